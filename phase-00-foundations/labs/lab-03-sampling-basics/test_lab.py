"""Lab 00-03 — the sampler's knobs as exact algorithms, equal to mini_vllm's Sampler."""
from course import load_impl

impl = load_impl(__file__)

import itertools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# The guide's example: " Paris", " Lyon", " a", " the", " banana"
GUIDE = np.array([4.0, 1.5, 1.0, 0.5, -3.0])


def test_softmax_is_a_distribution_and_is_stable():
    p = impl.softmax(np.array([1000.0, 1001.0, 1002.0]))
    assert np.isfinite(p).all() and p.sum() == pytest.approx(1.0)
    assert list(np.argsort(p)) == [0, 1, 2]  # order preserved
    assert np.allclose(p, impl.softmax(np.array([0.0, 1.0, 2.0])))  # shift-invariant


def test_guide_example_numbers():
    assert np.round(impl.softmax(GUIDE), 3).tolist() == [0.860, 0.071, 0.043, 0.026, 0.001]
    assert round(float(impl.filtered_probs(GUIDE, 0.5)[0]), 3) == 0.990
    assert round(float(impl.filtered_probs(GUIDE, 2.0)[0]), 3) == 0.584
    kept = impl.filtered_probs(GUIDE, 1.0, top_k=2)
    assert np.round(kept, 3).tolist() == [0.924, 0.076, 0.0, 0.0, 0.0]
    # Paris alone (0.860) is short of 0.9, so the crossing token Lyon is kept too
    assert np.array_equal(impl.filtered_probs(GUIDE, 1.0, top_p=0.9), kept)
    assert np.count_nonzero(impl.filtered_probs(GUIDE, 1.0, top_p=0.95)) == 3
    # min-p 0.05: keep tokens with at least 5% of Paris's 0.860, i.e. >= 0.043
    assert np.count_nonzero(impl.filtered_probs(GUIDE, 1.0, min_p=0.05)) == 2


def test_greedy_is_argmax_and_ignores_every_other_knob():
    rng = np.random.default_rng(7)
    before = rng.bit_generator.state
    for k, p, m in itertools.product((0, 1, 3), (0.1, 1.0), (0.0, 0.9)):
        assert impl.sample(GUIDE[::-1], 0.0, k, p, m, rng) == 4
    assert rng.bit_generator.state == before  # greedy never touches the generator
    assert impl.sample(np.array([2.0, 5.0, 5.0]), 0.0) == 1  # ties: the lowest id


def test_top_k_keeps_exactly_k():
    row = np.array([0.1, 3.0, -1.0, 2.0, 0.5])
    out = impl.apply_top_k(row, 2)
    assert np.isfinite(out).tolist() == [False, True, False, True, False]
    assert out[1] == 3.0 and out[3] == 2.0
    for disabled in (0, -1, 5, 9):
        assert np.array_equal(impl.apply_top_k(row, disabled), row)
    # a tie with the k-th largest survives, as in mini_vllm and upstream
    assert np.isfinite(impl.apply_top_k(np.array([1.0, 2.0, 2.0, 0.0]), 1)).sum() == 2


def test_top_p_keeps_the_smallest_sufficient_nucleus():
    logits = np.log(np.array([0.4, 0.4, 0.2]))
    # 0.5 lies well inside (0.4, 0.8): no float rounding can move the boundary
    out = impl.apply_top_p(logits, 0.5)
    assert np.isfinite(out).tolist() == [True, True, False]
    assert np.isfinite(impl.apply_top_p(logits, 0.3)).sum() == 1
    assert np.isfinite(impl.apply_top_p(logits, 0.9)).sum() == 3
    assert np.array_equal(impl.apply_top_p(logits, 1.0), logits)
    assert np.isfinite(impl.apply_top_p(logits, 1e-9)).sum() == 1  # never empty


def test_min_p_masks_logits_below_a_fraction_of_the_top_probability():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    out = impl.apply_min_p(logits, 0.2)  # threshold 0.2 x 0.5 = 0.1
    assert np.isfinite(out).tolist() == [True, True, True, False]
    assert np.array_equal(out[:3], logits[:3])  # survivors keep their logits
    # the final softmax renormalises over the survivors
    assert impl.softmax(out).tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    assert np.array_equal(impl.apply_min_p(logits, 0.0), logits)
    # relative, not absolute: adding a constant to every logit changes nothing
    assert np.isfinite(impl.apply_min_p(logits + 7.0, 0.2)).tolist() == [True, True, True, False]
    # the most likely token survives even min_p = 1, so greedy is never affected
    assert np.isfinite(impl.apply_min_p(GUIDE, 1.0)).tolist() == [True, False, False, False, False]


# The README's order example: probs [0.5, 0.3, 0.12, 0.08], min_p = 0.2, top_p = 0.85
ORDER = np.log(np.array([0.5, 0.3, 0.12, 0.08]))


def _reversed_order(logits, temperature, top_k, top_p, min_p):
    """The other order: top-k and top-p on the full distribution, min-p last."""
    row = impl.apply_temperature(logits, temperature)
    row = impl.apply_top_p(impl.apply_top_k(row, top_k), top_p)
    return impl.softmax(impl.apply_min_p(row, min_p))


def test_min_p_runs_before_top_p_like_vllm():
    alone_p = impl.filtered_probs(ORDER, 1.0, top_p=0.85)
    alone_m = impl.filtered_probs(ORDER, 1.0, min_p=0.2)
    assert np.count_nonzero(alone_p) == 3 and np.count_nonzero(alone_m) == 3
    both = impl.filtered_probs(ORDER, 1.0, top_p=0.85, min_p=0.2)
    assert np.round(both, 3).tolist() == [0.625, 0.375, 0.0, 0.0]
    assert np.round(_reversed_order(ORDER, 1.0, 0, 0.85, 0.2), 3).tolist() == [
        0.543, 0.326, 0.130, 0.0
    ]
    # after min-p, " 0.12" is 0.130 of what is left: at or below 1 - 0.85, so top-p drops it
    assert round(0.12 / 0.92, 3) == 0.130


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    top_k=st.sampled_from([0, 2, 8]),
    top_p=st.sampled_from([0.5, 0.8, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_order_matters_only_for_top_p_and_vllm_order_never_keeps_more(seed, top_k, top_p, min_p):
    logits = np.random.default_rng(seed).normal(0.0, 2.0, size=24)
    vllm = impl.filtered_probs(logits, 1.0, top_k, top_p, min_p)
    other = _reversed_order(logits, 1.0, top_k, top_p, min_p)
    assert set(np.flatnonzero(vllm)) <= set(np.flatnonzero(other))
    if top_p == 1.0 or min_p == 0.0:  # min-p commutes with top-k
        assert np.allclose(vllm, other)


def test_temperature_sharpens_or_flattens():
    tops = [impl.filtered_probs(GUIDE, t).max() for t in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert tops == sorted(tops, reverse=True)
    assert impl.apply_temperature(GUIDE, 2.0).tolist() == (GUIDE / 2).tolist()


def test_seeded_sampling_is_reproducible():
    logits = np.random.default_rng(3).normal(size=50)
    a = [impl.sample(logits, 1.0, generator=np.random.default_rng(11)) for _ in range(5)]
    assert len(set(a)) == 1
    s1 = np.random.default_rng(5)
    s2 = np.random.default_rng(5)
    assert [impl.sample(logits, 0.8, 20, 0.9, 0.0, s1) for _ in range(30)] == [
        impl.sample(logits, 0.8, 20, 0.9, 0.0, s2) for _ in range(30)
    ]


def test_draws_follow_the_distribution():
    rng = np.random.default_rng(0)
    draws = [impl.sample(GUIDE, 1.0, generator=rng) for _ in range(4000)]
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.abs(freq - impl.softmax(GUIDE)).max() < 0.02


# 16 configurations: (temperature, top_k, top_p, min_p)
CONFIGS = [
    (0.0, 0, 1.0, 0.0),
    (0.0, 5, 0.5, 0.1),
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (1.5, 0, 1.0, 0.0),
    (1.0, 1, 1.0, 0.0),
    (1.0, 10, 1.0, 0.0),
    (1.0, -1, 1.0, 0.0),
    (1.0, 0, 0.9, 0.0),
    (1.0, 0, 0.3, 0.0),
    (0.7, 50, 0.95, 0.0),
    (1.0, 0, 1.0, 0.05),
    (1.0, 0, 1.0, 0.5),
    (0.8, 20, 0.9, 0.02),
    (2.0, 100, 0.8, 0.1),
    (0.3, 300, 0.99, 0.0),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[f"T{t}-k{k}-p{p}-m{m}" for t, k, p, m in CONFIGS])
def test_agrees_with_mini_vllm_sampler(config):
    from mini_vllm.sampler import Sampler
    from mini_vllm.sampling_params import SamplingParams

    temperature, top_k, top_p, min_p = config
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    theirs = Sampler()
    for seed in range(4):
        logits = np.random.default_rng(100 + seed).normal(0.0, 2.0, size=257)
        mine_rng, their_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        # a stream of 12 draws from one generator each: equal tokens all the way
        # down means both samplers consume the generator in the same way
        mine = [impl.sample(logits, temperature, top_k, top_p, min_p, mine_rng) for _ in range(12)]
        ref = [theirs.sample(logits, params, their_rng) for _ in range(12)]
        assert mine == ref
        if temperature > 0:
            assert np.allclose(
                impl.filtered_probs(logits, temperature, top_k, top_p, min_p),
                theirs.probs(logits, params),
            )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.3]),
    top_k=st.sampled_from([-1, 0, 1, 3, 16]),
    top_p=st.sampled_from([0.2, 0.7, 1.0]),
    min_p=st.sampled_from([0.0, 0.1]),
)
def test_agrees_with_mini_vllm_for_random_seeds(seed, temperature, top_k, top_p, min_p):
    from mini_vllm.sampler import Sampler
    from mini_vllm.sampling_params import SamplingParams

    logits = np.random.default_rng(seed).normal(0.0, 1.0, size=32)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    mine = impl.sample(logits, temperature, top_k, top_p, min_p, np.random.default_rng(seed))
    assert mine == Sampler().sample(logits, params, np.random.default_rng(seed))


def test_top_p_ties_at_the_boundary_drop_the_lower_id_first_like_mini_vllm():
    from mini_vllm.sampler import Sampler
    from mini_vllm.sampling_params import SamplingParams

    # ids 0 and 2 tie at 0.2, ids 1 and 3 at 0.3; p = 0.75 drops exactly one 0.2 token
    logits = np.log(np.array([0.2, 0.3, 0.2, 0.3]))
    kept = np.isfinite(impl.apply_top_p(logits, 0.75))
    assert kept.tolist() == [False, True, True, True]
    ref = Sampler().probs(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert (ref > 0).tolist() == kept.tolist()
    # a tie among the most likely: p = 0.25 keeps one 0.3 token, the higher id
    logits = np.log(np.array([0.3, 0.2, 0.3, 0.2]))
    kept = np.isfinite(impl.apply_top_p(logits, 0.25))
    assert kept.tolist() == [False, False, True, False]
    ref = Sampler().probs(logits, SamplingParams(temperature=1.0, top_p=0.25))
    assert (ref > 0).tolist() == kept.tolist()


def test_a_nucleus_that_reaches_p_exactly_stops_there():
    # four equal logits: probabilities of exactly 0.25, running masses 0.25, 0.5, 0.75, 1.0
    equal = np.zeros(4)
    assert np.isfinite(impl.apply_top_p(equal, 0.75)).sum() == 3
    assert np.isfinite(impl.apply_top_p(equal, 0.5)).sum() == 2
    assert np.isfinite(impl.apply_top_p(equal, 0.25)).sum() == 1


def test_top_p_one_is_a_pass_through_even_for_underflowing_tokens():
    logits = np.array([0.0, -800.0, -1000.0, 5.0])  # two probabilities underflow to 0.0
    assert np.array_equal(impl.apply_top_p(logits, 1.0), logits)


def test_top_p_keeps_the_top_token_when_rounding_leaves_the_total_below_one():
    # find (deterministically) a row whose sorted probabilities add up to just under 1.0;
    # p = 1 - that total would otherwise drop every token
    for seed in range(200):
        logits = np.random.default_rng(seed).normal(0.0, 1.0, size=97)
        probs = impl.softmax(logits)
        total = np.cumsum(np.sort(probs))[-1]
        if total < 1.0:
            break
    assert total < 1.0
    out = impl.apply_top_p(logits, 1.0 - total)
    assert np.isfinite(out).sum() >= 1 and np.isfinite(out[np.argmax(logits)])


def test_filters_never_modify_the_callers_logits():
    original = np.array([2.0, -1.0, 0.5, 3.0, 0.5, -2.0])
    logits = original.copy()
    impl.apply_top_k(logits, 2)
    impl.apply_top_p(logits, 0.5)
    impl.apply_min_p(logits, 0.3)
    impl.apply_temperature(logits, 0.5)
    impl.filtered_probs(logits, 0.7, 2, 0.5, 0.1)
    impl.sample(logits, 0.7, 2, 0.5, 0.1, np.random.default_rng(0))
    assert np.array_equal(logits, original)


def test_each_filter_alone_keeps_the_expected_set():
    row = np.log(np.array([0.05, 0.4, 0.1, 0.25, 0.2]))
    assert np.isfinite(impl.apply_top_k(row, 3)).tolist() == [False, True, False, True, True]
    assert np.isfinite(impl.apply_top_k(row, 4)).tolist() == [False, True, True, True, True]
    # top-p 0.6: 0.4 alone is short, 0.4 + 0.25 = 0.65 reaches it
    assert np.isfinite(impl.apply_top_p(row, 0.6)).tolist() == [False, True, False, True, False]
    # min-p 0.3: threshold 0.12 keeps 0.4, 0.25, 0.2
    assert np.isfinite(impl.apply_min_p(row, 0.3)).tolist() == [False, True, False, True, True]
    # a probability exactly at the threshold is kept: two tied leaders survive min_p = 1
    assert np.isfinite(impl.apply_min_p(np.array([1.0, -2.0, 1.0]), 1.0)).tolist() == [
        True, False, True
    ]


def test_min_p_sees_the_temperature_scaled_distribution():
    # at T = 1 the 0.15 token survives min_p = 0.25 (threshold 0.125); at T = 0.5 the
    # distribution sharpens to [0.69, 0.25, 0.06, ...] and it falls below 0.25 x 0.69
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.count_nonzero(impl.filtered_probs(logits, 1.0, min_p=0.25)) == 3
    assert np.count_nonzero(impl.filtered_probs(logits, 0.5, min_p=0.25)) == 2


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: impl.apply_temperature(GUIDE, 0.0), "temperature"),
        (lambda: impl.apply_temperature(GUIDE, -1.0), "temperature"),
        (lambda: impl.apply_top_k(GUIDE, -2), "top_k"),
        (lambda: impl.apply_top_p(GUIDE, 0.0), "top_p"),
        (lambda: impl.apply_top_p(GUIDE, -0.1), "top_p"),
        (lambda: impl.apply_top_p(GUIDE, 1.0001), "top_p"),
        (lambda: impl.apply_min_p(GUIDE, -0.01), "min_p"),
        (lambda: impl.apply_min_p(GUIDE, 1.01), "min_p"),
        (lambda: impl.filtered_probs(GUIDE, 0.0), "temperature"),
        (lambda: impl.softmax(np.array([])), "logits"),
        (lambda: impl.sample(GUIDE, -1e-9), "temperature"),
    ],
)
def test_each_function_checks_its_own_arguments(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_the_edges_of_every_allowed_range_are_accepted():
    assert impl.sample(GUIDE, 0.0) == 0
    assert np.array_equal(impl.apply_top_k(GUIDE, -1), GUIDE)
    assert np.array_equal(impl.apply_top_p(GUIDE, 1.0), GUIDE)
    assert np.array_equal(impl.apply_min_p(GUIDE, 0.0), GUIDE)
    assert np.isfinite(impl.apply_min_p(GUIDE, 1.0)).sum() == 1
    assert impl.apply_temperature(GUIDE, 1e-3)[0] == pytest.approx(4000.0)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: impl.sample(GUIDE, -0.5), "temperature"),
        (lambda: impl.sample(GUIDE, 1.0, top_k=-2), "top_k"),
        (lambda: impl.sample(GUIDE, 1.0, top_p=0.0), "top_p"),
        (lambda: impl.sample(GUIDE, 1.0, min_p=1.5), "min_p"),
        (lambda: impl.sample(np.zeros((2, 3)), 1.0), "logits"),
    ],
)
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
