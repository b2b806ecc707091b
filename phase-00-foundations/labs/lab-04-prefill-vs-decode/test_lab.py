"""Lab 00-04 — the roofline numbers of the Phase 00 guide, each pinned."""
from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402

A100 = (impl.A100_PEAK_FLOPS, impl.A100_BANDWIDTH)
H100 = (impl.H100_PEAK_FLOPS, impl.H100_BANDWIDTH)
N8 = impl.LLAMA_8B_ROUND


def test_a100_ridge_point():
    assert impl.ridge_point(*A100) == 156.0


def test_intensity_is_just_tokens_over_dtype():
    # the parameter count cancels: 8B and 70B give the same intensity
    for tokens in (1, 64, 2048):
        small = impl.arithmetic_intensity(8e9, tokens, 2)
        big = impl.arithmetic_intensity(70e9, tokens, 2)
        assert small == big == tokens
    assert impl.arithmetic_intensity(8e9, 1, 1) == 2.0  # fp8 weights: 2 FLOPs per byte


def test_single_decode_is_hopelessly_bandwidth_bound():
    ridge = impl.ridge_point(*A100)
    i = impl.arithmetic_intensity(N8, 1, 2)
    assert i == 1.0
    assert not impl.is_compute_bound(i, ridge)
    assert round(100 * impl.compute_utilization(i, ridge), 2) == 0.64  # percent of peak


def test_decode_step_memory_time_dwarfs_compute_time():
    mem = impl.step_time(N8, 1, 2, *A100)
    assert mem == pytest.approx(0.008)  # 16 GB at 2 TB/s: 8 ms
    compute_only = 2 * N8 / impl.A100_PEAK_FLOPS  # 16 GFLOP at 312 TFLOP/s
    assert 2 * N8 == 16e9  # the guide's "about 16 billion FLOPs" per token
    assert round(compute_only * 1e3, 3) == 0.051  # ms
    assert mem / compute_only == pytest.approx(156.0)  # the ridge again, not "about 160"


def test_prefill_is_compute_bound():
    ridge = impl.ridge_point(*A100)
    i = impl.arithmetic_intensity(N8, 2048, 2)
    assert i == 2048.0 and impl.is_compute_bound(i, ridge)
    assert impl.compute_utilization(i, ridge) == 1.0
    t = impl.step_time(N8, 2048, 2, *A100)
    assert round(2 * N8 * 2048 / 1e12, 1) == 32.8  # TFLOP of math for the prompt
    assert round(2 * N8 * 8192 / 1e12) == 131  # and for an 8k prompt (INTERVIEW.md, Q5)
    assert impl.is_compute_bound(impl.arithmetic_intensity(N8, 8192, 0.5), ridge)  # even in int4
    assert round(t * 1e3) == 105  # the floor on TTFT for a 2,048-token prompt, in ms
    assert round(2048 / t) == 19_500  # tokens per second once compute-bound


def test_critical_batch_size_is_the_ridge():
    ridge = impl.ridge_point(*A100)
    assert impl.critical_batch_size(ridge, 2) == 156
    assert not impl.is_compute_bound(impl.arithmetic_intensity(N8, 155, 2), ridge)
    assert impl.is_compute_bound(impl.arithmetic_intensity(N8, 156, 2), ridge)
    assert impl.critical_batch_size(ridge, 1) == 78  # fp8 weights halve it
    # a fractional ridge (the H100's 295.2) rounds up: 295 tokens would still be memory-bound
    h100 = impl.ridge_point(*H100)
    assert impl.critical_batch_size(h100, 2) == 296
    assert not impl.is_compute_bound(impl.arithmetic_intensity(N8, 295, 2), h100)


def test_decode_speed_limit_8b_fp16():
    assert impl.decode_tokens_per_second(N8, 1, 2, *A100) == pytest.approx(125.0)
    real = impl.decode_tokens_per_second(impl.LLAMA_3_1_8B_PARAMS, 1, 2, *A100)
    assert round(real, 1) == 124.5
    assert impl.step_time(1e9, 1, 2, *A100) == pytest.approx(0.001)  # a 1B model: about 1 ms


def test_batching_multiplies_decode_throughput_for_free():
    one = impl.decode_tokens_per_second(N8, 1, 2, *A100)
    b64 = impl.decode_tokens_per_second(N8, 64, 2, *A100)
    assert b64 == pytest.approx(8000.0) == pytest.approx(64 * one)
    assert impl.step_time(N8, 64, 2, *A100) == impl.step_time(N8, 1, 2, *A100)
    # past the ridge the free lunch ends: throughput plateaus
    assert impl.decode_tokens_per_second(N8, 156, 2, *A100) == pytest.approx(19_500.0)
    assert impl.decode_tokens_per_second(N8, 512, 2, *A100) == pytest.approx(19_500.0)


def test_the_script_table_rows():
    # tokens per step -> (step ms, tokens/s), as `python solution.py` prints them
    expected = {1: (8.00, 125), 8: (8.00, 1000), 64: (8.00, 8000), 156: (8.00, 19500),
                512: (26.26, 19500), 2048: (105.03, 19500)}
    for tokens, (ms, tps) in expected.items():
        t = impl.step_time(N8, tokens, 2, *A100)
        assert (round(1e3 * t, 2), round(tokens / t)) == (ms, tps)


def test_smaller_weights_raise_the_decode_ceiling():
    assert impl.decode_tokens_per_second(N8, 1, 1, *A100) == pytest.approx(250.0)  # fp8
    assert impl.decode_tokens_per_second(N8, 1, 0.5, *A100) == pytest.approx(500.0)  # int4


def test_h100_numbers():
    assert round(impl.ridge_point(*H100), 1) == 295.2
    assert round(impl.decode_tokens_per_second(N8, 1, 2, *H100), 1) == 209.4


def test_roofline_shape():
    peak, bw = A100
    assert impl.attainable_flops(1.0, peak, bw) == 2.0e12
    assert impl.attainable_flops(156.0, peak, bw) == peak
    assert impl.attainable_flops(2048.0, peak, bw) == peak


def test_littles_law_sizes_the_batch():
    assert impl.sequences_in_flight(1000, 0.050) == pytest.approx(50.0)


def test_kv_reads_catch_up_with_weight_reads():
    # batch 64 of Llama-3.1-8B (128 KiB of KV per token): past ~1,907 tokens of
    # context per sequence, a decode step reads more KV than weights
    assert round(impl.kv_crossover_context(16e9, 64, 131_072)) == 1907
    assert round(impl.kv_crossover_context(16e9, 1, 131_072)) == 122_070


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: impl.ridge_point(312e12, 0), "bandwidth"),
        (lambda: impl.arithmetic_intensity(8e9, 0, 2), "num_tokens"),
        (lambda: impl.decode_tokens_per_second(8e9, 1, 2, 0, 2e12), "peak_flops"),
        (lambda: impl.critical_batch_size(156.0, -1), "dtype_bytes"),
        (lambda: impl.sequences_in_flight(1000, 0), "itl_seconds"),
    ],
)
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# A valid call of every function; each parameter the README says must be > 0 is then
# set to 0 and to a negative value (rejected, naming it) and to a tiny positive value
# (accepted).
VALID_CALLS = {
    "ridge_point": dict(peak_flops=312e12, bandwidth=2e12),
    "arithmetic_intensity": dict(num_params=8e9, num_tokens=1, dtype_bytes=2),
    "attainable_flops": dict(intensity=1.0, peak_flops=312e12, bandwidth=2e12),
    "is_compute_bound": dict(intensity=1.0, ridge=156.0),
    "compute_utilization": dict(intensity=1.0, ridge=156.0),
    "critical_batch_size": dict(ridge=156.0, dtype_bytes=2),
    "step_time": dict(num_params=8e9, num_tokens=1, dtype_bytes=2, peak_flops=312e12,
                      bandwidth=2e12),
    "decode_tokens_per_second": dict(num_params=8e9, batch=1, dtype_bytes=2, peak_flops=312e12,
                                     bandwidth=2e12),
    "sequences_in_flight": dict(tokens_per_second=1000.0, itl_seconds=0.05),
    "kv_crossover_context": dict(weight_bytes=16e9, batch=64, kv_bytes_per_token=131072),
}
CHECKED = [
    (fn, param) for fn, kwargs in VALID_CALLS.items() for param in kwargs
    if (fn, param) not in {("attainable_flops", "peak_flops"), ("attainable_flops", "bandwidth"),
                           ("is_compute_bound", "intensity"), ("compute_utilization", "intensity")}
]


@pytest.mark.parametrize(("function", "param"), CHECKED, ids=[f"{f}-{p}" for f, p in CHECKED])
def test_every_positive_parameter_is_checked(function, param):
    fn = getattr(impl, function)
    kwargs = VALID_CALLS[function]
    assert fn(**{**kwargs, param: 1e-3 if param != "num_tokens" and param != "batch" else 1}) > 0
    for bad in (0, -1):
        with pytest.raises(ValueError, match=param):
            fn(**{**kwargs, param: bad})


def test_fractional_results_are_not_rounded():
    # 3 tokens of fp32 weights: 1.5 FLOPs per byte, not 1
    assert impl.arithmetic_intensity(8e9, 3, 4) == 1.5
    assert impl.kv_crossover_context(16e9, 64, 131_072) == 1907.3486328125
    assert impl.compute_utilization(1.0, 156.0) == 1 / 156
    assert impl.sequences_in_flight(30.0, 0.05) == pytest.approx(1.5)
    assert impl.critical_batch_size(156.0, 0.5) == 39 and impl.critical_batch_size(157.0, 0.5) == 40


def test_the_two_sides_of_the_ridge():
    ridge = impl.ridge_point(*A100)
    assert impl.is_compute_bound(ridge, ridge)  # exactly at the ridge: compute-bound
    assert not impl.is_compute_bound(ridge - 1e-9, ridge)
    assert impl.compute_utilization(ridge, ridge) == 1.0
    assert impl.compute_utilization(4 * ridge, ridge) == 1.0  # capped, never above peak
    peak, bw = A100
    assert impl.attainable_flops(155.0, peak, bw) == 155.0 * bw  # below: bandwidth-limited
    assert impl.attainable_flops(1e6, peak, bw) == peak
    # step time is the slower of the two, not their sum: at the ridge they are equal
    at_ridge = impl.step_time(N8, 156, 2, *A100)
    assert at_ridge == pytest.approx(N8 * 2 / impl.A100_BANDWIDTH)
    assert impl.step_time(N8, 157, 2, *A100) == pytest.approx(2 * N8 * 157 / impl.A100_PEAK_FLOPS)


def test_exercise_70b_on_eight_a100s():
    # EXERCISES.md: Llama-3.1-70B split evenly over 8 GPUs (communication ignored)
    per_gpu = 70_553_706_496 / 8
    assert round(2 * 70_553_706_496 * 8192 / 1e15, 2) == 1.16  # PFLOP for the prompt
    assert round(impl.step_time(per_gpu, 1, 2, *A100) * 1e3, 1) == 8.8  # ms per decode step
    assert round(impl.step_time(per_gpu, 8192, 2, *A100), 2) == 0.46  # s for an 8k prefill
