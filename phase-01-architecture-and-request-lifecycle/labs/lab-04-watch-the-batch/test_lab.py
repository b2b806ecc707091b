"""Lab 01-04 tests: per-step batch composition, measured on mini_vllm and predicted from the rules."""
from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm import engine as engine_module  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.model import ToyModel  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

A, B = "hello world", "goodbye"  # 11 and 7 tokens


def named(ids, d):
    return {"AB"[ids.index(k)]: v for k, v in d.items()}


def test_tight_budget_chunks_a_then_defers_b():
    ids, records = impl.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    assert [named(ids, r.scheduled) for r in records] == [
        {"A": 8},
        {"A": 3, "B": 5},
        {"A": 1, "B": 2},
        {"A": 1, "B": 1},
        {"A": 1, "B": 1},
        {"B": 1},
    ]
    # Step 1: B could not be admitted, the budget was spent on A's first chunk.
    assert [named(ids, dict.fromkeys(r.waiting, 0)) for r in records[:2]] == [{"B": 0}, {}]


def test_step_three_mixes_a_decode_with_a_prefill_chunk():
    ids, records = impl.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    third = records[2]
    assert named(ids, third.decode) == {"A": 1}
    assert named(ids, third.prefill) == {"B": 2}
    assert impl.batch_summary(ids, records)["mixed_steps"] == [3]


def test_a_one_token_last_prefill_chunk_is_still_prefill():
    # 9 prompt tokens at budget 8: chunks of 8 and 1. The 1-token chunk finishes the prompt
    # and samples token 1, but the request had no output token yet: it is prefill.
    ids, records = impl.trace_batches(["abcdefghi"], max_tokens=2, max_num_batched_tokens=8)
    (a,) = ids
    assert [(r.prefill, r.decode) for r in records] == [({a: 8}, {}), ({a: 1}, {}), ({}, {a: 1})]


def test_token_conservation_per_request():
    ids, records = impl.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    summary = impl.batch_summary(ids, records)
    # Every prompt token once, every output token but the last once: P + M - 1.
    assert named(ids, summary["tokens_per_request"]) == {"A": 11 + 4 - 1, "B": 7 + 4 - 1}
    assert named(ids, summary["tokens_per_request"]) == {"A": 14, "B": 10}
    assert named(ids, summary["first_scheduled_step"]) == {"A": 1, "B": 2}
    assert summary["num_steps"] == 6


def test_ample_budget_prefills_everyone_in_step_one():
    ids, records = impl.trace_batches([A, B], max_tokens=4)  # default budget 2048
    assert named(ids, records[0].scheduled) == {"A": 11, "B": 7}
    assert all(named(ids, r.scheduled) == {"A": 1, "B": 1} for r in records[1:])
    assert impl.batch_summary(ids, records)["num_steps"] == 4
    assert impl.batch_summary(ids, records)["mixed_steps"] == []


def test_one_seat_serializes_the_requests():
    ids, records = impl.trace_batches([A, B], max_tokens=4, max_num_seqs=1)
    summary = impl.batch_summary(ids, records)
    assert summary["num_steps"] == 8
    assert named(ids, summary["first_scheduled_step"]) == {"A": 1, "B": 5}
    assert all(len(r.scheduled) == 1 for r in records)


def test_budget_is_never_exceeded_and_the_matrix_matches_the_records():
    prompts = ["x" * 30, "y" * 9, "z" * 17]
    ids, records = impl.trace_batches(prompts, max_tokens=5, max_num_batched_tokens=10,
                                      long_prefill_token_threshold=6)
    matrix = impl.batch_matrix(ids, records)
    assert len(matrix) == len(records) and all(len(row) == 3 for row in matrix)
    assert all(sum(row) <= 10 for row in matrix)
    assert max(sum(row) for row in matrix) == impl.batch_summary(ids, records)["max_step_tokens"]
    assert [sum(col) for col in zip(*matrix, strict=True)] == [30 + 4, 9 + 4, 17 + 4]


def test_matrix_columns_follow_prompt_order_with_twelve_requests():
    # Twelve requests: the engine names them req-0 ... req-11, and "req-10" sorts before "req-2".
    prompts = [chr(ord("a") + i) * (i + 1) for i in range(12)]
    ids, records = impl.trace_batches(prompts, max_tokens=2)
    matrix = impl.batch_matrix(ids, records)
    assert [sum(col) for col in zip(*matrix, strict=True)] == [i + 1 + 1 for i in range(12)]
    assert matrix[0] == [i + 1 for i in range(12)]


def test_the_probe_does_not_change_what_the_engine_does():
    kw = dict(max_num_batched_tokens=8, long_prefill_token_threshold=5)
    ids, records = impl.trace_batches([A, B, "xyz"], max_tokens=3, **kw)
    plain = LLMEngine(**kw)
    plain.generate([A, B, "xyz"], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert [r.scheduled for r in records] == [s.num_scheduled_tokens for s in plain.stats]


def test_requests_are_greedy_and_ignore_eos_even_on_a_model_that_prefers_eos(monkeypatch):
    submitted = []
    original = engine_module.LLMEngine.add_request

    def recording_add(self, prompt, params=None, request_id=None):
        submitted.append(params)
        return original(self, prompt, params, request_id)

    monkeypatch.setattr(engine_module.LLMEngine, "add_request", recording_add)
    # EOS has the largest logit everywhere: only ignore_eos lets the requests run to 3 tokens.
    ids, records = impl.trace_batches([A, B], max_tokens=3, model=ToyModel(eos_bias=100.0))
    assert named(ids, impl.batch_summary(ids, records)["tokens_per_request"]) == {"A": 13, "B": 9}
    assert [(p.greedy, p.ignore_eos, p.max_tokens) for p in submitted] == [(True, True, 3)] * 2


def test_the_probe_keeps_a_copy_not_the_schedulers_dict(monkeypatch):
    # A producer may reuse or clear its output once the step is over. Simulate one: a
    # probe that stored the scheduler's own dict would now hold only empty dicts.
    from mini_vllm.scheduler import Scheduler

    original = Scheduler.update_from_output

    def update_then_clear(self, scheduler_output, *args, **kwargs):
        finished = original(self, scheduler_output, *args, **kwargs)
        scheduler_output.num_scheduled_tokens.clear()
        return finished

    monkeypatch.setattr(Scheduler, "update_from_output", update_then_clear)
    ids, records = impl.trace_batches([A, B], max_tokens=4, max_num_batched_tokens=8)
    assert [named(ids, r.scheduled) for r in records[:3]] == [
        {"A": 8}, {"A": 3, "B": 5}, {"A": 1, "B": 2},
    ]


def test_prediction_matches_the_worked_example():
    assert impl.predict_batches([11, 7], 4, 8) == [
        {0: 8}, {0: 3, 1: 5}, {0: 1, 1: 2}, {0: 1, 1: 1}, {0: 1, 1: 1}, {1: 1},
    ]


def test_prediction_with_one_seat_runs_the_requests_one_after_the_other():
    assert impl.predict_batches([11, 7], 4, 2048, max_num_seqs=1) == (
        [{0: 11}, {0: 1}, {0: 1}, {0: 1}, {1: 7}, {1: 1}, {1: 1}, {1: 1}]
    )


def test_prediction_leaves_the_callers_list_alone():
    lens = [11, 7]
    impl.predict_batches(lens, 4, 8)
    assert lens == [11, 7]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    lens=st.lists(st.integers(1, 25), min_size=1, max_size=4),
    max_tokens=st.integers(1, 4),
    budget=st.integers(1, 20),
    threshold=st.integers(0, 6),
    max_seqs=st.integers(1, 3),
)
def test_prediction_matches_the_engine(lens, max_tokens, budget, threshold, max_seqs):
    prompts = [chr(ord("a") + i) * n for i, n in enumerate(lens)]  # no shared prefixes
    ids, records = impl.trace_batches(
        prompts, max_tokens=max_tokens, max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold, max_num_seqs=max_seqs,
    )
    measured = [{ids.index(k): v for k, v in r.scheduled.items()} for r in records]
    assert measured == impl.predict_batches(lens, max_tokens, budget, threshold, max_seqs)


@pytest.mark.parametrize(("call", "name"), [
    (lambda: impl.trace_batches([A], max_tokens=0), "max_tokens"),
    (lambda: impl.trace_batches([], max_tokens=2), "prompts"),
    (lambda: impl.predict_batches([3], 0, 8), "max_tokens"),
    (lambda: impl.predict_batches([3], 2, 0), "max_num_batched_tokens"),
    (lambda: impl.predict_batches([0], 2, 8), "prompt_lens"),
    (lambda: impl.predict_batches([3, 2.5], 2, 8), "prompt_lens"),
    (lambda: impl.predict_batches([3], 2, 8, long_prefill_token_threshold=-1),
     "long_prefill_token_threshold"),
    (lambda: impl.predict_batches([3], 2, 8, max_num_seqs=0), "max_num_seqs"),
])
def test_bad_parameters_are_rejected_with_a_named_error(call, name):
    with pytest.raises(ValueError, match=name):
        call()
