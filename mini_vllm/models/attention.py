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
attends to its cached prefix and to itself with one gather. Slots that no
block table reaches (free blocks, the tail of a partly filled block, the null
block 0 used as padding) are never read: the tests fill them with huge
numbers and check the output does not move.

upstream: vllm/_custom_ops.py:2591 reshape_and_cache_flash
upstream: vllm/v1/attention/backends/flash_attn.py:667 FlashAttentionImpl.forward
upstream: vllm/v1/attention/ops/triton_unified_attention.py:763 unified_attention
"""
from __future__ import annotations

import numpy as np

from mini_vllm.model_input import ModelInput


def write_kv(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray,
             slot_mapping: np.ndarray) -> None:
    """Store row ``i`` of ``k``/``v`` ([T, kv_heads, head_dim]) in slot ``slot_mapping[i]``."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    # A reshape of a contiguous array is a view, so the assignment lands in the cache.
    k_cache.reshape(num_blocks * block_size, kv_heads, head_dim)[slot_mapping] = k
    v_cache.reshape(num_blocks * block_size, kv_heads, head_dim)[slot_mapping] = v


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """The first ``seq_len`` tokens of one request, in order: [seq_len, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    rows = cache[block_table[:num_blocks]]  # [n, block_size, kv_heads, head_dim]
    return rows.reshape(num_blocks * block_size, *cache.shape[2:])[:seq_len]


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray,
           scale: float) -> np.ndarray:
    """Causal grouped-query attention of M query rows over the L keys of one sequence.

    q: [M, num_heads, head_dim]; k, v: [L, kv_heads, head_dim], key ``j`` at
    position ``j``; q_positions: [M]. Query head ``h`` reads kv head
    ``h // (num_heads // kv_heads)``. Returns [M, num_heads, head_dim].
    """
    m, num_heads, head_dim = q.shape
    seq_len, kv_heads, _ = k.shape
    group = num_heads // kv_heads
    # [kv_heads, group * M, head_dim]: the `group` query heads that share a kv
    # head are stacked so one matmul per kv head serves all of them.
    qg = q.reshape(m, kv_heads, group, head_dim).transpose(1, 2, 0, 3)
    qg = qg.reshape(kv_heads, group * m, head_dim)
    scores = (qg @ k.transpose(1, 2, 0)) * np.float32(scale)  # [kv_heads, group*M, L]
    scores = scores.reshape(kv_heads, group, m, seq_len)
    future = np.arange(seq_len)[None, :] > q_positions[:, None]  # [M, L]
    scores[:, :, future] = -np.inf
    # Stable softmax: subtract the row max. Every row keeps its own key, so the
    # max is finite and no row is all -inf.
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs.reshape(kv_heads, group * m, seq_len) @ v.transpose(1, 0, 2)
    return out.reshape(kv_heads, group, m, head_dim).transpose(2, 0, 1, 3).reshape(
        m, num_heads, head_dim)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                    model_input: ModelInput, scale: float) -> np.ndarray:
    """Attention for every row of a mixed batch. q: [T, num_heads, head_dim] -> same shape.

    The K/V of this step must already be in the cache (``write_kv`` first).
    """
    out = np.empty_like(q)
    qsl = model_input.query_start_loc
    for b in range(model_input.num_reqs):
        start, end = int(qsl[b]), int(qsl[b + 1])
        if start == end:
            continue
        seq_len = int(model_input.seq_lens[b])
        table = model_input.block_tables[b]
        k = gather_kv(k_cache, table, seq_len)
        v = gather_kv(v_cache, table, seq_len)
        out[start:end] = attend(q[start:end], k, v, model_input.positions[start:end], scale)
    return out


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
