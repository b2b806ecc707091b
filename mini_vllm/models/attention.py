"""Paged attention in numpy: write K/V through slot_mapping, read through block tables.

The KV cache of one layer is two arrays of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. Viewed flat, it is a list
of *slots*; token ``t`` of a request lives in slot
``block_table[t // block_size] * block_size + t % block_size``::

    block_table = [5, 2]   block_size = 4
    tokens 0..3 -> block 5 -> slots 20..23
    tokens 4..7 -> block 2 -> slots  8..11

Two operations, and nothing else, touch the cache:

1. ``write_kv`` scatters this step's new K/V rows into their slots
   (``slot_mapping[i]`` for row ``i``). In vLLM this is the
   ``reshape_and_cache_flash`` kernel.
2. ``paged_attention`` answers every query row of the step. For request ``b``
   it gathers the keys and values of positions ``[0, seq_lens[b])`` through
   its block table, and masks each query row so it sees only keys at a
   position ``<=`` its own. A prefill chunk (many rows, starting anywhere) and a
   decode (one row) go through the same lines: a decode is a chunk of length 1.
   In vLLM, FlashAttention's varlen kernel and Triton's ``unified_attention``
   do this on a GPU from the same metadata.

Because the K/V of this step are written *before* they are read, a chunk
attends to its cached prefix and to itself with one gather. Requests with the
same number of query rows (all the decodes of a step, above all) are stacked
into one call, their keys padded to the longest; the padding, like the tail
of a partly filled block and the null block 0, is zeroed by ``gather_kv`` and
hidden by the causal mask, so no stale slot reaches the output. The tests
fill every unwritten slot with 1e30 and with NaN and check nothing moves.

upstream: vllm/_custom_ops.py:2591 reshape_and_cache_flash
upstream: vllm/v1/attention/backends/flash_attn.py:667 FlashAttentionImpl.forward
upstream: vllm/v1/attention/ops/triton_unified_attention.py:763 unified_attention
"""
from __future__ import annotations

import numpy as np

from mini_vllm.model_input import ModelInput

GROUP_SIZE = 16  # requests per attend() call; measured best of 8/16/32/64 on a 64-decode step


def write_kv(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray,
             slot_mapping: np.ndarray) -> None:
    """Store row ``i`` of ``k``/``v`` ([T, kv_heads, head_dim]) in slot ``slot_mapping[i]``."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    # A reshape of a contiguous array is a view, so the assignment lands in the cache.
    k_cache.reshape(num_blocks * block_size, kv_heads, head_dim)[slot_mapping] = k
    v_cache.reshape(num_blocks * block_size, kv_heads, head_dim)[slot_mapping] = v


def gather_kv(cache: np.ndarray, block_tables: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
    """The first ``seq_lens[b]`` tokens of each request b, read through its block table.

    Returns [B, L, kv_heads, head_dim] with L = max(seq_lens). Whole blocks are
    copied (``cache[block_tables]``), then rows at or past a request's own
    seq_len are zeroed, so nothing that sits in those slots can leak out.
    """
    block_size = cache.shape[1]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    rows = cache[block_tables[:, :num_blocks]]  # a copy: [B, n, block_size, kv_heads, hd]
    if rows.dtype.itemsize == 1:  # an FP8 cache (scale 1.0): every E4M3 value is exact in float32
        from mini_vllm.quantization.fp8 import fp8_to_float32

        rows = fp8_to_float32(rows)
    rows = rows.reshape(len(block_tables), num_blocks * block_size, *cache.shape[2:])[:, :max_len]
    rows[np.arange(max_len)[None, :] >= seq_lens[:, None]] = 0
    return rows


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray,
           scale: float) -> np.ndarray:
    """Causal grouped-query attention for B requests of M query rows each.

    q: [B, M, num_heads, head_dim]; k, v: [B, L, kv_heads, head_dim], key ``j``
    at position ``j``; q_positions: [B, M]. Query head ``h`` reads kv head
    ``h // (num_heads // kv_heads)``. A key is visible iff its position is
    ``<=`` the query's, which also hides the zero padding past each seq_len.
    Returns [B, M, num_heads, head_dim].
    """
    b, m, num_heads, head_dim = q.shape
    seq_len, kv_heads = k.shape[1], k.shape[2]
    group = num_heads // kv_heads
    # [B, kv_heads, group * M, head_dim]: the `group` query heads that share a
    # kv head are stacked so one matmul per kv head serves all of them.
    qg = q.reshape(b, m, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    qg = qg.reshape(b, kv_heads, group * m, head_dim)
    # k.transpose(0, 2, 3, 1) is a view [B, kv_heads, head_dim, L]: each head's
    # matrix is strided but BLAS-compatible, so no copy is made.
    scores = (qg @ k.transpose(0, 2, 3, 1)) * np.float32(scale)  # [B, kv, group*M, L]
    scores = scores.reshape(b, kv_heads, group, m, seq_len)
    # The causal mask as an additive bias, -inf on keys past the query's
    # position and 0 elsewhere, added in place (no second [B, kv, group, M, L]
    # array). It needs finite scores, which holds because gather_kv zeroes
    # every padded row: a NaN or 1e30 left in a slot never reaches a score.
    future = np.arange(seq_len)[None, None, :] > q_positions[:, :, None]  # [B, M, L]
    scores += np.where(future, np.float32(-np.inf), np.float32(0))[:, None, None]
    # Stable softmax: subtract the row max. Every row sees its own key, so the
    # max is finite and no row is all -inf.
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores, out=scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs.reshape(b, kv_heads, group * m, seq_len) @ v.transpose(0, 2, 1, 3)
    out = out.reshape(b, kv_heads, group, m, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, m, num_heads, head_dim)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                    model_input: ModelInput, scale: float) -> np.ndarray:
    """Attention for every row of a mixed batch. q: [T, num_heads, head_dim] -> same shape.

    The K/V of this step must already be in the cache (``write_kv`` first).
    Requests with the same number of query rows are stacked into ``attend``
    calls of up to GROUP_SIZE requests of similar length: the decodes of a step
    (M = 1) go a few calls in all, a prefill chunk of a distinct length goes
    alone. Grouping changes speed, not the math.
    """
    out = np.empty_like(q)
    qsl = model_input.query_start_loc
    for m, reqs in request_groups(model_input):
        rows = (qsl[reqs][:, None] + np.arange(m)[None, :]).ravel()  # [len(reqs) * m]
        seq_lens = model_input.seq_lens[reqs]
        k = gather_kv(k_cache, model_input.block_tables[reqs], seq_lens)
        v = gather_kv(v_cache, model_input.block_tables[reqs], seq_lens)
        qb = q[rows].reshape(len(reqs), m, *q.shape[1:])
        pos = model_input.positions[rows].reshape(len(reqs), m)
        out[rows] = attend(qb, k, v, pos, scale).reshape(len(rows), *q.shape[1:])
    return out


def request_groups(model_input: ModelInput, group_size: int | None = GROUP_SIZE):
    """The gather kernels' calls: (m, request indices) for requests with m query rows each.

    Requests with the same number of rows are sorted by length and cut into groups of
    ``group_size``, so keys are padded only up to the longest of a few similar requests;
    ``group_size=None`` keeps each row count in one group (the torch gather).
    """
    num_rows = np.diff(model_input.query_start_loc)
    for m in np.unique(num_rows[num_rows > 0]).tolist():
        same = np.flatnonzero(num_rows == m)
        if group_size is None:
            yield m, same
            continue
        same = same[np.argsort(model_input.seq_lens[same], kind="stable")]
        for reqs in np.array_split(same, -(-len(same) // group_size)):
            yield m, reqs


def gathered_rows(model_input: ModelInput, group_size: int | None = GROUP_SIZE) -> int:
    """K/V rows a gather kernel copies: whole blocks, each group padded to its longest request."""
    bs, seq_lens = model_input.block_size, model_input.seq_lens
    return sum(len(reqs) * -(-int(seq_lens[reqs].max()) // bs) * bs
               for _, reqs in request_groups(model_input, group_size))


def dense_causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                           scale: float) -> np.ndarray:
    """The reference: one sequence, no cache, rows at positions 0..L-1 (float64 inside)."""
    seq_len = q.shape[0]
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), kk) * scale
    scores[:, np.triu(np.ones((seq_len, seq_len), dtype=bool), 1)] = -np.inf
    scores -= scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", probs, vv)
