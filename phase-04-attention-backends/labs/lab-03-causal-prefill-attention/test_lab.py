"""Lab 04-03 tests: varlen paged attention with the bottom-right causal diagonal."""
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


def sequences(rng, lens, kv_heads=KV_HEADS, dim=DIM):
    """Contiguous K and V for each request: lists of [L_b, kv_heads, dim]."""
    ks = [rng.standard_normal((n, kv_heads, dim)) for n in lens]
    vs = [rng.standard_normal((n, kv_heads, dim)) for n in lens]
    return ks, vs


def oracle(q_rows, k, v, first_pos, scale=SCALE):
    """Independent of the learner: row r sits at position first_pos + r and
    sees keys 0 .. first_pos + r of k/v ([L, kv_heads, dim]); loops, float64."""
    q_rows = np.asarray(q_rows, dtype=np.float64)
    group = q_rows.shape[1] // k.shape[1]
    out = np.empty(q_rows.shape)
    for r in range(q_rows.shape[0]):
        keys = first_pos + r + 1
        for h in range(q_rows.shape[1]):
            s = k[:keys, h // group] @ q_rows[r, h] * scale
            p = np.exp(s - s.max())
            out[r, h] = p @ v[:keys, h // group] / p.sum()
    return out


def run(q, k_cache, v_cache, qsl, seq_lens, table, scale=SCALE):
    return impl.varlen_paged_attention(q, k_cache, v_cache, qsl, seq_lens, table, scale)


# ---------------------------------------------------------------- causal_limits


def test_causal_limits_end_in_the_bottom_right_corner():
    # 9 keys, 4 query rows: the rows are positions 5..8 (5 keys were cached).
    assert impl.causal_limits(9, 4).tolist() == [5, 6, 7, 8]
    # a whole prompt: the top-left and bottom-right diagonals coincide
    assert impl.causal_limits(12, 12).tolist() == list(range(12))
    # a decode: one row, at the last position, sees all 13 keys
    assert impl.causal_limits(13, 1).tolist() == [12]
    lim = impl.causal_limits(7, 0)
    assert lim.shape == (0,) and lim.dtype.kind == "i"
    assert impl.causal_limits(0, 0).shape == (0,)
    assert impl.causal_limits(np.int64(6), np.int64(2)).dtype.kind == "i"


def test_causal_limits_reject_impossible_lengths():
    with pytest.raises(ValueError, match="q_len"):
        impl.causal_limits(5, -1)
    with pytest.raises(ValueError, match="q_len"):
        impl.causal_limits(4, 5)  # more query rows than keys
    assert impl.causal_limits(5, 5).tolist() == [0, 1, 2, 3, 4]  # the edge is fine


# ---------------------------------------------------------------- read_context


def labelled_cache(num_blocks=8, block=BLOCK, kv_heads=KV_HEADS, dim=DIM):
    """Slot (block b, row r, kv head h) holds 100*b + r + 0.5*h in every dim."""
    b, r, h = np.meshgrid(np.arange(num_blocks), np.arange(block), np.arange(kv_heads),
                          indexing="ij")
    return np.repeat((100.0 * b + r + 0.5 * h)[..., None], dim, axis=-1)


def test_read_context_follows_the_block_table():
    cache = labelled_cache()
    cache[7, 2:] = np.nan  # the tail of the last block used
    cache[0] = np.nan  # the table's fourth entry, not needed for 10 tokens
    # 10 tokens, block 4, table [5, 2, 7, 0]: tokens 0-3 in block 5, 4-7 in block 2,
    # 8-9 in rows 0-1 of block 7; block 0 is never touched.
    rows = impl.read_context(cache, [5, 2, 7, 0], 10)
    assert rows.shape == (10, KV_HEADS, DIM) and rows.dtype == np.float64
    expect = [500, 501, 502, 503, 200, 201, 202, 203, 700, 701]
    np.testing.assert_array_equal(rows[:, 0, 0], expect)
    np.testing.assert_array_equal(rows[:, 1, 3], np.add(expect, 0.5))  # kv head 1
    # exactly full blocks, and nothing at all
    full = impl.read_context(labelled_cache(), np.array([3, 1]), 8)
    np.testing.assert_array_equal(full[:, 0, 0], [300, 301, 302, 303, 100, 101, 102, 103])
    assert impl.read_context(cache, [5], 0).shape == (0, KV_HEADS, DIM)
    # a returned copy: writing to it leaves the cache alone
    rows[:] = -1
    assert cache[5, 0, 0, 0] == 500


@pytest.mark.parametrize(("row", "seq_len", "name"), [
    ([5, 2], -1, "seq_len"),
    ([5, 2], 9, "block_table"),  # two blocks of 4 hold 8 tokens
    ([5, -1], 5, "block_table"),  # numpy would silently read the last block
    ([5, 8], 5, "block_table"),  # the cache has blocks 0..7
    ([8, 2], 1, "block_table"),
])
def test_read_context_rejects_bad_arguments(row, seq_len, name):
    with pytest.raises(ValueError, match=name):
        impl.read_context(labelled_cache(), row, seq_len)


def test_read_context_accepts_the_edges():
    cache = labelled_cache()
    # 8 tokens fill both blocks; 0 and 7 are the first and last real blocks
    np.testing.assert_array_equal(impl.read_context(cache, [0, 7], 8)[[0, 7], 0, 0], [0, 703])
    # entries past the blocks needed are ignored, whatever they hold
    np.testing.assert_array_equal(impl.read_context(cache, [6, 99], 4)[:, 0, 0],
                                  [600, 601, 602, 603])
    np.testing.assert_array_equal(impl.read_context(cache, [6, -1], 2)[:, 0, 0], [600, 601])


# ---------------------------------------------------------------- whole prompts and chunks


def test_full_prefill_equals_dense_causal_attention():
    rng = np.random.default_rng(1)
    (k,), (v,) = sequences(rng, [13])
    k_cache, v_cache, table = impl.build_paged_cache([k], [v], BLOCK, num_blocks=9, seed=1)
    # 13 tokens = 3 full blocks + 1 block holding one token, in shuffled physical blocks
    assert table.shape == (1, 4) and sorted(table[0]) != table[0].tolist()
    q = rng.standard_normal((13, HEADS, DIM))
    out = run(q, k_cache, v_cache, [0, 13], [13], table)
    assert out.shape == (13, HEADS, DIM) and out.dtype == np.float64
    np.testing.assert_allclose(out, oracle(q, k, v, 0), rtol=0, atol=1e-9)
    # row 0 sees only key 0: its output is key 0's value row, per kv head
    np.testing.assert_allclose(out[0], v[0, [0, 0, 1, 1]], rtol=0, atol=1e-12)


def test_mid_sequence_chunk_sees_its_cached_prefix():
    """9 keys in the cache, this step computes positions 5..8 (4 rows): row 0
    sees 6 keys (0..5), row 3 all 9. A top-left mask would give row 0 one key."""
    rng = np.random.default_rng(2)
    (k,), (v,) = sequences(rng, [9])
    k_cache, v_cache, table = impl.build_paged_cache([k], [v], BLOCK, num_blocks=6, seed=2)
    q = rng.standard_normal((4, HEADS, DIM))
    out = run(q, k_cache, v_cache, [0, 4], [9], table)
    np.testing.assert_allclose(out, oracle(q, k, v, 5), rtol=0, atol=1e-9)
    # the case tells the masks apart: top-left would make row 0 equal value row 0
    assert np.abs(out[0] - v[0, [0, 0, 1, 1]]).max() > 0.1


def test_chunks_of_5_and_7_equal_one_pass_of_12():
    rng = np.random.default_rng(3)
    (k,), (v,) = sequences(rng, [12])
    k_cache, v_cache, table = impl.build_paged_cache([k], [v], BLOCK, num_blocks=7, seed=3)
    q = rng.standard_normal((12, HEADS, DIM))
    one_pass = run(q, k_cache, v_cache, [0, 12], [12], table)
    # Step 1 runs before tokens 5..11 exist: their slots are still stale (NaN).
    early_k, early_v = k_cache.copy(), v_cache.copy()
    for t in range(5, 12):
        early_k[table[0, t // BLOCK], t % BLOCK] = np.nan
        early_v[table[0, t // BLOCK], t % BLOCK] = np.nan
    first = run(q[:5], early_k, early_v, [0, 5], [5], table)
    second = run(q[5:], k_cache, v_cache, [0, 7], [12], table)  # positions 5..11
    np.testing.assert_allclose(np.concatenate([first, second]), one_pass, rtol=0, atol=1e-9)
    np.testing.assert_allclose(one_pass, oracle(q, k, v, 0), rtol=0, atol=1e-9)


def test_future_keys_are_invisible():
    """1e3 planted in the K and V of the last of 8 tokens: rows 0..6 must not
    move by a single bit, row 7 (which sees it) must."""
    rng = np.random.default_rng(4)
    (k,), (v,) = sequences(rng, [8])
    k_cache, v_cache, table = impl.build_paged_cache([k], [v], BLOCK, num_blocks=4, seed=4)
    q = rng.standard_normal((8, HEADS, DIM))
    before = run(q, k_cache, v_cache, [0, 8], [8], table)
    last_block = table[0, 7 // BLOCK]
    k_cache[last_block, 7 % BLOCK] = 1e3
    v_cache[last_block, 7 % BLOCK] = 1e3
    after = run(q, k_cache, v_cache, [0, 8], [8], table)
    np.testing.assert_array_equal(after[:7], before[:7])
    assert np.abs(after[7] - before[7]).max() > 1.0


def test_decode_rows_see_every_key():
    """Three decodes (one row each) at seq_lens 11, 1 and 6: the row is the last
    position, so it attends to all of its request's keys."""
    rng = np.random.default_rng(5)
    lens = [11, 1, 6]
    ks, vs = sequences(rng, lens)
    k_cache, v_cache, table = impl.build_paged_cache(ks, vs, BLOCK, num_blocks=8, seed=5)
    q = rng.standard_normal((3, HEADS, DIM))
    out = run(q, k_cache, v_cache, [0, 1, 2, 3], lens, table)
    for b, n in enumerate(lens):
        np.testing.assert_allclose(out[b:b + 1], oracle(q[b:b + 1], ks[b], vs[b], n - 1),
                                   rtol=0, atol=1e-12)
    # one key: the output is its value row, whatever the score
    np.testing.assert_allclose(out[1], vs[1][0, [0, 0, 1, 1]], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- packed batches


def test_requests_do_not_see_each_other():
    """A: positions 3..7 of 8 keys (5 rows). B: a 6-token prompt whose K, V and
    q are 1e3 times louder. Packed in either order, each request's rows equal
    the rows it gets alone: one leaked key of B would swamp A."""
    rng = np.random.default_rng(6)
    (ka, kb), (va, vb) = sequences(rng, [8, 6])
    kb, vb = kb * 1e3, vb * 1e3
    qa, qb = rng.standard_normal((5, HEADS, DIM)), rng.standard_normal((6, HEADS, DIM)) * 1e3
    alone = {}
    for name, kk, vv, qq, n in (("a", ka, va, qa, 8), ("b", kb, vb, qb, 6)):
        kc, vc, tb = impl.build_paged_cache([kk], [vv], BLOCK, num_blocks=4, seed=6)
        alone[name] = run(qq, kc, vc, [0, len(qq)], [n], tb)
    np.testing.assert_allclose(alone["a"], oracle(qa, ka, va, 3), rtol=0, atol=1e-9)
    np.testing.assert_allclose(alone["b"], oracle(qb, kb, vb, 0), rtol=1e-9, atol=0)
    kc, vc, tb = impl.build_paged_cache([ka, kb], [va, vb], BLOCK, num_blocks=6, seed=7)
    ab = run(np.concatenate([qa, qb]), kc, vc, [0, 5, 11], [8, 6], tb)
    np.testing.assert_allclose(ab[:5], alone["a"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ab[5:], alone["b"], rtol=1e-12, atol=0)
    kc, vc, tb = impl.build_paged_cache([kb, ka], [vb, va], BLOCK, num_blocks=6, seed=8)
    ba = run(np.concatenate([qb, qa]), kc, vc, [0, 6, 11], [6, 8], tb)
    np.testing.assert_allclose(ba[:6], alone["b"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(ba[6:], alone["a"], rtol=0, atol=1e-12)


def test_mixed_batch_matches_mini_vllm():
    """A 6-token prefill chunk at positions 4..9 and two decodes (positions 12
    and 6), arranged by mini_vllm's own make_model_input, in float32, compared
    with mini_vllm's paged_attention. The chunk's seq_len (10) is not the
    batch's largest (13)."""
    from mini_vllm.models.attention import paged_attention, write_kv
    from mini_vllm.models.runner import Chunk, make_model_input

    rng = np.random.default_rng(9)
    num_blocks, dim = 14, 16
    pool = rng.permutation(np.arange(1, num_blocks)).tolist()  # block 0 stays null
    tables = [pool[0:3], pool[3:7], pool[7:9]]  # 3, 4 and 2 blocks of 4 tokens
    chunks = [Chunk(list(range(6)), 4, tables[0]),   # positions 4..9, seq_len 10
              Chunk([7], 12, tables[1]),             # decode, seq_len 13
              Chunk([8], 6, tables[2])]              # decode, seq_len 7
    mi = make_model_input(chunks, BLOCK)
    assert mi.query_start_loc.tolist() == [0, 6, 7, 8] and mi.seq_lens.tolist() == [10, 13, 7]
    assert mi.block_tables.shape == (3, 4)  # padded with the null block 0
    shape = (num_blocks, BLOCK, KV_HEADS, dim)
    k_cache = np.full(shape, np.nan, dtype=np.float32)
    v_cache = np.full(shape, np.nan, dtype=np.float32)
    # every key of every context, earlier steps' and this step's, through write_kv
    slots = [tb[t // BLOCK] * BLOCK + t % BLOCK for tb, n in zip(tables, mi.seq_lens, strict=True)
             for t in range(n)]
    kv = rng.standard_normal((2, len(slots), KV_HEADS, dim)).astype(np.float32)
    write_kv(k_cache, v_cache, kv[0], kv[1], np.asarray(slots))
    q = rng.standard_normal((mi.num_tokens, HEADS, dim)).astype(np.float32)
    ref = paged_attention(q, k_cache, v_cache, mi, dim ** -0.5)
    out = run(q, k_cache, v_cache, mi.query_start_loc, mi.seq_lens, mi.block_tables,
              dim ** -0.5)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("poison", [1e30, np.nan])
def test_stale_slots_are_never_read(poison):
    """A chunk (positions 2..6 of 7) and a decode (seq_len 9): the tails of both
    last blocks, the unused blocks and the null block hold the poison."""
    rng = np.random.default_rng(10)
    ks, vs = sequences(rng, [7, 9])
    q = rng.standard_normal((6, HEADS, DIM))
    outs = []
    for fill in (0.0, poison):
        kc, vc, tb = impl.build_paged_cache(ks, vs, BLOCK, num_blocks=10, seed=10, fill=fill)
        outs.append(run(q, kc, vc, [0, 5, 6], [7, 9], tb))
    assert np.all(np.isfinite(outs[1]))
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_allclose(outs[0][:5], oracle(q[:5], ks[0], vs[0], 2), rtol=0, atol=1e-12)


def test_requests_with_no_rows_are_allowed():
    """vLLM pads a batch with requests of 0 query rows and seq_len 0 (the
    padded query_start_loc repeats its last value). They own no rows and read
    nothing; neither does a request with cached keys but no rows this step."""
    rng = np.random.default_rng(11)
    ks, vs = sequences(rng, [6, 5, 9])  # request 1 is scheduled for no tokens
    kc, vc, tb = impl.build_paged_cache(ks, vs, BLOCK, num_blocks=10, seed=11)
    q = rng.standard_normal((4, HEADS, DIM))  # 3 rows of request 0, 1 of request 2
    plain = run(q, kc, vc, [0, 3, 4], [6, 9], tb[[0, 2]])
    table = np.concatenate([tb, np.zeros((2, tb.shape[1]), dtype=np.int64)])
    padded = run(q, kc, vc, [0, 3, 3, 4, 4, 4], [6, 5, 9, 0, 0], table)
    np.testing.assert_array_equal(padded, plain)
    np.testing.assert_allclose(plain[:3], oracle(q[:3], ks[0], vs[0], 3), rtol=0, atol=1e-12)
    # a step with no rows at all
    empty = run(np.zeros((0, HEADS, DIM)), kc, vc, [0, 0], [0], [[0]])
    assert empty.shape == (0, HEADS, DIM)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 1), (4, 2), (6, 3), (2, 2)])
def test_query_heads_read_their_own_kv_head(num_heads, num_kv_heads):
    rng = np.random.default_rng(12)
    (k,), (v,) = sequences(rng, [10], kv_heads=num_kv_heads)
    kc, vc, tb = impl.build_paged_cache([k], [v], BLOCK, num_blocks=5, seed=12)
    q = rng.standard_normal((4, num_heads, DIM))  # positions 6..9
    out = run(q, kc, vc, [0, 4], [10], tb)
    np.testing.assert_allclose(out, oracle(q, k, v, 6), rtol=0, atol=1e-12)


def test_inputs_are_left_unchanged_and_array_likes_work():
    rng = np.random.default_rng(13)
    ks, vs = sequences(rng, [5, 3])
    kc, vc, tb = impl.build_paged_cache(ks, vs, BLOCK, num_blocks=5, seed=13)
    q = rng.standard_normal((3, HEADS, DIM)).astype(np.float32)
    copies = [a.copy() for a in (q, kc, vc, tb)]
    qsl, lens = np.array([0, 2, 3]), np.array([5, 3])
    out = run(q, kc, vc, qsl, lens, tb)
    for before, after in zip(copies, (q, kc, vc, tb), strict=True):
        np.testing.assert_array_equal(before, after)
    assert qsl.tolist() == [0, 2, 3] and lens.tolist() == [5, 3]
    assert out.dtype == np.float64
    as_lists = run(q.tolist(), kc, vc, [0, 2, 3], [5, 3], tb.tolist())
    np.testing.assert_array_equal(as_lists, out)
    np.testing.assert_allclose(out[:2], oracle(q[:2], ks[0], vs[0], 3), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- errors

def _valid_args():
    """Two requests: 3 rows of a 5-key context, one decode of 6 keys; block 4,
    table width 2 (8 tokens each)."""
    rng = np.random.default_rng(14)
    ks, vs = sequences(rng, [5, 8])  # request 1 stores 8 keys: seq_lens may use up to 8
    kc, vc, tb = impl.build_paged_cache(ks, vs, BLOCK, num_blocks=6, seed=14)
    return {"q": np.zeros((4, HEADS, DIM)), "k_cache": kc, "v_cache": vc,
            "query_start_loc": [0, 3, 4], "seq_lens": [5, 6], "block_table": tb,
            "scale": SCALE}


@pytest.mark.parametrize(("change", "name"), [
    ({"q": np.zeros((4, HEADS * DIM))}, "q"),
    ({"q": np.zeros((4, HEADS, DIM + 1))}, "head_dim"),
    ({"k_cache": np.zeros((6, BLOCK, KV_HEADS * DIM)),
      "v_cache": np.zeros((6, BLOCK, KV_HEADS * DIM))}, "k_cache"),
    ({"v_cache": np.zeros((6, BLOCK, KV_HEADS, DIM + 1))}, "v_cache"),
    ({"q": np.zeros((4, 3, DIM))}, "num_kv_heads"),  # 3 heads over 2 KV heads
    ({"query_start_loc": [0, 4]}, "query_start_loc"),  # B + 1 = 3 entries needed
    ({"query_start_loc": [0, 3, 4, 4]}, "query_start_loc"),
    ({"query_start_loc": [1, 3, 4]}, "query_start_loc"),  # does not start at 0
    ({"query_start_loc": [0, 3, 3]}, "query_start_loc"),  # ends at 3, q has 4 rows
    ({"query_start_loc": [0, 3, 5]}, "query_start_loc"),  # ends past the rows
    ({"query_start_loc": [0, 5, 4], "seq_lens": [5, 6]}, "query_start_loc"),  # decreasing
    ({"seq_lens": [2, 6]}, "seq_lens"),  # 3 query rows, only 2 keys
    ({"seq_lens": [5, 0]}, "seq_lens"),  # a decode row needs its own key
    ({"query_start_loc": [0, 0, 4], "seq_lens": [-1, 6]}, "seq_lens"),
    ({"block_table": np.zeros((3, 2), dtype=np.int64)}, "block_table"),  # 3 rows, B = 2
    ({"block_table": np.array([1, 2])}, "block_table"),  # not 2-D
    ({"seq_lens": [5, 9]}, "block_table"),  # width 2 x block 4 = 8 < 9
    # checked for a request with no rows too, though it reads nothing
    ({"query_start_loc": [0, 4, 4], "seq_lens": [5, 9]}, "block_table"),
    ({"block_table": [[1, 2], [3, 6]]}, "block_table"),  # block 6 of a 6-block cache
    ({"block_table": [[1, -1], [3, 4]]}, "block_table"),
])
def test_rejects_bad_arguments(change, name):
    args = _valid_args()
    args.update(change)
    with pytest.raises(ValueError, match=name):
        impl.varlen_paged_attention(**args)


def test_accepts_the_edges_of_the_ranges():
    args = _valid_args()
    # seq_len == q_len (a whole prompt), seq_len filling the table exactly
    args.update(query_start_loc=[0, 3, 4], seq_lens=[3, 8])
    assert np.all(np.isfinite(impl.varlen_paged_attention(**args)))
    args.update(query_start_loc=[0, 4, 4], seq_lens=[4, 0])  # an empty request last
    assert np.all(np.isfinite(impl.varlen_paged_attention(**args)))


# ---------------------------------------------------------------- the example script


def test_script_example_prints_the_readme_numbers():
    path = pathlib.Path(impl.__file__)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(path), run_name="__main__")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "request 0: rows 0..3 see keys up to [5, 6, 7, 8]"
    assert lines[1] == "request 1: rows 4..4 see keys up to [7]"
    assert lines[2] == "request 2: rows 5..11 see keys up to [0, 1, 2, 3, 4, 5, 6]"
    assert float(lines[3].split("=")[1]) < 1e-12
    assert lines[4] == "block_table = [[5, 6, 3], [7, 4, 0], [9, 8, 0]]"
