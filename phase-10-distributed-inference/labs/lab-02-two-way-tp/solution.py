"""Lab 10-02: cut a whole model for two ranks, run it in mini_vllm, then size its KV cache.

Lab 10-01 split one matrix at a time. Here you cut every weight of a real
(tiny) Llama for rank ``rank`` of ``tp_size``, hand the shards to mini_vllm's
own tensor-parallel workers, and check what tensor parallelism promises: the
same greedy tokens as one process, half the KV cache bytes on each rank, and a
fixed number of collectives per step. Then the arithmetic that decides how many
KV blocks a rank can hold on a real GPU.

What each rank keeps (weights are stored ``[in, out]``, as mini_vllm's are):

    qkv_proj      columns: its query heads, then its K heads, then its V heads.
                  With more ranks than KV heads, each rank keeps one KV head and
                  ``tp_size // num_kv_heads`` neighbouring ranks hold the same one.
    o_proj        rows: the rows fed by its query heads (row-parallel).
    gate_up_proj  columns: its slice of gate AND the same slice of up (the two
                  halves of the fused matrix are cut alike).
    down_proj     rows: the same MLP slice (row-parallel).
    embed_tokens  rows ``[r * V_pad / tp, (r + 1) * V_pad / tp)`` of the vocabulary
                  padded to a multiple of 64 (padding rows are zero).
    lm_head       the same range of columns (padding columns are zero: their
                  logits are cut off after the gather).
    norms         the whole vector on every rank.
    biases        a column-parallel bias is cut like its columns; a row-parallel
                  bias (o_proj, down_proj) goes to rank 0 only, because the
                  all-reduce would otherwise add it ``tp_size`` times.

upstream: vllm/model_executor/layers/linear.py:975 QKVParallelLinear
upstream: vllm/model_executor/layers/linear.py:1031 num_kv_head_replicas
upstream: vllm/model_executor/layers/linear.py:607 MergedColumnParallelLinear
upstream: vllm/model_executor/layers/linear.py:1555 bias_
upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:81 pad_vocab_size
upstream: vllm/v1/worker/gpu_worker.py:358 determine_available_memory
upstream: vllm/v1/core/kv_cache_utils.py:691 _check_enough_kv_cache_memory
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from mini_vllm.models.config import ModelConfig
from mini_vllm.models.llama import LayerWeights, Weights

DEFAULT_VOCAB_PADDING = 64


# ---------------------------------------------------------------- given helpers


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING) -> int:
    """``vocab_size`` rounded up to a multiple of ``pad_to`` (257 -> 320). Given: lab 10-01's.

    upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:81 pad_vocab_size
    """
    return -(-vocab_size // pad_to) * pad_to


def weights_nbytes(weights: Weights) -> int:
    """Total bytes of every array in ``weights`` (``None`` fields count 0). Given."""
    arrays = [weights.embed_tokens, weights.norm, weights.lm_head]
    for lw in weights.layers:  # every dense field of a layer (the MoE one is not sharded here)
        arrays += [getattr(lw, f.name) for f in dataclasses.fields(LayerWeights) if f.name != "moe"]
    return sum(int(a.nbytes) for a in arrays if a is not None)


@contextlib.contextmanager
def plugged_into_workers(shard_fn: Callable[[Weights, ModelConfig, int, int], Weights]) -> Iterator[None]:
    """While the block runs, mini_vllm's TP workers cut their weights with ``shard_fn``. Given.

    ``mini_vllm.distributed.worker`` calls the name ``shard_weights`` when a worker
    builds its model, right after the fork; the workers of an engine created inside
    this block inherit the replacement, and the engine constructor returns only after
    every worker has built its shard, so restoring the name afterwards is safe.
    """
    from mini_vllm.distributed import worker

    saved = worker.shard_weights
    worker.shard_weights = shard_fn
    try:
        yield
    finally:
        worker.shard_weights = saved


def tp_engine(tp_size: int, shard_fn=None, **engine_kw):
    """An ``LLMEngine`` on tiny-random (torch backend) whose ``tp_size`` workers hold the
    shards that ``shard_fn`` (default: this file's ``shard_weights``) cuts. Given.
    Call ``engine.shutdown()`` when done; at ``tp_size == 1`` no worker exists."""
    from mini_vllm.engine import LLMEngine

    with plugged_into_workers(shard_fn or shard_weights):
        return LLMEngine("tiny-random", model_backend="torch", tensor_parallel_size=tp_size, **engine_kw)


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_split(num_heads: int, num_kv_heads: int, rank, tp_size) -> tuple[int, int]:
    """The shared input checks of the sharding functions: ``(rank, tp_size)`` as ints."""
    tp_size = _check_int(tp_size, "tp_size", 1)
    if num_heads % tp_size or (num_kv_heads % tp_size and tp_size % num_kv_heads):
        raise ValueError(f"tp_size must divide num_attention_heads ({num_heads}) and divide or be a "
                         f"multiple of num_key_value_heads ({num_kv_heads}), got {tp_size}")
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < tp_size:
        raise ValueError(f"rank must be an integer in [0, tp_size) = [0, {tp_size}), got {rank!r}")
    return int(rank), tp_size


# ---------------------------------------------------------------- 1. which columns of qkv


def qkv_columns(config: ModelConfig, rank: int, tp_size: int) -> np.ndarray:
    """The columns of the fused ``qkv_proj`` (``[hidden, q_size + 2 * kv_size]``) that rank keeps.

    The fused matrix's columns are Q (``num_attention_heads * head_dim``), then K,
    then V (``num_key_value_heads * head_dim`` each). Rank ``rank`` keeps, in this
    order: the columns of its query heads ``[rank * h, (rank + 1) * h)`` with
    ``h = num_attention_heads // tp_size``; the K columns of its KV heads; the V
    columns of the same KV heads. KV heads: ``num_key_value_heads // tp_size`` per rank
    when ``tp_size <= num_key_value_heads``; otherwise exactly one per rank, head
    ``rank // (tp_size // num_key_value_heads)`` (``num_kv_head_replicas`` ranks share it).

    Returns a 1-D int64 array of ``(h + 2 * kv_per_rank) * head_dim`` column indices.
    Raises ``ValueError`` naming ``tp_size`` unless it divides ``num_attention_heads`` and
    divides or is a multiple of ``num_key_value_heads``, and naming ``rank`` unless
    ``0 <= rank < tp_size``.
    """
    rank, tp_size = _check_split(config.num_attention_heads, config.num_key_value_heads, rank, tp_size)
    hd, kv = config.head_dim, config.num_key_value_heads
    heads = config.num_attention_heads // tp_size
    if tp_size >= kv:
        # More ranks than KV heads: one KV head each, shared by `replicas` neighbouring ranks
        # (upstream: shard_rank = tp_rank // num_kv_head_replicas), never kv // tp = 0 heads.
        replicas = tp_size // kv
        kv_heads, kv_start = 1, rank // replicas
    else:
        kv_heads = kv // tp_size
        kv_start = rank * kv_heads
    q_cols = np.arange(rank * heads * hd, (rank + 1) * heads * hd)
    kv_cols = np.arange(kv_start * hd, (kv_start + kv_heads) * hd)
    return np.concatenate([q_cols, config.q_size + kv_cols,
                           config.q_size + config.kv_size + kv_cols]).astype(np.int64)


# ---------------------------------------------------------------- 2. every weight of a rank


def shard_weights(weights: Weights, config: ModelConfig, rank: int, tp_size: int) -> Weights:
    """Rank ``rank``'s share of every weight of a dense Llama, as the module docstring lays out.

    ``weights`` holds float arrays stored ``[in, out]`` (``mini_vllm.models.llama.Weights``:
    ``embed_tokens [vocab, hidden]``, ``lm_head [hidden, vocab]``, per layer ``qkv_proj
    [hidden, q + 2 kv]``, ``o_proj [q, hidden]``, ``gate_up_proj [hidden, 2 * inter]``
    (gate columns first, then up), ``down_proj [inter, hidden]``, optional biases).
    Returns a new ``Weights`` (MoE field ``None``) whose arrays are C-contiguous copies
    (never views of ``weights``), same dtype:

    - ``qkv_proj``/``qkv_bias``: the columns ``qkv_columns(config, rank, tp_size)``;
    - ``o_proj``: the rows of this rank's query heads; ``o_bias`` on rank 0 only (else ``None``);
    - ``gate_up_proj``/``gate_up_bias``: columns ``[r*I/tp, (r+1)*I/tp)`` of gate and the same
      of up (``I = intermediate_size``); ``down_proj``: those rows; ``down_bias`` on rank 0 only;
    - ``embed_tokens``: rows ``[r*P/tp, (r+1)*P/tp)`` of the vocabulary zero-padded to
      ``P = pad_vocab_size(vocab_size)``; ``lm_head``: the same columns of the padded head;
    - norms: the whole vectors (the same arrays may be shared).

    Raises ``ValueError`` as ``qkv_columns`` does, naming ``tp_size`` also when it does not
    divide ``intermediate_size`` or the padded vocabulary.
    """
    rank, tp_size = _check_split(config.num_attention_heads, config.num_key_value_heads, rank, tp_size)
    inter_total = config.intermediate_size
    padded = pad_vocab_size(config.vocab_size)
    if inter_total % tp_size or padded % tp_size:
        raise ValueError(f"tp_size must divide intermediate_size ({inter_total}) and the padded "
                         f"vocabulary ({padded}), got {tp_size}")
    qkv = qkv_columns(config, rank, tp_size)
    heads = config.num_attention_heads // tp_size
    q_rows = np.arange(rank * heads * config.head_dim, (rank + 1) * heads * config.head_dim)
    inter = inter_total // tp_size
    mlp = np.arange(rank * inter, (rank + 1) * inter)
    gate_up = np.concatenate([mlp, inter_total + mlp])  # the same slice of gate and of up

    def cols(a, idx):
        return None if a is None else np.ascontiguousarray(a[..., idx])

    def rows(a, idx):
        return None if a is None else np.ascontiguousarray(a[idx])

    def first_rank_only(bias):
        # A row-parallel bias is added once, after the all-reduce has summed the partial
        # products; on every rank it would be counted tp_size times.
        return None if bias is None or rank != 0 else bias.copy()

    layers = [LayerWeights(
        input_norm=lw.input_norm, post_norm=lw.post_norm,
        qkv_proj=cols(lw.qkv_proj, qkv), qkv_bias=cols(lw.qkv_bias, qkv),
        o_proj=rows(lw.o_proj, q_rows), o_bias=first_rank_only(lw.o_bias),
        gate_up_proj=cols(lw.gate_up_proj, gate_up), gate_up_bias=cols(lw.gate_up_bias, gate_up),
        down_proj=rows(lw.down_proj, mlp), down_bias=first_rank_only(lw.down_bias),
        moe=None,
    ) for lw in weights.layers]

    per_rank = padded // tp_size
    start, end = rank * per_rank, (rank + 1) * per_rank
    embed = np.zeros((padded, config.hidden_size), dtype=weights.embed_tokens.dtype)
    embed[:config.vocab_size] = weights.embed_tokens  # rows past the vocabulary stay zero
    head = np.zeros((config.hidden_size, padded), dtype=weights.lm_head.dtype)
    head[:, :config.vocab_size] = weights.lm_head
    return Weights(embed_tokens=np.ascontiguousarray(embed[start:end]), layers=layers, norm=weights.norm,
                   lm_head=np.ascontiguousarray(head[:, start:end]))


# ---------------------------------------------------------------- 3. collectives per step


def expected_collectives_per_step(num_layers: int) -> tuple[int, int]:
    """``(all_reduces, gathers)`` one forward step of a ``num_layers``-layer TP model runs.

    One all-reduce joins the vocab-parallel embedding's rows, each decoder layer has two
    row-parallel layers (``o_proj``, ``down_proj``) ending in one all-reduce each, and the
    LM head's vocab slices meet in one gather of the logits (upstream's ``_gather_logits``:
    a gather to rank 0, or an all-gather; one collective either way). The count does not
    depend on the batch, nor on ``tp_size > 1``. Raises ``ValueError`` naming
    ``num_layers`` unless it is an integer >= 1.
    """
    num_layers = _check_int(num_layers, "num_layers", 1)
    return 2 * num_layers + 1, 1


# ---------------------------------------------------------------- 4. KV capacity per rank


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int,
                       tp_size: int = 1) -> int:
    """Bytes of K and V that ONE rank stores per token: ``2 * layers * heads_here * head_dim * bytes``.

    ``heads_here`` is ``num_kv_heads // tp_size`` when ``tp_size`` divides ``num_kv_heads``,
    and 1 when ``tp_size`` is a multiple of it (the head is replicated, so bytes stop
    shrinking). All arguments are integers >= 1; a bad one raises ``ValueError`` naming it,
    and a ``tp_size`` that neither divides nor is a multiple of ``num_kv_heads`` raises
    ``ValueError`` naming ``tp_size``.
    """
    num_layers = _check_int(num_layers, "num_layers", 1)
    num_kv_heads = _check_int(num_kv_heads, "num_kv_heads", 1)
    head_dim = _check_int(head_dim, "head_dim", 1)
    dtype_bytes = _check_int(dtype_bytes, "dtype_bytes", 1)
    tp_size = _check_int(tp_size, "tp_size", 1)
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        raise ValueError(f"tp_size must divide or be a multiple of num_kv_heads ({num_kv_heads}), "
                         f"got {tp_size}")
    heads_here = max(1, num_kv_heads // tp_size)
    return 2 * num_layers * heads_here * head_dim * dtype_bytes


def max_kv_blocks_per_rank(gpu_memory_bytes: int, kv_bytes_per_block: int,
                           gpu_memory_utilization: float = 1.0, weight_bytes: int = 0,
                           activation_bytes: int = 0) -> int:
    """How many KV blocks fit on one rank's GPU, vLLM's budget: what is left of
    ``gpu_memory_bytes * gpu_memory_utilization`` after this rank's weights and its peak
    activations, divided by the bytes of one block (all layers), rounded down.

    ``gpu_memory_bytes`` and ``kv_bytes_per_block`` are integers >= 1, ``weight_bytes`` and
    ``activation_bytes`` integers >= 0, ``gpu_memory_utilization`` a number in (0, 1]; a
    bad one raises ``ValueError`` naming it. A budget of 0 bytes or less raises
    ``ValueError`` naming ``gpu_memory_utilization`` (upstream refuses to start: "No
    available memory for the cache blocks").
    """
    gpu_memory_bytes = _check_int(gpu_memory_bytes, "gpu_memory_bytes", 1)
    kv_bytes_per_block = _check_int(kv_bytes_per_block, "kv_bytes_per_block", 1)
    weight_bytes = _check_int(weight_bytes, "weight_bytes", 0)
    activation_bytes = _check_int(activation_bytes, "activation_bytes", 0)
    if (isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, int | float)
            or not 0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be a number in (0, 1], got {gpu_memory_utilization!r}")
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_bytes
    if budget <= 0:
        raise ValueError(f"gpu_memory_utilization {gpu_memory_utilization} leaves no memory for the KV "
                         f"cache: {gpu_memory_bytes * gpu_memory_utilization:.0f} B requested, "
                         f"{weight_bytes + activation_bytes} B taken by weights and activations")
    return int(budget // kv_bytes_per_block)


if __name__ == "__main__":
    import time

    import torch

    from mini_vllm.sampling_params import SamplingParams

    torch.set_num_threads(1)  # as each worker does: one core per rank, a fair comparison

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(40, 60))}, {"prompt_token_ids": [5, 6, 7]}]
    for tp in (1, 2):
        engine = tp_engine(tp, block_size=4, num_blocks=32, max_num_batched_tokens=16)
        try:
            engine.generate(prompts, params)  # warm-up
            start, steps = time.perf_counter(), engine.num_steps
            out = engine.generate(prompts, params)
            ms = (time.perf_counter() - start) / (engine.num_steps - steps) * 1e3
            kv = (engine.model.kv_cache_bytes_per_rank() if tp > 1 else [engine.model.kv_cache_bytes])
            print(f"TP={tp}: {ms:.2f} ms/step, KV bytes per rank {kv}, "
                  f"collectives/step {engine.stats[-1].num_collectives}, tokens {out[0].output_token_ids}")
        finally:
            engine.shutdown()
