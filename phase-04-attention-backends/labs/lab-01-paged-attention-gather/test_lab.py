"""Lab 04-01 tests: streaming softmax over a paged cache equals dense attention."""
from __future__ import annotations

import contextlib
import io
import pathlib
import runpy

import numpy as np
import pytest

from course import load_impl

impl = load_impl(__file__)

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 4
SCALE = 0.3  # deliberately not 1/sqrt(DIM): the scale argument must be the one used


def make_cache(rng, num_blocks=8, block=BLOCK, kv_heads=KV_HEADS, dim=DIM):
    shape = (num_blocks, block, kv_heads, dim)
    return rng.standard_normal(shape), rng.standard_normal(shape)


def contiguous(cache, table, seq_len):
    """The oracle's view: the sequence's rows in logical order (test-side gather)."""
    return np.concatenate([cache[b] for b in table])[:seq_len]


def dense_oracle(q, k, v, scale):
    """Independent of the learner: float64 softmax per head, GQA by h // group."""
    group = q.shape[0] // k.shape[1]
    out = np.empty(q.shape)
    for h in range(q.shape[0]):
        s = k[:, h // group] @ q[h] * scale
        p = np.exp(s - s.max())
        out[h] = p @ v[:, h // group] / p.sum()
    return out


def run_paged(q, k_cache, v_cache, table, seq_len, scale=SCALE):
    reader = impl.BlockReader(k_cache, v_cache)
    out, state = impl.paged_online_attention(q, k_cache, v_cache, table, seq_len, scale, reader)
    return out, state, reader


def test_dense_attention_matches_an_independent_softmax():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((HEADS, DIM))
    k, v = rng.standard_normal((2, 11, KV_HEADS, DIM))
    out = impl.dense_attention(q, k, v, SCALE)
    np.testing.assert_allclose(out, dense_oracle(q, k, v, SCALE), rtol=0, atol=1e-12)
    # array-likes of any float dtype are accepted; the result is float64
    as_lists = impl.dense_attention(q.astype(np.float32), k.tolist(), v.tolist(), SCALE)
    assert as_lists.dtype == np.float64
    np.testing.assert_allclose(as_lists, out, rtol=0, atol=1e-6)
    # one key: the output is that key's value row, whatever the score
    one = impl.dense_attention(q, k[:1] * 50, v[:1], SCALE)
    np.testing.assert_allclose(one, v[0, [0, 0, 1, 1]], rtol=0, atol=1e-12)


def test_aligned_sequence_equals_dense_attention():
    rng = np.random.default_rng(2)
    k_cache, v_cache = make_cache(rng)
    q = rng.standard_normal((HEADS, DIM))
    table = [3, 1, 7, 0]
    out, _, _ = run_paged(q, k_cache, v_cache, table, 16)
    k, v = contiguous(k_cache, table, 16), contiguous(v_cache, table, 16)
    np.testing.assert_allclose(out, dense_oracle(q, k, v, SCALE), rtol=0, atol=1e-12)
    np.testing.assert_allclose(impl.dense_attention(q, k, v, SCALE), out, rtol=0, atol=1e-12)


def test_partial_last_block_equals_dense_attention():
    rng = np.random.default_rng(3)
    k_cache, v_cache = make_cache(rng)
    q = rng.standard_normal((HEADS, DIM))
    table = [3, 1, 7, 0]  # 13 tokens: three full blocks and one single-token block
    out, _, reader = run_paged(q, k_cache, v_cache, table, 13)
    k, v = contiguous(k_cache, table, 13), contiguous(v_cache, table, 13)
    np.testing.assert_allclose(out, dense_oracle(q, k, v, SCALE), rtol=0, atol=1e-12)
    assert reader.trace == [(3, 4), (1, 4), (7, 4), (0, 1)]


@pytest.mark.parametrize("seq_len", [1, 4, 5, 9, 12])
def test_paging_invariance_two_physical_layouts_agree(seq_len):
    rng = np.random.default_rng(4)
    k_seq, v_seq = rng.standard_normal((2, 12, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    outs = []
    for table in ([0, 1, 2], [7, 3, 5]):
        k_cache, v_cache = make_cache(rng)  # different garbage everywhere else
        for i, b in enumerate(table):
            rows = slice(i * BLOCK, (i + 1) * BLOCK)
            k_cache[b], v_cache[b] = k_seq[rows], v_seq[rows]
        outs.append(run_paged(q, k_cache, v_cache, table, seq_len)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-12)
    expect = dense_oracle(q, k_seq[:seq_len], v_seq[:seq_len], SCALE)
    np.testing.assert_allclose(outs[1], expect, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("seq_len", "expected"), [
    (1, [(6, 1)]),
    (8, [(6, 4), (2, 4)]),
    (10, [(6, 4), (2, 4), (5, 2)]),
])
def test_reads_each_block_once_in_table_order(seq_len, expected):
    rng = np.random.default_rng(5)
    k_cache, v_cache = make_cache(rng)
    table = [6, 2, 5, 4]  # block 4 is never needed for these lengths
    _, _, reader = run_paged(rng.standard_normal((HEADS, DIM)), k_cache, v_cache, table, seq_len)
    assert reader.trace == expected
    blocks = [b for b, _ in reader.trace]
    assert blocks == table[:-(-seq_len // BLOCK)]


def test_only_one_block_is_live_at_a_time():
    """The reader reuses one buffer: collecting every block before the softmax
    (a gather in disguise) sees the last block's rows repeated and gives a
    wrong answer."""
    rng = np.random.default_rng(6)
    k_cache, v_cache = make_cache(rng)
    q = rng.standard_normal((HEADS, DIM))
    table = [2, 6, 1]
    out, _, _ = run_paged(q, k_cache, v_cache, table, 11)
    k, v = contiguous(k_cache, table, 11), contiguous(v_cache, table, 11)
    np.testing.assert_allclose(out, dense_oracle(q, k, v, SCALE), rtol=0, atol=1e-12)


@pytest.mark.parametrize("poison", [1e30, np.nan])
def test_never_reads_past_seq_len(poison):
    rng = np.random.default_rng(7)
    k_cache, v_cache = make_cache(rng)
    q = rng.standard_normal((HEADS, DIM))
    table, seq_len = [3, 1, 7, 0], 10
    clean = run_paged(q, k_cache, v_cache, table, seq_len)[0]
    k_cache[7, 2:], v_cache[7, 2:] = poison, poison  # the tail of the last block
    k_cache[0], v_cache[0] = poison, poison  # a later block of the table
    out, _, reader = run_paged(q, k_cache, v_cache, table, seq_len)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, clean)
    assert sum(n for _, n in reader.trace) == seq_len


def test_state_is_the_logsumexp():
    rng = np.random.default_rng(8)
    k_cache, v_cache = make_cache(rng)
    q = rng.standard_normal((HEADS, DIM)) * 3
    table, seq_len = [5, 0, 2], 11
    out, state, _ = run_paged(q, k_cache, v_cache, table, seq_len)
    k = contiguous(k_cache, table, seq_len)
    group = HEADS // KV_HEADS
    for h in range(HEADS):
        s = k[:, h // group] @ q[h] * SCALE
        assert abs(state.m[h] - s.max()) < 1e-12
        lse = s.max() + np.log(np.exp(s - s.max()).sum())
        assert abs(state.m[h] + np.log(state.l[h]) - lse) < 1e-12
    np.testing.assert_allclose(state.lse(), state.m + np.log(state.l), rtol=0, atol=0)
    # acc stays unnormalized: the output is acc / l
    np.testing.assert_allclose(out, state.acc / state.l[:, None], rtol=0, atol=1e-15)
    assert np.all(state.l >= 1.0)  # the maximum's own term is exp(0) = 1


def test_state_rescales_when_the_maximum_rises():
    state = impl.OnlineSoftmaxState.start(1, 1)
    assert state.m[0] == -np.inf and state.l[0] == 0 and state.acc[0, 0] == 0
    state.update(np.array([[0.0, 0.0]]), np.array([[[1.0], [3.0]]]))
    assert state.m[0] == 0 and state.l[0] == 2 and state.acc[0, 0] == 4
    state.update(np.array([[np.log(4.0)]]), np.array([[[10.0]]]))  # the max rises to log 4
    # the old terms shrink by exp(0 - log 4) = 1/4: l = 2/4 + 1, acc = 4/4 + 10
    assert state.m[0] == np.log(4.0)
    assert abs(state.l[0] - 1.5) < 1e-15 and abs(state.acc[0, 0] - 11.0) < 1e-15
    assert abs(state.output()[0, 0] - 11.0 / 1.5) < 1e-15
    state.update([[-1.0]], [[[5.0]]])  # nested lists work too; below the max: nothing rescaled
    assert state.m[0] == np.log(4.0)
    assert abs(state.l[0] - (1.5 + np.exp(-1.0 - np.log(4.0)))) < 1e-15


@pytest.mark.parametrize("level", [800.0, -800.0])
def test_huge_logits_do_not_overflow(level):
    """Scores near +-800 in float64: exp(800) is inf and exp(-800) is 0, so both
    the missing max shift and a maximum that starts at 0 fail here."""
    rng = np.random.default_rng(9)
    k_cache, v_cache = make_cache(rng)
    q = np.zeros((HEADS, DIM))
    q[:, 0] = 1.0
    # scores = level + noise
    k_cache[..., 0] = level / SCALE + rng.standard_normal(k_cache.shape[:3])
    table, seq_len = [4, 6, 1], 10
    out, state, _ = run_paged(q, k_cache, v_cache, table, seq_len)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(state.l))
    k, v = contiguous(k_cache, table, seq_len), contiguous(v_cache, table, seq_len)
    np.testing.assert_allclose(out, dense_oracle(q, k, v, SCALE), rtol=0, atol=1e-9)
    np.testing.assert_allclose(impl.dense_attention(q, k, v, SCALE), out, rtol=0, atol=1e-9)
    assert abs(state.lse()[0] - level) < 5  # about level + log(10)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 1), (6, 3), (2, 2)])
def test_query_heads_read_their_own_kv_head(num_heads, num_kv_heads):
    rng = np.random.default_rng(10)
    k_cache, v_cache = make_cache(rng, kv_heads=num_kv_heads)
    q = rng.standard_normal((num_heads, DIM))
    table, seq_len = [1, 3, 5], 9
    out, _, _ = run_paged(q, k_cache, v_cache, table, seq_len)
    k, v = contiguous(k_cache, table, seq_len), contiguous(v_cache, table, seq_len)
    np.testing.assert_allclose(out, dense_oracle(q, k, v, SCALE), rtol=0, atol=1e-12)


def test_inputs_are_left_unchanged_and_reader_defaults():
    rng = np.random.default_rng(11)
    k_cache, v_cache = make_cache(rng)
    q = rng.standard_normal((HEADS, DIM))
    copies = [a.copy() for a in (q, k_cache, v_cache)]
    out, _ = impl.paged_online_attention(q, k_cache, v_cache, [2, 4], 7, SCALE)  # reader=None
    for before, after in zip(copies, (q, k_cache, v_cache), strict=True):
        np.testing.assert_array_equal(before, after)
    np.testing.assert_array_equal(out, run_paged(q, k_cache, v_cache, [2, 4], 7)[0])


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"seq_len": 0}, "seq_len"),
    ({"seq_len": 13}, "seq_len"),  # the table [2, 4, 1] covers 12 tokens
    ({"q": np.zeros((3, DIM))}, "num_kv_heads"),
])
def test_paged_attention_rejects_bad_arguments(kwargs, name):
    rng = np.random.default_rng(12)
    k_cache, v_cache = make_cache(rng)
    args = {"q": np.zeros((HEADS, DIM)), "k_cache": k_cache, "v_cache": v_cache,
            "block_table": [2, 4, 1], "seq_len": 5, "scale": SCALE}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        impl.paged_online_attention(**args)
    # the full table is fine
    impl.paged_online_attention(np.zeros((HEADS, DIM)), k_cache, v_cache, [2, 4, 1], 12, SCALE)


def test_dense_attention_rejects_bad_arguments():
    k = np.zeros((5, KV_HEADS, DIM))
    with pytest.raises(ValueError, match="seq_len"):
        impl.dense_attention(np.zeros((HEADS, DIM)), k[:0], k[:0], SCALE)
    with pytest.raises(ValueError, match="v"):
        impl.dense_attention(np.zeros((HEADS, DIM)), k, k[:4], SCALE)
    with pytest.raises(ValueError, match="num_kv_heads"):
        impl.dense_attention(np.zeros((3, DIM)), k, k, SCALE)


def test_state_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_heads"):
        impl.OnlineSoftmaxState.start(0, 4)
    with pytest.raises(ValueError, match="head_dim"):
        impl.OnlineSoftmaxState.start(2, 0)
    state = impl.OnlineSoftmaxState.start(2, 3)
    with pytest.raises(ValueError, match="update"):
        state.output()  # nothing folded in yet
    with pytest.raises(ValueError, match="scores"):
        state.update(np.zeros((2, 0)), np.zeros((2, 0, 3)))
    with pytest.raises(ValueError, match="scores"):
        state.update(np.zeros((3, 1)), np.zeros((3, 1, 3)))
    with pytest.raises(ValueError, match="values"):
        state.update(np.zeros((2, 2)), np.zeros((2, 1, 3)))
    assert state.l.tolist() == [0.0, 0.0]  # a refused update changes nothing


def test_out_of_range_blocks_are_refused_by_the_reader():
    rng = np.random.default_rng(13)
    reader = impl.BlockReader(*make_cache(rng))
    with pytest.raises(ValueError, match="block_id"):
        reader.read(8, 1)
    with pytest.raises(ValueError, match="num_tokens"):
        reader.read(0, BLOCK + 1)
    with pytest.raises(ValueError, match="k_cache"):
        impl.BlockReader(np.zeros((2, 4, 1, 8)), np.zeros((2, 4, 1, 4)))
    assert reader.trace == []
    # a table entry past the cache surfaces as the reader's error, after the good reads
    with pytest.raises(ValueError, match="block_id"):
        impl.paged_online_attention(np.zeros((HEADS, DIM)), reader.k_cache, reader.v_cache,
                                    [1, 9], 6, SCALE, reader)
    assert reader.trace == [(1, 4)]


def test_agrees_with_mini_vllm_paged_attention():
    from mini_vllm.model_input import ModelInput
    from mini_vllm.models.attention import paged_attention

    rng = np.random.default_rng(14)
    block, heads, kv_heads, dim, seq_len = 4, 4, 2, 16, 14
    k_cache, v_cache = make_cache(rng, num_blocks=9, block=block, kv_heads=kv_heads, dim=dim)
    k_cache, v_cache = k_cache.astype(np.float32), v_cache.astype(np.float32)
    q = rng.standard_normal((heads, dim)).astype(np.float32)
    table, last = [8, 2, 5, 3], seq_len - 1

    def arr(x):
        return np.asarray(x, dtype=np.int64)

    mi = ModelInput(token_ids=arr([0]), positions=arr([last]), query_start_loc=arr([0, 1]),
                    seq_lens=arr([seq_len]), block_tables=arr([table]),
                    slot_mapping=arr([table[last // block] * block + last % block]),
                    logits_indices=arr([0]), block_size=block)
    ref = paged_attention(q[None], k_cache, v_cache, mi, dim ** -0.5)[0]
    out, _ = impl.paged_online_attention(q, k_cache, v_cache, table, seq_len, dim ** -0.5)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)


def test_script_example_prints_the_readme_numbers():
    path = pathlib.Path(impl.__file__)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(path), run_name="__main__")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "reads (block, rows): [(3, 4), (1, 4), (7, 4), (0, 1)]"
    assert lines[1] == "output[0, :4] = [-0.5621 -0.3626 -0.1463  0.2687]"
    assert float(lines[2].split("=")[1]) < 1e-12
    assert lines[3] == "m + log l, head 0 = 3.0035"
