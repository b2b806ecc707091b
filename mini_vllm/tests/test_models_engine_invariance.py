"""The course's central claim, on real attention math: scheduling never changes output.

Chunked prefill (token budgets down to 1), prefix caching, preemption by
recompute (tiny KV pools) and the batch a request happens to share change
memory and timing only. With ``model="tiny-random"`` every token depends on
the K/V read through the block table, so a wrong slot, a stale cached block or
a badly recomputed preempted request changes the greedy tokens; the last test
proves the comparison has teeth by corrupting the cache on purpose.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.engine import LLMEngine
from mini_vllm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SHARED = list(range(40, 40 + 21))  # a 21-token prefix several prompts share
PROMPTS = [
    {"prompt_token_ids": SHARED + [1, 2, 3]},
    {"prompt_token_ids": [200]},
    {"prompt_token_ids": SHARED + [9]},
    {"prompt_token_ids": list(range(100, 137))},
    {"prompt_token_ids": SHARED},
    {"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11, 12]},
]


def run(prompts=PROMPTS, params=GREEDY, **engine_kw):
    engine_kw.setdefault("block_size", 4)
    engine_kw.setdefault("num_blocks", 128)
    engine = LLMEngine(model="tiny-random", **engine_kw)
    reqs = engine.generate(prompts, params)
    return [list(r.output_token_ids) for r in reqs], engine


@pytest.fixture(scope="module")
def reference():
    """Each prompt alone, whole prompt in one step, no prefix caching, a roomy pool."""
    return [run([p], enable_caching=False)[0][0] for p in PROMPTS]


def test_batched_run_equals_each_prompt_alone(reference):
    tokens, engine = run()
    assert tokens == reference
    assert max(len(s.num_scheduled_tokens) for s in engine.stats) == len(PROMPTS)
    assert all(len(t) == GREEDY.max_tokens for t in tokens)


@pytest.mark.parametrize("budget", [1, 2, 5, 16])
def test_chunked_prefill_never_changes_output(reference, budget):
    tokens, engine = run(max_num_batched_tokens=budget)
    assert tokens == reference
    assert max(sum(s.num_scheduled_tokens.values()) for s in engine.stats) <= budget
    # The 37-token prompt really was split into chunks.
    assert sum(1 for s in engine.stats if s.num_scheduled_tokens.get("req-3", 0) > 1) > 1 \
        or budget == 1


def test_long_prefill_threshold_never_changes_output(reference):
    tokens, engine = run(long_prefill_token_threshold=3)
    assert tokens == reference
    assert max(n for s in engine.stats for n in s.num_scheduled_tokens.values()) <= 3


def test_prefix_caching_never_changes_output(reference):
    engine = LLMEngine(model="tiny-random", block_size=4, num_blocks=128, enable_caching=True)
    first = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    # A second wave of the same prompts: their full blocks are cached now.
    second = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    assert first == reference and second == reference
    assert sum(s.num_cached_tokens for s in engine.stats) >= 4 * 20  # hits really happened


def test_preemption_with_a_tiny_pool_never_changes_output(reference):
    # 12 usable blocks of 4 tokens: exactly what the 37-token prompt plus its 12
    # new tokens needs alone, so running requests get preempted and recomputed.
    tokens, engine = run(num_blocks=13)
    assert tokens == reference
    assert sum(len(s.preempted) for s in engine.stats) >= 2


def test_preemption_with_chunking_and_caching_never_changes_output(reference):
    tokens, engine = run(num_blocks=13, max_num_batched_tokens=3, enable_caching=True)
    assert tokens == reference
    assert sum(len(s.preempted) for s in engine.stats) >= 1


@pytest.mark.parametrize("order", [[5, 4, 3, 2, 1, 0], [3, 0, 4, 1, 5, 2]])
def test_batch_order_and_size_never_change_output(reference, order):
    prompts = [PROMPTS[i] for i in order]
    for max_num_seqs in (1, 2, 6):
        tokens, _ = run(prompts, max_num_seqs=max_num_seqs)
        assert tokens == [reference[i] for i in order]


def test_block_size_never_changes_output(reference):
    for block_size in (1, 3, 16):
        tokens, _ = run(block_size=block_size, num_blocks=512 // block_size + 8)
        assert tokens == reference


def test_text_prompts_run_end_to_end_on_the_real_model():
    engine = LLMEngine(model="tiny-random", block_size=8, num_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    a, b = engine.generate(["Hello, paged world", "Hi"], params)
    assert a.prompt_token_ids == list(b"Hello, paged world")
    assert len(a.output_token_ids) == len(b.output_token_ids) == 5
    alone = LLMEngine(model="tiny-random", block_size=8, num_blocks=64).generate("Hi", params)
    assert list(b.output_token_ids) == list(alone[0].output_token_ids)


def test_corrupting_cached_kv_changes_greedy_output(reference):
    # The negative control: without it, "outputs equal" could hold because the
    # model ignored its cache (as the toy model does).
    engine = LLMEngine(model="tiny-random", block_size=4, num_blocks=128, enable_caching=False)
    engine.add_request(PROMPTS[3], GREEDY)
    engine.step()  # the 37-token prefill: blocks now hold K/V
    blocks = engine.kv_cache_manager.get_block_ids("req-0")
    rng = np.random.default_rng(0)
    cache = engine.model.kv_cache
    cache[:, :, blocks[2:5]] = rng.standard_normal(cache[:, :, blocks[2:5]].shape)
    out = []
    while engine.has_unfinished_requests():
        out += [list(r.output_token_ids) for r in engine.step()]
    assert out[0] != reference[3]
