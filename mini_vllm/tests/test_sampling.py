from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.sampler import Sampler
from mini_vllm.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"seed": -1}, "seed"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"stop": ""}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": 1e-3}, "temperature"),  # upstream would raise it to 0.01
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 0.0, "n": 2}, "n"),  # greedy copies would be identical
        ({"seed": 1.5}, "seed"),
    ],
)
def test_every_invalid_value_raises_naming_the_parameter(kwargs, names):
    with pytest.raises(ValueError, match=rf"^{names} must be"):
        SamplingParams(**kwargs)


def test_range_is_in_the_message():
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 0"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match=r"top_k must be -1 or 0 \(disabled\) or >= 1, got -5"):
        SamplingParams(top_k=-5)


def test_the_temperature_floor_is_in_the_message_and_is_itself_accepted():
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a finite number >= 0.01, got 0.005"):
        SamplingParams(temperature=0.005)
    assert SamplingParams(temperature=0.01).temperature == 0.01
    probs = Sampler().probs(np.array([0.0, 0.5, 1.0]), SamplingParams(temperature=0.01))
    assert np.isfinite(probs).all() and probs.argmax() == 2


def test_defaults_and_disabled_values_are_accepted():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.max_tokens, p.n) == (1.0, 0, 1.0, 0.0, 16, 1)
    assert SamplingParams(top_k=-1).top_k == -1
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(temperature=0).greedy


def test_greedy_is_argmax_with_lowest_id_on_ties():
    s = Sampler()
    assert s.sample(np.array([0.1, 3.0, 2.0]), SamplingParams(temperature=0)) == 1
    assert s.sample(np.array([5.0, 1.0, 5.0]), SamplingParams(temperature=0)) == 0


def _support(probs):
    return set(np.flatnonzero(probs).tolist())


def test_top_k_keeps_exactly_the_k_largest():
    logits = np.array([1.0, 4.0, 3.0, 2.0, 0.0])
    probs = Sampler().probs(logits, SamplingParams(top_k=2))
    assert _support(probs) == {1, 2}
    e = np.exp([4.0, 3.0])
    np.testing.assert_allclose(probs[[1, 2]], e / e.sum())


def test_top_k_keeps_ties_with_the_kth_value():
    probs = Sampler().probs(np.array([3.0, 2.0, 2.0, 1.0]), SamplingParams(top_k=2))
    assert _support(probs) == {0, 1, 2}


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    s = Sampler()
    assert _support(s.probs(logits, SamplingParams(top_p=0.45))) == {0}
    assert _support(s.probs(logits, SamplingParams(top_p=0.6))) == {0, 1}
    assert _support(s.probs(logits, SamplingParams(top_p=0.9))) == {0, 1, 2}
    assert _support(s.probs(logits, SamplingParams(top_p=0.96))) == {0, 1, 2, 3}
    # at least the most likely token survives, however small p is
    assert _support(s.probs(logits, SamplingParams(top_p=1e-9))) == {0}


def test_min_p_drops_tokens_below_a_fraction_of_the_max():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = Sampler().probs(logits, SamplingParams(min_p=0.3))  # threshold 0.15
    assert _support(probs) == {0, 1, 2}
    np.testing.assert_allclose(probs[:3], np.array([0.5, 0.3, 0.15]) / 0.95)


def test_min_p_runs_before_top_p_as_upstream():
    # probs [0.5, 0.3, 0.12, 0.08], min_p = 0.2 (threshold 0.1), top_p = 0.85.
    # Upstream order: min-p drops 0.08, leaving [0.5, 0.3, 0.12] / 0.92; top-p then
    # sees 0.12 / 0.92 = 0.130 <= 1 - 0.85 at the bottom and drops it too -> {0, 1}.
    # The old order (top-p on the full row, then min-p) would have kept {0, 1, 2}.
    logits = np.log(np.array([0.5, 0.3, 0.12, 0.08]))
    s = Sampler()
    assert _support(s.probs(logits, SamplingParams(top_p=0.85))) == {0, 1, 2}
    assert _support(s.probs(logits, SamplingParams(min_p=0.2))) == {0, 1, 2}
    both = s.probs(logits, SamplingParams(min_p=0.2, top_p=0.85))
    assert _support(both) == {0, 1}
    np.testing.assert_allclose(both, [0.625, 0.375, 0.0, 0.0])
    # and the draw uses exactly that distribution: one choice over the full vocab
    ref = np.random.default_rng(4).choice(4, p=both)
    assert s.sample(logits, SamplingParams(min_p=0.2, top_p=0.85), np.random.default_rng(4)) == ref


def test_min_p_sees_the_temperature_scaled_distribution():
    # At T = 1 the ratios to the top token are 0.6, 0.3, 0.1: min_p = 0.4 keeps two.
    # At T = 2 they become sqrt of those, 0.775, 0.548, 0.316: it keeps three.
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    s = Sampler()
    assert _support(s.probs(logits, SamplingParams(min_p=0.4))) == {0, 1}
    assert _support(s.probs(logits, SamplingParams(temperature=2.0, min_p=0.4))) == {0, 1, 2}


def test_min_p_never_changes_the_greedy_pick():
    logits = np.random.default_rng(0).normal(size=64)
    probs = Sampler().probs(logits, SamplingParams(min_p=1.0, temperature=0.7))
    assert _support(probs) == {int(np.argmax(logits))}


def test_temperature_divides_the_logits():
    logits = np.array([0.0, 1.0])
    probs = Sampler().probs(logits, SamplingParams(temperature=0.5))
    np.testing.assert_allclose(probs, np.exp([0.0, 2.0]) / np.exp([0.0, 2.0]).sum())


def test_same_seed_same_samples_and_empirical_distribution_matches():
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    params = SamplingParams(temperature=1.0, seed=3)
    s = Sampler()
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    draws = [s.sample(logits, params, g1) for _ in range(4000)]
    assert draws == [s.sample(logits, params, g2) for _ in range(4000)]
    freq = np.bincount(draws, minlength=3) / 4000
    np.testing.assert_allclose(freq, [0.6, 0.3, 0.1], atol=0.03)  # > 4 sigma at n=4000


def test_a_request_generator_is_unaffected_by_other_requests_draws():
    logits = np.zeros(50)
    params = SamplingParams(seed=1)
    s = Sampler()
    alone = np.random.default_rng(1)
    solo = [s.sample(logits, params, alone) for _ in range(10)]
    mine, other = np.random.default_rng(1), np.random.default_rng(99)
    mixed = []
    for _ in range(10):
        s.sample(logits, params, other)  # a neighbour in the batch samples too
        mixed.append(s.sample(logits, params, mine))
    assert mixed == solo


def test_sampler_rejects_a_batch_where_a_row_is_expected():
    with pytest.raises(ValueError, match="one row"):
        Sampler().sample(np.zeros((2, 5)), SamplingParams())
