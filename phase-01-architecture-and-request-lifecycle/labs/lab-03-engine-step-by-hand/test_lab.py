"""Lab 01-03 tests: your engine_step against mini_vllm's LLMEngine.step, token for token."""
from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.model import ToyModel  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = ["hello", "The capital of France is", "a", "what is 1+1?"]
# Each comparison below is ([(output_token_ids, status), ...] per request, [the IDs each step
# returned as finished, sorted]); the length of the second list is the number of steps.
DIFFERS = ("your engine_step and LLMEngine.step disagree ((tokens, status) per request, "
           "the requests each step returned as finished)")


def _drive(engine, prompts, params, step):
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params_list, strict=True)]
    done, finished_per_step = {}, []
    while engine.scheduler.has_unfinished_requests():
        finished = step()
        finished_per_step.append(sorted(r.request_id for r in finished))
        for r in finished:
            done[r.request_id] = r
        assert len(finished_per_step) < 500, "the engine never finishes the requests"
    return [(done[i].output_token_ids, done[i].status.name) for i in ids], finished_per_step


def reference(prompts, params, **engine_kwargs):
    """mini_vllm's own loop, LLMEngine.step."""
    engine = LLMEngine(**engine_kwargs)
    return _drive(engine, prompts, params, engine.step)


def by_hand(prompts, params, **engine_kwargs):
    """The same engine's parts, driven by the learner's engine_step."""
    engine = LLMEngine(**engine_kwargs)
    generators = {}
    got = _drive(engine, prompts, params, lambda: impl.engine_step(
        engine.scheduler, engine.model, engine.sampler, generators))
    assert generators == {}, "finished requests must not keep their generators"
    return got


def test_single_request_matches_llm_engine():
    assert by_hand(["hello"], GREEDY) == reference(["hello"], GREEDY), DIFFERS


def test_batch_matches_llm_engine_row_for_row():
    got = by_hand(PROMPTS, GREEDY)
    assert got == reference(PROMPTS, GREEDY), DIFFERS + ": is row i of the logits given to scheduled_requests[i]?"
    # the four outputs differ, so a swapped row could not hide behind identical answers
    assert len({tuple(tokens) for tokens, _ in got[0]}) == len(PROMPTS)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(budget=st.integers(1, 12), threshold=st.integers(0, 5), max_seqs=st.integers(1, 4))
def test_matches_under_chunked_prefill_and_tight_budgets(budget, threshold, max_seqs):
    kw = dict(max_num_batched_tokens=budget, long_prefill_token_threshold=threshold,
              max_num_seqs=max_seqs)
    assert by_hand(PROMPTS, GREEDY, **kw) == reference(PROMPTS, GREEDY, **kw), DIFFERS


def test_matches_on_the_tiny_random_transformer():
    kw = dict(model="tiny-random", block_size=4, num_blocks=64, max_num_batched_tokens=7)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    assert by_hand(PROMPTS[:3], params, **kw) == reference(PROMPTS[:3], params, **kw), DIFFERS


def test_matches_with_seeded_sampling_even_when_prompts_are_chunked():
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_tokens=8, seed=s)
              for s in (11, 12, 13, 14)]
    kw = dict(max_num_batched_tokens=6)
    assert by_hand(PROMPTS, params, **kw) == reference(PROMPTS, params, **kw), (
        DIFFERS + ": keep one generator per request across steps, created from its seed, "
        "and draw from it only for the rows rows_to_sample returns"
    )


def test_rows_to_sample_skips_a_mid_prefill_chunk():
    engine = LLMEngine(max_num_batched_tokens=8)
    a = engine.add_request("abc", GREEDY)          # 3 tokens: whole prompt, samples
    b = engine.add_request("0123456789", GREEDY)   # 10 tokens: only 5 fit, no sample
    out = engine.scheduler.schedule()
    assert out.num_scheduled_tokens == {a: 3, b: 5}
    assert [(row, r.request_id) for row, r in impl.rows_to_sample(out)] == [(0, a)]


def test_rows_keep_their_batch_position_when_an_earlier_row_is_mid_prefill():
    engine = LLMEngine(max_num_batched_tokens=8, long_prefill_token_threshold=4)
    a = engine.add_request("0123456789", GREEDY)   # row 0: 4 of 10 tokens, no sample
    b = engine.add_request("abc", GREEDY)          # row 1: its whole prompt, samples
    out = engine.scheduler.schedule()
    assert out.num_scheduled_tokens == {a: 4, b: 3}
    assert [(row, r.request_id) for row, r in impl.rows_to_sample(out)] == [(1, b)]
    # rows_to_sample only reads: the counters still mark where the chunks start.
    assert [r.num_computed_tokens for r in out.scheduled_requests] == [0, 0]


def test_mid_prefill_chunk_emits_no_token_but_still_advances():
    engine = LLMEngine(long_prefill_token_threshold=4)
    rid = engine.add_request("abcdefghij", GREEDY)  # 10 tokens: chunks of 4, 4, 2
    request = engine.scheduler.requests[rid]
    seen = []
    for _ in range(3):
        impl.engine_step(engine.scheduler, engine.model, engine.sampler)
        seen.append((request.num_computed_tokens, request.num_tokens, request.num_output_tokens))
    # (num_computed_tokens, num_tokens, num_output_tokens) after each step
    assert seen == [(4, 10, 0), (8, 10, 0), (10, 11, 1)], (
        "a mid-prefill chunk samples nothing, but update_from_output must still run"
    )


class _NoCallModel(ToyModel):
    def execute(self, model_input):
        raise AssertionError("the model ran on a step that scheduled nothing")


def test_an_idle_step_runs_no_model_and_finishes_nobody():
    engine = LLMEngine(model=_NoCallModel())
    assert impl.engine_step(engine.scheduler, engine.model, engine.sampler) == []
    assert engine.scheduler.has_unfinished_requests() is False


def test_sampling_without_generators_is_rejected_before_scheduling():
    engine = LLMEngine()
    rid = engine.add_request("hi", SamplingParams(temperature=1.0, max_tokens=2))
    with pytest.raises(ValueError, match="generators"):
        impl.engine_step(engine.scheduler, engine.model, engine.sampler)
    assert engine.scheduler.requests[rid].status.name == "WAITING"  # nothing was scheduled
