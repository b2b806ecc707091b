"""Lab 06-02 tests: damage measures by hand, exact bits per weight, round trips, SmolLM2 bands."""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

import importlib.util  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def rel(ref, approx):
    """Independent of the learner: Frobenius relative error."""
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(np.asarray(approx, dtype=np.float64) - ref) / np.linalg.norm(ref))


def logits_of(probs):
    """Logits whose softmax is exactly ``probs`` (up to float64 rounding): their logs."""
    return np.log(np.asarray(probs, dtype=np.float64))


# ---------------------------------------------------------------- log-softmax and KL


def test_log_softmax_survives_logits_of_1e4():
    x = np.array([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4 - 1.0]])
    out = impl.log_softmax(x)
    assert out.dtype == np.float64 and out.shape == (2, 3)
    # row 0: exp(0 - 1e4) vanishes next to 1, so the log-sum-exp is exactly 1e4
    assert out[0].tolist() == [0.0, -1e4, -2e4]
    # row 1: shifted by 1e4 it is [0, 0, -1]; log-sum-exp = log(2 + e^-1)
    lse = math.log(2 + math.exp(-1))
    np.testing.assert_allclose(out[1], [-lse, -lse, -1 - lse], rtol=1e-12)
    # exp(1e4) overflows to inf in float64: without subtracting the max this is NaN
    assert np.isfinite(out).all()
    np.testing.assert_allclose(np.exp(out).sum(axis=1), [1.0, 1.0], rtol=1e-15)


def test_kl_of_a_distribution_with_itself_is_zero():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 11)) * 3
    assert impl.kl_divergence(x, x) == 0.0
    # adding a constant to every logit of a row changes nothing
    assert impl.kl_divergence(x, x + 7.0) == pytest.approx(0.0, abs=1e-14)
    assert impl.kl_divergence(x + 1e4, x + 1e4) == 0.0


def test_kl_by_hand_on_two_positions():
    p = [[0.8, 0.1, 0.1], [1 / 3, 1 / 3, 1 / 3]]
    q = [[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]
    # position 0: 0.8 ln(0.8/0.5) + 2 * 0.1 ln(0.1/0.25) = 0.8 ln 1.6 + 0.2 ln 0.4
    # position 1: (1/3) [ln(2/3) + 2 ln(4/3)] = (1/3) ln(32/27)
    kl0 = 0.8 * math.log(1.6) + 0.2 * math.log(0.4)
    kl1 = math.log(32 / 27) / 3
    assert kl0 == pytest.approx(0.19274, abs=1e-5) and kl1 == pytest.approx(0.05663, abs=1e-5)
    assert impl.kl_divergence(logits_of(p), logits_of(q)) == pytest.approx((kl0 + kl1) / 2,
                                                                            rel=1e-12)
    # the other direction, KL(q || p), is a different number: 0.5 ln 0.625 + 0.5 ln 2.5 ...
    reverse = (0.5 * math.log(0.625) + 0.5 * math.log(2.5)
               + 0.5 * math.log(1.5) + 0.5 * math.log(0.75)) / 2
    assert abs(reverse - (kl0 + kl1) / 2) > 0.01  # 0.141 against 0.125
    # shifting either set of logits by 1e4 (per row) changes nothing
    assert impl.kl_divergence(logits_of(p) + 1e4, logits_of(q) - 1e4) == pytest.approx(
        (kl0 + kl1) / 2, rel=1e-9)


def test_kl_survives_probabilities_that_underflow():
    # exp(-800) is below float64's smallest number: softmax gives exactly 0 there, and
    # log(0) = -inf, 0 * (-inf - -inf) = NaN. From log-softmax the term is
    # e^-800 * 100, i.e. 0, and the total is 0 + 1 * (0 - 0) = 0.
    ref = np.array([[0.0, -800.0], [0.0, -800.0]])
    q = np.array([[0.0, -900.0], [0.0, -700.0]])
    kl = impl.kl_divergence(ref, q)
    assert kl == pytest.approx(0.0, abs=1e-300) and kl >= 0


def test_top1_agreement_counts_positions_not_vocab_entries():
    ref = np.array([[1, 2, 3], [3, 2, 1], [0, 5, 1], [2, 2.5, 0]], dtype=float)
    q = np.array([[1, 2, 3], [1, 2, 3], [0, 5, 1], [9, 0, 0]], dtype=float)
    # greedy tokens per position: ref [2, 0, 1, 1], q [2, 2, 1, 0] -> 2 of 4 agree.
    # Argmax over positions (axis 0) would compare 3 vocab columns and give 2/3.
    assert impl.top1_agreement(ref, q) == 0.5
    assert impl.top1_agreement(ref, ref) == 1.0
    assert impl.top1_agreement(ref, -ref) == 0.0


def test_damage_measures_reject_bad_logits():
    good = np.zeros((2, 3))
    for fn in (impl.kl_divergence, impl.top1_agreement):
        with pytest.raises(ValueError, match="logits must have ref_logits' shape"):
            fn(good, np.zeros((2, 4)))
        with pytest.raises(ValueError, match="ref_logits must be a non-empty 2-D"):
            fn(np.zeros(3), good)
        with pytest.raises(ValueError, match="logits must hold only finite"):
            fn(good, np.array([[0, np.nan, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="logits must be a non-empty 2-D"):
        impl.log_softmax(np.zeros((0, 4)))


# ---------------------------------------------------------------- perplexity


def test_perplexity_of_uniform_logits_is_the_vocab_size():
    # every token has probability 1/V, so exp(mean(-log(1/V))) = V
    assert impl.perplexity(np.zeros((5, 7)), [0, 6, 3, 3, 1]) == pytest.approx(7.0, rel=1e-12)
    assert impl.perplexity(np.full((3, 49152), 2.5), [1, 2, 3]) == pytest.approx(49152.0,
                                                                                   rel=1e-12)


def test_perplexity_scores_row_t_on_token_t_plus_1():
    ids = [0, 1, 1]
    logits = logits_of([[0.2, 0.8],    # predicts ids[1] = 1 with 0.8
                        [0.5, 0.5],    # predicts ids[2] = 1 with 0.5
                        [0.99, 0.01]])  # predicts a 4th token that is not there: unused
    # exp(-(ln 0.8 + ln 0.5) / 2) = 1 / sqrt(0.4) = 1.5811...
    # Scoring row t on ids[t] would use 0.2, 0.5, 0.01 (ppl 10.0); dropping the
    # first row instead of the last would use 0.5, 0.01 (ppl 14.1).
    assert impl.perplexity(logits, ids) == pytest.approx(1 / math.sqrt(0.4), rel=1e-12)
    assert impl.perplexity(logits + 1e4, ids) == pytest.approx(1 / math.sqrt(0.4), rel=1e-9)
    # two tokens are enough: one prediction, ppl = 1 / 0.8
    assert impl.perplexity(logits[:2], ids[:2]) == pytest.approx(1.25, rel=1e-12)


def test_perplexity_rejects_bad_token_ids():
    logits = np.zeros((3, 4))
    with pytest.raises(ValueError, match="token_ids must be 1-D with one id per logits row"):
        impl.perplexity(logits, [0, 1])
    with pytest.raises(ValueError, match="token_ids must be 1-D"):
        impl.perplexity(np.zeros((1, 4)), [0])
    with pytest.raises(ValueError, match=r"token_ids must be integers in \[0, 4\)"):
        impl.perplexity(logits, [0, 1, 4])
    with pytest.raises(ValueError, match=r"token_ids must be integers in \[0, 4\)"):
        impl.perplexity(logits, [0, -1, 2])


# ---------------------------------------------------------------- bits per weight


def test_bits_per_weight_counts_every_scale():
    sq = (576, 576)
    expect = {"q8_0": 8.5, "q4_1": 5.0, "q4_0": 4.5, "mxfp4": 4.25, "int4_g32": 4.5,
              "int4_g64": 4.25}
    for fmt, bits in expect.items():
        assert impl.bits_per_weight(fmt, sq) == bits, fmt
    # one fp32 per tensor: 32 bits spread over 576 * 1536 weights
    assert impl.bits_per_weight("fp8_tensor", (576, 1536)) == 8 + 32 / 884_736
    assert impl.bits_per_weight("nvfp4", (576, 1536)) == 4.5 + 32 / 884_736
    # one fp32 per output column: 960 scales over 576 * 960 weights = 32 / 576 each
    assert impl.bits_per_weight("fp8_channel", (576, 960)) == pytest.approx(8 + 32 / 576,
                                                                            rel=1e-15)
    assert impl.bits_per_weight("fp8_channel", (1536, 576)) == pytest.approx(8 + 32 / 1536,
                                                                             rel=1e-15)
    # every answer is a float (20 * 8 / 32, never 20 * 8 // 32); a 32 x 1 matrix is one block
    for fmt in expect:
        assert type(impl.bits_per_weight(fmt, sq)) is float, fmt
    assert impl.bits_per_weight("q8_0", (32, 1)) == 8.5
    # numpy integers and lists are fine too
    assert impl.bits_per_weight("q8_0", np.array([64, 8])) == 8.5
    assert impl.bits_per_weight("q4_0", [64, 8]) == 4.5


def test_bits_per_weight_rejects_unknown_formats_and_bad_shapes():
    with pytest.raises(ValueError, match="fmt must be one of q8_0, q4_1, q4_0, mxfp4, nvfp4"):
        impl.bits_per_weight("int3", (64, 64))
    with pytest.raises(ValueError, match="fmt must be one of"):
        impl.bits_per_weight("Q8_0", (64, 64))
    with pytest.raises(ValueError, match=r"shape must be two integers \(in, out\) >= 1, "
                                         r"got \(576,\)"):
        impl.bits_per_weight("q8_0", [576])
    with pytest.raises(ValueError, match=r"shape must be two integers"):
        impl.bits_per_weight("q8_0", (64, 0))
    with pytest.raises(ValueError, match=r"shape must be two integers"):
        impl.bits_per_weight("q8_0", (64.0, 8))
    # in = 96 holds three blocks of 32, not whole blocks of 64
    assert impl.bits_per_weight("int4_g32", (96, 4)) == 4.5
    for fmt in ("int4_g64", "nvfp4"):
        with pytest.raises(ValueError, match="shape: in_features 96 is not a multiple of 64"):
            impl.bits_per_weight(fmt, (96, 4))
    with pytest.raises(ValueError, match="shape: in_features 100 is not a multiple of 32"):
        impl.bits_per_weight("q8_0", (100, 4))


# ---------------------------------------------------------------- the round trips


def test_int4_group_by_hand():
    # one group of 4 in column 0: hi 0.7, lo -0.8 -> scale max(0.7/7, 0.8/8) = 0.1,
    # stored as fp16 0.0999755859375; codes rint([7.0017, -8.0020, 3.5009, 1.0002])
    # = [7, -8, 4, 1] (floor would give 3 for the third). Column 1 is all zero: scale 1.
    # Column 2: hi 0.7, lo -0.1 -> max(0.1, 0.0125): the top end decides, the same 0.1,
    # codes [7, -1, 4, 0]. (Dividing hi by 8 would give a scale of 0.0875, and 0.7 would
    # clip to 7 * 0.0875 = 0.6125.)
    w = np.array([[0.7, 0.0, 0.7], [-0.8, 0.0, -0.1], [0.35, 0.0, 0.35], [0.1, 0.0, 0.0]],
                 dtype=np.float32)
    out = impl.fake_quant_int4(w, 4)
    s16 = float(np.float16(0.1))
    assert s16 == 0.0999755859375
    assert out.dtype == np.float32 and out.shape == (4, 3)
    assert out[:, 0].tolist() == [np.float32(c * s16) for c in (7, -8, 4, 1)]
    assert out[:, 1].tolist() == [0.0] * 4
    assert out[:, 2].tolist() == [np.float32(c * s16) for c in (7, -1, 4, 0)]
    # group size 1: every weight is its own group and lands on code 7 (or -8) of its own
    # scale, so only the fp16 rounding of the scale is left (< 2^-11 relative)
    np.testing.assert_allclose(impl.fake_quant_int4(w, 1), w, rtol=2**-11)
    assert w[2, 0] == np.float32(0.35)  # not modified


def test_int4_groups_run_along_in_features():
    # A 100x outlier at w[0, 0] coarsens only its own group: rows 0..31 of column 0.
    # Groups cut along out (within row 0) would coarsen w[0, 1..31] instead.
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    w[0, 0] = 100.0
    out = impl.fake_quant_int4(w, 32)
    assert rel(w[0, 1:32], out[0, 1:32]) < 0.2
    assert rel(w[32:, 0], out[32:, 0]) < 0.2
    assert rel(w[1:32, 0], out[1:32, 0]) > 0.5  # the outlier's group: mostly rounded to 0


def test_smaller_groups_cost_bits_and_buy_accuracy():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((576, 64)).astype(np.float32)
    e32 = rel(w, impl.fake_quant_int4(w, 32))
    e64 = rel(w, impl.fake_quant_int4(w, 64))
    e576 = rel(w, impl.fake_quant_int4(w, 576))
    # measured 0.1073, 0.1189, 0.1450
    assert e32 < e64 < e576
    assert 0.09 < e32 < 0.13


def test_int4_rejects_bad_groups():
    w = np.ones((576, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="group_size must be an integer >= 1 dividing "
                                         "in_features 576, got 128"):
        impl.fake_quant_int4(w, 128)  # SmolLM2's hidden size has no group of 128
    with pytest.raises(ValueError, match="group_size must be"):
        impl.fake_quant_int4(w, 0)
    with pytest.raises(ValueError, match="w must be a non-empty 2-D"):
        impl.fake_quant_int4(np.ones(32), 32)


def test_fp8_dynamic_round_trip():
    # amax 8 -> scale 8/448 = 1/56; w / scale = 56, 112, -224, 28, 14, 448, all E4M3 values
    w = np.array([[1.0, 2.0, -4.0], [0.5, 0.25, 8.0]], dtype=np.float32)
    np.testing.assert_allclose(impl.fake_quant_fp8(w, "tensor"), w, rtol=1e-6)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((256, 32)).astype(np.float32)
    for per in ("tensor", "channel"):
        out = impl.fake_quant_fp8(w, per)
        assert out.dtype == np.float32 and np.isfinite(out).all()
        # 3 mantissa bits: each value within 1/16 of itself (normal range); measured 2.3%
        assert 0.015 < rel(w, out) < 0.035
    # the default is per tensor; all zeros stay zeros
    np.testing.assert_array_equal(impl.fake_quant_fp8(w), impl.fake_quant_fp8(w, "tensor"))
    assert not impl.fake_quant_fp8(np.zeros((4, 2)), "channel").any()


def test_fp8_static_scale_saturates_instead_of_nan():
    # scale 1: 1000 is far beyond E4M3's 448. ml_dtypes casts it to NaN; clamped it is 448.
    w = np.array([[1000.0, 1.0], [-3.0, -700.0]], dtype=np.float32)
    out = impl.fake_quant_fp8(w, "tensor", scale=1.0)
    assert out.tolist() == [[448.0, 1.0], [-3.0, -448.0]]
    # per channel, one scale per output column (3 of them for a [2, 3] weight):
    # column 0 scale 2 -> 1000/2 = 500 -> 448 -> 896; columns 1 and 2 scale 1
    w3 = np.array([[1000.0, 1.0, 0.5], [-3.0, -700.0, 2.0]], dtype=np.float32)
    out = impl.fake_quant_fp8(w3, "channel", scale=[2.0, 1.0, 1.0])
    assert out.tolist() == [[896.0, 1.0, 0.5], [-3.0, -448.0, 2.0]]
    with pytest.raises(ValueError, match="scale must be one number > 0"):
        impl.fake_quant_fp8(w, "tensor", scale=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"scale must be \(3,\) > 0"):
        impl.fake_quant_fp8(w3, "channel", scale=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"scale must be \(2,\) > 0"):
        impl.fake_quant_fp8(w, "channel", scale=[1.0, 0.0])
    with pytest.raises(ValueError, match="per must be 'tensor' or 'channel'"):
        impl.fake_quant_fp8(w, "row")


def test_fp8_per_channel_keeps_quiet_columns():
    # Columns 4..7 are a million times quieter. One scale for the tensor puts them at
    # w / scale ~ 2e-4, below E4M3's smallest subnormal (2^-9): they round to 0.
    # Their own scales keep them at 3 mantissa bits like the loud columns.
    rng = np.random.default_rng(6)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    w[:, 4:] *= 1e-6
    tensor = impl.fake_quant_fp8(w, "tensor")
    channel = impl.fake_quant_fp8(w, "channel")
    assert not tensor[:, 4:].any()
    assert rel(w[:, 4:], channel[:, 4:]) < 0.035
    # the loud columns do equally well either way
    assert rel(w[:, :4], tensor[:, :4]) < 0.035 and rel(w[:, :4], channel[:, :4]) < 0.035


def test_requantize_dispatches_to_each_format():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    keep = w.copy()
    for fmt in ("q8_0", "q4_0", "q4_1", "mxfp4"):
        np.testing.assert_array_equal(impl.requantize(w, fmt), impl.gguf_round_trip(w, fmt))
    np.testing.assert_array_equal(impl.requantize(w, "int4_g32"), impl.fake_quant_int4(w, 32))
    np.testing.assert_array_equal(impl.requantize(w, "int4_g64"), impl.fake_quant_int4(w, 64))
    np.testing.assert_array_equal(impl.requantize(w, "fp8_tensor"),
                                  impl.fake_quant_fp8(w, "tensor"))
    np.testing.assert_array_equal(impl.requantize(w, "fp8_channel"),
                                  impl.fake_quant_fp8(w, "channel"))
    np.testing.assert_array_equal(w, keep)
    # measured on N(0, 1): q8_0 0.45%, q4_0 11.5%, mxfp4 13.4%, int4_g32 10.1%
    errs = {f: rel(w, impl.requantize(w, f)) for f in ("q8_0", "q4_0", "mxfp4", "int4_g32")}
    assert errs["q8_0"] < 0.01
    assert all(0.05 < errs[f] < 0.2 for f in ("q4_0", "mxfp4", "int4_g32"))


def test_requantize_rejects_unknown_formats_and_bad_weights():
    w = np.ones((64, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="fmt must be one of q8_0, q4_1, q4_0, mxfp4, int4_g32"):
        impl.requantize(w, "nvfp4")  # counted in bits_per_weight, no quantizer here
    with pytest.raises(ValueError, match="fmt must be one of"):
        impl.requantize(w, "int8")
    with pytest.raises(ValueError, match="w: in_features must be a multiple of 32"):
        impl.requantize(np.ones((48, 4)), "q8_0")
    with pytest.raises(ValueError, match="group_size must be"):
        impl.requantize(np.ones((96, 4)), "int4_g64")
    with pytest.raises(ValueError, match="w must hold only finite"):
        impl.requantize(np.full((64, 4), np.inf), "fp8_tensor")


# ---------------------------------------------------------------- the KV-cache calculator


# Qwen2.5-0.5B's linear weights per layer as vLLM holds them, fused: [in, out] of
# qkv_proj (896 + 2 x 128 outputs), o_proj, gate_up_proj (2 x 4864), down_proj
QWEN_LINEAR = [(896, 1152), (896, 896), (896, 9728), (4864, 896)]


def test_kv_calculator_and_the_seed_claim():
    # quantization="fp8" on a 16-bit checkpoint: each fused weight gets one fp32 scale
    # (Fp8OnlineLinearMethod calls scaled_fp8_quant once per layer), so every linear
    # weight goes from 16 bits to bits_per_weight("fp8_tensor", shape).
    freed_bits = sum(24 * k * n * (16 - impl.bits_per_weight("fp8_tensor", (k, n)))
                     for k, n in QWEN_LINEAR)
    freed = round(freed_bits / 8)
    # one byte per weight, minus 4 bytes of scale for each of 4 x 24 tensors
    assert freed == 24 * sum(k * n for k, n in QWEN_LINEAR) - 4 * 24 * 4 == 357_826_176
    # Qwen2.5-0.5B's KV: 24 layers, K and V, 2 KV heads of 64, fp16
    per_token = impl.kv_bytes_per_token(24, 2, 64, 2)
    assert per_token == 12_288
    # 357,826,176 / 12,288 = 29,119.97 tokens; 1,819 whole blocks of 16
    assert impl.extra_kv_tokens(freed, per_token) == (29_119, 1_819)
    # "+75% blocks" needs a whole 16-bit KV pool of freed / 0.75 bytes = 477 MB
    # (38,826 tokens): less than the 16-bit model's own weights (about 988 MB). A 24 GiB
    # card at 0.9 utilisation leaves about 20 GB of pool: the gain is under 2%.
    assert impl.extra_kv_tokens(freed * 4 // 3, per_token)[0] == 38_826
    pool = 20 * 10**9 // per_token
    assert impl.extra_kv_tokens(freed, per_token)[0] / pool < 0.02
    with pytest.raises(ValueError, match="kv_heads must be an integer >= 1"):
        impl.kv_bytes_per_token(24, 0, 64, 2)
    with pytest.raises(ValueError, match="freed_bytes must be an integer >= 0"):
        impl.extra_kv_tokens(-1, 12_288)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        impl.extra_kv_tokens(1, 12_288, block_size=0)
    # run.py reads the two start-up lines the measurement rests on (it imports no vllm
    # at module level, so this runs on the CPU)
    spec = importlib.util.spec_from_file_location("lab02_run", HERE / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    log = ("INFO 01-01 [gpu_model_runner.py:5133] Model loading took 0.9254 GiB memory and "
           "3.141593 seconds\nINFO 01-01 [kv_cache_utils.py:1733] GPU KV cache size: "
           "1,234,567 tokens\n")
    assert run.parse_vllm_log(log) == {"weights_gib": 0.9254, "kv_tokens": 1_234_567}
    assert run.parse_vllm_log("nothing here") == {"weights_gib": None, "kv_tokens": None}


# ---------------------------------------------------------------- SmolLM2

PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top "
          "he could see the whole bay and the fishing boats.")
# Six of the 30 layers keep the suite inside its CPU budget: each format costs one
# requantization of 6 x 3.5M weights and one 26-token forward. python solution.py
# requantizes all 30 layers on 256 tokens; the ordering of the formats is the same.
LAYERS = (0, 5, 10, 15, 20, 25)


@pytest.fixture(scope="module")
def smollm2():
    """The model, the prompt's ids, reference logits and a lazy per-format measurement."""
    pytest.importorskip("gguf")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mini_vllm.models import get_model
    from mini_vllm.models.hub import model_path

    if model_path("smollm2") is None:
        pytest.skip("SmolLM2 not downloaded: python -m mini_vllm download smollm2")
    with threadpoolctl.threadpool_limits(1, "blas"):
        model = get_model("smollm2")
        ids = model.tokenizer.encode(PROMPT)
        ref = impl.all_logits(model, ids)
    cache = {}

    def damage(fmt):
        if fmt not in cache:
            with threadpoolctl.threadpool_limits(1, "blas"):
                q = impl.all_logits(impl.requantized_model(model, fmt, LAYERS), ids)
            cache[fmt] = (impl.kl_divergence(ref, q), impl.top1_agreement(ref, q),
                          impl.perplexity(q, ids))
        return cache[fmt]

    return model, ids, ref, damage


@pytest.mark.model
def test_q4_1_round_trip_of_the_reference_is_exact(smollm2):
    # The reference IS Q4_1 dequantized; requantizing to Q4_1 finds the same blocks,
    # so the weights come back bit for bit (the damage of the shipped format is 0).
    model = smollm2[0]
    layer = model.weights.layers[0]
    for field in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        w = getattr(layer, field)
        np.testing.assert_array_equal(impl.requantize(w, "q4_1"), w)
        assert impl.bits_per_weight("q4_1", w.shape) == 5.0


@pytest.mark.model
def test_reference_logits_and_perplexity(smollm2):
    model, ids, ref, damage = smollm2
    assert len(ids) == 26 and ref.shape == (26, 49152)
    # measured 103.135 on the 2-core box (float32 forward; summation order moves it ~1e-5)
    assert impl.perplexity(ref, ids) == pytest.approx(103.135, rel=1e-3)
    before = model.weights.layers[0].qkv_proj.copy()
    damage("int4_g64")
    # the cached session model was not touched: a new model got new weights
    np.testing.assert_array_equal(model.weights.layers[0].qkv_proj, before)


@pytest.mark.model
def test_q8_0_is_nearly_lossless(smollm2):
    kl, top1, _ = smollm2[3]("q8_0")
    # measured KL 1.6e-4 nats, top-1 26/26 (all 30 layers on this prompt: 1.6e-3, 96%)
    assert kl < 1e-3
    assert top1 >= 0.95


@pytest.mark.model
def test_four_bit_formats_cost_two_orders_of_magnitude_more(smollm2):
    damage = smollm2[3]
    q8 = damage("q8_0")[0]
    g32, g64 = damage("int4_g32")[0], damage("int4_g64")[0]
    # measured 0.053 and 0.080: twice the scales, a third less damage
    assert g32 < g64
    assert min(g32, g64) > 100 * q8  # measured 330x
    assert g64 < 0.5


@pytest.mark.model
def test_fp8_sits_between_q8_0_and_int4(smollm2):
    damage = smollm2[3]
    fp8 = damage("fp8_channel")[0]
    # measured 2.2e-3: 14x Q8_0 (3 mantissa bits against int8 steps of amax/127 per
    # 32 weights), 24x below int4 group 32
    assert 3 * damage("q8_0")[0] < fp8 < damage("int4_g32")[0] / 5
