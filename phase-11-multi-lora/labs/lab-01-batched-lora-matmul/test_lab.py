"""Lab 11-01 tests: batched LoRA shrink/expand (BGMV, SGMV), a whole QKV layer, and upstream.

Most numbers here are small integers stored as float32: every product and sum is
exact, so results are compared with ``assert_array_equal`` and a wrong slot, a
wrong column range or a second ``scale`` changes them visibly. The random tests
compare with a per-token loop written below, independently of the lab. The
``upstream`` tests load ``vllm/lora/ops/torch_ops/lora_ops.py`` (it imports only
torch) and run it.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM_OPS = course.UPSTREAM / "vllm/lora/ops/torch_ops/lora_ops.py"


def f32(rows):
    return np.array(rows, dtype=np.float32)


def stacks_with(rng, max_loras, max_rank, in_features, slices, ranks, ints=False):
    """Stacks with an adapter of rank ranks[s] in every slot s (test-side, no lab code).

    Returns (lora_a_stacked, lora_b_stacked, adapters) where adapters[s] is a list of
    (A [r, in], B [out_i, r]) per slice."""
    a_st = tuple(np.zeros((max_loras, 1, max_rank, in_features), np.float32) for _ in slices)
    b_st = tuple(np.zeros((max_loras, 1, size, max_rank), np.float32) for size in slices)
    adapters = []
    for s, r in enumerate(ranks):
        pairs = []
        for i, size in enumerate(slices):
            if ints:
                A = rng.integers(-2, 3, (r, in_features)).astype(np.float32)
                B = rng.integers(-2, 3, (size, r)).astype(np.float32)
            else:
                A = rng.standard_normal((r, in_features)).astype(np.float32)
                B = rng.standard_normal((size, r)).astype(np.float32)
            a_st[i][s, 0, :r] = A
            b_st[i][s, 0, :, :r] = B
            pairs.append((A, B))
        adapters.append(pairs)
    return a_st, b_st, adapters


def loop_reference(y_base, x, adapters, scale, slices, slots):
    """One token at a time, one slice at a time: y[t, cols_i] += scale * B_i @ (A_i @ x[t])."""
    y = y_base.astype(np.float64).copy()
    for t, s in enumerate(slots):
        if s == -1:
            continue
        offset = 0
        for (A, B), size in zip(adapters[s], slices, strict=True):
            y[t, offset:offset + size] += scale * (B.astype(np.float64) @ (A.astype(np.float64)
                                                                        @ x[t].astype(np.float64)))
            offset += size
    return y


# ---------------------------------------------------------------- the kernels by hand


# Two slots, rank 2, in 3. Slot 0's A picks x[0], x[1]; slot 1's A gives x[2] and the sum.
A_HAND = np.zeros((2, 1, 2, 3), np.float32)
A_HAND[0, 0] = [[1, 0, 0], [0, 1, 0]]
A_HAND[1, 0] = [[0, 0, 1], [1, 1, 1]]
# Slot 0's B is [[1, 0], [0, 1], [1, 1]], slot 1's is [[2, 0], [0, 2], [0, 0]].
B_HAND = np.zeros((2, 1, 3, 2), np.float32)
B_HAND[0, 0] = [[1, 0], [0, 1], [1, 1]]
B_HAND[1, 0] = [[2, 0], [0, 2], [0, 0]]


def test_bgmv_shrink_by_hand():
    x = f32([[1, 2, 3], [4, 5, 6], [1, 2, 3]])
    out = np.full((3, 2), 9.0, np.float32)  # stale content: shrink replaces it
    impl.bgmv_shrink(x, A_HAND, out, np.array([1, 0, -1]), 2.0)
    # row 0, slot 1: A1 @ [1, 2, 3] = [3, 6], times 2 -> [6, 12]
    # row 1, slot 0: A0 @ [4, 5, 6] = [4, 5], times 2 -> [8, 10]
    # row 2, -1: zeros. Read as "slot -1" = the last slot, it would be [6, 12] like row 0.
    np.testing.assert_array_equal(out, f32([[6, 12], [8, 10], [0, 0]]))


def test_bgmv_expand_by_hand_adds_or_replaces():
    h = f32([[1, 2], [3, 4], [5, 6]])
    base = f32([[10, 10, 10], [20, 20, 20], [30, 30, 30]])
    y = base.copy()
    impl.bgmv_expand(h, B_HAND, y, np.array([0, 1, -1]), add_inputs=True)
    # row 0, slot 0: B0 @ [1, 2] = [1, 2, 3];  row 1, slot 1: B1 @ [3, 4] = [6, 8, 0]
    # row 2, -1: untouched (slot 1 would add [10, 12, 0])
    np.testing.assert_array_equal(y, f32([[11, 12, 13], [26, 28, 20], [30, 30, 30]]))
    y = base.copy()
    impl.bgmv_expand(h, B_HAND, y, np.array([0, 1, -1]), add_inputs=False)
    # replaced, except the -1 row, which is never written in either mode
    np.testing.assert_array_equal(y, f32([[1, 2, 3], [6, 8, 0], [30, 30, 30]]))
    y = base.copy()
    impl.bgmv_expand(h, B_HAND, y, np.array([1, 1, 0]))  # the default is add_inputs=True
    np.testing.assert_array_equal(y, f32([[12, 14, 10], [26, 28, 20], [35, 36, 41]]))


def test_minus_one_is_never_the_last_slot_in_any_kernel():
    # every slot full, so reading slot S-1 for a -1 token would show everywhere
    rng = np.random.default_rng(1)
    a_st, b_st, _ = stacks_with(rng, 3, 4, 6, (5,), (4, 4, 4))
    x = rng.standard_normal((4, 6)).astype(np.float32)
    h = rng.standard_normal((4, 4)).astype(np.float32)
    idx = np.array([-1, 2, -1, 0])
    out = np.full((4, 4), 7.0, np.float32)
    impl.bgmv_shrink(x, a_st[0], out, idx, 1.0)
    assert (out[[0, 2]] == 0).all() and (out[[1, 3]] != 0).all()
    for add in (True, False):
        y = np.full((4, 5), 7.0, np.float32)
        impl.bgmv_expand(h, b_st[0], y, idx, add_inputs=add)
        assert (y[[0, 2]] == 7.0).all() and (y[[1, 3]] != 7.0).all()
    # the same through the segment kernels: segments [2, 2] of slots [-1, 2]
    out = np.full((4, 4), 7.0, np.float32)
    impl.sgmv_shrink(x, a_st[0], out, np.array([0, 2]), np.array([2, 2]), np.array([-1, 2]),
                     2, 2, 4, 1.0)
    assert (out[:2] == 0).all() and (out[2:] != 0).all()
    y = np.full((4, 5), 7.0, np.float32)
    impl.sgmv_expand(h, b_st[0], y, np.array([0, 2]), np.array([2, 2]), np.array([-1, 2]),
                     2, 2, 4, add_inputs=True)
    assert (y[:2] == 7.0).all() and (y[2:] != 7.0).all()


# ---------------------------------------------------------------- a whole layer


def test_add_lora_linear_by_hand_two_slices_scale_once():
    # in 2, slices (q: 2 columns, k: 1 column), rank 1, one slot, scale 0.5
    a_st = (np.array([[[[1, 1]]]], np.float32), np.array([[[[1, -1]]]], np.float32))
    b_st = (np.array([[[[1], [2]]]], np.float32), np.array([[[[3]]]], np.float32))
    y = f32([[10, 20, 30]])
    out = impl.add_lora_linear(y, f32([[2, 1]]), a_st, b_st, 0.5, (2, 1), np.array([0]))
    assert out is None  # in place, like upstream on the CPU
    # q: shrink 0.5 * (2 + 1) = 1.5, expand [1, 2] * 1.5 = [1.5, 3] -> columns 0..1
    # k: shrink 0.5 * (2 - 1) = 0.5, expand 3 * 0.5 = 1.5          -> column 2
    # scale applied twice: [10.75, 21.5, 30.75]; every slice at offset 0: [13, 23, 30];
    # overwriting y (no add_inputs): [1.5, 3, 1.5]
    np.testing.assert_array_equal(y, f32([[11.5, 23, 31.5]]))


def test_qkv_slices_with_two_adapters_and_base_rows_exactly():
    # GQA shapes: q 8 columns, k 2, v 2; slot 0 rank 2, slot 1 rank 3 (max rank 4)
    rng = np.random.default_rng(2)
    slices = (8, 2, 2)
    a_st, b_st, adapters = stacks_with(rng, 2, 4, 5, slices, (2, 3), ints=True)
    x = rng.integers(-3, 4, (6, 5)).astype(np.float32)
    base = rng.integers(-9, 10, (6, 12)).astype(np.float32)
    slots = np.array([1, 0, -1, 1, -1, 0])
    y = base.copy()
    impl.add_lora_linear(y, x, a_st, b_st, 2.0, slices, slots)
    # small integers: every value is exact, so the loop and the batch agree to the bit
    np.testing.assert_array_equal(y, loop_reference(base, x, adapters, 2.0, slices, slots))
    # and every slice of every adapted row moved (a slice expanded at the wrong offset,
    # or not at all, leaves one of them at the base value)
    for t in (0, 1, 3, 5):
        for lo, hi in ((0, 8), (8, 10), (10, 12)):
            assert not np.array_equal(y[t, lo:hi], base[t, lo:hi]), (t, lo)


def test_batched_equals_the_per_token_loop_on_random_data():
    rng = np.random.default_rng(3)
    slices = (16, 8, 8)
    a_st, b_st, adapters = stacks_with(rng, 4, 8, 32, slices, (8, 4, 2, 1))
    x = rng.standard_normal((24, 32)).astype(np.float32)
    base = rng.standard_normal((24, 32)).astype(np.float32)
    slots = rng.integers(-1, 4, 24)
    slots[[0, 11, 23]] = -1  # first, middle and last rows use no adapter
    y = base.copy()
    impl.add_lora_linear(y, x, a_st, b_st, 0.25, slices, slots)
    ref = loop_reference(base, x, adapters, 0.25, slices, slots)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert y.dtype == np.float32


def test_minus_one_rows_are_bit_identical_to_the_base_output():
    # Not "close": identical bits. The last slot (1) holds a loud adapter, so a -1 row
    # that reads it (Python's negative indexing) moves by tens, and one that adds a
    # computed zero-ish value would still differ in the last bits of these values.
    rng = np.random.default_rng(4)
    slices = (6, 3)
    a_st, b_st, _ = stacks_with(rng, 2, 4, 8, slices, (4, 4))
    b_st[0][1] *= 10.0
    x = rng.standard_normal((7, 8)).astype(np.float32)
    base = (rng.standard_normal((7, 9)) * 1e3).astype(np.float32)
    slots = np.array([-1, 0, 1, -1, 1, 0, -1])
    y = base.copy()
    impl.add_lora_linear(y, x, a_st, b_st, 1.0, slices, slots)
    base_rows = slots == -1
    assert np.array_equal(y[base_rows], base[base_rows])
    assert np.array_equal(y[base_rows].view(np.uint32), base[base_rows].view(np.uint32))
    assert (np.abs(y[~base_rows] - base[~base_rows]).max(axis=1) > 0.1).all()


def test_zero_padded_rank_changes_nothing():
    # the same rank-2 adapter in stacks of max rank 2 and of max rank 8: A's extra rows
    # and B's extra columns are zero, so the extra buffer entries are 0 and add 0
    rng = np.random.default_rng(5)
    slices = (4, 4)
    a2, b2, adapters = stacks_with(rng, 1, 2, 6, slices, (2,), ints=True)
    a8 = tuple(np.zeros((1, 1, 8, 6), np.float32) for _ in slices)
    b8 = tuple(np.zeros((1, 1, 4, 8), np.float32) for _ in slices)
    impl.set_lora(a8, b8, 0, [A for A, _ in adapters[0]], [B for _, B in adapters[0]])
    x = rng.integers(-3, 4, (5, 6)).astype(np.float32)
    y2, y8 = np.zeros((5, 8), np.float32), np.zeros((5, 8), np.float32)
    impl.add_lora_linear(y2, x, a2, b2, 1.0, slices, np.zeros(5, np.int64))
    impl.add_lora_linear(y8, x, a8, b8, 1.0, slices, np.zeros(5, np.int64))
    np.testing.assert_array_equal(y8, y2)
    assert np.abs(y8).max() > 0


def test_the_delta_has_the_adapters_rank():
    # 20 tokens, two adapters of rank 3 and 2 padded to 8: each slot's block of deltas
    # is a [tokens, out] matrix of rank exactly r (full rank would be 12)
    rng = np.random.default_rng(6)
    a_st, b_st, _ = stacks_with(rng, 2, 8, 12, (16,), (3, 2))
    x = rng.standard_normal((20, 12)).astype(np.float32)
    slots = np.array([0, 1] * 10)
    y = np.zeros((20, 16), np.float32)
    impl.add_lora_linear(y, x, a_st, b_st, 1.0, (16,), slots)
    assert np.linalg.matrix_rank(y[slots == 0], tol=1e-3) == 3
    assert np.linalg.matrix_rank(y[slots == 1], tol=1e-3) == 2
    # the same deltas from the merged weight of a one-slice layer with W = 0
    for slot in (0, 1):
        merged = impl.merged_weight(np.zeros((16, 12), np.float32), a_st, b_st, 1.0, (16,), slot)
        np.testing.assert_allclose(x[slots == slot] @ merged.T, y[slots == slot],
                                   rtol=1e-5, atol=1e-5)


def test_merged_weight_equals_base_plus_lora():
    rng = np.random.default_rng(7)
    slices = (8, 4, 4)
    a_st, b_st, adapters = stacks_with(rng, 3, 4, 10, slices, (4, 2, 3))
    W = rng.standard_normal((16, 10)).astype(np.float32)
    x = rng.standard_normal((5, 10)).astype(np.float32)
    for slot in (0, 1, 2):
        merged = impl.merged_weight(W, a_st, b_st, 0.5, slices, slot)
        # test-side: W + 0.5 * B @ A, slice by slice down the output rows
        expect = W.astype(np.float64).copy()
        off = 0
        for (A, B), size in zip(adapters[slot], slices, strict=True):
            expect[off:off + size] += 0.5 * (B.astype(np.float64) @ A)
            off += size
        np.testing.assert_allclose(merged, expect, rtol=1e-5, atol=1e-5)
        y = x @ W.T
        impl.add_lora_linear(y, x, a_st, b_st, 0.5, slices, np.full(5, slot))
        np.testing.assert_allclose(x @ merged.T, y, rtol=1e-5, atol=1e-5)
    same = impl.merged_weight(W, a_st, b_st, 0.5, slices, -1)
    assert same.dtype == np.float32 and np.array_equal(same, W) and same is not W


# ---------------------------------------------------------------- slots, ids and segments


def test_set_lora_pads_with_zeros_and_clears_the_slot_first():
    a_st = tuple(np.zeros((2, 1, 4, 3), np.float32) for _ in range(2))
    b_st = (np.zeros((2, 1, 2, 4), np.float32), np.zeros((2, 1, 1, 4), np.float32))
    ones_a, ones_b = [np.ones((4, 3))] * 2, [np.ones((2, 4)), np.ones((1, 4))]
    impl.set_lora(a_st, b_st, 0, ones_a, ones_b)
    impl.set_lora(a_st, b_st, 1, ones_a, ones_b)  # rank 4 in slot 1 ...
    A2 = np.full((2, 3), 2.0)
    impl.set_lora(a_st, b_st, 1, [A2, None], [np.full((2, 2), 3.0), None])  # ... then rank 2
    # slot 1, slice 0: rows 0-1 of A are the new 2s, rows 2-3 zero (not the old 1s);
    # columns 0-1 of B are 3s, columns 2-3 zero
    np.testing.assert_array_equal(a_st[0][1, 0], [[2, 2, 2], [2, 2, 2], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(b_st[0][1, 0], [[3, 3, 0, 0], [3, 3, 0, 0]])
    # slice 1 is not in the new adapter: all zero, so it applies no delta
    assert not a_st[1][1].any() and not b_st[1][1].any()
    # slot 0 is untouched
    assert (a_st[0][0] == 1).all() and (b_st[1][0] == 1).all()


def test_ids_become_slot_positions():
    # slot 0 holds adapter 7, slot 1 is empty, slot 2 holds adapter 3; id 0 = no LoRA
    slots = impl.lora_ids_to_slots([3, 0, 7, 3, 0], [7, None, 3])
    assert slots.dtype == np.int64
    assert slots.tolist() == [2, -1, 0, 2, -1]


def test_a_layer_indexes_by_slot_not_by_lora_int_id():
    # adapters 12 and 5 live in slots 1 and 2; indexing the stacks with the ids (or
    # with id - 1) picks the wrong slots or none
    rng = np.random.default_rng(8)
    slices = (4, 2)
    a_st, b_st, adapters = stacks_with(rng, 3, 2, 5, slices, (2, 2, 2), ints=True)
    by_id = {12: adapters[1], 5: adapters[2]}
    ids = [5, 12, 0, 5]
    slots = impl.lora_ids_to_slots(ids, [None, 12, 5])
    x = rng.integers(-3, 4, (4, 5)).astype(np.float32)
    y = np.zeros((4, 6), np.float32)
    impl.add_lora_linear(y, x, a_st, b_st, 1.0, slices, slots)
    for t, lora_id in enumerate(ids):
        expect = np.zeros(6)
        if lora_id:
            expect = np.concatenate([B @ (A @ x[t]) for A, B in by_id[lora_id]])
        np.testing.assert_array_equal(y[t], expect)


def test_sgmv_repeats_each_segments_slot_over_its_rows():
    # segments of 3, 1 and 2 tokens using slots 1, -1, 0: per token [1, 1, 1, -1, 0, 0]
    # (np.tile-like explosion gives [1, -1, 0, 1, -1, 0])
    x = f32([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1], [2, 0, 1], [0, 3, 1]])
    out = np.full((6, 2), 9.0, np.float32)
    impl.sgmv_shrink(x, A_HAND, out, np.array([0, 3, 4]), np.array([3, 1, 2]),
                     np.array([1, -1, 0]), 3, 3, 6, 1.0)
    # slot 1 rows: [x2, x0+x1+x2]; slot 0 rows: [x0, x1]
    np.testing.assert_array_equal(out, f32([[3, 6], [6, 15], [9, 24], [0, 0], [2, 0], [0, 3]]))
    y = np.ones((6, 3), np.float32)
    impl.sgmv_expand(out, B_HAND, y, np.array([0, 3, 4]), np.array([3, 1, 2]),
                     np.array([1, -1, 0]), 3, 3, 6)  # default add_inputs=False: replace
    np.testing.assert_array_equal(
        y, f32([[6, 12, 0], [12, 30, 0], [18, 48, 0], [1, 1, 1], [2, 0, 2], [0, 3, 3]]))


def test_sgmv_on_compute_meta_segments_equals_bgmv():
    # vLLM builds segments from the per-token slots with unique_consecutive: runs of
    # equal slots become one segment
    rng = np.random.default_rng(9)
    a_st, b_st, _ = stacks_with(rng, 3, 4, 8, (6,), (4, 3, 2))
    per_token = np.array([2, 2, 2, -1, -1, 0, 1, 1, 1, 1, 2, -1])
    change = np.flatnonzero(np.diff(per_token)) + 1
    starts = np.concatenate([[0], change])
    lens = np.diff(np.concatenate([starts, [len(per_token)]]))
    seg_slots = per_token[starts]
    x = rng.standard_normal((12, 8)).astype(np.float32)
    h_b, h_s = np.zeros((12, 4), np.float32), np.zeros((12, 4), np.float32)
    impl.bgmv_shrink(x, a_st[0], h_b, per_token, 0.5)
    impl.sgmv_shrink(x, a_st[0], h_s, starts, lens, seg_slots, len(lens), lens.max(), 12, 0.5)
    np.testing.assert_array_equal(h_s, h_b)
    base = rng.standard_normal((12, 6)).astype(np.float32)
    y_b, y_s = base.copy(), base.copy()
    impl.bgmv_expand(h_b, b_st[0], y_b, per_token, add_inputs=True)
    impl.sgmv_expand(h_s, b_st[0], y_s, starts, lens, seg_slots, len(lens), lens.max(), 12,
                     add_inputs=True)
    np.testing.assert_array_equal(y_s, y_b)


# ---------------------------------------------------------------- bad input


def test_bad_kernel_arguments_name_the_parameter():
    x, out = np.ones((3, 3), np.float32), np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"lora_indices_tensor.*\[-1, 1\]"):
        impl.bgmv_shrink(x, A_HAND, out, np.array([0, 2, 0]))  # 2 slots: index 2 is out
    with pytest.raises(ValueError, match=r"lora_indices_tensor.*\[-1, 1\]"):
        impl.bgmv_shrink(x, A_HAND, out, np.array([0, -2, 0]))
    with pytest.raises(ValueError, match="lora_indices_tensor"):
        impl.bgmv_shrink(x, A_HAND, out, np.array([0, 1]))  # one index per token
    with pytest.raises(ValueError, match="lora_indices_tensor"):
        impl.bgmv_shrink(x, A_HAND, out, np.array([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="inputs"):
        impl.bgmv_shrink(np.ones((3, 4), np.float32), A_HAND, out, np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="output_tensor"):
        impl.bgmv_shrink(x, A_HAND, np.zeros((3, 3), np.float32), np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="lora_a_weights"):
        impl.bgmv_shrink(x, A_HAND[:, 0], out, np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="lora_b_weights"):
        impl.bgmv_expand(out, np.ones((2, 2, 3, 2), np.float32), np.zeros((3, 3), np.float32),
                         np.array([0, 1, 0]))
    with pytest.raises(ValueError, match=r"lora_indices_tensor.*\[-1, 1\]"):
        impl.bgmv_expand(out, B_HAND, np.zeros((3, 3), np.float32), np.array([0, 5, 0]))
    with pytest.raises(ValueError, match="output_tensor"):
        impl.bgmv_expand(out, B_HAND, np.zeros((3, 4), np.float32), np.array([0, 1, 0]))


def test_bad_segments_name_the_parameter():
    x, out = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)
    good = dict(b_seq_start_loc=np.array([0, 3]), seq_len_tensor=np.array([3, 1]),
                lora_indices_tensor=np.array([0, 1]), batches=2, max_seq_length=3, token_nums=4)

    def call(**change):
        impl.sgmv_shrink(x, A_HAND, out, scaling=1.0, **{**good, **change})

    call()  # the good metadata passes
    with pytest.raises(ValueError, match="b_seq_start_loc"):
        call(b_seq_start_loc=np.array([0, 2]))
    with pytest.raises(ValueError, match="token_nums"):
        call(token_nums=5)
    with pytest.raises(ValueError, match="max_seq_length"):
        call(max_seq_length=4)
    with pytest.raises(ValueError, match="batches"):
        call(batches=3)
    with pytest.raises(ValueError, match="seq_len_tensor"):
        call(seq_len_tensor=np.array([4, 0]))
    with pytest.raises(ValueError, match=r"lora_indices_tensor.*\[-1, 1\]"):
        call(lora_indices_tensor=np.array([0, 2]))
    with pytest.raises(ValueError, match="token_nums"):
        impl.sgmv_expand(np.ones((4, 2), np.float32), B_HAND, np.zeros((4, 3), np.float32),
                         np.array([0, 3]), np.array([3, 1]), np.array([0, 1]), 2, 3, 5)


def test_bad_layer_arguments_name_the_parameter():
    rng = np.random.default_rng(10)
    a_st, b_st, _ = stacks_with(rng, 2, 2, 4, (3, 2), (2, 2))
    x, idx = np.ones((2, 4), np.float32), np.array([0, 1])
    with pytest.raises(ValueError, match="output_slices"):
        impl.add_lora_linear(np.zeros((2, 6), np.float32), x, a_st, b_st, 1.0, (3, 2), idx)
    with pytest.raises(ValueError, match="output_slices"):
        impl.add_lora_linear(np.zeros((2, 5), np.float32), x, a_st, b_st, 1.0, (5,), idx)
    with pytest.raises(ValueError, match="lora_b_stacked"):
        impl.add_lora_linear(np.zeros((2, 5), np.float32), x, a_st, b_st[:1], 1.0, (3, 2), idx)
    with pytest.raises(ValueError, match="lora_b_stacked"):
        impl.add_lora_linear(np.zeros((2, 5), np.float32), x, a_st, b_st, 1.0, (2, 3), idx)
    with pytest.raises(ValueError, match=r"^x "):
        impl.add_lora_linear(np.zeros((2, 5), np.float32), np.ones((2, 3), np.float32),
                             a_st, b_st, 1.0, (3, 2), idx)
    with pytest.raises(ValueError, match=r"^y "):
        impl.add_lora_linear(np.zeros((3, 5), np.float32), x, a_st, b_st, 1.0, (3, 2), idx)
    with pytest.raises(ValueError, match=r"lora_indices_tensor.*\[-1, 1\]"):
        impl.add_lora_linear(np.zeros((2, 5), np.float32), x, a_st, b_st, 1.0, (3, 2),
                             np.array([0, 2]))
    W = np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match=r"slot.*\[-1, 1\]"):
        impl.merged_weight(W, a_st, b_st, 1.0, (3, 2), 2)
    with pytest.raises(ValueError, match=r"slot.*\[-1, 1\]"):
        impl.merged_weight(W, a_st, b_st, 1.0, (3, 2), -2)
    with pytest.raises(ValueError, match="base_weight"):
        impl.merged_weight(W.T, a_st, b_st, 1.0, (3, 2), 0)
    with pytest.raises(ValueError, match=r"^y "):
        impl.add_lora_linear(np.zeros((2, 5), np.int64), x, a_st, b_st, 1.0, (3, 2), idx)
    with pytest.raises(ValueError, match=r"^x "):
        impl.add_lora_linear(np.zeros((2, 5), np.float32), np.ones(4, np.float32),
                             a_st, b_st, 1.0, (3, 2), idx)
    with pytest.raises(ValueError, match="token_lora_mapping holds id 4"):
        impl.lora_ids_to_slots([1, 4], [1, None])
    with pytest.raises(ValueError, match=r"token_lora_mapping must hold ids >= 0"):
        impl.lora_ids_to_slots([-1], [1, None])
    with pytest.raises(ValueError, match=r"index.*\[0, 1\]"):
        impl.set_lora(a_st, b_st, 2, [np.ones((2, 4))] * 2, [np.ones((3, 2)), np.ones((2, 2))])
    with pytest.raises(ValueError, match=r"lora_a\[0\].*max_lora_rank = 2"):
        impl.set_lora(a_st, b_st, 0, [np.ones((3, 4))] * 2, [np.ones((3, 3)), np.ones((2, 3))])
    with pytest.raises(ValueError, match=r"lora_b\[1\]"):
        impl.set_lora(a_st, b_st, 0, [np.ones((2, 4))] * 2, [np.ones((3, 2)), np.ones((3, 2))])


def test_demo_prints_the_readme_lines(capsys):
    impl._demo()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "lora ids [7, 7, 0, 3, 3, 3] -> slots [0, 0, -1, 1, 1, 1]"
    assert lines[3] == ("token 2  slot -1  max|delta|  0.000  vs merged ok  "
                        "bit-equal to base: True")
    assert all("vs merged ok" in line and "bit-equal to base: False" in line
               for line in lines[1:3] + lines[4:])


# ---------------------------------------------------------------- upstream's torch ops


@pytest.fixture(scope="module")
def up():
    """vLLM's CPU LoRA ops, loaded straight from upstream/ (the file imports only torch)."""
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("_lab11_01_upstream_lora_ops", UPSTREAM_OPS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return torch, module


@pytest.mark.upstream
def test_kernels_match_upstream_torch_ops_on_valid_indices(up):
    torch, ops = up
    rng = np.random.default_rng(11)
    T, S, r, n_in, n_out = 10, 3, 8, 24, 12
    A = rng.standard_normal((S, 1, r, n_in)).astype(np.float32)
    B = rng.standard_normal((S, 1, n_out, r)).astype(np.float32)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    idx = rng.integers(0, S, T)  # valid slots only: upstream is wrong on -1 (see below)
    mine, theirs = np.zeros((T, r), np.float32), torch.zeros(T, r)
    impl.bgmv_shrink(x, A, mine, idx, 0.7)
    ops.bgmv_shrink(torch.from_numpy(x), torch.from_numpy(A), theirs, torch.from_numpy(idx), 0.7)
    np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-5, atol=1e-5)
    base = rng.standard_normal((T, n_out)).astype(np.float32)
    for add in (True, False):
        mine_y, their_y = base.copy(), torch.from_numpy(base.copy())
        impl.bgmv_expand(mine, B, mine_y, idx, add_inputs=add)
        ops.bgmv_expand(theirs, torch.from_numpy(B), their_y, torch.from_numpy(idx),
                        add_inputs=add)
        np.testing.assert_allclose(mine_y, their_y.numpy(), rtol=1e-5, atol=1e-5)
    # segments [4, 1, 5] with slots [2, 0, 2]
    meta = (np.array([0, 4, 5]), np.array([4, 1, 5]), np.array([2, 0, 2]), 3, 5, 10)
    tmeta = tuple(torch.from_numpy(m) if isinstance(m, np.ndarray) else m for m in meta)
    impl.sgmv_shrink(x, A, mine, *meta, 1.5)
    ops.sgmv_shrink(torch.from_numpy(x), torch.from_numpy(A), theirs, *tmeta, 1.5)
    np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-5, atol=1e-5)
    mine_y, their_y = base.copy(), torch.from_numpy(base.copy())
    impl.sgmv_expand(mine, B, mine_y, *meta, add_inputs=True)
    ops.sgmv_expand(theirs, torch.from_numpy(B), their_y, *tmeta, add_inputs=True)
    np.testing.assert_allclose(mine_y, their_y.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.upstream
def test_add_lora_linear_matches_upstream_cpu_wrapper_composition(up):
    # PunicaWrapperCPU.add_lora_linear = per slice, shrink into a zeroed float32 buffer,
    # then bgmv_expand_slice into y's columns [offset, offset + size) with add_inputs=True
    torch, ops = up
    rng = np.random.default_rng(12)
    slices = (12, 4, 4)
    a_st, b_st, _ = stacks_with(rng, 2, 8, 16, slices, (8, 4))
    x = rng.standard_normal((9, 16)).astype(np.float32)
    base = rng.standard_normal((9, 20)).astype(np.float32)
    idx = rng.integers(0, 2, 9)
    mine = base.copy()
    impl.add_lora_linear(mine, x, a_st, b_st, 0.5, slices, idx)
    theirs, tidx, offset = torch.from_numpy(base.copy()), torch.from_numpy(idx), 0
    for a, b, size in zip(a_st, b_st, slices, strict=True):
        buf = torch.zeros(9, 8)
        ops.bgmv_shrink(torch.from_numpy(x), torch.from_numpy(a), buf, tidx, 0.5)
        ops.bgmv_expand_slice(buf, torch.from_numpy(b), theirs, tidx, offset, size, True)
        offset += size
    np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.upstream
def test_upstream_torch_ops_treat_minus_one_as_last_slot_at_the_pin(up):
    # A documented upstream bug at v0.22.1: the torch ops index the stack with the
    # token's slot directly, so -1 (no LoRA) selects the LAST slot. If this test fails
    # after a pin bump, upstream has fixed it (vllm-project/vllm PR #48421): update the
    # README's section on it and turn this test around.
    torch, ops = up
    x = torch.tensor([[1.0, 2.0, 3.0]] * 3)
    theirs = torch.zeros(3, 2)
    ops.bgmv_shrink(x, torch.from_numpy(A_HAND), theirs, torch.tensor([0, 1, -1]), 1.0)
    # row 2 (no LoRA) got slot 1's result, the same as row 1
    assert theirs.tolist() == [[1.0, 2.0], [3.0, 6.0], [3.0, 6.0]]
    mine = np.zeros((3, 2), np.float32)
    impl.bgmv_shrink(x.numpy(), A_HAND, mine, np.array([0, 1, -1]), 1.0)
    assert mine.tolist() == [[1.0, 2.0], [3.0, 6.0], [0.0, 0.0]]
    # the prefill path vLLM V1 takes on the CPU: sgmv with a -1 segment, exploded with
    # repeat_interleave, then the same indexing
    y = torch.full((3, 3), 10.0)
    ops.sgmv_expand(theirs[:2].clone().repeat(2, 1)[:3], torch.from_numpy(B_HAND), y,
                    torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([0, -1]),
                    2, 2, 3, add_inputs=True)
    # rows 1 and 2 are a no-LoRA segment, yet slot 1's B ([[2, 0], [0, 2], [0, 0]]) was added
    assert y.tolist() == [[11.0, 12.0, 13.0], [16.0, 22.0, 10.0], [12.0, 14.0, 10.0]]
