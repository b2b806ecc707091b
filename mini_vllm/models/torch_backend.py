"""The same Llama / Qwen2 model in PyTorch, on the CPU or a CUDA GPU: an optional backend.

The numpy model (``llama.py``, ``attention.py``) is the reference. This file
runs the same math, line for line, from the same ``ModelConfig`` and
``Weights``, behind the same interface (``init_kv_cache``, ``execute``). What
changes is where the numbers live: each weight becomes a torch tensor on
``device`` once, at construction, and the paged KV cache is a torch tensor
there too. Per step, only ``ModelInput``'s small index arrays go to the device
and only the sampled rows' logits come back, as float32 numpy.

The two paged operations, in torch::

    write  cache.view(num_slots, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    read   cache[block_tables] -> [B, blocks, block_size, kv_heads, head_dim],
           slots at or past each seq_len zeroed, future keys masked to -inf

Requests with the same number of query rows (all of a step's decodes, above
all) share one gather and one masked softmax, as in ``attention.py``. A real
GPU backend hands the same metadata to a fused kernel (FlashAttention's varlen
path) instead of materialising the gathered keys; the result is the same.

upstream: vllm/_custom_ops.py:2591 reshape_and_cache_flash
upstream: vllm/v1/attention/backends/flash_attn.py:667 FlashAttentionImpl.forward
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from mini_vllm.compilation.config import CompilationConfig
from mini_vllm.compilation.dispatcher import CudagraphDispatcher
from mini_vllm.compilation.forward_context import (
    ForwardContext,
    get_forward_context,
    set_forward_context,
)
from mini_vllm.model_input import ModelInput
from mini_vllm.models import DEVICES
from mini_vllm.models.attention import request_groups
from mini_vllm.models.attention_backends import AttentionBackend, TorchGatherBackend
from mini_vllm.models.config import ModelConfig
from mini_vllm.models.llama import LayerWeights, LlamaForCausalLM, Weights, kv_cache_shape


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos, sin: [T, head_dim / 2] (the neox pairing of llama.py)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x @ weight  # weights are [in, out], as in llama.py
    return out if bias is None else out + bias


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Row ``i`` of ``k``/``v`` ([T, kv_heads, head_dim]) goes to slot ``slot_mapping[i]``."""
    kv_heads, head_dim = k_cache.shape[2:]
    # view() of a contiguous cache shares its storage, so the copy lands in the cache.
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
              max_len: int) -> torch.Tensor:
    """[B, max_len, kv_heads, head_dim]: each request's tokens, zero at or past its seq_len."""
    rows = cache[block_tables]  # [B, n, block_size, kv_heads, head_dim], a copy
    rows = rows.reshape(len(block_tables), -1, *cache.shape[2:])[:, :max_len]
    past = torch.arange(max_len, device=cache.device)[None, :] >= seq_lens[:, None]
    return rows.masked_fill(past[:, :, None, None], 0.0)  # NaN in a stale slot is gone too


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Causal grouped-query attention. q: [B, M, heads, hd]; k, v: [B, L, kv_heads, hd]."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bmhd,blhd->bhml", q, k) * scale
    keys = torch.arange(k.shape[1], device=q.device)
    future = keys[None, None, :] > q_positions[:, :, None]  # [B, M, L]
    probs = torch.softmax(scores.masked_fill(future[:, None], float("-inf")), dim=-1)
    return torch.einsum("bhml,blhd->bmhd", probs, v)


def paged_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          model_input: ModelInput, scale: float, sdpa: bool = False) -> torch.Tensor:
    """Every row of a mixed batch, one gather per distinct number of query rows.

    ``sdpa=True`` hands each group to ``scaled_dot_product_attention`` with an
    explicit bottom-right causal mask and ``enable_gqa`` instead of ``attend``
    (the ``TORCH_SDPA`` backend); the gather is the same.
    """
    out = torch.empty_like(q)
    qsl, device = model_input.query_start_loc, q.device

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    for m, reqs in request_groups(model_input, group_size=None):
        rows = (qsl[reqs][:, None] + np.arange(m)[None, :]).ravel()
        seq_lens = model_input.seq_lens[reqs]
        max_len = int(seq_lens.max())
        tables = t(model_input.block_tables[reqs, :-(-max_len // k_cache.shape[1])])
        k = gather_kv(k_cache, tables, t(seq_lens), max_len)
        v = gather_kv(v_cache, tables, t(seq_lens), max_len)
        rows_t = t(rows)
        qb = q[rows_t].reshape(len(reqs), m, *q.shape[1:])
        pos = t(model_input.positions[rows]).reshape(len(reqs), m)
        if sdpa:
            visible = torch.arange(max_len, device=device)[None, None, :] <= pos[:, :, None]
            res = torch.nn.functional.scaled_dot_product_attention(
                qb.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                attn_mask=visible[:, None], scale=scale, enable_gqa=True).transpose(1, 2)
        else:
            res = attend(qb, k, v, pos, scale)
        out[rows_t] = res.reshape(len(rows), *q.shape[1:])
    return out


class TorchLlamaForCausalLM:
    """The transformer of ``llama.py`` in torch; pass ``device="cuda"`` to run it on a GPU."""

    def __init__(self, config: ModelConfig, weights: Weights, tokenizer=None,
                 max_model_len: int | None = None, name: str = "llama", device: str = "cpu"):
        if device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' needs a CUDA GPU; torch.cuda.is_available() is False")
        # The numpy model checks config and max_model_len and computes the RoPE
        # frequencies; reuse it so both backends accept exactly the same inputs.
        ref = LlamaForCausalLM(config, weights, tokenizer, max_model_len, name)
        self.config, self.tokenizer, self.name = config, tokenizer, name
        self.vocab_size, self.eos_token_id = ref.vocab_size, ref.eos_token_id
        self.max_model_len, self.scale = ref.max_model_len, ref.scale
        self.device = torch.device(device)
        self.inv_freq = self._tensor(ref.inv_freq)
        # The same dataclasses as the numpy model, holding tensors instead of arrays.
        layers = [LayerWeights(**{f.name: self._tensor(getattr(lw, f.name))
                                  for f in dataclasses.fields(LayerWeights)})
                  for lw in weights.layers]
        self.weights = Weights(embed_tokens=self._tensor(weights.embed_tokens), layers=layers,
                               norm=self._tensor(weights.norm),
                               lm_head=self._tensor(weights.lm_head))
        self.kv_cache: torch.Tensor | None = None  # [layers, 2, blocks, block_size, kv_heads, hd]
        self.attn_backend: AttentionBackend = TorchGatherBackend()
        self._static_ptrs = frozenset(t.data_ptr() for t in self._all_weights())
        self.configure_compilation(CompilationConfig(), 1, 1)  # eager until the engine says otherwise

    def _all_weights(self):
        yield from (self.weights.embed_tokens, self.weights.norm, self.weights.lm_head, self.inv_freq)
        for lw in self.weights.layers:
            yield from (getattr(lw, f.name) for f in dataclasses.fields(LayerWeights)
                        if getattr(lw, f.name) is not None)

    @property
    def attn_platform(self) -> str:
        """Which AttentionBackend classes can serve this model: "torch" (CPU) or "cuda"."""
        return "cuda" if self.device.type == "cuda" else "torch"

    def set_attn_backend(self, backend_cls: type[AttentionBackend]) -> None:
        """Use ``backend_cls`` (already validated by ``get_attn_backend``) in every layer."""
        self.attn_backend = backend_cls()

    @classmethod
    def from_numpy(cls, model: LlamaForCausalLM, device: str = "cpu") -> TorchLlamaForCausalLM:
        """The torch twin of a numpy model: same config, weights, tokenizer and limits."""
        return cls(model.config, model.weights, model.tokenizer, model.max_model_len,
                   model.name, device)

    def _tensor(self, a: np.ndarray | None) -> torch.Tensor | None:
        """A numpy array as a tensor on this model's device (read-only arrays are copied)."""
        if a is None:
            return None
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a if a.flags.writeable else a.copy()).to(self.device)

    # -- the model interface -------------------------------------------------
    def init_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """K and V for every layer: [num_blocks, block_size, kv_heads, head_dim] each, zeroed."""
        self.kv_cache = torch.zeros(kv_cache_shape(self.config, num_blocks, block_size),
                                    dtype=torch.float32, device=self.device)

    @property
    def kv_cache_bytes(self) -> int:
        return 0 if self.kv_cache is None else self.kv_cache.numel() * self.kv_cache.element_size()

    def configure_compilation(self, config: CompilationConfig, max_num_seqs: int,
                              max_num_batched_tokens: int) -> None:
        """Compile the forward pass and set up CUDA-graph dispatch (``LLMEngine`` calls this once).

        With ``mode`` NONE the forward runs eagerly, as before. With VLLM_COMPILE
        it runs through ``torch.compile`` and ``MiniVllmBackend`` (split at
        attention; dynamic in the token count, so one Dynamo graph serves every
        batch size above 1). With PIECEWISE graphs each batch is padded up to a
        capture size and the pieces between attention ops replay CUDA graphs.
        """
        from mini_vllm.compilation.backend import MiniVllmBackend
        from mini_vllm.compilation.config import CompilationMode

        self.compilation_config = config
        sizes = config.resolve_capture_sizes(max_num_seqs, max_num_batched_tokens)
        self.dispatcher = CudagraphDispatcher(sizes, max_num_seqs, config.cudagraph_mode)
        self.compile_backend = None
        self._forward_fn = self.forward_tokens
        if config.mode == CompilationMode.VLLM_COMPILE:
            self.compile_backend = MiniVllmBackend(config)
            self._forward_fn = torch.compile(self.forward_tokens, backend=self.compile_backend,
                                             fullgraph=True, dynamic=True)

    @torch.inference_mode()
    def execute(self, model_input: ModelInput) -> np.ndarray:
        """Run one step; return float32 numpy logits [len(logits_indices), vocab]."""
        if self.kv_cache is None:
            raise RuntimeError("call init_kv_cache(num_blocks, block_size) before execute()")
        if model_input.block_size != self.kv_cache.shape[3]:
            raise ValueError(f"model_input.block_size ({model_input.block_size}) differs from "
                             f"the KV cache's block_size ({self.kv_cache.shape[3]})")
        hidden = self.forward(model_input)[self._tensor(model_input.logits_indices)]
        logits = rms_norm(hidden, self.weights.norm, self.config.rms_norm_eps) @ self.weights.lm_head
        return logits.cpu().numpy()

    # -- the forward pass ----------------------------------------------------
    def forward(self, model_input: ModelInput) -> torch.Tensor:
        """The residual stream after the last layer, the real rows: [T, hidden].

        Dispatches the step (padding it to a capture size when graphs are on),
        sets the forward context the attention op reads, and runs the forward
        pass, eager or compiled.
        """
        num_tokens = model_input.num_tokens
        qsl = model_input.query_start_loc
        uniform_decode = bool((np.diff(qsl) == 1).all())
        mode, desc = self.dispatcher.dispatch(num_tokens, uniform_decode)
        pad = desc.num_tokens - num_tokens
        ids, pos = model_input.token_ids, model_input.positions
        if pad:  # pad rows: token 0 at position 0; they write no KV and their outputs are dropped
            ids = np.concatenate([ids, np.zeros(pad, dtype=ids.dtype)])
            pos = np.concatenate([pos, np.zeros(pad, dtype=pos.dtype)])
        self.last_padded_tokens, self.last_cudagraph_mode = pad, mode
        context = ForwardContext(model_input, self.kv_cache, self.attn_backend, self.scale, num_tokens,
                                 desc, mode, self._tensor(model_input.slot_mapping), self._static_ptrs)
        with set_forward_context(context):
            return self._forward_fn(self._tensor(ids), self._tensor(pos))[:num_tokens]

    def forward_tokens(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Tensors in, tensors out: what ``torch.compile`` traces. [T] ids, [T] positions -> [T, hidden].

        The only call Dynamo cannot see into is the attention op, one per
        layer; it finds the step's metadata in the forward context.
        """
        c, w = self.config, self.weights
        x = w.embed_tokens[input_ids]
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(angles), torch.sin(angles)
        for layer_idx, lw in enumerate(w.layers):
            qkv = linear(rms_norm(x, lw.input_norm, c.rms_norm_eps), lw.qkv_proj, lw.qkv_bias)
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = apply_rope(q.reshape(-1, c.num_attention_heads, c.head_dim), cos, sin)
            k = apply_rope(k.reshape(-1, c.num_key_value_heads, c.head_dim), cos, sin)
            v = v.reshape(-1, c.num_key_value_heads, c.head_dim)
            attn = torch.ops.mini_vllm.unified_attention(q, k, v, layer_idx)
            x = x + linear(attn.reshape(-1, c.q_size), lw.o_proj, lw.o_bias)

            gate_up = linear(rms_norm(x, lw.post_norm, c.rms_norm_eps), lw.gate_up_proj,
                             lw.gate_up_bias)
            gate, up = gate_up.split([c.intermediate_size, c.intermediate_size], dim=-1)
            x = x + linear(torch.nn.functional.silu(gate) * up, lw.down_proj, lw.down_bias)
        return x


def unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """Write this step's K/V of layer ``layer_idx`` into the cache, then attend: one opaque op.

    Only the first ``num_tokens`` rows are real; pad rows write nothing and get
    zeros. The cache and metadata come from the forward context, so the op's
    signature holds tensors only and Dynamo can leave it as a single node.
    Registered below as ``torch.ops.mini_vllm.unified_attention``.

    upstream: vllm/model_executor/layers/attention/attention.py:734 unified_attention_with_output
    upstream: vllm/model_executor/layers/attention/attention.py:691 unified_kv_cache_update
    """
    ctx = get_forward_context()
    n = ctx.num_tokens
    k_cache, v_cache = ctx.kv_cache[layer_idx]
    write_kv(k_cache, v_cache, k[:n], v[:n], ctx.slot_mapping)  # the whole batch, before any read
    out = torch.zeros_like(q)
    out[:n] = ctx.attn_backend.forward(q[:n], k_cache, v_cache, ctx.model_input, ctx.scale)
    return out


def _unified_attention_fake(q, k, v, layer_idx):
    """What Dynamo sees while tracing: only the output's shape, dtype and device."""
    return torch.empty_like(q)


# Registered with the low-level torch.library API, as vLLM's direct_register_custom_op does:
# torch.library.custom_op would wrap every eager call in a Dynamo guard, whose first use imports
# torch._dynamo (about 3 s here) even in a model that is never compiled.
# upstream: vllm/utils/torch_utils.py:931 direct_register_custom_op
_LIB = torch.library.Library("mini_vllm", "FRAGMENT")
_LIB.define("unified_attention(Tensor q, Tensor k, Tensor v, int layer_idx) -> Tensor")
_LIB.impl("unified_attention", unified_attention, "CompositeExplicitAutograd")
torch.library.register_fake("mini_vllm::unified_attention", _unified_attention_fake, lib=_LIB)
