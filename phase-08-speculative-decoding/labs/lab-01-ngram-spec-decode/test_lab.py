"""Lab 08-01 tests: vLLM's n-gram proposer rule for rule, greedy verification, exact counts."""
from __future__ import annotations

import ast
import contextlib
import functools
import io
import math
import pathlib
import runpy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
NGRAM = UPSTREAM / "vllm/v1/spec_decode/ngram_proposer.py"


def propose(tokens, min_n, max_n, k, max_model_len=1024):
    return impl.ngram_propose(tokens, min_n, max_n, k, max_model_len)


def periodic(tokens):
    """Greedy target whose text cycles 0, 1, ..., 6, 0, 1, ... (the next token is last + 1 mod 7)."""
    return (tokens[-1] + 1) % 7


def recording(target):
    """Wrap ``target`` so every context it is asked about is kept, as a tuple, in ``.calls``."""
    def wrapped(tokens):
        wrapped.calls.append(tuple(tokens))
        return target(tokens)

    wrapped.calls = []
    return wrapped


def random_sequence(vocab, length, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]


# ---------------------------------------------------------------- the proposer: upstream's cases


def test_upstream_unit_cases():
    # tests/v1/spec_decode/test_ngram.py:16, values copied from there
    assert propose([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2) == []  # the suffix [5, 6] never occurred
    tokens = [1, 2, 3, 4, 1, 2, 3]
    assert propose(tokens, 2, 2, 3) == [4, 1, 2]
    assert propose(tokens, 2, 2, 2) == [4, 1]
    assert propose(tokens, 1, 1, 3) == [4, 1, 2]
    assert propose(tokens, 1, 1, 2) == [4, 1]
    # n = 1: the suffix "3" occurs earlier at indices 1 and 4. Upstream takes index 1 and
    # proposes [6, 2] ("Return on the first match"); the most recent copy would give [4, 1].
    tokens = [1, 3, 6, 2, 3, 4, 1, 2, 3]
    assert propose(tokens, 2, 2, 3) == [4, 1, 2]
    assert propose(tokens, 1, 1, 2) == [6, 2]


def test_earliest_occurrence_wins_among_equal_lengths():
    # tests/v1/spec_decode/test_ngram.py: three earlier copies of [1, 2, 3]; the first is
    # followed by 100, the last by 300. Upstream proposes [100, 1].
    tokens = [1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3]
    assert propose(tokens, 3, 3, 2) == [100, 1]
    # the same with n in [1, 3]: 3 is the longest length, and its first copy still wins
    assert propose(tokens, 1, 3, 3) == [100, 1, 2]


def test_longest_length_in_range_wins():
    # n in [3, 4]: [1, 2, 3, 4] (n = 4) occurs at index 4; [2, 3, 4] (n = 3) already at index 0.
    # The longer match wins even though the shorter one is earlier: [1, 2], not [5, 1].
    assert propose([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2) == [1, 2]
    # n in [2, 4]: no 4-gram, the 3-gram [2, 3, 4] at index 3 beats the 2-gram [3, 4] at 0
    assert propose([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2) == [1, 2]
    # n in [3, 4]: no 4-gram match, so fall back to n = 3 ([1, 2, 3] at index 0)
    assert propose([1, 2, 3, 4, 1, 2, 3], 3, 4, 2) == [4, 1]
    # only n = 4 allowed: nothing
    assert propose([1, 2, 3, 4, 1, 2, 3], 4, 4, 2) == []


def test_the_suffix_never_matches_itself():
    # every n-gram occurs once, as the suffix: no proposal (a scan that lets the suffix match
    # itself finds it at the end, and the tokens after the end are none)
    assert propose([1, 2, 3], 1, 3, 3) == []
    assert propose([9], 1, 1, 3) == []
    # [5, 5]: the suffix [5] occurs at index 0, which ends before the last token
    assert propose([5, 5], 1, 2, 3) == [5]
    # [1, 1, 1, 1], n <= 3: the 3-gram at index 0 overlaps the suffix and counts; only one
    # token (index 3) follows it, so one draft although k = 5
    assert propose([1, 1, 1, 1], 1, 3, 5) == [1]
    # n = 4 is longer than any earlier occurrence can be (T - 1 = 3): falls back to n = 3
    assert propose([7, 7, 7, 7], 3, 4, 2) == [7]


def test_drafts_stop_at_the_end_of_the_context():
    # [2, 3] matches at index 1; four tokens follow it ([4, 1, 2, 3]): k = 10 gives those four
    assert propose([1, 2, 3, 4, 1, 2, 3], 2, 2, 10) == [4, 1, 2, 3]


def test_drafts_stop_at_max_model_len():
    tokens = [1, 2, 3, 1, 2]  # [1, 2] at index 0: the continuation is [3, 1, 2]
    assert propose(tokens, 2, 2, 5, max_model_len=100) == [3, 1, 2]
    assert propose(tokens, 2, 2, 5, max_model_len=7) == [3, 1]  # room for 7 - 5 = 2
    assert propose(tokens, 2, 2, 5, max_model_len=6) == [3]
    assert propose(tokens, 2, 2, 5, max_model_len=5) == []  # the context is full


def test_short_context_and_zero_k():
    assert propose([], 1, 3, 3) == []
    assert propose([4, 4], 3, 3, 3) == []  # T = 2 < min_n = 3
    assert propose([1, 2, 1], 1, 1, 0) == []


def test_accepts_arrays_and_returns_python_ints():
    out = propose(np.array([1, 2, 3, 4, 1, 2, 3], dtype=np.int32), 2, 2, 3)
    assert out == [4, 1, 2] and isinstance(out, list)
    assert all(type(t) is int for t in out)


def test_ngram_bad_arguments_name_the_parameter():
    for args, name in [(([1.5, 2.0], 1, 1, 1, 10), "tokens"),
                       (([[1, 2], [1, 2]], 1, 1, 1, 10), "tokens"),
                       (([1, 2, 3], 1, 1, 1, 2), "tokens"),
                       (([1, 2], 0, 1, 1, 10), "min_n"),
                       (([1, 2], 3, 2, 1, 10), "max_n"),
                       (([1, 2], 1, 2, -1, 10), "k"),
                       (([1, 2], 1, 2, True, 10), "k"),
                       (([], 1, 2, 1, 0), "max_model_len")]:
        with pytest.raises(ValueError, match=name):
            impl.ngram_propose(*args)


# ---------------------------------------------------------------- the proposer against upstream's own code


@functools.lru_cache(maxsize=1)
def _upstream_proposer():
    """``_find_longest_matched_ngram_and_propose_tokens`` read from upstream/ with ``ast``.

    The function is plain numpy under a numba ``@jit``; the decorator is dropped, so
    neither vllm nor numba is imported and it runs as ordinary (slower) Python.
    """
    tree = ast.parse(NGRAM.read_text())
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef)
              and node.name == "_find_longest_matched_ngram_and_propose_tokens")
    fn.decorator_list = []
    namespace = {"np": np}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(NGRAM), "exec"), namespace)
    upstream = namespace[fn.name]

    def call(tokens, min_n, max_n, k, max_model_len):
        out = upstream(origin_tokens=np.asarray(tokens, dtype=np.int64), min_ngram=min_n,
                       max_ngram=max_n, max_model_len=max_model_len, k=k)
        return [int(t) for t in out]

    return call


@pytest.mark.upstream
def test_matches_upstream_on_2000_random_contexts():
    upstream = _upstream_proposer()
    rng = np.random.default_rng(2026)
    # small vocabularies (1 to 5 symbols) so that long, repeated and overlapping matches
    # are common; max_model_len from "full" to 7 tokens of room
    kinds = set()
    for _ in range(2000):
        length, vocab = int(rng.integers(0, 40)), int(rng.integers(1, 6))
        tokens = rng.integers(0, vocab, length)
        min_n = int(rng.integers(1, 5))
        max_n = min_n + int(rng.integers(0, 4))
        k, room = int(rng.integers(0, 7)), int(rng.integers(0, 8))
        args = (tokens, min_n, max_n, k, max(1, length + room))
        want = upstream(*args)
        assert impl.ngram_propose(*args) == want, args
        kinds.add(min(len(want), 2))
    assert kinds == {0, 1, 2}  # empty, single and longer proposals all occurred


@pytest.mark.upstream
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=30), min_n=st.integers(1, 4),
       extra=st.integers(0, 3), k=st.integers(0, 6), room=st.integers(0, 6))
def test_matches_upstream_on_hypothesis_contexts(tokens, min_n, extra, k, room):
    args = (tokens, min_n, min_n + extra, k, max(1, len(tokens) + room))
    assert impl.ngram_propose(*args) == _upstream_proposer()(*args)


# ---------------------------------------------------------------- greedy verification


def test_verify_accepts_the_matching_prefix_then_adds_one_target_token():
    context = [3, 4]  # periodic continues 5, 6, 0, 1
    # all three drafts right: they are kept, and the bonus token 1 follows
    assert impl.verify_greedy(context, [5, 6, 0], periodic) == ([5, 6, 0, 1], 3)
    # the second draft is wrong: keep 5, emit the correction 6, drop the rest
    assert impl.verify_greedy(context, [5, 2, 0], periodic) == ([5, 6], 1)
    # the first draft is wrong: one token, exactly what plain decoding emits
    assert impl.verify_greedy(context, [9, 6, 0], periodic) == ([5], 0)
    # no drafts: one plain decoding step
    assert impl.verify_greedy(context, [], periodic) == ([5], 0)


def test_verify_asks_the_target_about_the_growing_context():
    target = recording(periodic)
    impl.verify_greedy([3, 4], [5, 6, 2, 1], target)
    # drafts 5 and 6 accepted, 2 rejected: three questions, each one token longer.
    # Checking every draft against target([3, 4]) (the frozen context) rejects 6.
    assert target.calls == [(3, 4), (3, 4, 5), (3, 4, 5, 6)]
    target = recording(periodic)
    impl.verify_greedy([0], [1, 2], target)
    assert target.calls == [(0,), (0, 1), (0, 1, 2)]  # the last call is the bonus token


def test_verify_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="context"):
        impl.verify_greedy([], [1], periodic)
    with pytest.raises(ValueError, match="proposed"):
        impl.verify_greedy([1], [0.5], periodic)
    with pytest.raises(ValueError, match="target"):
        impl.verify_greedy([1], [2], None)


# ---------------------------------------------------------------- the loop: exact counts


def test_periodic_text_exact_counts():
    # prompt [0], period 7, k = 4, n in [1, 3], 40 tokens. Runs 1-7 emit 1, 2, ..., 6, 0 one
    # at a time: no suffix occurred before (the first period has no repeats). From then on
    # every suffix has an earlier copy followed by the right four tokens: 4 drafts, all
    # accepted, plus the bonus = 5 tokens per run. 7 + 6 * 5 = 37, 3 tokens left: the last
    # run's drafts are trimmed to 2 (it may emit 3). Runs 7 + 6 + 1 = 14; accepted 6*4 + 2 = 26.
    out, stats = impl.run_speculative([0], periodic, 40, k=4, min_n=1, max_n=3)
    assert out == [(i + 1) % 7 for i in range(40)]
    assert stats == {"num_runs": 14, "num_drafts": 7, "num_draft_tokens": 26,
                     "num_accepted_tokens": 26, "num_accepted_tokens_per_pos": [7, 7, 6, 6]}
    assert impl.tokens_per_run(stats) == 40 / 14  # 2.857
    assert impl.mean_acceptance_length(stats) == 1 + 26 / 7  # 4.714: no-draft runs left out


def test_speculative_output_equals_baseline():
    table = np.random.default_rng(3).integers(0, 16, (16, 16))

    def markov(tokens):  # a content-driven greedy "model": next = table[previous two]
        return int(table[tokens[-2], tokens[-1]])

    sequence = random_sequence(50, 121, seed=0)
    cases = [([0], periodic), ([1, 2], markov), (sequence[:1], impl.replay_target(sequence))]
    for prompt, target in cases:
        base = impl.run_baseline(prompt, target, 120)
        assert len(base) == 120
        for k, min_n, max_n in [(1, 1, 1), (3, 1, 3), (4, 2, 4), (7, 5, 5)]:
            out, stats = impl.run_speculative(prompt, target, 120, k=k, min_n=min_n, max_n=max_n)
            assert out == base, (prompt, k, min_n, max_n)
            assert len(out) == stats["num_accepted_tokens"] + stats["num_runs"]


def test_a_looping_target_needs_far_fewer_runs():
    # the markov target's text falls into a cycle of 19 tokens after 2; from the second lap on
    # nearly every run accepts all 4 drafts: 100 tokens in 35 runs (65 drafts accepted)
    table = np.random.default_rng(3).integers(0, 16, (16, 16))
    out, stats = impl.run_speculative([1, 2], lambda t: int(table[t[-2], t[-1]]), 100,
                                      k=4, min_n=1, max_n=3)
    assert out[2:21] == out[21:40] and stats["num_runs"] == 35
    assert stats["num_accepted_tokens_per_pos"] == [17, 16, 16, 16]


def test_random_text_needs_one_run_per_token():
    # 200 tokens drawn from 1,000 ids: about 200^2 / (2 * 1000) = 20 ids repeat, so the
    # proposer does find matches (14 runs draft 53 tokens), but what followed a token once
    # says nothing about what follows it now: none accepted, 200 runs for 200 tokens
    sequence = random_sequence(1000, 201, seed=1)
    out, stats = impl.run_speculative(sequence[:1], impl.replay_target(sequence), 200,
                                      k=4, min_n=1, max_n=3)
    assert out == sequence[1:]
    assert stats["num_runs"] == 200 and stats["num_accepted_tokens"] == 0
    assert (stats["num_drafts"], stats["num_draft_tokens"]) == (14, 53)
    assert stats["num_accepted_tokens_per_pos"] == [0, 0, 0, 0]
    assert impl.tokens_per_run(stats) == 1.0 and impl.mean_acceptance_length(stats) == 1.0
    # 50 ids: drafts in 149 of 199 runs. A first draft is right by chance 1 time in 50, so
    # about 3 lucky runs are expected; this seed has one (1 of 584 drafts): 199 runs
    sequence = random_sequence(50, 201, seed=0)
    out, stats = impl.run_speculative(sequence[:1], impl.replay_target(sequence), 200,
                                      k=4, min_n=1, max_n=3)
    assert (stats["num_runs"], stats["num_accepted_tokens"], stats["num_draft_tokens"]) == (199, 1, 584)


def test_no_run_looks_past_max_model_len():
    # period 7, max_model_len 18. Runs 1-7 emit one token each (8 tokens in the context);
    # run 8 has room for 10: 5 drafts + the bonus (14 tokens); run 9 has room for 4: the
    # proposer caps its drafts at 4, the loop keeps 3 so that the bonus token is the 18th.
    target = recording(periodic)
    out, stats = impl.run_speculative([0], target, 100, k=5, min_n=1, max_n=2, max_model_len=18)
    assert out == [(i + 1) % 7 for i in range(17)]
    assert (stats["num_runs"], stats["num_draft_tokens"]) == (9, 5 + 3)
    # the target is never asked about an 18-token context (its answer would be token 19)
    assert max(len(c) for c in target.calls) == 17
    assert impl.run_baseline([0], periodic, 100, max_model_len=18) == out


def test_k_zero_is_plain_decoding():
    out, stats = impl.run_speculative([0], periodic, 30, k=0)
    assert out == impl.run_baseline([0], periodic, 30)
    assert stats == {"num_runs": 30, "num_drafts": 0, "num_draft_tokens": 0,
                     "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    assert impl.tokens_per_run(stats) == 1.0
    assert math.isnan(impl.mean_acceptance_length(stats))


def test_loop_bad_arguments_name_the_parameter():
    for kwargs, name in [({"prompt": []}, "prompt"),
                         ({"prompt": [1] * 1024}, "prompt"),
                         ({"num_tokens": 0}, "num_tokens"),
                         ({"target": "periodic"}, "target"),
                         ({"max_model_len": 0}, "max_model_len")]:
        args = {"prompt": [1], "target": periodic, "num_tokens": 5, **kwargs}
        with pytest.raises(ValueError, match=name):
            impl.run_baseline(**args)
        with pytest.raises(ValueError, match=name):
            impl.run_speculative(**args)
    for kwargs, name in [({"k": -1}, "k"), ({"k": 1.5}, "k"), ({"min_n": 0}, "min_n"),
                         ({"max_n": 0}, "max_n")]:
        with pytest.raises(ValueError, match=name):
            impl.run_speculative([1], periodic, 5, **kwargs)


# ---------------------------------------------------------------- metrics


def test_tokens_per_run_and_mean_acceptance_length_differ():
    # 10 runs, 4 of them with drafts, 6 drafts accepted in all: 16 tokens.
    stats = {"num_runs": 10, "num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 6,
             "num_accepted_tokens_per_pos": [3, 2, 1]}
    assert impl.tokens_per_run(stats) == 1.6  # 16 tokens / 10 runs
    assert impl.mean_acceptance_length(stats) == 2.5  # 1 + 6 / 4: runs without drafts left out
    for bad in [{}, {**stats, "num_runs": 0}, [1, 2]]:
        with pytest.raises(ValueError, match="stats"):
            impl.tokens_per_run(bad)
        with pytest.raises(ValueError, match="stats"):
            impl.mean_acceptance_length(bad)


# ---------------------------------------------------------------- a real model's greedy output


def test_greedy_acceptance_from_baseline_output():
    """Greedy speculation's run count follows from the baseline output alone.

    Greedy output is a function of the prefix, so the target's answer at every position
    a verification can ask about is already in mini_vllm's plain greedy output: replaying
    the proposer over it gives the exact number of target passes a speculative run would
    need, with no speculative engine at all.
    """
    from mini_vllm.engine import LLM
    from mini_vllm.sampling_params import SamplingParams

    llm = LLM("tiny-random")
    greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    prompt = [10, 20, 30, 10, 20]
    generated = list(llm.generate({"prompt_token_ids": prompt}, greedy)[0].outputs[0].token_ids)
    sequence = prompt + generated
    # the premise, checked on the engine: greedy from a longer prefix continues the same way
    for cut in (len(prompt) + 9, len(prompt) + 40):
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        assert llm.generate({"prompt_token_ids": sequence[:cut]}, one)[0].outputs[0].token_ids == [
            sequence[cut]]
    runs = {}
    for k, min_n, max_n in [(3, 1, 3), (3, 2, 4), (5, 5, 5)]:
        out, stats = impl.run_speculative(prompt, impl.replay_target(sequence), 64,
                                          k=k, min_n=min_n, max_n=max_n)
        assert out == generated
        runs[k, min_n, max_n] = stats["num_runs"]
    # tiny-random's greedy text loops (a random model repeats itself), so prompt lookup
    # helps: 64 tokens in 41 runs with n in [1, 3], 45 with [2, 4], and 56 with vLLM's
    # default n = 5, whose 5-token suffixes rarely recur in 69 tokens
    assert runs == {(3, 1, 3): 41, (3, 2, 4): 45, (5, 5, 5): 56}


# ---------------------------------------------------------------- the script


def test_script_example_prints_the_readme_lines():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(pathlib.Path(impl.__file__)), run_name="__main__")
    assert buf.getvalue().splitlines() == [
        "periodic: 40 tokens in 14 runs, tokens/run 2.857, mean acceptance length 4.714",
        "random:   200 tokens in 199 runs, 1 of 584 drafts accepted, tokens/run 1.005",
    ]
