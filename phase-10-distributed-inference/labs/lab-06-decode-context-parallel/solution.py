"""Lab 10-06 — decode context parallelism: shard the KV cache by token, merge by LSE (reference solution).

Tensor parallelism splits a layer's KV heads across ranks. A model has few KV
heads (8 for many GQA models, 4 for Qwen3-235B, effectively one for
DeepSeek's MLA), so once the TP size passes that count every extra rank holds
a *copy* of some head's cache. Decode context parallelism (DCP) spends those
copies differently: the ranks of a DCP group share one KV head and split the
*tokens* of every context between them, so each stores ``1 / dcp_size`` of
the cache and the group holds one copy instead of ``dcp_size``.

The price is one combination per attention layer. Each rank attends its query
rows to its own tokens only and gets a partial answer, normalized over its
own keys, plus the log-sum-exp (LSE) of its scores. Phase 04's merge turns any
set of such partials into the exact attention over all keys; DCP runs that
merge with two collectives (upstream's ``cp_lse_ag_out_ar``):

1. ``all_gather`` the LSEs (small: one number per query row and head);
2. each rank rescales its own partial output by
   ``exp(lse_rank - lse_total)`` (``correct_attn_out``);
3. ``all_reduce`` (sum) the rescaled outputs: every rank now holds the
   attention over the whole context.

Which rank stores which token is set by ``cp_kv_cache_interleave_size`` ``I``:
runs of ``I`` consecutive positions go to ranks 0, 1, ..., N - 1 in turn, so
position ``p`` lives on rank ``(p // I) % N``. ``I = 1`` deals tokens one at a
time; ``I = block_size`` fills a whole block on one rank before moving on. Each
rank keeps its tokens in its own paged cache, compacted: one entry of the
request's block table stands for ``block_size * N`` positions (a *virtual*
block), of which each rank stores ``block_size`` in its physical block with
that id.

The functions, in the order you write them:

* ``kv_copies`` — how many copies of each token's K/V a TP group stores, with
  and without DCP, and upstream's rules for a valid ``dcp_size``;
* ``dcp_rank_of`` — the rank that stores each position;
* ``local_seq_lens`` — how many of a context's tokens each rank stores
  (upstream's ``get_dcp_local_seq_lens``);
* ``slot_mapping`` — where each new token's K/V goes in this rank's cache,
  ``PAD_SLOT_ID`` when another rank stores it;
* ``correct_attn_out`` — the rescaling of step 2 (upstream's Triton kernel);
* ``cp_lse_ag_out_ar`` — steps 1 to 3 with real ``torch.distributed`` calls;
* ``dcp_decode_attention`` — one rank's whole decode attention: read the
  local tokens through the block table, attend, combine.

Given: ``PAD_SLOT_ID`` and ``attend_with_lse`` (Phase 04's partial attention,
returning the LSE in FlashAttention's ``[num_heads, num_tokens]`` layout).

Shapes follow vLLM: query rows and outputs ``[num_tokens, num_heads,
head_dim]``; keys and values ``[num_keys, num_kv_heads, head_dim]``; a paged
cache ``[num_blocks, block_size, num_kv_heads, head_dim]``; LSEs in the DCP
combine ``[num_tokens, num_heads]``. Attention math is float64 numpy; the
collectives move the same numbers as torch tensors (``torch.from_numpy``).

upstream: vllm/config/parallel.py:334 cp_kv_cache_interleave_size
upstream: vllm/v1/attention/ops/common.py:237 cp_lse_ag_out_ar
upstream: vllm/v1/attention/ops/common.py:110 correct_attn_out
upstream: vllm/v1/attention/backends/utils.py:857 get_dcp_local_seq_lens
upstream: vllm/v1/worker/block_table.py:326 _compute_slot_mapping_kernel
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

PAD_SLOT_ID = -1  # a slot mapping's "not stored here" (upstream's PAD_SLOT_ID)


# ---------------------------------------------------------------- given


def attend_with_lse(q, k, v, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Given (Phase 04's partial attention). Every query row over every key of ``k``.

    q: ``[num_tokens, num_heads, head_dim]``; k, v: ``[num_keys, num_kv_heads,
    head_dim]``; query head ``h`` reads KV head ``h // (num_heads //
    num_kv_heads)``. No mask. Returns float64 ``(out, lse)``: ``out`` ``[T, H,
    D]`` normalized over these keys, ``lse`` ``[H, T]`` (FlashAttention's
    layout, heads first). No keys: ``out = 0``, ``lse = -inf``.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    num_tokens, num_heads, head_dim = q.shape
    if k.shape[0] == 0:
        return np.zeros((num_tokens, num_heads, head_dim)), np.full((num_heads, num_tokens), -np.inf)
    kv_head = np.arange(num_heads) // (num_heads // k.shape[1])
    scores = np.einsum("thd,nhd->htn", q, k[:, kv_head]) * scale  # [H, T, N]
    m = scores.max(axis=-1)
    p = np.exp(scores - m[..., None])
    denom = p.sum(axis=-1)
    out = np.einsum("htn,nhd->thd", p, v[:, kv_head]) / denom.T[..., None]
    return out, m + np.log(denom)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _int_array(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" or (arr.size and arr.min() < 0):
        raise ValueError(f"{name} must hold integers >= 0, got {x!r}")
    return arr.astype(np.int64)


# ---------------------------------------------------------------- the layout


def kv_copies(tp_size: int, num_kv_heads: int, dcp_size: int = 1, use_mla: bool = False) -> int:
    """How many ranks of a TP group store each token's K/V for one KV head.

    Without DCP a TP group of ``tp_size`` ranks splits ``num_kv_heads`` heads:
    when ``tp_size <= num_kv_heads`` each rank owns ``num_kv_heads / tp_size``
    heads and every token is stored once; when ``tp_size > num_kv_heads`` each
    head is replicated on ``tp_size / num_kv_heads`` ranks, and so is every
    token of it. MLA caches one latent vector per token shared by all heads:
    it behaves as one KV head (``num_kv_heads`` is then not used). DCP splits
    each set of replicas into groups of ``dcp_size`` that divide the tokens:
    ``copies = replicas / dcp_size``.

    Returns an int >= 1. Examples: MLA at TP 8 -> 8, with DCP 8 -> 1; 4 KV
    heads at TP 8 -> 2, with DCP 2 -> 1.

    Raises ValueError naming ``tp_size`` or ``dcp_size`` (not an integer >= 1),
    ``num_kv_heads`` (not an integer >= 1, or, without MLA, neither dividing
    nor divisible by ``tp_size``), and ``dcp_size`` when ``tp_size %
    dcp_size != 0``, when ``dcp_size > 1`` without MLA and ``tp_size <=
    num_kv_heads`` (nothing is replicated), or when ``dcp_size`` does not
    divide the replica count (upstream checks ``dcp_size <= tp_size //
    num_kv_heads``; this lab asks for a divisor so each DCP group shares one
    head).

    upstream: vllm/config/parallel.py:478 decode_context_parallel_size
    upstream: vllm/config/model.py:1225 max_dcp_size
    """
    if not _is_int(tp_size) or tp_size < 1:
        raise ValueError(f"tp_size must be an integer >= 1, got {tp_size!r}")
    if not _is_int(num_kv_heads) or num_kv_heads < 1:
        raise ValueError(f"num_kv_heads must be an integer >= 1, got {num_kv_heads!r}")
    if not _is_int(dcp_size) or dcp_size < 1:
        raise ValueError(f"dcp_size must be an integer >= 1, got {dcp_size!r}")
    if tp_size % dcp_size:
        raise ValueError(f"dcp_size ({dcp_size}) must divide tp_size ({tp_size})")
    heads = 1 if use_mla else num_kv_heads  # MLA: one latent "head" shared by every query head
    if tp_size <= heads:
        if heads % tp_size:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must be divisible by tp_size ({tp_size})")
        if dcp_size > 1:
            raise ValueError(f"dcp_size > 1 needs tp_size ({tp_size}) > num_kv_heads ({num_kv_heads}): "
                             f"with no replicated heads there is nothing to split")
        return 1
    if tp_size % heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide tp_size ({tp_size})")
    replicas = tp_size // heads
    if replicas % dcp_size:
        raise ValueError(f"dcp_size ({dcp_size}) must divide the {replicas} replicas of each KV head "
                         f"(tp_size // num_kv_heads)")
    return replicas // dcp_size


def dcp_rank_of(positions, dcp_size: int, interleave_size: int = 1) -> np.ndarray:
    """The DCP rank that stores each token position: ``(p // interleave_size) % dcp_size``.

    positions: integers >= 0, any shape. Returns int64, same shape. Runs of
    ``interleave_size`` consecutive positions go to ranks 0, 1, ...,
    ``dcp_size - 1``, then round again.

    Raises ValueError naming ``positions`` (not integers >= 0), ``dcp_size`` or
    ``interleave_size`` (not an integer >= 1).

    upstream: vllm/v1/worker/block_table.py:369 is_local
    """
    pos = _int_array(positions, "positions")
    if not _is_int(dcp_size) or dcp_size < 1:
        raise ValueError(f"dcp_size must be an integer >= 1, got {dcp_size!r}")
    if not _is_int(interleave_size) or interleave_size < 1:
        raise ValueError(f"interleave_size must be an integer >= 1, got {interleave_size!r}")
    return (pos // interleave_size) % dcp_size


def local_seq_lens(seq_lens, dcp_size: int, dcp_rank: int | None = None,
                   interleave_size: int = 1) -> np.ndarray:
    """How many of each context's tokens a DCP rank stores.

    seq_lens: integers >= 0, shape ``[B]`` (tokens per request). A context of
    ``L`` tokens spread by ``dcp_rank_of`` gives rank ``r``
    ``base + clip(rest - r * I, 0, I)`` tokens, where ``base = L // I // N * I``
    (full rounds of ``N * I`` tokens) and ``rest = L - base * N`` (the last,
    partial round, filled from rank 0). The counts of all ranks sum to ``L``.

    Returns int64 ``[B]`` for one ``dcp_rank``, or ``[B, dcp_size]`` (column
    ``r`` for rank ``r``) when ``dcp_rank`` is None.

    Raises ValueError naming ``seq_lens`` (not a 1-D array of integers >= 0),
    ``dcp_size`` or ``interleave_size`` (not an integer >= 1) and ``dcp_rank``
    (not None nor an integer in ``0..dcp_size - 1``).

    upstream: vllm/v1/attention/backends/utils.py:857 get_dcp_local_seq_lens
    """
    lens = _int_array(seq_lens, "seq_lens")
    if lens.ndim != 1:
        raise ValueError(f"seq_lens must be 1-D [num_requests], got shape {lens.shape}")
    if not _is_int(dcp_size) or dcp_size < 1:
        raise ValueError(f"dcp_size must be an integer >= 1, got {dcp_size!r}")
    if not _is_int(interleave_size) or interleave_size < 1:
        raise ValueError(f"interleave_size must be an integer >= 1, got {interleave_size!r}")
    if dcp_rank is not None and (not _is_int(dcp_rank) or not 0 <= dcp_rank < dcp_size):
        raise ValueError(f"dcp_rank must be None or an integer in 0..{dcp_size - 1}, got {dcp_rank!r}")
    ranks = np.arange(dcp_size) if dcp_rank is None else np.array([dcp_rank])
    base = lens // interleave_size // dcp_size * interleave_size  # per rank, full rounds
    rest = lens - base * dcp_size  # < N * I tokens, dealt from rank 0
    extra = np.clip(rest[:, None] - ranks[None, :] * interleave_size, 0, interleave_size)
    out = base[:, None] + extra
    return out if dcp_rank is None else out[:, 0]


def slot_mapping(positions, block_table, block_size: int, dcp_size: int, dcp_rank: int,
                 interleave_size: int = 1) -> np.ndarray:
    """Where this rank writes each new token's K/V: a slot in its paged cache, or ``PAD_SLOT_ID``.

    positions: integers >= 0 ``[T]`` (one request's new tokens); block_table:
    integers >= 0 ``[num_blocks]``, the request's block ids, the same on every
    rank. Entry ``b`` of the table covers the *virtual* block of positions
    ``b * block_size * N .. (b + 1) * block_size * N - 1``; of those, each rank
    stores the ``block_size`` it owns (``dcp_rank_of``) in its physical block
    ``block_table[b]``, compacted in position order. With ``off = p % (block_size
    * N)`` the offset inside the block is ``off // (N * I) * I + off % I`` and
    the slot is ``block_table[b] * block_size + offset``. Positions another
    rank owns map to ``PAD_SLOT_ID`` (-1). Returns int64 ``[T]``.

    Raises ValueError naming ``positions`` (not 1-D integers >= 0, or past
    the end of the block table), ``block_table`` (not 1-D integers >= 0),
    ``block_size`` or ``dcp_size`` (not an integer >= 1), ``dcp_rank`` (not in
    ``0..dcp_size - 1``) and ``interleave_size`` (not an integer >= 1, larger
    than ``block_size`` or not dividing it: upstream refuses that config).

    upstream: vllm/v1/worker/block_table.py:357 virtual_block_size
    upstream: vllm/config/vllm.py:2093 cp_kv_cache_interleave_size
    """
    pos = _int_array(positions, "positions")
    table = _int_array(block_table, "block_table")
    if pos.ndim != 1:
        raise ValueError(f"positions must be 1-D, got shape {pos.shape}")
    if table.ndim != 1:
        raise ValueError(f"block_table must be 1-D, got shape {table.shape}")
    for name, value in (("block_size", block_size), ("dcp_size", dcp_size)):
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not _is_int(dcp_rank) or not 0 <= dcp_rank < dcp_size:
        raise ValueError(f"dcp_rank must be an integer in 0..{dcp_size - 1}, got {dcp_rank!r}")
    if not _is_int(interleave_size) or interleave_size < 1 or block_size % interleave_size:
        raise ValueError(f"interleave_size must be an integer >= 1 that divides block_size "
                         f"({block_size}), got {interleave_size!r}")
    virtual = block_size * dcp_size  # positions per block-table entry, all ranks together
    block_idx = pos // virtual
    if pos.size and block_idx.max() >= table.size:
        raise ValueError(f"positions reach virtual block {int(block_idx.max())}, but block_table "
                         f"has {table.size} entries ({virtual} positions each)")
    off = pos % virtual
    local = off // (dcp_size * interleave_size) * interleave_size + off % interleave_size
    slots = table[block_idx] * block_size + local
    mine = dcp_rank_of(pos, dcp_size, interleave_size) == dcp_rank
    return np.where(mine, slots, PAD_SLOT_ID).astype(np.int64)


# ---------------------------------------------------------------- the combine


def correct_attn_out(out, lses, cp_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rescale this rank's partial output by its share of the total softmax mass.

    out: ``[B, H, D]``, this rank's attention normalized over its own keys;
    lses: ``[N, B, H]``, every rank's LSE (row ``n`` from rank ``n`` of the
    group); cp_rank: this rank's index in the group. Per query row and head:

    * an LSE that is NaN or ``+inf`` counts as ``-inf`` (a rank with no keys);
    * ``lse = log(sum_n exp(lses[n] - m)) + m`` with ``m`` the largest LSE
      (``m = 0`` when all are ``-inf``, so nothing computes ``-inf - -inf``;
      the total is then ``-inf``);
    * ``factor = exp(lses[cp_rank] - lse)``, 0 when that difference is NaN or
      ``+inf``.

    Returns float64 ``(out * factor, lse)``: ``[B, H, D]`` and ``[B, H]``.
    Summing the first over the ranks gives the attention over all keys. No
    exponent is positive, so LSEs in the hundreds do not overflow.

    Raises ValueError naming ``out`` (not 3-D), ``lses`` (not 3-D with
    ``lses.shape[1:] == out.shape[:2]``) and ``cp_rank`` (not an integer in
    ``0..N - 1``).

    upstream: vllm/v1/attention/ops/common.py:10 _correct_attn_cp_out_kernel
    """
    out = np.asarray(out, dtype=np.float64)
    lses = np.asarray(lses, dtype=np.float64)
    if out.ndim != 3:
        raise ValueError(f"out must be [B, H, D], got shape {out.shape}")
    if lses.ndim != 3 or lses.shape[1:] != out.shape[:2]:
        raise ValueError(f"lses must be [N, B, H] with [B, H] = {out.shape[:2]}, got shape {lses.shape}")
    if not _is_int(cp_rank) or not 0 <= cp_rank < lses.shape[0]:
        raise ValueError(f"cp_rank must be an integer in 0..{lses.shape[0] - 1}, got {cp_rank!r}")
    clean = np.where(np.isnan(lses) | (lses == np.inf), -np.inf, lses)
    m = clean.max(axis=0)
    m = np.where(m == -np.inf, 0.0, m)  # all empty: a finite shift, no -inf - -inf
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer for "no keys anywhere"
        lse = np.log(np.exp(clean - m).sum(axis=0)) + m
    with np.errstate(invalid="ignore"):  # -inf - -inf = NaN, mapped to weight 0 below
        diff = clean[cp_rank] - lse
    diff = np.where(np.isnan(diff) | (diff == np.inf), -np.inf, diff)
    return out * np.exp(diff)[..., None], lse


def cp_lse_ag_out_ar(cp_attn_out, cp_attn_lse, group=None, return_lse: bool = False):
    """Combine the ranks' partial attentions: all-gather the LSEs, correct, all-reduce the outputs.

    Call on every rank of ``group`` (a ``torch.distributed`` process group;
    None for the default, whole world) with this rank's ``cp_attn_out`` ``[B,
    H, D]`` (normalized over its keys) and ``cp_attn_lse`` ``[B, H]``. Exactly
    two collectives: one ``dist.all_gather`` of the ``[B, H]`` LSEs (never the
    outputs), then ``correct_attn_out`` with this rank's index *in the group*,
    then one ``dist.all_reduce`` (sum) of the corrected ``[B, H, D]`` outputs.
    Call them through the module, as ``dist.all_gather(...)``: the tests count
    the calls there.
    A group of one rank returns its inputs (as float64) with no collective.

    Returns float64 ``out`` ``[B, H, D]``, the attention over every rank's
    keys, identical on all ranks; with ``return_lse=True``, ``(out, lse)``
    with ``lse`` ``[B, H]`` the LSE over all keys.

    Raises ValueError naming ``cp_attn_out`` (not 3-D) and ``cp_attn_lse``
    (shape not ``[B, H]``), both checked before any ``torch.distributed``
    call, and ``group`` (this rank is not a member: ``dist.get_rank(group)``
    is then -1).

    upstream: vllm/v1/attention/ops/common.py:237 cp_lse_ag_out_ar
    upstream: vllm/v1/attention/ops/common.py:181 _cp_lse_common
    """
    out = np.asarray(cp_attn_out, dtype=np.float64)
    lse = np.asarray(cp_attn_lse, dtype=np.float64)
    if out.ndim != 3:
        raise ValueError(f"cp_attn_out must be [B, H, D], got shape {out.shape}")
    if lse.shape != out.shape[:2]:
        raise ValueError(f"cp_attn_lse must be [B, H] = {out.shape[:2]}, got shape {lse.shape}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this rank is not a member of the process group")
    world = dist.get_world_size(group)
    if world == 1:
        return (out, lse) if return_lse else out
    # 1. every rank's LSE, [N, B, H]: a few bytes per query row and head
    mine = torch.from_numpy(np.ascontiguousarray(lse))
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    lses = np.stack([t.numpy() for t in gathered])
    # 2. this rank's share of the softmax mass; its index in the *group*, not the world
    corrected, total_lse = correct_attn_out(out, lses, rank)
    # 3. the shares add up to the full attention
    summed = torch.from_numpy(np.ascontiguousarray(corrected))
    dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
    result = summed.numpy()
    return (result, total_lse) if return_lse else result


def dcp_decode_attention(q, key_cache, value_cache, block_table, seq_len: int, scale: float,
                         interleave_size: int = 1, group=None) -> tuple[np.ndarray, np.ndarray]:
    """One rank's decode attention under DCP: local tokens, partial attention, combine.

    q: ``[T, H, D]`` query rows (the same on every rank of ``group``);
    key_cache, value_cache: this rank's paged cache ``[num_blocks,
    block_size, Hkv, D]``, filled through ``slot_mapping`` with this rank's
    index in ``group``; block_table: the request's block ids ``[num_blocks]``
    (the same on every rank); seq_len: the context length, all ranks
    together. The rank reads its ``local_seq_lens`` tokens: local token ``j``
    sits at offset ``j % block_size`` of block ``block_table[j //
    block_size]``. It attends to them with ``attend_with_lse`` (LSE ``[H,
    T]``, transposed to ``[T, H]`` for the combine) and calls
    ``cp_lse_ag_out_ar(..., return_lse=True)``.

    Returns float64 ``(out [T, H, D], lse [T, H])``: attention over all
    ``seq_len`` positions, on every rank. A rank that stores no token of the
    context still takes part in both collectives.

    Raises ValueError naming ``key_cache`` (not 4-D), ``value_cache`` (shape
    unlike key_cache's), ``seq_len`` (not an integer >= 0, or more positions
    than ``block_table`` covers) and ``interleave_size`` (not dividing the
    cache's block size); bad ``q`` or ``block_table`` fail in the helpers.

    upstream: vllm/v1/attention/backends/flash_attn.py:885 _forward_with_dcp
    """
    k_cache = np.asarray(key_cache, dtype=np.float64)
    v_cache = np.asarray(value_cache, dtype=np.float64)
    if k_cache.ndim != 4:
        raise ValueError(f"key_cache must be [num_blocks, block_size, Hkv, D], got shape {k_cache.shape}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"value_cache must have key_cache's shape {k_cache.shape}, got {v_cache.shape}")
    table = _int_array(block_table, "block_table")
    block_size = k_cache.shape[1]
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if not _is_int(seq_len) or seq_len < 0 or seq_len > table.size * block_size * world:
        raise ValueError(f"seq_len must be an integer in 0..{table.size * block_size * world} "
                         f"(block_table covers that many positions), got {seq_len!r}")
    if not _is_int(interleave_size) or interleave_size < 1 or block_size % interleave_size:
        raise ValueError(f"interleave_size must be an integer >= 1 that divides block_size "
                         f"({block_size}), got {interleave_size!r}")
    n_local = int(local_seq_lens([seq_len], world, rank, interleave_size)[0])
    j = np.arange(n_local)
    slots = table[j // block_size] * block_size + j % block_size
    flat_k = k_cache.reshape(-1, *k_cache.shape[2:])
    flat_v = v_cache.reshape(-1, *v_cache.shape[2:])
    out, lse_ht = attend_with_lse(q, flat_k[slots], flat_v[slots], scale)
    # FlashAttention hands back [H, T]; the DCP combine wants [T, H]
    return cp_lse_ag_out_ar(out, lse_ht.T, group=group, return_lse=True)


def _example() -> None:
    """Where 10 tokens live on 2 ranks, and a two-rank correction worked by hand."""
    positions = np.arange(10)
    for size in (1, 4):
        owners = dcp_rank_of(positions, 2, size)
        lens = local_seq_lens([10], 2, None, size)[0]
        print(f"interleave {size}: owners {''.join(str(r) for r in owners)}  "
              f"local lengths {lens.tolist()}")
    slots = slot_mapping(positions, [7, 3], 4, 2, 0, 1)
    print(f"rank 0 slots (block table [7, 3], block size 4): {slots.tolist()}")
    # rank 0 saw scores whose exp-sum is 1 (lse 0), rank 1 saw 3 (lse ln 3): shares 1/4, 3/4
    lses = np.array([0.0, np.log(3.0)]).reshape(2, 1, 1)
    parts = [correct_attn_out(np.full((1, 1, 1), value), lses, r)
             for r, value in enumerate((10.0, 30.0))]
    print(f"partials 10 and 30, lse 0 and ln 3: total lse ln {np.exp(parts[0][1].item()):.4f}, "
          f"combined {sum(p[0].item() for p in parts):.4f}")
    print(f"KV copies, 4 KV heads at TP 8: {kv_copies(8, 4)}; with DCP 2: {kv_copies(8, 4, 2)}")


if __name__ == "__main__":
    _example()
