"""Lab 09-04 tests: whose random numbers a row gets, and what that does to batch invariance.

Every test uses fixed seeds, so each gives the same verdict on every run. Most pin tokens
exactly: numpy's ``standard_exponential`` fills an array in C order from one stream, so
``g.standard_exponential((S, V))[t]`` is what the (t+1)-th call ``g.standard_exponential(V)``
returns, and the expected tokens can be recomputed here without the code under test.
"""
from __future__ import annotations

import ast

import numpy as np
import pytest

import course
from course import load_impl
from mini_vllm.engine import LLMEngine
from mini_vllm.sampler import Sampler
from mini_vllm.sampling_params import SamplingParams

impl = load_impl(__file__)

TOPK_TOPP = course.UPSTREAM / "vllm/v1/sample/ops/topk_topp_sampler.py"

V = 64  # vocabulary of the trajectory tests
STEPS = 12
UNIFORM = np.zeros((1, V))  # equal logits: every token has probability 1/64
# A's logits, one row per step: peaked enough to look like a model, flat enough to vary.
LOGITS_A = np.random.default_rng(2024).normal(0.0, 2.0, size=(STEPS, V))
P5 = np.array([0.4, 0.3, 0.15, 0.1, 0.05, 0.0])  # the race test's target (token 5 never)


def softmax(x, t=1.0):
    z = np.asarray(x, dtype=np.float64) / t
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def state(gen: np.random.Generator) -> dict:
    """A generator's full position in its stream (two equal dicts: the same next numbers)."""
    return gen.bit_generator.state


def advanced(seed: int, *shapes) -> dict:
    """The state of default_rng(seed) after standard_exponential(shape) for each shape."""
    g = np.random.default_rng(seed)
    for shape in shapes:
        g.standard_exponential(shape)
    return state(g)


def chi_square(counts, p) -> float:
    counts = np.asarray(counts, dtype=np.float64)
    expected = counts.sum() * np.asarray(p)
    return float(((counts - expected) ** 2 / expected).sum())


# Chi-square with 4 degrees of freedom: P(X >= x) = exp(-x/2) (1 + x/2), which is 9.9e-7 at
# x = 33.4. A correct race fails this bound with probability under 1e-6 whatever the seed;
# on 20,000 rows the wrong races score far above it (uniform noise q ~ U(0, 1): 403,
# p * q: 1,501, p + q: 7,786; the correct race: 1.7).
CHI2_DF4_1E6 = 33.4


# ---------------------------------------------------------------- random_sample, pinned


def test_random_sample_noise_layout_is_upstreams():
    # B = 3, V = 5; row 1 has its own generator (seed 7), rows 0 and 2 draw from shared (0).
    probs = np.array([[0.1, 0.2, 0.3, 0.4, 0.0],
                      [0.5, 0.5, 0.0, 0.0, 0.0],
                      [0.2, 0.2, 0.2, 0.2, 0.2]])
    shared, own = np.random.default_rng(0), np.random.default_rng(7)
    tokens = impl.random_sample(probs, {1: own}, shared)
    assert tokens.dtype == np.int64 and tokens.shape == (3,)
    # Expected, built here: ONE (3, 5) shared draw, then row 1 replaced by 5 numbers of seed 7.
    q = np.random.default_rng(0).standard_exponential((3, 5))
    q[1] = np.random.default_rng(7).standard_exponential(5)
    np.testing.assert_array_equal(tokens, np.argmax(probs / q, axis=-1))
    assert tokens.tolist() == [3, 0, 1]
    # shared moved by exactly 15 numbers (row 1's included), own by exactly 5
    assert state(shared) == advanced(0, (3, 5))
    assert state(own) == advanced(7, (5,))


def test_all_seeded_batch_leaves_the_shared_stream_alone():
    # every row has a generator: upstream skips the shared fill (len(generators) == B)
    probs = softmax(np.random.default_rng(1).normal(size=(4, 6)))
    shared = np.random.default_rng(3)
    gens = {i: np.random.default_rng(40 + i) for i in (2, 0, 3, 1)}
    tokens = impl.random_sample(probs, gens, shared)
    assert state(shared) == advanced(3)
    q = np.stack([np.random.default_rng(40 + i).standard_exponential(6) for i in range(4)])
    np.testing.assert_array_equal(tokens, np.argmax(probs / q, axis=-1))
    # one row without a generator: now the whole (4, 6) block is drawn from shared
    impl.random_sample(probs, {0: np.random.default_rng(40)}, shared)
    assert state(shared) == advanced(3, (4, 6))


def test_exponential_race_draws_from_p():
    # 20,000 rows of the same P5 in one call, all from the shared stream
    n = 20_000
    tokens = impl.random_sample(np.tile(P5, (n, 1)), {}, np.random.default_rng(5))
    counts = np.bincount(tokens, minlength=6)
    assert counts[5] == 0  # probability 0 never wins the race
    assert chi_square(counts[:5], P5[:5]) < CHI2_DF4_1E6
    # 5,000 rows, each with its own generator (seeds 1000..5999): the same law per row
    # (a quarter of the samples: uniform noise in the seeded rows still scores 138 here)
    n = 5_000
    gens = {i: np.random.default_rng(1000 + i) for i in range(n)}
    tokens = impl.random_sample(np.tile(P5, (n, 1)), gens, np.random.default_rng(6))
    counts = np.bincount(tokens, minlength=6)
    assert counts[5] == 0
    assert chi_square(counts[:5], P5[:5]) < CHI2_DF4_1E6


# ---------------------------------------------------------------- upstream's random_sample, on numpy


class _FakeTensor:
    """Just enough of torch.Tensor for random_sample: a numpy array, views included."""

    def __init__(self, a):
        self.a = a

    @property
    def shape(self):
        return self.a.shape

    def __getitem__(self, i):
        return _FakeTensor(self.a[i])  # an int index gives a view, as in torch

    def exponential_(self, generator=None):
        g = generator if generator is not None else _FakeTorch.default_generator
        self.a[...] = g.standard_exponential(self.a.shape)
        return self

    def div_(self, other):
        self.a /= other.a
        return self

    def argmax(self, dim):
        return _FakeTensor(np.argmax(self.a, axis=dim))

    def view(self, *shape):
        return _FakeTensor(self.a.reshape(shape))


class _FakeTorch:
    """torch with a numpy Generator as its global generator (torch.manual_seed's stream)."""

    Tensor = _FakeTensor
    Generator = np.random.Generator
    default_generator: np.random.Generator | None = None

    @staticmethod
    def empty_like(t):
        return _FakeTensor(np.empty_like(t.a))


def _upstream_random_sample():
    """vLLM's random_sample, its source unchanged, run against the fake torch above."""
    tree = ast.parse(TOPK_TOPP.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "random_sample"]
    namespace = {"torch": _FakeTorch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(TOPK_TOPP), "exec"), namespace)
    return namespace["random_sample"]


@pytest.mark.upstream
def test_random_sample_agrees_with_vllms_bit_for_bit():
    # Same probs, same seeds: vLLM's function (on numpy generators) and yours must pick the
    # same tokens AND leave every generator, the shared one included, in the same state.
    upstream = _upstream_random_sample()
    rng = np.random.default_rng(8)
    for case, seeded_rows in enumerate([(), (0,), (1, 4), (5, 2, 0), tuple(range(6)), (3,)]):
        probs = rng.dirichlet(np.full(9, 0.3), size=6)
        probs[1, 4] = 0.0
        probs[1] /= probs[1].sum()

        ours_g, theirs_g = ({r: np.random.default_rng(100 * case + r) for r in seeded_rows}
                            for _ in range(2))
        ours_shared = np.random.default_rng(case)
        _FakeTorch.default_generator = theirs_shared = np.random.default_rng(case)
        ours = impl.random_sample(probs, ours_g, ours_shared)
        theirs = upstream(_FakeTensor(probs.copy()), theirs_g).a
        np.testing.assert_array_equal(ours, theirs, err_msg=f"seeded rows {seeded_rows}")
        assert state(ours_shared) == state(theirs_shared), f"shared stream, seeded rows {seeded_rows}"
        for r in seeded_rows:
            assert state(ours_g[r]) == state(theirs_g[r])


# ---------------------------------------------------------------- the sampler: seeded requests


def _a_alone(sampler_seed=0, seed=7, steps=STEPS):
    s = impl.SeededBatchSampler(seed=sampler_seed)
    s.add_request("A", 0.8, seed=seed)
    return [int(s.sample(["A"], LOGITS_A[t][None])[0]) for t in range(steps)]


def _a_expected(seed=7, steps=STEPS):
    # one generator, V numbers per step, never reset: row t of a (steps, V) draw
    q = np.random.default_rng(seed).standard_exponential((steps, V))
    return np.argmax(softmax(LOGITS_A[:steps], 0.8) / q, axis=-1).tolist()


def test_same_seed_reproduces_across_instances():
    # the stream is a function of the request's seed alone: the engine's seed is irrelevant
    first, second = _a_alone(sampler_seed=0), _a_alone(sampler_seed=99)
    assert first == second == _a_expected()


def test_different_seeds_diverge():
    # uniform logits, 16 steps: two independent streams agree at a step with probability 1/64,
    # so about 0.25 matches are expected; 4 or more has probability ~1e-4 (1820 / 64**4).
    def run(seed):
        s = impl.SeededBatchSampler()
        s.add_request("r", 1.0, seed=seed)
        return [int(s.sample(["r"], UNIFORM)[0]) for _ in range(16)]

    a, b = run(7), run(8)
    assert sum(x == y for x, y in zip(a, b, strict=True)) <= 3
    assert len(set(a)) > 8  # and each stream really varies


def test_stream_continues_across_steps_not_reset():
    # 1,000 equal logits: a generator re-created every step returns the same token every
    # step; the real stream returns draw 1, draw 2, draw 3 of one generator
    s = impl.SeededBatchSampler()
    s.add_request("r", 1.0, seed=3)
    flat = np.zeros((1, 1000))
    got = [int(s.sample(["r"], flat)[0]) for _ in range(3)]
    q = np.random.default_rng(3).standard_exponential((3, 1000))
    assert got == np.argmax(1.0 / q, axis=-1).tolist()
    assert len(set(got)) == 3


# Neighbours: greedy with a seed, unseeded, seeded, and one with A's own seed (a second,
# separate generator: requests own generators, seeds do not).
NEIGHBOURS = [("g", 0.0, 3), ("u1", 1.0, None), ("s1", 1.3, 5), ("u2", 0.6, None),
              ("twin", 1.0, 7), ("u3", 2.0, None)]


def _a_with(k: int) -> list[int]:
    """A's tokens over STEPS steps with k neighbours, most of them in front of A, and churn:
    the first neighbour leaves after step 4 (A's row moves up) and comes back in front of
    everyone (as a new request) after step 8."""
    s = impl.SeededBatchSampler(seed=11)
    nb = NEIGHBOURS[:k]
    for rid, t, seed in nb:
        s.add_request(rid, t, seed=seed)
    s.add_request("A", 0.8, seed=7)
    front, back = [r for r, _, _ in nb[: k - k // 3]], [r for r, _, _ in nb[k - k // 3:]]
    rng = np.random.default_rng(k)
    out = []
    for t in range(STEPS):
        if t == 4 and k:
            gone = front.pop(0) if front else back.pop(0)
            s.remove_request(gone)
        if t == 8 and k:
            s.add_request("late", 1.0)
            front.insert(0, "late")
        ids = front + ["A"] + back
        logits = rng.normal(0.0, 2.0, size=(len(ids), V))
        logits[len(front)] = LOGITS_A[t]
        out.append(int(s.sample(ids, logits)[len(front)]))
    return out


def test_seeded_request_is_invariant_to_0_1_and_5_neighbours():
    alone = _a_with(0)
    assert alone == _a_expected()
    assert _a_with(1) == alone
    assert _a_with(5) == alone
    assert _a_with(6) == alone  # the twin with A's seed is in this batch


def test_generators_for_hands_out_the_requests_own_generators():
    s = impl.SeededBatchSampler()
    s.add_request("a", 1.0, seed=1)
    s.add_request("b", 1.0)
    s.add_request("c", 0.5, seed=1)  # same seed as a, its own object
    s.add_request("g", 0.0, seed=3)  # greedy: no generator, seed or not
    gens = s.generators_for(["b", "a", "g", "c"])
    assert sorted(gens) == [1, 3]
    assert gens[1] is s.generators_for(["a"])[0]
    assert gens[3] is s.generators_for(["c", "b"])[0]
    assert gens[1] is not gens[3]
    assert s.generators_for(["g", "b"]) == {}
    # sampling moves a's stream on by V numbers, and only a's
    s.sample(["a"], UNIFORM)
    assert state(gens[1]) == advanced(1, (V,))
    assert state(gens[3]) == advanced(1)


# ---------------------------------------------------------------- unseeded requests: the shared stream


def test_unseeded_rows_share_one_stream_and_depend_on_the_batch():
    # U alone for 16 steps gets V-number chunks 0, 1, 2, ... of the shared stream.
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("U", 1.0)
    alone = [int(s.sample(["U"], UNIFORM)[0]) for _ in range(16)]
    q = np.random.default_rng(0).standard_exponential((16, V))
    assert alone == np.argmax(1.0 / q, axis=-1).tolist()
    # One neighbour in front: each step fills 2 rows, so the neighbour gets chunks 0, 2, 4, ...
    # and U gets 1, 3, 5, ...: the same stream, dealt out by row.
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("N", 1.0)
    s.add_request("U", 1.0)
    pairs = [s.sample(["N", "U"], np.repeat(UNIFORM, 2, axis=0)).tolist() for _ in range(8)]
    assert [n for n, _ in pairs] == alone[0::2]
    assert [u for _, u in pairs] == alone[1::2]
    assert [u for _, u in pairs] != alone[:8]  # U's tokens changed because N was there
    # A seeded neighbour still widens the shared draw (its row is drawn, then overwritten).
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("S", 1.0, seed=1)
    s.add_request("U", 1.0)
    got = [int(s.sample(["S", "U"], np.repeat(UNIFORM, 2, axis=0))[1]) for _ in range(8)]
    assert got == alone[1::2]


def test_steps_without_unseeded_rows_do_not_move_the_shared_stream():
    # U, then a step of a seeded request only, then a greedy-only step, then U again:
    # U must see chunks 0, 1, 2 of the shared stream, as if the other steps never happened.
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("U", 1.0)
    s.add_request("S", 1.0, seed=4)
    s.add_request("G", 0.0)
    q = np.random.default_rng(0).standard_exponential((3, V))
    expected = np.argmax(1.0 / q, axis=-1).tolist()
    got = [int(s.sample(["U"], UNIFORM)[0])]
    s.sample(["S"], UNIFORM)
    got.append(int(s.sample(["U"], UNIFORM)[0]))
    s.sample(["G"], UNIFORM)
    got.append(int(s.sample(["U"], UNIFORM)[0]))
    assert got == expected


# ---------------------------------------------------------------- greedy


def test_greedy_rows_touch_no_generator():
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("g1", 0.0, seed=9)
    s.add_request("g2", 1e-6)  # below SAMPLING_EPS: greedy too
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [2.0, -1.0, 2.0, 2.0]])
    before = state(s.shared)
    out = s.sample(["g1", "g2"], logits)
    # the lowest id among tied maxima, as mini_vllm's (and torch's) argmax
    ref = Sampler()
    assert out.tolist() == [ref.sample(row, SamplingParams(temperature=0.0)) for row in logits]
    assert out.tolist() == [1, 0]
    assert state(s.shared) == before  # an all-greedy batch draws nothing
    assert s.generators_for(["g1", "g2"]) == {}


def test_greedy_row_in_a_mixed_batch_widens_the_shared_draw():
    # upstream samples the whole batch, greedy rows at temperature 1, and keeps their argmax
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("g", 0.0)
    s.add_request("u", 1.0)
    logits = np.stack([LOGITS_A[0], LOGITS_A[1]])
    out = s.sample(["g", "u"], logits)
    q = np.random.default_rng(0).standard_exponential((2, V))
    assert out[0] == np.argmax(LOGITS_A[0])
    assert out[1] == np.argmax(softmax(LOGITS_A[1]) / q[1])
    assert state(s.shared) == advanced(0, (2, V))
    # a greedy row beside a seeded one: nobody uses the shared numbers, yet 2 x V are drawn,
    # because the greedy row has no generator (len(generators) = 1 != B = 2)
    s.add_request("s", 1.0, seed=4)
    s.sample(["g", "s"], logits)
    assert state(s.shared) == advanced(0, (2, V), (2, V))


# ---------------------------------------------------------------- temperature, against mini_vllm


def test_temperature_and_softmax_match_mini_vllms_sampler():
    # Four unseeded rows and one seeded: the tokens must be argmax(p / q) with p from
    # mini_vllm's Sampler.probs (temperature only, the knob both samplers have). Row 3's logits
    # sit near 800, where exp overflows float64 unless the row's max is subtracted first.
    temps, seeds = [0.5, 1.0, 2.0, 0.25, 0.7], [None, None, None, None, 9]
    s = impl.SeededBatchSampler(seed=5)
    for i, (t, sd) in enumerate(zip(temps, seeds, strict=True)):
        s.add_request(f"r{i}", t, seed=sd)
    logits = np.random.default_rng(12).normal(0.0, 3.0, size=(5, V))
    logits[3] += 800.0
    out = s.sample([f"r{i}" for i in range(5)], logits)
    ref = Sampler()
    p = np.stack([ref.probs(row, SamplingParams(temperature=t)) for row, t in zip(logits, temps,
                                                                               strict=True)])
    q = np.random.default_rng(5).standard_exponential((5, V))
    q[4] = np.random.default_rng(9).standard_exponential(V)
    np.testing.assert_array_equal(out, np.argmax(p / q, axis=-1))


# ---------------------------------------------------------------- request lifecycle


def test_a_reused_request_id_starts_a_fresh_stream():
    s = impl.SeededBatchSampler()
    s.add_request("a", 0.8, seed=7)
    first = [int(s.sample(["a"], LOGITS_A[t][None])[0]) for t in range(6)]
    with pytest.raises(ValueError, match="request_id"):
        s.add_request("a", 0.8, seed=7)  # still registered
    s.remove_request("a")
    with pytest.raises(ValueError, match="request_ids"):
        s.sample(["a"], UNIFORM)
    s.add_request("a", 0.8, seed=7)
    again = [int(s.sample(["a"], LOGITS_A[t][None])[0]) for t in range(6)]
    assert first == again == _a_expected(steps=6)
    s.remove_request("a")
    s.add_request("a", 0.8)  # now unseeded: no generator may survive from before
    assert s.generators_for(["a"]) == {}


# ---------------------------------------------------------------- mini_vllm's documented difference


def _engine_tokens(prompts, seed=None, which=0):
    engine = LLMEngine("toy", seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=seed)
    return engine.generate([{"prompt_token_ids": p} for p in prompts], params)[which].output_token_ids


def test_mini_vllm_gives_every_request_a_generator_upstream_does_not():
    # mini_vllm seeds every request's own generator, from (engine seed, request number) when the
    # request has no seed: an unseeded request added first is untouched by neighbours added
    # after it. Its number, not the batch, decides its stream (one added before it changes it).
    x, others = [5, 6, 7], [[9, 9 + i] for i in range(5)]
    alone = _engine_tokens([x])
    assert _engine_tokens([x] + others) == alone
    assert _engine_tokens([others[0], x], which=1) != alone
    assert _engine_tokens([others[0], x], seed=7, which=1) == _engine_tokens([x], seed=7)
    # Upstream's rule, in your sampler: the same situation, U in row 0 with 5 neighbours
    # behind it, and U's tokens change from the second step on (its rows are chunks 0, 6, 12...).
    def u_tokens(k):
        s = impl.SeededBatchSampler(seed=0)
        ids = ["U"] + [f"n{j}" for j in range(k)]
        for rid in ids:
            s.add_request(rid, 1.0)
        return [int(s.sample(ids, np.repeat(UNIFORM, k + 1, axis=0))[0]) for _ in range(8)]

    solo, crowded = u_tokens(0), u_tokens(5)
    assert crowded[0] == solo[0] and crowded[1:] != solo[1:]


# ---------------------------------------------------------------- contracts


def test_bad_inputs_name_the_parameter():
    ok = np.full((2, 3), 1 / 3)
    g = np.random.default_rng(0)
    for probs in ([0.5, 0.5], [[0.5, -0.1, 0.6]], [[0.0, 0.0]], [[np.nan, 1.0]], np.zeros((0, 3))):
        with pytest.raises(ValueError, match="probs"):
            impl.random_sample(probs, {}, g)
    for gens in ({2: g}, {-1: g}, {0: np.random.RandomState(0)}, [g, g], {True: g}):
        with pytest.raises(ValueError, match="generators"):
            impl.random_sample(ok, gens, g)
    for shared in (None, np.random.RandomState(0), 0):
        with pytest.raises(ValueError, match="shared"):
            impl.random_sample(ok, {}, shared)

    s = impl.SeededBatchSampler()
    s.add_request("a", 1.0, seed=0)
    for rid in ("", 3, None, "a"):
        with pytest.raises(ValueError, match="request_id"):
            s.add_request(rid, 1.0)
    for t in (-0.5, float("nan"), float("inf"), True, "1.0", None):
        with pytest.raises(ValueError, match="temperature"):
            s.add_request("b", t)
    for seed in (-1, 1.5, True, "7"):
        with pytest.raises(ValueError, match="seed"):
            s.add_request("b", 1.0, seed=seed)
    with pytest.raises(ValueError, match="request_id"):
        s.remove_request("b")  # every refused add left nothing behind
    for ids in (["a", "a"], ["zz"], "a"):
        with pytest.raises(ValueError, match="request_ids"):
            s.sample(ids, np.zeros((len(ids), 3)))
        with pytest.raises(ValueError, match="request_ids"):
            s.generators_for(ids)
    for logits in (np.zeros((2, 3)), np.zeros(3), [[np.inf, 0.0, 0.0]], np.zeros((1, 0))):
        with pytest.raises(ValueError, match="logits"):
            s.sample(["a"], logits)
    with pytest.raises(ValueError, match="seed"):
        impl.SeededBatchSampler(seed=-1)


def test_inputs_are_not_modified():
    probs = np.tile(P5[:5] / P5[:5].sum(), (3, 1))
    p0 = probs.copy()
    impl.random_sample(probs, {1: np.random.default_rng(0)}, np.random.default_rng(1))
    np.testing.assert_array_equal(probs, p0)
    s = impl.SeededBatchSampler()
    s.add_request("a", 0.5, seed=1)
    s.add_request("b", 0.0)
    logits = LOGITS_A[:2].copy()
    s.sample(["a", "b"], logits)
    np.testing.assert_array_equal(logits, LOGITS_A[:2])


def test_a_temperature_of_exactly_sampling_eps_is_a_seeded_random_row():
    # Upstream: temperature < _SAMPLING_EPS is greedy, so 1e-5 itself samples: the seeded
    # request gets its generator, and that generator (not the shared one) moves by one row.
    s = impl.SeededBatchSampler(seed=0)
    s.add_request("edge", impl.SAMPLING_EPS, seed=4)
    assert set(s.generators_for(["edge"])) == {0}
    before = state(s.shared)
    s.sample(["edge"], np.array([[0.0, 1e-5, 2e-5]]))
    assert state(s.shared) == before
    assert state(s.generators_for(["edge"])[0]) == advanced(4, 3)
