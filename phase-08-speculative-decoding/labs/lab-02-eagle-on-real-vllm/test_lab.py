"""Lab 08-02 tests: vLLM's SpecDecoding line parsed, L turned into alpha, lines reconciled."""
from __future__ import annotations

import ast
import math
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

METRICS = course.UPSTREAM / "vllm/v1/spec_decode/metrics.py"

# Test-side copy of the format vLLM 0.22.1 logs; test_format_is_upstreams checks it
# against upstream/ (when present), so the tests below render real lines without it.
FORMAT = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
          "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d "
          "tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%")


def counters_line(accepted_per_draft, draft_lens, k, seconds=4.0, fmt=FORMAT):
    """Test-side: the line vLLM logs after these verifies, computed as upstream does.

    accepted_per_draft[j]: drafts kept by verify j; draft_lens[j]: tokens it drafted.
    """
    acc = np.asarray(accepted_per_draft)
    n, A, D = acc.size, int(acc.sum()), int(np.sum(draft_lens))
    per_pos = [(acc > i).sum() / n for i in range(k)]
    rates = ", ".join(f"{p:.3f}" for p in per_pos)
    rate = A / D * 100 if D else float("nan")
    return fmt % (1 + A / n, A / seconds, D / seconds, A, D, rates, rate)


def line(L, acc_tp, draft_tp, A, D, rates, pct):
    return FORMAT % (L, acc_tp, draft_tp, A, D, ", ".join(f"{r:.3f}" for r in rates), pct)


# ---------------------------------------------------------------- 1. parsing

PINNED = ("(EngineCore_DP0 pid=4121) INFO 06-02 14:03:11 [loggers.py:276] SpecDecoding metrics: "
          "Mean acceptance length: 2.94, Accepted throughput: 96.90 tokens/s, Drafted "
          "throughput: 249.50 tokens/s, Accepted: 1938 tokens, Drafted: 4990 tokens, "
          "Per-position acceptance rate: 0.702, 0.487, 0.339, 0.238, 0.176, Avg Draft "
          "acceptance rate: 38.8%")


def test_parse_a_logged_line_field_by_field():
    m = impl.parse_metrics_line(PINNED)
    assert isinstance(m, impl.SpecDecodingMetrics)
    assert m.mean_acceptance_length == 2.94
    assert (m.accepted_throughput, m.drafted_throughput) == (96.90, 249.50)
    assert (m.accepted, m.drafted) == (1938, 4990)
    assert type(m.accepted) is int and type(m.drafted) is int
    # the rates are joined with ", " like the fields: five floats, not one string or two
    assert m.per_position == (0.702, 0.487, 0.339, 0.238, 0.176)
    assert m.k == 5
    # the number before "%", as a percentage
    assert m.draft_acceptance_rate_pct == 38.8


def test_parse_one_position_nan_and_big_numbers():
    text = FORMAT % (1.0, 0.0, 0.0, 0, 0, "0.000", float("nan"))
    m = impl.parse_metrics_line(text)
    assert m.per_position == (0.0,) and (m.accepted, m.drafted) == (0, 0)
    assert math.isnan(m.draft_acceptance_rate_pct)
    text = FORMAT % (6.0, 123456.78, 123456.78, 10_000_000, 10_000_000,
                     ", ".join(["1.000"] * 5), 100.0)
    m = impl.parse_metrics_line(text)
    assert m.accepted_throughput == 123456.78 and m.drafted == 10_000_000
    assert m.mean_acceptance_length == 6.0 and m.draft_acceptance_rate_pct == 100.0


def test_parse_rejects_what_is_not_a_metrics_line():
    for bad in ("Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 80.1 tokens/s",
                PINNED[: PINNED.index(", Avg Draft")],       # cut before the last field
                PINNED.replace("38.8%", "38.8"),            # not upstream's: no percent sign
                PINNED.replace("Drafted: 4990", "Drafted: x")):
        with pytest.raises(ValueError, match=r"line"):
            impl.parse_metrics_line(bad)
    with pytest.raises(ValueError, match=r"line must be a str"):
        impl.parse_metrics_line(b"SpecDecoding metrics: ")


def test_find_every_metrics_line_in_a_log():
    log = "\n".join([
        "INFO 06-02 14:03:01 [loggers.py:257] Engine 000: Avg prompt throughput: 310.2 tokens/s",
        counters_line([5, 5, 0], [5, 5, 5], 5),
        "WARNING something else, with: colons, and commas 12.5%",
        PINNED[: PINNED.index(", Per-position")],           # cut off: skipped
        PINNED,
    ])
    found = impl.find_metrics_lines(log)
    assert [m.accepted for m in found] == [10, 1938]
    # 10 of 15 drafted; 1 + 10 / 3 drafts
    assert found[0].draft_acceptance_rate_pct == 66.7 and found[0].mean_acceptance_length == 4.33
    assert found[0].per_position == (0.667,) * 5
    assert impl.find_metrics_lines("no metrics here\n") == []
    with pytest.raises(ValueError, match=r"log_text must be a str"):
        impl.find_metrics_lines(None)


# ---------------------------------------------------------------- 2. L, rate, alpha


def test_draft_acceptance_rate_takes_the_bonus_token_off():
    # the seed's pair: L = 2.8 at k = 5 means 36%, and 56% means L = 3.8
    assert impl.draft_acceptance_rate(2.8, 5) == pytest.approx(0.36, abs=1e-12)
    assert impl.draft_acceptance_rate(3.8, 5) == pytest.approx(0.56, abs=1e-12)
    # 2.8 / 5 = 0.56 is what forgetting the bonus token gives; (L - 1)/(k + 1) = 0.30
    assert impl.draft_acceptance_rate(1.0, 5) == 0.0
    assert impl.draft_acceptance_rate(6.0, 5) == 1.0
    assert impl.draft_acceptance_rate(1.5, 1) == 0.5


def test_alpha_from_mean_acceptance_length_pins():
    a = impl.alpha_from_mean_acceptance_length(2.8, 5)
    # 1 + a + ... + a^5 = 2.8 at a = 0.677349 (the other "root" of the product form is 1)
    assert a == pytest.approx(0.6773490, abs=1e-6)
    assert impl.alpha_from_mean_acceptance_length(3.8, 5) == pytest.approx(0.8126196, abs=1e-6)
    # lab 04's pinned E: alpha 0.7, k 5 -> 2.94117...
    assert impl.alpha_from_mean_acceptance_length(1 + 0.7 + 0.49 + 0.343 + 0.2401 + 0.16807,
                                                  5) == pytest.approx(0.7, abs=1e-9)
    # k = 1: L = 1 + a
    assert impl.alpha_from_mean_acceptance_length(1.25, 1) == pytest.approx(0.25, abs=1e-9)
    # the ends, exactly
    assert impl.alpha_from_mean_acceptance_length(1.0, 5) == 0.0
    assert impl.alpha_from_mean_acceptance_length(6.0, 5) == 1.0
    assert impl.alpha_from_mean_acceptance_length(6, 5) == 1.0


def test_alpha_round_trips_through_the_model():
    for k in (1, 2, 5, 8):
        for L in np.linspace(1.0, k + 1.0, 23)[1:-1]:
            a = impl.alpha_from_mean_acceptance_length(float(L), k)
            assert 0.0 < a < 1.0
            assert impl.expected_tokens_per_verify(a, k) == pytest.approx(L, abs=1e-9)
    # the default tolerance is tight; a looser one is honoured
    coarse = impl.alpha_from_mean_acceptance_length(2.8, 5, tol=1e-3)
    assert abs(coarse - 0.6773490) <= 1e-3


def test_length_and_k_are_checked():
    for fn in (impl.draft_acceptance_rate, impl.alpha_from_mean_acceptance_length):
        for bad in (0.99, 6.01, float("nan"), float("inf"), True, "2.8"):
            with pytest.raises(ValueError, match=r"mean_acceptance_length must be a number in "
                                                 r"\[1, k \+ 1\] = \[1, 6\]"):
                fn(bad, 5)
        for bad in (0, -1, 2.0, True):
            with pytest.raises(ValueError, match=r"k must be an integer >= 1"):
                fn(1.5, bad)
    with pytest.raises(ValueError, match=r"tol must be a finite number > 0"):
        impl.alpha_from_mean_acceptance_length(2.8, 5, tol=0.0)


def test_conditional_rates_divide_by_the_position_before():
    np.testing.assert_allclose(impl.conditional_acceptance_rates([0.7, 0.49, 0.343]),
                               [0.7, 0.7, 0.7], rtol=1e-12)
    # the pinned line's rates: the drafter gets worse with depth (0.702 then ~0.69, 0.70, 0.74)
    np.testing.assert_allclose(impl.conditional_acceptance_rates([0.702, 0.487, 0.339]),
                               [0.702, 0.487 / 0.702, 0.339 / 0.487], rtol=1e-12)
    assert impl.conditional_acceptance_rates([0.5, 0.0, 0.0]) == [0.5, 0.0, 0.0]
    assert impl.conditional_acceptance_rates((1.0,)) == [1.0]
    for bad in ([], [0.5, 1.2], [-0.1], "0.5"):
        with pytest.raises(ValueError, match=r"per_position must be a non-empty sequence"):
            impl.conditional_acceptance_rates(bad)


# ---------------------------------------------------------------- 3. reconciliation


def test_pinned_and_simulated_lines_are_consistent():
    assert impl.reconcile_metrics(impl.parse_metrics_line(PINNED), full_drafts=True) == []
    # 300 short intervals (3 to 12 verifies) where rounding bites hardest; half of them with
    # n-gram-like short drafts, which must pass unless full drafts are claimed
    rng = np.random.default_rng(8)
    for trial in range(300):
        k = int(rng.integers(1, 8))
        n = int(rng.integers(3, 13))
        lens = rng.integers(1, k + 1, n) if trial % 2 else np.full(n, k)
        acc = np.array([rng.integers(0, ln + 1) for ln in lens])
        m = impl.parse_metrics_line(counters_line(acc, lens, k, seconds=float(rng.uniform(0.5, 9))))
        assert impl.reconcile_metrics(m) == [], (acc, lens, k)
        if not trial % 2:
            assert impl.reconcile_metrics(m, full_drafts=True) == [], (acc, lens, k)


def test_the_seed_pair_is_impossible_for_k_token_drafts():
    # 140 drafts, 252 accepted -> L = 2.80; 450 drafted -> 56.0%; rates sum to 1.8
    seed = impl.parse_metrics_line(line(2.8, 90.0, 160.71, 252, 450,
                                        [0.6, 0.45, 0.35, 0.25, 0.15], 56.0))
    # an n-gram drafter proposing 3.2 tokens per draft on average could log this...
    assert impl.reconcile_metrics(seed) == []
    # ...EAGLE at k = 5, which always drafts 5, cannot: it would log 36.0%
    assert impl.reconcile_metrics(seed, full_drafts=True) == ["full_drafts"]
    # L = 3.8 and 36% needs 7.8 drafted tokens per draft at k = 5: no drafter logs it
    flipped = impl.parse_metrics_line(line(3.8, 50.4, 140.0, 252, 700,
                                           [0.9, 0.75, 0.6, 0.45, 0.1], 36.0))
    assert impl.reconcile_metrics(flipped) == ["rate_vs_length"]


# A consistent base line: 100 drafts of 5 tokens, 180 kept, over 2 s.
BASE = dict(L=2.80, acc_tp=90.0, draft_tp=250.0, A=180, D=500,
            rates=[0.62, 0.45, 0.33, 0.24, 0.16], pct=36.0)


def check(**change):
    kw = dict(BASE, **change)
    return impl.reconcile_metrics(impl.parse_metrics_line(line(**kw)), full_drafts=True)


def test_each_check_fires_alone_just_outside_its_rounding():
    assert check() == []
    assert check(rates=[0.62, 1.0, 0.0, 0.0, 0.18]) == ["per_position_order"]
    # sum 1.80 +/- (0.005 + 5 * 0.0005): 1.807 passes, 1.808 does not
    assert check(rates=[0.627, 0.45, 0.33, 0.24, 0.16]) == []
    assert check(rates=[0.628, 0.45, 0.33, 0.24, 0.16]) == ["length_vs_per_position"]
    assert check(rates=[0.613, 0.45, 0.33, 0.24, 0.16]) == []
    assert check(rates=[0.612, 0.45, 0.33, 0.24, 0.16]) == ["length_vs_per_position"]
    # the rates are unconditional: 0.9 at every position sums to 4.5, so L = 4.69 (what
    # 0.9 + 0.81 + ... would give, reading them as conditional) does not fit them
    assert check(L=4.69, A=369, acc_tp=184.5, pct=73.8, rates=[0.9] * 5) == \
        ["length_vs_per_position"]
    # 180 / 500 = 36.0%; the logged % may be off by 0.05 of rounding and no more
    assert check(D=499, draft_tp=249.5, pct=36.1) == []     # 36.07 is printed 36.1
    assert check(D=499, draft_tp=249.5, pct=36.0) == ["rate_vs_counts"]
    assert "rate_vs_counts" in check(A=181, draft_tp=250.0, acc_tp=90.5)
    assert check(A=600, acc_tp=300.0) [:1] == ["rate_vs_counts"]
    # both throughputs divide by one elapsed time, so their ratio is 180 / 500 = 0.36 up to
    # the 0.005 of rounding on each: 90.00 / 250.01 fits, 90.01 / 250.00 (0.36004) does not
    assert check(draft_tp=250.01) == []
    assert check(acc_tp=90.01) == ["throughput_vs_counts"]
    # drafted 0 with a number for the rate
    m = impl.parse_metrics_line(FORMAT % (1.0, 0.0, 0.0, 0, 0, "0.000", 0.0))
    assert impl.reconcile_metrics(m) == ["rate_vs_counts"]
    m = impl.parse_metrics_line(FORMAT % (1.0, 0.0, 0.0, 0, 0, "0.000", float("nan")))
    assert impl.reconcile_metrics(m, full_drafts=True) == []


def test_rate_bounds_are_the_two_draft_lengths():
    # every draft 1 token long: R = L - 1 exactly (100 drafts, 37 kept)
    one = dict(L=1.37, acc_tp=37.0, draft_tp=100.0, A=37, D=100, rates=[0.37, 0, 0], pct=37.0)
    assert impl.reconcile_metrics(impl.parse_metrics_line(line(**one))) == []
    assert impl.reconcile_metrics(impl.parse_metrics_line(line(**one)),
                                  full_drafts=True) == ["full_drafts"]
    # a rate above L - 1 would need drafts shorter than one token
    hi = dict(one, A=38, D=95, acc_tp=38.0, draft_tp=95.0, pct=40.0)
    assert impl.reconcile_metrics(impl.parse_metrics_line(line(**hi))) == ["rate_vs_length"]
    # below (L - 1) / k no drafter fits: L = 2.80 needs at least 35.85% at k = 5
    assert check(A=179, acc_tp=89.5, pct=35.8) == ["rate_vs_length", "full_drafts"]
    # above it, only k-token drafts are ruled out: up to 36.15% (0.0005 + 0.005 / k)
    assert check(D=498, draft_tp=249.0, pct=36.1) == []
    assert check(D=497, draft_tp=248.5, pct=36.2) == ["full_drafts"]
    assert impl.reconcile_metrics(impl.parse_metrics_line(line(**dict(
        BASE, D=497, draft_tp=248.5, pct=36.2)))) == []


def test_checks_at_their_exact_margins():
    def rec(L, acc_tp, draft_tp, A, D, rates, pct, full=False):
        return impl.reconcile_metrics(impl.parse_metrics_line(
            line(L, acc_tp, draft_tp, A, D, rates, pct)), full_drafts=full)

    # k = 2: 1 + 0.6 + 0.406 - 2.00 = 0.006, exactly 0.005 + 2 * 0.0005: still consistent
    assert rec(2.0, 50.0, 100.0, 50, 100, [0.6, 0.406], 50.0) == []
    # k = 2, L = 1.80: the lowest rate any drafter fits is (0.795 / 2) - 0.0005 = 39.7%, and
    # |39.7% - 40%| is exactly full drafts' 0.0005 + 0.005 / 2
    assert rec(1.8, 39.7, 100.0, 397, 1000, [0.5, 0.3], 39.7, full=True) == []
    # one draft of one token, kept; 1,000 s of interval print both throughputs as 0.00
    assert rec(2.0, 0.0, 0.0, 1, 1, [1.0], 100.0) == []
    # the highest rate any drafter fits is L - 1 + 0.005 (+ 0.0005 of the rate's rounding)
    assert rec(1.37, 3.0, 8.0, 3, 8, [0.37], 37.5) == []
    # rates that only go up between neighbours
    assert rec(2.8, 90.0, 250.0, 180, 500, [0.5, 0.6, 0.4, 0.2, 0.1], 36.0) == \
        ["per_position_order"]
    # accepted above drafted cannot be (each kept token was drafted), whatever else fits
    assert rec(2.2, 60.0, 50.0, 120, 100, [0.6, 0.6], 120.0) == ["rate_vs_counts"]
    # tiny throughputs: 9 / 640 s prints 0.01, 10 / 640 s prints 0.02; the ratio 0.5 against
    # 9 / 10 is within 0.005 * 1.5 / 0.015 = 0.5 of rounding; 0.01 / 1.00 is not
    assert rec(1.9, 0.01, 0.02, 9, 10, [0.9], 90.0) == []
    assert rec(1.5, 1.0, 1.0, 1, 2, [0.5], 50.0) == ["throughput_vs_counts"]
    assert rec(2.0, 0.5, 1.0, 1, 1, [1.0], 100.0) == ["throughput_vs_counts"]
    # nothing drafted: no ratio to compare the throughputs with
    assert rec(1.0, 0.0, 5.0, 0, 0, [0.0], float("nan")) == []


def test_out_of_range_rates_and_bad_input():
    assert "per_position_range" in check(rates=[1.2, 0.3, 0.2, 0.1, 0.0])
    with pytest.raises(ValueError, match=r"metrics must be a SpecDecodingMetrics"):
        impl.reconcile_metrics(PINNED)


# ---------------------------------------------------------------- 4. ITL


def test_predicted_itl_from_a_measured_length():
    # 20 ms plain; k = 5 drafts at 5% of a step each: a step costs 1.25, emits 2.8 tokens
    assert impl.predicted_itl_ms(20.0, 2.8, 5, 0.05) == pytest.approx(20 * 1.25 / 2.8, rel=1e-12)
    # a free drafter (n-gram lookup): 20 / L
    assert impl.predicted_itl_ms(20.0, 3.8, 5, 0.0) == pytest.approx(20 / 3.8, rel=1e-12)
    # nothing accepted: speculation only costs
    assert impl.predicted_itl_ms(20.0, 1.0, 5, 0.05) == pytest.approx(25.0, rel=1e-12)
    # lab 04's pin: alpha 0.7, c 0.05, k 5 -> speedup 2.353, 8.50 ms from 20 ms
    E = impl.expected_tokens_per_verify(0.7, 5)
    assert impl.predicted_itl_ms(20.0, E, 5, 0.05) == pytest.approx(8.5, abs=5e-4)


def test_predicted_itl_checks_its_inputs():
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match=r"baseline_itl_ms must be a finite number > 0"):
            impl.predicted_itl_ms(bad, 2.8, 5, 0.05)
    with pytest.raises(ValueError, match=r"draft_cost must be a finite number >= 0"):
        impl.predicted_itl_ms(20.0, 2.8, 5, -0.1)
    with pytest.raises(ValueError, match=r"mean_acceptance_length must be a number"):
        impl.predicted_itl_ms(20.0, 6.5, 5, 0.05)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1"):
        impl.predicted_itl_ms(20.0, 1.5, 0, 0.05)


# ---------------------------------------------------------------- 5. upstream's own logger


def _upstream_log_call():
    """The ``log_fn(...)`` call of ``SpecDecodingLogging.log`` in upstream's metrics.py."""
    tree = ast.parse(METRICS.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "SpecDecodingLogging")
    log = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "log")
    calls = [n for n in ast.walk(log) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "log_fn"]
    assert len(calls) == 1
    return calls[0]


@pytest.mark.upstream
def test_format_is_upstreams():
    fmt = _upstream_log_call().args[0]
    # Python joins the adjacent string literals into one constant
    assert isinstance(fmt, ast.Constant) and fmt.value == FORMAT == impl.METRICS_FORMAT
    # a line rendered with upstream's very string parses back to what went in
    rendered = fmt.value % (3.14159, 12.345, 40.0, 1234, 3300, "0.812, 0.640, 0.401", 37.39)
    m = impl.parse_metrics_line(rendered)
    assert m == impl.SpecDecodingMetrics(3.14, 12.35, 40.0, 1234, 3300, (0.812, 0.64, 0.401), 37.4)


def _upstream_classes():
    """Upstream's SpecDecodingStats and SpecDecodingLogging, exec'd without vllm imports."""
    tree = ast.parse(METRICS.read_text())
    defs = [n for n in tree.body if isinstance(n, ast.ClassDef)
            and n.name in ("SpecDecodingStats", "SpecDecodingLogging")]
    logger = type("Logger", (), {"info": staticmethod(lambda *a: None)})()
    ns = {"__name__": "upstream_spec_metrics", "np": np, "time": time, "dataclass": dataclass,
          "field": field, "logger": logger}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(METRICS), "exec", dont_inherit=True), ns)
    return ns["SpecDecodingStats"], ns["SpecDecodingLogging"]


@pytest.mark.upstream
def test_upstreams_logger_output_parses_and_reconciles():
    Stats, Logging = _upstream_classes()
    rng = np.random.default_rng(2)
    k, alpha = 5, 0.7
    for short_drafts in (False, True):
        stats = Stats.new(num_spec_tokens=k)
        for _ in range(4000):
            n = int(rng.integers(1, k + 1)) if short_drafts else k
            kept = int(np.cumprod(rng.random(n) < alpha).sum())
            # what the scheduler does after each verify (scheduler.py: num_accepted)
            stats.observe_draft(num_draft_tokens=n, num_accepted_tokens=kept)
        logging = Logging()
        logging.observe(stats)
        out: list[str] = []
        logging.log(log_fn=lambda fmt, *args, out=out: out.append(fmt % args))  # as logging does
        m = impl.parse_metrics_line("INFO [loggers.py:276] " + out[0])
        assert (m.accepted, m.drafted) == (stats.num_accepted_tokens, stats.num_draft_tokens)
        assert m.mean_acceptance_length == round(1 + stats.num_accepted_tokens / 4000, 2)
        assert impl.reconcile_metrics(m) == []
        assert impl.reconcile_metrics(m, full_drafts=True) == (["full_drafts"] if short_drafts
                                                               else [])
        if not short_drafts:
            # 4,000 verifies: L has se 0.029, so alpha comes back within 0.02 (~4 se)
            a = impl.alpha_from_mean_acceptance_length(m.mean_acceptance_length, k)
            assert abs(a - alpha) < 0.02
            np.testing.assert_allclose(impl.conditional_acceptance_rates(m.per_position),
                                       [alpha] * k, atol=0.06)
