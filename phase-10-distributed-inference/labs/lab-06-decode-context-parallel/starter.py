"""Lab 10-06 — decode context parallelism: shard the KV cache by token, merge by LSE (your implementation).

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
import torch  # noqa: F401 - cp_lse_ag_out_ar moves numpy arrays as torch tensors
import torch.distributed as dist  # noqa: F401 - your collectives

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
    raise NotImplementedError("kv_copies: replicas = tp_size // heads (1 when tp_size <= heads); copies = replicas // dcp_size")


def dcp_rank_of(positions, dcp_size: int, interleave_size: int = 1) -> np.ndarray:
    """The DCP rank that stores each token position: ``(p // interleave_size) % dcp_size``.

    positions: integers >= 0, any shape. Returns int64, same shape. Runs of
    ``interleave_size`` consecutive positions go to ranks 0, 1, ...,
    ``dcp_size - 1``, then round again.

    Raises ValueError naming ``positions`` (not integers >= 0), ``dcp_size`` or
    ``interleave_size`` (not an integer >= 1).

    upstream: vllm/v1/worker/block_table.py:369 is_local
    """
    raise NotImplementedError("dcp_rank_of: (p // interleave_size) % dcp_size")


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
    raise NotImplementedError("local_seq_lens: base = L // I // N * I; each rank adds clip(L - base*N - r*I, 0, I)")


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
    raise NotImplementedError("slot_mapping: off = p % (block_size*N); local = off // (N*I) * I + off % I; -1 where not mine")


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
    raise NotImplementedError("correct_attn_out: lse = m + log(sum exp(lses - m)); factor = exp(lses[cp_rank] - lse)")


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
    raise NotImplementedError("cp_lse_ag_out_ar: dist.all_gather the [B, H] LSEs, correct_attn_out, dist.all_reduce the outputs")


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
    raise NotImplementedError("dcp_decode_attention: local_seq_lens -> slots via block_table -> attend_with_lse -> cp_lse_ag_out_ar")


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
