"""Lab 01-01 tests: a request's statuses and counters, step by step."""
from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm import engine as engine_module  # noqa: E402


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


def test_status_path_is_waiting_running_finished():
    events = impl.trace_request("hello", max_tokens=4)
    summary = impl.summarize(events, num_prompt_tokens=5)
    assert summary.statuses == ["WAITING", "RUNNING", "FINISHED_LENGTH_CAPPED"]
    assert summary.num_steps == 4
    assert summary.first_token_step == 1
    assert (summary.prefill_steps, summary.decode_steps) == (1, 3)


def test_ids_are_read_from_the_engine_not_hard_coded(monkeypatch):
    original = engine_module.LLMEngine.add_request

    def add_with_odd_id(self, prompt, params=None, request_id=None):
        return original(self, prompt, params, request_id="zebra-7")

    monkeypatch.setattr(engine_module.LLMEngine, "add_request", add_with_odd_id)
    events = impl.trace_request("hi", max_tokens=2)
    assert {e.request_id for e in events} == {"zebra-7"}
    assert events[-1].status == "FINISHED_LENGTH_CAPPED"


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


@settings(max_examples=25, deadline=None)
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
