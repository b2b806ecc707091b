"""Lab 08-03 tests: the rejection test, its residual, the exponential race, and exactness by chi-square.

Every statistical test uses a fixed seed, so each one gives the same verdict on every run;
the thresholds are set so that a correct sampler would fail them with probability below
1e-6 even under a fresh seed, while every wrong sampler the lab lists misses them by a
factor of 10 or more.
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

REJECTION = course.UPSTREAM / "vllm/v1/sample/rejection_sampler.py"

P = np.array([0.5, 0.3, 0.2])  # the target used throughout
Q_UNIFORM = np.full(3, 1 / 3)  # a drafter that knows nothing: overlap 1/3 + 0.3 + 0.2 = 5/6
Q_PAIR = np.array([0.2, 0.3, 0.5])  # overlap min(.5,.2) + min(.3,.3) + min(.2,.5) = 0.70
N = 200_000


# ---------------------------------------------------------------- statistics helpers


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a chi-square variable with integer ``df``, by the closed forms.

    Even df = 2m: exp(-x/2) * sum_{i<m} (x/2)^i / i!. Odd df: erfc(sqrt(x/2)) plus
    exp(-x/2) * sum_{i=1}^{(df-1)/2} (x/2)^(i-1/2) / Gamma(i + 1/2). (scipy is not needed.)
    """
    h = x / 2
    if df % 2 == 0:
        return math.exp(-h) * sum(h**i / math.factorial(i) for i in range(df // 2))
    tail = sum(h ** (i - 0.5) / math.gamma(i + 0.5) for i in range(1, (df - 1) // 2 + 1))
    return math.erfc(math.sqrt(h)) + math.exp(-h) * tail


def chi2_critical(df: int, alpha: float = 1e-6) -> float:
    """The x with chi2_sf(x, df) == alpha, by bisection (sf is decreasing in x)."""
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return lo


# Critical values at p = 1e-6 (cross-checked with torch.special.gammaincc when this lab was
# written): df 1 -> 23.93, df 2 -> 2 ln(1e6) = 27.63, df 4 -> 33.38, df 7 -> 40.52.
assert abs(chi2_critical(2) - 2 * math.log(1e6)) < 1e-6
assert abs(chi2_critical(1) - 23.928) < 0.01 and abs(chi2_critical(7) - 40.522) < 0.01


def chi2_stat(tokens, probs) -> tuple[float, int]:
    """Pearson's statistic of the token histogram against ``probs``, and its degrees of freedom.

    A token with probability 0 that appears even once makes the statistic infinite: such a
    sampler is wrong, not unlucky. The df is (number of possible tokens) - 1.
    """
    tokens = np.asarray(tokens)
    probs = np.asarray(probs, dtype=np.float64)
    counts = np.bincount(tokens, minlength=probs.size)
    assert counts.size == probs.size, "a token id outside the vocabulary"
    support = probs > 0
    if counts[~support].any():
        return math.inf, int(support.sum()) - 1
    expected = tokens.size * probs[support]
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def assert_distributed_as(tokens, probs, label=""):
    """Pass when the tokens' histogram is consistent with ``probs`` at p = 1e-6."""
    stat, df = chi2_stat(tokens, probs)
    if df == 0:  # one possible token: every draw must be it
        assert stat == 0.0, f"{label}: a token of probability 0 was drawn"
        return stat
    crit = chi2_critical(df)
    assert stat < crit, f"{label}: chi-square {stat:.1f} >= critical {crit:.1f} (df {df})"
    return stat


def assert_rate(flags, rate, label=""):
    """A Bernoulli frequency within 6 binomial standard deviations (two-sided p < 2e-9)."""
    flags = np.asarray(flags)
    sd = math.sqrt(rate * (1 - rate) / flags.size)
    assert abs(flags.mean() - rate) <= 6 * sd, f"{label}: {flags.mean():.5f} vs {rate:.5f}"


def frequencies(tokens, vocab):
    return np.bincount(np.asarray(tokens), minlength=vocab) / np.asarray(tokens).size


# ---------------------------------------------------------------- the formulas by hand


def test_accept_prob_two_regimes_by_hand():
    # x = 0: p = 0.5 > q = 0.2, the drafter under-serves it: always keep (not 2.5, the raw ratio)
    assert impl.accept_prob(P, Q_PAIR, 0) == 1.0
    # x = 1: p == q, keep
    assert impl.accept_prob(P, Q_PAIR, 1) == 1.0
    # x = 2: p = 0.2 < q = 0.5: keep 40% of the time (q / p = 2.5 clamps to 1; p alone = 0.2)
    assert impl.accept_prob(P, Q_PAIR, 2) == pytest.approx(0.4, abs=1e-15)
    assert isinstance(impl.accept_prob(P, Q_PAIR, 2), float)
    # the uniform drafter: x = 0 is kept always, x = 1 at 0.9, x = 2 at 0.6
    got = [impl.accept_prob(P, Q_UNIFORM, x) for x in range(3)]
    np.testing.assert_allclose(got, [1.0, 0.9, 0.6], atol=1e-12)


def test_accept_prob_of_an_impossible_draft_is_zero():
    # q[2] == 0: a draft q cannot produce. vLLM's kernel rejects it (draft_prob > 0 fails);
    # so must you, with no division by zero (which numpy would turn into inf -> min(1, inf) = 1)
    with np.errstate(all="raise"):
        assert impl.accept_prob(P, [0.5, 0.5, 0.0], 2) == 0.0
    # and a target with p[x] == 0 never keeps x
    assert impl.accept_prob([0.0, 0.5, 0.5], Q_UNIFORM, 0) == 0.0


def test_accept_prob_for_a_one_hot_draft_is_p_of_the_draft():
    # vLLM's no-draft-probs path: q = e_x, so min(1, p[x] / 1) = p[x]
    for x in range(3):
        assert impl.accept_prob(P, impl.one_hot(x, 3), x) == pytest.approx(P[x], abs=1e-15)


def test_residual_is_the_normalized_shortfall_by_hand():
    p = [0.4, 0.3, 0.2, 0.1]
    q = [0.1, 0.2, 0.3, 0.4]
    # max(0, p - q) = [0.3, 0.1, 0, 0], sum 0.4 -> [0.75, 0.25, 0, 0].
    # Unnormalized: [0.3, 0.1, 0, 0]; |p - q| / 0.8: [0.375, 0.125, 0.125, 0.375]; q - p: [0, 0, .25, .75]
    r = impl.residual_distribution(p, q)
    assert r.dtype == np.float64 and r.shape == (4,)
    np.testing.assert_allclose(r, [0.75, 0.25, 0.0, 0.0], atol=1e-12)
    assert (r >= 0).all()
    # the seed pair: the only shortfall is token 0
    np.testing.assert_allclose(impl.residual_distribution(P, Q_PAIR), [1.0, 0.0, 0.0], atol=1e-12)
    # uniform drafter: shortfall [1/6, 0, 0] -> all mass on token 0 (0.3 - 1/3 < 0 is clipped)
    np.testing.assert_allclose(impl.residual_distribution(P, Q_UNIFORM), [1.0, 0.0, 0.0], atol=1e-12)


def test_residual_against_a_one_hot_draft_is_p_without_the_draft():
    # max(0, p - e_1) = [0.5, 0, 0.2] -> [5/7, 0, 2/7]: the recovery of vLLM's n-gram path
    np.testing.assert_allclose(
        impl.residual_distribution(P, impl.one_hot(1, 3)), [5 / 7, 0.0, 2 / 7], atol=1e-12
    )
    p = np.array([0.1, 0.6, 0.2, 0.1])
    np.testing.assert_allclose(
        impl.residual_distribution(p, impl.one_hot(1, 4)), [0.25, 0.0, 0.5, 0.25], atol=1e-12
    )


def test_residual_of_identical_distributions_is_defined():
    # p == q: nothing to recover (0 / 0); the contract returns a copy of p, never NaN
    p = np.array([0.25, 0.25, 0.5])
    r = impl.residual_distribution(p, p.copy())
    np.testing.assert_array_equal(r, p)
    r[0] = 9.0
    assert p[0] == 0.25  # a copy, not p itself


def test_expected_acceptance_rate_is_the_overlap():
    assert impl.expected_acceptance_rate(P, Q_PAIR) == pytest.approx(0.70, abs=1e-12)
    assert impl.expected_acceptance_rate(P, Q_UNIFORM) == pytest.approx(5 / 6, abs=1e-12)
    assert impl.expected_acceptance_rate(P, P) == pytest.approx(1.0, abs=1e-12)
    assert impl.expected_acceptance_rate([0.6, 0.4, 0, 0], [0, 0, 0.5, 0.5]) == 0.0
    # sum(p * q) would give 0.29; the mean of min(1, p / q) over tokens 0.8; 1 - sum(max(0, p-q)) is it
    assert isinstance(impl.expected_acceptance_rate(P, Q_PAIR), float)
    # symmetric, and 1 - TV for random pairs
    rng = np.random.default_rng(3)
    for _ in range(5):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        a = impl.expected_acceptance_rate(p, q)
        assert a == pytest.approx(impl.expected_acceptance_rate(q, p), abs=1e-12)
        assert a == pytest.approx(1 - 0.5 * np.abs(p - q).sum(), abs=1e-12)
        # E_{x~q}[accept_prob] is the same number
        assert a == pytest.approx(sum(q[x] * impl.accept_prob(p, q, x) for x in range(6)), abs=1e-12)


# ---------------------------------------------------------------- the exponential race


def test_exponential_race_replays_the_rng_and_keeps_shapes():
    w = np.random.default_rng(5).random((2, 3, 7))
    got = impl.sample_by_exponential_race(w, np.random.default_rng(11))
    e = np.random.default_rng(11).standard_exponential(w.shape)
    assert got.shape == (2, 3) and got.dtype == np.int64
    np.testing.assert_array_equal(got, np.argmax(w / e, axis=-1))
    # a 1-D row gives one 0-d token
    one = impl.sample_by_exponential_race(P, np.random.default_rng(2))
    assert np.shape(one) == ()
    assert int(one) == int(np.argmax(P / np.random.default_rng(2).standard_exponential(3)))


def test_exponential_race_needs_no_normalization():
    # upstream feeds max(p - q, 0) straight in, unnormalized: scaling a row changes nothing
    w = np.random.default_rng(8).random((500, 9))
    a = impl.sample_by_exponential_race(w, np.random.default_rng(4))
    b = impl.sample_by_exponential_race(w * 1000.0, np.random.default_rng(4))
    np.testing.assert_array_equal(a, b)
    # a zero weight never wins
    w[:, 3] = 0.0
    assert 3 not in impl.sample_by_exponential_race(w, np.random.default_rng(4))


def test_exponential_race_matches_p_and_its_negative_control_fails():
    rng_seed = 21
    tokens = impl.sample_by_exponential_race(np.broadcast_to(P, (N, 3)), np.random.default_rng(rng_seed))
    assert_distributed_as(tokens, P, "exponential race")
    # The same test rejects a race that multiplies by E instead of dividing. On the same
    # draws argmax(p * E) gives about [0.532, 0.299, 0.169]: chi-square 1,378 against 27.6.
    e = np.random.default_rng(rng_seed).standard_exponential((N, 3))
    wrong = np.argmax(P * e, axis=-1)
    stat, df = chi2_stat(wrong, P)
    assert stat > 10 * chi2_critical(df)


# ---------------------------------------------------------------- exactness, by chi-square


def _check_speculation(p, q, seed, n=N):
    """The four checks every drafter must pass; returns (tokens, accepted)."""
    p, q = np.asarray(p), np.asarray(q)
    tokens, accepted = impl.speculative_token(p, q, np.random.default_rng(seed), n)
    assert tokens.shape == (n,) and accepted.shape == (n,)
    assert np.issubdtype(tokens.dtype, np.integer) and accepted.dtype == np.bool_
    # 1. the output is p: the whole point
    assert_distributed_as(tokens, p, "output")
    # 2. a draft is kept at the overlap rate
    alpha = float(np.minimum(p, q).sum())
    assert_rate(accepted, alpha, "acceptance")
    # 3. kept tokens are drafts that passed: distributed as min(p, q) / alpha
    if 0 < alpha:
        assert_distributed_as(tokens[accepted], np.minimum(p, q) / alpha, "accepted tokens")
    # 4. replaced tokens come from the residual
    if alpha < 1:
        shortfall = np.maximum(p - q, 0)
        assert_distributed_as(tokens[~accepted], shortfall / shortfall.sum(), "recovered tokens")
    return tokens, accepted


def test_uniform_drafter_output_is_exactly_p():
    # acceptance 5/6; the accepted tokens are [1/3, .3, .2] / (5/6) = [0.4, 0.36, 0.24];
    # every rejected one is token 0, the only token the drafter under-serves
    tokens, accepted = _check_speculation(P, Q_UNIFORM, seed=1)
    assert (tokens[~accepted] == 0).all()


def test_overlap_070_pair_output_is_exactly_p():
    # acceptance 0.70: token 2 is drafted half the time but kept only 40% of those
    _check_speculation(P, Q_PAIR, seed=2)


def test_resampling_from_p_instead_of_the_residual_is_caught():
    # Negative control, built from your own pieces. Correct: recover from the residual.
    # Wrong: recover from p. With q uniform the wrong output is
    #   min(p, q) + (1 - 5/6) * p = [1/3 + 1/12, 0.3 + 0.05, 0.2 + 1/30] = [0.417, 0.35, 0.233],
    # TV distance 1/12 = 0.083 from p. Same draws, same chi-square test.
    rng = np.random.default_rng(7)
    drafts = impl.sample_by_exponential_race(np.broadcast_to(Q_UNIFORM, (N, 3)), rng)
    keep = np.array([impl.accept_prob(P, Q_UNIFORM, x) for x in range(3)])
    accepted = rng.random(N) < keep[drafts]
    e_state = rng.bit_generator.state
    good = impl.sample_by_exponential_race(
        np.broadcast_to(impl.residual_distribution(P, Q_UNIFORM), (N, 3)), rng
    )
    rng.bit_generator.state = e_state
    bad = impl.sample_by_exponential_race(np.broadcast_to(P, (N, 3)), rng)
    assert_distributed_as(np.where(accepted, drafts, good), P, "residual recovery")
    wrong = np.where(accepted, drafts, bad)
    np.testing.assert_allclose(frequencies(wrong, 3), [5 / 12, 0.35, 7 / 30], atol=0.005)
    stat, df = chi2_stat(wrong, P)
    assert stat > 10 * chi2_critical(df)  # measured 5,659 against 27.6


def test_identical_distributions_always_accept():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    tokens, accepted = _check_speculation(p, p.copy(), seed=3, n=50_000)
    assert accepted.all()


def test_disjoint_distributions_never_accept_and_still_give_p():
    # no overlap: every draft is rejected, the output is pure residual = p. Slow, never wrong.
    p = np.array([0.6, 0.4, 0.0, 0.0])
    q = np.array([0.0, 0.0, 0.5, 0.5])
    tokens, accepted = _check_speculation(p, q, seed=4, n=50_000)
    assert not accepted.any()
    assert set(np.unique(tokens).tolist()) == {0, 1}


def test_sampling_at_temperature_is_exact_over_eight_tokens():
    # p and q come from two models' logits at the request's temperature, both through softmax
    target = np.array([2.0, 1.5, 0.3, -0.5, 0.9, -1.2, 0.0, 1.1])
    draft = np.array([1.6, 1.9, 0.1, -0.2, 0.4, -0.8, 0.5, 0.6])
    for seed, temperature in ((5, 0.7), (6, 1.5)):
        p, q = impl.softmax(target, temperature), impl.softmax(draft, temperature)
        _check_speculation(p, q, seed=seed, n=100_000)


def test_one_hot_rule_on_a_probabilistic_drafter_is_caught():
    # A sampler that keeps a draft with probability p[x] even though q is a real
    # distribution (the one-hot rule applied to a probabilistic drafter) is not exact:
    # with the 0.70 pair it outputs q*p + (1 - sum(q*p)) * residual = [0.81, 0.09, 0.10].
    rng = np.random.default_rng(9)
    drafts = impl.sample_by_exponential_race(np.broadcast_to(Q_PAIR, (N, 3)), rng)
    accepted = rng.random(N) < P[drafts]
    recovered = impl.sample_by_exponential_race(
        np.broadcast_to(impl.residual_distribution(P, Q_PAIR), (N, 3)), rng
    )
    wrong = np.where(accepted, drafts, recovered)
    stat, df = chi2_stat(wrong, P)
    assert stat > 10 * chi2_critical(df)
    # while the real sampler on the same pair passes (seed 2 above); its acceptance is 0.70, not 0.29
    _, ok = impl.speculative_token(P, Q_PAIR, np.random.default_rng(10), 20_000)
    assert_rate(ok, 0.70, "acceptance")


# ---------------------------------------------------------------- the one-hot (no draft probs) path


def test_one_hot_draft_is_kept_with_p_of_x_and_recovered_without_x():
    tokens, accepted = impl.verify_one_hot_draft(P, 0, np.random.default_rng(12), N)
    assert tokens.shape == (N,) and accepted.dtype == np.bool_
    assert_distributed_as(tokens, P, "one-hot output")
    assert_rate(accepted, 0.5, "one-hot acceptance")
    assert (tokens[accepted] == 0).all()
    # rejected: p without token 0, renormalized: [0, 0.6, 0.4]
    assert_distributed_as(tokens[~accepted], [0.0, 0.6, 0.4], "one-hot recovery")


def test_one_hot_draft_of_an_unlikely_token_over_five_tokens():
    p = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    tokens, accepted = impl.verify_one_hot_draft(p, 4, np.random.default_rng(13), 100_000)
    assert_distributed_as(tokens, p, "one-hot output")
    assert_rate(accepted, 0.1, "one-hot acceptance")
    assert 4 not in tokens[~accepted]


def test_one_hot_negative_controls_fail_the_same_test():
    # 1. recovering from all of p: 0.5 * e_0 + 0.5 * p = [0.75, 0.15, 0.10]
    # 2. the greedy rule at temperature 1 (keep x when it is p's argmax): always token 0
    rng = np.random.default_rng(14)
    tokens, accepted = impl.verify_one_hot_draft(P, 0, rng, N)
    full_p = impl.sample_by_exponential_race(np.broadcast_to(P, (N, 3)), rng)
    wrong = np.where(accepted, tokens, full_p)
    np.testing.assert_allclose(frequencies(wrong, 3), [0.75, 0.15, 0.10], atol=0.005)
    assert chi2_stat(wrong, P)[0] > 10 * chi2_critical(2)
    assert chi2_stat(np.zeros(N, dtype=np.int64), P)[0] > 10 * chi2_critical(2)
    assert_distributed_as(tokens, P, "the real one")


def test_one_hot_draft_edge_probabilities():
    # p[x] == 1: always kept. p[x] == 0: never kept, and x never appears
    tokens, accepted = impl.verify_one_hot_draft([0.0, 1.0, 0.0], 1, np.random.default_rng(15), 5_000)
    assert accepted.all() and (tokens == 1).all()
    tokens, accepted = impl.verify_one_hot_draft([0.5, 0.5, 0.0], 2, np.random.default_rng(16), 5_000)
    assert not accepted.any() and 2 not in tokens
    assert_distributed_as(tokens, [0.5, 0.5, 0.0], "p[x] == 0")


def test_one_hot_path_equals_the_general_path_with_q_one_hot():
    # speculative_token with q = e_x must behave like verify_one_hot_draft(p, x)
    tokens, accepted = impl.speculative_token(P, impl.one_hot(2, 3), np.random.default_rng(17), N)
    assert_rate(accepted, 0.2, "acceptance")
    assert (tokens[accepted] == 2).all()
    assert_distributed_as(tokens[~accepted], [0.625, 0.375, 0.0], "recovery")


# ---------------------------------------------------------------- upstream's kernels, run on numpy


class _Ptr:
    """A Triton pointer stand-in: an array and an offset (an int or an array of ints)."""

    def __init__(self, arr, off=0):
        self.arr, self.off = arr, off

    def __add__(self, k):
        return _Ptr(self.arr, self.off + k)

    __radd__ = __add__

    def __sub__(self, k):
        return _Ptr(self.arr, self.off - k)


def _fake_tl(pid):
    def load(ptr, mask=None, other=None):
        if mask is None:
            return ptr.arr[ptr.off]
        safe = np.where(mask, ptr.off, 0)
        return np.where(mask, ptr.arr[safe], other)

    def store(ptr, value):
        ptr.arr[ptr.off] = value

    def tl_max(x, axis=0, return_indices=False):
        return x.max(), int(np.argmax(x))

    return types.SimpleNamespace(
        constexpr=object, load=load, store=store, program_id=lambda axis: pid[axis],
        arange=np.arange, maximum=np.maximum, max=tl_max,
    )


def _upstream_kernels():
    """The two kernels' bodies from rejection_sampler.py, decorators stripped, on a fake ``tl``."""
    tree = ast.parse(REJECTION.read_text())
    wanted = {"rejection_random_sample_kernel", "sample_recovered_tokens_kernel"}
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {d.name for d in defs} == wanted
    for d in defs:
        d.decorator_list = []
    pid = [0, 0]
    namespace = {"tl": _fake_tl(pid)}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(REJECTION), "exec"), namespace)

    def launch(name, grid, *args, **kw):
        for i in range(grid[0]):
            for j in range(grid[1] if len(grid) > 1 else 1):
                pid[0], pid[1] = i, j
                namespace[name](*args, **kw)

    return launch


def _random_batch(seed, batch, vocab):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.5), size=batch)
    q = rng.dirichlet(np.full(vocab, 0.5), size=batch)
    x = np.array([rng.choice(vocab, p=row) for row in q])
    return p, q, x, rng


@pytest.mark.upstream
def test_accept_prob_agrees_with_vllms_kernel():
    # One draft per request; vLLM keeps it iff p[x] / q[x] >= u (or, without draft probs,
    # iff p[x] >= u). Your accept_prob must give the same verdict for the same u.
    launch = _upstream_kernels()
    batch, vocab = 300, 6
    p, q, x, rng = _random_batch(31, batch, vocab)
    q[0] = [0.0, 0.2, 0.2, 0.2, 0.2, 0.2]  # a draft q could not make: vLLM rejects it
    x[0] = 0
    u = rng.random(batch)
    u[1] = 0.0
    for no_draft_probs in (False, True):
        out = np.full((batch, 2), -1, dtype=np.int64)
        launch(
            "rejection_random_sample_kernel", (batch,),
            _Ptr(out.reshape(-1)), _Ptr(np.arange(1, batch + 1)), _Ptr(x),
            None if no_draft_probs else _Ptr(q.reshape(-1)), _Ptr(p.reshape(-1)),
            _Ptr(np.full(batch, 1000)), _Ptr(np.full(batch, 2000)), _Ptr(u),
            _Ptr(np.zeros(batch, dtype=bool)), 1, vocab, None,
            NO_DRAFT_PROBS=no_draft_probs, SYNTHETIC_MODE=False,
        )
        vllm_kept = out[:, 0] == x
        assert ((out[:, 1] == 1000) == vllm_kept).all()  # the bonus token follows a kept draft
        qs = [impl.one_hot(int(x[i]), vocab) if no_draft_probs else q[i] for i in range(batch)]
        yours = np.array([u[i] <= impl.accept_prob(p[i], qs[i], int(x[i])) for i in range(batch)])
        np.testing.assert_array_equal(yours, vllm_kept)
        assert 50 < vllm_kept.sum() < batch - 20  # both verdicts occur
        if not no_draft_probs:
            assert not vllm_kept[0]


@pytest.mark.upstream
def test_recovered_token_agrees_with_vllms_kernel():
    # vLLM draws the recovered token as argmax(max(p - q, 0) * (1 / E)) (or p with the draft
    # masked out). Feed its kernel 1 / E from the seed your race will use, and the tokens of
    # sample_by_exponential_race(residual_distribution(...)) must be its tokens, row by row.
    launch = _upstream_kernels()
    batch, vocab, seed = 200, 10, 41
    p, q, x, _ = _random_batch(32, batch, vocab)
    inv_e = 1.0 / np.random.default_rng(seed).standard_exponential((batch, vocab))
    for no_draft_probs in (False, True):
        out = np.full(batch, -1, dtype=np.int64)
        launch(
            "sample_recovered_tokens_kernel", (batch, 1),
            _Ptr(out), _Ptr(np.arange(1, batch + 1)), _Ptr(x),
            None if no_draft_probs else _Ptr(q.reshape(-1)), _Ptr(p.reshape(-1)),
            _Ptr(inv_e.reshape(-1)), vocab, 4,  # BLOCK_SIZE 4 < vocab: three tiles
            NO_DRAFT_PROBS=no_draft_probs,
        )
        residuals = np.stack([
            impl.residual_distribution(p[i], impl.one_hot(int(x[i]), vocab) if no_draft_probs else q[i])
            for i in range(batch)
        ])
        yours = impl.sample_by_exponential_race(residuals, np.random.default_rng(seed))
        np.testing.assert_array_equal(yours, out)
        if no_draft_probs:
            assert (out != x).all()


# ---------------------------------------------------------------- contracts


def test_inputs_are_not_modified():
    p, q = P.copy(), Q_PAIR.copy()
    w = np.random.default_rng(0).random((4, 3))
    w0 = w.copy()
    impl.accept_prob(p, q, 2)
    impl.residual_distribution(p, q)
    impl.expected_acceptance_rate(p, q)
    impl.speculative_token(p, q, np.random.default_rng(0), 10)
    impl.verify_one_hot_draft(p, 1, np.random.default_rng(0), 10)
    impl.sample_by_exponential_race(w, np.random.default_rng(0))
    np.testing.assert_array_equal(p, P)
    np.testing.assert_array_equal(q, Q_PAIR)
    np.testing.assert_array_equal(w, w0)


def test_plain_lists_work_like_arrays():
    # every function takes array-likes: convert before indexing (a list cannot be indexed by
    # an array of drafts)
    rng = np.random.default_rng(18)
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    tokens, accepted = impl.speculative_token(p, q, rng, 2_000)
    assert tokens.shape == (2_000,) and 0.6 < accepted.mean() < 0.8
    tokens, accepted = impl.verify_one_hot_draft(p, 2, rng, 2_000)
    assert tokens.shape == (2_000,) and 0.1 < accepted.mean() < 0.3
    assert impl.accept_prob(p, q, 2) == pytest.approx(0.4, abs=1e-15)
    assert int(impl.sample_by_exponential_race([0.0, 1.0], rng)) == 1


def test_bad_inputs_name_the_parameter():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"q must have the shape of p"):
        impl.accept_prob(P, [0.5, 0.5], 0)
    with pytest.raises(ValueError, match=r"p must sum to 1"):
        impl.accept_prob([0.5, 0.6, 0.0], Q_PAIR, 0)
    with pytest.raises(ValueError, match=r"q must hold finite probabilities >= 0"):
        impl.residual_distribution(P, [1.2, -0.2, 0.0])
    with pytest.raises(ValueError, match=r"x must be a token id in \[0, 3\)"):
        impl.accept_prob(P, Q_PAIR, 3)
    with pytest.raises(ValueError, match=r"x must be a token id in \[0, 3\)"):
        impl.verify_one_hot_draft(P, -1, rng, 10)
    with pytest.raises(ValueError, match=r"x must be a token id in \[0, 3\)"):
        impl.verify_one_hot_draft(P, 3, rng, 10)
    with pytest.raises(ValueError, match=r"p must be a non-empty 1-D"):
        impl.expected_acceptance_rate([[0.5, 0.5]], [[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"n must be an integer >= 1"):
        impl.speculative_token(P, Q_PAIR, rng, 0)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1"):
        impl.verify_one_hot_draft(P, 0, rng, 2.5)
    with pytest.raises(ValueError, match=r"weights: every row needs a positive sum"):
        impl.sample_by_exponential_race([[0.2, 0.8], [0.0, 0.0]], rng)
    with pytest.raises(ValueError, match=r"weights must be finite and >= 0"):
        impl.sample_by_exponential_race([0.5, -0.1, 0.6], rng)
    with pytest.raises(ValueError, match=r"weights must have a non-empty last"):
        impl.sample_by_exponential_race(1.0, rng)
