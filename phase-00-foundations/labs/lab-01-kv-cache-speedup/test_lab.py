"""Lab 00-01 — the KV cache turns O(N^2) work into O(N) and changes no token."""
from course import load_impl

impl = load_impl(__file__)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# The guide's three-token example: query [1, 0]; keys and values of tokens 1..3.
Q3 = [1.0, 0.0]
KEYS = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
VALUES = [[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]]


def test_linear_is_one_dot_product_per_row_of_w():
    # The guide's primer: [1,2,3].[4,5,6] = 32, and x=[1,2,3] times a 2x3 W gives [4, 5].
    assert impl.linear([1, 2, 3], [[4, 5, 6]]).tolist() == [32.0]
    assert impl.linear([1, 2, 3], [[1, 0, 1], [0, 1, 1]]).tolist() == [4.0, 5.0]
    with pytest.raises(ValueError, match="shapes"):
        impl.linear([1, 2], [[1, 0, 1]])


def test_softmax_sums_to_one_and_survives_huge_logits():
    p = impl.softmax(np.array([1000.0, 1001.0, 999.0]))
    assert np.isfinite(p).all()
    assert p.sum() == pytest.approx(1.0)
    assert int(np.argmax(p)) == 1


def test_guide_worked_attention_example():
    # scores [1, 0, 1] scaled by 1/sqrt(2) -> softmax ~ [0.40, 0.20, 0.40]
    w = impl.attention_weights(Q3, KEYS)
    assert np.round(w, 3).tolist() == [0.401, 0.198, 0.401]
    # step 4 of the guide shows four decimals so the products add up: 4.011, 1.978, 2.006
    assert np.round(w, 4).tolist() == [0.4011, 0.1978, 0.4011]
    assert [round(float(w[0] * 10), 3), round(float(w[1] * 10), 3), round(float(w[2] * 5), 3)] == [
        4.011, 1.978, 2.006
    ]
    # the exponentials the guide shows: exp(0.707) ~ 2.03, and their sum ~ 5.06
    assert round(float(np.exp(1 / np.sqrt(2))), 2) == 2.03
    assert round(float(w[1] ** -1), 2) == 5.06
    out = impl.attend(Q3, KEYS, VALUES)
    assert np.round(out, 2).tolist() == [6.02, 3.98]  # "about [6, 4]"


def test_guide_temperature_table_is_a_softmax_of_scaled_logits():
    # The guide's section 0.8 table: softmax(logits / T) for T = 1, 0.5 and 2.
    logits = np.array([4.0, 1.5, 1.0, 0.5, -3.0])
    table = {t: np.round(impl.softmax(logits / t), 3).tolist() for t in (1.0, 0.5, 2.0)}
    assert table == {
        1.0: [0.860, 0.071, 0.043, 0.026, 0.001],
        0.5: [0.990, 0.007, 0.002, 0.001, 0.000],
        2.0: [0.584, 0.167, 0.130, 0.101, 0.018],
    }


def test_attend_counts_one_score_per_key():
    meter = impl.WorkMeter()
    impl.attend(Q3, KEYS, VALUES, meter)
    assert meter.scores == 3


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    prompt=st.lists(st.integers(0, 47), min_size=1, max_size=8),
    n_new=st.integers(1, 10),
    seed=st.integers(0, 3),
)
def test_both_loops_produce_identical_tokens(prompt, n_new, seed):
    model = impl.TinyModel(seed=seed)
    slow, _ = impl.generate_no_cache(model, prompt, n_new)
    fast, _ = impl.generate_with_cache(model, prompt, n_new)
    assert slow == fast
    assert slow[: len(prompt)] == prompt and len(slow) == len(prompt) + n_new


def test_cached_prefill_gives_bit_identical_logits_to_a_fresh_forward():
    model = impl.TinyModel(seed=1)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    meter = impl.WorkMeter()
    whole = impl.forward(model, tokens, 0, model.new_cache(16), meter)
    cache = model.new_cache(16)
    impl.forward(model, tokens[:5], 0, cache, meter)
    impl.forward(model, tokens[5:7], 5, cache, meter)
    last = impl.forward(model, tokens[7:], 7, cache, meter)
    assert np.array_equal(whole, last)


def _reference_logits(model, tokens):
    """An independent forward over the whole sequence: all rows at once, an explicit
    causal mask, the same weights. It shares no code with the learner's forward."""
    xs = np.stack([model.embed(t, p) for p, t in enumerate(tokens)])
    n = len(tokens)
    for layer in range(model.n_layers):
        q, k, v = xs @ model.wq[layer].T, xs @ model.wk[layer].T, xs @ model.wv[layer].T
        scores = q @ k.T / np.sqrt(model.d_model)
        scores[np.triu_indices(n, 1)] = -np.inf  # row i sees keys 0..i only
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        xs = np.tanh(xs + (w @ v) @ model.wo[layer].T)  # TinyModel.mix, row by row
    return xs[-1] @ model.w_lm.T


def test_forward_matches_an_independent_full_attention_reference():
    # Both loops agreeing proves nothing if both share a broken forward (say, one that
    # computes each layer's output and never passes it on). Pin forward to the math.
    for seed, tokens in ((0, [3, 1, 4, 1, 5, 9, 2, 6]), (3, [7]), (1, [0, 47, 12, 12, 30])):
        model = impl.TinyModel(seed=seed)
        got = impl.forward(model, tokens, 0, model.new_cache(len(tokens)), impl.WorkMeter())
        assert np.allclose(got, _reference_logits(model, tokens), rtol=1e-9, atol=1e-9)
    model = impl.TinyModel(seed=2)
    tokens, _ = impl.generate_with_cache(model, [5, 6, 7], 6)
    for i in range(3, len(tokens)):  # every greedy pick is the reference's argmax
        assert tokens[i] == int(np.argmax(_reference_logits(model, tokens[:i])))


def test_no_cache_work_is_the_arithmetic_series():
    model = impl.TinyModel()
    _, meter = impl.generate_no_cache(model, [1, 2, 3, 4, 5], 10)
    assert impl.kv_rows_no_cache(5, 10) == 95 == sum(range(5, 15))
    assert meter.kv_rows == model.n_layers * 95


def test_cached_work_is_linear_and_skips_the_last_token():
    model = impl.TinyModel()
    _, meter = impl.generate_with_cache(model, [1, 2, 3, 4, 5], 10)
    # 5 prompt rows, then one row for each of the first 9 generated tokens: the
    # 10th is sampled but never fed back, so its K/V is never computed.
    assert impl.kv_rows_with_cache(5, 10) == 14
    assert meter.kv_rows == model.n_layers * 14


@settings(max_examples=20, deadline=None, derandomize=True)
@given(p=st.integers(1, 6), n=st.integers(1, 8))
def test_measured_rows_match_both_formulas(p, n):
    model = impl.TinyModel(seed=2)
    prompt = list(range(p))
    _, slow = impl.generate_no_cache(model, prompt, n)
    _, fast = impl.generate_with_cache(model, prompt, n)
    assert slow.kv_rows == model.n_layers * impl.kv_rows_no_cache(p, n)
    assert fast.kv_rows == model.n_layers * impl.kv_rows_with_cache(p, n)


def test_attention_scores_cubic_without_cache_quadratic_with_it():
    model = impl.TinyModel()
    p, n = 4, 6
    _, slow = impl.generate_no_cache(model, list(range(p)), n)
    _, fast = impl.generate_with_cache(model, list(range(p)), n)
    # Without a cache, a step over L tokens scores the whole causal triangle L(L+1)/2.
    no_cache = sum((p + i) * (p + i + 1) // 2 for i in range(n))
    # With it, the prefill scores its triangle once and each decode row scores L keys.
    cached = p * (p + 1) // 2 + sum(p + i + 1 for i in range(n - 1))
    assert slow.scores == model.n_layers * no_cache
    assert fast.scores == model.n_layers * cached


def test_work_ratio_grows_with_length():
    # From an empty start (P = 1) the guide's N(N+1)/2 versus N is exact.
    assert impl.kv_rows_no_cache(1, 1000) == 500_500
    assert impl.kv_rows_with_cache(1, 1000) == 1000
    assert impl.kv_rows_no_cache(1, 10_000) == 50_005_000  # "about fifty million"
    ratios = [impl.kv_rows_no_cache(5, n) / impl.kv_rows_with_cache(5, n) for n in (10, 100, 1000)]
    assert ratios == sorted(ratios)
    assert ratios[-1] > 100
    assert round(ratios[-1], 1) == 502.5


def test_the_script_table_rows():
    # `python solution.py` prints these counts (summed over the 2 layers) for P = 16
    rows = [(n, 2 * impl.kv_rows_no_cache(16, n), 2 * impl.kv_rows_with_cache(16, n)) for n in (16, 32, 64, 128)]
    assert rows == [(16, 752, 62), (32, 2016, 94), (64, 6080, 158), (128, 20352, 286)]


def test_bad_arguments_are_rejected():
    model = impl.TinyModel()
    with pytest.raises(ValueError, match="n_new"):
        impl.generate_with_cache(model, [1], 0)
    with pytest.raises(ValueError, match="prompt"):
        impl.generate_no_cache(model, [], 3)


@pytest.mark.parametrize("formula", ["kv_rows_no_cache", "kv_rows_with_cache"])
@pytest.mark.parametrize(("prompt_len", "n_new"), [(0, 5), (5, 0), (0, 0), (-1, 3), (3, -2)])
def test_row_formulas_reject_a_count_below_one(formula, prompt_len, n_new):
    with pytest.raises(ValueError, match="prompt_len|n_new"):
        getattr(impl, formula)(prompt_len, n_new)


def test_row_formulas_accept_the_smallest_case_and_return_exact_integers():
    # one prompt token, one new token: one row either way
    assert impl.kv_rows_no_cache(1, 1) == 1 and impl.kv_rows_with_cache(1, 1) == 1
    for p, n in ((1, 1), (5, 10), (7, 4), (3, 1_000_001)):
        for value in (impl.kv_rows_no_cache(p, n), impl.kv_rows_with_cache(p, n)):
            assert type(value) is int  # a count of rows, not a float that looks like one
    # exact where a float would round: n(n-1)/2 above 2**53
    n = 2**27 + 1
    assert impl.kv_rows_no_cache(1, n) == n + n * (n - 1) // 2


def test_forward_rejects_no_tokens_and_a_cache_out_of_step_with_start_pos():
    model = impl.TinyModel()
    meter = impl.WorkMeter()
    with pytest.raises(ValueError, match="token_ids"):
        impl.forward(model, [], 0, model.new_cache(4), meter)
    cache = model.new_cache(8)
    impl.forward(model, [1, 2, 3], 0, cache, meter)
    for wrong in (0, 2, 4):  # the cache holds 3 positions
        with pytest.raises(ValueError, match="start_pos"):
            impl.forward(model, [4], wrong, cache, meter)
    assert len(cache) == 3  # a rejected call appends nothing
    impl.forward(model, [4], 3, cache, meter)
    assert len(cache) == 4


def test_mini_vllm_request_counters_follow_the_cached_formula():
    # The real engine keeps the same books: after a prompt of P tokens and n
    # generated ones, num_computed_tokens (tokens with K/V in the cache) is
    # P + n - 1, one behind num_tokens, because the last token is never fed back.
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    engine = LLMEngine(model="tiny-random", block_size=4, num_blocks=16)
    engine.add_request({"prompt_token_ids": [104, 105, 32, 116, 104, 101, 114, 101]},
                       SamplingParams(temperature=0.0, max_tokens=4))
    request = engine.scheduler.waiting[0]
    computed = []
    while engine.has_unfinished_requests():
        engine.step()
        computed.append((request.num_computed_tokens, request.num_tokens))
    assert computed == [(8, 9), (9, 10), (10, 11), (11, 12)]
    # what `python -m mini_vllm generate` shows for this run (02-mini-build.md): one 8-token
    # prefill, then single-token decodes; at most 3 blocks of 4 slots (12 slots for the 11
    # cached tokens), all returned to the pool once the request finishes
    assert [sum(s.num_scheduled_tokens.values()) for s in engine.stats] == [8, 1, 1, 1]
    assert max(s.blocks_used for s in engine.stats) == 3
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1  # everything but the null block
    assert request.num_computed_tokens == impl.kv_rows_with_cache(8, 4)
    assert impl.kv_rows_no_cache(8, 4) == 8 + 9 + 10 + 11


def test_exercise_numbers():
    # EXERCISES.md: the same keys and values, queried with [0, 1] instead of [1, 0]
    w = impl.attention_weights([0.0, 1.0], KEYS)
    assert np.round(w, 3).tolist() == [0.248, 0.503, 0.248]
    assert np.round(impl.attend([0.0, 1.0], KEYS, VALUES), 2).tolist() == [3.72, 6.28]
    # recomputing everything for a 2,000-token generation from a one-token prompt
    assert impl.kv_rows_no_cache(1, 2000) == 2_001_000
    assert impl.kv_rows_with_cache(1, 2000) == 2000
