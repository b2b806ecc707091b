"""Lab 01-01 tests: a request's statuses and counters, step by step."""
from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm import engine as engine_module  # noqa: E402
from mini_vllm.model import ToyModel  # noqa: E402


def _shape(events):
    """The trace without request ids: (step, status, computed, tokens)."""
    return [(e.step, e.status, e.num_computed_tokens, e.num_tokens) for e in events]


def test_hello_trace_matches_the_guide_table():
    events = impl.trace_request("hello", max_tokens=4)
    assert _shape(events) == [
        (0, "WAITING", 0, 5),
        (1, "RUNNING", 5, 6),
        (2, "RUNNING", 6, 7),
        (3, "RUNNING", 7, 8),
        (4, "FINISHED_LENGTH_CAPPED", 8, 9),
    ]
    assert len({e.request_id for e in events}) == 1
    assert all(type(e.status) is str for e in events)  # the status *name*, not the enum


def test_status_path_is_waiting_running_finished():
    events = impl.trace_request("hello", max_tokens=4)
    summary = impl.summarize(events, num_prompt_tokens=5)
    assert summary.statuses == ["WAITING", "RUNNING", "FINISHED_LENGTH_CAPPED"]
    assert summary.num_steps == 4
    assert summary.first_token_step == 1
    assert (summary.prefill_steps, summary.decode_steps) == (1, 3)


def test_ids_are_read_from_the_engine_not_hard_coded(monkeypatch):
    original = engine_module.LLMEngine.add_request

    submitted = []

    def add_with_odd_id(self, prompt, params=None, request_id=None):
        submitted.append(params)
        return original(self, prompt, params, request_id="zebra-7")

    monkeypatch.setattr(engine_module.LLMEngine, "add_request", add_with_odd_id)
    events = impl.trace_request("hi", max_tokens=2)
    assert {e.request_id for e in events} == {"zebra-7"}
    assert events[-1].status == "FINISHED_LENGTH_CAPPED"
    # The one request submitted is the one the README describes: greedy, ignore_eos, 2 tokens.
    [params] = submitted
    assert (params.greedy, params.ignore_eos, params.max_tokens) == (True, True, 2)


def test_counters_obey_the_catch_up_arithmetic():
    prompt, max_tokens = "counters", 6  # 8 tokens
    events = impl.trace_request(prompt, max_tokens=max_tokens)
    p = len(prompt)
    for before, after in zip(events, events[1:], strict=False):
        assert after.num_computed_tokens >= before.num_computed_tokens
        assert after.num_tokens >= before.num_tokens
        # Decode: one token's KV in, one token out.
        if before.num_computed_tokens >= p:
            assert after.num_computed_tokens - before.num_computed_tokens == 1
            assert after.num_tokens - before.num_tokens == 1
    # Running requests sit exactly one token behind after every step.
    assert all(e.num_tokens - e.num_computed_tokens == 1 for e in events[1:])
    last = events[-1]
    assert last.num_tokens == p + max_tokens
    assert last.num_computed_tokens == p + max_tokens - 1  # the last token's KV is never computed


def test_a_twelve_token_prompt_runs_five_steps_for_five_tokens():
    events = impl.trace_request("x" * 12, max_tokens=5)  # EXERCISES item 4
    assert [(e.num_computed_tokens, e.num_tokens) for e in events[1:]] == [
        (12, 13), (13, 14), (14, 15), (15, 16), (16, 17),
    ]


def test_sixteen_tokens_take_sixteen_steps_not_seventeen():
    prompt = "The capital of France is"  # 24 bytes, fits in one step
    events = impl.trace_request(prompt, max_tokens=16)
    summary = impl.summarize(events, num_prompt_tokens=24)
    assert summary.num_steps == 16
    assert summary.first_token_step == 1
    assert (summary.prefill_steps, summary.decode_steps) == (1, 15)
    assert (events[-1].num_computed_tokens, events[-1].num_tokens) == (39, 40)


def test_chunked_prefill_holds_num_tokens_until_the_last_chunk():
    events = impl.trace_request("abcdefghij", max_tokens=4, long_prefill_token_threshold=2)
    assert [(e.num_computed_tokens, e.num_tokens) for e in events[:6]] == [
        (0, 10), (2, 10), (4, 10), (6, 10), (8, 10), (10, 11),
    ]
    summary = impl.summarize(events, num_prompt_tokens=10)
    assert summary.first_token_step == 5
    assert summary.num_steps == 8 == impl.expected_num_steps(10, 4, long_prefill_token_threshold=2)
    assert (summary.prefill_steps, summary.decode_steps) == (5, 3)
    # The mini-build's self-check: threshold 3 -> chunks 3, 3, 3, 1; token 1 at step 4; 8 steps.
    events = impl.trace_request("abcdefghij", max_tokens=5, long_prefill_token_threshold=3)
    summary = impl.summarize(events, num_prompt_tokens=10)
    assert (summary.first_token_step, summary.num_steps) == (4, 8)


def test_a_budget_smaller_than_the_prompt_chunks_it_too():
    events = impl.trace_request("abcdefghij", max_tokens=3, max_num_batched_tokens=4)
    assert [e.num_computed_tokens for e in events[:4]] == [0, 4, 8, 10]
    assert events[-1].step == 5 == impl.expected_num_steps(10, 3, max_num_batched_tokens=4)
    # The mini-build's REPL session: "hello" at budget 4 runs 4 + 1, then 3 tokens in 4 steps.
    hello = impl.trace_request("hello", max_tokens=3, max_num_batched_tokens=4)
    assert [(e.num_computed_tokens, e.num_tokens) for e in hello] == [(0, 5), (4, 5), (5, 6), (6, 7), (7, 8)]


def test_ignore_eos_keeps_a_request_going_on_a_model_that_prefers_eos():
    # This toy model gives EOS the largest logit at every position: without ignore_eos the
    # request would stop after its first token.
    events = impl.trace_request("hi", max_tokens=5, model=ToyModel(eos_bias=100.0))
    assert events[-1].status == "FINISHED_LENGTH_CAPPED"
    assert (events[-1].step, events[-1].num_tokens) == (5, 7)


def test_summarize_lists_statuses_by_first_appearance_even_after_preemption():
    # A hand-written trace (P = 4) in which the request is preempted once and recomputed.
    e = impl.Event
    events = [
        e(0, "r", "WAITING", 0, 4),
        e(1, "r", "RUNNING", 4, 5),
        e(2, "r", "PREEMPTED", 0, 5),
        e(3, "r", "RUNNING", 5, 6),
        e(4, "r", "FINISHED_LENGTH_CAPPED", 6, 7),
    ]
    summary = impl.summarize(events, num_prompt_tokens=4)
    assert summary.statuses == ["WAITING", "RUNNING", "PREEMPTED", "FINISHED_LENGTH_CAPPED"]
    assert (summary.num_steps, summary.first_token_step) == (4, 1)
    assert (summary.prefill_steps, summary.decode_steps) == (2, 1)


def test_one_token_prefill_chunks_are_prefill_not_decode():
    # Threshold 1 moves the computed counter by exactly one in every prompt step too.
    events = impl.trace_request("abc", max_tokens=3, long_prefill_token_threshold=1)
    summary = impl.summarize(events, num_prompt_tokens=3)
    assert (summary.prefill_steps, summary.decode_steps, summary.num_steps) == (3, 2, 5)


def test_summarize_rejects_an_empty_trace():
    with pytest.raises(ValueError, match="events"):
        impl.summarize([], num_prompt_tokens=5)


@pytest.mark.parametrize(("prompt_len", "max_tokens", "budget", "threshold", "steps"), [
    (10, 4, 3, 5, 4 + 3),    # threshold above the budget: the budget cuts the chunks
    (10, 4, 5, 3, 4 + 3),    # threshold below the budget: the threshold cuts them
    (12, 2, 4, 0, 3 + 1),    # budget divides the prompt exactly: no extra chunk
    (13, 2, 4, 4, 4 + 1),    # one token over a multiple: a fourth chunk of 1 token
    (1, 1, 1, 0, 1),         # the smallest request: one step
    (5, 2, 8, 1, 5 + 1),     # threshold 1: one prompt token per step
])
def test_step_count_formula_on_boundary_cases(prompt_len, max_tokens, budget, threshold, steps):
    assert impl.expected_num_steps(prompt_len, max_tokens, budget, threshold) == steps
    events = impl.trace_request("x" * prompt_len, max_tokens=max_tokens,
                                max_num_batched_tokens=budget, long_prefill_token_threshold=threshold)
    assert events[-1].step == steps


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    prompt_len=st.integers(1, 40),
    max_tokens=st.integers(1, 6),
    threshold=st.integers(0, 7),
    budget=st.integers(1, 64),
)
def test_step_count_formula_matches_the_engine(prompt_len, max_tokens, threshold, budget):
    events = impl.trace_request(
        "x" * prompt_len,
        max_tokens=max_tokens,
        long_prefill_token_threshold=threshold,
        max_num_batched_tokens=budget,
    )
    assert events[-1].step == impl.expected_num_steps(prompt_len, max_tokens, budget, threshold)
    assert events[-1].num_tokens == prompt_len + max_tokens


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_max_tokens_is_rejected_with_a_named_error(bad):
    with pytest.raises(ValueError, match="max_tokens"):
        impl.trace_request("hi", max_tokens=bad)
    with pytest.raises(ValueError, match="max_tokens"):
        impl.expected_num_steps(5, bad)


@pytest.mark.parametrize(("args", "name"), [
    ((0, 4), "num_prompt_tokens"),
    ((5, 4, 0), "max_num_batched_tokens"),
    ((5, 4, 8, -1), "long_prefill_token_threshold"),
    ((5.0, 4), "num_prompt_tokens"),
])
def test_expected_num_steps_rejects_bad_sizes_by_name(args, name):
    with pytest.raises(ValueError, match=name):
        impl.expected_num_steps(*args)
