"""One tensor-parallel rank: its shard of the torch model, its shard of the KV cache.

``TPTorchLlamaForCausalLM`` is ``TorchLlamaForCausalLM`` built from one rank's
weights (``sharding.shard_weights``) and a config with that rank's heads, KV
heads and MLP width, so the attention op, the paged cache and the kernels are
the unchanged single-GPU ones. Only the forward pass differs, in four places:
the vocab-parallel embedding, the all-reduce after ``o_proj``, the all-reduce
after ``down_proj``, and the gathered LM head.

``Worker`` is what the executor calls by name (``collective_rpc``): every rank
runs the same method on the same input; rank 0 alone returns the logits.

upstream: vllm/v1/worker/gpu_worker.py:109 Worker
upstream: vllm/v1/worker/gpu_worker.py:781 execute_model
"""
from __future__ import annotations

import time

import numpy as np
import torch

from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_gather,
)
from mini_vllm.distributed.parallel_state import get_tp_group
from mini_vllm.distributed.sharding import (
    get_masked_input_and_mask,
    pad_vocab_size,
    shard_config,
    shard_weights,
    vocab_range,
)
from mini_vllm.model_input import ModelInput
from mini_vllm.models.torch_backend import TorchLlamaForCausalLM, apply_rope, linear, rms_norm


class TPTorchLlamaForCausalLM(TorchLlamaForCausalLM):
    """Rank ``rank`` of a ``tp_size``-way tensor-parallel Llama (call inside a TP group)."""

    def __init__(self, reference, rank: int, tp_size: int, device: str = "cpu") -> None:
        full = reference.config
        super().__init__(shard_config(full, tp_size), shard_weights(reference.weights, full, rank, tp_size),
                         reference.tokenizer, reference.max_model_len, reference.name, device)
        self.full_config, self.rank, self.tp_size = full, rank, tp_size
        self.vocab_size = full.vocab_size  # the real vocabulary; the shards hold the padded one
        self.vocab_start, self.vocab_end = vocab_range(full, rank, tp_size)
        self.padded_vocab_size = pad_vocab_size(full.vocab_size)
        self.last_num_collectives = 0

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """VocabParallelEmbedding.forward: local rows, foreign ids zeroed, summed over ranks."""
        local_ids, foreign = get_masked_input_and_mask(input_ids, self.vocab_start, self.vocab_end)
        rows = self.weights.embed_tokens[local_ids]
        rows.masked_fill_(foreign[:, None], 0.0)
        return tensor_model_parallel_all_reduce(rows)

    def forward_tokens(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The decoder of ``TorchLlamaForCausalLM.forward_tokens`` on this rank's heads and MLP
        columns; the two row-parallel outputs of each layer are summed across ranks."""
        c, w = self.config, self.weights  # c: this rank's heads and intermediate width
        x = self.embed(input_ids)
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(angles), torch.sin(angles)
        for layer_idx, lw in enumerate(w.layers):
            qkv = linear(rms_norm(x, lw.input_norm, c.rms_norm_eps), lw.qkv_proj, lw.qkv_bias)
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = apply_rope(q.reshape(-1, c.num_attention_heads, c.head_dim), cos, sin)
            k = apply_rope(k.reshape(-1, c.num_key_value_heads, c.head_dim), cos, sin)
            v = v.reshape(-1, c.num_key_value_heads, c.head_dim)
            attn = torch.ops.mini_vllm.unified_attention(q, k, v, layer_idx)
            # RowParallelLinear: a partial sum over this rank's heads, then the all-reduce.
            x = x + tensor_model_parallel_all_reduce(linear(attn.reshape(-1, c.q_size), lw.o_proj, lw.o_bias))

            gate_up = linear(rms_norm(x, lw.post_norm, c.rms_norm_eps), lw.gate_up_proj, lw.gate_up_bias)
            gate, up = gate_up.split([c.intermediate_size, c.intermediate_size], dim=-1)
            x = x + tensor_model_parallel_all_reduce(
                linear(torch.nn.functional.silu(gate) * up, lw.down_proj, lw.down_bias))
        return x

    @torch.inference_mode()
    def execute(self, model_input: ModelInput) -> np.ndarray | None:
        """One step on this rank; rank 0 returns the full logits [rows, vocab], the others None."""
        group = get_tp_group()
        before = group.num_collectives
        if self.kv_cache is None:
            raise RuntimeError("call init_kv_cache(num_blocks, block_size) before execute()")
        hidden = self.forward(model_input)[self._tensor(model_input.logits_indices)]
        local = rms_norm(hidden, self.weights.norm, self.config.rms_norm_eps) @ self.weights.lm_head
        logits = tensor_model_parallel_gather(local)  # [rows, padded vocab] on rank 0
        self.last_num_collectives = group.num_collectives - before
        if logits is None:
            return None
        return logits[:, :self.vocab_size].cpu().numpy()


class Worker:
    """A rank's long-lived state; the executor calls its methods by name on every rank."""

    def __init__(self, reference, rank: int, world_size: int, device: str = "cpu") -> None:
        self.rank, self.world_size = rank, world_size
        if device == "cuda":
            torch.cuda.set_device(rank)  # one GPU per rank, as vLLM's local_rank
        self.model = TPTorchLlamaForCausalLM(reference, rank, world_size, device)
        self._fault: str | None = None

    def ready(self) -> int:
        return self.rank

    def init_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.model.init_kv_cache(num_blocks, block_size)

    def kv_cache_bytes(self) -> int:
        return self.model.kv_cache_bytes

    def set_attn_backend(self, backend_cls) -> None:
        self.model.set_attn_backend(backend_cls)

    def execute_model(self, model_input: ModelInput) -> dict | None:
        """``model.execute`` plus the counters the engine's StepStats reports (rank 0 only)."""
        if self._fault == "raise":
            raise RuntimeError(f"fault injected into rank {self.rank}")
        if self._fault == "hang":
            time.sleep(3600)  # a rank that never joins the collective its peers wait in
        backend = self.model.attn_backend
        backend.kv_rows_read = 0
        logits = self.model.execute(model_input)
        if logits is None:
            return None
        return {"logits": logits, "kv_rows_read": backend.kv_rows_read,
                "num_collectives": self.model.last_num_collectives}

    def inject_fault(self, rank: int, kind: str | None) -> None:
        """Test hook: make rank ``rank``'s next ``execute_model`` raise (``"raise"``) or hang."""
        if self.rank == rank:
            self._fault = kind
