"""Every worked number in Phase 08's guide and deep-dive, recomputed.

The pages quote these values; if one of them changes here, the text is wrong. Numbers that rest
on an assumption (a bandwidth, the H100's ridge point) take it from the ASSUMPTIONS block below,
which the guide states in the same words. Model shapes are the published ``config.json`` values.
Numbers measured by a lab (lab 01's run counts, lab 03's temperature sweep, lab 05's SmolLM2
replays) are asserted by that lab's tests; the ones repeated here are pure arithmetic. Pure
Python and numpy; well under a second. The tests that read ``upstream/`` skip when it is absent.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM

# -- ASSUMPTIONS (labelled as such in the guide, sections 1 and 9) ----------------------------
HBM_BYTES_PER_S = 3.35e12       # H100 SXM datasheet peak
RIDGE_ROWS = 295                # Phase 07: 989 TFLOP/s / 3.35 TB/s, weights-only intensity = rows

LLAMA_8B = dict(layers=32, hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128,
                vocab=128256)


def tokens_per_verify(alpha: float, k: int) -> float:
    """E(alpha, k) = 1 + alpha + ... + alpha^k."""
    if alpha == 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup(alpha: float, c: float, k: int) -> float:
    return tokens_per_verify(alpha, k) / (k * c + 1)


def best_k(alpha: float, c: float, k_max: int = 40) -> int:
    vals = [speedup(alpha, c, k) for k in range(k_max + 1)]
    return int(np.argmax(vals))          # smallest k on an exact tie


def alpha_from_length(length: float, k: int) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_verify(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def ngram_propose(tokens, min_n, max_n, k, max_model_len):
    """Brute-force statement of upstream's rule: longest suffix in [min_n, max_n] with an
    earlier occurrence, the earliest occurrence, k capped by the length limit and the text."""
    t = list(tokens)
    total = len(t)
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = t[total - n:]
        for start in range(0, total - n):            # earliest first; excludes the suffix itself
            if t[start:start + n] == suffix:
                after = start + n
                return t[after:after + min(k, total - after)]
    return []


def greedy_verify(drafts, target_argmax):
    out = []
    for d, a in zip(drafts, target_argmax):
        out.append(a)
        if d != a:
            return out
    return out + [target_argmax[len(drafts)]]


def calc_logits_indices(num_draft, cu_sched):
    num_draft = np.asarray(num_draft)
    cu_sched = np.asarray(cu_sched)
    sampled = num_draft + 1
    cu_sampled = np.cumsum(sampled)
    logits = np.concatenate([np.arange(c - s, c) for c, s in zip(cu_sched, sampled)])
    bonus = cu_sampled - 1
    target = np.concatenate([np.arange(c - s, c - s + d)
                             for c, s, d in zip(cu_sampled, sampled, num_draft)])
    return logits.tolist(), target.tolist(), bonus.tolist(), np.cumsum(num_draft).tolist()


# -- guide, section 1: one token per step ------------------------------------------------------

def test_guide_s1_llama_bytes_and_step_time():
    m = LLAMA_8B
    per_layer = (2 * m["hidden"] * m["heads"] * m["head_dim"]
                 + 2 * m["hidden"] * m["kv_heads"] * m["head_dim"]
                 + 3 * m["hidden"] * m["inter"])
    assert per_layer == 218_103_808
    total = m["layers"] * per_layer + 2 * m["vocab"] * m["hidden"]
    assert round(total / 1e9, 2) == 8.03
    assert round(2 * total / 1e9, 2) == 16.06                     # GB of bf16
    assert round(2 * total / HBM_BYTES_PER_S * 1e3, 2) == 4.79    # ms per step at peak
    assert RIDGE_ROWS / 6 > 49                                    # "fifty times below the ridge"


# -- guide, sections 3-5: the acceptance rules --------------------------------------------------

def test_guide_s3_greedy_walk_and_check_yourself_2():
    assert greedy_verify([7, 9, 4], [7, 9, 5, 2]) == [7, 9, 5]
    assert greedy_verify([7, 9], [7, 9, 2]) == [7, 9, 2]          # bonus when all accepted


def test_guide_s4_residual_example_and_bug():
    p = np.array([0.5, 0.3, 0.2])
    q = np.full(3, 1 / 3)
    accept = np.minimum(1, p / q)
    assert np.allclose(accept, [1.0, 0.9, 0.6])
    overlap = np.minimum(p, q)
    assert round(overlap.sum(), 3) == 0.833
    resid = np.maximum(0, p - q)
    assert np.allclose(resid / resid.sum(), [1, 0, 0])
    reject = 1 - overlap.sum()
    assert np.allclose(overlap + reject * resid / resid.sum(), p)
    bug = overlap + reject * p                                    # resample from p
    assert np.allclose(np.round(bug, 3), [0.417, 0.35, 0.233])
    assert round(0.5 * np.abs(bug - p).sum(), 3) == 0.083


def test_guide_s5_one_hot_example_and_check_yourself_3_4():
    p = np.array([0.5, 0.3, 0.2])
    rec = p.copy(); rec[1] = 0; rec /= rec.sum()
    assert np.allclose(np.round(rec, 3), [0.714, 0, 0.286])
    assert np.allclose(0.3 * np.eye(3)[1] + 0.7 * rec, p)
    # check yourself 3
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    assert round(min(1, p[1] / q[1]), 3) == 0.6
    r = np.maximum(0, p - q)
    assert np.allclose(r, [0.4, 0, 0])
    assert round(np.minimum(p, q).sum(), 3) == 0.6
    # check yourself 4: one-hot draft of token 0
    rec = p.copy(); rec[0] = 0; rec /= rec.sum()
    assert np.allclose(rec, [0, 0.75, 0.25])
    assert np.allclose(0.6 * np.eye(3)[0] + 0.4 * rec, p)


def test_guide_s4_exponential_race_is_proportional():
    rng = np.random.default_rng(0)
    w = np.array([0.4, 0.0, 0.1, 0.5])                            # unnormalized weights
    e = rng.exponential(size=(40_000, 4))
    picks = np.argmax(w / e, axis=1)
    freq = np.bincount(picks, minlength=4) / len(picks)
    assert freq[1] == 0
    assert np.allclose(freq, w / w.sum(), atol=0.01)


# -- guide, section 7 and deep-dive section 3: prompt lookup -------------------------------------

def test_guide_s7_upstream_cases_and_check_yourself_5():
    assert ngram_propose([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, 100) == [4, 1, 2]
    assert ngram_propose([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, 100) == [6, 2]
    assert ngram_propose([5, 8, 2, 9, 5, 8, 1, 5, 8], 1, 2, 3, 100) == [2, 9, 5]
    # length cap: 7 tokens, max_model_len 9 -> at most 2 drafts
    assert ngram_propose([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, 9) == [4, 1]
    assert ngram_propose([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, 7) == []


# -- guide, section 8: tokens per verify ---------------------------------------------------------

def test_guide_s8_table_and_rates():
    table = {0.5: [1.5, 1.75, 1.875, 1.969, 1.996], 0.7: [1.7, 2.19, 2.533, 2.941, 3.199],
             0.8: [1.8, 2.44, 2.952, 3.689, 4.329], 0.9: [1.9, 2.71, 3.439, 4.686, 6.126]}
    for a, row in table.items():
        got = [round(tokens_per_verify(a, k), 3) for k in (1, 2, 3, 5, 8)]
        assert got == row, a
    assert [round(1 / (1 - a), 2) for a in table] == [2.0, 3.33, 5.0, 10.0]
    assert round(0.7 ** 5, 3) == 0.168
    assert [round(0.7 ** (i + 1), 3) for i in range(5)] == [0.7, 0.49, 0.343, 0.24, 0.168]
    e = tokens_per_verify(0.7, 5)
    assert round((e - 1) / 5, 3) == 0.388
    assert round(sum(0.7 ** (i + 1) for i in range(5)), 3) == round(e - 1, 3)
    assert tokens_per_verify(1.0, 5) == 6


# -- guide, section 9: speedup, best k, batch size -----------------------------------------------

def test_guide_s9_speedup_table():
    assert round(speedup(0.7, 0.05, 5), 3) == 2.353
    assert round(tokens_per_verify(0.75, 5), 3) == 3.288 and round(speedup(0.75, 0.05, 5), 3) == 2.630
    assert round(tokens_per_verify(0.5, 3), 3) == 1.875 and round(speedup(0.5, 0.05, 3), 3) == 1.630
    assert best_k(0.5, 0.05) == 3
    assert round(tokens_per_verify(0.9, 13), 3) == 7.712 and round(speedup(0.9, 0.05, 13), 3) == 4.674
    assert best_k(0.9, 0.05) == 13
    assert round(tokens_per_verify(0.2, 5), 3) == 1.250 and round(speedup(0.2, 0.5, 5), 3) == 0.357
    assert best_k(0.2, 0.5) == 0
    # the near-tie: k = 6 wins by about 2e-6
    s5, s6 = speedup(0.7, 0.05, 5), speedup(0.7, 0.05, 6)
    assert 0 < s6 - s5 < 3e-6
    assert (round(s5, 6), round(s6, 6)) == (2.352936, 2.352938)


def test_guide_s9_batch_roofline():
    def verify_cost(b, k):
        return max(1, b * (k + 1) / RIDGE_ROWS) / max(1, b / RIDGE_ROWS)

    rows = {1: 6, 32: 192, 64: 384, 128: 768, 256: 1536}
    costs = {1: 1.00, 32: 1.00, 64: 1.30, 128: 2.60, 256: 5.21}
    gains = {1: 2.94, 32: 2.94, 64: 2.26, 128: 1.13, 256: 0.56}
    e = tokens_per_verify(0.7, 5)
    for b in rows:
        assert b * 6 == rows[b]
        assert round(verify_cost(b, 5), 2) == costs[b]
        assert round(e / verify_cost(b, 5), 2) == gains[b]


# -- guide, section 10 and deep-dive sections 6 and 11: scheduling and rollback ------------------

def rollback(num_tokens, computed, drafts, accepted):
    scheduled = num_tokens + drafts - computed
    emitted = accepted + 1
    rejected = drafts - accepted
    return scheduled, computed + scheduled - rejected, num_tokens + emitted


def test_guide_s10_rollback_examples():
    assert rollback(100, 99, 3, 1) == (4, 101, 102)
    assert 102 + 3 - 101 == 4                                     # next step: 1 + k' rows
    # check yourself 7
    assert rollback(500, 499, 4, 2) == (5, 502, 503)
    assert 503 + 4 - 502 == 5


def test_deep_dive_s6_length_cap():
    # T tokens, T - 1 computed: scheduler allows max_model_len - 1 - (T - 1) rows
    max_model_len, T = 10, 8
    rows = min(1 + 5, max_model_len - 1 - (T - 1))
    assert rows == 2 and rows - 1 == 1                            # one draft survives
    assert min(5, max_model_len - T) == 2                         # the proposer allowed 2


# -- guide, section 11 and deep-dive section 7: logits indices -----------------------------------

def test_guide_s11_logits_indices_worked_example():
    logits, target, bonus, cu_draft = calc_logits_indices([3, 0, 2, 0, 1], [4, 104, 107, 207, 209])
    assert logits == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert target == [0, 1, 2, 5, 6, 9]
    assert bonus == [3, 4, 7, 8, 10]
    assert cu_draft == [3, 3, 5, 5, 6]
    # deep-dive: the draft ids come from input_ids[logits_indices][target + 1]
    assert [logits[t + 1] for t in target] == [1, 2, 3, 105, 106, 208]


# -- guide, section 12: metrics ------------------------------------------------------------------

def test_guide_s12_log_line_example():
    k, accepted = 5, [5, 2, 0]
    drafts, drafted, acc = len(accepted), k * len(accepted), sum(accepted)
    assert round(1 + acc / drafts, 2) == 3.33
    assert round(acc / drafted * 100, 1) == 46.7
    per_pos = [sum(a > i for a in accepted) / drafts for i in range(k)]
    assert ", ".join(f"{p:.3f}" for p in per_pos) == "0.667, 0.667, 0.333, 0.333, 0.333"


def test_guide_s12_reconcile_length_and_rate():
    assert round((2.8 - 1) / 5, 2) == 0.36 and round((3.8 - 1) / 5, 2) == 0.56
    assert round(alpha_from_length(2.8, 5), 3) == 0.677
    assert round(alpha_from_length(3.8, 5), 3) == 0.813
    # check yourself 8
    assert round((2.5 - 1) / 3, 3) == 0.5
    assert round(alpha_from_length(2.5, 3), 3) == 0.691


def test_guide_s15_check_yourself_6():
    assert round(tokens_per_verify(0.8, 4), 3) == 3.362
    assert round(speedup(0.8, 0.1, 4), 2) == 2.40
    assert [round(speedup(0.8, 0.1, k), 2) for k in (3, 5, 6, 7)] == [2.27, 2.46, 2.47, 2.45]
    assert best_k(0.8, 0.1) == 6


# -- deep-dive, section 9: synthetic mode --------------------------------------------------------

def test_deep_dive_s9_synthetic_rates():
    # unconditional -> conditional: c_i = p_i / p_{i-1}
    rates = [0.7, 0.49, 0.343]
    cond = [p / q for p, q in zip(rates, [1.0, *rates[:-1]])]
    assert np.allclose(cond, [0.7, 0.7, 0.7])
    # a mean length of 2.5 with k = 4 -> minimum-variance schedule [1, 0.5, 0, 0]
    length, n = 2.5, 4
    drafts = length - 1
    full = int(drafts)
    sched = ([1.0] * full + [drafts - full] + [0.0] * (n - full - 1))[:n]
    assert sched == [1.0, 0.5, 0.0, 0.0]
    assert 1 + sum(sched) == length


# -- the pin: anchors the pages lean on ----------------------------------------------------------

@pytest.mark.skipif(not (UPSTREAM / "vllm").exists(), reason="upstream/ not unpacked")
def test_pin_defaults_and_definitions():
    spec = (UPSTREAM / "vllm/config/speculative.py").read_text()
    assert 'draft_sample_method: DraftSampleMethod = "greedy"' in spec
    assert re.search(r"self\.prompt_lookup_min = 5\n\s+self\.prompt_lookup_max = 5", spec)
    metrics = (UPSTREAM / "vllm/v1/spec_decode/metrics.py").read_text()
    assert "mean_acceptance_length = 1 + (num_accepted_tokens / num_drafts)" in metrics
    runner = (UPSTREAM / "vllm/v1/worker/gpu_model_runner.py").read_text()
    assert "# logits_indices:           [  0,   1,   2,   3, 103, 104, 105, 106," in runner
