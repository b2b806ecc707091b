"""Lab 04-06 — cascade attention: read a shared prefix once (reference solution).

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
# The lab
# --------------------------------------------------------------------------


def num_common_prefix_blocks(block_tables: Sequence[Sequence[int]],
                             ref_counts: Mapping[int, int]) -> int:
    """Leading blocks of the first request that every request holding KV references.

    block_tables: one list of block ids per request that holds KV, the first
    being the request asked about (vLLM passes ``running[0]``). ref_counts:
    block id -> ``ref_cnt``. Counts blocks of ``block_tables[0]`` from the
    start while ``ref_cnt == len(block_tables)`` and stops at the first that is
    not.

    upstream: vllm/v1/core/single_type_kv_cache_manager.py:531 FullAttentionManager.get_num_common_prefix_blocks
    """
    if len(block_tables) < 1:
        raise ValueError("block_tables must hold at least one request, got none")
    num_requests = len(block_tables)
    count = 0
    for block_id in block_tables[0]:
        if block_id not in ref_counts:
            raise ValueError(f"ref_counts has no entry for block {block_id}")
        ref_cnt = ref_counts[block_id]
        if not 1 <= ref_cnt <= num_requests:
            raise ValueError(f"ref_counts[{block_id}] must be in 1..{num_requests} "
                             f"(the requests holding KV), got {ref_cnt}")
        if ref_cnt != num_requests:
            break
        count += 1
    return count


def cascade_prefix_len(num_common_blocks: int, block_size: int,
                       num_computed_tokens: Sequence[int]) -> int:
    """Tokens the unmasked prefix pass may use.

    ``num_common_blocks * block_size``, capped by the smallest
    ``num_computed_tokens`` (no query may see a shared key at or after its own
    position), then rounded down to a multiple of ``block_size``.

    upstream: vllm/v1/worker/gpu_model_runner.py:2520 _compute_cascade_attn_prefix_len
    """
    if num_common_blocks < 0:
        raise ValueError(f"num_common_blocks must be >= 0, got {num_common_blocks}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if len(num_computed_tokens) < 1:
        raise ValueError("num_computed_tokens must hold at least one request, got none")
    if min(num_computed_tokens) < 0:
        raise ValueError(f"num_computed_tokens must all be >= 0, got {min(num_computed_tokens)}")
    prefix = min(num_common_blocks * block_size, min(num_computed_tokens))
    return prefix // block_size * block_size


def cascade_cost_model(common_prefix_len: int, num_reqs: int, num_query_heads: int,
                       num_kv_heads: int, num_sms: int) -> tuple[int, int]:
    """vLLM's rough cost of a decode step: ``(cascade_time, flash_decoding_time)``.

    For ``num_reqs`` one-token queries: the cascade prefix kernel launches
    ``num_query_heads * cdiv(num_reqs, 128)`` CTAs and runs
    ``cdiv(ctas, num_sms)`` waves, each over ``cdiv(common_prefix_len, 128)``
    KV tiles; flash-decoding launches ``num_reqs * num_kv_heads *
    cdiv(num_query_heads // num_kv_heads, 128)`` CTAs per KV tile and takes
    ``cdiv(that * tiles, num_sms)``.

    upstream: vllm/v1/attention/backends/flash_attn.py:1111-1128 flash_decoding_time
    """
    for name, value, low in (("common_prefix_len", common_prefix_len, 0), ("num_reqs", num_reqs, 1),
                             ("num_query_heads", num_query_heads, 1), ("num_kv_heads", num_kv_heads, 1),
                             ("num_sms", num_sms, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if num_query_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_query_heads ({num_query_heads})")
    num_queries_per_kv = num_query_heads // num_kv_heads
    num_prefix_tiles = _cdiv(common_prefix_len, KV_TILE_SIZE)
    cascade_ctas = num_query_heads * _cdiv(num_reqs, Q_TILE_SIZE)
    cascade_time = _cdiv(cascade_ctas, num_sms) * num_prefix_tiles
    fd_ctas = num_reqs * num_kv_heads * _cdiv(num_queries_per_kv, Q_TILE_SIZE) * num_prefix_tiles
    return cascade_time, _cdiv(fd_ctas, num_sms)


def use_cascade_attention(common_prefix_len: int, query_lens: Sequence[int], num_query_heads: int,
                          num_kv_heads: int, use_alibi: bool, use_sliding_window: bool,
                          use_local_attention: bool, num_sms: int, dcp_world_size: int = 1) -> bool:
    """vLLM's decision, check for check in upstream's order.

    False when the prefix is under 256 tokens, with ALiBi, a sliding window
    or local attention, with fewer than 8 requests, or with decode context
    parallelism (``dcp_world_size > 1``). Otherwise True when flash-decoding
    would not be used (it needs more than one query head per KV head, no
    sliding window, no ALiBi and every query length 1), and else True only
    when ``cascade_cost_model`` says cascade is strictly faster.

    Raises ValueError naming ``num_kv_heads`` when it is below 1 or does not
    divide ``num_query_heads`` (upstream assumes it does).

    upstream: vllm/v1/attention/backends/flash_attn.py:1054 use_cascade_attention
    """
    if num_kv_heads < 1 or num_query_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must be >= 1 and divide "
                         f"num_query_heads ({num_query_heads})")
    if common_prefix_len < MIN_COMMON_PREFIX_LEN:
        return False
    if use_alibi or use_sliding_window or use_local_attention:
        return False
    query_lens = np.asarray(query_lens)
    num_reqs = len(query_lens)
    if num_reqs < MIN_NUM_REQS:
        return False
    if dcp_world_size > 1:
        return False
    num_queries_per_kv = num_query_heads // num_kv_heads
    use_flash_decoding = (num_queries_per_kv > 1 and not use_sliding_window
                          and not use_alibi and bool(np.all(query_lens == 1)))
    if not use_flash_decoding:
        return True
    cascade_time, flash_decoding_time = cascade_cost_model(
        common_prefix_len, num_reqs, num_query_heads, num_kv_heads, num_sms)
    return cascade_time < flash_decoding_time


def kv_rows_read(seq_lens: Sequence[int], common_prefix_len: int) -> int:
    """K/V rows one layer reads in a step: every request's keys, the shared prefix once.

    ``sum(seq_lens)`` when ``common_prefix_len`` is 0; otherwise
    ``common_prefix_len + sum(s - common_prefix_len for s in seq_lens)``.
    """
    if len(seq_lens) < 1:
        raise ValueError("seq_lens must hold at least one request, got none")
    if common_prefix_len < 0:
        raise ValueError(f"common_prefix_len must be >= 0, got {common_prefix_len}")
    if common_prefix_len > min(seq_lens):
        raise ValueError(f"common_prefix_len must be <= the shortest seq_len ({min(seq_lens)}), "
                         f"got {common_prefix_len}")
    return int(common_prefix_len + sum(s - common_prefix_len for s in seq_lens))


def _gather(cache: np.ndarray, table_row: Sequence[int], start: int, stop: int) -> np.ndarray:
    """Rows ``start..stop-1`` of one request, read through its block table."""
    block_size = cache.shape[1]
    pos = np.arange(start, stop)
    blocks = np.asarray(table_row, dtype=np.int64)[pos // block_size]
    return cache[blocks, pos % block_size]


def cascade_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                      query_start_loc: Sequence[int], seq_lens: Sequence[int],
                      block_table: np.ndarray, common_prefix_len: int,
                      scale: float) -> np.ndarray:
    """Attention of a packed batch as a prefix pass plus a suffix pass, merged.

    q: ``[T, H, D]``; caches ``[num_blocks, block_size, Hkv, D]``;
    request b owns rows ``query_start_loc[b]:query_start_loc[b+1]`` and has
    ``seq_lens[b]`` keys after this step, read through ``block_table[b]``.
    Prefix pass: all T rows, keys ``0..common_prefix_len-1`` of the shared
    blocks, no mask. Suffix pass: request b's row i sees keys
    ``common_prefix_len <= j <= seq_lens[b] - q_len_b + i``. Returns
    ``[T, H, D]`` float64, equal to plain causal attention.

    upstream: vllm/v1/attention/backends/flash_attn.py:1132 cascade_attention
    """
    q = np.asarray(q, dtype=np.float64)
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    block_table = np.asarray(block_table, dtype=np.int64)
    block_size = k_cache.shape[1]
    num_reqs = len(seq_lens)
    q_lens = np.diff(qsl)
    if common_prefix_len < 0 or common_prefix_len % block_size:
        raise ValueError(f"common_prefix_len must be a multiple of block_size ({block_size}) "
                         f">= 0, got {common_prefix_len}")
    context = np.asarray(seq_lens, dtype=np.int64) - q_lens  # keys computed before this step
    if num_reqs and common_prefix_len > context.min():
        raise ValueError(f"common_prefix_len must be <= the smallest context before the step "
                         f"({int(context.min())}), got {common_prefix_len}")
    num_common = common_prefix_len // block_size
    if num_common and not (block_table[:, :num_common] == block_table[:1, :num_common]).all():
        raise ValueError(f"block_table rows must share their first {num_common} blocks "
                         f"(common_prefix_len {common_prefix_len})")

    # Prefix pass: the shared blocks, read once, every query row, no mask.
    k_pre = _gather(k_cache, block_table[0], 0, common_prefix_len)
    v_pre = _gather(v_cache, block_table[0], 0, common_prefix_len)
    prefix_out, prefix_lse = attention_with_lse(q, k_pre, v_pre, scale)

    # Suffix pass: each request's own keys, causal, aligned bottom-right.
    suffix_out = np.zeros_like(q)
    suffix_lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b in range(num_reqs):
        lo, hi = int(qsl[b]), int(qsl[b + 1])
        k_own = _gather(k_cache, block_table[b], common_prefix_len, int(seq_lens[b]))
        v_own = _gather(v_cache, block_table[b], common_prefix_len, int(seq_lens[b]))
        key_pos = np.arange(common_prefix_len, int(seq_lens[b]))
        q_pos = int(context[b]) + np.arange(hi - lo)
        mask = key_pos[None, :] <= q_pos[:, None]
        suffix_out[lo:hi], suffix_lse[:, lo:hi] = attention_with_lse(q[lo:hi], k_own, v_own, scale, mask)

    out, _ = merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse)
    return out


def measure_shared_prefix_decode(num_requests: int = 8, prefix_len: int = 512, own_len: int = 64,
                                 block_size: int = 16, model: str = "tiny-random",
                                 seed: int = 0) -> SharedPrefixMeasurement:
    """Run mini_vllm until every request decodes; measure that decode step.

    Prompts: one shared prefix of ``prefix_len`` random tokens, then
    ``own_len - 1`` tokens of each request's own, so the first decode step
    brings each request to ``prefix_len + own_len`` keys. Records the step's
    block tables and ``ref_cnt`` of their blocks (read while the step runs),
    and layer 0's K/V cache after it; computes the common blocks, the cascade
    prefix length and K/V rows read per layer with and without cascade.
    """
    for name, value, low in (("num_requests", num_requests, 1), ("prefix_len", prefix_len, 1),
                             ("own_len", own_len, 2), ("block_size", block_size, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    engine = LLMEngine(model, block_size=block_size, seed=seed)
    rng = np.random.default_rng(seed)
    prefix = rng.integers(1, 200, prefix_len).tolist()
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for _ in range(num_requests):
        engine.add_request({"prompt_token_ids": prefix + rng.integers(1, 200, own_len - 1).tolist()}, params)

    pool = engine.kv_cache_manager.block_pool
    seen: dict = {}
    execute = engine.model.execute

    def recording_execute(model_input):
        seen["input"] = model_input
        seen["ref_counts"] = {b.block_id: b.ref_cnt for b in pool.blocks}
        return execute(model_input)

    engine.model.execute = recording_execute
    while True:
        engine.step()
        mi = seen["input"]
        if mi.num_reqs == num_requests and mi.num_tokens == num_requests:
            break
    seq_lens = [int(s) for s in mi.seq_lens]
    num_blocks = [_cdiv(s, block_size) for s in seq_lens]
    tables = [[int(x) for x in mi.block_tables[b, :n]] for b, n in enumerate(num_blocks)]
    ref_counts = {bid: seen["ref_counts"][bid] for row in tables for bid in row}
    computed = [s - 1 for s in seq_lens]
    n_common = num_common_prefix_blocks(tables, ref_counts)
    prefix_tokens = cascade_prefix_len(n_common, block_size, computed)
    k_cache, v_cache = engine.model.kv_cache[0]
    return SharedPrefixMeasurement(
        block_size=block_size, block_tables=tables, ref_counts=ref_counts, seq_lens=seq_lens,
        num_computed_tokens=computed, query_start_loc=[int(x) for x in mi.query_start_loc],
        num_common_blocks=n_common, common_prefix_len=prefix_tokens,
        rows_plain=kv_rows_read(seq_lens, 0), rows_cascade=kv_rows_read(seq_lens, prefix_tokens),
        k_cache=k_cache.copy(), v_cache=v_cache.copy(),
    )
