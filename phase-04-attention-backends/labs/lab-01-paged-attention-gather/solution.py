"""Lab 04-01 — online softmax over a paged cache, one block at a time (reference solution).

Phase 02 read a paged cache by gathering every row of a sequence into one
contiguous array and then running an ordinary softmax. A GPU kernel cannot
afford that copy. It walks the block table instead, loads one block of K and V
into fast memory, folds it into three running numbers per head, and throws the
block away before loading the next one:

* ``m``   the largest score seen so far,
* ``l``   the sum of ``exp(score - m)`` over the keys seen so far,
* ``acc`` the sum of ``exp(score - m) * v`` over the same keys (not yet divided).

When a new block raises the maximum from ``m`` to ``m'``, every earlier term
was computed against the old maximum, so ``l`` and ``acc`` are multiplied by
``exp(m - m')`` before the new block's terms are added. After the last block,
``acc / l`` is exactly softmax(scores) @ V and ``m + log(l)`` is the
log-sum-exp of all scores (the number lab 04 merges partitions with).

* ``dense_attention`` — the contiguous oracle: one query row per head.
* ``OnlineSoftmaxState`` — the three running quantities and their update.
* ``BlockReader`` (given) — the only way to touch the cache: one block per
  call, into one reused buffer, every read recorded.
* ``paged_online_attention`` — walk the block table and stream the blocks.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``. Query head
``h`` reads KV head ``h // (num_heads // num_kv_heads)``.

upstream: vllm/v1/attention/ops/triton_unified_attention.py:397-403 physical_block_idx
upstream: vllm/v1/attention/ops/triton_attention_helpers.py:361 softmax_step
upstream: csrc/attention/attention_kernels.cuh:343-351 max_logits
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Softmax attention of one query row per head over contiguous keys.

    q: ``[num_heads, head_dim]``; k, v: ``[seq_len, num_kv_heads, head_dim]``
    (array-likes of any float dtype). Returns ``[num_heads, head_dim]`` in float64.

    Raises ValueError naming ``seq_len`` when k holds no rows, ``v`` when its
    shape differs from k's, and ``num_kv_heads`` when the query heads do not
    split evenly over the KV heads.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if k.shape[0] < 1:
        raise ValueError(f"seq_len must be >= 1, got {k.shape[0]} keys")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {k.shape}, got {v.shape}")
    num_heads, num_kv_heads = q.shape[0], k.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})"
        )
    group = num_heads // num_kv_heads
    out = np.empty_like(q)
    for h in range(num_heads):
        scores = k[:, h // group] @ q[h] * scale
        weights = np.exp(scores - scores.max())
        out[h] = weights @ v[:, h // group] / weights.sum()
    return out


@dataclass(slots=True)
class OnlineSoftmaxState:
    """Running softmax of one query row per head, fed one block of keys at a time.

    ``m``: ``[num_heads]`` largest score so far (``-inf`` before any key);
    ``l``: ``[num_heads]`` sum of ``exp(score - m)``;
    ``acc``: ``[num_heads, head_dim]`` sum of ``exp(score - m) * value``, unnormalized.

    upstream: vllm/v1/attention/ops/triton_attention_helpers.py:361 softmax_step
    """

    m: np.ndarray
    l: np.ndarray  # noqa: E741  (the letter the FlashAttention papers use)
    acc: np.ndarray

    @classmethod
    def start(cls, num_heads: int, head_dim: int) -> OnlineSoftmaxState:
        """The state before any key: m = -inf, l = 0, acc = 0 (float64).

        Raises ValueError naming ``num_heads`` or ``head_dim`` when it is < 1.
        """
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        return cls(
            m=np.full(num_heads, -np.inf),
            l=np.zeros(num_heads),
            acc=np.zeros((num_heads, head_dim)),
        )

    def update(self, scores: np.ndarray, values: np.ndarray) -> None:
        """Fold one block into the state, in place.

        scores: ``[num_heads, n]`` (already scaled); values: ``[num_heads, n, head_dim]``
        (each head's own value rows), array-likes. Raises ValueError naming
        ``scores`` when ``n < 1`` or the head count is not the state's, and
        ``values`` when its shape is not ``[num_heads, n, head_dim]``.
        """
        scores = np.asarray(scores, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        num_heads, head_dim = self.acc.shape
        if scores.ndim != 2 or scores.shape[0] != num_heads or scores.shape[1] < 1:
            raise ValueError(
                f"scores must be [num_heads={num_heads}, n >= 1], got {scores.shape}"
            )
        if values.shape != (num_heads, scores.shape[1], head_dim):
            raise ValueError(
                f"values must be {(num_heads, scores.shape[1], head_dim)}, got {values.shape}"
            )
        m_new = np.maximum(self.m, scores.max(axis=1))
        alpha = np.exp(self.m - m_new)  # 0 on the first block: exp(-inf)
        p = np.exp(scores - m_new[:, None])
        self.l = self.l * alpha + p.sum(axis=1)
        self.acc = self.acc * alpha[:, None] + np.einsum("hn,hnd->hd", p, values)
        self.m = m_new

    def output(self) -> np.ndarray:
        """``acc / l``: the attention output, ``[num_heads, head_dim]``.

        Raises ValueError when no key has been folded in yet (``l`` is 0).
        """
        if not np.all(self.l > 0):
            raise ValueError("no keys folded in yet: call update before output")
        return self.acc / self.l[:, None]

    def lse(self) -> np.ndarray:
        """``m + log(l)``: the log-sum-exp of every score seen, ``[num_heads]``."""
        return self.m + np.log(self.l)


class BlockReader:
    """Given. The only door into the cache: one physical block per ``read``.

    ``read(block_id, num_tokens)`` copies the first ``num_tokens`` rows of K
    and V of that block into one reused buffer (think of it as the kernel's
    tile of on-chip memory) and returns views of it, so the rows of a previous
    read are overwritten by the next one. ``trace`` records every call as
    ``(block_id, num_tokens)``.
    """

    def __init__(self, k_cache: np.ndarray, v_cache: np.ndarray) -> None:
        if k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
            raise ValueError(
                "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, "
                f"head_dim], got {k_cache.shape} and {v_cache.shape}"
            )
        self.k_cache, self.v_cache = k_cache, v_cache
        self.num_blocks, self.block_size = k_cache.shape[:2]
        self._k_tile = np.empty(k_cache.shape[1:], dtype=np.float64)
        self._v_tile = np.empty(v_cache.shape[1:], dtype=np.float64)
        self.trace: list[tuple[int, int]] = []

    def read(self, block_id: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V rows ``[num_tokens, num_kv_heads, head_dim]`` of one block (views)."""
        block_id, num_tokens = int(block_id), int(num_tokens)
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block_id must be in [0, {self.num_blocks}), got {block_id}")
        if not 1 <= num_tokens <= self.block_size:
            raise ValueError(
                f"num_tokens must be in [1, {self.block_size}], got {num_tokens}"
            )
        self.trace.append((block_id, num_tokens))
        self._k_tile[:num_tokens] = self.k_cache[block_id, :num_tokens]
        self._v_tile[:num_tokens] = self.v_cache[block_id, :num_tokens]
        return self._k_tile[:num_tokens], self._v_tile[:num_tokens]


def paged_online_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray | list[int],
    seq_len: int,
    scale: float,
    reader: BlockReader | None = None,
) -> tuple[np.ndarray, OnlineSoftmaxState]:
    """Decode attention over a paged cache without gathering it.

    q: ``[num_heads, head_dim]``; caches ``[num_blocks, block_size, num_kv_heads,
    head_dim]``; the sequence's token ``t`` is row ``t % block_size`` of block
    ``block_table[t // block_size]``. Reads blocks ``block_table[0], ...,
    block_table[ceil(seq_len / block_size) - 1]`` once each, in that order,
    through ``reader`` (a fresh ``BlockReader`` when None), and from the last
    one only the rows that belong to the sequence. Returns the output
    ``[num_heads, head_dim]`` (float64) and the final state.

    Raises ValueError naming ``seq_len`` when it is < 1 or more than the table
    covers, and ``num_kv_heads`` when the query heads do not split evenly.

    upstream: vllm/v1/attention/ops/triton_unified_attention.py:397-403 physical_block_idx
    """
    table = np.asarray(block_table, dtype=np.int64)
    num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if seq_len > len(table) * block_size:
        raise ValueError(
            f"seq_len {seq_len} exceeds what block_table covers "
            f"({len(table)} blocks x {block_size} = {len(table) * block_size})"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})"
        )
    if reader is None:
        reader = BlockReader(k_cache, v_cache)
    kv_head = np.arange(num_heads) // (num_heads // num_kv_heads)
    q64 = np.asarray(q, dtype=np.float64)
    state = OnlineSoftmaxState.start(num_heads, head_dim)
    for logical in range(-(-seq_len // block_size)):
        n = min(block_size, seq_len - logical * block_size)
        k, v = reader.read(table[logical], n)
        # k[:, kv_head]: [n, num_heads, head_dim], each query head's own KV rows.
        scores = np.einsum("hd,nhd->hn", q64, k[:, kv_head]) * scale
        state.update(scores, v[:, kv_head].transpose(1, 0, 2))
    return state.output(), state


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    num_blocks, block_size, heads, kv_heads, dim = 8, 4, 4, 2, 8
    k_cache = rng.standard_normal((num_blocks, block_size, kv_heads, dim))
    v_cache = rng.standard_normal((num_blocks, block_size, kv_heads, dim))
    q = rng.standard_normal((heads, dim))
    table, seq_len = [3, 1, 7, 0], 13
    reader = BlockReader(k_cache, v_cache)
    out, state = paged_online_attention(q, k_cache, v_cache, table, seq_len, dim ** -0.5, reader)
    rows = np.concatenate([k_cache[b] for b in table])[:seq_len]
    vals = np.concatenate([v_cache[b] for b in table])[:seq_len]
    dense = dense_attention(q, rows, vals, dim ** -0.5)
    print("reads (block, rows):", reader.trace)
    print("output[0, :4] =", np.round(out[0, :4], 4))
    print(f"max |paged - dense| = {np.abs(out - dense).max():.1e}")
    print("m + log l, head 0 =", np.round(state.lse()[0], 4))
