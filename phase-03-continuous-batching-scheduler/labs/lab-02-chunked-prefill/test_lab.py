from course import load_impl

impl = load_impl(__file__)

import random  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def prompt(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(1, 256) for _ in range(n)]


def test_threshold_zero_means_one_step_only_when_the_prompt_fits_the_budget():
    assert impl.num_prefill_steps(100, 0, 2048) == 1
    # 0 disables the threshold, not chunking: the budget still cuts the prompt.
    assert impl.num_prefill_steps(5000, 0, 2048) == 3
    assert impl.prefill_chunks(5000, 0, 2048) == [2048, 2048, 904]


def test_threshold_above_the_budget_is_moot():
    assert impl.chunk_size(4096, 2048) == 2048
    assert impl.num_prefill_steps(5000, 4096, 2048) == 3


def test_exact_division_gets_no_extra_step():
    assert impl.num_prefill_steps(256, 32, 2048) == 8
    assert impl.prefill_chunks(256, 32, 2048) == [32] * 8
    assert impl.num_prefill_steps(257, 32, 2048) == 9
    assert impl.prefill_chunks(257, 32, 2048) == [32] * 8 + [1]


def test_a_4096_token_prompt_at_threshold_512_takes_8_steps():
    assert impl.num_prefill_steps(4096, 512, 2048) == 8
    assert impl.num_prefill_steps(4096, 512, 512) == 8
    assert impl.num_prefill_steps(4096, 0, 512) == 8
    assert impl.num_prefill_steps(4096, 0, 8192) == 1


def test_numbers_used_in_the_exercises():
    assert impl.prefill_chunks(10, 0, 4) == [4, 4, 2] and impl.num_prefill_steps(10, 0, 4) == 3
    assert impl.num_prefill_steps(16384, 0, 2048) == 8
    assert impl.num_prefill_steps(16384, 512, 2048) == 32


def test_a_threshold_of_1_is_a_real_cap_not_off():
    assert impl.chunk_size(1, 2048) == 1
    assert impl.prefill_chunks(3, 1, 2048) == [1, 1, 1]
    assert impl.num_prefill_steps(3, 1, 2048) == 3
    assert impl.chunk_size(0, 1) == 1 and impl.prefill_chunks(2, 0, 1) == [1, 1]


def test_bad_arguments_raise_value_error_naming_the_parameter():
    with pytest.raises(ValueError, match="prompt_len"):
        impl.num_prefill_steps(0, 0, 2048)
    with pytest.raises(ValueError, match="prompt_len"):
        impl.prefill_chunks(0, 16, 2048)
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        impl.num_prefill_steps(10, -1, 2048)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        impl.chunk_size(16, 0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        impl.num_prefill_steps(10, 4, -3)
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        impl.chunk_size(-1, 2048)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        impl.prefill_chunks(10, 0, 0)


@pytest.mark.parametrize("threshold,budget", [(0, 2048), (7, 2048), (16, 2048), (100, 2048), (150, 2048), (0, 24), (32, 24)])
def test_engine_schedules_exactly_the_predicted_chunks(threshold, budget):
    res = impl.generate([prompt(100)], threshold, budget, max_tokens=3)
    chunks = impl.prefill_chunks(100, threshold, budget)
    rid = res.request_ids[0]
    assert [s[rid] for s in res.step_tokens] == chunks + [1, 1]
    assert res.first_token_steps == [impl.num_prefill_steps(100, threshold, budget)]


def test_chunked_prefill_never_changes_output_on_real_attention():
    prompts = [prompt(37, 1), prompt(80, 2), prompt(5, 3)]
    baseline = impl.generate(prompts, 0, 2048, max_tokens=8)
    assert len(baseline.step_tokens) == 8  # unchunked: all three prefill in step 1
    for threshold, budget in [(8, 2048), (13, 2048), (0, 16), (5, 9)]:
        chunked = impl.generate(prompts, threshold, budget, max_tokens=8)
        assert chunked.token_ids == baseline.token_ids
        assert len(chunked.step_tokens) > len(baseline.step_tokens)  # the timing did change


def test_generate_runs_every_prompt_to_max_tokens_even_past_eos():
    # prompt(50, 0) makes tiny-random emit EOS as its 4th greedy token; the
    # comparison needs equal-length outputs, so EOS must not stop it.
    res = impl.generate([prompt(50, 0), prompt(12, 1)], 0, 2048, max_tokens=9)
    assert [len(t) for t in res.token_ids] == [9, 9]
    assert res.token_ids[0][3] == 256  # the EOS id, kept as an ordinary token
    assert len(res.step_tokens) == 9 and res.first_token_steps == [1, 1]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(1, 90), st.integers(0, 40), st.integers(1, 64))
def test_lone_prompt_schedule_matches_the_formula_for_any_knobs(n, threshold, budget):
    res = impl.generate([prompt(n, n)], threshold, budget, max_tokens=1)
    assert [s[res.request_ids[0]] for s in res.step_tokens] == impl.prefill_chunks(n, threshold, budget)
    assert len(res.step_tokens) == impl.num_prefill_steps(n, threshold, budget)
