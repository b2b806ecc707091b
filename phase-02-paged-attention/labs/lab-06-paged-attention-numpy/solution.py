"""Lab 02-06 — paged attention in pure numpy (reference solution).

One decode step of attention over a paged KV cache, with nothing but numpy:

* ``build_slot_mapping`` — the write map: logical positions -> flat cache rows.
* ``write_kv`` — scatter new K/V rows into the physical cache through that map.
* ``gather_kv`` — the read map: walk the block table, return the first
  ``seq_len`` rows in logical order.
* ``paged_attention`` — softmax(q . K^T / sqrt(d)) . V for one query per head,
  over the gathered rows, with grouped-query attention (several query heads
  share one KV head).

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (what upstream
calls NHD, the flash-attention layout). Token ``t`` of a sequence lives at flat
row ``block_table[t // block_size] * block_size + t % block_size``.

upstream: vllm/v1/worker/block_table.py:326 _compute_slot_mapping_kernel
upstream: csrc/cache_kernels.cu:304 reshape_and_cache_flash_kernel
upstream: csrc/attention/attention_kernels.cuh:202 block_table
mini_vllm/models/attention.py does the same math for the real numpy model.
"""
from __future__ import annotations

import numpy as np


def build_slot_mapping(
    block_table: np.ndarray | list[int], block_size: int, start: int, num_tokens: int
) -> np.ndarray:
    """Flat cache rows for logical positions ``start .. start + num_tokens - 1``.

    Raises ValueError when ``block_size < 1``, ``start < 0``, ``num_tokens < 0``
    or the range runs past the last slot the table covers.
    """
    table = np.asarray(block_table, dtype=np.int64)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    capacity = len(table) * block_size
    if start + num_tokens > capacity:
        raise ValueError(
            f"start + num_tokens must be <= len(block_table) * block_size = {capacity}, "
            f"got {start} + {num_tokens}"
        )
    positions = np.arange(start, start + num_tokens, dtype=np.int64)
    return table[positions // block_size] * block_size + positions % block_size


def write_kv(
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slot_mapping: np.ndarray,
    new_k: np.ndarray,
    new_v: np.ndarray,
) -> None:
    """Scatter ``new_k[i]`` / ``new_v[i]`` to flat row ``slot_mapping[i]``, in place.

    ``k_cache``/``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``;
    ``new_k``/``new_v``: ``[len(slot_mapping), num_kv_heads, head_dim]``.
    """
    slots = np.asarray(slot_mapping, dtype=np.int64)
    if new_k.shape != new_v.shape or new_k.shape[0] != len(slots):
        raise ValueError(
            f"new_k and new_v must both have shape [len(slot_mapping)={len(slots)}, "
            f"num_kv_heads, head_dim], got {new_k.shape} and {new_v.shape}"
        )
    num_blocks, block_size = k_cache.shape[:2]
    if len(slots) and (slots.min() < 0 or slots.max() >= num_blocks * block_size):
        raise ValueError(
            f"slot_mapping entries must be in [0, {num_blocks * block_size}), "
            f"got min {slots.min()} max {slots.max()}"
        )
    rows_k = k_cache.reshape(num_blocks * block_size, *k_cache.shape[2:])
    rows_v = v_cache.reshape(num_blocks * block_size, *v_cache.shape[2:])
    rows_k[slots] = new_k
    rows_v[slots] = new_v


def gather_kv(
    cache: np.ndarray, block_table: np.ndarray | list[int], seq_len: int, block_size: int
) -> np.ndarray:
    """The first ``seq_len`` logical rows of one sequence, contiguous, in order.

    Returns ``[seq_len, num_kv_heads, head_dim]``. Rows past ``seq_len`` in the
    tail block are never read.
    """
    slots = build_slot_mapping(block_table, block_size, 0, seq_len)
    num_blocks = cache.shape[0]
    return cache.reshape(num_blocks * block_size, *cache.shape[2:])[slots]


def paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray | list[int],
    seq_len: int,
    block_size: int,
) -> np.ndarray:
    """Decode attention for one query per head, K/V read through the block table.

    ``q``: ``[num_heads, head_dim]``; caches: ``[num_blocks, block_size,
    num_kv_heads, head_dim]`` with ``num_heads % num_kv_heads == 0``.
    Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
    Returns ``[num_heads, head_dim]``.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    group = num_heads // num_kv_heads
    keys = gather_kv(k_cache, block_table, seq_len, block_size)
    values = gather_kv(v_cache, block_table, seq_len, block_size)
    scale = 1.0 / np.sqrt(head_dim)
    out = np.empty_like(q)
    for h in range(num_heads):
        kv_head = h // group
        scores = keys[:, kv_head, :] @ q[h] * scale
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        out[h] = weights @ values[:, kv_head, :]
    return out


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    block_size, heads, kv_heads, dim, seq_len = 16, 4, 2, 8, 35
    table = [5, 2, 7]
    k_cache = rng.standard_normal((8, block_size, kv_heads, dim))
    v_cache = rng.standard_normal((8, block_size, kv_heads, dim))
    q = rng.standard_normal((heads, dim))
    print("slots of the first 3 tokens:", build_slot_mapping(table, block_size, 0, 3))
    print("slot of token 34:", build_slot_mapping(table, block_size, 34, 1))
    print("output[0, :4] =", np.round(paged_attention(q, k_cache, v_cache, table, seq_len, block_size)[0, :4], 4))
