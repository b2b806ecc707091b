"""Quantized linear layers and the FP8 KV cache (mini_vllm/quantization).

Four claims, each with numbers:

1. Off is the old path, bit for bit: ``quantization=None`` and the unquantized
   method compute exactly what the model computed before layers had methods.
2. Each method stores what it says (exact byte counts) and reproduces its
   format's arithmetic (codes, scales, packing, clamping).
3. Scheduling never changes a quantized model's output: chunked prefill,
   prefix caching and preemption give the same greedy tokens as one prompt alone.
4. On SmolLM2 the damage is what BENCHMARKS.md prints (KL, top-1), within
   tolerances, measured by the same functions.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.engine import LLMEngine
from mini_vllm.models import get_model
from mini_vllm.models.attention import paged_attention, write_kv
from mini_vllm.models.llama import apply_rope, rms_norm, silu
from mini_vllm.quantization import (
    QUANTIZATION_METHODS,
    Int4GroupConfig,
    LinearLayer,
    LinearMethodBase,
    QuantizationConfig,
    UnquantizedLinearMethod,
    get_quantization_config,
    make_quant_config,
    register_quantization_config,
)
from mini_vllm.quantization.fp8 import (
    FP8_E4M3_MAX,
    MIN_SCALE,
    quantize_fp8_per_tensor,
    quantize_fp8_per_token,
    to_fp8,
)
from mini_vllm.quantization.int4 import pack_rows, quantize_int4_groups, unpack_rows
from mini_vllm.quantization.int8 import quantize_int8_per_channel
from mini_vllm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SHARED = list(range(40, 61))  # 21 tokens several prompts share: prefix-cache hits
PROMPTS = [
    {"prompt_token_ids": SHARED + [1, 2, 3]},
    {"prompt_token_ids": [200]},
    {"prompt_token_ids": SHARED + [9]},
    {"prompt_token_ids": list(range(100, 137))},
]
METHODS = [("int8", None), ("int4", {"group_size": 32}), ("int4", {"group_size": 64}), ("fp8", None)]


def run(prompts=PROMPTS, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 128)
    engine = LLMEngine("tiny-random", **kw)
    return [list(r.output_token_ids) for r in engine.generate(prompts, GREEDY)], engine


# ------------------------------------------------------------------ off is the old path


def reference_forward(model, model_input):
    """The forward pass as it was before LinearLayer existed: ``h @ W`` on the [in, out] arrays."""
    c, w = model.config, model.weights
    t = model_input.num_tokens
    x = w.embed_tokens[model_input.token_ids]
    angles = model_input.positions.astype(np.float32)[:, None] * model.inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    for i, lw in enumerate(w.layers):
        qkv = rms_norm(x, lw.input_norm, c.rms_norm_eps) @ lw.qkv_proj
        q = qkv[:, :c.q_size].reshape(t, c.num_attention_heads, c.head_dim)
        k = qkv[:, c.q_size:c.q_size + c.kv_size].reshape(t, c.num_key_value_heads, c.head_dim)
        v = qkv[:, c.q_size + c.kv_size:].reshape(t, c.num_key_value_heads, c.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_cache, v_cache = model.kv_cache[i]
        write_kv(k_cache, v_cache, k, v, model_input.slot_mapping)
        attn = paged_attention(q, k_cache, v_cache, model_input, model.scale)
        x = x + attn.reshape(t, c.q_size) @ lw.o_proj
        gate_up = rms_norm(x, lw.post_norm, c.rms_norm_eps) @ lw.gate_up_proj
        act = silu(gate_up[:, :c.intermediate_size])
        act *= gate_up[:, c.intermediate_size:]
        x = x + act @ lw.down_proj
    return x


def test_unquantized_model_equals_the_old_forward_bit_for_bit():
    from mini_vllm.models.runner import Chunk, make_model_input

    model = get_model("tiny-random")
    assert model.quant_config is None
    assert all(type(layer.quant_method) is UnquantizedLinearMethod
               for lin in model.linears for layer in (lin.qkv_proj, lin.o_proj, lin.gate_up_proj, lin.down_proj))
    chunks = [Chunk(list(range(3, 40)), 0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), Chunk([7], 0, [11])]
    model_input = make_model_input(chunks, 4)
    model.init_kv_cache(16, 4)
    new = model.forward(model_input)
    model.init_kv_cache(16, 4)
    old = reference_forward(model, model_input)
    np.testing.assert_array_equal(new, old)
    # The unquantized method holds a view of the model's own array, not a copy.
    assert np.shares_memory(model.linears[0].qkv_proj.weight, model.weights.layers[0].qkv_proj)


def test_quantization_none_in_the_engine_is_the_default_engine():
    base, engine = run()
    assert engine.model.quant_config is None and engine.kv_cache_dtype == "auto"
    tokens, _ = run(quantization=None, quantization_config=None, kv_cache_dtype="auto")
    assert tokens == base


# ------------------------------------------------------------------ registry and errors


def test_registry_names_and_errors():
    assert QUANTIZATION_METHODS[:3] == ["int8", "int4", "fp8"]
    assert get_quantization_config("int4") is Int4GroupConfig
    with pytest.raises(ValueError, match=r"quantization must be one of int8, int4, fp8.*got 'awq'"):
        get_quantization_config("awq")
    with pytest.raises(ValueError, match=r"unknown keys \['group'\]; allowed: \['group_size'\]"):
        make_quant_config("int4", {"group": 64})
    with pytest.raises(ValueError, match=r"'int8' has unknown keys \['group_size'\]"):
        make_quant_config("int8", {"group_size": 64})
    with pytest.raises(ValueError, match=r"group_size must be a multiple of 8 that is >= 8, got 12"):
        make_quant_config("int4", {"group_size": 12})
    with pytest.raises(ValueError, match="quantization_config must be a dict"):
        make_quant_config("int4", [("group_size", 64)])
    with pytest.raises(ValueError, match="quantization_config needs quantization="):
        make_quant_config(None, {"group_size": 64})


def test_engine_refuses_what_it_cannot_quantize():
    with pytest.raises(ValueError, match="quantization applies to a transformer"):
        LLMEngine("toy", quantization="int8")
    with pytest.raises(ValueError, match="quantization applies to a transformer"):
        LLMEngine("tiny-random", model_backend="torch", quantization="int8")
    with pytest.raises(ValueError, match="quantization applies to a transformer"):
        LLMEngine(get_model("tiny-random"), quantization="int8")
    # tiny-random's smallest input size is 64: a group of 48 divides none of them.
    with pytest.raises(ValueError, match=r"group_size must divide the input size of "
                                         r"model\.layers\.0\.self_attn\.qkv_proj \(64\), got 48"):
        LLMEngine("tiny-random", quantization="int4", quantization_config={"group_size": 48})
    with pytest.raises(ValueError, match="already quantized"):
        get_model("tiny-random", quantization="int8").quantized(make_quant_config("int8"))


def test_a_registered_config_serves_chosen_layers_and_leaves_the_rest():
    """The plug-in path a learner uses: register a config, name it, skip layers by prefix."""
    seen = []

    class Int8ExceptMLP(QuantizationConfig):
        def get_name(self):
            return "test-int8-attn-only"

        @classmethod
        def from_config(cls, config):
            return cls()

        def get_quant_method(self, layer, prefix):
            seen.append(prefix)
            if ".mlp." in prefix:
                return UnquantizedLinearMethod()
            return get_quantization_config("int8")().get_quant_method(layer, prefix)

    register_quantization_config("test-int8-attn-only")(Int8ExceptMLP)
    try:
        model = get_model("tiny-random", quantization="test-int8-attn-only")
        assert seen[:4] == ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                            "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"]
        assert len(seen) == 4 * model.config.num_hidden_layers
        lin = model.linears[1]
        assert type(lin.gate_up_proj.quant_method) is UnquantizedLinearMethod
        assert type(lin.qkv_proj.quant_method).__name__ == "Int8LinearMethod"
        # MLP keeps float32; attention is int8 + one float32 scale per output channel.
        c = model.config
        qkv_out = c.q_size + 2 * c.kv_size
        attn = (c.hidden_size * qkv_out + 4 * qkv_out) + (c.q_size * c.hidden_size + 4 * c.hidden_size)
        mlp = 4 * (c.hidden_size * 2 * c.intermediate_size + c.intermediate_size * c.hidden_size)
        assert model.linear_weight_bytes() == c.num_hidden_layers * (attn + mlp)
        with pytest.raises(ValueError, match="must be a subclass of QuantizationConfig"):
            register_quantization_config("test-bad")(object)
    finally:
        from mini_vllm import quantization

        quantization._REGISTRY.pop("test-int8-attn-only")
        QUANTIZATION_METHODS.remove("test-int8-attn-only")


def test_create_weights_must_declare_the_weight_shape():
    class Forgetful(LinearMethodBase):
        def create_weights(self, layer, input_size, output_size):
            layer.weight = np.empty((input_size, output_size), np.float32)  # [in, out]: wrong

        def apply(self, layer, x, bias=None):
            return x @ layer.weight

    class Config(QuantizationConfig):
        def get_name(self):
            return "forgetful"

        @classmethod
        def from_config(cls, config):
            return cls()

        def get_quant_method(self, layer, prefix):
            return Forgetful()

    class Skips(Config):
        def get_quant_method(self, layer, prefix):
            return None

    with pytest.raises(ValueError, match=r"Skips\.get_quant_method returned None for "
                                         r"model\.layers\.0\.self_attn\.qkv_proj: every linear layer"):
        get_model("tiny-random").quantized(Skips())
    with pytest.raises(ValueError, match=r"Forgetful\.create_weights must set layer\.weight to shape "
                                         r"\[output_size, input_size\] = \[128, 64\] for "
                                         r"model\.layers\.0\.self_attn\.qkv_proj, got \(64, 128\)"):
        get_model("tiny-random").quantized(Config())


def test_linear_layer_checks_its_arguments():
    with pytest.raises(ValueError, match="input_size must be an integer >= 1, got 0"):
        LinearLayer(0, 4)
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\) \(output_size\), got \(3,\)"):
        LinearLayer(2, 4, bias=np.zeros(3, np.float32))


# ------------------------------------------------------------------ the formats' arithmetic


def test_int8_codes_scales_and_exact_bytes():
    w = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [254.0, 1.0, -3.0]], np.float32)
    codes, scales = quantize_int8_per_channel(w)
    # Row 0: scale 1/127, codes 63.5 -> 64 (half to even), -127, 31.75 -> 32.
    # Row 1: all zero -> scale 1.0, codes 0 (no NaN). Row 2: scale 2, codes 127, 0 (0.5 -> 0), -2 (-1.5 -> -2).
    np.testing.assert_allclose(scales, [1 / 127, 1.0, 2.0], rtol=1e-7)
    assert codes.dtype == np.int8 and codes.tolist() == [[64, -127, 32], [0, 0, 0], [127, 0, -2]]
    model = get_model("tiny-random", quantization="int8")
    c = model.config
    sizes = [(c.hidden_size, c.q_size + 2 * c.kv_size), (c.q_size, c.hidden_size),
             (c.hidden_size, 2 * c.intermediate_size), (c.intermediate_size, c.hidden_size)]
    assert model.linear_weight_bytes() == c.num_hidden_layers * sum(i * o + 4 * o for i, o in sizes)
    layer = model.linears[0].o_proj
    assert layer.weight.dtype == np.int8  # the float32 matrix is no longer referenced
    x = np.random.default_rng(0).standard_normal((5, c.q_size)).astype(np.float32)
    dequant = layer.weight.astype(np.float32) * layer.weight_scale[:, None]
    np.testing.assert_allclose(layer(x), x @ dequant.T, rtol=1e-5, atol=1e-5)


def test_int4_packs_gptq_rows_and_round_trips():
    codes = (np.arange(16 * 3) % 16).reshape(16, 3).astype(np.uint8)
    packed = pack_rows(codes)
    assert packed.shape == (2, 3) and packed.dtype == np.int32
    # Column 0 holds 0, 3, 6, 9, 12, 15, 2, 5 in rows 0..7: row i in bits 4i..4i+3.
    expected = sum(int(v) << (4 * i) for i, v in enumerate(codes[:8, 0]))
    assert int(packed.view(np.uint32)[0, 0]) == expected == 0x52FC9630
    np.testing.assert_array_equal(unpack_rows(packed), codes)


def test_int4_groups_scales_and_bytes():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 6)).astype(np.float32)
    w[:32, 0] = np.linspace(-0.8, 0.7, 32)  # group 0 of column 0: max/7 = 0.1, -min/8 = 0.1
    codes, scales = quantize_int4_groups(w, 32)
    assert scales.shape == (2, 6) and scales.dtype == np.float16
    assert scales[0, 0] == np.float16(0.1) and codes[0, 0] == 0 and codes[31, 0] == 15
    assert codes.min() >= 0 and codes.max() <= 15
    deq = (codes.astype(np.float32) - 8).reshape(2, 32, 6) * scales.astype(np.float32)[:, None, :]
    assert np.abs(deq.reshape(64, 6) - w).max() <= scales.astype(np.float32).max() / 2 + 1e-6
    for group in (32, 64):
        model = get_model("tiny-random", quantization="int4", quantization_config={"group_size": group})
        c = model.config
        sizes = [(c.hidden_size, c.q_size + 2 * c.kv_size), (c.q_size, c.hidden_size),
                 (c.hidden_size, 2 * c.intermediate_size), (c.intermediate_size, c.hidden_size)]
        # half a byte per weight + one float16 scale per group of each output column
        assert model.linear_weight_bytes() == c.num_hidden_layers * sum(
            i * o // 2 + 2 * (i // group) * o for i, o in sizes)


def test_fp8_clamps_floors_and_scales_per_token():
    x = np.array([[500.0, -1000.0, 1.0], [0.0, 0.0, 0.0], [0.25, -0.5, 0.125]], np.float32)
    # A static scale of 1 would put 500 and -1000 out of range: clamped to +-448, never NaN.
    np.testing.assert_array_equal(to_fp8(x, 1.0).astype(np.float32)[0], [448.0, -448.0, 1.0])
    q, scale = quantize_fp8_per_token(x)
    assert scale[:, 0].tolist() == pytest.approx([1000 / 448, MIN_SCALE, 0.5 / 448], rel=1e-6)
    assert not np.isnan(q.astype(np.float32)).any()
    assert np.abs(q.astype(np.float32)).max(axis=1).tolist() == [448.0, 0.0, 448.0]
    # Per tensor, the small row keeps far fewer significant bits than per token.
    qt, st = quantize_fp8_per_tensor(x)
    err_tensor = np.abs(qt.astype(np.float32)[2] * st - x[2]).max()
    err_token = np.abs(q.astype(np.float32)[2] * scale[2] - x[2]).max()
    assert err_token == 0.0 and err_tensor > 0.01
    assert FP8_E4M3_MAX == 448.0


# ------------------------------------------------------------------ scheduling never changes output


@pytest.mark.parametrize("quantization,options", METHODS + [(None, None)],
                         ids=["int8", "int4-g32", "int4-g64", "fp8", "fp8-kv"])
def test_scheduling_never_changes_a_quantized_models_output(quantization, options):
    kw = dict(quantization=quantization, quantization_config=options)
    if quantization is None:
        kw["kv_cache_dtype"] = "fp8"
    alone = [run([p], enable_caching=False, **kw)[0][0] for p in PROMPTS]
    chunked, engine = run(max_num_batched_tokens=5, **kw)
    assert chunked == alone
    assert sum(1 for s in engine.stats if s.num_scheduled_tokens.get("req-3", 0) > 1) > 1
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, **kw)
    first = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    second = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    assert first == alone and second == alone
    assert sum(s.num_cached_tokens for s in engine.stats) >= 2 * 20
    preempted, engine = run(num_blocks=13, **kw)
    assert preempted == alone
    assert any(s.preempted for s in engine.stats)


def test_quantized_tiny_random_stays_close_to_float32():
    """Step-1 logits of all four prompts: int8 is close, int4 further, never NaN."""
    from mini_vllm.quantization.quality import compare_logits

    def first_logits(**kw):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, **kw)
        captured = []
        execute = engine.model.execute
        engine.model.execute = lambda mi: captured.append(execute(mi)) or captured[-1]
        engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=1))
        return captured[0]

    ref = first_logits()
    kl = {name: compare_logits(ref, first_logits(quantization=q, quantization_config=o))["kl"]
          for name, (q, o) in zip(["int8", "int4-g32", "int4-g64", "fp8"], METHODS, strict=True)}
    kl["fp8-kv"] = compare_logits(ref, first_logits(kv_cache_dtype="fp8"))["kl"]
    assert kl["int8"] < 1e-3 < kl["int4-g32"] < kl["int4-g64"]
    assert kl["fp8"] < kl["int4-g32"] and kl["fp8-kv"] < kl["int4-g32"]


# ------------------------------------------------------------------ FP8 KV cache


def test_fp8_kv_cache_is_a_quarter_of_the_bytes_and_checked():
    _, base = run()
    _, fp8 = run(kv_cache_dtype="fp8")
    assert fp8.model.kv_cache.dtype.itemsize == 1 and fp8.kv_cache_dtype == "fp8"
    assert fp8.model.kv_cache_bytes * 4 == base.model.kv_cache_bytes == 128 * 4 * 2 * 2 * 2 * 16 * 4
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of auto, fp8, fp8_e4m3 for "
                                         r"LlamaForCausalLM, got 'fp8_e5m2'"):
        LLMEngine("tiny-random", kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of auto for ToyModel"):
        LLMEngine("toy", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match=r"Selected backend NUMPY_FLASH is not valid .*kv_cache_dtype=fp8\)\. "
                                         r"Reason: \['kv_cache_dtype not supported'\]"):
        LLMEngine("tiny-random", kv_cache_dtype="fp8", attention_backend="NUMPY_FLASH")


def test_fp8_kv_cache_stores_clamped_e4m3_values():
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=16, kv_cache_dtype="fp8")
    engine.generate([{"prompt_token_ids": [1, 2, 3, 4, 5]}], SamplingParams(temperature=0, max_tokens=1))
    stored = engine.model.kv_cache.astype(np.float32)
    assert not np.isnan(stored).any() and np.abs(stored).max() <= FP8_E4M3_MAX
    # Every stored value is on the E4M3 grid: casting it again changes nothing.
    np.testing.assert_array_equal(to_fp8(stored, 1.0).astype(np.float32), stored)
    assert np.count_nonzero(stored) > 0


# ------------------------------------------------------------------ SmolLM2: the table in BENCHMARKS.md

# (label, quantization, options, kv dtype) -> linear bytes, KL mean, top-1 on EVAL_TEXT (44 tokens),
# as printed by benchmarks/bench_quantization.py on the CI machine (see BENCHMARKS.md).
SMOLLM2_TABLE = {
    "int8 W8A16": (106_790_400, 3.71e-3, 1.000),
    "int4 W4A16 g32": (59_719_680, 3.02e-1, 0.705),
    "int4 W4A16 g64": (56_401_920, 4.00e-1, 0.614),
    "fp8 W8A8": (106_168_800, 2.48e-2, 0.886),
    "fp8 KV cache": (424_673_280, 4.98e-3, 1.000),
}


@pytest.mark.model
def test_smollm2_quality_matches_the_benchmark_table():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mini_vllm.quantization.quality import EVAL_TEXT, compare_logits, prefill_logits
    from mini_vllm.quantization.quality import METHODS as TABLE_METHODS

    with threadpoolctl.threadpool_limits(1, "blas"):
        base = get_model("smollm2")
        ids = base.tokenizer.encode(EVAL_TEXT)
        assert len(ids) == 44
        ref = prefill_logits(base, ids)
        # 106,168,320 linear weights in 30 layers, float32
        assert base.linear_weight_bytes() == 4 * 30 * 576 * (960 + 576 + 3072) + 4 * 30 * 1536 * 576
        for label, quantization, options, kv_dtype in TABLE_METHODS[1:]:
            model = base if quantization is None else base.quantized(make_quant_config(quantization, options))
            got = compare_logits(ref, prefill_logits(model, ids, kv_cache_dtype=kv_dtype))
            nbytes, kl, top1 = SMOLLM2_TABLE[label]
            assert model.linear_weight_bytes() == nbytes, label
            assert got["kl"] == pytest.approx(kl, rel=0.05), label
            assert abs(got["top1"] - top1) <= 1.5 / 44, label  # at most one position either way


def test_the_cli_passes_quantization_through(capsys):
    from mini_vllm.__main__ import main

    argv = ["generate", "--model", "tiny-random", "--max-tokens", "4", "--quiet", "hello there"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--quantization", "int8"]) == 0
    int8 = capsys.readouterr().out
    assert main(argv + ["--quantization", "int4", "--quantization-config", '{"group_size": 64}',
                        "--kv-cache-dtype", "fp8"]) == 0
    assert plain and int8 and capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--quantization", "awq"])
    assert exit_info.value.code == 2
    assert "quantization must be one of int8, int4, fp8" in capsys.readouterr().err


def test_fp8_widening_table_equals_the_cast_on_all_256_patterns():
    from mini_vllm.quantization.fp8 import fp8_dtype, fp8_to_float32

    codes = np.arange(256, dtype=np.uint8).view(fp8_dtype()).reshape(16, 16)
    np.testing.assert_array_equal(fp8_to_float32(codes), codes.astype(np.float32))
    assert fp8_to_float32(codes).dtype == np.float32
