from course import load_impl

impl = load_impl(__file__)

import random  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

A = [10 + i for i in range(8)]  # two 8-token prompts
B = [50 + i for i in range(8)]


def test_the_seeds_5_block_pool_cannot_hold_even_one_request():
    assert impl.kv_slots_needed(8, 20) == 27
    assert impl.min_num_blocks(8, 20, 4) == 8  # 7 blocks of 4 slots + the null block
    assert impl.min_num_blocks(8, 20, 4) > 5
    # mini_vllm refuses such a request up front instead of livelocking.
    with pytest.raises(ValueError, match="usable blocks"):
        impl.run([A], num_blocks=impl.min_num_blocks(8, 20, 4) - 1)


def test_a_pool_of_exactly_min_num_blocks_runs_one_request_to_the_end():
    res = impl.run([A], num_blocks=impl.min_num_blocks(8, 20, 4))
    assert len(res.token_ids[0]) == 20 and res.preemptions == []


def test_bad_lengths_and_block_sizes_raise_value_error_naming_the_parameter():
    for args, name in [((0, 20), "prompt_len"), ((8, 0), "max_tokens"), ((-3, 5), "prompt_len"),
                       ((8.0, 20), "prompt_len"), ((8, True), "max_tokens")]:
        with pytest.raises(ValueError, match=name):
            impl.kv_slots_needed(*args)
        with pytest.raises(ValueError, match=name):
            impl.min_num_blocks(*args, 4)
    for bs in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="block_size"):
            impl.min_num_blocks(8, 20, bs)
    assert impl.kv_slots_needed(1, 1) == 1 and impl.min_num_blocks(1, 1, 1) == 2


def test_outputs_are_mini_vllms_greedy_tokens_run_past_eos():
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    rng = random.Random(0)
    eos_prone = [rng.randrange(1, 256) for _ in range(50)]  # greedy EOS as its 4th token
    res = impl.run([eos_prone, A], num_blocks=512, max_tokens=8)
    want = LLMEngine("tiny-random", block_size=4, num_blocks=512, enable_caching=False).generate(
        [{"prompt_token_ids": p} for p in (eos_prone, A)],
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert res.token_ids == [list(r.output_token_ids) for r in want]
    assert [len(t) for t in res.token_ids] == [8, 8] and res.token_ids[0][3] == 256


def test_two_requests_do_not_fit_together_but_each_fits_alone():
    usable = 10 - 1
    need = impl.min_num_blocks(8, 20, 4) - 1
    assert need <= usable < 2 * need  # 7 <= 9 < 14


def test_tight_pool_outputs_match_a_roomy_pool_token_for_token():
    tight, roomy = impl.run([A, B], num_blocks=10), impl.run([A, B], num_blocks=256)
    assert tight.token_ids == roomy.token_ids
    assert tight.preemptions  # the "survives" test is only worth something if it happened
    assert [len(t) for t in tight.token_ids] == [20, 20]


def test_preemption_really_happens_at_step_10_and_takes_the_newest_request():
    tight, roomy = impl.run([A, B], num_blocks=10), impl.run([A, B], num_blocks=256)
    assert roomy.preemptions == [] and roomy.num_steps == 20
    assert tight.preemptions == [(10, tight.request_ids[1])]
    assert tight.num_preemptions == [0, 1]


def test_the_victim_is_replayed_by_recompute_after_the_survivor_finishes():
    tight = impl.run([A, B], num_blocks=10)
    victim = tight.request_ids[1]
    # 8 prompt tokens + the 9 outputs it had: all recomputed in one step (step 21).
    assert tight.step_tokens[20] == {victim: 17}
    assert all(victim not in s for s in tight.step_tokens[10:20])  # it waited for memory
    assert tight.num_steps == 31  # vs 20 with room: the price is time, not output


def test_with_prefix_caching_the_replay_gets_a_head_start():
    tight = impl.run([A, B], num_blocks=10, enable_caching=True)
    victim = tight.request_ids[1]
    # Two of its four full blocks survived in the free queue: 8 tokens are hits.
    assert tight.step_tokens[20] == {victim: 9}
    assert tight.token_ids == impl.run([A, B], num_blocks=256).token_ids


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.integers(2, 4), st.integers(1, 12), st.integers(2, 16), st.sampled_from([2, 4]), st.integers(0, 3))
def test_any_tight_but_feasible_pool_preserves_outputs(n, prompt_len, max_tokens, bs, spare):
    rng = random.Random(prompt_len * 31 + max_tokens)
    prompts = [[rng.randrange(1, 256) for _ in range(prompt_len)] for _ in range(n)]
    num_blocks = impl.min_num_blocks(prompt_len, max_tokens, bs) + spare
    tight = impl.run(prompts, num_blocks, bs, max_tokens, enable_caching=bool(spare % 2))
    assert tight.token_ids == impl.run(prompts, 512, bs, max_tokens).token_ids
