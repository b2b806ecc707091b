"""Lab 06-01 tests: int8 per-channel weights (W8A16), the method shape, and mini_vllm running it."""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def gaussian(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def rel(ref, approx):
    """Independent of the learner: Frobenius relative error."""
    return float(np.linalg.norm(np.asarray(approx, np.float64) - ref) / np.linalg.norm(ref))


def deq(q, scales):
    """Test-side dequantization, row scales: q[o, i] * scales[o]."""
    return q.astype(np.float32) * np.asarray(scales, np.float32).reshape(-1, 1)


# ---------------------------------------------------------------- per-channel quantization


def test_per_channel_scales_and_codes_by_hand():
    # Every number here is exact in float32, so the expected codes are exact:
    # row 0: max 127 -> scale 1.0; 63.5 is a tie -> -64 (half to even), 2.5 -> 2,
    #        -0.5 -> 0 (even), 1.5 -> 2. floor would give -64, 2, -1, 1.
    # row 1: max 31.75 -> scale 0.25; 0.375 / 0.25 = 1.5 -> 2, 0.625 -> 2.5 -> 2,
    #        0.125 -> 0.5 -> 0, 5.0 -> 20.
    # row 2: all zero -> scale 1.0 (no 0 / 0), codes 0.
    W = np.array([[127.0, -63.5, 2.5, -0.5, 1.5],
                  [-31.75, 0.375, 0.625, 0.125, 5.0],
                  [0.0, 0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    q, scales = impl.quantize_per_channel(W)
    assert q.dtype == np.int8 and q.shape == (3, 5)
    assert scales.dtype == np.float32 and scales.shape == (3,)  # one per OUTPUT row, not per column
    assert scales.tolist() == [1.0, 0.25, 1.0]
    assert q.tolist() == [[127, -64, 2, 0, 2],
                          [-127, 2, 2, 0, 20],
                          [0, 0, 0, 0, 0]]


def test_scale_is_absmax_over_127_per_row():
    # rows of very different size: each scale is its own row's max|w| / 127, in float32
    W = gaussian((6, 40), seed=3) * np.geomspace(1e-3, 1e2, 6, dtype=np.float32)[:, None]
    q, scales = impl.quantize_per_channel(W)
    np.testing.assert_array_equal(scales, np.abs(W).max(axis=1) / np.float32(127))
    # every row reaches the end of the grid, and the end is +-127
    assert (np.abs(q.astype(np.int32)).max(axis=1) == 127).all()


def test_codes_stop_at_minus_127_never_minus_128():
    # the row's extreme is negative: it maps to -127. A [-128, 127] range (scale /128)
    # would put it at -128, the one int8 value a symmetric grid never uses.
    q, scales = impl.quantize_per_channel(np.array([[-1.0, 0.25], [0.5, -2.0]]))
    assert q[:, :].min() == -127 and q[0, 0] == -127 and q[1, 1] == -127
    assert scales.tolist() == [np.float32(1.0) / np.float32(127), np.float32(2.0) / np.float32(127)]
    q, _ = impl.quantize_per_channel(-np.abs(gaussian((32, 64), seed=4)))
    assert q.min() == -127 and (q.min(axis=1) == -127).all()


def test_round_trip_error_is_under_half_a_step_and_unbiased():
    W = gaussian((64, 256))
    q, scales = impl.quantize_per_channel(W)
    err = deq(q, scales) - W
    steps = err / scales[:, None]
    # rounding to nearest: never more than half a step (plus float32 noise), and it
    # gets close to half a step somewhere (a coarser grid or a clipped range does not)
    assert np.abs(steps).max() <= 0.5 + 1e-4
    assert np.abs(steps).max() > 0.45
    # unbiased: the mean error is ~0 steps (measured -0.002); floor gives -0.5
    assert abs(steps.mean()) < 0.02
    # relative Frobenius error on N(0, 1): measured 0.69%; floor doubles it (1.39%)
    assert rel(W, deq(q, scales)) < 0.01


def test_all_zero_rows_get_scale_one_and_no_nan():
    W = gaussian((4, 8), seed=5)
    W[2] = 0.0
    q, scales = impl.quantize_per_channel(W)
    assert np.isfinite(scales).all() and scales[2] == 1.0
    assert q[2].tolist() == [0] * 8
    out = impl.dequantize(q, scales)
    assert np.isfinite(out).all() and out[2].tolist() == [0.0] * 8
    q, scale = impl.quantize_per_tensor(np.zeros((3, 3)))
    assert scale == 1.0 and not q.any()


# ---------------------------------------------------------------- per tensor, and why per channel


def test_per_tensor_scale_by_hand():
    # max|W| = 63.5 -> scale 0.5 exactly: 63.5 -> 127, 1.25 -> 2.5 -> 2, -1.75 -> -3.5 -> -4,
    # 0.3 -> 0.6 -> 1, -63.5 -> -127
    W = np.array([[63.5, 1.25, -1.75], [-63.5, 0.2, 0.3]], dtype=np.float32)
    q, scale = impl.quantize_per_tensor(W)
    assert q.dtype == np.int8 and np.ndim(scale) == 0 and scale == 0.5
    assert q.tolist() == [[127, 2, -4], [-127, 0, 1]]
    # a small matrix (max below 1) gets a small scale, not 1.0: only all-zero means 1.0
    q, scale = impl.quantize_per_tensor([[-0.5, 0.125], [0.0, 0.25]])
    assert scale == np.float32(0.5) / np.float32(127) and q[0, 0] == -127


def test_per_channel_beats_per_tensor_with_one_loud_row():
    # one output row 100x louder: a single scale sized for it is a grid step of
    # ~3.4 on rows whose weights are ~1, so most of them round to 0
    W = gaussian((64, 256))
    W[7] *= 100
    quiet = np.arange(64) != 7
    q_c, s_c = impl.quantize_per_channel(W)
    q_t, s_t = impl.quantize_per_tensor(W)
    err_c = rel(W[quiet], impl.dequantize(q_c, s_c)[quiet])
    err_t = rel(W[quiet], impl.dequantize(q_t, s_t)[quiet])
    # measured: per channel 0.0070, per tensor 0.575 (83x)
    assert err_c < 0.01 and err_t > 0.5
    assert err_t > 50 * err_c
    # the per-tensor codes of the quiet rows are a handful of levels only
    assert np.abs(q_t[quiet].astype(np.int32)).max() <= 5


# ---------------------------------------------------------------- dequantize and the linear layer


def test_dequantize_scales_each_output_row():
    # square on purpose: scaling the columns instead of the rows broadcasts without error
    q = np.array([[1, -2], [3, 4]], dtype=np.int8)
    out = impl.dequantize(q, np.array([1.0, 10.0], dtype=np.float32))
    assert out.dtype == np.float32
    assert out.tolist() == [[1.0, -2.0], [30.0, 40.0]]
    # a scalar scale (per tensor) scales everything
    assert impl.dequantize(q, np.float32(0.5)).tolist() == [[0.5, -1.0], [1.5, 2.0]]
    # -127 * scale is exact where the scale is a power of two
    assert impl.dequantize(np.array([[-127]], dtype=np.int8), [0.25]).tolist() == [[-31.75]]


def test_quant_linear_matches_x_at_W_T():
    W = gaussian((64, 256))
    x = gaussian((8, 256), seed=1)
    bias = np.linspace(-1, 1, 64, dtype=np.float32)
    q, scales = impl.quantize_per_channel(W)
    y = impl.quant_linear(x, q, scales)
    assert y.dtype == np.float32 and y.shape == (8, 64)
    # it is x times the dequantized weight, transposed (float32 rounding only)
    np.testing.assert_allclose(y, x @ deq(q, scales).T, rtol=1e-4, atol=1e-4)
    # and close to the float layer: measured 0.65% relative
    assert rel(x @ W.T, y) < 0.02
    yb = impl.quant_linear(x, q, scales, bias)
    np.testing.assert_allclose(yb - y, np.broadcast_to(bias, y.shape), atol=1e-5)
    # per tensor through the same function
    q_t, s_t = impl.quantize_per_tensor(W)
    np.testing.assert_allclose(impl.quant_linear(x, q_t, s_t), x @ (q_t * s_t).T,
                               rtol=1e-4, atol=1e-4)


def test_inputs_are_not_modified():
    W = gaussian((16, 32), seed=6)
    x = gaussian((4, 32), seed=7)
    W0, x0 = W.copy(), x.copy()
    q, s = impl.quantize_per_channel(W)
    impl.quantize_per_tensor(W)
    q0, s0 = q.copy(), s.copy()
    impl.dequantize(q, s)
    impl.quant_linear(x, q, s, np.ones(16, np.float32))
    np.testing.assert_array_equal(W, W0)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(s, s0)


def test_memory_arithmetic():
    W = gaussian((100, 100))
    assert impl.memory_bytes(W) == 40_000
    assert impl.memory_bytes(W.astype(np.float64)) == 40_000  # the float32 bill, whatever W's dtype
    assert impl.memory_bytes(W, np.float16) == 20_000
    q, scales = impl.quantize_per_channel(W)
    assert impl.memory_bytes_quant(q, scales) == 10_000 + 400  # 100 float32 scales
    q_t, s_t = impl.quantize_per_tensor(W)
    assert impl.memory_bytes_quant(q_t, s_t) == 10_000 + 4
    # a wide layer: the scales are 4 bytes per row of in_features bytes
    q, scales = impl.quantize_per_channel(gaussian((8, 1000)))
    assert impl.memory_bytes_quant(q, scales) == 8_000 + 32


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="W"):
        impl.quantize_per_channel(np.ones(5))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_per_channel(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_per_channel(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_per_tensor(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="W"):
        impl.quantize_per_tensor(np.ones(3))
    q, s = impl.quantize_per_channel(gaussian((4, 6)))
    with pytest.raises(ValueError, match="x must have 6 columns"):
        impl.quant_linear(np.ones((2, 5), np.float32), q, s)
    with pytest.raises(ValueError, match="x"):
        impl.quant_linear(np.ones(6, np.float32), q, s)
    with pytest.raises(ValueError, match="scales"):
        impl.dequantize(q, np.ones(6, np.float32))  # one per column: the wrong axis
    with pytest.raises(ValueError, match="q"):
        impl.dequantize(q.astype(np.float32), s)
    with pytest.raises(ValueError, match="q"):
        impl.dequantize(q.ravel(), s)


# ---------------------------------------------------------------- the method, on one layer


def make_layer(W, bias=None):
    """A LinearLayer run through the method's three calls, the way the model builder does."""
    from mini_vllm.quantization import LinearLayer

    out_f, in_f = W.shape
    layer = LinearLayer(in_f, out_f, "test.proj", bias=bias)
    method = impl.Int8LinearMethod()
    layer.quant_method = method
    method.create_weights(layer, in_f, out_f)
    assert layer.weight.shape == (out_f, in_f) and layer.weight.dtype == np.float32
    # what mini_vllm's loader does: bind the checkpoint's [in, out] array, transposed
    # (a view, not contiguous), to layer.weight
    layer.weight = np.ascontiguousarray(W.T).T
    method.process_weights_after_loading(layer)
    return layer


def test_method_is_a_linear_method_with_vllms_three_calls():
    from mini_vllm.quantization import LinearLayer, LinearMethodBase

    assert issubclass(impl.Int8LinearMethod, LinearMethodBase)
    layer = LinearLayer(48, 24, "p")
    impl.Int8LinearMethod().create_weights(layer, 48, 24)
    assert layer.weight.shape == (24, 48) and layer.weight.dtype == np.float32
    tiny = LinearLayer(1, 1, "one")  # 1 x 1 is a legal (if silly) layer
    impl.Int8LinearMethod().create_weights(tiny, 1, 1)
    assert tiny.weight.shape == (1, 1)
    for sizes, name in (((0, 24), "input_size"), ((48, -1), "output_size"),
                        ((48.0, 24), "input_size"), ((48, True), "output_size")):
        with pytest.raises(ValueError, match=name):
            impl.Int8LinearMethod().create_weights(LinearLayer(48, 24, "p"), *sizes)


def test_method_stores_int8_codes_and_float32_scales_only():
    W = gaussian((24, 48), seed=8)
    layer = make_layer(W)
    q, scales = impl.quantize_per_channel(W)
    assert layer.weight.dtype == np.int8 and layer.weight.shape == (24, 48)
    np.testing.assert_array_equal(layer.weight, q)
    assert layer.weight_scale.dtype == np.float32 and layer.weight_scale.shape == (24,)
    np.testing.assert_array_equal(layer.weight_scale, scales)
    # every array on the layer, counted by mini_vllm: 24 * 48 codes + 24 * 4 scale bytes.
    # Keeping the float32 weight as well (or instead) fails this.
    assert layer.weight_bytes() == 24 * 48 + 24 * 4


def test_method_apply_is_x_at_dequantized_W_T_plus_bias():
    W = gaussian((24, 48), seed=9)
    bias = np.arange(24, dtype=np.float32) - 12.0
    layer = make_layer(W, bias)
    x = gaussian((5, 48), seed=10)
    q, scales = impl.quantize_per_channel(W)
    y = layer(x)  # LinearLayer.__call__ = quant_method.apply(layer, x, layer.bias)
    assert y.dtype == np.float32 and y.shape == (5, 24)
    np.testing.assert_allclose(y, x @ deq(q, scales).T + bias, rtol=1e-5, atol=1e-4)
    # without a bias, no bias
    np.testing.assert_allclose(layer.quant_method.apply(layer, x), x @ deq(q, scales).T,
                               rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- the method inside mini_vllm

# Four prompts, batched, with a 16-token step budget: the 35-byte prompt is prefilled in
# chunks over three steps, mixed with the others' prefill and decode. tiny-random's weights
# are random, so its logits are nearly flat: the top two logits of a step are sometimes
# 0.007 apart, while int8 moves a logit by up to 0.05. On such a near-tie the greedy token
# can flip, and from there the two runs diverge ("Hello, world!" and
# "Quantization trades bits for error" do, at their 2nd and 4th tokens). These four prompts
# were checked to have no such tie in 8 tokens; that is what "pinned" means here.
PROMPTS = ["The quick brown fox", "Paged attention stores KV in blocks",
           "The cat sat on the mat", "1 2 3 4 5 6 7 8"]
EXPECTED_TOKENS = [[87, 235, 43, 142, 151, 25, 95, 80],
                   [101, 213, 33, 64, 85, 213, 33, 64],
                   [202, 19, 213, 33, 64, 101, 171, 142],
                   [97, 168, 84, 212, 24, 152, 173, 182]]
LINEARS_PER_LAYER = 4  # qkv_proj, o_proj, gate_up_proj, down_proj


def run_engine(quantization):
    """Greedy, 8 tokens each; returns (engine, output ids, the logits of every step)."""
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    engine = LLMEngine("tiny-random", quantization=quantization, max_num_batched_tokens=16,
                       num_blocks=64)
    logits, execute = [], engine.model.execute

    def recording_execute(model_input):
        out = execute(model_input)
        logits.append(np.array(out, copy=True))
        return out

    engine.model.execute = recording_execute
    reqs = engine.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.0))
    return engine, [list(r.output_token_ids) for r in reqs], logits


@pytest.fixture(scope="module")
def engines():
    """The float32 engine and the lab01-int8 engine, with the learner's apply calls counted."""
    from mini_vllm.quantization import get_quantization_config

    # the given Lab01Int8Config registered itself when the lab module was imported
    assert get_quantization_config("lab01-int8") is impl.Lab01Int8Config
    calls = []
    original = impl.Int8LinearMethod.apply

    def counting_apply(self, layer, x, bias=None):
        calls.append(layer.prefix)
        return original(self, layer, x, bias)

    ref = run_engine(None)
    impl.Int8LinearMethod.apply = counting_apply
    try:
        quant = run_engine("lab01-int8")
    finally:
        impl.Int8LinearMethod.apply = original
    return ref, quant, calls


def test_mini_vllm_runs_your_linear_method(engines):
    ref, (engine, _, logits), calls = engines
    layers = [lin for lin in engine.model.linears]
    assert len(layers) == engine.model.config.num_hidden_layers == 2
    for lin in layers:
        for layer in (lin.qkv_proj, lin.o_proj, lin.gate_up_proj, lin.down_proj):
            assert type(layer.quant_method) is impl.Int8LinearMethod
            assert layer.weight.dtype == np.int8
    # your apply ran for every linear layer of every step: 2 layers x 4 linears per forward
    assert len(logits) == engine.num_steps == ref[0].num_steps
    assert len(calls) == 2 * LINEARS_PER_LAYER * len(logits)
    assert calls[:4] == ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                         "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"]
    # chunked prefill really happened: the first step is the 16-token budget, all of prompt 0's
    # 19 tokens did not fit
    assert engine.stats[0].num_scheduled_tokens == {"req-0": 16}


def test_int8_greedy_tokens_equal_float32(engines):
    (_, ref_tokens, _), (_, tokens, _), _ = engines
    assert ref_tokens == EXPECTED_TOKENS  # the float32 engine itself is pinned
    assert tokens == ref_tokens


def test_int8_step_logits_within_pinned_tolerance(engines):
    (_, _, ref_logits), (_, _, logits), _ = engines
    assert len(logits) == len(ref_logits) == 14
    errs = [rel(r, q) for r, q in zip(ref_logits, logits, strict=True)]
    # Measured per step: 0.85% to 1.19% relative (Frobenius over the step's [reqs, 257]
    # logits). Each weight moves by up to half a step, ~0.7% of a row's norm on
    # Gaussian weights, and the errors of 8 matmuls add up roughly in quadrature through
    # two layers. Pinned at 2.5%, about twice the worst step; per-tensor scales or floor
    # rounding go past it (the unit tests above catch the subtler grid errors).
    assert max(errs) < 0.025
    # and it is quantized: float32 weights in apply would give 0 here
    assert min(errs) > 0.005


def test_linear_weight_bytes_are_int8_codes_plus_float32_scales(engines):
    (ref_engine, _, _), (engine, _, _), _ = engines
    c = engine.model.config
    # tiny-random: hidden 64, 4 query heads and 2 KV heads of 16, intermediate 128
    shapes = [(c.q_size + 2 * c.kv_size, c.hidden_size),  # qkv_proj [128, 64]
              (c.hidden_size, c.q_size),  # o_proj [64, 64]
              (2 * c.intermediate_size, c.hidden_size),  # gate_up_proj [256, 64]
              (c.hidden_size, c.intermediate_size)]  # down_proj [64, 128]
    assert shapes == [(128, 64), (64, 64), (256, 64), (64, 128)]
    weights = sum(o * i for o, i in shapes) * c.num_hidden_layers  # 36,864 per layer
    rows = sum(o for o, _ in shapes) * c.num_hidden_layers  # 512 scales per layer
    assert ref_engine.model.linear_weight_bytes() == 4 * weights == 294_912
    # 73,728 one-byte codes + 1,024 four-byte scales
    assert engine.model.linear_weight_bytes() == weights + 4 * rows == 77_824
