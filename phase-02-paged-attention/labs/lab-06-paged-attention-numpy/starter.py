"""Lab 02-06 — paged attention in pure numpy (your implementation).

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

    Returns an int64 array of ``num_tokens`` row numbers into the cache viewed as
    ``[num_blocks * block_size, ...]``: position ``t`` sits in physical block
    ``block_table[t // block_size]`` at offset ``t % block_size``.

    Raises ValueError naming the parameter when ``block_size < 1``, ``start < 0`` or
    ``num_tokens < 0``, and naming ``num_tokens`` when the range runs past the last
    slot the table covers (a range ending exactly there is fine).
    """
    raise NotImplementedError("build_slot_mapping: write the slot formula")


def write_kv(
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slot_mapping: np.ndarray,
    new_k: np.ndarray,
    new_v: np.ndarray,
) -> None:
    """Scatter ``new_k[i]`` / ``new_v[i]`` to flat row ``slot_mapping[i]``, in place.

    ``k_cache``/``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``;
    ``new_k``/``new_v``: ``[len(slot_mapping), num_kv_heads, head_dim]``. Only the
    named rows change; the caller's cache arrays themselves are updated (no copy).

    Raises ValueError mentioning ``slot_mapping``, before writing anything, when
    ``new_k`` and ``new_v`` do not both have one row per slot, or when a slot is
    outside ``[0, num_blocks * block_size)``.
    """
    raise NotImplementedError("write_kv: scatter rows through the slot mapping")


def gather_kv(
    cache: np.ndarray, block_table: np.ndarray | list[int], seq_len: int, block_size: int
) -> np.ndarray:
    """The first ``seq_len`` logical rows of one sequence, contiguous, in order.

    Returns ``[seq_len, num_kv_heads, head_dim]``. Rows past ``seq_len`` in the
    tail block are never read (they may hold anything).
    """
    raise NotImplementedError("gather_kv: read through the block table")


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
    num_kv_heads, head_dim]``. Query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)``. Returns ``[num_heads, head_dim]``:
    ``softmax(K q / sqrt(head_dim)) V`` per head over the first ``seq_len`` tokens,
    exact to float64 rounding and finite for scores of any size. The inputs are not
    modified.

    Raises ValueError naming ``seq_len`` when it is < 1, and naming ``num_kv_heads``
    when ``num_heads`` is not a multiple of it.
    """
    raise NotImplementedError("paged_attention: gather, softmax, weighted sum")


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
