import course
from course import load_impl

impl = load_impl(__file__)

import ast  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

UPSTREAM = course.UPSTREAM
H100_SMS = 132


def heuristic(common_prefix_len, query_lens, q_heads=32, kv_heads=8, alibi=False, sliding=False,
              local=False, num_sms=H100_SMS, dcp=1):
    return impl.use_cascade_attention(common_prefix_len, np.asarray(query_lens), q_heads, kv_heads,
                                      alibi, sliding, local, num_sms, dcp)


# ---------------------------------------------------------------- common blocks


def test_common_blocks_stop_at_the_first_block_not_held_by_everyone():
    # Block 9 is shared by all three again after a private block: it does not count.
    tables = [[5, 6, 7, 9], [5, 6, 8, 9], [5, 6, 3, 9]]
    refs = {5: 3, 6: 3, 7: 1, 8: 1, 3: 1, 9: 3}
    assert impl.num_common_prefix_blocks(tables, refs) == 2


def test_common_blocks_need_every_request_holding_kv():
    # Two of three requests share blocks 1 and 2: not common to the batch.
    tables = [[1, 2, 4], [1, 2, 5], [6]]
    refs = {1: 2, 2: 2, 4: 1, 5: 1, 6: 1}
    assert impl.num_common_prefix_blocks(tables, refs) == 0
    # A lone request "shares" all of its blocks with itself.
    assert impl.num_common_prefix_blocks([[3, 1, 2]], {3: 1, 1: 1, 2: 1}) == 3
    assert impl.num_common_prefix_blocks([[], [4]], {4: 1}) == 0


# ---------------------------------------------------------------- prefix length


def test_prefix_len_is_capped_by_the_least_computed_request_without_plus_one():
    assert impl.cascade_prefix_len(32, 16, [575] * 8) == 512
    # 47 computed tokens: the cap is 47, cut to 32 (a cap of 48 would keep 48).
    assert impl.cascade_prefix_len(4, 16, [47, 100]) == 32
    assert impl.cascade_prefix_len(4, 16, [48, 100]) == 48
    assert impl.cascade_prefix_len(32, 16, [600, 300, 900]) == 288


def test_prefix_len_is_a_whole_number_of_blocks():
    assert impl.cascade_prefix_len(10, 16, [100, 200]) == 96
    assert impl.cascade_prefix_len(3, 16, [15, 40]) == 0
    assert impl.cascade_prefix_len(0, 16, [1000]) == 0
    # Edges of the arguments: a block of one token, a request with nothing computed.
    assert impl.cascade_prefix_len(3, 1, [2, 5]) == 2
    assert impl.cascade_prefix_len(2, 16, [0, 40]) == 0


# ---------------------------------------------------------------- the heuristic


def test_short_prefix_or_few_requests_never_cascade():
    assert heuristic(255, [1] * 64, q_heads=8, kv_heads=8) is False
    assert heuristic(256, [1] * 64, q_heads=8, kv_heads=8) is True
    assert heuristic(512, [1] * 7, q_heads=8, kv_heads=8) is False
    assert heuristic(512, [1] * 8, q_heads=8, kv_heads=8) is True


def test_unsupported_variants_never_cascade():
    for kwargs in ({"alibi": True}, {"sliding": True}, {"local": True}, {"dcp": 2}):
        assert heuristic(4096, [1] * 64, q_heads=8, kv_heads=8, **kwargs) is False


def test_without_flash_decoding_cascade_always_wins():
    # MHA (one query head per KV head): flash-decoding is not used.
    assert heuristic(512, [1] * 8, q_heads=32, kv_heads=32) is True
    # GQA, but one request is a prefill chunk: not a pure decode batch.
    assert heuristic(512, [1] * 7 + [5], q_heads=32, kv_heads=8) is True
    # query_lens may be a plain list: eight decodes of a GQA model go to the cost model.
    assert impl.use_cascade_attention(512, [1] * 8, 32, 8, False, False, False, H100_SMS) is False


def test_gqa_decode_uses_the_cost_model():
    assert impl.cascade_cost_model(512, 8, 32, 8, H100_SMS) == (4, 2)
    assert heuristic(512, [1] * 8) is False
    assert impl.cascade_cost_model(512, 64, 32, 8, H100_SMS) == (4, 16)
    assert heuristic(512, [1] * 64) is True
    # More query tiles and waves: 300 requests, 1,000-token prefix.
    assert impl.cascade_cost_model(1000, 300, 32, 8, H100_SMS) == (8, 146)
    assert impl.cascade_cost_model(1000, 300, 64, 8, 16) == (96, 1200)
    # 256 query heads on one KV head: two query tiles per flash-decoding CTA group.
    assert impl.cascade_cost_model(512, 8, 256, 1, 16) == (64, 4)
    # The smallest legal arguments, and an empty prefix.
    assert impl.cascade_cost_model(512, 1, 1, 1, 1) == (4, 4)
    assert impl.cascade_cost_model(512, 8, 1, 1, 1) == (4, 32)
    assert impl.cascade_cost_model(0, 8, 32, 8, 132) == (0, 0)
    assert all(type(t) is int for t in impl.cascade_cost_model(512, 64, 32, 8, H100_SMS))


def test_a_tie_goes_to_flash_decoding():
    # 64 SMs: cascade 1 wave x 4 tiles = 4, flash-decoding cdiv(256, 64) = 4.
    assert impl.cascade_cost_model(512, 8, 32, 8, 64) == (4, 4)
    assert heuristic(512, [1] * 8, num_sms=64) is False


# ---------------------------------------------------------------- rows read


def test_shared_prefix_is_read_once():
    assert impl.kv_rows_read([576] * 8, 0) == 4608
    assert impl.kv_rows_read([576] * 8, 512) == 1024
    assert impl.kv_rows_read([576] * 8, 0) - impl.kv_rows_read([576] * 8, 512) == 7 * 512
    assert impl.kv_rows_read([300, 520, 700], 256) == 256 + 44 + 264 + 444
    assert impl.kv_rows_read([100], 64) == 100  # one request gains nothing
    assert impl.kv_rows_read([64, 100], 64) == 64 + 0 + 36  # a prefix as long as a sequence


# ---------------------------------------------------------------- the math


def plain_attention(q, k_cache, v_cache, qsl, seq_lens, table, scale):
    """Oracle: per request, gather every key, causal mask aligned bottom-right, float64."""
    bs = k_cache.shape[1]
    out = np.zeros(q.shape)
    group = q.shape[1] // k_cache.shape[2]
    for b in range(len(seq_lens)):
        lo, hi, n = qsl[b], qsl[b + 1], seq_lens[b]
        pos = np.arange(n)
        k = k_cache[np.asarray(table[b])[pos // bs], pos % bs].astype(np.float64)
        v = v_cache[np.asarray(table[b])[pos // bs], pos % bs].astype(np.float64)
        for i, t in enumerate(range(lo, hi)):
            visible = n - (hi - lo) + i + 1
            for h in range(q.shape[1]):
                s = k[:visible, h // group] @ q[t, h].astype(np.float64) * scale
                w = np.exp(s - s.max())
                out[t, h] = w @ v[:visible, h // group] / w.sum()
    return out


def mixed_batch(dtype=np.float64, seed=0):
    """4 requests share 3 blocks (bs 4, 12 tokens); two decodes, a 3-row and a 2-row chunk."""
    rng = np.random.default_rng(seed)
    heads, kv_heads, dim, bs = 4, 2, 8, 4
    k_cache = rng.standard_normal((24, bs, kv_heads, dim)).astype(dtype)
    v_cache = rng.standard_normal((24, bs, kv_heads, dim)).astype(dtype)
    table = np.array([[7, 2, 9, 1, 4, 0],
                      [7, 2, 9, 3, 0, 0],
                      [7, 2, 9, 5, 6, 11],
                      [7, 2, 9, 8, 10, 0]])
    seq_lens = [17, 14, 23, 19]
    qsl = [0, 1, 2, 5, 7]  # decode, decode, 3-row chunk, 2-row chunk
    q = rng.standard_normal((7, heads, dim)).astype(dtype)
    return q, k_cache, v_cache, qsl, seq_lens, table


def test_cascade_equals_plain_attention_on_a_mixed_batch():
    q, kc, vc, qsl, seq_lens, table = mixed_batch()
    want = plain_attention(q, kc, vc, qsl, seq_lens, table, 0.3)
    for prefix in (0, 4, 8, 12):
        got = impl.cascade_attention(q, kc, vc, qsl, seq_lens, table, prefix, 0.3)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # The prefix may reach exactly to a request's context (request 1: 12 before the step).
    lens = [17, 13, 23, 19]
    want = plain_attention(q, kc, vc, qsl, lens, table, 0.3)
    got = impl.cascade_attention(q, kc, vc, qsl, lens, table, 12, 0.3)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_cascade_of_a_single_request_is_plain_attention():
    q, kc, vc, qsl, seq_lens, table = mixed_batch(seed=5)
    rows = q[2:5]  # request 2's 3-row chunk alone
    want = plain_attention(rows, kc, vc, [0, 3], [23], table[2:3], 0.3)
    for prefix in (0, 8, 20):
        got = impl.cascade_attention(rows, kc, vc, [0, 3], [23], table[2:3], prefix, 0.3)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_cascade_matches_mini_vllm_paged_attention():
    from mini_vllm.model_input import ModelInput
    from mini_vllm.models.attention import paged_attention

    q, kc, vc, qsl, seq_lens, table = mixed_batch(np.float32, seed=3)
    q_lens = np.diff(qsl)
    positions = np.concatenate([np.arange(s - n, s) for s, n in zip(seq_lens, q_lens, strict=True)])
    mi = ModelInput(token_ids=np.zeros(len(q), np.int64), positions=positions.astype(np.int64),
                    query_start_loc=np.asarray(qsl, np.int64), seq_lens=np.asarray(seq_lens, np.int64),
                    block_tables=table.astype(np.int64), slot_mapping=np.zeros(len(q), np.int64),
                    logits_indices=np.asarray(qsl[1:], np.int64) - 1, block_size=4)
    want = paged_attention(q, kc, vc, mi, 0.25)
    got = impl.cascade_attention(q, kc, vc, qsl, seq_lens, table, 12, 0.25)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # float32 inputs, float64 arithmetic all the way: as exact as the float64 oracle.
    exact = plain_attention(q, kc, vc, qsl, seq_lens, table, 0.25)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-12)


def test_suffix_pass_hides_future_keys():
    # Loud values in every slot a query must not see: outputs stay equal.
    q, kc, vc, qsl, seq_lens, table = mixed_batch()
    base = impl.cascade_attention(q, kc, vc, qsl, seq_lens, table, 12, 0.3)
    kc2, vc2 = kc.copy(), vc.copy()
    kc2[11, 2], vc2[11, 2] = 50.0, 1e3  # request 2: position 22 (its last key)
    kc2[0], vc2[0] = np.nan, np.nan  # the null block pads tables; never read
    kc2[3, 2:], vc2[3, 2:] = 50.0, 1e3  # request 1: positions 14, 15 are past seq_len 14
    got = impl.cascade_attention(q, kc2, vc2, qsl, seq_lens, table, 12, 0.3)
    np.testing.assert_array_equal(np.delete(got, 4, axis=0), np.delete(base, 4, axis=0))
    assert np.isfinite(got).all()


def test_bad_cascade_arguments_raise_value_error_naming_the_parameter():
    q, kc, vc, qsl, seq_lens, table = mixed_batch()
    with pytest.raises(ValueError, match="common_prefix_len"):
        impl.cascade_attention(q, kc, vc, qsl, seq_lens, table, 6, 0.3)  # not a block multiple
    with pytest.raises(ValueError, match="common_prefix_len"):
        impl.cascade_attention(q, kc, vc, qsl, seq_lens, table, -4, 0.3)
    with pytest.raises(ValueError, match="common_prefix_len"):
        impl.cascade_attention(q, kc, vc, qsl, [17, 14, 23, 5], table, 4, 0.3)  # context 3 < 4
    with pytest.raises(ValueError, match="common_prefix_len"):
        impl.cascade_attention(q, kc, vc, qsl, [17, 12, 23, 19], table, 12, 0.3)  # context 11 < 12
    other = table.copy()
    other[3, 1] = 13
    with pytest.raises(ValueError, match="block_table"):
        impl.cascade_attention(q, kc, vc, qsl, seq_lens, other, 12, 0.3)


def test_bad_arguments_raise_value_error_naming_the_parameter():
    with pytest.raises(ValueError, match="block_tables"):
        impl.num_common_prefix_blocks([], {})
    with pytest.raises(ValueError, match="ref_counts"):
        impl.num_common_prefix_blocks([[1, 2]], {1: 1})
    with pytest.raises(ValueError, match="ref_counts"):
        impl.num_common_prefix_blocks([[1], [1]], {1: 3})
    with pytest.raises(ValueError, match="ref_counts"):
        impl.num_common_prefix_blocks([[1], [2]], {1: 0, 2: 1})
    with pytest.raises(ValueError, match="num_kv_heads"):
        impl.use_cascade_attention(512, [1] * 8, 32, 12, False, False, False, 132)
    with pytest.raises(ValueError, match="num_kv_heads"):
        impl.use_cascade_attention(100, [1] * 8, 32, 0, False, False, False, 132)
    with pytest.raises(ValueError, match="num_common_blocks"):
        impl.cascade_prefix_len(-1, 16, [10])
    with pytest.raises(ValueError, match="block_size"):
        impl.cascade_prefix_len(1, 0, [10])
    with pytest.raises(ValueError, match="num_computed_tokens"):
        impl.cascade_prefix_len(1, 16, [])
    with pytest.raises(ValueError, match="num_computed_tokens"):
        impl.cascade_prefix_len(1, 16, [10, -1])
    for args, name in (((512, 0, 32, 8, 132), "num_reqs"), ((512, 8, 0, 8, 132), "num_query_heads"),
                       ((512, 8, 32, 0, 132), "num_kv_heads"), ((512, 8, 32, 8, 0), "num_sms"),
                       ((-1, 8, 32, 8, 132), "common_prefix_len"), ((512, 8, 32, 12, 132), "num_kv_heads")):
        with pytest.raises(ValueError, match=name):
            impl.cascade_cost_model(*args)
    with pytest.raises(ValueError, match="seq_lens"):
        impl.kv_rows_read([], 0)
    with pytest.raises(ValueError, match="common_prefix_len"):
        impl.kv_rows_read([10, 20], -1)
    with pytest.raises(ValueError, match="common_prefix_len"):
        impl.kv_rows_read([10, 20], 16)
    with pytest.raises(ValueError, match="own_len"):
        impl.measure_shared_prefix_decode(own_len=1)
    with pytest.raises(ValueError, match="num_requests"):
        impl.measure_shared_prefix_decode(num_requests=0)
    with pytest.raises(ValueError, match="prefix_len"):
        impl.measure_shared_prefix_decode(prefix_len=0)
    with pytest.raises(ValueError, match="block_size"):
        impl.measure_shared_prefix_decode(block_size=0)


# ---------------------------------------------------------------- on mini_vllm


@pytest.fixture(scope="module")
def measured():
    return impl.measure_shared_prefix_decode()  # 8 requests, 512 shared + 64 own, block 16


def test_engine_decode_step_reads_1024_rows_instead_of_4608(measured):
    m = measured
    assert m.seq_lens == [576] * 8 and m.num_computed_tokens == [575] * 8
    assert m.num_common_blocks == 32
    # Cross-check with the tables themselves: 32 identical leading ids, then all distinct.
    first = m.block_tables[0]
    assert all(row[:32] == first[:32] for row in m.block_tables)
    assert len({row[32] for row in m.block_tables}) == 8
    assert all(m.ref_counts[b] == 8 for b in first[:32])
    assert m.common_prefix_len == 512
    assert (m.rows_plain, m.rows_cascade) == (4608, 1024)
    assert m.rows_plain - m.rows_cascade == 3584


def test_agrees_with_the_engines_own_counters():
    """mini_vllm counts both things itself: common blocks in its cache manager, rows per step."""
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    engine = LLMEngine("tiny-random", block_size=16, attention_backend="NUMPY_FLASH")
    rng = np.random.default_rng(3)
    prefix = rng.integers(1, 200, 64).tolist()  # 4 whole blocks, shared by all
    for _ in range(4):
        engine.add_request({"prompt_token_ids": prefix + rng.integers(1, 200, 15).tolist()},
                           SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.step()  # the 4 prefills (79 tokens each): the prefix blocks are shared from the 2nd on
    kv = engine.kv_cache_manager
    tables = [kv.get_block_ids(f"req-{i}") for i in range(4)]
    refs = {b.block_id: b.ref_cnt for b in kv.block_pool.blocks}
    assert impl.num_common_prefix_blocks(tables, refs) == kv.get_num_common_prefix_blocks("req-0") == 4
    engine.step()  # one decode each: seq_len 80 = 5 whole blocks, in each of tiny-random's 2 layers
    assert engine.stats[-1].num_decode_tokens == 4
    assert engine.stats[-1].kv_rows_read == 2 * impl.kv_rows_read([80] * 4, 0) == 2 * 320
    assert impl.kv_rows_read([80] * 4, impl.cascade_prefix_len(4, 16, [79] * 4)) == 64 + 4 * 16


def test_smallest_engine_measurement():
    # One request, one shared token, one own token, blocks of one token: 3 keys at decode.
    m = impl.measure_shared_prefix_decode(num_requests=1, prefix_len=1, own_len=2, block_size=1)
    assert m.seq_lens == [3] and m.num_computed_tokens == [2] and len(m.block_tables[0]) == 3
    assert m.num_common_blocks == 3  # a lone request shares all of its blocks with itself
    assert (m.common_prefix_len, m.rows_plain, m.rows_cascade) == (2, 3, 3)


def test_cascade_on_the_engines_real_kv_cache(measured):
    from mini_vllm.model_input import ModelInput
    from mini_vllm.models.attention import paged_attention

    m = measured
    heads = 2 * m.k_cache.shape[2]  # tiny-random: 4 query heads over 2 KV heads
    rng = np.random.default_rng(1)
    q = rng.standard_normal((8, heads, m.k_cache.shape[3])).astype(np.float32)
    width = max(len(r) for r in m.block_tables)
    table = np.array([r + [0] * (width - len(r)) for r in m.block_tables], dtype=np.int64)
    mi = ModelInput(token_ids=np.zeros(8, np.int64), positions=np.full(8, 575, np.int64),
                    query_start_loc=np.asarray(m.query_start_loc, np.int64),
                    seq_lens=np.asarray(m.seq_lens, np.int64), block_tables=table,
                    slot_mapping=np.zeros(8, np.int64), logits_indices=np.arange(8), block_size=16)
    want = paged_attention(q, m.k_cache, m.v_cache, mi, 0.25)
    got = impl.cascade_attention(q, m.k_cache, m.v_cache, m.query_start_loc, m.seq_lens,
                                 table.tolist(), m.common_prefix_len, 0.25)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # On an H100, vLLM would not cascade this shape: 4 query heads over 2 KV heads,
    # 8 decodes: cascade 1 wave x 4 tiles vs flash-decoding cdiv(64, 132) = 1.
    assert impl.cascade_cost_model(512, 8, 4, 2, H100_SMS) == (4, 1)
    assert heuristic(512, [1] * 8, q_heads=4, kv_heads=2) is False


# ---------------------------------------------------------------- upstream


@pytest.mark.upstream
def test_heuristic_matches_upstream_on_500_random_configurations():
    source = (UPSTREAM / "vllm/v1/attention/backends/flash_attn.py").read_text()
    fn = next(node for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef) and node.name == "use_cascade_attention")
    namespace = {"np": np, "cdiv": lambda a, b: -(-a // b)}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "flash_attn.py", "exec"), namespace)
    upstream_fn = namespace["use_cascade_attention"]
    rng = np.random.default_rng(2026)
    outcomes = set()
    for _ in range(500):
        kv_heads = int(rng.choice([1, 2, 4, 8, 16, 32]))
        q_heads = kv_heads * int(rng.choice([1, 1, 2, 4, 8]))
        num_reqs = int(rng.integers(1, 400))
        decode_only = rng.random() < 0.7
        query_lens = np.ones(num_reqs, dtype=np.int64) if decode_only else rng.integers(1, 9, num_reqs)
        args = (int(rng.integers(0, 8192)), query_lens, q_heads, kv_heads, bool(rng.random() < 0.1),
                bool(rng.random() < 0.1), bool(rng.random() < 0.1), int(rng.choice([16, 64, 108, 132, 148])),
                int(rng.choice([1, 1, 1, 2])))
        want = bool(upstream_fn(*args))
        assert impl.use_cascade_attention(*args) == want, args
        outcomes.add(want)
    assert outcomes == {True, False}
