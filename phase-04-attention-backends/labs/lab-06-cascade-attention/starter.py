"""Lab 04-06 — cascade attention: read a shared prefix once (your work).

When every running request starts with the same cached blocks (one system
prompt, many users), a normal decode step reads those blocks once per request.
Cascade attention splits the step into two passes and merges them:

1. the **prefix pass**: every query row of the batch, packed together as if
   it were one request, attends to the shared blocks with *no* mask; the
   blocks are read once for the whole batch;
2. the **suffix pass**: each request's rows attend to its own keys after the
   prefix, with the usual bottom-right causal mask;
3. the two normalized partial outputs are merged by their log-sum-exps (the
   same merge as lab 04's flash-decoding partitions).

Four decisions come before the math, and they are the part of vLLM this lab
reimplements exactly:

* ``num_common_prefix_blocks`` — how many leading blocks *every* request that
  holds KV references (a block's ``ref_cnt`` equals that number of requests);
* ``cascade_prefix_len`` — how many of those tokens the unmasked prefix pass
  may use: capped by the smallest ``num_computed_tokens`` and cut to a whole
  number of blocks;
* ``cascade_cost_model`` / ``use_cascade_attention`` — vLLM's heuristic: is
  the prefix long enough, are there enough requests, and would the cascade
  kernel beat flash-decoding in a rough count of waves and tiles;
* ``kv_rows_read`` — the saving, in K/V rows read per layer.

``measure_shared_prefix_decode`` runs mini_vllm with eight requests that share
a 512-token prefix, captures the decode step's block tables and reference
counts, and feeds them through the functions above.

Given (identical in starter.py): ``attention_with_lse`` (masked attention that
also returns the log-sum-exp), ``merge_attn_states`` (lab 04's merge, vLLM's
shapes), and the ``SharedPrefixMeasurement`` record.

upstream: vllm/v1/core/single_type_kv_cache_manager.py:531 FullAttentionManager.get_num_common_prefix_blocks
upstream: vllm/v1/worker/gpu_model_runner.py:2520 _compute_cascade_attn_prefix_len
upstream: vllm/v1/attention/backends/flash_attn.py:1054 use_cascade_attention
upstream: vllm/v1/attention/backends/flash_attn.py:1132 cascade_attention
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# The heuristic's constants (flash_attn.py, use_cascade_attention).
MIN_COMMON_PREFIX_LEN = 256  # shorter prefixes: not worth a second kernel
MIN_NUM_REQS = 8  # fewer requests: not worth it either
Q_TILE_SIZE = 128  # flash-attn's default tile sizes in the cost model
KV_TILE_SIZE = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


def attention_with_lse(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                       mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Given. Softmax attention of query rows over one set of keys, plus its LSE.

    q: ``[T, H, D]``; k, v: ``[N, Hkv, D]`` (query head ``h`` reads KV head
    ``h // (H // Hkv)``); mask: ``[T, N]`` bool, True where row ``t`` may see
    key ``n`` (None: every row sees every key). Returns ``(out [T, H, D],
    lse [H, T])`` in float64; ``out`` is normalized. A row that sees no key
    (or ``N == 0``) gets ``out = 0`` and ``lse = -inf``.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    num_tokens, num_heads, head_dim = q.shape
    out = np.zeros((num_tokens, num_heads, head_dim))
    lse = np.full((num_heads, num_tokens), -np.inf)
    if k.shape[0] == 0 or num_tokens == 0:
        return out, lse
    group = num_heads // k.shape[1]
    kk = np.repeat(k, group, axis=1)  # [N, H, D]
    vv = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,nhd->htn", q, kk) * scale  # [H, T, N]
    if mask is not None:
        scores = np.where(np.asarray(mask, dtype=bool)[None], scores, -np.inf)
    m = scores.max(axis=-1)  # [H, T]
    seen = np.isfinite(m)
    m_safe = np.where(seen, m, 0.0)
    p = np.exp(scores - m_safe[..., None])  # exp(-inf) = 0 for hidden keys
    denom = p.sum(axis=-1)
    num = np.einsum("htn,nhd->thd", p, vv)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(seen.T[..., None], num / denom.T[..., None], 0.0)
        lse = np.where(seen, m_safe + np.log(denom), -np.inf)
    return out, lse


def merge_attn_states(prefix_out: np.ndarray, prefix_lse: np.ndarray,
                      suffix_out: np.ndarray, suffix_lse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Given (lab 04's merge, cut to what cascade needs). Merge two partial attentions.

    prefix_out, suffix_out: ``[T, H, D]``; prefix_lse, suffix_lse: ``[H, T]``
    (vLLM's shapes). Returns ``(out [T, H, D], lse [H, T])``: the attention over
    the union of both key sets. A side whose LSE is ``-inf`` (no keys)
    contributes nothing; both ``-inf`` gives ``out = 0``, ``lse = -inf``. (Lab 04's
    full version adds upstream's ``+inf`` rule and ``prefill_tokens_with_context``.)

    upstream: vllm/v1/attention/ops/merge_attn_states.py:9 merge_attn_states
    """
    p_lse = np.asarray(prefix_lse, dtype=np.float64)
    s_lse = np.asarray(suffix_lse, dtype=np.float64)
    m = np.maximum(p_lse, s_lse)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p_w = np.exp(p_lse - m_safe)
    s_w = np.exp(s_lse - m_safe)
    total = p_w + s_w
    with np.errstate(divide="ignore", invalid="ignore"):
        p_frac = np.where(total > 0, p_w / total, 0.0).T[..., None]  # [T, H, 1]
        s_frac = np.where(total > 0, s_w / total, 0.0).T[..., None]
        lse = np.where(total > 0, m_safe + np.log(total), -np.inf)
    out = np.asarray(prefix_out, dtype=np.float64) * p_frac + np.asarray(suffix_out, dtype=np.float64) * s_frac
    return out, lse


@dataclass(slots=True)
class SharedPrefixMeasurement:
    """Given. One decode step of mini_vllm with requests that share a prefix.

    ``block_tables`` and ``ref_counts`` are read from the engine while the
    step runs; ``seq_lens`` and ``num_computed_tokens`` are per request (the
    context after the step, and before it). ``k_cache``/``v_cache`` are layer
    0's cache after the step and ``query_start_loc`` the step's row offsets,
    so the tests can run ``cascade_attention`` on the engine's real K/V.
    """

    block_size: int
    block_tables: list[list[int]]
    ref_counts: dict[int, int]
    seq_lens: list[int]
    num_computed_tokens: list[int]
    query_start_loc: list[int]
    num_common_blocks: int
    common_prefix_len: int
    rows_plain: int
    rows_cascade: int
    k_cache: np.ndarray
    v_cache: np.ndarray


# --------------------------------------------------------------------------
# Your work
# --------------------------------------------------------------------------


def num_common_prefix_blocks(block_tables: Sequence[Sequence[int]],
                             ref_counts: Mapping[int, int]) -> int:
    """How many leading blocks of ``block_tables[0]`` every request holding KV references.

    Inputs: ``block_tables``, one list of block ids per request that holds KV
    (the first one is the request asked about); ``ref_counts``, block id ->
    that block's ``ref_cnt`` in the pool.
    Output: an int in ``0..len(block_tables[0])``: the length of the longest
    run, from the start of ``block_tables[0]``, of blocks whose ``ref_cnt``
    equals ``len(block_tables)``. The run ends at the first block that fails.
    Errors (ValueError): no request at all (names ``block_tables``); a block id
    of ``block_tables[0]`` that the run inspects and that is missing from
    ``ref_counts``, or whose count is outside ``1..len(block_tables)`` (names
    ``ref_counts``).
    """
    raise NotImplementedError("num_common_prefix_blocks: count the leading blocks held by every request")


def cascade_prefix_len(num_common_blocks: int, block_size: int,
                       num_computed_tokens: Sequence[int]) -> int:
    """The number of shared tokens the unmasked prefix pass may use.

    Inputs: ``num_common_blocks`` >= 0, ``block_size`` >= 1, and the
    ``num_computed_tokens`` (before this step) of every scheduled request.
    Output: an int, a multiple of ``block_size``, never above
    ``num_common_blocks * block_size`` and never above the smallest entry of
    ``num_computed_tokens``; the largest such value. 0 when there are no
    common blocks.
    Errors (ValueError naming the parameter): ``num_common_blocks`` < 0,
    ``block_size`` < 1, ``num_computed_tokens`` empty or holding a negative.
    """
    raise NotImplementedError("cascade_prefix_len: cap the shared tokens so no query sees its future")


def cascade_cost_model(common_prefix_len: int, num_reqs: int, num_query_heads: int,
                       num_kv_heads: int, num_sms: int) -> tuple[int, int]:
    """vLLM's rough time model of a batch of one-token decodes: ``(cascade, flash_decoding)``.

    Inputs: prefix length in tokens (>= 0), ``num_reqs`` >= 1, head counts
    >= 1 with ``num_kv_heads`` dividing ``num_query_heads``, ``num_sms`` >= 1.
    Output: two ints, in upstream's units (waves of CTAs times KV tiles),
    with query and KV tiles of ``Q_TILE_SIZE`` and ``KV_TILE_SIZE`` tokens:
    the cascade prefix kernel runs one CTA per query head per query tile of
    the batch's packed rows, in waves of ``num_sms``, each wave walking every
    prefix tile; flash-decoding runs one CTA per request, per KV head, per
    query tile of that KV head's query heads, per prefix tile, in waves of
    ``num_sms``.
    Errors (ValueError naming the parameter): any value below its minimum;
    ``num_kv_heads`` not dividing ``num_query_heads``.
    """
    raise NotImplementedError("cascade_cost_model: count CTAs, waves and KV tiles for both kernels")


def use_cascade_attention(common_prefix_len: int, query_lens: Sequence[int], num_query_heads: int,
                          num_kv_heads: int, use_alibi: bool, use_sliding_window: bool,
                          use_local_attention: bool, num_sms: int, dcp_world_size: int = 1) -> bool:
    """vLLM's decision whether a step runs cascade attention (same arguments, same result).

    Output: a bool, False when the prefix is shorter than
    ``MIN_COMMON_PREFIX_LEN``, when ALiBi, a sliding window or local attention
    is on, when there are fewer than ``MIN_NUM_REQS`` requests
    (``len(query_lens)``), or when ``dcp_world_size > 1``. Otherwise: True if
    normal attention would not use flash-decoding (flash-decoding needs more
    than one query head per KV head, no sliding window, no ALiBi, and every
    query length equal to 1); if it would, True only when
    ``cascade_cost_model`` gives cascade a strictly smaller time.
    Errors (ValueError naming ``num_kv_heads``): below 1, or not dividing
    ``num_query_heads``; checked before anything else.
    """
    raise NotImplementedError("use_cascade_attention: transcribe the heuristic, checks in order")


def kv_rows_read(seq_lens: Sequence[int], common_prefix_len: int) -> int:
    """K/V rows one layer reads in one step, the shared prefix counted once.

    Inputs: each request's ``seq_lens`` (keys after the step, at least one
    request) and ``common_prefix_len`` (0: no cascade).
    Output: an int, the number of distinct (request, key) reads, where the
    first ``common_prefix_len`` keys are read once for the whole batch.
    Errors (ValueError naming the parameter): ``seq_lens`` empty;
    ``common_prefix_len`` negative or longer than the shortest sequence.
    """
    raise NotImplementedError("kv_rows_read: count the rows, the shared ones once")


def cascade_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                      query_start_loc: Sequence[int], seq_lens: Sequence[int],
                      block_table: np.ndarray, common_prefix_len: int,
                      scale: float) -> np.ndarray:
    """Plain causal attention of a packed batch, computed as prefix pass + suffix pass + merge.

    Inputs: ``q [T, H, D]``; ``k_cache``, ``v_cache`` ``[num_blocks,
    block_size, Hkv, D]``; request b owns query rows
    ``query_start_loc[b]:query_start_loc[b+1]``, has ``seq_lens[b]`` keys
    after the step (its rows are its last positions) and reads them through
    ``block_table[b]`` (padded; entries past its blocks are never read).
    ``common_prefix_len`` tokens at the start are shared by every request.
    Output: ``[T, H, D]`` float64, equal to each row attending to its own
    request's keys up to its own position (bottom-right causal), GQA head
    ``h // (H // Hkv)``. The shared keys must be read once for all rows, with
    no mask, through ``attention_with_lse``; the rest per request; the two
    combined with ``merge_attn_states``. ``common_prefix_len == 0`` is plain
    attention.
    Errors (ValueError): ``common_prefix_len`` negative, not a multiple of the
    block size, or above the smallest context before the step
    (``seq_lens[b] - q_len_b``) (names ``common_prefix_len``); block table
    rows that do not share the prefix's block ids (names ``block_table``).
    """
    raise NotImplementedError("cascade_attention: a prefix pass, a suffix pass, one merge")


def measure_shared_prefix_decode(num_requests: int = 8, prefix_len: int = 512, own_len: int = 64,
                                 block_size: int = 16, model: str = "tiny-random",
                                 seed: int = 0) -> SharedPrefixMeasurement:
    """Run mini_vllm on requests that share a prefix and measure their first all-decode step.

    Inputs: ``num_requests`` >= 1 prompts made of one shared ``prefix_len``
    (>= 1) random tokens plus ``own_len - 1`` (``own_len`` >= 2) tokens of
    their own, so the first decode step gives each ``prefix_len + own_len``
    keys; the engine's ``block_size`` (>= 1), ``model`` and ``seed``.
    Output: a filled ``SharedPrefixMeasurement`` of the first step in which
    every request runs exactly one token: its block tables (each trimmed to
    the blocks its ``seq_len`` needs) and the ``ref_cnt`` of those blocks as
    they were while that step ran, ``seq_lens`` and ``num_computed_tokens``,
    ``query_start_loc``, the results of ``num_common_prefix_blocks``,
    ``cascade_prefix_len`` and ``kv_rows_read`` (without and with the prefix),
    and copies of layer 0's K and V cache after the step. Deterministic for a
    given seed.
    Errors (ValueError naming the parameter): a value below its minimum.
    """
    raise NotImplementedError("measure_shared_prefix_decode: run the engine and record one decode step")
