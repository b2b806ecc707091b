"""Lab 09-03 tests: beam search on a fixture, against brute force, then vLLM's loop on mini_vllm.

Every random chain comes from a fixed seed. Probabilities in comments are exact products of
the fixtures' entries; the tests compare log probabilities to 1e-12 (or 1e-9 through the engine,
which sums float64 log-softmaxes).
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import io
import itertools
import math
import pathlib
import runpy
import types

import numpy as np
import pytest

import course
from course import load_impl
from mini_vllm.engine import LLM
from mini_vllm.sampling_params import SamplingParams

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
BEAM_DIR = UPSTREAM / "vllm/entrypoints/generate/beam_search"
S, A, B, C, D, EOS = range(6)  # TRAP's tokens (also exported by the lab file)
ln = math.log


def chain(rows: dict[int, dict[int, float]], vocab: int) -> np.ndarray:
    """A [vocab, vocab] log-prob table from {token: {next: p}}; unlisted rows go to the last id (EOS)."""
    probs = np.zeros((vocab, vocab))
    for i in range(vocab):
        for j, p in rows.get(i, {vocab - 1: 1.0}).items():
            probs[i, j] = p
    assert np.allclose(probs.sum(1), 1.0)
    with np.errstate(divide="ignore"):
        return np.log(probs)


def fn_of(table: np.ndarray):
    """The next-token function of a Markov table: the row of the last token."""
    return lambda tokens: table[tokens[-1]]


def recording(fn):
    def wrapped(tokens):
        wrapped.calls.append(tuple(tokens))
        return fn(tokens)

    wrapped.calls = []
    return wrapped


def dense_chain(seed: int, vocab: int = 3) -> np.ndarray:
    """A random Markov chain with every transition possible (no ties, no zeros)."""
    return np.log(np.random.default_rng(seed).dirichlet(np.ones(vocab), size=vocab))


def pairs(beams) -> list[tuple[list[int], float]]:
    return [(list(b.tokens), b.cum_logprob) for b in beams]


# EARLY: greedy takes A (0.55) over ending at once (0.45), then only halves are left.
EARLY = chain({0: {1: 0.55, 4: 0.45}, 1: {2: 0.5, 3: 0.5}}, 5)  # S=0 A=1 B=2 C=3 EOS=4

# WIDER: width 2 finds 0.10, width 3 only 0.26/3. Step 1 from S=0: A .40, B .35, C .25.
# Step 2: A -> X .65 (0.26), G .25 (0.10), A3 .10; B -> four children of .25 (0.0875 each);
# C -> C1 .52 (0.13), C2 .48 (0.12). Width 2 keeps {X, G} from A's and B's children; width 3
# also sees C1 and C2, which outrank G, and keeps {X, C1, C2}. Step 3: G -> G2 with
# certainty (0.10); X -> three children of 1/3 (0.0867); C1, C2 -> three thirds (<= 0.0433).
S0, WA, WB, WC, WX, WG, WA3 = range(7)
WB_KIDS, (WC1, WC2, WG2), WX_KIDS = (7, 8, 9, 10), (11, 12, 13), (14, 15, 16)
WC1_KIDS, WC2_KIDS, WEOS = (17, 18, 19), (20, 21, 22), 23
WIDER = chain({
    S0: {WA: 0.40, WB: 0.35, WC: 0.25},
    WA: {WX: 0.65, WG: 0.25, WA3: 0.10},
    WB: dict.fromkeys(WB_KIDS, 0.25),
    WC: {WC1: 0.52, WC2: 0.48},
    WG: {WG2: 1.0},
    WX: dict.fromkeys(WX_KIDS, 1 / 3),
    WC1: dict.fromkeys(WC1_KIDS, 1 / 3),
    WC2: dict.fromkeys(WC2_KIDS, 1 / 3),
}, 24)

# LEN: after the prompt's last token S, A and B are equally likely (0.5). A ends at once;
# B -> X -> Y -> Z continue with 0.7 each (0.3 to EOS at every step). P pads the prompt.
LS, LA, LB, LX, LY, LZ, LP, LEOS = range(8)
LEN = chain({LS: {LA: 0.5, LB: 0.5}, LA: {LEOS: 1.0}, LB: {LX: 0.7, LEOS: 0.3},
             LX: {LY: 0.7, LEOS: 0.3}, LY: {LZ: 0.7, LEOS: 0.3}, LP: {LS: 1.0}}, 8)


def markov_llm(table, **kwargs) -> LLM:
    return LLM(impl.MarkovLM(table, eos_token_id=len(table) - 1), **kwargs)


@functools.lru_cache(maxsize=1)
def tiny_llm() -> LLM:
    return LLM("tiny-random", block_size=4)


# ---------------------------------------------------------------- Part 1: greedy, beam, brute force on TRAP


def test_trap_greedy_takes_the_likelier_first_step_into_the_trap():
    beam = impl.greedy_decode(impl.trap_logprobs, [S], 3, EOS)
    assert beam.tokens == [S, A, C, EOS]
    assert beam.cum_logprob == pytest.approx(ln(0.6 * 0.51), abs=1e-12)  # 0.306


def test_trap_width_2_finds_b_then_c():
    beams = impl.beam_search(impl.trap_logprobs, [S], 2, 3, EOS)
    # step 2 ranks A C 0.306, A D 0.294, B C 0.36, B D 0.04: B C and A C survive
    assert [b.tokens for b in beams] == [[S, B, C, EOS], [S, A, C, EOS]]
    assert beams[0].cum_logprob == pytest.approx(ln(0.4 * 0.9), abs=1e-12)  # 0.36
    assert beams[1].cum_logprob == pytest.approx(ln(0.306), abs=1e-12)


def test_brute_force_agrees_with_width_2_on_trap():
    best = impl.brute_force_best(impl.trap_logprobs, [S], 3, EOS)
    assert best.tokens == [S, B, C, EOS]
    assert best.cum_logprob == pytest.approx(ln(0.36), abs=1e-12)
    # on a tie the first sequence found (token-id order) wins: A and B are both 0.5
    tie = chain({0: {1: 0.5, 2: 0.5}}, 4)  # S=0 A=1 B=2 EOS=3
    assert impl.brute_force_best(fn_of(tie), [0], 2, 3).tokens == [0, 1, 3]


def test_width_1_equals_greedy():
    greedy = impl.greedy_decode(impl.trap_logprobs, [S], 3, EOS)
    (beam,) = impl.beam_search(impl.trap_logprobs, [S], 1, 3, EOS)
    assert beam.tokens == greedy.tokens
    assert beam.cum_logprob == pytest.approx(greedy.cum_logprob, abs=1e-12)
    # and on ten random 5-token chains with no EOS (id 99 never occurs), over 6 steps; with an
    # EOS the two can differ (test_a_finished_beam_competes_at_the_end)
    for seed in range(10):
        fn = fn_of(dense_chain(seed, 5))
        greedy = impl.greedy_decode(fn, [0, 1], 6, 99)
        (beam,) = impl.beam_search(fn, [0, 1], 1, 6, 99)
        assert beam.tokens == greedy.tokens, seed
        assert beam.cum_logprob == pytest.approx(greedy.cum_logprob, abs=1e-12)


def test_wider_is_never_worse_on_trap():
    best = [impl.beam_search(impl.trap_logprobs, [S], w, 3, EOS)[0].cum_logprob for w in range(1, 7)]
    assert best == sorted(best)
    assert best[0] == pytest.approx(ln(0.306), abs=1e-12)
    assert best[1:] == pytest.approx([ln(0.36)] * 5, abs=1e-12)


def test_wider_can_be_worse():
    fn = fn_of(WIDER)
    found = {w: impl.beam_search(fn, [S0], w, 4, WEOS)[0] for w in (1, 2, 3, 4)}
    assert found[2].tokens == [S0, WA, WG, WG2, WEOS]
    assert found[2].cum_logprob == pytest.approx(ln(0.40 * 0.25), abs=1e-12)  # 0.10
    assert found[3].tokens == [S0, WA, WX, WX_KIDS[0], WEOS]
    assert found[3].cum_logprob == pytest.approx(ln(0.40 * 0.65 / 3), abs=1e-12)  # 0.0867 < 0.10
    assert found[1].cum_logprob == pytest.approx(found[3].cum_logprob, abs=1e-12)
    assert found[4].cum_logprob == pytest.approx(ln(0.10), abs=1e-12)
    assert impl.brute_force_best(fn, [S0], 4, WEOS).cum_logprob == pytest.approx(ln(0.10), abs=1e-12)


def test_eos_finishes_a_beam_and_the_search_stops():
    fn = recording(impl.trap_logprobs)
    beams = impl.beam_search(fn, [S], 2, 10, EOS)
    assert [b.tokens for b in beams] == [[S, B, C, EOS], [S, A, C, EOS]]
    # step 1 asks about [S]; step 2 about [S A], [S B]; step 3 about the two survivors;
    # after step 3 every candidate ended in EOS, so there is no step 4
    assert len(fn.calls) == 5
    assert all(call[-1] != EOS for call in fn.calls)
    greedy = recording(impl.trap_logprobs)
    assert impl.greedy_decode(greedy, [S], 10, EOS).tokens == [S, A, C, EOS]
    assert len(greedy.calls) == 3


def test_a_finished_beam_competes_at_the_end():
    # EARLY: greedy takes A (0.55) and ends at 0.275. Width 1 keeps only A alive too, but
    # sets [S, EOS] (0.45) aside as finished, and it wins at the end: width 1 beats greedy.
    fn = fn_of(EARLY)
    greedy = impl.greedy_decode(fn, [0], 3, 4)
    assert greedy.tokens == [0, 1, 2, 4] and greedy.cum_logprob == pytest.approx(ln(0.275), abs=1e-12)
    (beam,) = impl.beam_search(fn, [0], 1, 3, 4)
    assert beam.tokens == [0, 4] and beam.cum_logprob == pytest.approx(ln(0.45), abs=1e-12)
    best = impl.brute_force_best(fn, [0], 3, 4)
    assert best.tokens == [0, 4]
    assert [b.tokens for b in impl.beam_search(fn, [0], 3, 3, 4)] == [[0, 4], [0, 1, 2, 4], [0, 1, 3, 4]]


def test_max_tokens_caps_the_sequences():
    fn = fn_of(dense_chain(7, 4))  # EOS = 3
    for max_tokens in (1, 2, 3):
        best = impl.brute_force_best(fn, [0], max_tokens, 3)
        assert len(best.tokens) - 1 <= max_tokens
        beams = impl.beam_search(fn, [0], 2, max_tokens, 3)
        assert all(len(b.tokens) - 1 <= max_tokens for b in beams)
        assert len(beams) == 2
    # one step: the best single token, EOS included
    assert impl.brute_force_best(fn, [0], 1, 3).tokens == [0, int(np.argmax(fn([0])))]


def test_wide_beams_are_exact():
    # 3 tokens + EOS, 3 steps: at most 3 * 3 = 9 live beams after step 2, so width 9 prunes
    # nothing that could matter and finds the brute-force best on every chain
    for seed in range(8):
        fn = fn_of(dense_chain(100 + seed, 4))
        best = impl.brute_force_best(fn, [1], 3, 3)
        (top, *_) = impl.beam_search(fn, [1], 9, 3, 3)
        assert top.tokens == best.tokens, seed
        assert top.cum_logprob == pytest.approx(best.cum_logprob, abs=1e-12)


def test_part_1_bad_arguments_name_the_parameter():
    fn = impl.trap_logprobs
    with pytest.raises(ValueError, match="prompt"):
        impl.greedy_decode(fn, [], 3, EOS)
    with pytest.raises(ValueError, match="max_tokens"):
        impl.greedy_decode(fn, [S], 0, EOS)
    with pytest.raises(ValueError, match="beam_width"):
        impl.beam_search(fn, [S], 0, 3, EOS)
    with pytest.raises(ValueError, match="beam_width"):
        impl.beam_search(fn, [S], 1.5, 3, EOS)
    with pytest.raises(ValueError, match="max_tokens"):
        impl.beam_search(fn, [S], 2, -1, EOS)
    with pytest.raises(ValueError, match="prompt"):
        impl.brute_force_best(fn, [], 3, EOS)
    with pytest.raises(ValueError, match="max_tokens"):
        impl.brute_force_best(fn, [S], True, EOS)


def test_script_prints_the_readme_lines():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(pathlib.Path(impl.__file__)), run_name="__main__")
    assert buf.getvalue().splitlines() == [
        "greedy      : S A C EOS  p = 0.306",
        "beam width 1: S A C EOS  p = 0.306",
        "beam width 2: S B C EOS  p = 0.360",
        "brute force : S B C EOS  p = 0.360",
    ]


# ---------------------------------------------------------------- Part 2: the score


def test_score_by_hand():
    prompt = list(range(10))
    # 10 prompt tokens + 3 generated, no EOS: -2.6 / 13
    assert impl.beam_search_score(prompt + [4, 5, 6], -2.6, 99) == pytest.approx(-0.2, abs=1e-15)
    # the same ending in EOS: the EOS is not length, -2.6 / 12
    assert impl.beam_search_score(prompt + [4, 5, 99], -2.6, 99) == pytest.approx(-2.6 / 12, abs=1e-15)
    # length_penalty 0: the cumulative log probability itself; 2: divided by 13 ** 2
    assert impl.beam_search_score(prompt + [4, 5, 6], -2.6, 99, 0.0) == -2.6
    assert impl.beam_search_score(prompt + [4, 5, 6], -2.6, 99, 2.0) == pytest.approx(-2.6 / 169, abs=1e-15)
    assert impl.beam_search_score(prompt + [4, 5, 6], -2.6, 99, 0.5) == pytest.approx(-2.6 / math.sqrt(13))


def test_length_penalty_counts_the_prompt():
    # Two finished-or-not sequences after a 10-token prompt (P x 9, then S):
    #   [A, EOS]        cum ln 0.5 = -0.6931   length 10 + 2 - 1 = 11   score -0.0630
    #   [B, X, Y, Z]    cum ln 0.5 + 3 ln 0.7 = -1.7632   length 14     score -0.1259
    # Counting generated tokens only (1 and 4) would rank them the other way round:
    #   -0.6931 / 1 = -0.6931 against -1.7632 / 4 = -0.4408.
    prompt = [LP] * 9 + [LS]
    short, long_ = prompt + [LA, LEOS], prompt + [LB, LX, LY, LZ]
    c_short, c_long = ln(0.5), ln(0.5) + 3 * ln(0.7)
    assert impl.beam_search_score(short, c_short, LEOS) == pytest.approx(c_short / 11, abs=1e-15)
    assert impl.beam_search_score(long_, c_long, LEOS) == pytest.approx(c_long / 14, abs=1e-15)
    beams = impl.engine_beam_search(markov_llm(LEN), prompt, 2, 4)
    assert [b.tokens for b in beams] == [short, long_]
    assert [b.cum_logprob for b in beams] == pytest.approx([c_short, c_long], abs=1e-9)


def _upstream_score():
    """``get_beam_search_score`` read from upstream/ with ``ast`` (vllm is not imported)."""
    path = BEAM_DIR / "utils.py"
    fn = next(n for n in ast.parse(path.read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == "get_beam_search_score")
    namespace: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[fn.name]


@pytest.mark.upstream
def test_score_matches_upstream_on_2000_inputs():
    upstream = _upstream_score()
    rng = np.random.default_rng(909)
    eos_seen = 0
    for _ in range(2000):
        tokens = [int(t) for t in rng.integers(0, 6, int(rng.integers(2, 30)))]  # EOS = 5
        eos_seen += tokens[-1] == 5
        cum = -float(rng.exponential(5.0))
        penalty = float(rng.choice([0.0, 0.5, 1.0, 1.3, 2.0]))
        assert impl.beam_search_score(tokens, cum, 5, penalty) == upstream(tokens, cum, 5, penalty)
    assert eos_seen > 200  # both branches ran many times


# ---------------------------------------------------------------- Part 2: the loop on mini_vllm


def test_engine_runs_trap():
    llm = markov_llm(impl.TRAP_LOGPROBS)
    beams = impl.engine_beam_search(llm, [S], 2, 3, length_penalty=0.0)
    assert pairs(beams) == [([S, B, C, EOS], pytest.approx(ln(0.36), abs=1e-12)),
                            ([S, A, C, EOS], pytest.approx(ln(0.306), abs=1e-12))]
    (beam,) = impl.engine_beam_search(llm, [S], 1, 3)
    assert beam.tokens == [S, A, C, EOS]
    # EARLY through the engine: the EOS that greedy passes over wins, as in Part 1
    (beam,) = impl.engine_beam_search(markov_llm(EARLY), [0], 1, 3, length_penalty=0.0)
    assert beam.tokens == [0, 4]


def test_engine_width_1_equals_engine_greedy():
    llm = tiny_llm()
    prompt = list(range(1, 11))
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=8, logprobs=1))
    greedy = out[0].outputs[0]
    assert 256 not in greedy.token_ids  # no EOS on the way, so width 1 has nothing to set aside
    (beam,) = impl.engine_beam_search(llm, prompt, 1, 8)
    assert beam.tokens == prompt + list(greedy.token_ids)
    # the beam's requests reuse cached K/V that greedy's single request computed in one
    # prefill; float32 attention over the two layouts differs by ~1e-6 after 8 tokens
    assert beam.cum_logprob == pytest.approx(greedy.cumulative_logprob, abs=1e-5)


def _brute_force_ranking(table, prompt, max_tokens, eos, penalty):
    """Every sequence (ends in EOS, or has max_tokens tokens) with vLLM's score, best first."""
    ranked = []
    for n in range(1, max_tokens + 1):
        for tail in itertools.product(range(len(table)), repeat=n):
            if eos in tail[:-1] or (n < max_tokens and tail[-1] != eos):
                continue
            tokens = list(prompt) + list(tail)
            cum = sum(table[tokens[i - 1], tokens[i]] for i in range(len(prompt), len(tokens)))
            length = len(tokens) - (tail[-1] == eos)
            ranked.append((cum / length ** penalty, tuple(tokens)))
    ranked.sort(key=lambda x: x[0], reverse=True)
    return ranked


def test_engine_equals_brute_force_on_a_three_token_vocabulary():
    # vocabulary {0, 1, EOS = 2}, 3 steps: 2 live beams after step 1, 4 after step 2, so width
    # 4 prunes nothing that could reach the top 4; 2 * 4 = 8 logprobs cover the whole
    # vocabulary (mini_vllm returns all 3; upstream's topk would refuse k > V, a real model
    # never has 2 * width above its vocabulary). A Markov chain gives equal scores to
    # sequences with the same transitions in another order (1 1 0 1 and 1 0 1 1), so the
    # check is: the 4 best scores, each on a sequence that really has that score.
    for seed, penalty in [(0, 1.0), (1, 0.0), (2, 2.0), (3, 1.0), (4, 0.5)]:
        table = dense_chain(seed)
        ranked = _brute_force_ranking(table, [0, 1], 3, 2, penalty)
        score_of = {tokens: score for score, tokens in ranked}
        beams = impl.engine_beam_search(markov_llm(table), [0, 1], 4, 3, length_penalty=penalty)
        got = [score_of[tuple(b.tokens)] for b in beams]
        assert got == pytest.approx([score for score, _ in ranked[:4]], abs=1e-12), seed
        assert len(set(got)) >= 3, seed  # no run of ties hides the order


# THIRD: from S, A .4, B .35, and EOS third at .25. A -> C .5 | D .5; C, D, B -> EOS.
THIRD = chain({0: {1: 0.40, 2: 0.35, 6: 0.25}, 1: {3: 0.5, 4: 0.5}}, 7)  # S A B C D X EOS


def test_engine_takes_2_width_candidates_per_beam():
    # width 1 asks for exactly 2 logprobs: A and B; the EOS in third place (0.25) is never a
    # candidate, so the answer is S A C EOS (0.2). Asking for 3 would finish S EOS and return it.
    (beam,) = impl.engine_beam_search(markov_llm(THIRD), [0], 1, 3, length_penalty=0.0)
    assert beam.tokens == [0, 1, 3, 6]
    assert beam.cum_logprob == pytest.approx(ln(0.2), abs=1e-12)
    # 3 tokens + EOS, width 2: 2 * 2 = 4 logprobs cover the vocabulary, so with length_penalty
    # 0 the engine equals Part 1's beam search (every token a candidate). Width-many
    # candidates (2 per beam) would drop each beam's third option.
    for seed in range(6):
        table = dense_chain(40 + seed, 4)
        want = impl.beam_search(fn_of(table), [0], 2, 4, 3)
        got = impl.engine_beam_search(markov_llm(table), [0], 2, 4, length_penalty=0.0)
        assert [b.tokens for b in got] == [b.tokens for b in want], seed
        assert [b.cum_logprob for b in got] == pytest.approx([b.cum_logprob for b in want], abs=1e-9)


def test_each_beam_step_computes_at_most_one_block():
    # block 4, a 10-token prompt, width 3, 6 steps. Step k's requests hold L = 10 + k - 1
    # tokens; their parents computed the first L - 1, so every full block among those hits the
    # cache: each request computes L - 4 * floor((L - 1) / 4) tokens, between 1 and 4.
    llm = LLM("tiny-random", block_size=4)
    engine = llm.llm_engine
    prompt = list(range(1, 11))
    impl.engine_beam_search(llm, prompt, 3, 6)
    assert len(engine.stats) == 6  # one engine step per beam step
    per_step = []
    for k, stats in enumerate(engine.stats, start=1):
        length = 10 + k - 1
        new = length - 4 * ((length - 1) // 4) if k > 1 else 10
        per_step.append(stats.num_prefill_tokens)
        assert sorted(stats.num_scheduled_tokens.values()) == [new] * (1 if k == 1 else 3), k
        assert stats.num_cached_tokens == (0 if k == 1 else 3 * (length - new)), k
    assert per_step == [10, 9, 12, 3, 6, 9]  # 49 tokens computed in all
    # without prefix caching every request recomputes its whole sequence:
    # 10 + 3 * (11 + 12 + 13 + 14 + 15) = 205
    cold = LLM("tiny-random", block_size=4, enable_caching=False)
    impl.engine_beam_search(cold, prompt, 3, 6)
    assert [s.num_prefill_tokens for s in cold.llm_engine.stats] == [10, 33, 36, 39, 42, 45]


class _CountingEngine:
    """An LLMEngine stand-in that forwards to a real one and records each generate call's size."""

    def __init__(self, engine) -> None:
        self.engine, self.model, self.calls = engine, engine.model, []

    def generate(self, prompts, params=None):
        self.calls.append(len(prompts))
        return self.engine.generate(prompts, params)


def test_engine_runs_every_step_even_after_the_best_beams_finished():
    # TRAP's best sequences end at step 3, yet a request returns 2 * width distinct tokens, at
    # most one of them EOS, so every beam leaves 2 * width - 1 live candidates (here of
    # probability 0) and the live set never empties: upstream's loop, which has no early stop,
    # sends a batch at each of the 10 steps
    engine = _CountingEngine(markov_llm(impl.TRAP_LOGPROBS).llm_engine)
    beams = impl.engine_beam_search(engine, [S], 2, 10, length_penalty=0.0)
    assert [b.tokens for b in beams] == [[S, B, C, EOS], [S, A, C, EOS]]
    assert engine.calls == [1] + [2] * 9


def test_engine_bad_arguments_name_the_parameter():
    llm = markov_llm(impl.TRAP_LOGPROBS)
    with pytest.raises(ValueError, match="beam_width"):
        impl.engine_beam_search(llm, [S], 0, 3)
    with pytest.raises(ValueError, match="max_tokens"):
        impl.engine_beam_search(llm, [S], 2, 0)
    with pytest.raises(ValueError, match="prompt"):
        impl.engine_beam_search(llm, [], 2, 3)


# ---------------------------------------------------------------- Part 2: against upstream's own loop


@functools.lru_cache(maxsize=1)
def _upstream_offline_beam_search():
    """``BeamSearchOfflineMixin.beam_search`` and its helpers, read from upstream/ with ``ast``.

    vllm is never imported: its type names become ``dict`` or ``object``, ``SamplingParams``
    becomes mini_vllm's (dropping ``skip_clone``), and the method runs on ``_Shim`` below,
    which hands the requests to a mini_vllm ``LLM``.
    """
    def sampling_params(skip_clone=False, **kwargs):
        return SamplingParams(**kwargs)

    namespace = {
        "dataclass": dataclasses.dataclass, "itertools": itertools, "tqdm": None, "logger": None,
        "TokensInput": dict, "MultiModalInput": dict, "EncoderDecoderInput": dict,
        "DecoderOnlyEngineInput": dict, "TokensPrompt": dict, "TextPrompt": dict,
        "Logprob": object, "LoRARequest": object, "BeamSearchParams": object, "RequestOutput": object,
        "SamplingParams": sampling_params,
        "tokens_input": lambda tokens, prompt=None, cache_salt=None: {"type": "token",
                                                                      "prompt_token_ids": tokens},
    }
    utils = ast.parse((BEAM_DIR / "utils.py").read_text())
    body = [n for n in utils.body if isinstance(n, ast.ClassDef | ast.FunctionDef)]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(BEAM_DIR / "utils.py"), "exec"), namespace)
    offline = ast.parse((BEAM_DIR / "offline.py").read_text())
    mixin = next(n for n in offline.body if isinstance(n, ast.ClassDef))
    body = [n for n in mixin.body if isinstance(n, ast.FunctionDef) and n.name == "beam_search"]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(BEAM_DIR / "offline.py"), "exec"), namespace)
    return namespace["beam_search"]


class _Shim:
    """What upstream's ``beam_search`` needs from ``self``, served by a mini_vllm ``LLM``."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        tokenizer = types.SimpleNamespace(eos_token_id=llm.llm_engine.model.eos_token_id,
                                          decode=lambda ids: "")
        self.renderer = types.SimpleNamespace(get_tokenizer=lambda: tokenizer)

    def _preprocess_cmpl(self, prompts):
        return [{"type": "token", "prompt_token_ids": list(p["prompt_token_ids"])} for p in prompts]

    def _lora_request_to_seq(self, lora_request, n):
        return [None] * n

    def _params_to_seq(self, params, n):
        return [params] * n

    def _render_and_run_requests(self, prompts, params, output_type, lora_requests, use_tqdm):
        return self.llm.generate([{"prompt_token_ids": p["prompt_token_ids"]} for p in prompts], list(params))


@pytest.mark.upstream
def test_engine_equals_upstreams_own_loop():
    upstream = _upstream_offline_beam_search()
    cases = [(tiny_llm(), list(range(1, 11)), 3, 5, 1.0), (tiny_llm(), [7, 8, 9], 2, 4, 2.0),
             (markov_llm(LEN), [LP] * 9 + [LS], 2, 4, 1.0), (markov_llm(LEN), [LS], 3, 5, 0.5),
             (markov_llm(dense_chain(5, 5)), [0], 2, 5, 1.0)]
    for llm, prompt, width, max_tokens, penalty in cases:
        params = types.SimpleNamespace(beam_width=width, max_tokens=max_tokens, temperature=0.0,
                                       ignore_eos=False, length_penalty=penalty)
        (want,) = upstream(_Shim(llm), [{"prompt_token_ids": prompt}], params)
        got = impl.engine_beam_search(llm, prompt, width, max_tokens, length_penalty=penalty)
        assert pairs(got) == [(s.tokens, s.cum_logprob) for s in want.sequences], (prompt, width)


def test_engine_equals_mini_vllm_llm_beam_search():
    if not hasattr(LLM, "beam_search"):
        pytest.skip("mini_vllm has no LLM.beam_search yet (Phase 09 adds it in mini_vllm/beam_search.py)")
    from mini_vllm.beam_search import BeamSearchParams

    for llm, prompt, width, penalty in [(tiny_llm(), list(range(1, 11)), 3, 1.0),
                                        (markov_llm(LEN), [LP] * 9 + [LS], 2, 1.0),
                                        (markov_llm(dense_chain(5, 5)), [0], 2, 0.5)]:
        (out,) = llm.beam_search([{"prompt_token_ids": prompt}],
                                 BeamSearchParams(beam_width=width, max_tokens=4, length_penalty=penalty))
        got = impl.engine_beam_search(llm, prompt, width, 4, length_penalty=penalty)
        assert pairs(got) == [(list(s.tokens), s.cum_logprob) for s in out.sequences]
