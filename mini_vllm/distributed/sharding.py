"""What each tensor-parallel rank holds, and the forward pass that joins the shards.

Megatron's split, as vLLM lays it out (weights here are ``[in, out]``):

    qkv_proj      column-parallel by heads: rank r keeps its query heads and its
                  KV heads (a KV head is *replicated* on tp / num_kv_heads ranks
                  when tp > num_kv_heads: ``num_kv_head_replicas``)
    o_proj        row-parallel: the rows of rank r's query heads; partial sums,
                  then one all-reduce
    gate_up_proj  column-parallel, gate and up sliced alike (MergedColumnParallel)
    down_proj     row-parallel, then one all-reduce
    embed_tokens  vocab-parallel: the vocabulary padded to a multiple of 64 and cut
                  into tp row ranges; out-of-range ids are masked, their rows
                  zeroed, then one all-reduce sums the ranks' rows
    lm_head       vocab-parallel columns; the [tokens, vocab / tp] logits gathered

So a decoder layer costs two all-reduces (attention, MLP), and a step costs
2L + 1 all-reduces (the embedding's too) and one gather. Attention itself needs
no communication: heads are independent, and each rank's paged KV cache holds
only its KV heads (1/tp of the bytes, or 1/num_kv_heads with replication). A
bias of a row-parallel layer is added on rank 0 only, or the sum would count
it tp times. Norms and the RoPE table are replicated.

upstream: vllm/model_executor/layers/linear.py:410 ColumnParallelLinear
upstream: vllm/model_executor/layers/linear.py:975 QKVParallelLinear
upstream: vllm/model_executor/layers/linear.py:1031 num_kv_head_replicas
upstream: vllm/model_executor/layers/linear.py:1392 RowParallelLinear
upstream: vllm/model_executor/layers/linear.py:1559 tensor_model_parallel_all_reduce
upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:81 pad_vocab_size
upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:163 get_masked_input_and_mask
upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:470 forward
upstream: vllm/model_executor/layers/logits_processor.py:75 _gather_logits
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mini_vllm.models.config import ModelConfig
from mini_vllm.models.llama import LayerWeights, Weights

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    """``vocab_size`` rounded up to a multiple of ``pad_to`` (257 -> 320)."""
    return -(-vocab_size // pad_to) * pad_to


@dataclass(frozen=True, slots=True)
class HeadSplit:
    """Rank ``rank``'s attention heads: query heads ``[q_start, q_start + num_heads)``,
    KV heads ``[kv_start, kv_start + num_kv_heads)``, each KV head held by
    ``num_kv_head_replicas`` ranks."""

    num_heads: int
    num_kv_heads: int
    num_kv_head_replicas: int
    q_start: int
    kv_start: int


def allowed_tp_sizes(config: ModelConfig) -> list[int]:
    """The tensor_parallel_size values this model accepts (heads, KV heads, MLP and vocab split)."""
    h, kv = config.num_attention_heads, config.num_key_value_heads
    return [n for n in range(1, h + 1)
            if h % n == 0 and (kv % n == 0 or n % kv == 0) and config.intermediate_size % n == 0
            and pad_vocab_size(config.vocab_size) % n == 0]


def check_tp_size(config: ModelConfig, tp_size: int) -> None:
    """``ValueError`` naming tensor_parallel_size unless the model splits ``tp_size`` ways."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp_size!r}")
    allowed = allowed_tp_sizes(config)
    if tp_size not in allowed:
        raise ValueError(
            f"tensor_parallel_size must divide num_attention_heads ({config.num_attention_heads}) and "
            f"divide or be a multiple of num_key_value_heads ({config.num_key_value_heads}); "
            f"allowed values for this model: {allowed}, got {tp_size}")


def head_split(config: ModelConfig, rank: int, tp_size: int) -> HeadSplit:
    """Which heads rank ``rank`` owns (upstream's QKVParallelLinear arithmetic)."""
    check_tp_size(config, tp_size)
    num_heads = config.num_attention_heads // tp_size
    if tp_size >= config.num_key_value_heads:  # one KV head per rank, shared by `replicas` ranks
        replicas = tp_size // config.num_key_value_heads
        num_kv, kv_start = 1, rank // replicas
    else:
        replicas, num_kv = 1, config.num_key_value_heads // tp_size
        kv_start = rank * num_kv
    return HeadSplit(num_heads, num_kv, replicas, rank * num_heads, kv_start)


def shard_config(config: ModelConfig, tp_size: int) -> ModelConfig:
    """The config one rank's layers see: its heads, KV heads and MLP width (vocab unchanged)."""
    split = head_split(config, 0, tp_size)
    return replace(config, num_attention_heads=split.num_heads, num_key_value_heads=split.num_kv_heads,
                   intermediate_size=config.intermediate_size // tp_size)


def vocab_range(config: ModelConfig, rank: int, tp_size: int) -> tuple[int, int]:
    """Rank ``rank``'s rows ``[start, end)`` of the padded vocabulary."""
    per_rank = pad_vocab_size(config.vocab_size) // tp_size
    return rank * per_rank, (rank + 1) * per_rank


def shard_weights(weights: Weights, config: ModelConfig, rank: int, tp_size: int) -> Weights:
    """Rank ``rank``'s slices of every weight (copies, contiguous), as the docstring above lays out."""
    split = head_split(config, rank, tp_size)
    hd, q_size, kv_size = config.head_dim, config.q_size, config.kv_size
    q_cols = np.arange(split.q_start * hd, (split.q_start + split.num_heads) * hd)
    kv_cols = np.arange(split.kv_start * hd, (split.kv_start + split.num_kv_heads) * hd)
    qkv_cols = np.concatenate([q_cols, q_size + kv_cols, q_size + kv_size + kv_cols])
    inter = config.intermediate_size // tp_size
    mlp_cols = np.arange(rank * inter, (rank + 1) * inter)
    gate_up_cols = np.concatenate([mlp_cols, config.intermediate_size + mlp_cols])

    def cols(a, idx):
        return None if a is None else np.ascontiguousarray(a[..., idx])

    def rows(a, idx):
        return None if a is None else np.ascontiguousarray(a[idx])

    def rank0(bias):  # a row-parallel layer's bias: added once, after the all-reduce's sum
        return bias if rank == 0 else None

    layers = [LayerWeights(
        input_norm=lw.input_norm, post_norm=lw.post_norm,
        qkv_proj=cols(lw.qkv_proj, qkv_cols), qkv_bias=cols(lw.qkv_bias, qkv_cols),
        o_proj=rows(lw.o_proj, q_cols), o_bias=rank0(lw.o_bias),
        gate_up_proj=cols(lw.gate_up_proj, gate_up_cols), gate_up_bias=cols(lw.gate_up_bias, gate_up_cols),
        down_proj=rows(lw.down_proj, mlp_cols), down_bias=rank0(lw.down_bias),
        moe=None,
    ) for lw in weights.layers]
    start, end = vocab_range(config, rank, tp_size)
    padded = pad_vocab_size(config.vocab_size)
    embed = np.zeros((padded, config.hidden_size), dtype=weights.embed_tokens.dtype)
    embed[:config.vocab_size] = weights.embed_tokens  # padded rows stay zero, never selected
    lm_head = np.zeros((config.hidden_size, padded), dtype=weights.lm_head.dtype)
    lm_head[:, :config.vocab_size] = weights.lm_head  # padded columns: logit 0, cut after the gather
    return Weights(embed_tokens=embed[start:end].copy(), layers=layers, norm=weights.norm,
                   lm_head=np.ascontiguousarray(lm_head[:, start:end]))


def get_masked_input_and_mask(input_ids, start: int, end: int):
    """Ids in ``[start, end)`` shifted to local rows; the others become row 0 and are flagged.

    Returns ``(local_ids, mask)`` where ``mask`` is True for ids this rank does not hold
    (their embedding rows must be zeroed before the all-reduce, or rank 0's row 0 would
    be added in for every foreign token).
    """
    inside = (input_ids >= start) & (input_ids < end)
    return (input_ids - start) * inside, ~inside
