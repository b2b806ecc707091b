"""Every worked number in Phase 06's guide and deep-dive, recomputed.

The pages quote these values; if one of them changes here, the text is wrong. Numbers that rest
on an assumption (a bandwidth, a peak rate) take it from the ASSUMPTIONS block below, which the
guide states in the same words. Model shapes are the published ``config.json`` values. Numbers
measured by a lab (the 30.0x outlier ratio, the 2.05x SmoothQuant gain) are asserted by that
lab's tests, not here. Pure Python plus ``ml_dtypes``; well under a second. The tests that read
``upstream/`` skip when it is absent.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM

# -- ASSUMPTIONS (labelled as such in the guide, section 1) ----------------------------------
HBM_BYTES_PER_S = 3.35e12       # H100 SXM datasheet peak
BF16_FLOPS = 989e12             # H100 SXM dense bf16 datasheet peak
FP8_FLOPS = 1979e12             # H100 SXM dense FP8 datasheet peak


def projection_params(layers, hidden, inter, kv_heads, head_dim, heads, **_):
    """Weights of the seven projections of every layer (q, k, v, o, gate, up, down)."""
    per_layer = (hidden * heads * head_dim * 2          # q and o
                 + 2 * hidden * kv_heads * head_dim     # k and v
                 + 3 * hidden * inter)                  # gate, up, down
    return layers * per_layer


# Published configs (config.json on the Hugging Face Hub).
QWEN_05B = dict(layers=24, hidden=896, inter=4864, vocab=151936, kv_heads=2, head_dim=64,
                heads=14, tied=True)
LLAMA_8B = dict(layers=32, hidden=4096, inter=14336, vocab=128256, kv_heads=8, head_dim=128,
                heads=32, tied=False)


def kv_bytes_per_token(m, elem_bytes=2):
    return m["layers"] * 2 * m["kv_heads"] * m["head_dim"] * elem_bytes


def bits_per_weight(group, scale_bits=16, zero_bits=0, code_bits=4):
    return code_bits + (scale_bits + zero_bits) / group


# -- guide, section 1: bytes per decode step ---------------------------------------------------

def test_guide_s1_llama_8b_bytes_per_step():
    lin = projection_params(**LLAMA_8B)
    head = LLAMA_8B["vocab"] * LLAMA_8B["hidden"]
    assert lin == 6_979_321_856 and head == 525_336_576
    bf16 = 2 * lin + 2 * head
    fp8 = 1 * lin + 2 * head
    int4 = lin * bits_per_weight(128) / 8 + 2 * head
    assert round(bf16 / 1e9, 2) == 15.01
    assert round(fp8 / 1e9, 2) == 8.03
    assert round(int4 / 1e9, 2) == 4.65
    assert round(2 * head / 1e9, 2) == 1.05
    ms = [round(b / HBM_BYTES_PER_S * 1e3, 2) for b in (bf16, fp8, int4)]
    assert ms == [4.48, 2.40, 1.39]
    assert [round(HBM_BYTES_PER_S / b) for b in (bf16, fp8, int4)] == [223, 417, 721]
    assert round(bf16 / int4, 1) == 3.2            # "not four times"
    assert round(bits_per_weight(128) / 8, 3) == 0.516


def test_guide_s1_s4_ridge_points():
    assert round(BF16_FLOPS / HBM_BYTES_PER_S) == 295     # bf16: intensity = batch
    assert round(BF16_FLOPS / HBM_BYTES_PER_S / 4) == 74   # 4-bit weights: 4x the work per byte
    assert 2000 > 295                                     # a 2,000-token prefill is compute-bound
    assert FP8_FLOPS / BF16_FLOPS == pytest.approx(2.0, abs=0.01)


# -- guide, section 3: the bill for scales -----------------------------------------------------

def test_guide_s3_bits_per_weight_table():
    assert bits_per_weight(128) == 4.125
    assert bits_per_weight(128, zero_bits=4) == 4.15625
    assert bits_per_weight(32) == 4.5
    assert bits_per_weight(16) == 5.0
    assert bits_per_weight(32, scale_bits=16, zero_bits=16) == 5.0    # Q4_1: fp16 d and m
    assert round(bits_per_weight(4096), 3) == 4.004
    # overhead as a share of the 4-bit payload (an older claim, corrected: see ERRATA)
    assert (bits_per_weight(128) - 4) / 4 == 0.03125                 # 3.1%
    assert round((bits_per_weight(128, zero_bits=4) - 4) / 4, 3) == 0.039
    assert (bits_per_weight(32) - 4) / 4 == 0.125
    assert (bits_per_weight(16) - 4) / 4 == 0.25                     # 25%
    assert round((bits_per_weight(4096) - 4) / 4 * 100, 1) == 0.1
    # in bytes, as the corrected figures are often quoted: 0.0156 B/weight and 0.125 B/weight
    assert round(16 / 128 / 8, 4) == 0.0156 and 16 / 16 / 8 == 0.125
    # group 16 stores 8x the scales of group 128
    assert (4096 // 16) / (4096 // 128) == 8


def test_guide_s3_smollm2_group_sizes():
    hidden = 576
    assert hidden == 2 ** 6 * 3 ** 2
    assert [g for g in (32, 64, 128, 192, 576) if hidden % g == 0] == [32, 64, 192, 576]


def test_guide_s14_check_yourself():
    assert bits_per_weight(64, zero_bits=4) == 4.3125
    assert round((bits_per_weight(64, zero_bits=4) - 4) / 4, 3) == 0.078
    assert (0x3A & 0xF, 0x3A >> 4) == (10, 3)
    tokens = 1.3e9 / (28 * 1024)
    assert round(tokens) == 45_340 and round(tokens / 16) == 2_834


# -- guide, section 6: float formats -----------------------------------------------------------

def test_guide_s6_fp8_limits_and_saturation():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    e4m3, e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    assert float(ml_dtypes.finfo(e4m3).max) == 448.0 == 1.75 * 2 ** 8
    assert float(ml_dtypes.finfo(e5m2).max) == 57344.0 == 1.75 * 2 ** 15
    assert float(ml_dtypes.finfo(e4m3).smallest_subnormal) == 2.0 ** -9
    assert float(ml_dtypes.finfo(e5m2).smallest_subnormal) == 2.0 ** -16
    cast = np.array([464.0, 470.0, 500.0], np.float32).astype(e4m3).astype(np.float32)
    assert cast[0] == 448.0 and np.isnan(cast[1]) and np.isnan(cast[2])   # ml_dtypes: NaN
    clamped = np.clip(np.float32([500.0]), -448, 448).astype(e4m3).astype(np.float32)
    assert clamped[0] == 448.0                                             # clamp first: safe


def test_guide_s6_microscaling_sizes():
    assert 32 * 4 + 8 == 136 and 136 / 8 == 17 and 136 / 32 == 4.25       # MXFP4
    assert 4 + 8 / 16 == 4.5 and 64 * 4.5 / 8 == 36                        # NVFP4, 64 in 36 B
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert len(e2m1) == 2 ** 3                                             # 3 magnitude bits


# -- guide, section 10 and 11: KV capacity -----------------------------------------------------

def test_guide_s10_s11_qwen_kv_capacity():
    m = QWEN_05B
    kv = kv_bytes_per_token(m)
    assert kv == 12_288 and kv_bytes_per_token(m, 1) == 6_144
    assert 16 * kv == 196_608
    lin = projection_params(**m)
    assert lin // m["layers"] == 14_909_440 and lin == 357_826_560
    assert m["vocab"] * m["hidden"] == 136_134_656
    assert 2 * (lin + m["vocab"] * m["hidden"]) == 987_922_432          # 0.99 GB in bf16
    # online FP8: one byte saved per projection weight
    assert lin / kv == 29_120 and lin / kv / 16 == 1_820
    # AWQ 4-bit, group 128, fp16 scale + 4-bit zero
    awq = lin * bits_per_weight(128, zero_bits=4) / 8
    assert awq == 185_902_080
    freed = 2 * lin - awq
    assert freed == 529_751_040
    assert math.floor(freed / kv) == 43_111 and math.floor(freed / kv / 16) == 2_694


def test_guide_s11_seed_blocks_are_impossible():
    kv = kv_bytes_per_token(QWEN_05B)
    extra_blocks = 21_300 - 12_140
    assert extra_blocks == 9_160
    needed = extra_blocks * 16 * kv
    assert round(needed / 1e9, 2) == 1.80
    whole_model = 2 * (projection_params(**QWEN_05B) + 151_936 * 896)
    assert needed > whole_model                                   # more than the model weighs
    assert round(21_300 / 12_140 - 1, 2) == 0.75                  # the older claim, "+75%"
    assert round(1_820 / 12_140, 2) == 0.15 and round(2_694 / 12_140, 2) == 0.22
    assert 70e9 * 2 / 1e9 == 140                                  # 70B in bf16 > 80 GB


# -- pin checks --------------------------------------------------------------------------------

@pytest.mark.upstream
def test_registry_and_shorthands_at_the_pin():
    text = (UPSTREAM / "vllm/model_executor/layers/quantization/__init__.py").read_text()
    literal = text[text.index("QuantizationMethods = Literal["):text.index("QUANTIZATION_METHODS:")]
    names = re.findall(r'^\s+"([\w-]+)",', literal, re.MULTILINE)
    assert len(names) == 30 and "gguf" in names and "fp8_per_tensor" in names
    for alias in ('"gptq": AutoGPTQConfig', '"gptq_marlin": AutoGPTQConfig',
                  '"auto_gptq": AutoGPTQConfig'):
        assert alias in text


@pytest.mark.upstream
def test_kernel_thresholds_at_the_pin():
    gguf = (UPSTREAM / "vllm/model_executor/layers/quantization/gguf.py").read_text()
    assert "mmvq_safe = 2 if qweight.shape[0] > 5120 else 6" in gguf
    awq = (UPSTREAM / "vllm/model_executor/layers/quantization/awq.py").read_text()
    assert "x.shape[:-1].numel() >= 256" in awq
    qu = (UPSTREAM / "vllm/model_executor/layers/quantization/utils/quant_utils.py").read_text()
    assert "numpy.array([0, 2, 4, 6, 1, 3, 5, 7])" in qu


# -- deep-dive -----------------------------------------------------------------------------------

def test_deep_dive_s10_gguf_tensor_bytes():
    weights = 576 * 576                          # SmolLM2's attn_q
    assert weights == 331_776
    assert weights // 32 * 20 == 207_360        # Q4_1: 20 bytes per block of 32
    assert weights // 32 * 34 == 352_512        # Q8_0: 34 bytes per block of 32
    assert weights // 32 * 18 * 8 / weights == 4.5   # Q4_0, for comparison


def test_deep_dive_s6_s8_constants():
    assert 32 // 4 == 8                                   # AWQ pack factor for 4 bits
    assert 1.0 / (448.0 * 512.0) == pytest.approx(4.36e-6, rel=1e-3)   # _FP8_MIN_SCALING_FACTOR
    assert 26 + 4 == 30                                   # method names + online shorthands
    # AWQ's shapes for a 4096 x 4096 layer with group 128 (reading checklist)
    k, n, g = 4096, 4096, 128
    assert (k, n // 8) == (4096, 512) and (k // g, n // 8) == (32, 512) and (k // g, n) == (32, 4096)
    # the inverse of AWQ's interleave is the "reverse AWQ order" of awq_triton.py
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    assert [order.index(c) for c in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]
