"""Lab 08-04 tests: the speedup model's numbers, its simulation, and vLLM's own metrics."""
from __future__ import annotations

import ast
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
METRICS = UPSTREAM / "vllm/v1/spec_decode/metrics.py"
SPEC_UTILS = UPSTREAM / "vllm/v1/spec_decode/utils.py"


def model_histogram(alpha: float, k: int) -> np.ndarray:
    """Test-side: P(a verify keeps exactly j drafts), j = 0 .. k.

    j < k: j passes then a failure, alpha**j * (1 - alpha); j = k: every draft
    passes, alpha**k. (A truncated geometric distribution; it sums to 1.)
    """
    j = np.arange(k + 1)
    p = alpha ** j * (1.0 - alpha)
    p[k] = alpha ** k
    return p


def chi_square(accepted: np.ndarray, alpha: float, k: int) -> float:
    """Pearson's statistic of the kept-drafts histogram against model_histogram."""
    expected = model_histogram(alpha, k) * accepted.size
    observed = np.bincount(accepted, minlength=k + 1)[: k + 1]
    return float(((observed - expected) ** 2 / expected).sum())


class FixedUniforms:
    """A stand-in for numpy's Generator whose random() hands back a fixed matrix."""

    def __init__(self, u):
        self.u = np.asarray(u, dtype=np.float64)
        self.calls = []

    def random(self, size=None):
        self.calls.append(size)
        return self.u.copy()


# ---------------------------------------------------------------- 1. tokens per verify


def test_expected_tokens_pinned_numbers():
    # alpha = 0.7, k = 5: 1 + .7 + .49 + .343 + .2401 + .16807 = 2.94117
    # (the off-by-one (1 - a**k) / (1 - a) gives 2.7731; counting every pass, 1 + k*a, gives 4.5)
    assert impl.expected_tokens_per_verify(0.7, 5) == pytest.approx(2.94117, abs=1e-12)
    # alpha = 0.75: 0.75**6 = 729/4096, so E = (1 - 729/4096) / (1/4) = 3367/1024, exactly
    assert impl.expected_tokens_per_verify(0.75, 5) == pytest.approx(3367 / 1024, abs=1e-12)
    # a weak drafter: alpha = 0.2 -> 1 + .2 + .04 + .008 + .0016 + .00032 = 1.24992
    assert impl.expected_tokens_per_verify(0.2, 5) == pytest.approx(1.24992, abs=1e-12)
    assert isinstance(impl.expected_tokens_per_verify(0.7, 5), float)


def test_expected_tokens_edges_and_ceiling():
    for k in (0, 1, 5, 20):
        # alpha = 0: every first draft fails; the target's own token still comes out
        assert impl.expected_tokens_per_verify(0.0, k) == 1.0
        # alpha = 1: the closed form is 0/0; the series is k + 1, exactly
        assert impl.expected_tokens_per_verify(1.0, k) == float(k + 1)
    # k = 0 is plain decoding whatever the drafter
    assert impl.expected_tokens_per_verify(0.9, 0) == 1.0
    # just below 1 the closed form must still be close to k + 1 (continuity at alpha = 1)
    assert impl.expected_tokens_per_verify(1 - 1e-9, 5) == pytest.approx(6.0, rel=1e-6)
    # the ceiling 1 / (1 - alpha): 3.333... at 0.7, never reached, approached as k grows
    e = [impl.expected_tokens_per_verify(0.7, k) for k in range(0, 80)]
    assert all(x < 1 / 0.3 for x in e)
    assert e[79] == pytest.approx(1 / 0.3, abs=1e-10)
    assert all(b > a for a, b in zip(e, e[1:]))


def test_diminishing_returns_in_k():
    # the (k+1)-th draft adds alpha**(k+1) tokens: each extra draft is worth alpha times the last
    for alpha in (0.5, 0.7, 0.9):
        e = np.array([impl.expected_tokens_per_verify(alpha, k) for k in range(12)])
        gains = np.diff(e)
        np.testing.assert_allclose(gains, alpha ** np.arange(1, 12), rtol=1e-9)
        np.testing.assert_allclose(gains[1:] / gains[:-1], alpha, rtol=1e-9)


def test_per_position_acceptance_is_alpha_to_the_i_plus_one():
    rates = impl.per_position_acceptance(0.7, 3)
    assert isinstance(rates, np.ndarray) and rates.dtype == np.float64 and rates.shape == (3,)
    # position 0 needs one pass (0.7), position 1 two (0.49), position 2 three (0.343);
    # starting the powers at 0 would claim position 0 is always accepted
    np.testing.assert_allclose(rates, [0.7, 0.49, 0.343], rtol=1e-12)
    assert impl.per_position_acceptance(0.7, 0).shape == (0,)
    # one plus the sum of the rates is the mean tokens per verify
    for alpha, k in ((0.7, 5), (0.9, 13), (0.2, 1), (1.0, 4)):
        assert 1 + impl.per_position_acceptance(alpha, k).sum() == pytest.approx(
            impl.expected_tokens_per_verify(alpha, k), rel=1e-12)


# ---------------------------------------------------------------- 2. the simulation


def test_simulation_keeps_the_leading_run_by_hand():
    u = [
        [0.1, 0.2, 0.9, 0.1, 0.1],    # pass, pass, fail: 2 (counting every pass gives 4)
        [0.6, 0.1, 0.1, 0.1, 0.1],    # the first fails: 0, whatever follows
        [0.0, 0.1, 0.2, 0.3, 0.4],    # all pass: 5
        [0.5, 0.1, 0.1, 0.1, 0.1],    # u == alpha is a failure (accept when u < alpha): 0
        [0.49, 0.49, 0.49, 0.49, 0.5],  # only the last fails: 4
    ]
    rng = FixedUniforms(u)
    out = impl.simulate_accepted(0.5, 5, 5, rng)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (5,)
    assert out.tolist() == [2, 0, 5, 0, 4]
    # one draw of the whole matrix, (n_cycles, k)
    assert len(rng.calls) == 1 and tuple(np.atleast_1d(rng.calls[0])) == (5, 5)


def test_simulation_edges():
    rng = np.random.default_rng(3)
    assert impl.simulate_accepted(0.0, 5, 1000, rng).tolist() == [0] * 1000
    assert impl.simulate_accepted(1.0, 5, 1000, rng).tolist() == [5] * 1000
    assert impl.simulate_accepted(0.7, 0, 10, rng).tolist() == [0] * 10
    # a single cycle is a valid request
    one = impl.simulate_accepted(1.0, 3, 1, rng)
    assert one.shape == (1,) and one.tolist() == [3]


def test_simulation_uses_the_given_generator():
    a = impl.simulate_accepted(0.7, 5, 50_000, np.random.default_rng(11))
    b = impl.simulate_accepted(0.7, 5, 50_000, np.random.default_rng(11))
    c = impl.simulate_accepted(0.7, 5, 50_000, np.random.default_rng(12))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("alpha,k,seed", [(0.7, 5, 0), (0.9, 13, 1), (0.2, 5, 2)])
def test_simulation_mean_within_one_percent_of_the_model(alpha, k, seed):
    # 200,000 cycles. At alpha = 0.7, k = 5 the kept count has variance 3.31, so the mean
    # tokens per verify has standard error sqrt(3.31 / 2e5) = 0.0041, 0.14% of 2.94: the 1%
    # bound is 7 standard errors wide (0.9/13: sd 4.8, se 0.14%; 0.2/5: se 0.10%)
    n = 200_000
    model = impl.expected_tokens_per_verify(alpha, k)

    def rel_err(accepted):
        return abs(1 + accepted.mean() - model) / model

    assert rel_err(impl.simulate_accepted(alpha, k, n, np.random.default_rng(seed))) < 0.01
    if alpha == 0.7:
        # negative controls, drawn from the same seed: a drafter at 0.69 (E = 2.878, 2.2% low)
        # and counting every pass, not the leading run (E = 1 + 5 * 0.7 = 4.5)
        u = np.random.default_rng(seed).random((n, k))
        assert rel_err(np.cumprod(u < 0.69, axis=1).sum(axis=1)) > 0.01
        assert rel_err((u < alpha).sum(axis=1)) > 0.01


def test_simulation_histogram_matches_the_model_chi_square():
    # Pearson's chi-square over the 6 outcomes (0..5 drafts kept) has 5 degrees of freedom;
    # its critical value for p = 1e-6 is 35.89 (upper tail, computed with mpmath's
    # regularized incomplete gamma; a table gives 35.9). A correct simulator fails this
    # once in a million seeds.
    alpha, k, n = 0.7, 5, 200_000
    crit = 35.89
    assert chi_square(impl.simulate_accepted(alpha, k, n, np.random.default_rng(7)), alpha, k) < crit
    # negative controls on the same uniforms: a 0.69 drafter has expected statistic
    # 5 + 254 (noncentrality), counting every pass about 400,000
    u = np.random.default_rng(7).random((n, k))
    assert chi_square(np.cumprod(u < 0.69, axis=1).sum(axis=1), alpha, k) > crit
    assert chi_square((u < alpha).sum(axis=1), alpha, k) > crit


# ---------------------------------------------------------------- 3. speedup


def test_speedup_pinned_numbers():
    # 2.94117 tokens for 5 * 0.05 + 1 = 1.25 target steps: 2.352936x
    assert impl.speedup(0.7, 0.05, 5) == pytest.approx(2.352936, abs=1e-9)
    # 3367/1024 / 1.25 = 2.63046875 exactly
    assert impl.speedup(0.75, 0.05, 5) == pytest.approx(2.63046875, abs=1e-12)
    # forgetting the verify's own cost (E / (k c)) gives 11.76; charging k + 1 drafts, 2.26
    assert isinstance(impl.speedup(0.7, 0.05, 5), float)


def test_speedup_at_k_zero_is_one_and_a_free_drafter_never_loses():
    for alpha in (0.0, 0.3, 0.7, 1.0):
        for c in (0.0, 0.05, 2.0):
            assert impl.speedup(alpha, c, 0) == 1.0
        # c = 0 (n-gram lookup, in this model): speedup equals E, which is >= 1
        for k in (1, 3, 8):
            assert impl.speedup(alpha, 0.0, k) == impl.expected_tokens_per_verify(alpha, k) >= 1.0
    # ...and is capped by 1 / (1 - alpha) however long the drafts: 3.33x at 0.7
    assert impl.speedup(0.7, 0.0, 200) == pytest.approx(10 / 3, abs=1e-9)


def test_spec_decode_can_lose():
    # alpha = 0.2, c = 0.5, k = 5: 1.24992 tokens for 3.5 steps = 0.35712x, a 2.8x slowdown
    assert impl.speedup(0.2, 0.5, 5) == pytest.approx(0.35712, abs=1e-12)
    assert all(impl.speedup(0.2, 0.5, k) < 1 for k in range(1, 33))
    assert impl.optimal_k(0.2, 0.5) == 0
    # a drafter as expensive as the target never helps, even when it is never wrong:
    # (k + 1) / (k + 1) = 1 for every k, a tie that goes to k = 0
    assert impl.optimal_k(1.0, 1.0) == 0


# ---------------------------------------------------------------- 4. choosing k


def test_optimal_k_pinned_where_the_maximum_is_clear():
    # alpha = 0.5, c = 0.05: k = 2, 3, 4 give 1.5909, 1.6304, 1.6146
    assert impl.optimal_k(0.5, 0.05) == 3
    assert impl.speedup(0.5, 0.05, 3) == pytest.approx(1.875 / 1.15, abs=1e-12)  # 1.6304
    # alpha = 0.9, c = 0.05: k = 12, 13, 14 give 4.6613, 4.6741, 4.6712
    k = impl.optimal_k(0.9, 0.05)
    assert isinstance(k, int) and k == 13
    assert impl.speedup(0.9, 0.05, 13) == pytest.approx(4.674134, abs=1e-6)
    # alpha = 0.6, c = 0.1: k = 2, 3, 4 give 1.6333, 1.6738, 1.6469
    assert impl.optimal_k(0.6, 0.1) == 3


def test_optimal_k_near_tie_is_not_pinned_but_is_a_maximum():
    # alpha = 0.7, c = 0.05: k = 5 gives 2.352936, k = 6 gives 2.352938. Which one "wins"
    # is a 1e-6 accident of the numbers, so only the property is asserted
    k = impl.optimal_k(0.7, 0.05)
    assert k in (5, 6)
    best = impl.speedup(0.7, 0.05, k)
    assert all(best >= impl.speedup(0.7, 0.05, j) for j in range(0, 33))


def test_optimal_k_range_and_ties():
    # alpha = 1, c = 0: speedup k + 1 grows without end, so the search stops at k_max itself
    assert impl.optimal_k(1.0, 0.0, k_max=7) == 7
    assert impl.optimal_k(0.9, 0.05, k_max=0) == 0
    # the default range reaches 32: alpha = 0.99, c = 0.01 is still climbing at k = 32
    assert impl.optimal_k(0.99, 0.01) == 32
    # tie at every k (alpha = 1, c = 1): the smallest k
    assert impl.optimal_k(1.0, 1.0, k_max=10) == 0


def test_optimal_k_grows_with_alpha_and_shrinks_with_cost():
    ks = [impl.optimal_k(a, 0.05) for a in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks) and ks[0] < ks[-1]
    ks = [impl.optimal_k(0.8, c) for c in (0.01, 0.05, 0.1, 0.2, 0.4, 1.0)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1] == 0


# ---------------------------------------------------------------- 5. latency


def test_predicted_itl():
    # 20 ms per token without speculation; a step now costs 20 * 1.25 = 25 ms and yields
    # 2.94117 tokens: 8.50 ms per token
    assert impl.predicted_itl_ms(20.0, 0.7, 0.05, 5) == pytest.approx(25 / 2.94117, abs=1e-9)
    assert impl.predicted_itl_ms(20.0, 0.7, 0.05, 0) == 20.0
    # the losing regime: 20 / 0.35712 = 56.0 ms, slower than no speculation
    assert impl.predicted_itl_ms(20.0, 0.2, 0.5, 5) == pytest.approx(20 / 0.35712, abs=1e-9)


# ---------------------------------------------------------------- 6. bad input


def test_bad_inputs_name_the_parameter():
    rng = np.random.default_rng(0)
    for bad in (1.5, -0.1, float("nan"), True, "0.7"):
        with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
            impl.expected_tokens_per_verify(bad, 5)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        impl.per_position_acceptance(1.01, 3)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        impl.simulate_accepted(-1, 3, 10, rng)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        impl.speedup(2.0, 0.05, 5)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"k must be an integer >= 0"):
            impl.expected_tokens_per_verify(0.7, bad)
    with pytest.raises(ValueError, match=r"k must be an integer >= 0"):
        impl.per_position_acceptance(0.7, -2)
    with pytest.raises(ValueError, match=r"k must be an integer >= 0"):
        impl.simulate_accepted(0.7, -1, 10, rng)
    with pytest.raises(ValueError, match=r"n_cycles must be an integer >= 1"):
        impl.simulate_accepted(0.7, 5, 0, rng)
    for bad in (-0.01, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"c must be a finite number >= 0"):
            impl.speedup(0.7, bad, 5)
        with pytest.raises(ValueError, match=r"c must be a finite number >= 0"):
            impl.optimal_k(0.7, bad)
    with pytest.raises(ValueError, match=r"k_max must be an integer >= 0"):
        impl.optimal_k(0.7, 0.05, k_max=-1)
    for bad in (0.0, -5.0, float("inf")):
        with pytest.raises(ValueError, match=r"baseline_itl_ms must be a finite number > 0"):
            impl.predicted_itl_ms(bad, 0.7, 0.05, 5)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        impl.predicted_itl_ms(20.0, 1.2, 0.05, 5)


# ---------------------------------------------------------------- 7. vLLM's own arithmetic


def _upstream_metrics():
    """``SpecDecodingStats`` and ``SpecDecodingLogging`` from upstream's metrics.py.

    Extracted with ``ast`` (the module imports prometheus_client and vllm) and
    executed with numpy, ``time``, ``dataclass`` and a stand-in logger.
    """
    tree = ast.parse(METRICS.read_text())
    wanted = {"SpecDecodingStats", "SpecDecodingLogging"}
    defs = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in wanted]
    assert {d.name for d in defs} == wanted
    logger = type("Logger", (), {"info": staticmethod(lambda *a: None)})()
    ns = {"__name__": "upstream_spec_metrics", "np": np, "time": time,
          "dataclass": dataclass, "field": field, "logger": logger}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(METRICS), "exec", dont_inherit=True), ns)
    return ns["SpecDecodingStats"], ns["SpecDecodingLogging"]


@pytest.mark.upstream
def test_vllms_logged_metrics_are_this_model():
    Stats, Logging = _upstream_metrics()
    alpha, k, n = 0.7, 5, 20_000
    accepted = impl.simulate_accepted(alpha, k, n, np.random.default_rng(21))
    # what the scheduler does after each verify of one request (scheduler.py, num_accepted)
    stats = Stats.new(num_spec_tokens=k)
    for a in accepted.tolist():
        stats.observe_draft(num_draft_tokens=k, num_accepted_tokens=a)
    logging = Logging()
    logging.observe(stats)
    captured = []
    logging.log(log_fn=lambda fmt, *args: captured.append((fmt, args)))
    fmt, args = captured[0]
    assert "Mean acceptance length" in fmt
    mean_len, rates_str, avg_rate_pct = args[0], args[5], args[6]
    # vLLM's mean acceptance length counts the bonus token: it is 1 + mean kept, exactly
    assert mean_len == pytest.approx(1 + accepted.mean(), abs=1e-12)
    # and it estimates E: 20,000 cycles, sd 1.82, se 0.013; 0.08 is 6 standard errors
    assert abs(mean_len - impl.expected_tokens_per_verify(alpha, k)) < 0.08
    # per-position rates estimate alpha**(i + 1): se <= sqrt(0.25 / 2e4) = 0.0035, plus
    # 0.0005 of rounding to 3 decimals; 0.02 is > 5 standard errors
    rates = np.array([float(x) for x in rates_str.split(", ")])
    np.testing.assert_allclose(rates, impl.per_position_acceptance(alpha, k), atol=0.02)
    # "Avg Draft acceptance rate" is accepted / drafted = (E - 1) / k = 38.8% here, not alpha:
    # a 70% drafter at k = 5 reports under 40%
    assert avg_rate_pct == pytest.approx(100 * (mean_len - 1) / k, abs=1e-9)
    assert abs(avg_rate_pct - 100 * (impl.expected_tokens_per_verify(alpha, k) - 1) / k) < 1.6
    assert avg_rate_pct < 45


@pytest.mark.upstream
def test_vllms_synthetic_rates_convert_back_to_alpha():
    # vLLM's synthetic rejection mode takes per-position *unconditional* rates and turns
    # them into the per-position conditional rates its kernel tests u against; for this
    # model's rates the conditional rate is alpha at every position
    tree = ast.parse(SPEC_UTILS.read_text())
    fn = [n for n in tree.body
          if isinstance(n, ast.FunctionDef) and n.name == "unconditional_to_conditional_rates"]
    assert len(fn) == 1
    ns: dict = {}
    exec(compile(ast.Module(body=fn, type_ignores=[]), str(SPEC_UTILS), "exec", dont_inherit=True), ns)
    convert = ns["unconditional_to_conditional_rates"]
    for alpha, k in ((0.7, 5), (0.9, 13), (0.35, 3)):
        conditional = convert(impl.per_position_acceptance(alpha, k).tolist())
        np.testing.assert_allclose(conditional, [alpha] * k, rtol=1e-12)
    # the mean acceptance length a synthetic run at these rates would log
    assert 1 + sum(impl.per_position_acceptance(0.7, 5)) == pytest.approx(2.94117, abs=1e-12)
