"""Lab 06-03 tests: GGUF Q4_1 bytes, grouped int4, GPTQ and AWQ packing, bit for bit."""
from __future__ import annotations

import ast
import contextlib
import io
import pathlib
import runpy
import types

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
QUANT_UTILS = UPSTREAM / "vllm/model_executor/layers/quantization/utils/quant_utils.py"
TENSOR = "blk.0.attn_q.weight"  # 576 x 576, Q4_1: 576 rows of 18 blocks = 360 bytes


def as_u32(words):
    """The bits of an int32 word, as a non-negative Python int (for hex comparisons)."""
    return int(np.asarray(words).astype(np.int64)) & 0xFFFFFFFF


def q4_1_block(d: float, m: float, codes) -> np.ndarray:
    """One Q4_1 block built by hand, test-side: fp16 d, fp16 m, GGUF nibble pairs."""
    codes = np.asarray(codes, dtype=np.uint8)
    nibbles = codes[:16] | (codes[16:] << 4)
    header = np.array([d, m], dtype=np.float16).view(np.uint8)
    return np.concatenate([header, nibbles])


# ---------------------------------------------------------------- GGUF nibbles


def test_gguf_nibbles_pair_weight_j_with_weight_j_plus_16():
    # codes 0..15 twice: byte j holds j (low) and j + 16 -> j again (high): 0x00, 0x11, ... 0xFF
    packed = impl.pack_q4_nibbles(np.arange(32) % 16)
    assert packed.dtype == np.uint8 and packed.shape == (16,)
    assert packed.tolist() == [0x11 * j for j in range(16)]
    # the first half all 0, the second all 15: every byte is 0xF0. The even/odd layout
    # (code 2j low, 2j + 1 high) would give eight 0x00 bytes then eight 0xFF.
    assert impl.pack_q4_nibbles([0] * 16 + [15] * 16).tolist() == [0xF0] * 16
    # one code at position 3, one at position 19: both land in byte 3
    codes = np.zeros(32, dtype=np.uint8)
    codes[3], codes[19] = 5, 9
    assert impl.pack_q4_nibbles(codes).tolist() == [0] * 3 + [0x95] + [0] * 12


def test_gguf_nibbles_round_trip_16x64_to_16x32():
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, size=(16, 64)).astype(np.uint8)
    packed = impl.pack_q4_nibbles(q)
    assert packed.shape == (16, 32) and packed.dtype == np.uint8
    # the second block of a row is packed on its own: its bytes are bytes 16..31
    np.testing.assert_array_equal(packed[:, 16:], impl.pack_q4_nibbles(q[:, 32:]))
    out = impl.unpack_q4_nibbles(packed)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, q)


# ---------------------------------------------------------------- Q4_1 by hand


def test_q4_1_dequant_of_a_hand_made_block():
    # d = 0.5, m = -1 (both exact in fp16): weight i = 0.5 * code + (-1)
    codes = list(range(16)) + list(range(15, -1, -1))
    raw = q4_1_block(0.5, -1.0, codes)
    assert raw.shape == (20,)
    out = impl.dequantize_q4_1(raw)
    assert out.dtype == np.float32 and out.shape == (32,)
    np.testing.assert_array_equal(out, 0.5 * np.array(codes, dtype=np.float32) - 1.0)
    # two blocks in a row, two rows: [2, 40] -> [2, 64]; blocks do not share d and m
    second = q4_1_block(2.0, 3.0, [1] * 32)
    rows = np.stack([np.concatenate([raw, second]), np.concatenate([second, raw])])
    out = impl.dequantize_q4_1(rows)
    assert out.shape == (2, 64)
    np.testing.assert_array_equal(out[0, 32:], np.full(32, 5.0, dtype=np.float32))
    np.testing.assert_array_equal(out[1, :32], np.full(32, 5.0, dtype=np.float32))


def test_q4_1_header_is_float16_and_little_endian():
    # d = 0.1 is not exact in fp16: the stored value is 0.0999755859375, and the weights
    # follow the stored value, not 0.1. Bytes 0-1 of the block are that fp16's bytes.
    raw = q4_1_block(0.1, 0.0, [10] * 32)
    assert raw[:2].tolist() == [0x66, 0x2E]  # 0x2E66, little-endian
    out = impl.dequantize_q4_1(raw)
    assert out[0] == np.float32(np.float16(0.1)) * 10
    assert out[0] != np.float32(1.0)


def test_q4_1_quantize_rounds_half_up_like_gguf():
    # min 0, max 15 -> d = 1 exactly; 2.5 sits on a tie: trunc(2.5 + 0.5) = 3, rint would say 2
    w = np.linspace(0.0, 15.0, 32, dtype=np.float32)
    w[1], w[2], w[3] = 2.5, 4.5, 0.49
    raw = impl.quantize_q4_1(w)
    assert raw.shape == (20,) and raw.dtype == np.uint8
    codes = impl.unpack_q4_nibbles(raw[4:])
    assert codes[1] == 3 and codes[2] == 5 and codes[3] == 0
    assert raw[:2].view(np.float16)[0] == 1.0 and raw[2:4].view(np.float16)[0] == 0.0


def test_q4_1_multiplies_by_the_reciprocal_of_d():
    # gguf-py computes (w - min) * (1 / d), not (w - min) / d. The two differ in the last
    # bit now and then, and at a tie that moves the code. In this block (found by a random
    # search) the third weight gives exactly 7.5 through the reciprocal -> code 8, but
    # 7.4999995 through the division -> code 7.
    w = np.zeros(32, dtype=np.float32)
    w[:3] = [np.float32(-3.0356581), np.float32(3.069139), np.float32(0.016740523)]
    codes = impl.unpack_q4_nibbles(impl.quantize_q4_1(w)[4:])
    assert codes[2] == 8


def test_q4_1_stores_the_minimum_as_m_and_a_constant_block_as_d_zero():
    w = np.full(32, -0.75, dtype=np.float32)
    raw = impl.quantize_q4_1(w)
    assert raw[:2].view(np.float16)[0] == 0.0  # d = 0: every code 0
    assert raw[2:4].view(np.float16)[0] == -0.75
    assert raw[4:].tolist() == [0] * 16
    np.testing.assert_array_equal(impl.dequantize_q4_1(raw), w)


def test_q4_1_matches_gguf_on_random_data():
    gq = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    rng = np.random.default_rng(2)
    # several scales, a zero row and a constant row, float64 input (computed in float32)
    w = rng.standard_normal((6, 256)) * np.array([[1e-3], [0.02], [1.0], [30.0], [0.0], [1.0]])
    w[5] = 0.3
    expect = gq.quantize(w.astype(np.float32), GGMLQuantizationType.Q4_1)
    got = impl.quantize_q4_1(w)
    assert got.shape == (6, 160) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, expect)
    deq = impl.dequantize_q4_1(expect)
    ref = gq.dequantize(expect, GGMLQuantizationType.Q4_1)
    np.testing.assert_array_equal(deq.view(np.uint32), ref.astype(np.float32).view(np.uint32))


# ---------------------------------------------------------------- grouped int4


def test_symmetric_group_codes_by_hand():
    # one group of 4 in one column: max 1.75 / 7 = 0.25, |min| 2.0 / 8 = 0.25 -> scale 0.25
    w = np.array([[-2.0], [0.3], [0.625], [1.75]])
    q, scales, zeros = impl.quantize_grouped(w, 4)
    assert q.dtype == np.uint8 and scales.dtype == np.float16 and zeros.dtype == np.uint8
    assert scales.tolist() == [[0.25]] and zeros.tolist() == [[8]]
    # -2/0.25 = -8 -> 0; 0.3/0.25 = 1.2 -> 1 -> 9; 0.625/0.25 = 2.5 -> 2 (half to even) -> 10
    assert q.ravel().tolist() == [0, 9, 10, 15]
    back = impl.dequantize_grouped(q, scales, zeros, 4)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.ravel(), [-2.0, 0.25, 0.5, 1.75])


def test_symmetric_scale_takes_the_larger_side():
    # max 0.7 -> 0.7/7 = 0.1; min -0.4 -> 0.4/8 = 0.05: the positive side sets the scale
    q, scales, _ = impl.quantize_grouped(np.array([[-0.4], [0.0], [0.7], [0.35]]), 4)
    assert scales[0, 0] == np.float16(0.1)
    s = np.float32(np.float16(0.1))
    assert q.ravel().tolist() == [int(np.rint(-0.4 / s)) + 8, 8, 15, int(np.rint(0.35 / s)) + 8]
    # the codes come from the stored fp16 scale 0.0999755859375, not from 0.1: 0.24997 is
    # 2.4997 steps of 0.1 (code 2 + 8 = 10) but 2.5003 stored steps (code 3 + 8 = 11)
    q, _, _ = impl.quantize_grouped(np.array([[-0.4], [0.24997], [0.7], [0.35]]), 4)
    assert q.ravel().tolist() == [4, 11, 15, 12]
    # an all-zero group gets scale 1, codes 8, and dequantizes to exact zeros (no NaN)
    q, scales, zeros = impl.quantize_grouped(np.zeros((4, 2)), 2)
    assert scales.tolist() == [[1.0, 1.0], [1.0, 1.0]] and q.tolist() == [[8, 8]] * 4
    np.testing.assert_array_equal(impl.dequantize_grouped(q, scales, zeros, 2), 0.0)


def test_asymmetric_group_codes_by_hand():
    # range [-1, 2] -> scale 3/15 = 0.2 -> fp16 0.199951171875; zero = rint(1/0.19995) = 5
    w = np.array([[-1.0], [0.0], [1.0], [2.0]])
    q, scales, zeros = impl.quantize_grouped(w, 4, symmetric=False)
    assert scales[0, 0] == np.float16(0.2) and zeros.tolist() == [[5]]
    assert q.ravel().tolist() == [0, 5, 10, 15]
    s = np.float32(np.float16(0.2))
    np.testing.assert_array_equal(impl.dequantize_grouped(q, scales, zeros, 4).ravel(),
                                  (np.array([0, 5, 10, 15], np.float32) - 5) * s)
    # a group of positive numbers: the range is widened to 0, so the zero point is 0
    q, scales, zeros = impl.quantize_grouped(np.array([[1.5], [3.0]]), 2, symmetric=False)
    assert zeros.tolist() == [[0]] and scales[0, 0] == np.float16(0.2)
    assert q.ravel().tolist() == [8, 15]


def test_asymmetric_edge_groups():
    # all negative: widened to hi = 0, scale 3/15 = 0.2, zero = rint(3 / 0.19995) = 15 (the top)
    q, scales, zeros = impl.quantize_grouped(np.array([[-1.5], [-3.0]]), 2, symmetric=False)
    assert zeros.tolist() == [[15]] and scales[0, 0] == np.float16(0.2)
    # -1.5 / 0.19995 = -7.5018 -> -8 -> 7; -3 / 0.19995 = -15.004 -> -15 -> 0
    assert q.ravel().tolist() == [7, 0]
    # all zero: scale 1, zero point 0, codes 0, and exact zeros back (no NaN)
    q, scales, zeros = impl.quantize_grouped(np.zeros((4, 3)), 4, symmetric=False)
    assert scales.tolist() == [[1.0] * 3] and zeros.tolist() == [[0] * 3]
    assert q.tolist() == [[0] * 3] * 4
    np.testing.assert_array_equal(impl.dequantize_grouped(q, scales, zeros, 4), 0.0)


def test_group_size_1_is_a_scale_per_weight():
    w = np.array([[0.875, -2.0], [3.5, 0.0]])
    q, scales, zeros = impl.quantize_grouped(w, 1)
    assert scales.shape == (2, 2)
    # a lone -2.0 is its group's max as well as its min: scale max(2/7, 2/8) = 2/7, code -7 + 8
    assert q.tolist() == [[15, 1], [15, 8]]
    assert scales[0, 1] == np.float16(2 / 7)
    back = impl.dequantize_grouped(q, scales, zeros, 1)
    np.testing.assert_array_equal(back[:, 0], [0.875, 3.5])  # 0.125 and 0.5 are exact in fp16
    assert back[1, 1] == 0.0 and abs(back[0, 1] + 2.0) < 1e-3


def test_groups_run_down_the_rows_of_each_column():
    # k = 8, n = 2, group 4: rows 0-3 and rows 4-7 of each column are separate groups
    w = np.zeros((8, 2))
    w[:4, 0] = [7.0, 0, 0, 0]   # group 0 of column 0: scale 1
    w[4:, 0] = [0, 0, 0, 14.0]  # group 1 of column 0: scale 2
    w[:, 1] = 0.7               # column 1: 0.1 in both groups
    q, scales, _ = impl.quantize_grouped(w, 4)
    assert scales.shape == (2, 2)
    assert scales[:, 0].tolist() == [1.0, 2.0]
    assert scales[:, 1].tolist() == [np.float16(0.1)] * 2
    np.testing.assert_array_equal(q[:, 0], [15, 8, 8, 8, 8, 8, 8, 15])


def test_group_16_stores_8x_the_scales_of_group_128():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 64))
    small = impl.quantize_grouped(w, 16)[1]
    big = impl.quantize_grouped(w, 128)[1]
    assert small.shape == (16, 64) and big.shape == (2, 64)
    assert small.size == 8 * big.size


def test_smaller_groups_track_an_outlier_better():
    # one loud weight per column: it inflates the scale of its group only
    rng = np.random.default_rng(4)
    w = rng.standard_normal((256, 32)).astype(np.float32)
    w[5] *= 40
    errs = {}
    for g in (16, 64, 256):
        q, s, z = impl.quantize_grouped(w, g)
        errs[g] = np.abs(impl.dequantize_grouped(q, s, z, g) - w).mean()
    assert errs[16] < errs[64] < errs[256]
    assert errs[256] > 4 * errs[16]


def test_round_trip_error_is_about_half_a_step():
    # rounding to the nearest code costs at most half a step; the float16 scale and the
    # integer zero point can push an extreme weight a hair past the last code (seen here:
    # 0.5017 steps, asymmetric), hence the 2% slack
    rng = np.random.default_rng(5)
    w = rng.standard_normal((128, 24))
    for symmetric in (True, False):
        q, s, z = impl.quantize_grouped(w, 32, symmetric=symmetric)
        step = np.repeat(s.astype(np.float32), 32, axis=0)
        err = np.abs(impl.dequantize_grouped(q, s, z, 32) - w)
        assert np.all(err <= 0.51 * step)
        assert (err / step).max() > 0.45  # the steps really are that coarse


def test_group_size_must_divide_in_features():
    # SmolLM2's hidden size is 576 = 2^6 * 9: groups 32, 64, 192, 576 fit, 128 does not
    w = np.zeros((576, 8))
    for g in (32, 64, 192, 576):
        assert impl.quantize_grouped(w, g)[1].shape == (576 // g, 8)
    with pytest.raises(ValueError, match="group_size"):
        impl.quantize_grouped(w, 128)
    with pytest.raises(ValueError, match="group_size"):
        impl.quantize_grouped(w, 0)


# ---------------------------------------------------------------- int32 packing


def test_gptq_packs_eight_rows_into_one_word():
    column = np.arange(1, 9, dtype=np.uint8).reshape(8, 1)
    packed = impl.pack_gptq_rows(column)
    assert packed.dtype == np.int32 and packed.shape == (1, 1)
    assert as_u32(packed[0, 0]) == 0x87654321  # row 0 in the lowest nibble
    # a code >= 8 in row 7 sets the sign bit: 15 everywhere is -1 as int32
    assert impl.pack_gptq_rows(np.full((8, 1), 15, np.uint8))[0, 0] == -1
    np.testing.assert_array_equal(impl.unpack_gptq_rows(np.array([[-1]], np.int32)), 15)
    # k = 16: word 0 holds rows 0-7, word 1 rows 8-15 (not rows 0, 2, 4, ... or 0, 8 / 1, 9 ...)
    rows = np.arange(16, dtype=np.uint8).reshape(16, 1)
    assert [as_u32(x) for x in impl.pack_gptq_rows(rows).ravel()] == [0x76543210, 0xFEDCBA98]


def test_awq_interleaves_columns_0_2_4_6_1_3_5_7():
    row = np.arange(8, dtype=np.uint8).reshape(1, 8)
    packed = impl.pack_awq(row)
    assert packed.dtype == np.int32 and packed.shape == (1, 1)
    # nibbles from low to high hold columns 0, 2, 4, 6, 1, 3, 5, 7
    assert as_u32(packed[0, 0]) == 0x75316420
    # a plain sequential pack would give 0x76543210
    assert as_u32(impl.pack_awq(np.array([[15, 0, 0, 0, 0, 0, 0, 0]]))[0, 0]) == 0xF
    assert as_u32(impl.pack_awq(np.array([[0, 15, 0, 0, 0, 0, 0, 0]]))[0, 0]) == 0xF0000


def test_pack_unpack_round_trips():
    rng = np.random.default_rng(6)
    q = rng.integers(0, 16, size=(64, 16)).astype(np.uint8)
    gptq = impl.pack_gptq_rows(q)
    assert gptq.shape == (8, 16) and gptq.dtype == np.int32
    np.testing.assert_array_equal(impl.unpack_gptq_rows(gptq), q)
    awq = impl.pack_awq(q)
    assert awq.shape == (64, 2) and awq.dtype == np.int32
    np.testing.assert_array_equal(impl.unpack_awq(awq), q)
    assert impl.unpack_awq(awq).dtype == np.uint8
    assert impl.unpack_gptq_rows(gptq).dtype == np.uint8
    # the same codes, packed along k and along n: GPTQ and AWQ words differ
    assert not np.array_equal(impl.pack_gptq_rows(q[:8, :8]), impl.pack_awq(q[:8, :8]).T)


def _upstream_packers() -> dict:
    """``pack_rows``, ``pack_cols`` and ``awq_pack`` from upstream's quant_utils.py, run on numpy.

    Their source is extracted with ``ast`` and executed against a small stand-in for
    torch (an ndarray subclass with ``.cpu()``, ``.numpy()``, ``.contiguous()``,
    ``.to()``), so neither vllm nor torch is imported.
    """

    class T(np.ndarray):
        device = "cpu"

        def cpu(self):
            return self

        def numpy(self):
            return np.asarray(self)

        def contiguous(self):
            return self

        def to(self, *args, **kwargs):
            return self

    fake_torch = types.SimpleNamespace(Tensor=T, from_numpy=lambda a: a.view(T))
    tree = ast.parse(QUANT_UTILS.read_text())
    wanted = {"get_pack_factor", "pack_rows", "pack_cols", "awq_pack", "gptq_pack"}
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {d.name for d in defs} == wanted
    namespace = {"numpy": np, "torch": fake_torch}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(QUANT_UTILS), "exec"), namespace)
    namespace["T"] = T
    return namespace


@pytest.mark.upstream
def test_awq_and_gptq_packing_match_upstream():
    up = _upstream_packers()
    rng = np.random.default_rng(7)
    q = rng.integers(0, 16, size=(32, 64)).astype(np.int32)
    awq = np.asarray(up["awq_pack"](q.view(up["T"]), 4, 32, 64))
    gptq = np.asarray(up["gptq_pack"](q.view(up["T"]), 4, 32, 64))
    assert awq.shape == (32, 8) and gptq.shape == (4, 64)
    np.testing.assert_array_equal(impl.pack_awq(q.astype(np.uint8)), awq)
    np.testing.assert_array_equal(impl.pack_gptq_rows(q.astype(np.uint8)), gptq)


# ---------------------------------------------------------------- bits per weight


def test_bits_per_weight():
    assert impl.bits_per_weight(128) == 4.125  # GPTQ symmetric, fp16 scale
    assert impl.bits_per_weight(128, 16, 4) == 4.15625  # plus a packed 4-bit zero point
    assert impl.bits_per_weight(32, 16, 16) == 5.0  # GGUF Q4_1: fp16 d and fp16 m per 32
    assert impl.bits_per_weight(32, 16, 0, weight_bits=8) == 8.5  # GGUF Q8_0
    assert impl.bits_per_weight(16) == 5.0  # group 16: the scales are a quarter of the codes
    assert impl.bits_per_weight(64) == 4.25
    assert impl.bits_per_weight(1, 0) == 4.0
    assert impl.bits_per_weight(32, 16, 0, weight_bits=1) == 1.5  # 1-bit codes are allowed


# ---------------------------------------------------------------- errors


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="q"):
        impl.pack_q4_nibbles(np.zeros(30, np.uint8))
    with pytest.raises(ValueError, match="q"):
        impl.pack_q4_nibbles(np.full(32, 16))
    with pytest.raises(ValueError, match="packed"):
        impl.unpack_q4_nibbles(np.zeros(15, np.uint8))
    with pytest.raises(ValueError, match="packed"):
        impl.unpack_q4_nibbles(np.zeros(16, np.int32))
    with pytest.raises(ValueError, match="raw"):
        impl.dequantize_q4_1(np.zeros(19, np.uint8))
    with pytest.raises(ValueError, match="raw"):
        impl.dequantize_q4_1(np.zeros(20, np.int8))
    with pytest.raises(ValueError, match="raw"):
        impl.dequantize_q4_1(np.zeros((2, 0), np.uint8))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_q4_1(np.zeros(48))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_q4_1(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_grouped(np.zeros(8), 4)
    with pytest.raises(ValueError, match="W"):
        impl.quantize_grouped(np.zeros((0, 4)), 4)
    with pytest.raises(ValueError, match="q"):
        impl.pack_gptq_rows(np.zeros((12, 4), np.uint8))
    with pytest.raises(ValueError, match="q"):
        impl.pack_gptq_rows(np.full((8, 4), -1))
    with pytest.raises(ValueError, match="q"):
        impl.pack_awq(np.zeros((4, 12), np.uint8))
    with pytest.raises(ValueError, match="q"):
        impl.pack_awq(np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="packed"):
        impl.unpack_gptq_rows(np.zeros((1, 1), np.uint32))
    with pytest.raises(ValueError, match="packed"):
        impl.unpack_awq(np.zeros(4, np.int32))
    for kwargs, name in [({"group_size": 0}, "group_size"),
                         ({"group_size": 32, "weight_bits": 0}, "weight_bits"),
                         ({"group_size": 32, "scale_bits": -1}, "scale_bits"),
                         ({"group_size": 32, "zero_bits": -1}, "zero_bits")]:
        with pytest.raises(ValueError, match=name):
            impl.bits_per_weight(**kwargs)


def test_dequantize_grouped_checks_shapes():
    q = np.full((8, 4), 8, np.uint8)
    s = np.ones((2, 4), np.float16)
    z = np.full((2, 4), 8, np.uint8)
    np.testing.assert_array_equal(impl.dequantize_grouped(q, s, z, 4), 0.0)
    with pytest.raises(ValueError, match="group_size"):
        impl.dequantize_grouped(q, s, z, 3)
    with pytest.raises(ValueError, match="group_size"):
        impl.dequantize_grouped(q, s, z, 0)
    with pytest.raises(ValueError, match="scales"):
        impl.dequantize_grouped(q, s[:1], z, 4)
    with pytest.raises(ValueError, match="zeros"):
        impl.dequantize_grouped(q, s, z[:, :2], 4)
    with pytest.raises(ValueError, match="q"):
        impl.dequantize_grouped(q + 8, s, z, 4)
    with pytest.raises(ValueError, match="q"):
        impl.dequantize_grouped(q[0], s, z, 4)


def test_script_example_prints_the_readme_lines():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(pathlib.Path(impl.__file__)), run_name="__main__")
    lines = buf.getvalue().splitlines()
    assert lines[:3] == ["GGUF nibbles of 0..15,0..15: [0, 17, 34, 51]",
                         "GPTQ word of rows 1..8: 0x87654321",
                         "AWQ word of columns 0..7: 0x75316420"]
    assert lines[4] == "group 128, zero bits  4: 4.15625 bits/weight"


# ---------------------------------------------------------------- the real file (SmolLM2)


@pytest.fixture(scope="module")
def smollm2_q():
    """``blk.0.attn_q.weight`` of the shipped SmolLM2 GGUF: its raw bytes and gguf's floats.

    The file is parsed once per session (a few seconds: most of it is the tokenizer's
    strings) by ``hub.gguf_reader``, which lab 06 shares; only this one tensor's bytes are read.
    """
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    from mini_vllm.models import hub

    if hub.model_path("smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: python -m mini_vllm download smollm2")
    reader = hub.gguf_reader("smollm2")
    tensor = next(t for t in reader.tensors if t.name == TENSOR)
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1
    raw = np.array(tensor.data)  # copy out of the memory map: [576, 360] uint8
    return raw, dequantize(raw, gguf.GGMLQuantizationType.Q4_1)


@pytest.mark.model
def test_q4_1_dequant_is_bit_exact_on_smollm2(smollm2_q):
    raw, ref = smollm2_q
    assert raw.shape == (576, 360) and raw.dtype == np.uint8
    # 360 bytes for 576 weights: 20 bytes per 32 = 5.0 bits per weight
    assert raw.shape[1] * 8 / 576 == impl.bits_per_weight(32, 16, 16) == 5.0
    out = impl.dequantize_q4_1(raw)
    assert out.shape == (576, 576) and out.dtype == np.float32
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.model
def test_q4_1_requantize_reproduces_the_file(smollm2_q):
    raw, ref = smollm2_q
    np.testing.assert_array_equal(impl.quantize_q4_1(ref), raw)


@pytest.mark.model
def test_smollm2_groups_of_its_hidden_size(smollm2_q):
    # as GPTQ/AWQ store it: [in_features k = 576, out_features n = 576]
    w = smollm2_q[1].T
    with pytest.raises(ValueError, match="group_size"):
        impl.quantize_grouped(w, 128)
    # relative RMS error of re-quantizing the file's (already 4-bit) weights, measured on
    # the 2-core machine this lab was written on: symmetric groups 32, 64, 192, 576
    # give 0.107, 0.123, 0.147, 0.169; asymmetric group 32 gives 0.090
    def rel_rms(g, symmetric=True):
        q, s, z = impl.quantize_grouped(w, g, symmetric=symmetric)
        assert s.shape == (576 // g, 576)
        err = impl.dequantize_grouped(q, s, z, g) - w
        return float(np.sqrt((err ** 2).sum() / (w ** 2).sum()))

    errs = [round(rel_rms(g), 3) for g in (32, 64, 192, 576)]
    assert errs == [0.107, 0.123, 0.147, 0.169]
    assert round(rel_rms(32, symmetric=False), 3) == 0.090
