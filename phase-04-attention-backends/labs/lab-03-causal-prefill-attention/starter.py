"""Lab 04-03 — varlen attention over a paged cache, bottom-right causal (your implementation).

One scheduler step hands the attention kernel a single flat array of query
rows: the chunk of a prompt being prefilled, the one row of each decode, all
packed back to back with no padding. Three small integer arrays say how to cut
it up, and they are the same three that vLLM's ``CommonAttentionMetadata``
carries to every backend:

* ``query_start_loc`` ``[B + 1]``: request ``b`` owns rows
  ``query_start_loc[b] : query_start_loc[b + 1]`` (a prefix sum of the query
  lengths; FlashAttention calls it ``cu_seqlens_q``);
* ``seq_lens`` ``[B]``: how many keys request ``b`` has once this step's K/V
  are written (tokens cached before the step plus the step's own rows;
  FlashAttention's ``seqused_k``);
* ``block_table`` ``[B, W]``: logical block ``i`` of request ``b`` is physical
  block ``block_table[b, i]`` of the cache.

The query rows of a request are always the *last* ``q_len`` positions of its
context, so its row ``i`` sits at position ``seq_len - q_len + i`` and may see
every key up to that position. The causal diagonal therefore ends in the
bottom-right corner of the ``q_len x seq_len`` score matrix. For a whole
prompt (``q_len == seq_len``) that is the familiar ``j <= i``; for a chunk or
a decode it is not, and a top-left mask is silently wrong.

* ``causal_limits`` — the last key each row of a request may see.
* ``read_context`` — a request's first ``seq_len`` K (or V) rows, read through
  its block table and nothing else.
* ``varlen_paged_attention`` — the whole packed batch.
* ``build_paged_cache`` (given) — scatter contiguous sequences into a paged
  cache with shuffled blocks and poisoned free slots, for the tests.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``. Query head
``h`` reads KV head ``h // (num_heads // num_kv_heads)``.

upstream: vllm/v1/attention/backend.py:353 CommonAttentionMetadata
upstream: vllm/v1/attention/backends/flash_attn.py:796 flash_attn_varlen_func
upstream: vllm/v1/attention/ops/triton_unified_attention.py:368 context_len
upstream: vllm/v1/attention/ops/triton_unified_attention.py:491 query_abs_pos
upstream: vllm/v1/attention/ops/triton_attention_helpers.py:284 seq_mask
"""
from __future__ import annotations

import numpy as np


def causal_limits(seq_len: int, q_len: int) -> np.ndarray:
    """The last key index each query row of one request may attend to (inclusive).

    A request whose context holds ``seq_len`` keys after this step computes
    its last ``q_len`` positions, so row ``i`` (``0 <= i < q_len``) is the
    token at position ``seq_len - q_len + i`` and sees keys ``0 ..`` that
    position. Returns an int64 array of length ``q_len`` (empty when
    ``q_len`` is 0).

    Raises ValueError naming ``q_len`` when it is negative or larger than
    ``seq_len``.

    upstream: vllm/v1/attention/ops/triton_unified_attention.py:368 context_len
    """
    raise NotImplementedError("causal_limits: row i sits i places after the cached keys")


def read_context(cache: np.ndarray, block_table_row: np.ndarray | list[int],
                 seq_len: int) -> np.ndarray:
    """Rows ``0 .. seq_len - 1`` of one request, read through its block table.

    cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (K or V);
    block_table_row: that request's physical block ids (array-like of ints,
    entries past the ones it needs are ignored, whatever they hold). Token
    ``t`` is row ``t % block_size`` of physical block
    ``block_table_row[t // block_size]``. Only those ``seq_len`` slots are
    read: the rest of the last block and every later entry of the row may
    hold anything (NaN included). Returns a new float64 array
    ``[seq_len, num_kv_heads, head_dim]`` (zero rows when ``seq_len`` is 0).

    Raises ValueError naming ``seq_len`` when it is negative, and
    ``block_table`` when the row has too few entries for ``seq_len`` tokens
    or an entry it needs lies outside ``[0, num_blocks)``.

    upstream: vllm/v1/attention/ops/triton_unified_attention.py:401-403 physical_block_idx
    """
    raise NotImplementedError("read_context: token t lives in block_table_row[t // block_size]")


def varlen_paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    query_start_loc: np.ndarray | list[int],
    seq_lens: np.ndarray | list[int],
    block_table: np.ndarray | list[list[int]],
    scale: float,
) -> np.ndarray:
    """Causal attention for a packed batch of prefill chunks and decodes.

    q: ``[T, num_heads, head_dim]``, every request's query rows back to back;
    caches ``[num_blocks, block_size, num_kv_heads, head_dim]`` already holding
    this step's K/V; query_start_loc ``[B + 1]``; seq_lens ``[B]`` (keys per
    request after this step); block_table ``[B, W]`` (array-likes of ints).
    Request ``b`` owns rows ``query_start_loc[b] : query_start_loc[b + 1]``;
    with ``q_len = query_start_loc[b + 1] - query_start_loc[b]``, its row
    ``i`` attends to its own keys ``j <= seq_lens[b] - q_len + i`` and to no
    other request's. Query head ``h`` uses KV head
    ``h // (num_heads // num_kv_heads)``; scores are ``q . k * scale``.
    A request with ``q_len == 0`` (vLLM pads batches with such requests) owns
    no rows and reads nothing. Keys are read only through the block table and
    only below each ``seq_lens[b]``. Returns ``[T, num_heads, head_dim]``
    float64; the inputs are left unchanged.

    Raises ValueError naming ``q`` (not 3-D, or a head_dim unlike the cache's),
    ``k_cache``/``v_cache`` (not 4-D or shapes that differ),
    ``num_kv_heads`` (does not divide num_heads), ``query_start_loc`` (not
    ``B + 1`` long, not starting at 0, decreasing, or not ending at T),
    ``seq_lens`` (negative, or shorter than a request's query rows) and
    ``block_table`` (not ``B`` rows, too narrow for a ``seq_lens`` entry, or
    an entry needed outside the cache).

    upstream: vllm/v1/attention/backends/flash_attn.py:796 flash_attn_varlen_func
    upstream: vllm/v1/attention/ops/triton_attention_helpers.py:73 cur_batch_query_len
    """
    raise NotImplementedError("varlen_paged_attention: cut q by query_start_loc, mask each request")


def build_paged_cache(
    keys: list[np.ndarray],
    values: list[np.ndarray],
    block_size: int,
    num_blocks: int,
    seed: int = 0,
    fill: float = np.nan,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Given. Scatter contiguous per-request K/V into a paged cache with shuffled blocks.

    keys[b], values[b]: ``[L_b, num_kv_heads, head_dim]``. Each request gets
    ``ceil(L_b / block_size)`` physical blocks drawn (seeded) from
    ``1 .. num_blocks - 1`` in shuffled order; block 0 stays the null block.
    Every slot that holds no token (the tail of a last block, unused blocks,
    block 0) holds ``fill``, NaN by default: a stale slot that must never be
    read. Returns ``(k_cache, v_cache, block_table)``: float64 caches
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` and an int64 table
    ``[B, W]`` (``W`` the most blocks any request needs, at least 1), padded
    with 0.

    Raises ValueError naming ``num_blocks`` when the blocks do not fit.
    """
    need = [-(-len(k) // block_size) for k in keys]
    if sum(need) > num_blocks - 1:
        raise ValueError(f"num_blocks={num_blocks} leaves {num_blocks - 1} usable blocks, "
                         f"the sequences need {sum(need)}")
    shape = (num_blocks, block_size, *np.shape(keys[0])[1:])
    k_cache, v_cache = np.full(shape, fill), np.full(shape, fill)
    pool = np.random.default_rng(seed).permutation(np.arange(1, num_blocks))
    table = np.zeros((len(keys), max(1, *need)), dtype=np.int64)
    taken = 0
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        table[b, :need[b]] = pool[taken:taken + need[b]]
        taken += need[b]
        for t in range(len(k)):
            k_cache[table[b, t // block_size], t % block_size] = k[t]
            v_cache[table[b, t // block_size], t % block_size] = v[t]
    return k_cache, v_cache, table


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    heads, kv_heads, dim, block = 4, 2, 8, 4
    # Three requests in one step: positions 5..8 of a 9-token context (a later
    # prefill chunk), one decode at position 7, and a fresh 7-token prompt.
    lens, q_lens = [9, 8, 7], [4, 1, 7]
    k_seqs = [rng.standard_normal((n, kv_heads, dim)) for n in lens]
    v_seqs = [rng.standard_normal((n, kv_heads, dim)) for n in lens]
    q_full = [rng.standard_normal((n, heads, dim)) for n in lens]
    k_cache, v_cache, table = build_paged_cache(k_seqs, v_seqs, block, num_blocks=10)
    qsl = np.concatenate([[0], np.cumsum(q_lens)])
    q = np.concatenate([qf[n - m:] for qf, n, m in zip(q_full, lens, q_lens, strict=True)])
    out = varlen_paged_attention(q, k_cache, v_cache, qsl, lens, table, dim ** -0.5)
    worst = 0.0
    for b, (n, m) in enumerate(zip(lens, q_lens, strict=True)):
        print(f"request {b}: rows {qsl[b]}..{qsl[b + 1] - 1} see keys up to "
              f"{causal_limits(n, m).tolist()}")
        # the same rows of an ordinary full-prompt causal pass
        group = heads // kv_heads
        kk, vv = np.repeat(k_seqs[b], group, 1), np.repeat(v_seqs[b], group, 1)
        s = np.einsum("ihd,jhd->hij", q_full[b], kk) * dim ** -0.5
        s[:, np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        dense = np.einsum("hij,jhd->ihd", p / p.sum(-1, keepdims=True), vv)[n - m:]
        worst = max(worst, float(np.abs(out[qsl[b]:qsl[b + 1]] - dense).max()))
    print(f"max |varlen - dense causal| = {worst:.1e}")
    print("block_table =", table.tolist())
