"""Lab 02-06 tests: the write map, the read map, and paged == dense."""
from __future__ import annotations

import numpy as np
import pytest

from course import load_impl

impl = load_impl(__file__)

BLOCK_SIZE = 16
HEADS, KV_HEADS, DIM = 4, 2, 8


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The oracle: plain attention over contiguous K/V ``[seq, kv_heads, dim]``."""
    group = q.shape[0] // k.shape[1]
    out = np.empty_like(q)
    for h in range(q.shape[0]):
        scores = k[:, h // group, :] @ q[h] / np.sqrt(q.shape[1])
        p = np.exp(scores - scores.max())
        out[h] = (p / p.sum()) @ v[:, h // group, :]
    return out


def scatter_sequence(k, v, table, num_blocks, block_size=BLOCK_SIZE, fill=0.0):
    """Put a contiguous sequence into a fresh paged cache via the learner's write path."""
    shape = (num_blocks, block_size, k.shape[1], k.shape[2])
    k_cache, v_cache = np.full(shape, fill), np.full(shape, fill)
    slots = impl.build_slot_mapping(table, block_size, 0, len(k))
    impl.write_kv(k_cache, v_cache, slots, k, v)
    return k_cache, v_cache


def test_slot_mapping_formula_at_block_edges():
    table = [7, 2, 9]
    slots = impl.build_slot_mapping(table, 4, 0, 12)
    assert slots.tolist() == [28, 29, 30, 31, 8, 9, 10, 11, 36, 37, 38, 39]
    # crossing a block boundary mid-range
    assert impl.build_slot_mapping(table, 4, 3, 2).tolist() == [31, 8]
    # one decode token at position 9 -> block_table[2] * 4 + 1
    assert impl.build_slot_mapping(table, 4, 9, 1).tolist() == [37]
    assert impl.build_slot_mapping(table, 4, 5, 0).tolist() == []
    # the README's example: block size 16, table [5, 2, 7]
    assert impl.build_slot_mapping([5, 2, 7], 16, 0, 3).tolist() == [80, 81, 82]
    assert impl.build_slot_mapping([5, 2, 7], 16, 34, 1).tolist() == [114]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"block_size": 0, "start": 0, "num_tokens": 1}, "block_size"),
        ({"block_size": 0, "start": 0, "num_tokens": 0}, "block_size"),  # even an empty range
        ({"block_size": 4, "start": -1, "num_tokens": 1}, "start"),
        ({"block_size": 4, "start": 0, "num_tokens": -2}, "num_tokens"),
        ({"block_size": 4, "start": 10, "num_tokens": 3}, "num_tokens"),
    ],
)
def test_slot_mapping_rejects_ranges_the_table_cannot_hold(kwargs, name):
    with pytest.raises(ValueError, match=name):
        impl.build_slot_mapping([7, 2, 9], **kwargs)


def test_smallest_block_and_sequence_are_accepted():
    assert impl.build_slot_mapping([7, 2, 9], 1, 0, 3).tolist() == [7, 2, 9]  # block size 1
    rng = np.random.default_rng(11)
    k_cache = rng.standard_normal((3, 4, 1, DIM))
    v_cache = rng.standard_normal((3, 4, 1, DIM))
    out = impl.paged_attention(rng.standard_normal((2, DIM)), k_cache, v_cache, [2], 1, 4)
    np.testing.assert_allclose(out, np.repeat(v_cache[2, 0], 2, axis=0), rtol=0, atol=1e-15)


def test_write_then_gather_round_trips():
    rng = np.random.default_rng(1)
    seq_len = 40
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    table = [6, 1, 4]
    k_cache, v_cache = scatter_sequence(k, v, table, num_blocks=8)
    np.testing.assert_array_equal(impl.gather_kv(k_cache, table, seq_len, BLOCK_SIZE), k)
    np.testing.assert_array_equal(impl.gather_kv(v_cache, table, seq_len, BLOCK_SIZE), v)
    # token 20 lives in logical block 1 -> physical block 1, offset 4
    np.testing.assert_array_equal(k_cache[1, 4], k[20])
    # blocks outside the table stay untouched
    assert not k_cache[[0, 2, 3, 5, 7]].any()


def test_paged_matches_dense_to_1e_12_under_a_shuffled_table():
    rng = np.random.default_rng(2)
    seq_len, num_blocks = 61, 12
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    table = [9, 2, 11, 5]
    k_cache, v_cache = scatter_sequence(k, v, table, num_blocks)
    paged = impl.paged_attention(q, k_cache, v_cache, table, seq_len, BLOCK_SIZE)
    np.testing.assert_allclose(paged, dense_attention(q, k, v), rtol=0, atol=1e-12)


def test_partial_tail_block_is_masked_by_poisoned_slots():
    """seq_len 35 = 2 full blocks + 3 slots; the other 13 slots hold 1e6."""
    rng = np.random.default_rng(3)
    seq_len = 35
    table = [3, 0, 5]
    poisoned_slots = len(table) * BLOCK_SIZE - seq_len
    assert poisoned_slots == 13
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    k_cache, v_cache = scatter_sequence(k, v, table, num_blocks=6, fill=1e6)
    assert (k_cache[5, 3:] == 1e6).all() and k_cache[5, 3:].shape[0] == 13
    paged = impl.paged_attention(q, k_cache, v_cache, table, seq_len, BLOCK_SIZE)
    assert np.isfinite(paged).all()
    np.testing.assert_allclose(paged, dense_attention(q, k, v), rtol=0, atol=1e-12)


def test_indirection_is_the_identity_for_two_physical_layouts():
    rng = np.random.default_rng(4)
    seq_len = 45
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    outs = []
    for table in ([0, 1, 2], [9, 4, 6]):
        k_cache, v_cache = scatter_sequence(k, v, table, num_blocks=10, fill=-7.0)
        outs.append(impl.paged_attention(q, k_cache, v_cache, table, seq_len, BLOCK_SIZE))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_query_heads_share_kv_heads_in_groups():
    """GQA: 4 query heads over 2 KV heads -> heads 0,1 read KV head 0; 2,3 read 1."""
    rng = np.random.default_rng(5)
    seq_len = 20
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    q = np.repeat(rng.standard_normal((1, DIM)), HEADS, axis=0)
    k_cache, v_cache = scatter_sequence(k, v, [2, 0], num_blocks=3)
    out = impl.paged_attention(q, k_cache, v_cache, [2, 0], seq_len, BLOCK_SIZE)
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[2], out[3])
    assert not np.allclose(out[0], out[2])


@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 2), (8, 1), (6, 3)])
def test_each_query_head_reads_its_own_kv_head(num_heads, num_kv_heads):
    """4:1, 8:1 and 2:1 grouping, every head checked against dense attention on its KV head."""
    rng = np.random.default_rng(8)
    seq_len, table = 23, [3, 1]
    k = rng.standard_normal((seq_len, num_kv_heads, DIM))
    v = rng.standard_normal((seq_len, num_kv_heads, DIM))
    q = rng.standard_normal((num_heads, DIM))
    k_cache, v_cache = scatter_sequence(k, v, table, num_blocks=4, fill=1e6)
    out = impl.paged_attention(q, k_cache, v_cache, table, seq_len, BLOCK_SIZE)
    group = num_heads // num_kv_heads
    for h in range(num_heads):
        kv = h // group
        want = dense_attention(q[h:h + 1], k[:, kv:kv + 1], v[:, kv:kv + 1])[0]
        np.testing.assert_allclose(out[h], want, rtol=0, atol=1e-12)


def test_huge_scores_still_give_a_finite_exact_softmax():
    """Scores in the thousands overflow np.exp unless the maximum is subtracted first."""
    rng = np.random.default_rng(9)
    seq_len, table = 19, [1, 0]
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM)) * 3000.0
    assert np.abs(k[:, 0] @ q[0] / np.sqrt(DIM)).max() > 710  # exp() of it is inf in float64
    k_cache, v_cache = scatter_sequence(k, v, table, num_blocks=2)
    with np.errstate(over="ignore", invalid="ignore"):
        out = impl.paged_attention(q, k_cache, v_cache, table, seq_len, BLOCK_SIZE)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, dense_attention(q, k, v), rtol=0, atol=1e-12)


def test_paged_attention_leaves_its_inputs_unchanged():
    rng = np.random.default_rng(10)
    k_cache = rng.standard_normal((4, BLOCK_SIZE, KV_HEADS, DIM))
    v_cache = rng.standard_normal((4, BLOCK_SIZE, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    saved = [x.copy() for x in (q, k_cache, v_cache)]
    first = impl.paged_attention(q, k_cache, v_cache, [2, 3], 20, BLOCK_SIZE)
    for before, after in zip(saved, (q, k_cache, v_cache), strict=True):
        np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(impl.paged_attention(q, k_cache, v_cache, [2, 3], 20,
                                                       BLOCK_SIZE), first)


def test_decode_loop_writes_one_slot_per_step_and_stays_exact():
    """Prefill 20 tokens in chunks of 8, then decode 10 tokens one slot at a time."""
    rng = np.random.default_rng(6)
    total = 30
    k = rng.standard_normal((total, KV_HEADS, DIM))
    v = rng.standard_normal((total, KV_HEADS, DIM))
    table = [4, 1]
    shape = (5, BLOCK_SIZE, KV_HEADS, DIM)
    k_cache, v_cache = np.full(shape, 1e6), np.full(shape, 1e6)
    for start in range(0, 20, 8):
        n = min(8, 20 - start)
        slots = impl.build_slot_mapping(table, BLOCK_SIZE, start, n)
        impl.write_kv(k_cache, v_cache, slots, k[start : start + n], v[start : start + n])
    for pos in range(20, total):
        slots = impl.build_slot_mapping(table, BLOCK_SIZE, pos, 1)
        assert len(slots) == 1
        impl.write_kv(k_cache, v_cache, slots, k[pos : pos + 1], v[pos : pos + 1])
        q = rng.standard_normal((HEADS, DIM))
        got = impl.paged_attention(q, k_cache, v_cache, table, pos + 1, BLOCK_SIZE)
        want = dense_attention(q, k[: pos + 1], v[: pos + 1])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_script_example_prints_the_readme_numbers():
    """`python solution.py`: table [5, 2, 7], block size 16, 35 tokens, seed 0."""
    rng = np.random.default_rng(0)
    k_cache = rng.standard_normal((8, 16, 2, 8))
    v_cache = rng.standard_normal((8, 16, 2, 8))
    q = rng.standard_normal((4, 8))
    out = impl.paged_attention(q, k_cache, v_cache, [5, 2, 7], 35, 16)
    assert np.round(out[0, :4], 4).tolist() == [0.2508, -0.135, 0.2772, 0.0861]


def test_online_softmax_block_by_block_agrees_below_1e_15():
    """EXERCISES 13: lab 04's loop in numpy, against your paged_attention."""
    rng = np.random.default_rng(0)
    k_cache = rng.standard_normal((8, 16, KV_HEADS, DIM))
    v_cache = rng.standard_normal((8, 16, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    table, seq_len, bs = [5, 2, 7], 35, 16
    online = np.empty_like(q)
    group = HEADS // KV_HEADS
    for h in range(HEADS):
        m, denom, acc = -np.inf, 0.0, np.zeros(DIM)
        for logical in range(-(-seq_len // bs)):
            n = min(bs, seq_len - logical * bs)
            k = k_cache[table[logical], :n, h // group]
            v = v_cache[table[logical], :n, h // group]
            s = k @ q[h] / np.sqrt(DIM)
            m_new = max(m, s.max())
            p = np.exp(s - m_new)
            acc = acc * np.exp(m - m_new) + p @ v
            denom = denom * np.exp(m - m_new) + p.sum()
            m = m_new
        online[h] = acc / denom
    got = impl.paged_attention(q, k_cache, v_cache, table, seq_len, bs)
    gap = np.abs(online - got).max()
    assert gap < 1e-15, (
        f"online softmax and paged_attention differ by {gap:.1e}; float64 rounding alone gives "
        "a few 1e-16, so look for a missing scale, max subtraction or tail-block row"
    )


def test_write_kv_rejects_mismatched_rows():
    k_cache = np.zeros((2, 4, 1, 2))
    v_cache = np.zeros((2, 4, 1, 2))
    with pytest.raises(ValueError, match="slot_mapping"):
        impl.write_kv(k_cache, v_cache, np.array([0, 1]), np.ones((3, 1, 2)), np.ones((3, 1, 2)))
    with pytest.raises(ValueError, match="slot_mapping"):
        impl.write_kv(k_cache, v_cache, np.array([8]), np.ones((1, 1, 2)), np.ones((1, 1, 2)))
    with pytest.raises(ValueError, match="slot_mapping"):  # -1 would wrap to the last row
        impl.write_kv(k_cache, v_cache, np.array([3, -1]), np.ones((2, 1, 2)), np.ones((2, 1, 2)))
    with pytest.raises(ValueError, match="slot_mapping"):  # one V row for two slots
        impl.write_kv(k_cache, v_cache, np.array([0, 1]), np.ones((2, 1, 2)), np.ones((1, 1, 2)))
    assert not k_cache.any() and not v_cache.any()  # a refused write changes nothing
    impl.write_kv(k_cache, v_cache, np.array([7]), np.ones((1, 1, 2)), np.full((1, 1, 2), 2.0))
    assert k_cache[1, 3].tolist() == [[1.0, 1.0]] and v_cache[1, 3].tolist() == [[2.0, 2.0]]


def test_paged_attention_rejects_an_empty_sequence_and_uneven_head_groups():
    k_cache = np.zeros((3, BLOCK_SIZE, KV_HEADS, DIM))
    v_cache = np.zeros((3, BLOCK_SIZE, KV_HEADS, DIM))
    with pytest.raises(ValueError, match="seq_len"):
        impl.paged_attention(np.ones((HEADS, DIM)), k_cache, v_cache, [1, 2], 0, BLOCK_SIZE)
    with pytest.raises(ValueError, match="num_kv_heads"):  # 3 query heads cannot share 2 KV heads
        impl.paged_attention(np.ones((3, DIM)), k_cache, v_cache, [1, 2], 5, BLOCK_SIZE)


def test_agrees_with_mini_vllm_attention_for_a_decode_row():
    """mini_vllm/models/attention.py runs the same math for the real numpy model."""
    from mini_vllm.models import attention as mini

    rng = np.random.default_rng(7)
    seq_len, table = 37, np.array([[8, 3, 6]])
    k = rng.standard_normal((seq_len, KV_HEADS, DIM))
    v = rng.standard_normal((seq_len, KV_HEADS, DIM))
    q = rng.standard_normal((HEADS, DIM))
    k_cache, v_cache = scatter_sequence(k, v, table[0].tolist(), num_blocks=9, fill=1e6)
    ours = impl.paged_attention(q, k_cache, v_cache, table[0].tolist(), seq_len, BLOCK_SIZE)
    lens = np.array([seq_len])
    theirs = mini.attend(q[None, None], mini.gather_kv(k_cache, table, lens),
                         mini.gather_kv(v_cache, table, lens), np.array([[seq_len - 1]]),
                         1.0 / np.sqrt(DIM))[0, 0]
    # mini_vllm multiplies by np.float32(scale) (its model runs in float32), so the
    # two agree to float32 rounding of the scale, not to 1e-12.
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)
