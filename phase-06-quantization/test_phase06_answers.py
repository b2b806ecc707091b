"""Every number in Phase 06's exercises, interview answers and cheatsheet, recomputed.

The pages quote these values; if one changes here, the text is wrong. Numbers that rest on an
assumption (a bandwidth, a peak FLOP rate) take it from the ASSUMPTIONS block, which the pages
state in the same words. Model shapes come from each model's published config.json; SmolLM2's
matches the GGUF file the course ships (lab 06 reads it). numpy and ml_dtypes only (gguf-py for
one block); the ``upstream`` test reads the pinned vLLM source. The build
exercise's answer (an int4 config with a skip list) runs against mini_vllm's quantization
interface and is skipped until that package exists.
"""

from __future__ import annotations

import ast
import re

import ml_dtypes
import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM
Q = "vllm/model_executor/layers/quantization"

# -- ASSUMPTIONS (stated as such where the pages use them) -----------------------------------
HBM_BYTES_PER_S = 3.35e12      # H100 SXM datasheet peak bandwidth
BF16_FLOPS = 989e12            # H100 SXM dense bf16 datasheet peak
BLOCK = 16                     # vLLM's default KV block size, in tokens

# -- Published configs (config.json on the Hugging Face Hub) ----------------------------------
QWEN_05B = dict(layers=24, hidden=896, inter=4864, vocab=151936, heads=14, kv_heads=2,
                head_dim=64, tied=True)
SMOLLM2 = dict(layers=30, hidden=576, inter=1536, vocab=49152, heads=9, kv_heads=3,
               head_dim=64, tied=True)   # also the header of the shipped GGUF file (lab 06)


def linear_params(m):
    """Parameters of the linear layers that quantization touches (q, k, v, o, gate, up, down)."""
    q_o = 2 * m["hidden"] * m["heads"] * m["head_dim"]
    k_v = 2 * m["hidden"] * m["kv_heads"] * m["head_dim"]
    mlp = 3 * m["hidden"] * m["inter"]
    return m["layers"] * (q_o + k_v + mlp)


def embedding_params(m):
    return m["vocab"] * m["hidden"] * (1 if m["tied"] else 2)


def kv_bytes_per_token(m, dtype_bytes):
    return m["layers"] * 2 * m["kv_heads"] * m["head_dim"] * dtype_bytes


# -- bits per weight ----------------------------------------------------------------------------

def bits(weight_bits, block, per_block_bits):
    return weight_bits + per_block_bits / block


def test_bits_per_weight_table():
    assert bits(8, 32, 16) == 8.5             # Q8_0: 32 int8 + fp16 d = 34 bytes
    assert bits(4, 32, 16) == 4.5             # Q4_0: 16 bytes + fp16 d = 18 bytes
    assert bits(4, 32, 32) == 5.0             # Q4_1: + fp16 m = 20 bytes
    assert bits(4, 32, 8) == 4.25             # MXFP4: 16 bytes + one E8M0 byte = 17 bytes
    assert bits(4, 16, 8) == 4.5              # NVFP4: 8 bytes + one E4M3 byte per 16 (+32/tensor)
    assert bits(4, 128, 16) == 4.125          # GPTQ g128 symmetric, fp16 scale
    assert bits(4, 128, 20) == 4.15625        # AWQ g128, fp16 scale + 4-bit zero
    assert bits(4, 32, 16) == 4.5 and bits(4, 64, 16) == 4.25   # int4 g32, g64
    assert bits(4, 16, 16) == 5.0             # group 16: a whole extra bit
    # scale overhead as a share of the 4-bit payload (older course material's arithmetic, corrected)
    assert (16 / 128) / 4 == 0.03125 and (16 / 16) / 4 == 0.25
    # FP8 per-tensor on a 576 x 576 matrix: 8 + 32 / numel
    assert round(8 + 32 / (576 * 576), 6) == 8.000096
    # bytes for 32 weights in each GGUF block type
    assert [34, 18, 20, 17] == [int(bits(8, 32, 16) * 4), int(bits(4, 32, 16) * 4),
                                int(bits(4, 32, 32) * 4), int(bits(4, 32, 8) * 4)]


# -- KV capacity from freed weight bytes ----------------------------------------------------

def test_qwen_sizes_and_kv_per_token():
    assert kv_bytes_per_token(QWEN_05B, 2) == 12_288
    assert linear_params(QWEN_05B) == 357_826_560
    assert embedding_params(QWEN_05B) == 136_134_656
    assert linear_params(QWEN_05B) + embedding_params(QWEN_05B) == 493_961_216
    assert (linear_params(QWEN_05B) + embedding_params(QWEN_05B)) * 2 == 987_922_432


def test_fp8_weights_free_kv_for_29k_tokens():
    bytes_freed = linear_params(QWEN_05B) * (2 - 1)   # bf16 -> fp8, one byte per linear weight
    assert bytes_freed == 357_826_560
    assert bytes_freed % kv_bytes_per_token(QWEN_05B, 2) == 0     # 29,120 exactly, before scales
    freed = bytes_freed - 4 * 24 * 4                  # one fp32 scale per fused weight (4 x 24)
    assert freed == 357_826_176
    tokens = freed // kv_bytes_per_token(QWEN_05B, 2)
    assert round(freed / kv_bytes_per_token(QWEN_05B, 2), 2) == 29_119.97
    assert tokens == 29_119 and tokens // BLOCK == 1_819          # lab 02's calculator agrees


def test_awq_frees_more_but_not_double():
    per_weight = 4.15625 / 8                       # g128, fp16 scale, 4-bit zero
    freed = linear_params(QWEN_05B) * (2 - per_weight)
    assert freed == 529_751_040 and round(freed / 1e6, 1) == 529.8
    tokens = int(freed // kv_bytes_per_token(QWEN_05B, 2))
    assert tokens == 43_111 and tokens // BLOCK == 2_694


def test_seed_block_counts_are_impossible():
    fp16_blocks, fp8_blocks, awq_blocks = 12_140, 18_900, 21_300    # an older version's L4 capture
    block_bytes = BLOCK * kv_bytes_per_token(QWEN_05B, 2)
    assert block_bytes == 196_608                                   # 192 KiB per block
    all_weights = (linear_params(QWEN_05B) + embedding_params(QWEN_05B)) * 2
    need_fp8 = (fp8_blocks - fp16_blocks) * block_bytes
    need_awq = (awq_blocks - fp16_blocks) * block_bytes
    assert round(need_fp8 / 1e9, 2) == 1.33 and round(need_awq / 1e9, 2) == 1.80
    assert need_fp8 > all_weights and need_awq > all_weights         # more than the whole model
    assert round((fp8_blocks / fp16_blocks - 1) * 100) == 56
    assert round((awq_blocks / fp16_blocks - 1) * 100) == 75
    # what the freed bytes can buy on that pool, at most
    assert round(1_819 / fp16_blocks * 100) == 15 and round(2_694 / fp16_blocks * 100) == 22


def test_smollm2_kv_in_mini_vllm():
    assert kv_bytes_per_token(SMOLLM2, 4) == 46_080    # float32 pool
    assert kv_bytes_per_token(SMOLLM2, 1) == 11_520    # fp8 pool: a quarter
    assert linear_params(SMOLLM2) == 106_168_320
    assert embedding_params(SMOLLM2) == 28_311_552


LLAMA_70B_KV = dict(layers=80, kv_heads=8, head_dim=128)     # Llama-3-70B's published config


def test_70b_on_one_80gb_gpu():
    """EXERCISES item 15: 70e9 weights, gpu_memory_utilization 0.9, activations left out."""
    budget = 0.9 * 80e9
    kv16 = kv_bytes_per_token(LLAMA_70B_KV, 2)
    assert kv16 == 327_680
    bf16, fp8, w4 = 70e9 * 2, 70e9 * 1, 70e9 * 4.125 / 8
    assert bf16 > budget and fp8 == 70e9 and round(w4 / 1e9, 1) == 36.1
    assert int((budget - fp8) // kv16) == 6_103 and int((budget - fp8) // (kv16 / 2)) == 12_207
    assert int((budget - w4) // kv16) == 109_577 and int((budget - w4) // (kv16 / 2)) == 219_154


def test_tokens_per_mib_of_kv_pool():
    mib = 1024 * 1024
    assert round(mib / kv_bytes_per_token(SMOLLM2, 4), 1) == 22.8
    assert round(mib / kv_bytes_per_token(SMOLLM2, 1), 1) == 91.0


# -- group sizes on SmolLM2 ---------------------------------------------------------------------

def smollm2_layer_inputs():
    m = SMOLLM2
    return {"qkv_proj": m["hidden"], "o_proj": m["heads"] * m["head_dim"],
            "gate_up_proj": m["hidden"], "down_proj": m["inter"]}


def test_group_128_fits_only_down_proj():
    ins = smollm2_layer_inputs()
    assert ins == {"qkv_proj": 576, "o_proj": 576, "gate_up_proj": 576, "down_proj": 1536}
    assert [k for k, v in ins.items() if v % 128 == 0] == ["down_proj"]
    assert 576 == 2 ** 6 * 9
    assert [g for g in (16, 32, 64, 128, 192, 256, 576) if 576 % g == 0] == [16, 32, 64, 192, 576]
    down = SMOLLM2["hidden"] * SMOLLM2["inter"]
    per_layer = linear_params(SMOLLM2) // SMOLLM2["layers"]
    assert per_layer == 3_538_944 and down == 884_736 and down / per_layer == 0.25


def test_marlin_shape_rule_on_smollm2_and_qwen():
    # verify_marlin_supports_shape: out % 64, in % 128, in % group (when group < in)
    def marlin_ok(n_out, k_in, group):
        return n_out % 64 == 0 and k_in % 128 == 0 and (group >= k_in or k_in % group == 0)
    s = SMOLLM2
    smol = {"qkv_proj": (576 + 2 * 192, 576), "o_proj": (576, 576),
            "gate_up_proj": (2 * 1536, 576), "down_proj": (576, 1536)}
    assert {k: marlin_ok(n, k_in, 64) for k, (n, k_in) in smol.items()} == {
        "qkv_proj": False, "o_proj": False, "gate_up_proj": False, "down_proj": True}
    assert s["hidden"] % 64 == 0
    q = QWEN_05B
    qwen = {"qkv_proj": (896 + 2 * 128, 896), "o_proj": (896, 896),
            "gate_up_proj": (2 * 4864, 896), "down_proj": (896, 4864)}
    assert all(marlin_ok(n, k_in, 128) for n, k_in in qwen.values())
    assert (896 // 128, 4864 // 128, q["hidden"]) == (7, 38, 896)


# SmolLM2's shape is read from the GGUF header by lab 06 (test_config_matches_the_header);
# parsing the file here would cost seconds.


# -- packing by hand ------------------------------------------------------------------------------

PI = [3, 1, 4, 1, 5, 9, 2, 6]
E = [2, 7, 1, 8, 2, 8, 1, 8]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack8(nibbles):
    word = 0
    for i, v in enumerate(nibbles):
        word |= v << (4 * i)
    return word


def test_gptq_and_awq_words_by_hand():
    assert pack8(PI) == 0x62951413                               # GPTQ: nibble i = row i
    assert [PI[j] for j in AWQ_ORDER] == [3, 4, 5, 2, 1, 1, 9, 6]
    assert pack8([PI[j] for j in AWQ_ORDER]) == 0x69112543       # AWQ: nibble i = column ORDER[i]
    assert pack8(list(range(8))) == 0x76543210
    assert pack8([j for j in AWQ_ORDER]) == 0x75316420
    # a code >= 8 in nibble 7 makes the int32 negative
    w = pack8([0, 0, 0, 0, 0, 0, 0, 9])
    assert np.array([w], np.uint32).view(np.int32)[0] == -1879048192


def test_gguf_q4_block_bytes_by_hand():
    codes = PI + [0] * 8 + E + [15] * 8           # 32 codes: weights 0..15 then 16..31
    packed = [codes[j] | codes[j + 16] << 4 for j in range(16)]
    assert packed[:8] == [0x23, 0x71, 0x14, 0x81, 0x25, 0x89, 0x12, 0x86]
    assert packed[8:] == [0xF0] * 8
    even_odd = [codes[2 * j] | codes[2 * j + 1] << 4 for j in range(16)]
    assert even_odd[:4] == [0x13, 0x14, 0x95, 0x62]       # the textbook layout: different bytes


def test_gguf_q4_block_against_gguf_py():
    gguf = pytest.importorskip("gguf")
    # a Q4_1 block whose min is 0 and step 1: weights equal to their codes
    codes = np.array(PI + [0] * 8 + E + [15] * 8, np.float32)
    raw = gguf.quants.quantize(codes[None, :], gguf.GGMLQuantizationType.Q4_1)
    body = raw.reshape(-1)[4:]
    assert list(body[:8]) == [0x23, 0x71, 0x14, 0x81, 0x25, 0x89, 0x12, 0x86]


# -- FP8 E4M3 -------------------------------------------------------------------------------------

def test_e4m3_grid_near_448():
    f8 = ml_dtypes.float8_e4m3fn
    assert float(ml_dtypes.finfo(f8).max) == 448.0
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max) == 57344.0
    vals = np.arange(256, dtype=np.uint8).view(f8).astype(np.float32)
    top = sorted({float(v) for v in vals if np.isfinite(v) and v >= 256})
    assert top == [256, 288, 320, 352, 384, 416, 448]
    assert 448 == 1.75 * 2 ** 8
    below = sorted({float(v) for v in vals if np.isfinite(v) and 128 <= v < 256})
    assert below[:2] == [128, 144] and below[-1] == 240


def test_e4m3_casts_of_500_and_neighbours():
    f8 = ml_dtypes.float8_e4m3fn
    cast = np.array([500, 465, 464, 449, 440, 432, 430], np.float32).astype(f8).astype(np.float32)
    assert np.isnan(cast[0]) and np.isnan(cast[1])                # ml_dtypes: out of range is NaN
    assert list(cast[2:]) == [448, 448, 448, 448, 416]            # 464 and 432 are ties: to even
    clamped = np.clip(np.float32(500), -448, 448).astype(f8).astype(np.float32)
    assert clamped == 448                                         # what vLLM's clamp gives


# torch's CPU cast saturating 500 to 448 is measured by lab 05 (test_500_becomes_448_never_nan),
# which imports torch anyway; this file stays torch-free to stay fast.


def test_fp8_scaled_value_of_500():
    # per-tensor dynamic scale over a tensor whose max is 500: scale = 500/448
    scale = np.float32(500) / np.float32(448)
    q = np.clip(np.float32(500) / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert float(q) == 448.0 and float(q.astype(np.float32) * scale) == pytest.approx(500, rel=1e-6)


# -- SmoothQuant on two channels ------------------------------------------------------------------

def test_smoothquant_two_channels():
    X = np.array([[16.0, 1.0], [-8.0, -0.5]])
    W = np.array([[1.0, 4.0], [-0.5, 2.0]])             # [out, in]
    a = np.abs(X).max(axis=0)
    w = np.abs(W).max(axis=0)
    assert list(a) == [16, 1] and list(w) == [1, 4]
    s = a ** 0.5 / w ** 0.5
    assert list(s) == [4.0, 0.5]
    Xs, Ws = X / s, W * s
    assert list(np.abs(Xs).max(axis=0)) == [4, 2] == list(np.abs(Ws).max(axis=0))
    assert list(np.sqrt(a * w)) == [4, 2]
    np.testing.assert_allclose(Xs @ Ws.T, X @ W.T, rtol=0, atol=1e-12)
    # channel 1's largest value in int8 steps of a per-tensor scale: 7.9 -> 63.5
    assert round(127 / 16 * 1, 2) == 7.94 and 127 / 4 * 2 == 63.5
    # alpha = 1 flattens the activations completely
    s1 = a / 1.0
    assert list(np.abs(X / s1).max(axis=0)) == [1, 1]


# -- decode arithmetic intensity -----------------------------------------------------------------

def test_w4a16_intensity_and_ridge():
    ridge = BF16_FLOPS / HBM_BYTES_PER_S
    assert round(ridge) == 295
    bytes16, bytes4 = 2.0, 4.125 / 8               # per weight: bf16, int4 g128 + fp16 scale
    # flops per weight byte at batch B: 2B / bytes_per_weight
    assert 2 / bytes16 == 1.0 and round(2 / bytes4, 2) == 3.88
    b4 = ridge / (2 / bytes4)
    assert round(b4, 1) == 76.1
    assert round(bytes16 / bytes4, 2) == 3.88      # best-case decode speed-up (bytes only)
    # Qwen2.5-0.5B's linear weights, one decode step at batch 1, at the HBM floor
    t16 = linear_params(QWEN_05B) * bytes16 / HBM_BYTES_PER_S * 1e6
    t4 = linear_params(QWEN_05B) * bytes4 / HBM_BYTES_PER_S * 1e6
    assert (round(t16), round(t4)) == (214, 55)


# -- the build exercise: an int4 config with a skip list ------------------------------------------

def _int4_answer():
    """The answer of EXERCISES item 13, the same code (the decorator applied by hand)."""
    quant = pytest.importorskip("mini_vllm.quantization")
    from mini_vllm.quantization import (
        Int4GroupLinearMethod,
        QuantizationConfig,
        register_quantization_config,
    )

    class Int4SkipConfig(QuantizationConfig):
        """int4 groups everywhere except the layers named in ``skip``."""

        def __init__(self, group_size=32, skip=(), fallback=False):
            self.group_size = group_size
            self.skip = tuple(skip)
            self.fallback = fallback

        def get_name(self):
            return "int4-skip"

        @classmethod
        def from_config(cls, config):
            unknown = set(config) - {"group_size", "skip", "fallback"}
            if unknown:
                raise ValueError(f"quantization_config: unknown keys {sorted(unknown)}")
            return cls(**config)

        def is_skipped(self, prefix):
            # a name skips itself and everything under it: "model.layers.1" covers
            # "model.layers.1.mlp.down_proj" but not "model.layers.10.mlp.down_proj"
            return any(prefix == s or prefix.startswith(s + ".") for s in self.skip)

        def get_quant_method(self, layer, prefix):
            if self.is_skipped(prefix):
                return quant.UnquantizedLinearMethod()  # None is an error, as upstream's LinearBase
            if layer.input_size % self.group_size:
                if self.fallback:
                    return quant.UnquantizedLinearMethod()
                raise ValueError(f"{prefix}: input_size {layer.input_size} is not divisible "
                                 f"by group_size {self.group_size}")
            return Int4GroupLinearMethod(self.group_size)

    register_quantization_config("int4-skip")(Int4SkipConfig)
    return quant, Int4SkipConfig


def _build(quant, config, in_f, out_f, prefix, rng):
    layer = quant.LinearLayer(in_f, out_f, prefix)
    method = config.get_quant_method(layer, prefix)
    layer.quant_method = method
    method.create_weights(layer, in_f, out_f)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32)
    layer.weight = w
    method.process_weights_after_loading(layer)
    return layer, w


def test_build_int4_skip_config():
    quant, Int4SkipConfig = _int4_answer()
    cfg = Int4SkipConfig.from_config({"group_size": 32, "skip": ["model.layers.1"]})
    rng = np.random.default_rng(0)
    layer, w = _build(quant, cfg, 576, 576, "model.layers.0.self_attn.o_proj", rng)
    assert layer.weight_bytes() == 186_624 == 576 * 576 // 2 + (576 // 32) * 576 * 2
    assert round(576 * 576 * 4 / layer.weight_bytes(), 2) == 7.11
    x = rng.standard_normal((4, 576)).astype(np.float32)
    ref = x @ w.T
    err = np.linalg.norm(layer(x) - ref) / np.linalg.norm(ref)
    assert 0.08 < err < 0.13                            # 4-bit, group 32, N(0,1) weights
    skipped, _ = _build(quant, cfg, 576, 576, "model.layers.1.mlp.down_proj", rng)
    assert isinstance(skipped.quant_method, quant.UnquantizedLinearMethod)
    kept, _ = _build(quant, cfg, 576, 64, "model.layers.10.mlp.down_proj", rng)
    assert not isinstance(kept.quant_method, quant.UnquantizedLinearMethod)   # "1" is not "10"
    with pytest.raises(ValueError, match="group_size 128"):
        _build(quant, Int4SkipConfig(128), 576, 64, "model.layers.0.mlp.gate_up_proj", rng)
    with pytest.raises(ValueError, match="unknown keys"):
        Int4SkipConfig.from_config({"groupsize": 32})


def test_build_in_the_engine_on_tiny_random():
    quant, _ = _int4_answer()
    engine_mod = pytest.importorskip("mini_vllm.engine")
    # tiny-random: 2 layers, hidden 64, intermediate 128; qkv 64->128, o 64->64,
    # gate_up 64->256, down 128->64: 36,864 linear weights per layer
    per_layer = 64 * 128 + 64 * 64 + 64 * 256 + 128 * 64
    assert per_layer == 36_864 and per_layer * 2 * 4 == 294_912          # float32 bytes
    scales = (64 // 32) * (128 + 64 + 256) * 2 + (128 // 32) * 64 * 2     # fp16, per layer
    assert scales == 2_304
    int4 = 2 * (per_layer // 2 + scales)
    assert int4 == 41_472
    down_f32, down_int4 = 128 * 64 * 4, 128 * 64 // 2 + (128 // 32) * 64 * 2
    skipped_one = int4 - down_int4 + down_f32
    assert skipped_one == 69_632
    only_down = 2 * ((64 * 128 + 64 * 64 + 64 * 256) * 4 + 128 * 64 // 2 + 64 * 2)
    assert only_down == 237_824

    def bytes_of(**kw):
        eng = engine_mod.LLMEngine("tiny-random", quantization="int4-skip", quantization_config=kw)
        return eng.model.linear_weight_bytes()

    assert engine_mod.LLMEngine("tiny-random").model.linear_weight_bytes() == 294_912
    assert bytes_of(group_size=32) == 41_472
    assert bytes_of(group_size=32, skip=["model.layers.1.mlp.down_proj"]) == 69_632
    assert bytes_of(group_size=128, fallback=True) == 237_824
    with pytest.raises(ValueError, match="not divisible by group_size 128"):
        bytes_of(group_size=128)


def test_build_whole_model_bytes_with_down_proj_skipped():
    s = SMOLLM2
    down = s["hidden"] * s["inter"]
    rest = linear_params(s) // s["layers"] - down
    assert rest * 4.5 / 8 == 1_492_992
    per_layer = rest * 4.5 / 8 + down * 4
    assert per_layer * s["layers"] == 150_958_080
    assert linear_params(s) * 4 == 424_673_280
    assert linear_params(s) * 4.5 / 8 == 59_719_680
    # group 128 with fallback: only down_proj is int4 (4.125 bits), the rest float32
    assert (rest * 4 + down * 4.125 / 8) * s["layers"] == 332_190_720


# -- upstream facts the answers lean on -----------------------------------------------------------

@pytest.mark.upstream
def test_registry_and_override_facts_at_the_pin():
    init = (UPSTREAM / Q / "__init__.py").read_text(encoding="utf-8")
    assert '"awq": AWQConfig,' in init and '"awq_marlin": AWQMarlinConfig,' in init
    assert '"gptq_marlin": AutoGPTQConfig,' in init
    tree = ast.parse(init)
    literal = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "QuantizationMethods")
    names = [e.value for e in literal.value.slice.elts]
    assert {"gptq", "awq_marlin", "mxfp4", "gpt_oss_mxfp4", "modelopt_fp4", "online",
            "cpu_awq", "gguf", "fp8"} <= set(names)
    marlin = (UPSTREAM / Q / "utils/marlin_utils.py").read_text(encoding="utf-8")
    assert "MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]" in marlin
    assert "GPTQ_MARLIN_MIN_THREAD_N = 64" in marlin and "GPTQ_MARLIN_MIN_THREAD_K = 128" in marlin
    assert "if device_capability < 75:" in marlin
    awq = (UPSTREAM / Q / "awq.py").read_text(encoding="utf-8")
    assert "FP16_MATMUL_HEURISTIC_CONDITION = x.shape[:-1].numel() >= 256" in awq
    assert re.search(r"def get_supported_act_dtypes\(self\)[^\n]*\n\s+return \[torch.half\]", awq)
    awqm = (UPSTREAM / Q / "awq_marlin.py").read_text(encoding="utf-8")
    assert 'user_quant is None or user_quant == "marlin" or user_quant == "awq_marlin"' in awqm
    fp8m = (UPSTREAM / "vllm/model_executor/kernels/linear/scaled_mm/marlin.py").read_text(
        encoding="utf-8")
    assert "compute_capability >= 89" in fp8m
    kv = (UPSTREAM / Q / "kv_cache.py").read_text(encoding="utf-8")
    assert "Using KV cache scaling factor 1.0 for fp8_e4m3" in kv


# -- microscaling element grid (INTERVIEW Q7) ------------------------------------------------------

def test_e2m1_magnitudes():
    codes = np.arange(8, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)   # one code per byte
    assert list(vals) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert float(ml_dtypes.finfo(ml_dtypes.float4_e2m1fn).max) == 6.0
    assert (32 * 4 + 8) / 8 == 17 and (16 * 4 + 8) / 16 == 4.5
