"""Lab 06-05 tests: FP8 quantization and _scaled_mm, MXFP4 and NVFP4 blocks, bit for bit."""
from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
import torch

from course import load_impl

impl = load_impl(__file__)

MX = gguf.GGMLQuantizationType.MXFP4
NV = gguf.GGMLQuantizationType.NVFP4
F8 = torch.float8_e4m3fn


def fp8_values(q: torch.Tensor) -> list:
    return q.to(torch.float32).tolist()


def nvfp4_block(scale_bytes, codes) -> np.ndarray:
    """One ggml NVFP4 block built test-side: 4 scale bytes, then per sub-block of 16
    codes c, 8 bytes c[j] | c[j + 8] << 4."""
    c = np.asarray(codes, dtype=np.uint8).reshape(4, 16)
    qs = c[:, :8] | (c[:, 8:] << 4)
    return np.concatenate([np.asarray(scale_bytes, dtype=np.uint8), qs.ravel()])


# ---------------------------------------------------------------- FP8: range and clamping


def test_500_becomes_448_never_nan():
    # the two FP8 ranges, from both libraries: E4M3 tops out at 448, E5M2 at 57,344
    assert torch.finfo(torch.float8_e4m3fn).max == 448.0 == impl.FP8_E4M3_MAX
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) == 448.0
    assert torch.finfo(torch.float8_e5m2).max == 57344.0 == impl.FP8_E5M2_MAX
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max) == 57344.0
    # what the raw casts do, measured on torch 2.13 CPU and ml_dtypes 0.6: ml_dtypes makes NaN
    # of anything that rounds past 448 (465 does, 464 is a tie and goes to 448); torch's CPU
    # cast saturates, even inf becomes 448
    raw = np.array([500, 465, 464], np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.isnan(raw[0]) and np.isnan(raw[1]) and raw[2] == 448
    assert torch.tensor([500.0, float("inf")]).to(F8).float().tolist() == [448.0, 448.0]
    # the clamped numpy cast: no NaN, ever, for finite input
    out = impl.fp8_e4m3_cast_np(np.array([500, 465, 464, -1e9, 0.3], np.float32))
    assert out.dtype == ml_dtypes.float8_e4m3fn
    assert out.astype(np.float32).tolist() == [448, 448, 448, -448, 0.3125]
    # and vLLM's op with a static scale of 1
    q, s = impl.scaled_fp8_quant(torch.tensor([[500.0, -500.0, 448.0, 1e30]]), scale=torch.tensor([1.0]))
    assert q.dtype == F8 and fp8_values(q) == [[448.0, -448.0, 448.0, 448.0]]


def test_fp8_grid_agrees_between_torch_and_ml_dtypes():
    # every finite E4M3 value (bytes 0..0x7E and 0x80..0xFE) survives both casts unchanged
    codes = np.array([b for b in range(256) if b & 0x7F != 0x7F], np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np_bytes = impl.fp8_e4m3_cast_np(values).view(np.uint8)
    np.testing.assert_array_equal(np_bytes, codes)
    q, _ = impl.scaled_fp8_quant(torch.from_numpy(values).reshape(2, -1), scale=torch.tensor([1.0]))
    np.testing.assert_array_equal(q.view(torch.uint8).numpy().ravel(), codes)


# ---------------------------------------------------------------- FP8: the three modes


def test_dynamic_per_tensor_scale_and_reciprocal():
    # amax 3136 = 7 * 448, so the scale is exactly 7. 10.9375 / 7 = 1.5625, a tie between the
    # E4M3 neighbours 1.5 and 1.625; the kernel multiplies by float32(1/7), which lands one
    # float32 step above the tie (1.5625001), so the code is 1.625.
    x = torch.tensor([[3136.0, 10.9375], [-1.0, 0.0]])
    q, s = impl.scaled_fp8_quant(x)
    assert s.dtype == torch.float32 and tuple(s.shape) == (1,) and s.item() == 7.0
    assert q.shape == x.shape and q.dtype == F8
    assert fp8_values(q)[0] == [448.0, 1.625]
    # -1/7 = -0.142857: nearest E4M3 is -0.140625 (0.125 + 1/64, spacing 1/64 there)
    assert fp8_values(q)[1] == [-0.140625, 0.0]


def test_dynamic_per_token_divides_and_returns_one_scale_per_row():
    # the same rows per token: row 0 has scale 7 again, and this kernel divides, so the tie
    # 1.5625 goes to even: 1.5. Row 1's scale is 1/448 and its -1 becomes -448.
    x = torch.tensor([[3136.0, 10.9375], [-1.0, 0.0]])
    q, s = impl.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    assert s.dtype == torch.float32 and tuple(s.shape) == (2, 1)
    assert s[0, 0].item() == 7.0 and s[1, 0].item() == pytest.approx(1 / 448, rel=1e-7)
    assert fp8_values(q) == [[448.0, 1.5], [-448.0, 0.0]]
    # a per-column scale (the wrong axis) would have shape (1, 2) and give row 1 codes -1/3136*448
    q3, s3 = impl.scaled_fp8_quant(torch.ones(3, 5) * torch.tensor([[1.0], [2.0], [4.0]]),
                                   use_per_token_if_dynamic=True)
    assert tuple(s3.shape) == (3, 1) and torch.equal(s3.ravel(), torch.tensor([1.0, 2.0, 4.0]) / 448)
    assert fp8_values(q3) == [[448.0] * 5] * 3


def test_static_scale_is_used_as_given():
    x = torch.tensor([[10.9375, 1.0, -3000.0]])
    q, s = impl.scaled_fp8_quant(x, scale=torch.tensor([7.0]))
    assert s.dtype == torch.float32 and s.reshape(-1).tolist() == [7.0]
    # 10.9375 * float32(1/7) -> 1.625 (see the per-tensor test); 1/7 -> 0.140625; -3000/7 = -428.6
    # -> -416 (E4M3 spacing is 32 between 256 and 448: 416 and 448 are the neighbours)
    assert fp8_values(q) == [[1.625, 0.140625, -416.0]]
    # a static scale smaller than the data needs: the clamp, not the data, decides
    q, _ = impl.scaled_fp8_quant(x, scale=torch.tensor(0.5))
    assert fp8_values(q) == [[22.0, 2.0, -448.0]]


def test_all_zero_input_gets_the_floor_scale():
    # vLLM floors a dynamic per-token scale at 1 / (448 * 512); this lab floors per-tensor too
    for per_token in (False, True):
        q, s = impl.scaled_fp8_quant(torch.zeros(2, 4), use_per_token_if_dynamic=per_token)
        assert torch.equal(s.ravel(), torch.full((2 if per_token else 1,), impl.FP8_MIN_SCALE))
        assert not torch.isnan(q.float()).any() and fp8_values(q) == [[0.0] * 4] * 2
    # a tiny but nonzero row: amax / 448 is below the floor, so the floor is the scale
    q, s = impl.scaled_fp8_quant(torch.tensor([[1e-6, 0.0]]), use_per_token_if_dynamic=True)
    assert s.item() == pytest.approx(impl.FP8_MIN_SCALE, rel=1e-7)
    assert fp8_values(q)[0][0] == pytest.approx(1e-6 / impl.FP8_MIN_SCALE, rel=2 ** -4)


def test_per_token_beats_per_tensor_on_rows_of_different_magnitude():
    # four rows of N(0, 1), scaled by 100, 1, 0.01 and 1e-4. One scale for all (amax ~ 300)
    # has a step of ~2^-9 * 0.66 ~ 1.3e-3 near zero: the 1e-4 row rounds to zero (error 1.0);
    # per token, every row keeps E4M3's ~2.5% relative RMS error.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 256, generator=g) * torch.tensor([[100.0], [1.0], [0.01], [1e-4]])

    def row_errors(per_token):
        q, s = impl.scaled_fp8_quant(x, use_per_token_if_dynamic=per_token)
        return ((q.float() * s - x).norm(dim=1) / x.norm(dim=1)).tolist()

    tensor_err, token_err = row_errors(False), row_errors(True)
    # measured: per tensor [0.0268, 0.0265, 0.0440, 1.0000]; per token [0.0268, 0.0262, 0.0273, 0.0255]
    assert tensor_err[3] == 1.0 and tensor_err[2] == pytest.approx(0.0440, abs=5e-4)
    assert max(token_err) < 0.028 and min(token_err) > 0.025
    assert tensor_err[3] / token_err[3] > 35


# ---------------------------------------------------------------- FP8: _scaled_mm


def emulate(xq, xs, wq, ws):
    """The W8A8 product the hardware computes, in float32, test-side."""
    return (xq.float() * xs.reshape(-1, 1)) @ (wq.float() * ws.reshape(-1, 1)).t()


@pytest.mark.parametrize("per_channel, pinned", [(False, 0.03693), (True, 0.03642)])
def test_fp8_linear_matches_fp32_and_the_emulation(per_channel, pinned):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 128, generator=g), torch.randn(48, 128, generator=g)
    wq, ws = impl.scaled_fp8_quant(w, use_per_token_if_dynamic=per_channel)
    y = impl.fp8_linear(x, wq, ws)
    assert y.dtype == torch.float32 and tuple(y.shape) == (16, 48)
    # exactly what the hardware would do: dynamic activations (per token iff per channel)
    xq, xs = impl.scaled_fp8_quant(x, use_per_token_if_dynamic=per_channel)
    torch.testing.assert_close(y, emulate(xq, xs, wq, ws), rtol=1e-5, atol=1e-4)
    # and within ~4% of float32 (two E4M3 roundings, each ~2.6% RMS on N(0, 1))
    ref = x @ w.t()
    err = ((y - ref).norm() / ref.norm()).item()
    assert err == pytest.approx(pinned, abs=2e-4) and err < 0.05


def test_fp8_linear_static_activation_scale():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 64, generator=g), torch.randn(24, 64, generator=g)
    for per_channel in (False, True):
        wq, ws = impl.scaled_fp8_quant(w, use_per_token_if_dynamic=per_channel)
        # a static scale of 1/448: every |x| > 1 is clamped to 448 * (1/448) = 1
        xs = torch.tensor([1 / 448])
        y = impl.fp8_linear(x, wq, ws, x_scale=xs)
        xq, _ = impl.scaled_fp8_quant(x, scale=xs)
        expect = emulate(xq, xs.expand(8), wq, ws)
        torch.testing.assert_close(y, emulate(xq, xs.expand(8), wq, ws), rtol=1e-5, atol=1e-4)
        # clamping made it far from the dynamic result
        assert (y - impl.fp8_linear(x, wq, ws)).abs().max() > 1.0
        assert expect.shape == (8, 24)


def test_scaled_mm_wants_a_transposed_weight_and_matching_scales():
    # the layouts torch 2.13's CPU _scaled_mm accepts, checked here so the lab states facts
    a = torch.ones(4, 8).to(F8)
    b = torch.ones(6, 8).to(F8)
    out = torch._scaled_mm(a, b.t(), scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0),
                           out_dtype=torch.float32)
    assert out.shape == (4, 6) and out[0, 0].item() == 8.0
    with pytest.raises((RuntimeError, ValueError)):  # b not transposed: [6, 8] @ ... fails
        torch._scaled_mm(a, b, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0),
                         out_dtype=torch.float32)
    with pytest.raises(ValueError, match="RowWise"):  # scale_b must be [1, N], not [N, 1]
        torch._scaled_mm(a, b.t(), scale_a=torch.ones(4, 1), scale_b=torch.ones(6, 1),
                         out_dtype=torch.float32)
    # fp8_linear handles both: per-channel weight scales arrive as [N, 1]
    wq, ws = impl.scaled_fp8_quant(torch.ones(6, 8) * torch.arange(1.0, 7.0).reshape(6, 1),
                                   use_per_token_if_dynamic=True)
    y = impl.fp8_linear(torch.ones(4, 8), wq, ws)
    torch.testing.assert_close(y, torch.arange(1.0, 7.0).expand(4, 6) * 8, rtol=0, atol=0)


# ---------------------------------------------------------------- E2M1 codes


def test_e2m1_table_matches_ml_dtypes():
    # the 16 codes as ml_dtypes' float4_e2m1fn reads them (code 8 is -0.0 there, 0.0 in ggml)
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(np.array(impl.E2M1_VALUES, np.float32), ref)
    # and the codes decoded by dequantize_mxfp4 with scale 1 (e = 127)
    codes = np.arange(32) % 16
    raw = np.concatenate([[127], codes[:16] | codes[16:] << 4]).astype(np.uint8)
    np.testing.assert_array_equal(impl.dequantize_mxfp4(raw), np.tile(ref, 2))


# ---------------------------------------------------------------- MXFP4


def test_mxfp4_block_by_hand():
    # amax 7 -> e = floor(log2 7) - 2 + 127 = 127, scale 1: E2M1 values map to their own codes.
    # Ties go to the smaller magnitude (0.25 -> 0, 2.5 -> 2, -5 -> -4); 0.9 -> 1 (nearest, not
    # toward zero); 1.25 -> 1 and 3.5 -> 3 (ties again); 7 is past 6 and clips to it;
    # -0.0 and -0.1 are code 0, never code 8.
    w = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, -0.0,
                  0.25, 2.5, -5, 0.9, 5.9, -0.1, 1.25, 3.5, 7] + [0.0] * 7, np.float32)
    raw = impl.quantize_mxfp4(w)
    assert raw.dtype == np.uint8 and raw.shape == (17,)
    assert raw[0] == 127
    codes = np.concatenate([raw[1:] & 0xF, raw[1:] >> 4])
    assert codes.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 0,
                              0, 4, 14, 2, 7, 0, 2, 5, 7] + [0] * 7
    # byte 0 pairs weight 0 (low) with weight 16 (high); byte 1 weights 1 and 17: 0x41
    assert raw[1] == 0x00 and raw[2] == 0x41


def test_mxfp4_exponent_comes_from_float32_log2():
    # e = floor(log2(amax)) - 2 + 127, log2 in float32 like gguf-py: just below 16 the float32
    # log2 rounds up to 4.0, so 15.999999 gets e = 129 (an exact log2 would give 128)
    below16 = np.nextafter(np.float32(16), np.float32(0))
    cases = [(6.0, 127), (4.0, 127), (3.99, 126), (8.0, 128), (16.0, 129), (below16, 129),
             (0.01, 118), (1.0, 125)]
    for amax, e in cases:
        w = np.zeros(32, np.float32)
        w[5] = -amax
        assert impl.quantize_mxfp4(w)[0] == e, amax
    # an all-zero block: e = 0 and all codes 0
    assert impl.quantize_mxfp4(np.zeros(32)).tolist() == [0] * 17


def test_mxfp4_is_bit_exact_with_gguf():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 256)).astype(np.float32) * np.geomspace(1e-4, 300, 8)[:, None]
    w[0] = 0.0
    w[1, :32] = np.nextafter(np.float32(16), np.float32(0))
    w[2, 32:64] = rng.integers(-12, 13, 32) * 0.25  # many exact ties
    raw = impl.quantize_mxfp4(w)
    expect = gguf.quants.quantize(w, MX)
    # 17 bytes per 32 weights: 8 blocks per row = 136 bytes = 4.25 bits per weight
    assert raw.shape == (8, 136) == expect.shape
    assert raw.size * 8 / w.size == 4.25
    np.testing.assert_array_equal(raw, expect)
    back = impl.dequantize_mxfp4(raw)
    assert back.dtype == np.float32 and back.shape == w.shape
    np.testing.assert_array_equal(back.view(np.uint32), gguf.quants.dequantize(expect, MX).view(np.uint32))
    # nearest-value rounding: up to 6 scale units the widest gap is 4 -> 6, so the error is at
    # most 1 unit; above 6 (amax reaches up to 8 units) values clip to 6: under 2 units
    scale = np.exp2(raw[:, ::17].astype(np.float64) - 127).repeat(32, axis=1)
    err, inside = np.abs(back - w), np.abs(w) <= 6 * scale
    assert (err[inside] <= scale[inside]).all() and (err < 2 * scale).all()
    assert (err[~inside] > scale[~inside]).any()  # the clipped top does happen


def test_mxfp4_dequantizes_random_bytes_like_gguf():
    rng = np.random.default_rng(6)
    raw = rng.integers(0, 256, (3, 17 * 4)).astype(np.uint8)
    raw[:, ::17] = rng.integers(0, 255, (3, 4))  # any E8M0 byte but 0xFF (NaN)
    out = impl.dequantize_mxfp4(raw)
    assert out.shape == (3, 128)
    np.testing.assert_array_equal(out.view(np.uint32), gguf.quants.dequantize(raw, MX).view(np.uint32))


# ---------------------------------------------------------------- NVFP4


def test_nvfp4_block_by_hand():
    # scales: 0x38 = 2^(7 - 7) = 1.0; 0x44 = 1.5 * 2 = 3.0; 0x01 = 2^-9 (subnormal); 0x7F = 0
    codes = np.arange(64) % 16
    raw = nvfp4_block([0x38, 0x44, 0x01, 0x7F], codes)
    assert raw.shape == (36,) and raw[4] == 0x80  # weight 0 (code 0) low, weight 8 (code 8) high
    out = impl.dequantize_nvfp4(raw)
    assert out.dtype == np.float32 and out.shape == (64,)
    table = np.array(impl.E2M1_VALUES, np.float32)
    expect = np.concatenate([table * 1.0, table * 3.0, table * 2.0 ** -9, table * 0.0])
    np.testing.assert_array_equal(out, expect)


def test_nvfp4_scale_bytes_are_unsigned_e4m3():
    # code 2 (value 1.0) everywhere; sub-block scale byte b: the weight is b read as E4M3
    bytes_ = np.arange(128, dtype=np.uint8)
    bytes_[127] = 0  # 0..0x7E: every finite non-negative E4M3, padded to 32 blocks of 4
    blocks = np.stack([nvfp4_block(bytes_[i:i + 4], [2] * 64) for i in range(0, 128, 4)])
    out = impl.dequantize_nvfp4(blocks)[:, ::16].ravel()[:127]
    np.testing.assert_array_equal(out, bytes_[:127].view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    assert out[0x7E] == 448.0


def test_nvfp4_is_bit_exact_with_gguf():
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (5, 36 * 3)).astype(np.uint8)
    raw.reshape(-1, 36)[:, :4] &= 0x7F  # scale bytes: unsigned
    out = impl.dequantize_nvfp4(raw)
    # 36 bytes per 64 weights: 4.5 bits per weight
    assert out.shape == (5, 192) and raw.size * 8 / out.size == 4.5
    np.testing.assert_array_equal(out.view(np.uint32), gguf.quants.dequantize(raw, NV).view(np.uint32))


def test_nvfp4_global_scale_is_applied_once():
    # NVIDIA's checkpoints add one float32 per tensor (ModelOpt's weight_scale_2, typically
    # amax / (6 * 448)); ggml's block has no field for it. 4.5 bits per weight + 32 per tensor.
    rng = np.random.default_rng(8)
    raw = rng.integers(0, 256, (4, 72)).astype(np.uint8)
    raw.reshape(-1, 36)[:, :4] &= 0x7F
    g = np.float32(3.7 / 2688)
    out = impl.dequantize_nvfp4(raw, global_scale=g)
    plain = gguf.quants.dequantize(raw, NV)
    # vLLM's emulation: the two scales multiply first, then the E2M1 value, all float32
    blocks = raw.reshape(-1, 36)
    scale = blocks[:, :4].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scale = np.where(blocks[:, :4] == 0x7F, np.float32(0), scale) * g
    codes = np.concatenate([blocks[:, 4:].reshape(-1, 4, 8) & 0xF, blocks[:, 4:].reshape(-1, 4, 8) >> 4], -1)
    expect = (np.array(impl.E2M1_VALUES, np.float32)[codes] * scale[:, :, None]).reshape(4, 128)
    np.testing.assert_array_equal(out, expect)
    np.testing.assert_allclose(out, plain * g, rtol=2e-7, atol=0)
    assert (raw.size * 8 + 32) / out.size == 4.5 + 32 / 512


# ---------------------------------------------------------------- bad input


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="x must be a 2-D float tensor"):
        impl.scaled_fp8_quant(torch.ones(4))
    with pytest.raises(ValueError, match="x must be a 2-D float tensor"):
        impl.scaled_fp8_quant(np.ones((2, 2)))
    with pytest.raises(ValueError, match="scale must be one finite float32 value > 0"):
        impl.scaled_fp8_quant(torch.ones(2, 2), scale=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="scale must be one finite float32 value > 0"):
        impl.scaled_fp8_quant(torch.ones(2, 2), scale=torch.tensor(0.0))
    wq, ws = impl.scaled_fp8_quant(torch.ones(3, 4))
    with pytest.raises(ValueError, match="w_fp8 must be float8_e4m3fn"):
        impl.fp8_linear(torch.ones(2, 4), torch.ones(3, 4), ws)
    with pytest.raises(ValueError, match="w_fp8 must be float8_e4m3fn"):
        impl.fp8_linear(torch.ones(2, 5), wq, ws)
    with pytest.raises(ValueError, match="w_scale must hold 1 or N = 3 values"):
        impl.fp8_linear(torch.ones(2, 4), wq, torch.ones(2))
    with pytest.raises(ValueError, match="W: the last axis must be a positive multiple of 32"):
        impl.quantize_mxfp4(np.ones((2, 48)))
    with pytest.raises(ValueError, match="W must be finite"):
        impl.quantize_mxfp4(np.full(32, np.nan))
    with pytest.raises(ValueError, match="raw must be uint8"):
        impl.dequantize_mxfp4(np.zeros(34, np.int8))
    with pytest.raises(ValueError, match="raw must be uint8"):
        impl.dequantize_mxfp4(np.zeros(18, np.uint8))
    with pytest.raises(ValueError, match="W: the last axis must be a positive multiple of 32"):
        impl.quantize_mxfp4(np.zeros((2, 0)))
    nan_e = np.zeros(17, np.uint8)
    nan_e[0] = 0xFF  # the exponent byte is NaN; a code byte of 0xFF is just two codes 15
    with pytest.raises(ValueError, match="raw: E8M0 byte 0xFF"):
        impl.dequantize_mxfp4(nan_e)
    out = impl.dequantize_mxfp4(nan_e[::-1].copy())  # e = 0, last byte 0xFF: weights 15 and 31
    assert out[15] == out[31] == np.float32(-6.0 * 2.0 ** -127) and not out[:15].any()
    for bad in (np.zeros((2, 0), np.uint8),):
        with pytest.raises(ValueError, match="raw must be uint8"):
            impl.dequantize_mxfp4(bad)
        with pytest.raises(ValueError, match="raw must be uint8"):
            impl.dequantize_nvfp4(bad)
    with pytest.raises(ValueError, match="raw must be uint8"):
        impl.dequantize_nvfp4(np.zeros(64, np.uint8))
    with pytest.raises(ValueError, match="raw: an NVFP4 scale byte has bit 7 set"):
        impl.dequantize_nvfp4(nvfp4_block([0x80, 0, 0, 0], [0] * 64))
    with pytest.raises(ValueError, match="global_scale must be a finite value > 0"):
        impl.dequantize_nvfp4(np.zeros(36, np.uint8), global_scale=-1.0)
    with pytest.raises(ValueError, match="global_scale must be a finite value > 0"):
        impl.dequantize_nvfp4(np.zeros(36, np.uint8), global_scale=0.0)
