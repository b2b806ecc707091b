"""Every number in Phase 08's exercises, interview answers and cheatsheet, recomputed.

The pages quote these values; if one changes here, the text is wrong. The roofline numbers in
exercise 15 and interview Q6 rest on assumptions (datasheet peaks, an 8B-parameter bf16 model,
attention and draft cost ignored); they come from the ASSUMPTIONS block and the pages say so.
numpy only; the tests marked ``upstream`` read the pinned vLLM source, and three of them run
code cut out of it with ``ast`` (no vllm, torch or numba import).
"""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM

# -- ASSUMPTIONS (stated as such where the pages use them) -----------------------------------
HBM_BYTES_PER_S = 3.35e12      # H100 SXM datasheet peak bandwidth
BF16_FLOPS = 989e12            # H100 SXM dense bf16 datasheet peak
PARAMS = 8e9                   # "an 8B model": 2 bytes and 2 FLOPs per parameter per token


# == shared formulas ===========================================================================

def expected_tokens(alpha, k):
    """1 + alpha + ... + alpha^k: tokens one verify emits, bonus included."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup(alpha, c, k):
    return expected_tokens(alpha, k) / (k * c + 1)


def optimal_k(alpha, c, k_max=32):
    best = max(speedup(alpha, c, k) for k in range(k_max + 1))
    return next(k for k in range(k_max + 1) if speedup(alpha, c, k) == best)


def alpha_from_length(L, k):
    """Solve expected_tokens(alpha, k) == L by bisection (it increases with alpha)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < L else (lo, mid)
    return (lo + hi) / 2


def ngram_propose(tokens, min_n, max_n, k, max_model_len):
    """Longest suffix n-gram in [min_n, max_n] with an earlier copy; its EARLIEST copy."""
    T = len(tokens)
    k = min(k, max_model_len - T)
    if T < min_n or k <= 0:
        return []
    for n in range(min(max_n, T - 1), min_n - 1, -1):
        suffix = tokens[T - n:]
        for s in range(0, T - n):          # the copy must end before the last token
            if tokens[s:s + n] == suffix:
                return list(tokens[s + n:s + n + k])
    return []


def ngram_most_recent(tokens, n, k):
    """The wrong rule: the latest earlier copy of a fixed-length suffix."""
    T = len(tokens)
    for s in range(T - n - 1, -1, -1):
        if tokens[s:s + n] == tokens[T - n:]:
            return list(tokens[s + n:s + n + k])
    return []


# == Warm-up =====================================================================================

def test_item1_tokens_per_verify_and_speedup_by_hand():
    a, c, k = 0.8, 0.1, 4
    assert [round(a ** (i + 1), 4) for i in range(k)] == [0.8, 0.64, 0.512, 0.4096]
    E = expected_tokens(a, k)
    assert round(E, 4) == 3.3616 and E == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert k * c + 1 == pytest.approx(1.4)
    assert round(speedup(a, c, k), 3) == 2.401
    assert round(1 / (1 - a), 6) == 5.0                       # ceiling
    assert round((E - 1) / k, 4) == 0.5904                   # what "Avg Draft acceptance rate" logs
    assert round(30 * (k * c + 1) / E, 2) == 12.49            # ITL 30 ms -> 12.49 ms
    # the best k for this drafter and its near neighbours
    assert optimal_k(a, c) == 6 and round(speedup(a, c, 6), 3) == 2.470
    assert round(speedup(a, c, 5), 3) == 2.460 and round(speedup(a, c, 7), 3) == 2.448
    # at alpha = 0 the step still emits one token; at alpha = 1, k + 1
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0


CTX = [4, 6, 7, 1, 5, 6, 7, 2, 3, 5, 6, 7]


def test_item2_ngram_by_hand():
    assert len(CTX) == 12
    # n = 3: [5, 6, 7] has one earlier copy, at 4 -> followers 2, 3, 5, 6, 7
    assert ngram_propose(CTX, 1, 3, 3, 100) == [2, 3, 5]
    assert ngram_propose(CTX, 1, 3, 8, 100) == [2, 3, 5, 6, 7]   # only five tokens follow
    # max_n = 2: [6, 7] at 1 and 5: the earliest (1) wins
    assert ngram_propose(CTX, 1, 2, 3, 100) == [1, 5, 6]
    assert ngram_most_recent(CTX, 2, 3) == [2, 3, 5]               # the seed's rule
    # n = 1: [7] at 2 and 6 -> earliest 2
    assert ngram_propose(CTX, 1, 1, 3, 100) == [1, 5, 6]
    # max_model_len 14 leaves room for two
    assert ngram_propose(CTX, 1, 2, 3, 14) == [1, 5]
    assert ngram_propose(CTX, 1, 2, 3, 12) == []
    # vLLM's default n = 5 finds nothing here
    assert ngram_propose(CTX, 5, 5, 3, 100) == []
    # upstream's own unit-test cases, as the answer quotes them
    assert ngram_propose([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, 100) == [4, 1, 2]
    assert ngram_propose([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, 100) == [6, 2]


P = np.array([0.6, 0.3, 0.1])
Q = np.array([0.3, 0.2, 0.5])


def test_item3_rejection_sampling_by_hand():
    acc = np.minimum(1, P / Q)
    assert np.allclose(acc, [1, 1, 0.2])
    alpha = np.minimum(P, Q).sum()
    assert alpha == pytest.approx(0.6)
    assert (Q * acc).sum() == pytest.approx(alpha)                   # E_q[accept] = overlap
    assert 0.5 * np.abs(P - Q).sum() == pytest.approx(0.4)           # TV = 1 - alpha
    surplus = np.maximum(0, P - Q)
    assert np.allclose(surplus, [0.3, 0.1, 0]) and surplus.sum() == pytest.approx(0.4)
    resid = surplus / surplus.sum()
    assert np.allclose(resid, [0.75, 0.25, 0])
    out = np.minimum(P, Q) + (1 - alpha) * resid
    assert np.allclose(np.minimum(P, Q), [0.3, 0.2, 0.1])
    assert np.allclose(out, P)
    # the wrong recovery: resample from p
    wrong = np.minimum(P, Q) + (1 - alpha) * P
    assert np.allclose(wrong, [0.54, 0.32, 0.14])
    assert 0.5 * np.abs(wrong - P).sum() == pytest.approx(0.06)
    # a seeded simulation agrees with the algebra (100k draws, well inside 4.5 sigma)
    rng = np.random.default_rng(8)
    n = 100_000
    x = rng.choice(3, size=n, p=Q)
    keep = rng.random(n) < acc[x]
    y = np.where(keep, x, rng.choice(3, size=n, p=resid))
    freq = np.bincount(y, minlength=3) / n
    sigma = np.sqrt(P * (1 - P) / n)
    assert np.all(np.abs(freq - P) < 4.5 * sigma)
    assert abs(keep.mean() - 0.6) < 4.5 * np.sqrt(0.24 / n)


def test_item4_one_hot_draft():
    x = 2
    assert P[x] == pytest.approx(0.1)                  # acceptance
    rest = P.copy()
    rest[x] = 0
    rec = rest / rest.sum()
    assert np.allclose(rec, [2 / 3, 1 / 3, 0])
    out = np.zeros(3)
    out[x] += P[x]
    out += (1 - P[x]) * rec
    assert np.allclose(out, P)
    # a probabilistic drafter with q[2] = 0.5 would keep the same draft with min(1, 0.1/0.5)
    assert min(1, P[x] / Q[x]) == pytest.approx(0.2)
    # the same drafter, one-hot at the draft it would sample: E_q[p[x]] = sum p*q
    assert (P * Q).sum() == pytest.approx(0.29)
    # x = 0 (the target's favourite): kept 60% of the time
    rest0 = P.copy()
    rest0[0] = 0
    assert np.allclose(rest0 / rest0.sum(), [0, 0.75, 0.25])


def test_item5_metrics_line_conversion():
    k = 5
    assert round((2.8 - 1) / k, 2) == 0.36
    assert round(1 + 0.56 * k, 2) == 3.8
    assert round(alpha_from_length(2.8, k), 3) == 0.677
    assert round(alpha_from_length(3.8, k), 3) == 0.813
    # 36% read as alpha would predict
    assert round(expected_tokens(0.36, k), 3) == 1.559
    # the counters of the worked example
    steps, with_drafts, drafted, accepted = 50, 30, 150, 54
    assert 1 + accepted / with_drafts == pytest.approx(2.8)
    assert accepted / drafted == pytest.approx(0.36)
    assert (accepted + steps) / steps == pytest.approx(2.08)
    # per-position rates of a 0.7 drafter, and alpha back from their ratios
    rates = [0.7 ** (i + 1) for i in range(k)]
    assert [round(r, 3) for r in rates] == [0.7, 0.49, 0.343, 0.24, 0.168]
    assert round((expected_tokens(0.7, k) - 1) / k, 3) == 0.388


# == Trace the code ==============================================================================

def calc_metadata(num_draft_tokens, cu_num_scheduled_tokens):
    """numpy restatement of upstream's _calc_spec_decode_metadata (index arrays only)."""
    d = np.asarray(num_draft_tokens)
    cu = np.asarray(cu_num_scheduled_tokens)
    s = d + 1
    cu_s = np.cumsum(s)
    logits = np.repeat(cu - s, s) + np.concatenate([np.arange(n) for n in s])
    bonus = cu_s - 1
    target = np.repeat(cu_s - s, d) + np.concatenate([np.arange(n) for n in d] + [np.zeros(0, int)])
    return dict(cu_num_draft_tokens=np.cumsum(d).tolist(), cu_num_sampled_tokens=cu_s.tolist(),
                logits_indices=logits.tolist(), target_logits_indices=target.tolist(),
                bonus_logits_indices=bonus.tolist(),
                draft_positions=logits[target + 1].tolist())


def test_item6_spec_decode_metadata_by_hand():
    m = calc_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209])
    assert m["logits_indices"] == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert m["target_logits_indices"] == [0, 1, 2, 5, 6, 9]
    assert m["bonus_logits_indices"] == [3, 4, 7, 8, 10]
    assert m["cu_num_draft_tokens"] == [3, 3, 5, 5, 6]
    assert m["cu_num_sampled_tokens"] == [4, 5, 8, 9, 11]
    assert m["draft_positions"] == [1, 2, 3, 105, 106, 208]
    # the second case: a 50-token prefill chunk, then two decodes with drafts
    m2 = calc_metadata([0, 2, 1], [50, 53, 55])
    assert m2["logits_indices"] == [49, 50, 51, 52, 53, 54]
    assert m2["target_logits_indices"] == [1, 2, 4]
    assert m2["bonus_logits_indices"] == [0, 3, 5]
    assert m2["draft_positions"] == [51, 52, 54]
    # rows = drafts + requests
    assert len(m["logits_indices"]) == 6 + 5 and len(m2["logits_indices"]) == 3 + 3


def test_item7_scheduler_rollback_by_hand():
    k, num_tokens, computed = 4, 120, 119
    with_spec = num_tokens + k
    scheduled = with_spec - computed
    assert scheduled == 5
    computed += scheduled                      # advanced at schedule time
    assert computed == 124
    sampled = ["a", "b", "y"]                  # two drafts kept, the third replaced
    accepted = len(sampled) - 1
    rejected = k - accepted
    assert (accepted, rejected) == (2, 2)
    computed -= rejected
    num_tokens += len(sampled)
    assert (computed, num_tokens) == (122, 123)
    assert num_tokens - computed == 1          # only y is left to compute next step
    # blocks of 16 held for 124 positions, and needed for 123: nothing to free
    assert -(-124 // 16) == 8 and -(-123 // 16) == 8
    # the positions computed this step and the stale ones
    assert list(range(119, 124)) == [119, 120, 121, 122, 123]
    # max_model_len cap: a request at 2047 computed tokens in a 2048 window schedules nothing
    assert min(5, 2048 - 1 - 2047) == 0 and min(5, 2048 - 1 - 2044) == 3


# == Design ======================================================================================

def step_ms(tokens):
    """Roofline step time of the ASSUMED 8B bf16 model: weights once, or the math, whichever is longer."""
    mem = 2 * PARAMS / HBM_BYTES_PER_S
    cmp = tokens * 2 * PARAMS / BF16_FLOPS
    return max(mem, cmp) * 1e3


def batch_speedup(B, alpha, k):
    return expected_tokens(alpha, k) * step_ms(B) / step_ms(B * (k + 1))


def test_item15_speculation_at_large_batch():
    assert round(step_ms(1), 3) == 4.776
    assert round(2 * PARAMS / BF16_FLOPS * 1e6, 2) == 16.18               # microseconds per token
    ridge = (2 * PARAMS / HBM_BYTES_PER_S) / (2 * PARAMS / BF16_FLOPS)
    assert round(ridge, 1) == 295.2
    assert round(step_ms(48), 3) == 4.776                                 # B = 8, k = 5: free
    assert round(batch_speedup(8, 0.7, 5), 3) == 2.941
    assert round(step_ms(384), 2) == 6.21 and round(batch_speedup(64, 0.7, 5), 2) == 2.26
    assert round(step_ms(768), 2) == 12.42 and round(batch_speedup(128, 0.7, 5), 2) == 1.13
    assert round(step_ms(1536), 2) == 24.85 and round(batch_speedup(256, 0.7, 5), 2) == 0.57
    # break-even batch for k = 5 at alpha 0.7 (plain decode still memory-bound)
    b_even = expected_tokens(0.7, 5) * ridge / 6
    assert round(b_even) == 145
    assert batch_speedup(144, 0.7, 5) > 1 > batch_speedup(146, 0.7, 5)
    # at B = 128 the best k is 1
    best = max(range(0, 9), key=lambda k: batch_speedup(128, 0.7, k))
    assert best == 1 and round(batch_speedup(128, 0.7, 1), 2) == 1.70
    assert round(batch_speedup(128, 0.7, 2), 2) == 1.68
    # at B = 8 the best k is large, limited only by the memory-bound window
    assert max(range(0, 60), key=lambda k: batch_speedup(8, 0.7, k)) == 35


def test_lab04_numbers_the_pages_repeat():
    assert round(expected_tokens(0.7, 5), 3) == 2.941 and round(speedup(0.7, 0.05, 5), 3) == 2.353
    assert round(expected_tokens(0.75, 5), 3) == 3.288 and round(speedup(0.75, 0.05, 5), 3) == 2.630
    assert round(speedup(0.2, 0.5, 5), 3) == 0.357 and optimal_k(0.2, 0.5) == 0
    assert optimal_k(0.5, 0.05) == 3 and round(speedup(0.5, 0.05, 3), 2) == 1.63
    assert optimal_k(0.9, 0.05) == 13 and round(speedup(0.9, 0.05, 13), 2) == 4.67
    assert round(1 / (1 - 0.7), 2) == 3.33
    assert abs(speedup(0.7, 0.05, 5) - speedup(0.7, 0.05, 6)) < 1e-5       # the near-tie


# == upstream: code and facts the answers lean on ===============================================

def _node(path, name, kind=ast.FunctionDef):
    src = (UPSTREAM / path).read_text(encoding="utf-8")
    tree = ast.parse(src)
    return src, next(n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name)


def _exec(path, nodes, ns):
    mod = ast.Module(body=nodes, type_ignores=[])
    exec(compile(mod, str(UPSTREAM / path), "exec", dont_inherit=True), ns)
    return ns


@pytest.mark.upstream
def test_item2_and_item6_against_upstreams_own_functions():
    path = "vllm/v1/spec_decode/ngram_proposer.py"
    _, fn = _node(path, "_find_longest_matched_ngram_and_propose_tokens")
    fn.decorator_list = []
    up = _exec(path, [fn], {"np": np})[fn.name]

    def call(tokens, lo, hi, k, mml):
        return up(origin_tokens=np.asarray(tokens, dtype=np.int64), min_ngram=lo, max_ngram=hi,
                  max_model_len=mml, k=k).tolist()

    for args in [(1, 3, 3, 100), (1, 3, 8, 100), (1, 2, 3, 100), (1, 1, 3, 100), (1, 2, 3, 14),
                 (1, 2, 3, 12), (5, 5, 3, 100)]:
        assert call(CTX, *args) == ngram_propose(CTX, *args)

    # _calc_spec_decode_metadata run on numpy, with a stand-in for torch and for self
    path = "vllm/v1/worker/gpu_model_runner.py"
    _, calc = _node(path, "_calc_spec_decode_metadata")
    _, cumsum = _node(path, "_get_cumsum_and_arange")
    calc.args.args[0].annotation = None
    ns = _exec(path, [cumsum, calc], {"np": np, "SpecDecodeMetadata": SimpleNamespace,
                                      "torch": SimpleNamespace(Tensor=np.ndarray)})
    fake_torch = SimpleNamespace(from_numpy=lambda a: SimpleNamespace(to=lambda *x, **y: a))
    ns["_calc_spec_decode_metadata"].__globals__["torch"] = fake_torch

    def run(drafts, cu):
        total = int(cu[-1])
        runner = SimpleNamespace(arange_np=np.arange(1024), _arange_scratch=np.empty(1024, np.int64),
                                 device="cpu", input_ids=SimpleNamespace(gpu=np.arange(total)))
        runner._get_cumsum_and_arange = lambda *a, **kw: ns["_get_cumsum_and_arange"](runner, *a, **kw)
        return ns["_calc_spec_decode_metadata"](runner, np.asarray(drafts), np.asarray(cu))

    for drafts, cu in [([3, 0, 2, 0, 1], [4, 104, 107, 207, 209]), ([0, 2, 1], [50, 53, 55])]:
        md, ours = run(drafts, cu), calc_metadata(drafts, cu)
        assert md.logits_indices.tolist() == ours["logits_indices"]
        assert md.target_logits_indices.tolist() == ours["target_logits_indices"]
        assert md.bonus_logits_indices.tolist() == ours["bonus_logits_indices"]
        assert md.cu_num_draft_tokens.tolist() == ours["cu_num_draft_tokens"]
        # input_ids.gpu is arange here, so the draft "ids" are their positions
        assert md.draft_token_ids.tolist() == ours["draft_positions"]


@pytest.mark.upstream
def test_item5_upstreams_log_line_from_the_worked_counters():
    path = "vllm/v1/spec_decode/metrics.py"
    src = (UPSTREAM / path).read_text(encoding="utf-8")
    tree = ast.parse(src)
    defs = [n for n in tree.body if isinstance(n, ast.ClassDef)
            and n.name in ("SpecDecodingStats", "SpecDecodingLogging")]
    lines = []
    logger = SimpleNamespace(info=lambda fmt, *a: lines.append(fmt % a))
    ns = _exec(path, defs, {"__name__": "m", "np": np, "time": time, "dataclass": dataclass,
                            "field": field, "logger": logger})
    stats = ns["SpecDecodingStats"].new(5)
    # 30 verifies with 5 drafts each, 54 accepted: 18 accept 3, 12 accept 0
    for i in range(30):
        stats.observe_draft(5, 3 if i < 18 else 0)
    log = ns["SpecDecodingLogging"]()
    log.observe(stats)
    log.log(log_fn=logger.info)
    line = lines[0]
    assert "Mean acceptance length: 2.80" in line
    assert "Accepted: 54 tokens, Drafted: 150 tokens" in line
    assert "Per-position acceptance rate: 0.600, 0.600, 0.600, 0.000, 0.000" in line
    assert line.endswith("Avg Draft acceptance rate: 36.0%")


@pytest.mark.upstream
def test_facts_at_the_pin():
    def text(p):
        return (UPSTREAM / p).read_text(encoding="utf-8")

    sched = text("vllm/v1/core/sched/scheduler.py")
    assert "request.num_computed_tokens -= num_rejected" in sched
    assert "num_accepted = len(generated_token_ids) - 1" in sched
    assert "request.num_computed_tokens += num_scheduled_token" in sched
    assert "self.max_model_len - 1 - request.num_computed_tokens" in sched
    assert "del new_token_ids[num_new:]  # Trim new tokens if needed." in sched
    # lookahead slots: EAGLE and draft models only
    init = sched[sched.index("if speculative_config:"):sched.index("# Create the KV cache manager.")]
    assert init.count("self.num_lookahead_tokens = self.num_spec_tokens") == 2
    assert "use_eagle()" in init and "uses_draft_model()" in init and "ngram" not in init
    spec = text("vllm/config/speculative.py")
    assert "self.prompt_lookup_min = 5" in spec and "self.prompt_lookup_max = 5" in spec
    assert 'draft_sample_method: DraftSampleMethod = "greedy"' in spec
    assert 'RejectionSampleMethod = Literal["standard", "synthetic"]' in spec
    metrics = text("vllm/v1/spec_decode/metrics.py")
    assert "mean_acceptance_length = 1 + (num_accepted_tokens / num_drafts)" in metrics
    rs = text("vllm/v1/sample/rejection_sampler.py")
    assert "PLACEHOLDER_TOKEN_ID: tl.constexpr = -1" in rs
    assert "accepted = draft_prob > 0 and target_prob / draft_prob >= uniform_prob" in rs
    req = text("vllm/v1/request.py")
    assert "return len(self._all_token_ids) + len(self.spec_token_ids)" in req
    ngram = text("vllm/v1/spec_decode/ngram_proposer.py")
    assert "if prev_lps >= longest_ngram:" in ngram
    doc = text("docs/features/speculative_decoding/README.md")
    assert "medium-to-low QPS" in doc
