"""Every worked number in Phase 09's guide, recomputed.

The guide quotes these values; if one changes here, the text is wrong. Each test names the
section of ``00-guide.md`` it backs. The sampler steps are restated here in a few lines of numpy
with upstream's rules (the ascending-sort top-p, min-p relative to the top probability, the
sign-dependent repetition penalty, the persistent batch's add-then-condense), independent of the
labs' code. Numbers measured by a lab (lab 02's counters on mini_vllm, lab 04's batch checks) are
asserted by that lab's tests; the ones repeated here are pure arithmetic. Pure Python and numpy,
well under a second. The tests that read ``upstream/`` skip when it is absent.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM

P6 = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])      # the six-token row of section 5


# -- the sampler's steps, restated --------------------------------------------------------------

def softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z[np.isfinite(z)].max())
    e[~np.isfinite(z)] = 0.0
    return e / e.sum()


def penalize(z, prompt, output, rep=1.0, freq=0.0, pres=0.0):
    z = np.array(z, dtype=np.float64)
    counts = np.bincount(np.asarray(output, dtype=int), minlength=len(z))[: len(z)]
    seen = counts > 0
    seen_any = seen.copy()
    seen_any[list(prompt)] = True
    factor = np.where(seen_any, rep, 1.0)
    z = z * np.where(z > 0, 1.0 / factor, factor)
    return z - freq * counts - pres * seen


def top_k(z, k):
    z = np.array(z, dtype=np.float64)
    kth = np.sort(z)[len(z) - k]
    return np.where(z < kth, -np.inf, z)


def top_p(z, p):
    """Upstream's rule: ascending sort, drop while the cumulative sum is <= 1 - p, keep the top."""
    z = np.array(z, dtype=np.float64)
    order = np.argsort(z, kind="stable")
    cum = np.cumsum(softmax(z)[order])
    drop = cum <= 1 - p
    drop[-1] = False
    z[order[drop]] = -np.inf
    return z


def min_p(z, m):
    probs = softmax(z)
    return np.where(probs < m * probs.max(), -np.inf, np.asarray(z, dtype=np.float64))


def kept(z):
    return [int(i) for i in np.flatnonzero(np.isfinite(z))]


def bad_word_banned(bad_word, output):
    """The last token of ``bad_word`` is banned when the output ends with the rest of it."""
    prefix = bad_word[:-1]
    if len(bad_word) > len(output) + 1:
        return False
    return (list(output[len(output) - len(prefix):]) if prefix else []) == list(prefix)


# -- guide, section 1: the sampler's input ------------------------------------------------------

def test_guide_s1_logits_tensor_size():
    assert 64 * 128_256 == 8_208_384
    assert round(64 * 128_256 * 4 / 1e6, 1) == 32.8                 # MB of float32


# -- guide, section 2: temperature before a penalty rescales it ---------------------------------

def test_guide_s2_temperature_before_frequency_penalty():
    z, t, f = 1.7, 0.5, 0.5
    assert math.isclose(z / t - f, (z - f * t) / t)                 # = a penalty of f*T in model units


# -- guide, section 3: bad words -----------------------------------------------------------------

def test_guide_s3_multi_token_bad_word():
    bad = [412, 77, 9]
    assert bad_word_banned(bad, [5, 412, 77])
    assert not bad_word_banned(bad, [412, 77, 5])
    assert not bad_word_banned(bad, [])          # a prompt ending in 412, 77 does not count
    assert bad_word_banned([9], [])              # a one-token bad word is always banned


# -- guide, section 4: penalties -----------------------------------------------------------------

def test_guide_s4_worked_table():
    z = [2.0, 1.0, -0.5, 0.5, -1.0]
    prompt, output = [0, 2], [1, 3, 1]
    rep_only = penalize(z, prompt, output, rep=1.2)
    assert np.allclose(np.round(rep_only, 4), [1.6667, 0.8333, -0.6, 0.4167, -1.0])
    with_freq = penalize(z, prompt, output, rep=1.2, freq=0.5)
    assert np.allclose(np.round(with_freq, 4), [1.6667, -0.1667, -0.6, -0.0833, -1.0])
    final = penalize(z, prompt, output, rep=1.2, freq=0.5, pres=0.3)
    assert np.allclose(np.round(final, 4), [1.6667, -0.4667, -0.6, -0.3833, -1.0])
    # token 1 falls from second place to fourth
    assert list(np.argsort(-np.array(z))).index(1) == 1
    assert list(np.argsort(-final)).index(1) == 2                  # third, below token 3
    assert final[3] > final[1]
    # the bug: repetition over the output only leaves tokens 0 and 2 untouched
    bug = penalize(z, [], output, rep=1.2, freq=0.5, pres=0.3)
    assert bug[0] == 2.0 and bug[2] == -0.5
    # dividing a negative logit raises it
    assert round(-0.5 / 1.2, 2) == -0.42 and -0.5 / 1.2 > -0.5
    assert round(2.0 / 1.2, 2) == 1.67 and round(-0.5 * 1.2, 2) == -0.6


def test_guide_s14_check_yourself_2():
    out = penalize([3.0, -2.0], [0, 1], [0, 0, 1, 1], rep=1.5, freq=0.4, pres=0.2)
    assert np.allclose(out, [1.0, -4.0])
    prompt_only = penalize([3.0, -2.0], [0, 1], [], rep=1.5, freq=0.4, pres=0.2)
    assert np.allclose(prompt_only, [2.0, -3.0])


# -- guide, section 5: temperature, min-p, top-k, top-p ------------------------------------------

def test_guide_s5_temperature():
    z = np.log(P6)
    assert np.allclose(softmax(z), P6)
    sq = P6 ** 2
    assert np.allclose(sq, [0.16, 0.0625, 0.0225, 0.01, 0.0036, 0.0016])
    assert round(sq.sum(), 4) == 0.2602
    assert np.allclose(np.round(softmax(z / 0.5), 4), [0.6149, 0.2402, 0.0865, 0.0384, 0.0138, 0.0061])
    assert np.allclose(np.round(softmax(z / 2), 4), [0.2773, 0.2192, 0.1698, 0.1386, 0.1074, 0.0877])


def test_guide_s5_each_knob_alone():
    z = np.log(P6)
    k3 = top_k(z, 3)
    assert kept(k3) == [0, 1, 2] and np.allclose(softmax(k3)[:3], [0.5, 0.3125, 0.1875])
    assert np.allclose(np.round(np.cumsum(P6[::-1]), 2), [0.04, 0.10, 0.20, 0.35, 0.60, 1.00])
    p06 = top_p(z, 0.6)
    assert kept(p06) == [0, 1]
    assert np.allclose(np.round(softmax(p06)[:2], 4), [0.6154, 0.3846])
    assert math.isclose(0.2 * 0.40, 0.08)
    m02 = min_p(z, 0.2)
    assert kept(m02) == [0, 1, 2, 3]
    assert np.allclose(np.round(softmax(m02)[:4], 4), [0.4444, 0.2778, 0.1667, 0.1111])


def test_guide_s5_order_matters():
    z = np.log(P6)
    # 1. temperature before min-p
    t05 = z / 0.5
    assert round(0.2 * softmax(t05).max(), 4) == 0.1230
    assert kept(min_p(t05, 0.2)) == [0, 1]
    ratio = P6 / P6.max()
    assert [int(i) for i in np.flatnonzero(ratio ** 2 >= 0.2)] == [0, 1]
    # 2. top-k before top-p
    assert kept(top_p(top_k(z, 3), 0.7)) == [0, 1]
    assert np.allclose(np.round(np.cumsum([0.1875, 0.3125, 0.5]), 4), [0.1875, 0.5, 1.0])
    assert kept(top_p(z, 0.7)) == [0, 1, 2]
    assert round(P6[:2].sum(), 2) == 0.65
    # 3. min-p before top-p (upstream) against the reverse
    assert round(softmax(min_p(z, 0.2))[:2].sum(), 4) == 0.7222
    assert kept(top_p(min_p(z, 0.2), 0.7)) == [0, 1]
    assert kept(min_p(top_p(z, 0.7), 0.2)) == [0, 1, 2]
    assert math.isclose(0.2 * softmax(top_p(z, 0.7)).max(), 0.1)


def test_guide_s14_check_yourself_3():
    z = np.log(P6)
    assert kept(top_p(z, 0.85)) == [0, 1, 2, 3]
    assert round(P6[:4].sum(), 2) == 0.90 and P6[:3].sum() < 0.85
    assert kept(top_p(top_k(z, 2), 0.85)) == [0, 1]
    # the boundary trap the answer warns about: 1 - 0.9 < 0.04 + 0.06
    assert 1 - 0.9 < 0.04 + 0.06


def test_guide_s5_top_k_keeps_ties():
    assert kept(top_k([3.0, 2.0, 2.0, 1.0], 2)) == [0, 1, 2]


# -- guide, section 6: the draw ------------------------------------------------------------------

def test_guide_s6_race_worked_draw():
    p = np.array([0.5, 0.3125, 0.1875, 0, 0, 0])
    q = np.array([1.2, 0.3, 0.9, 0.5, 0.7, 1.1])
    ratios = p / q
    assert np.allclose(np.round(ratios[:3], 4), [0.4167, 1.0417, 0.2083])
    assert int(np.argmax(ratios)) == 1


def test_guide_s6_race_and_gumbel_are_the_same_draw():
    rng = np.random.default_rng(9)
    p = P6
    u = rng.random((20_000, 6))
    e = -np.log(u)                                          # Exp(1)
    race = np.argmax(p / e, axis=1)
    gumbel = np.argmax(np.log(p) - np.log(-np.log(u)), axis=1)
    assert (race == gumbel).all()                           # identical token for identical u
    freq = np.bincount(race, minlength=6) / len(race)
    assert np.allclose(freq, p, atol=0.012)


# -- guide, section 7: floating-point addition is not associative --------------------------------

def test_guide_s7_non_associative_sum():
    assert (0.1 + 0.2) + 0.3 == 0.6000000000000001
    assert 0.1 + (0.2 + 0.3) == 0.6


# -- guide, section 8: logprobs ------------------------------------------------------------------

def logprob_entries(logprobs, k, sampled):
    """Sampled token first, then the top k, merged by token id; rank = #entries >= own."""
    top = list(np.argsort(-logprobs, kind="stable")[:k])
    ids = [sampled] + [t for t in top if t != sampled]
    return {int(t): int((logprobs >= logprobs[t]).sum()) for t in ids}


def test_guide_s8_raw_values_entries_ranks():
    lp = np.log(P6)
    assert np.allclose(np.round(lp, 3), [-0.916, -1.386, -1.897, -2.303, -2.813, -3.219])
    # raw logprobs do not move with temperature: they are taken before it
    assert np.allclose(np.log(softmax(np.log(P6))), lp)
    assert logprob_entries(lp, 2, 0) == {0: 1, 1: 2}            # k entries
    assert logprob_entries(lp, 2, 3) == {3: 4, 0: 1, 1: 2}      # k + 1 entries
    # check yourself 5: logprobs = 3, sampled rank 5 -> 4 entries
    e = logprob_entries(lp, 3, 4)
    assert len(e) == 4 and e[4] == 5


# -- guide, section 9: n > 1 through the prefix cache --------------------------------------------

def parallel_prefill(prompt_len, n, block):
    hit = (prompt_len - 1) // block * block
    computed = prompt_len + (n - 1) * (prompt_len - hit)
    return hit, computed, (n - 1) * hit / (n * prompt_len)


def test_guide_s9_parallel_sampling_numbers():
    hit, computed, rate = parallel_prefill(2000, 4, 16)
    assert (1999 // 16, hit, 2000 - hit) == (124, 1984, 16)
    assert computed == 2048 and 4 * 2000 == 8000
    assert round(8000 / computed, 1) == 3.9
    assert round(rate * 100, 1) == 74.4 and rate < 0.75
    assert parallel_prefill(10, 4, 16)[0] == 0                 # shorter than a block: no hit
    # check yourself 6
    hit, computed, rate = parallel_prefill(1000, 3, 16)
    assert (999 // 16, hit, 1000 - hit, computed) == (62, 992, 8, 1016)
    assert round(rate * 100, 1) == 66.1


# -- guide, section 10: beam search --------------------------------------------------------------

def test_guide_s10_greedy_loses():
    greedy, beam = 0.6 * 0.51, 0.4 * 0.9
    assert (round(greedy, 3), round(beam, 3)) == (0.306, 0.36)
    assert beam > greedy


def beam_score(total_len, cum, length_penalty=1.0, ends_in_eos=False):
    return cum / (total_len - ends_in_eos) ** length_penalty


def test_guide_s10_length_penalty_counts_the_prompt():
    x = beam_score(10 + 2, -1.0)
    y = beam_score(10 + 4, -1.6)
    assert (round(x, 4), round(y, 4)) == (-0.0833, -0.1143) and x > y
    xg, yg = beam_score(2, -1.0), beam_score(4, -1.6)
    assert (xg, yg) == (-0.5, -0.4) and yg > xg                # the ranking flips
    assert beam_score(13, -1.0, ends_in_eos=True) == x         # a final EOS is not counted


def test_guide_s10_prefix_cache_makes_beams_cheap():
    prompt, width, steps, block = 500, 4, 50, 16
    without = prompt + sum(width * (prompt + t) for t in range(1, steps))
    with_cache = prompt + (steps - 1) * width * block
    assert (without, with_cache) == (103_400, 3_636)
    assert round(without / with_cache) == 28
    # every beam recomputes between 1 and block tokens
    for length in range(501, 560):
        recompute = length - (length - 1) // block * block
        assert 1 <= recompute <= block


def test_guide_s14_check_yourself_7():
    assert 2 * 3 == 6


# -- guide, section 11: BatchUpdate from a persistent batch --------------------------------------

def persistent_step(rows, finished, arrivals):
    """Upstream's InputBatch: remove, add at the lowest freed index, condense last into holes."""
    rows = list(rows)
    removed = sorted(rows.index(r) for r in finished)
    for i in removed:
        rows[i] = None
    free = list(removed)
    added = []
    for r in arrivals:
        idx = free.pop(0) if free else len(rows)
        if idx == len(rows):
            rows.append(None)
        rows[idx] = r
        added.append((idx, r))
    moved = []
    while free:
        last = max(i for i, r in enumerate(rows) if r is not None)
        hole = free[0]
        if hole >= last:
            break
        free.pop(0)
        rows[hole], rows[last] = rows[last], None
        moved.append((last, hole, "UNIDIRECTIONAL"))
    while rows and rows[-1] is None:
        rows.pop()
    return rows, removed, added, moved


def test_guide_s11_batch_update_example():
    rows, removed, added, moved = persistent_step("abcd", "ab", "e")
    assert rows == ["e", "d", "c"]
    assert (removed, added, moved) == ([0, 1], [(0, "e")], [(3, 1, "UNIDIRECTIONAL")])


def test_guide_s14_check_yourself_8():
    rows, removed, added, moved = persistent_step("abcde", "be", "f")
    assert rows == ["a", "f", "c", "d"]
    assert (removed, added, moved) == ([1, 4], [(1, "f")], [])


# -- the pin: the lines the guide leans on --------------------------------------------------------

def _read(rel):
    return (UPSTREAM / rel).read_text()


@pytest.mark.skipif(not (UPSTREAM / "vllm").exists(), reason="upstream/ not unpacked")
def test_pin_rules_the_guide_states():
    ops = _read("vllm/_custom_ops.py")
    assert "torch.where(prompt_mask | output_mask, repetition_penalties, 1.0)" in ops
    assert "torch.where(logits > 0, 1.0 / penalties, penalties)" in ops
    utils = _read("vllm/model_executor/layers/utils.py")
    assert "logits -= frequency_penalties.unsqueeze(dim=1) * output_bin_counts" in utils
    topk = _read("vllm/v1/sample/ops/topk_topp_sampler.py")
    assert "top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)" in topk
    assert "return probs.div_(q).argmax(dim=-1).view(-1)" in topk
    builtin = _read("vllm/v1/sample/logits_processor/builtin.py")
    assert "invalid_token_mask = probability_values < adjusted_min_p" in builtin
    sampler = _read("vllm/v1/sample/sampler.py")
    assert "return (x >= values).sum(-1)" in _read("vllm/v1/sample/ops/logprobs.py")
    assert sampler.index("apply_logits_processors(") < sampler.index("self.sample(logits")
    assert "child_sampling_params.seed = seed + index" in _read("vllm/v1/engine/parallel_sampling.py")
    assert "max_cache_hit_length = request.num_tokens - 1" in _read("vllm/v1/core/kv_cache_manager.py")
    offline = _read("vllm/entrypoints/generate/beam_search/offline.py")
    assert "logprobs=2 * beam_width," in offline
    bs_utils = _read("vllm/entrypoints/generate/beam_search/utils.py")
    assert "seq_len = len(tokens)" in bs_utils and "seq_len -= 1" in bs_utils
    assert not (UPSTREAM / "vllm/beam_search.py").exists()
