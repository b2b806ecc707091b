"""The engine end to end: equivalences, regressions of small engines, bad input, outputs."""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm import LLM, LLMEngine, SamplingParams, ToyModel, prepare_inputs

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = ["the quick brown fox jumps over", "the quick brown cat", "hello", "the quick brown fox sleeps"]


def _tokens(engine, prompts=PROMPTS, params=GREEDY):
    return [r.output_token_ids for r in engine.generate(prompts, params)]


def _total_scheduled(engine):
    return sum(sum(s.num_scheduled_tokens.values()) for s in engine.stats)


def test_chunked_prefill_matches_unchunked_output():
    ref = _tokens(LLMEngine(block_size=4))
    chunked = LLMEngine(block_size=4, max_num_batched_tokens=5, long_prefill_token_threshold=3)
    assert _tokens(chunked) == ref
    assert max(sum(s.num_scheduled_tokens.values()) for s in chunked.stats) <= 5


def test_prefix_caching_matches_no_caching_output():
    cached = LLMEngine(block_size=4)
    assert _tokens(cached) == _tokens(LLMEngine(block_size=4, enable_caching=False))
    assert sum(s.num_cached_tokens for s in cached.stats) > 0


def test_cramped_pool_matches_roomy_pool_and_really_preempts():
    ref = _tokens(LLMEngine(block_size=4))
    cramped = LLMEngine(block_size=4, num_blocks=11)
    assert _tokens(cramped) == ref
    assert sum(len(s.preempted) for s in cramped.stats) > 0
    cramped.kv_cache_manager.block_pool.check_invariants()
    assert cramped.kv_cache_manager.block_pool.get_num_free_blocks() == 10


def test_real_model_output_survives_chunking_caching_and_preemption():
    ref = _tokens(LLMEngine("tiny-random", block_size=4, enable_caching=False))
    hard = LLMEngine("tiny-random", block_size=4, num_blocks=12, max_num_batched_tokens=5)
    assert _tokens(hard) == ref
    assert sum(len(s.preempted) for s in hard.stats) > 0
    assert sum(s.num_cached_tokens for s in hard.stats) > 0


def test_prefix_cache_savings_are_exact():
    # 8 prompts: a 64-token shared system prompt (16 blocks of 4) + 1 own token
    system = "S" * 64
    prompts = [system + str(i) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    off, on = LLMEngine(block_size=4, enable_caching=False), LLMEngine(block_size=4)
    assert _tokens(off, prompts, params) == _tokens(on, prompts, params)
    assert _total_scheduled(off) == 8 * (65 + 3) == 544
    assert _total_scheduled(on) == (65 + 3) + 7 * (1 + 3) == 96
    assert on.stats[0].num_cached_tokens == 7 * 64  # followers hit in the leader's step


def test_preempted_request_later_hits_the_prefix_cache():
    # Regression: after preemption the request's prompt+output blocks are still
    # cached (free but not evicted), and readmission must reuse them correctly.
    prompts = ["a" * 12, "b" * 12]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ref = _tokens(LLMEngine(block_size=4), prompts, params)
    eng = LLMEngine(block_size=4, num_blocks=8)
    assert _tokens(eng, prompts, params) == ref
    victim = [s for s in eng.stats if s.preempted][0].preempted[0]
    readmit = [s for s in eng.stats if victim in s.num_scheduled_tokens and s.num_cached_tokens][-1]
    # B's 3 prompt blocks were freed (not wiped) at preemption; A's growth evicted
    # the tail one (freed first, so evicted first); B comes back with 2 blocks hit
    assert victim == "req-1" and readmit.num_cached_tokens == 8


def test_identical_prompts_in_one_step_share_blocks_and_match():
    eng = LLMEngine(block_size=4)
    outs = eng.generate(["same prompt here"] * 3, GREEDY)
    assert outs[0].output_token_ids == outs[1].output_token_ids == outs[2].output_token_ids
    assert eng.stats[0].num_scheduled_tokens == {"req-0": 16, "req-1": 4, "req-2": 4}


class EosAt(ToyModel):
    """Emits EOS greedily when the input token sits at position ``pos``."""

    def __init__(self, pos: int) -> None:
        super().__init__()
        self.pos = pos

    def forward(self, last_tokens, positions):
        logits = super().forward(last_tokens, positions)
        logits[np.asarray(positions) == self.pos, self.eos_token_id] = 100.0
        return logits


def test_eos_on_the_same_step_as_max_tokens_reports_stop():
    # prompt of 5: the k-th output token is sampled at input position 5 + k - 2
    eng = LLMEngine(EosAt(pos=5 + 4 - 2))
    (req,) = eng.generate("hello", SamplingParams(temperature=0, max_tokens=4))
    assert req.num_output_tokens == 4 and req.output_token_ids[-1] == 256
    assert req.finish_reason == "stop"
    (req,) = LLMEngine(EosAt(pos=5)).generate("hello", SamplingParams(temperature=0, max_tokens=4))
    assert req.num_output_tokens == 2 and req.finish_reason == "stop"
    (req,) = LLMEngine(EosAt(pos=5)).generate("hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert req.num_output_tokens == 4 and req.finish_reason == "length"


def test_abort_while_waiting_and_while_running_frees_everything():
    eng = LLMEngine(block_size=4, num_blocks=64, max_num_seqs=1)
    a = eng.add_request("abcdefgh", GREEDY)
    b = eng.add_request("ijklmnop", GREEDY)
    eng.step()
    eng.abort_request(b)  # waiting
    eng.step()
    eng.abort_request(a)  # running
    eng.abort_request("never-existed")  # ignored, as upstream
    assert not eng.has_unfinished_requests()
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 63
    assert eng.step() == []


def test_bad_input_is_rejected_at_add_request():
    eng = LLMEngine(block_size=4, num_blocks=5, max_model_len=64)
    cases = [
        ("", "prompt is empty"),
        ({"prompt_token_ids": []}, "prompt is empty"),
        ({"prompt_token_ids": [1, 300]}, r"integers in \[0, 257\)"),
        (["not", "a prompt"], "prompt must be a str"),
    ]
    for prompt, msg in cases:
        with pytest.raises(ValueError, match=msg):
            eng.add_request(prompt)
    with pytest.raises(ValueError, match="exceeds max_model_len = 64"):
        eng.add_request("x" * 60, SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="needs 5 KV blocks of 4 tokens, but the pool has only 4"):
        eng.add_request("x" * 10, SamplingParams(max_tokens=8))  # 17 slots
    eng.add_request("x" * 10, SamplingParams(max_tokens=7))  # 16 slots: fits exactly
    with pytest.raises(ValueError, match="n must be 1"):
        eng.add_request("x", SamplingParams(n=2))
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("y", request_id="req-0")
    for bad in (7, ""):
        with pytest.raises(ValueError, match="^request_id must be None or a non-empty str"):
            eng.add_request("y", request_id=bad)
    with pytest.raises(ValueError, match="^params must be a SamplingParams"):
        eng.add_request("y", {"max_tokens": 2})
    assert eng.scheduler.get_num_unfinished_requests() == 1


def test_engine_rejects_bad_knobs():
    for kwargs, name in [({"block_size": 0}, "block_size"), ({"num_blocks": 1}, "num_blocks"),
                         ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
                         ({"max_num_seqs": -1}, "max_num_seqs"), ({"max_model_len": 1}, "max_model_len"),
                         ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
                         ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
                         ({"enable_caching": "no"}, "enable_caching"),
                         ({"model": 42}, "model"), ({"model": ""}, "model")]:
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            LLMEngine(**kwargs)


def test_max_model_len_above_the_models_is_an_error_not_a_silent_cut():
    with pytest.raises(ValueError, match=r"^max_model_len must be <= the model's max_model_len \(64\), got 65"):
        LLMEngine(ToyModel(max_model_len=64), max_model_len=65)
    assert LLMEngine(ToyModel(max_model_len=64), max_model_len=32).max_model_len == 32
    assert LLMEngine(ToyModel(max_model_len=64)).max_model_len == 64


def test_a_rejected_prompt_in_a_batch_leaves_the_engine_as_it_was():
    eng = LLMEngine(block_size=4, num_blocks=8)
    with pytest.raises(ValueError, match="prompt is empty"):
        eng.generate(["ok", "fine", ""], GREEDY)
    assert not eng.has_unfinished_requests()
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 7
    llm = LLM(block_size=4, num_blocks=8)
    with pytest.raises(ValueError, match="KV blocks"):
        llm.generate(["ok", "x" * 40], GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
    (out,) = llm.generate(["ok"], GREEDY)  # and it still works
    assert len(out.outputs[0].token_ids) == 8


def test_llm_generate_rejects_sampling_params_that_do_not_match_the_prompts():
    llm = LLM()
    for bad in ([GREEDY], {"temperature": 0}, [GREEDY, "greedy"]):
        with pytest.raises(ValueError, match="^sampling_params must be"):
            llm.generate(["a", "b"], bad)
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_request_that_exactly_fills_the_pool_finishes():
    eng = LLMEngine(block_size=4, num_blocks=5)
    (req,) = eng.generate("x" * 10, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert req.num_output_tokens == 7


def test_llm_facade_returns_vllm_shaped_outputs():
    llm = LLM(block_size=4)
    outs = llm.generate(["hello", {"prompt_token_ids": [104, 105]}], SamplingParams(temperature=0, max_tokens=5))
    assert [o.request_id for o in outs] == ["req-0", "req-1"]
    o = outs[0]
    assert o.prompt == "hello" and o.prompt_token_ids == [104, 101, 108, 108, 111]
    c = o.outputs[0]
    assert len(c.token_ids) == 5 and c.finish_reason == "length"
    assert c.text == bytes(c.token_ids).decode()  # the toy model's greedy bytes are printable
    assert outs[1].prompt is None
    assert (o.metrics.first_token_step, o.metrics.finished_step, o.metrics.inter_token_steps) == (1, 5, [1, 1, 1, 1])


def test_stop_string_cuts_the_text():
    llm = LLM()
    (ref,) = llm.generate("abc", SamplingParams(temperature=0, max_tokens=10))
    stop = ref.outputs[0].text[3:5]
    (out,) = LLM().generate("abc", SamplingParams(temperature=0, max_tokens=10, stop=[stop]))
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == ref.outputs[0].text[: ref.outputs[0].text.find(stop)]


def test_n_completions_use_seed_plus_index():
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=5, n=3)
    (out,) = LLM().generate("hi", params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, c in enumerate(out.outputs):
        (single,) = LLM().generate("hi", SamplingParams(temperature=1.0, max_tokens=6, seed=5 + i))
        assert c.token_ids == single.outputs[0].token_ids
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_seeded_sampling_does_not_depend_on_the_batch():
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, seed=11)
    alone = LLM().generate("xyz", params)[0].outputs[0].token_ids
    crowd = LLM(max_num_batched_tokens=7).generate(
        ["aaaa", "xyz", "bbbbbb"], [SamplingParams(temperature=1.0, max_tokens=8), params, GREEDY]
    )
    assert crowd[1].outputs[0].token_ids == alone


def test_unseeded_runs_are_reproducible_per_engine_seed():
    params = SamplingParams(temperature=1.0, max_tokens=8)
    a = LLM(seed=1).generate(["p", "q"], params)
    b = LLM(seed=1).generate(["p", "q"], params)
    c = LLM(seed=2).generate(["p", "q"], params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert [o.outputs[0].token_ids for o in a] != [o.outputs[0].token_ids for o in c]


def test_step_stats_record_the_prefill_decode_mix():
    eng = LLMEngine(block_size=4, max_num_batched_tokens=8)
    eng.generate(["hello world", "goodbye"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    s = eng.stats
    assert [x.step for x in s] == [1, 2, 3, 4, 5, 6]
    assert [(x.num_prefill_tokens, x.num_decode_tokens) for x in s] == [
        (8, 0), (8, 0), (2, 1), (0, 2), (0, 2), (0, 1)
    ]
    assert [x.finished for x in s] == [[], [], [], [], ["req-0"], ["req-1"]]
    # blocks_used is the step's peak, taken after scheduling: in the last step
    # "goodbye" (7 + 3 tokens in KV) still holds 3 blocks of 4; it frees them after.
    assert s[0].blocks_used == 2 and s[1].blocks_used == 5 and s[-1].blocks_used == 3
    assert eng.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 1023
    assert s[0].num_running == 1 and s[0].num_waiting == 1


def test_generate_returns_requests_in_prompt_order_even_when_they_finish_out_of_order():
    eng = LLMEngine()
    reqs = eng.generate(["a", "b"], [SamplingParams(max_tokens=9, temperature=0), SamplingParams(max_tokens=2, temperature=0)])
    assert [r.request_id for r in reqs] == ["req-0", "req-1"]
    assert [r.num_output_tokens for r in reqs] == [9, 2]


def test_prepare_inputs_builds_the_flat_arrays_of_a_mixed_step(make_scheduler, make_request, run_step):
    s = make_scheduler(block_size=4)
    b = make_request(range(10, 17), request_id="B")  # 7 tokens: blocks 1, 2
    s.add_request(b)
    run_step(s, token=99)  # B prefilled and sampled 99: 8 tokens, 7 computed
    s.add_request(make_request([1, 2, 3], request_id="A"))
    out = s.schedule()  # B decodes position 7, A prefills positions 0..2
    mi = prepare_inputs(out, s.kv_cache_manager)
    assert mi.token_ids.tolist() == [99, 1, 2, 3]
    assert mi.positions.tolist() == [7, 0, 1, 2]
    assert mi.query_start_loc.tolist() == [0, 1, 4]
    assert mi.seq_lens.tolist() == [8, 3]
    assert mi.block_tables.tolist() == [[1, 2], [3, 0]]  # padded with the null block
    assert mi.slot_mapping.tolist() == [2 * 4 + 3, 12, 13, 14]
    assert mi.logits_indices.tolist() == [0, 3] and mi.block_size == 4
