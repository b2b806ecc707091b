"""Lab 09-01 tests: the batched sampler, step by step, then whole, against mini_vllm and upstream.

Every random input uses a fixed seed, so each test gives the same verdict on every run. The
one statistical test derives its threshold in a comment.
"""
from __future__ import annotations

import ast
import math
import types

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
NEG = -np.inf


def rows_of(*rows):
    return np.array(rows, dtype=np.float64)


# ---------------------------------------------------------------- allowed ids, bad words, min_tokens, bias


def test_allowed_token_ids_mask_only_the_restricted_rows():
    logits = rows_of([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [0.5, NEG, 0.5, 0.5])
    out = impl.apply_allowed_token_ids(logits, [[1, 3], None, [0, 1]])
    assert out.tolist() == [[NEG, 2.0, NEG, 4.0],  # only 1 and 3 survive, values unchanged
                            [1.0, 2.0, 3.0, 4.0],  # None: unrestricted
                            [0.5, NEG, NEG, NEG]]  # an allowed token that was already -inf stays so
    # an allow-list of every id changes nothing
    np.testing.assert_array_equal(impl.apply_allowed_token_ids(logits[:1], [[3, 2, 1, 0]]), logits[:1])


def test_bad_words_ban_the_last_token_after_the_generated_prefix():
    V = 10
    logits = np.zeros((6, V))
    words = [[3, 4, 7], [5]]
    out = impl.apply_bad_words(
        logits, {i: words for i in range(5)},
        [[1, 3, 4],  # ends with the prefix [3, 4]: 7 is banned
         [3, 4, 1],  # the prefix occurs, but not at the end: 7 stays
         [4],  # one generated token: a 3-token word cannot complete yet
         [3, 4],  # exactly the prefix
         [4, 3],  # the prefix reversed
         [3, 4]])  # row 5 has no bad words
    banned = [sorted(np.flatnonzero(np.isinf(r)).tolist()) for r in out]
    # the one-token word [5] is banned in every listed row; row 5 has no bad words at all
    assert banned == [[5, 7], [5], [5], [5, 7], [5], []]
    # only the LAST token of a word is banned: 3 and 4 stay finite everywhere
    assert np.isfinite(out[:, [3, 4]]).all()


def test_bad_words_read_the_output_not_the_prompt():
    # The prefix is matched against generated tokens only: a prompt that ends with [3, 4]
    # bans nothing at the first step (upstream passes output_token_ids, not prompt + output).
    out = impl.apply_bad_words(np.zeros((1, 8)), {0: [[3, 4, 7]]}, [[]])
    assert np.isfinite(out).all()
    out = impl.apply_bad_words(np.zeros((1, 8)), {0: [[4, 7]]}, [[4]])
    assert np.flatnonzero(np.isinf(out[0])).tolist() == [7]


def test_min_tokens_bans_every_stop_id_until_reached():
    logits = np.ones((4, 6))
    out = impl.apply_min_tokens(logits, [3, 3, 0, 1],
                                [[1, 2], [1, 2, 3], [], []],
                                [[0, 5], [0, 5], [0], [0, 5]])
    assert np.isinf(out[0, [0, 5]]).all() and np.isfinite(out[0, 1:5]).all()  # 2 < 3: EOS and 5
    assert np.isfinite(out[1]).all()  # 3 generated: at min_tokens stopping is allowed
    assert np.isfinite(out[2]).all()  # min_tokens 0: off
    assert np.isinf(out[3, [0, 5]]).all()  # 0 < 1: the very first step
    assert np.isfinite(out[3, 1:5]).all()


def test_logit_bias_adds_to_the_named_tokens():
    logits = rows_of([0.0, 1.0, 2.0], [0.0, NEG, 2.0])
    out = impl.apply_logit_bias(logits, [{0: 5.0, 2: -1.5}, {1: 100.0, 2: 0.25}])
    assert out.tolist() == [[5.0, 1.0, 0.5], [0.0, NEG, 2.25]]  # added, not assigned; -inf stays
    assert impl.apply_logit_bias(logits, [None, {}]).tolist() == logits.tolist()


# ---------------------------------------------------------------- penalties


def test_penalties_by_hand():
    logits = rows_of([2.0, -1.0, 0.5, 3.0, 1.0],
                     [1.0, 1.0, 1.0, 1.0, 1.0],
                     [2.0, -1.0, 0.5, 3.0, 1.0],
                     [2.0, -1.0, 0.0, 3.0, 1.0])
    out = impl.apply_penalties(
        logits,
        prompt_token_ids=[[0, 1], [4, 4, 4], [0, 1], [0, 1, 2]],
        output_token_ids=[[2, 2, 3], [4], [], []],
        presence_penalties=[0.25, 0.0, 0.0, 0.0],
        frequency_penalties=[0.5, 1.0, 0.0, 0.0],
        repetition_penalties=[2.0, 1.0, 1.0, 0.5])
    # Row 0, repetition 2 over prompt {0, 1} and output {2, 3}; frequency 0.5 and presence
    # 0.25 over the output only:
    #   token 0, prompt only, positive:   2.0 / 2                   =  1.0  (output-only: 2.0)
    #   token 1, prompt only, negative:  -1.0 * 2                   = -2.0  (divided: -0.5)
    #   token 2, output twice:            0.5 / 2 - 0.5 * 2 - 0.25   = -1.0  (presence x count: -1.25)
    #   token 3, output once:             3.0 / 2 - 0.5 - 0.25       =  0.75
    #   token 4, unseen:                                              1.0
    # Row 1: token 4 occurs 3 times in the prompt and once in the output; frequency 1 counts
    #   the output only: 1 - 1 = 0 (counting the prompt too: 1 - 4 = -3).
    # Row 2: all penalties off: unchanged.
    # Row 3: repetition 0.5 (< 1 rewards repeats): 2 -> 4, -1 -> -0.5, 0 * 0.5 = 0.
    assert out.tolist() == [[1.0, -2.0, -1.0, 0.75, 1.0],
                            [1.0, 1.0, 1.0, 1.0, 0.0],
                            [2.0, -1.0, 0.5, 3.0, 1.0],
                            [4.0, -0.5, 0.0, 3.0, 1.0]]


def test_repetition_penalty_covers_prompt_and_output():
    # token 0 only in the prompt, token 1 only in the output, token 2 in both: each is
    # divided by r exactly once (a token in both is not penalized twice)
    out = impl.apply_penalties(rows_of([4.0, 4.0, 4.0, 4.0]), [[0, 2]], [[1, 2]], [0.0], [0.0], [2.0])
    assert out.tolist() == [[2.0, 2.0, 2.0, 4.0]]


def test_penalties_leave_masked_tokens_masked():
    out = impl.apply_penalties(rows_of([NEG, 1.0, NEG]), [[0]], [[2, 2]], [2.0], [-2.0], [1.5])
    assert out[0, 0] == NEG and out[0, 2] == NEG and not np.isnan(out).any()


# ---------------------------------------------------------------- temperature, min-p, top-k, top-p


def test_temperature_divides_and_guards_greedy_rows():
    logits = rows_of([1.0, -2.0], [1.0, -2.0], [1.0, -2.0])
    out = impl.apply_temperature(logits, [0.5, 0.0, 4.0])
    # row 1 is greedy (temperature 0): divided by 1.0, never by 0 (no inf, no NaN)
    assert out.tolist() == [[2.0, -4.0], [1.0, -2.0], [0.25, -0.5]]
    # below SAMPLING_EPS = 1e-5 counts as greedy too
    assert impl.apply_temperature(logits[:1], [1e-6]).tolist() == [[1.0, -2.0]]


def test_min_p_threshold_is_relative_to_the_top_probability():
    # probs [0.5, 0.3, 0.15, 0.05]: min_p 0.3 -> threshold 0.15, which 0.15 itself meets
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 3))
    out = impl.apply_min_p(logits, [0.3, 0.0, 1.0])
    assert np.isinf(out[0]).tolist() == [False, False, False, True]
    np.testing.assert_array_equal(out[0, :3], logits[0, :3])  # survivors untouched
    assert np.isfinite(out[1]).all()  # 0: off
    assert np.isinf(out[2]).tolist() == [False, True, True, True]  # 1.0: only the top survives
    # on logits with a large max, thresholding the logits themselves would keep a different set
    big = rows_of([10.0, 9.0, 5.0, 0.0])  # probs 0.727, 0.268, 0.0049, 0.00003
    assert np.isinf(impl.apply_min_p(big, [0.3])[0]).tolist() == [False, False, True, True]


def test_top_k_keeps_every_tie_at_the_kth_value():
    logits = rows_of([1.0, 3.0, 2.0, 2.0, 0.0], [1.0, 3.0, 2.0, 2.0, 0.0],
                     [1.0, 3.0, 2.0, 2.0, 0.0], [1.0, 3.0, 2.0, 2.0, 0.0])
    out = impl.apply_top_k_top_p(logits, [2, 0, 5, -1], [1.0] * 4)
    # k = 2: the 2nd largest is 2.0 and both tokens holding it survive
    assert np.isinf(out[0]).tolist() == [True, False, False, False, True]
    for row in out[1:]:  # 0, V and -1 are all "off"
        np.testing.assert_array_equal(row, logits[0])
    out = impl.apply_top_k_top_p(logits[:1], [1], [1.0])
    assert np.flatnonzero(np.isfinite(out[0])).tolist() == [1]


def test_top_p_boundary_is_inclusive_and_keeps_the_top_token():
    # logits 0 -> probs exactly 0.25 each; cumulative from the bottom 0.25, 0.5, 0.75, 1.0.
    # top_p 0.5: drop while cum <= 0.5 -> two dropped, two kept (with "<": three kept)
    out = impl.apply_top_k_top_p(np.zeros((1, 4)), [0], [0.5])
    assert np.isfinite(out).sum() == 2
    # ties are ordered by token id (stable sort): the lower ids are dropped first
    assert np.flatnonzero(np.isfinite(out[0])).tolist() == [2, 3]
    # probs [0.5, 0.3, 0.12, 0.08]: top_p 0.85 keeps {0, 1, 2}; a tiny p keeps the top only
    logits = np.log(np.array([[0.5, 0.3, 0.12, 0.08]] * 2))
    out = impl.apply_top_k_top_p(logits, [0, 0], [0.85, 1e-9])
    assert np.isinf(out).tolist() == [[False, False, False, True], [False, True, True, True]]


def test_top_p_measures_mass_after_top_k():
    # probs [0.4, 0.3, 0.2, 0.1]; top_k 3 renormalizes to [4, 3, 2] / 9; top_p 0.75:
    # cumulative from the bottom 2/9 = 0.222 <= 0.25 -> token 2 dropped -> {0, 1}.
    # top-p on the full row would see 0.1, 0.3 and keep {0, 1, 2}.
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    out = impl.apply_top_k_top_p(logits, [3], [0.75])
    assert np.flatnonzero(np.isfinite(out[0])).tolist() == [0, 1]


# ---------------------------------------------------------------- the pipeline: order


def _support(p):
    return set(np.flatnonzero(p > 0).tolist())


def test_min_p_before_top_p_keeps_fewer():
    # mini_vllm's docstring case: probs [0.5, 0.3, 0.12, 0.08], min_p 0.2, top_p 0.85.
    # min-p first (threshold 0.1) drops 0.08; top-p then sees 0.12 / 0.92 = 0.130 <= 0.15
    # at the bottom and drops it too: [0.625, 0.375, 0, 0]. top-p first keeps {0, 1, 2},
    # and min-p after it keeps them all (0.12 / 0.92 / (0.5 / 0.92) = 0.24 >= 0.2).
    logits = np.log(np.array([[0.5, 0.3, 0.12, 0.08]]))
    probs = impl.sampling_probs(logits, impl.make_metadata([{"min_p": 0.2, "top_p": 0.85}]))
    np.testing.assert_allclose(probs[0], [0.625, 0.375, 0.0, 0.0], rtol=1e-12)


def test_min_p_sees_the_temperature_scaled_distribution():
    # ratios to the top token at T = 1: 0.6, 0.3, 0.1 -> min_p 0.4 keeps {0, 1};
    # at T = 2 they are their square roots 0.775, 0.548, 0.316 -> it keeps {0, 1, 2}
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2))
    md = impl.make_metadata([{"min_p": 0.4}, {"min_p": 0.4, "temperature": 2.0}])
    probs = impl.sampling_probs(logits, md)
    assert _support(probs[0]) == {0, 1} and _support(probs[1]) == {0, 1, 2}


def test_temperature_applies_after_penalties():
    # logits [1, 0], token 0 in the output once, presence 1, T = 0.5.
    # Penalty first: [0, 0] / 0.5 = [0, 0] -> [0.5, 0.5].
    # Temperature first: [2, 0] - [1, 0] = [1, 0] -> [0.731, 0.269].
    md = impl.make_metadata([{"temperature": 0.5, "presence_penalty": 1.0, "output_token_ids": [0]}])
    probs = impl.sampling_probs(rows_of([1.0, 0.0]), md)
    np.testing.assert_allclose(probs[0], [0.5, 0.5], rtol=1e-12)


def test_logit_bias_and_bans_come_before_the_greedy_argmax():
    logits = rows_of([5.0, 4.0, 3.0, 2.0, 1.0])
    md = impl.make_metadata([
        {"temperature": 0.0, "logit_bias": {4: 10.0}},  # bias changes the argmax: 4
        {"temperature": 0.0, "allowed_token_ids": [2, 3]},  # -> 2
        {"temperature": 0.0, "bad_words": [[0]], "min_tokens": 2, "stop_token_ids": [1],
         "output_token_ids": [3]},  # 0 banned, 1 is a stop id before min_tokens -> 2
        {"temperature": 0.0, "repetition_penalty": 4.0, "prompt_token_ids": [0],
         "frequency_penalty": 2.0, "output_token_ids": [1]},  # 5/4 = 1.25; 4 - 2 = 2 -> 2
    ])
    gens = [np.random.default_rng(0) for _ in range(4)]
    assert impl.sample(np.repeat(logits, 4, axis=0), md, gens).tolist() == [4, 2, 2, 2]


def test_greedy_rows_take_the_argmax_and_touch_no_generator():
    logits = np.random.default_rng(3).normal(size=(3, 40))
    # greedy rows keep their argmax whatever min-p / top-k / top-p say; 1e-6 is greedy too
    md = impl.make_metadata([{"temperature": 0.0, "top_k": 3, "min_p": 1.0},
                             {"temperature": 1e-6, "top_p": 0.1},
                             {"temperature": 1.0}])
    gens = [np.random.default_rng(s) for s in (1, 2, 3)]
    tokens = impl.sample(logits, md, gens)
    assert tokens.dtype == np.int64 and tokens.shape == (3,)
    assert tokens[:2].tolist() == logits[:2].argmax(axis=1).tolist()
    # the greedy rows' generators were not advanced; the sampling row's was, once
    for g, s in zip(gens[:2], (1, 2), strict=True):
        assert g.random() == np.random.default_rng(s).random()
    fresh = np.random.default_rng(3)
    fresh.random()
    assert gens[2].random() == fresh.random()
    probs = impl.sampling_probs(logits, md)
    assert probs[0].tolist() == np.eye(40)[logits[0].argmax()].tolist()


# ---------------------------------------------------------------- against mini_vllm, row by row


def _mini_configs():
    from mini_vllm.sampling_params import SamplingParams

    return [SamplingParams(temperature=0.0), SamplingParams(), SamplingParams(temperature=0.7),
            SamplingParams(temperature=1.5), SamplingParams(top_k=1), SamplingParams(top_k=5),
            SamplingParams(top_k=5, temperature=0.5), SamplingParams(top_p=0.9),
            SamplingParams(top_p=0.5, temperature=1.3), SamplingParams(min_p=0.1),
            SamplingParams(min_p=0.3, temperature=2.0), SamplingParams(top_k=10, top_p=0.8),
            SamplingParams(min_p=0.05, top_p=0.9),
            SamplingParams(min_p=0.2, top_k=8, top_p=0.95, temperature=0.8),
            SamplingParams(temperature=0.0, top_k=-1)]


def test_batched_equals_mini_vllm_per_row_on_15_configurations():
    from mini_vllm.sampler import Sampler

    configs = _mini_configs()
    assert len(configs) == 15
    B, V, steps = len(configs), 64, 25
    logits = np.random.default_rng(11).normal(scale=2.0, size=(B, V))
    md = impl.make_metadata([{"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
                              "min_p": p.min_p} for p in configs])
    ref = Sampler()
    probs = impl.sampling_probs(logits, md)
    for i, p in enumerate(configs):
        want = np.eye(V)[logits[i].argmax()] if p.greedy else ref.probs(logits[i], p)
        np.testing.assert_allclose(probs[i], want, rtol=1e-12, atol=1e-15, err_msg=f"row {i}: {p}")
    # the draws: each row with its own generator, 25 steps, token for token
    ours = [np.random.default_rng(100 + i) for i in range(B)]
    theirs = [np.random.default_rng(100 + i) for i in range(B)]
    got = np.stack([impl.sample(logits, md, ours) for _ in range(steps)], axis=1)
    want = np.array([[ref.sample(logits[i], p, theirs[i]) for _ in range(steps)]
                     for i, p in enumerate(configs)])
    np.testing.assert_array_equal(got, want)
    assert len({tuple(r) for r in got[1:4]}) == 3  # the sampling rows really vary
    assert len(set(got[1].tolist())) > 3


def test_a_rows_tokens_do_not_depend_on_its_neighbours():
    logits = np.random.default_rng(12).normal(size=(4, 32))
    knobs = [{"temperature": 0.9, "top_p": 0.8}, {"temperature": 0.0},
             {"min_p": 0.1}, {"temperature": 1.2, "top_k": 6}]
    gens = [np.random.default_rng(7 + i) for i in range(4)]
    batched = np.stack([impl.sample(logits, impl.make_metadata(knobs), gens) for _ in range(10)])
    for i in range(4):
        g = np.random.default_rng(7 + i)
        alone = [impl.sample(logits[i:i + 1], impl.make_metadata([knobs[i]]), [g])[0]
                 for _ in range(10)]
        assert batched[:, i].tolist() == alone


# ---------------------------------------------------------------- bans hold under sampling


def test_banned_tokens_are_never_sampled_in_10k_draws():
    # 10,000 identical rows sampled in one call (one shared generator, advanced once per row).
    # V = 8, logits 0 (uniform). allowed {0..5} bans 6, 7; bad word [2, 3] after output
    # [.., 2] bans 3; min_tokens 5 with 1 generated bans the stop id 0. Left: {1, 2, 4, 5},
    # each with probability exactly 1/4.
    N, V = 10_000, 8
    row = {"allowed_token_ids": [0, 1, 2, 3, 4, 5], "bad_words": [[2, 3]], "output_token_ids": [2],
           "min_tokens": 5, "stop_token_ids": [0], "temperature": 1.0}
    md = impl.make_metadata([row] * N)
    g = np.random.default_rng(2024)
    tokens = impl.sample(np.zeros((N, V)), md, [g] * N)
    counts = np.bincount(tokens, minlength=V)
    assert counts[[0, 3, 6, 7]].tolist() == [0, 0, 0, 0]
    # Each kept token's count is Binomial(N, 1/4): mean 2,500, sd sqrt(N/4 * 3/4) = 43.3.
    # 5 sd (217) is exceeded with probability 5.7e-7 per token, so a correct draw passes;
    # drawing from the wrong rows' uniforms or ignoring the cdf would not stay within it.
    assert (np.abs(counts[[1, 2, 4, 5]] - N / 4) <= 5 * math.sqrt(N * 0.25 * 0.75)).all()


# ---------------------------------------------------------------- contracts


def test_inputs_are_not_modified():
    logits = np.random.default_rng(5).normal(size=(3, 10))
    keep = logits.copy()
    md = impl.make_metadata([{"allowed_token_ids": [1, 2, 3], "temperature": 0.5},
                             {"repetition_penalty": 1.3, "prompt_token_ids": [1, 1],
                              "output_token_ids": [2], "presence_penalty": 0.5},
                             {"logit_bias": {4: 2.0}, "min_p": 0.2, "top_k": 3, "top_p": 0.7}])
    impl.apply_allowed_token_ids(logits, md.allowed_token_ids)
    impl.apply_bad_words(logits, {0: [[1]]}, md.output_token_ids)
    impl.apply_min_tokens(logits, [1, 1, 1], md.output_token_ids, [[0], [0], [0]])
    impl.apply_logit_bias(logits, md.logit_bias)
    impl.apply_penalties(logits, md.prompt_token_ids, md.output_token_ids, [1, 1, 1], [1, 1, 1],
                         [2, 2, 2])
    impl.apply_temperature(logits, [0.5, 0.5, 0.5])
    impl.apply_min_p(logits, [0.5, 0.5, 0.5])
    impl.apply_top_k_top_p(logits, [2, 2, 2], [0.5, 0.5, 0.5])
    impl.sample(logits, md, [np.random.default_rng(0)] * 3)
    np.testing.assert_array_equal(logits, keep)


def test_bad_inputs_name_the_parameter():
    x = np.zeros((2, 5))
    cases = [
        (lambda: impl.apply_temperature(x, [1.0, -0.1]), "temperature"),
        (lambda: impl.apply_temperature(x, [1.0, np.inf]), "temperature"),
        (lambda: impl.apply_min_p(x, [0.0, 1.5]), "min_p"),
        (lambda: impl.apply_top_k_top_p(x, [0, -2], [1.0, 1.0]), "top_k"),
        (lambda: impl.apply_top_k_top_p(x, [0, 0], [1.0, 0.0]), "top_p"),
        (lambda: impl.apply_top_k_top_p(x, [0, 0], [1.0, 1.01]), "top_p"),
        (lambda: impl.apply_penalties(x, [[], []], [[], []], [0, 2.5], [0, 0], [1, 1]),
         "presence_penalties"),
        (lambda: impl.apply_penalties(x, [[], []], [[], []], [0, 0], [-2.1, 0], [1, 1]),
         "frequency_penalties"),
        (lambda: impl.apply_penalties(x, [[], []], [[], []], [0, 0], [0, 0], [1, 0]),
         "repetition_penalties"),
        (lambda: impl.apply_penalties(x, [[5], []], [[], []], [0, 0], [0, 0], [1, 1]),
         "prompt_token_ids"),
        (lambda: impl.apply_penalties(x, [[], []], [[0], [-1]], [0, 0], [0, 0], [1, 1]),
         "output_token_ids"),
        (lambda: impl.apply_allowed_token_ids(x, [[0], []]), "allowed_token_ids"),
        (lambda: impl.apply_allowed_token_ids(x, [[0], [5]]), "allowed_token_ids"),
        (lambda: impl.apply_allowed_token_ids(x, [[0]]), "allowed_token_ids"),
        (lambda: impl.apply_bad_words(x, {0: [[]]}, [[], []]), "bad_words_token_ids"),
        (lambda: impl.apply_bad_words(x, {2: [[1]]}, [[], []]), "bad_words_token_ids"),
        (lambda: impl.apply_bad_words(x, {0: [[1, 9]]}, [[], []]), "bad_words_token_ids"),
        (lambda: impl.apply_min_tokens(x, [1, -1], [[], []], [[0], [0]]), "min_tokens"),
        (lambda: impl.apply_min_tokens(x, [1, 1], [[], []], [[0], [7]]), "stop_token_ids"),
        (lambda: impl.apply_logit_bias(x, [{5: 1.0}, None]), "logit_bias"),
        (lambda: impl.apply_logit_bias(x, [{1: np.nan}, None]), "logit_bias"),
        (lambda: impl.apply_logit_bias(x, [None]), "logit_bias"),
        (lambda: impl.sample(x, impl.make_metadata([{}, {}]), [np.random.default_rng(0)]),
         "generators"),
        (lambda: impl.sampling_probs(x, impl.make_metadata([{}])), "metadata"),
        (lambda: impl.sampling_probs(x, impl.make_metadata([{"allowed_token_ids": [1],
                                                            "bad_words": [[1]]}, {}])), "logits"),
        (lambda: impl.apply_temperature(np.ones(5), [1.0]), "logits"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()


# ---------------------------------------------------------------- upstream's code, run on numpy


class _T(np.ndarray):
    """numpy posing as a torch tensor: only the methods the upstream functions below call."""

    def unsqueeze(self, dim):
        return np.expand_dims(np.asarray(self), dim).view(_T)

    def repeat(self, *sizes):
        return np.tile(np.asarray(self), sizes).view(_T)

    def size(self, dim=None):  # torch's size(dim); numpy's .size is shadowed on purpose
        return self.shape if dim is None else self.shape[dim]

    def to(self, dtype):
        return np.asarray(self).astype(dtype).view(_T)

    @property
    def device(self):
        return "cpu"

    def scatter_add_(self, dim, index, src):
        assert dim == 1
        idx = np.asarray(index)
        rows = np.broadcast_to(np.arange(idx.shape[0])[:, None], idx.shape)
        np.add.at(np.asarray(self), (rows, idx), np.asarray(src))
        return self

    def gather(self, dim, index):
        return np.take_along_axis(np.asarray(self), np.asarray(index), dim).view(_T)

    def masked_fill_(self, mask, value):
        np.asarray(self)[np.asarray(mask)] = value
        return self

    def softmax(self, dim):
        a = np.asarray(self)
        e = np.exp(a - a.max(axis=dim, keepdims=True))
        return (e / e.sum(axis=dim, keepdims=True)).view(_T)

    def sort(self, dim=-1, descending=False):
        idx = np.argsort(np.asarray(self), axis=dim, kind="stable")
        if descending:
            idx = np.flip(idx, axis=dim)
        return np.take_along_axis(np.asarray(self), idx, dim).view(_T), idx.view(_T)

    def scatter_(self, dim, index, src):
        np.put_along_axis(np.asarray(self), np.asarray(index), np.asarray(src), dim)
        return self


def _t(a, dtype=np.float64):
    return np.array(a, dtype=dtype).view(_T)


FAKE_TORCH = types.SimpleNamespace(
    Tensor=_T, long=np.int64, bool=np.bool_, float32=np.float32,
    zeros=lambda shape, dtype=None, device=None: np.zeros(shape, dtype=dtype).view(_T),
    ones_like=lambda a: np.ones_like(np.asarray(a)).view(_T),
    where=lambda c, a, b: np.where(np.asarray(c), np.asarray(a), np.asarray(b)).view(_T),
    cumsum=lambda a, dim, out: np.cumsum(np.asarray(a), axis=dim, out=np.asarray(out)).view(_T),
)


def _upstream_functions(path, names, extra=None):
    """Named top-level functions of an upstream file, decorators and imports stripped,
    defined over FAKE_TORCH (so neither vllm nor torch is imported)."""
    tree = ast.parse((UPSTREAM / path).read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {d.name for d in defs} == set(names)
    for d in defs:
        d.decorator_list = []
        d.body = [s for s in d.body if not isinstance(s, ast.Import | ast.ImportFrom)]
    ns = {"torch": FAKE_TORCH, **(extra or {})}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(UPSTREAM / path), "exec"), ns)
    return ns


def _padded(lists, pad):
    width = max(1, max(len(t) for t in lists))
    return _t([list(t) + [pad] * (width - len(t)) for t in lists], np.int64)


@pytest.mark.upstream
def test_penalties_agree_with_vllms_apply_penalties():
    rep = _upstream_functions("vllm/_custom_ops.py", ["apply_repetition_penalties_torch"])
    ns = _upstream_functions("vllm/model_executor/layers/utils.py",
                             ["get_token_bin_counts_and_mask", "apply_penalties"],
                             {"apply_repetition_penalties": rep["apply_repetition_penalties_torch"]})
    rng = np.random.default_rng(21)
    B, V = 24, 12
    logits = rng.normal(scale=3.0, size=(B, V))
    logits[rng.random((B, V)) < 0.05] = NEG
    prompts = [rng.integers(0, V, rng.integers(0, 9)).tolist() for _ in range(B)]
    outputs = [rng.integers(0, V, rng.integers(0, 9)).tolist() for _ in range(B)]
    pres, freq = rng.uniform(-2, 2, B), rng.uniform(-2, 2, B)
    reps = rng.uniform(0.5, 2.0, B)
    reps[::4] = 1.0
    want = ns["apply_penalties"](_t(logits), _padded(prompts, V), _padded(outputs, V),
                                 _t(pres), _t(freq), _t(reps))
    got = impl.apply_penalties(logits, prompts, outputs, pres, freq, reps)
    # upstream multiplies by 1 / r where the lab may divide by r: 1-ulp differences
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12, atol=1e-12)
    finite = np.isfinite(logits)
    assert (np.abs(got[finite] - logits[finite]) > 1e-3).mean() > 0.3  # penalties did act


@pytest.mark.upstream
def test_top_k_top_p_agree_with_vllms_pytorch_path():
    ns = _upstream_functions("vllm/v1/sample/ops/topk_topp_sampler.py", ["apply_top_k_top_p_pytorch"])
    rng = np.random.default_rng(22)
    B, V = 40, 30
    logits = rng.normal(scale=2.0, size=(B, V))  # continuous: no ties
    k = rng.integers(1, V + 1, B)  # V means "off", upstream's convention
    p = rng.uniform(0.05, 1.0, B)
    k[::5], p[1::5] = V, 1.0
    want = np.asarray(ns["apply_top_k_top_p_pytorch"](_t(logits), _t(k, np.int64), _t(p)))
    got = impl.apply_top_k_top_p(logits, k, p)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(got[np.isfinite(got)], logits[np.isfinite(got)])
    kept = np.isfinite(got).sum(axis=1)
    assert kept.min() >= 1 and kept.max() == V and len(set(kept.tolist())) > 10


@pytest.mark.upstream
def test_bad_words_agree_with_vllms_apply_bad_words():
    ns = _upstream_functions("vllm/v1/sample/ops/bad_words.py",
                             ["_apply_bad_words_single_batch", "apply_bad_words"],
                             {"_SMALLEST_LOGIT": float("-inf")})
    rng = np.random.default_rng(23)
    B, V = 60, 4  # a tiny vocabulary so that prefixes match often
    outputs = [rng.integers(0, V, rng.integers(0, 6)).tolist() for _ in range(B)]
    words = {i: [rng.integers(0, V, rng.integers(1, 4)).tolist() for _ in range(3)]
             for i in range(B) if i % 3}
    want = np.zeros((B, V))
    ns["apply_bad_words"](want, words, outputs)  # in place, one row at a time
    got = impl.apply_bad_words(np.zeros((B, V)), words, outputs)
    np.testing.assert_array_equal(got, want)
    assert 0.1 < np.isinf(want).mean() < 0.6


def test_a_temperature_of_exactly_sampling_eps_samples():
    # Upstream's rule is `temperature < _SAMPLING_EPS` -> greedy, so 1e-5 itself is a sampling
    # row: it is divided by 1e-5 (not by 1.0), its distribution is not the one-hot, and its
    # generator is advanced by exactly one draw.
    logits = rows_of([1e-5, 0.0, -1e-5])
    assert impl.apply_temperature(logits, [impl.SAMPLING_EPS]).tolist() == [[1.0, 0.0, -1.0]]
    md = impl.make_metadata([{"temperature": impl.SAMPLING_EPS}])
    probs = impl.sampling_probs(logits, md)
    e = np.exp(np.array([1.0, 0.0, -1.0]) - 1.0)
    assert np.allclose(probs[0], e / e.sum(), rtol=1e-12)
    gen = np.random.default_rng(5)
    impl.sample(logits, md, [gen])
    fresh = np.random.default_rng(5)
    fresh.random()
    assert gen.random() == fresh.random()


def test_a_sampling_row_without_a_generator_is_refused_and_a_greedy_row_needs_none():
    logits = rows_of([0.0, 1.0], [2.0, 0.0])
    md = impl.make_metadata([{"temperature": 0.0}, {"temperature": 1.0}])
    with pytest.raises(ValueError, match=r"generators: row 1 samples and needs a np.random.Generator"):
        impl.sample(logits, md, [np.random.default_rng(0), None])
    # The greedy row's entry is never used, so None is fine there.
    assert impl.sample(logits, md, [None, np.random.default_rng(0)])[0] == 1
