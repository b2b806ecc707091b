"""Lab 10-03 tests: the TP communication bill, vLLM's all-reduce choice and the alpha-beta fit."""
from __future__ import annotations

import math

from course import load_impl

impl = load_impl(__file__)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

MiB = 1024 * 1024
HIDDEN = 4096            # a 7B-class model's hidden size
LAYERS = 32
STEP_S = 8e-3            # an 8 ms decode step of compute
NVLINK = (450e9, 3e-6)   # bytes/s per direction, seconds per ring step
ETH_10G = (1.25e9, 50e-6)  # 10 Gb/s = 1.25e9 bytes/s


# ---------------------------------------------------------------- payload and ring traffic


def test_payload_is_one_activation_row_per_token():
    # one decode token at hidden 4,096 in bf16: 4,096 x 2 = 8,192 B = 8 KiB
    assert impl.allreduce_payload_bytes(1, HIDDEN) == 8192
    assert impl.allreduce_payload_bytes(1, HIDDEN, dtype_bytes=4) == 16384
    # a 2,048-token prefill chunk: 2,048 x 4,096 x 2 = 16,777,216 B = 16 MiB exactly
    assert impl.allreduce_payload_bytes(2048, HIDDEN) == 16 * MiB
    # a batch of 3 tokens at hidden 10 in fp32: every factor counts once
    assert impl.allreduce_payload_bytes(3, 10, 4) == 120
    assert isinstance(impl.allreduce_payload_bytes(3, 10, 4), int)
    assert impl.allreduce_payload_bytes(1, 1, 1) == 1          # every lower bound is 1, inclusive


def test_ring_traffic_formula():
    p = 8192.0
    # 2 (N - 1) / N: 0 at N = 1, exactly one payload at N = 2, 1.5 at 4, 1.75 at 8
    assert impl.ring_allreduce_traffic_per_rank(p, 1) == 0.0
    assert impl.ring_allreduce_traffic_per_rank(0, 4) == 0.0      # an empty payload is allowed
    assert impl.ring_allreduce_traffic_per_rank(p, 2) == p
    assert impl.ring_allreduce_traffic_per_rank(p, 4) == 1.5 * p
    assert impl.ring_allreduce_traffic_per_rank(p, 8) == 1.75 * p
    # it tends to 2 payloads and never reaches it: 2 - 2/1024 at N = 1024
    big = impl.ring_allreduce_traffic_per_rank(p, 1024)
    assert big == pytest.approx(p * (2 - 2 / 1024), rel=1e-12) and big < 2 * p


def test_allreduce_time_has_a_latency_and_a_bandwidth_term():
    # N = 4, 1 MB payload, 1 GB/s, 10 us per step:
    # traffic 1.5e6 B -> 1.5 ms; 6 steps x 10 us = 60 us
    assert impl.allreduce_time_s(1e6, 4, 1e9, 10e-6) == pytest.approx(1.5e-3 + 60e-6, rel=1e-12)
    # latency alone (infinite bandwidth): 2 (N - 1) steps; 2 steps at N = 2, 14 at N = 8
    assert impl.allreduce_time_s(8192, 2, math.inf, 50e-6) == pytest.approx(100e-6, rel=1e-12)
    assert impl.allreduce_time_s(8192, 8, math.inf, 50e-6) == pytest.approx(700e-6, rel=1e-12)
    # bandwidth alone: an 8 KiB payload at N = 2 over 10 GbE is 8,192 / 1.25e9 = 6.5536 us
    assert impl.allreduce_time_s(8192, 2, 1.25e9, 0.0) == pytest.approx(6.5536e-6, rel=1e-12)
    # one rank: nothing to do
    assert impl.allreduce_time_s(8192, 1, 1e9, 50e-6) == 0.0


def test_allreduces_per_step_count_the_embedding():
    # 2 per layer (attention out + MLP down) + 1 (vocab-parallel embedding)
    assert impl.allreduces_per_step(32) == 65
    assert impl.allreduces_per_step(2) == 5      # tiny-random, as mini_vllm counts it
    assert impl.allreduces_per_step(1) == 3


# ---------------------------------------------------------------- the decode bill


def test_comm_fraction_is_a_share_of_the_whole_step():
    # comm / (compute + comm): 6.4 ms over an 8 ms step is 6.4 / 14.4 = 4/9
    assert impl.comm_fraction(6.4e-3, 8e-3) == pytest.approx(4 / 9, rel=1e-12)
    assert impl.comm_fraction(0.0, 8e-3) == 0.0
    # equal comm and compute: one half (comm / compute would say 1.0)
    assert impl.comm_fraction(3.0, 3.0) == 0.5
    # comm three times compute: 0.75, never above 1 (comm / compute would say 3.0)
    assert impl.comm_fraction(3.0, 1.0) == 0.75


def test_decode_step_comm_on_nvlink_is_noise():
    payload = impl.allreduce_payload_bytes(1, HIDDEN)
    comm = impl.tp_comm_time_per_step(LAYERS, payload, 2, *NVLINK)
    # 65 x (8,192 / 450e9 + 2 x 3 us) = 65 x 6.0182 us = 0.391 ms
    assert comm == pytest.approx(65 * (8192 / 450e9 + 6e-6), rel=1e-12)
    assert comm < 1e-3
    frac = impl.comm_fraction(comm, STEP_S)
    assert frac == pytest.approx(0.0467, abs=1e-4) and frac < 0.10


def test_decode_step_comm_on_ethernet_is_fatal():
    payload = impl.allreduce_payload_bytes(1, HIDDEN)
    # the 64 layer all-reduces' latency alone: 64 x 2 x 50 us = 6.4 ms -> 6.4 / 14.4 = 44.4%
    latency_only = 64 * impl.allreduce_time_s(payload, 2, math.inf, ETH_10G[1])
    assert latency_only == pytest.approx(6.4e-3, rel=1e-12)
    assert impl.comm_fraction(latency_only, STEP_S) == pytest.approx(0.4444, abs=1e-4)
    # the whole bill: 65 all-reduces x (100 us + 6.5536 us) = 6.926 ms -> 46.4% of the step
    comm = impl.tp_comm_time_per_step(LAYERS, payload, 2, *ETH_10G)
    assert comm == pytest.approx(65 * 106.5536e-6, rel=1e-12)
    assert impl.comm_fraction(comm, STEP_S) == pytest.approx(0.4640, abs=1e-4)
    assert impl.comm_fraction(comm, STEP_S) > 0.40


def test_latency_dominates_small_payloads():
    # decode (8 KiB) on 10 GbE at N = 2: bandwidth is 6.55 us of 106.55 us, 6%
    t = impl.allreduce_time_s(8192, 2, *ETH_10G)
    t_lat = impl.allreduce_time_s(8192, 2, math.inf, ETH_10G[1])
    assert t_lat / t == pytest.approx(100 / 106.5536, rel=1e-12) and t_lat / t > 0.9


def test_prefill_payloads_shift_the_balance_to_bandwidth():
    # a 16 MiB prefill all-reduce on 10 GbE at N = 2: 16,777,216 / 1.25e9 = 13.42 ms of
    # bandwidth against 100 us of latency, 99.3% bandwidth
    payload = impl.allreduce_payload_bytes(2048, HIDDEN)
    t = impl.allreduce_time_s(payload, 2, *ETH_10G)
    t_bw = impl.allreduce_time_s(payload, 2, ETH_10G[0], 0.0)
    assert t_bw == pytest.approx(16 * MiB / 1.25e9, rel=1e-12)
    assert t_bw / t == pytest.approx(0.99260, abs=1e-5)


def test_more_ranks_more_overhead():
    payload = impl.allreduce_payload_bytes(1, HIDDEN)
    t2 = impl.tp_comm_time_per_step(LAYERS, payload, 2, *NVLINK)
    t8 = impl.tp_comm_time_per_step(LAYERS, payload, 8, *NVLINK)
    # 14 ring steps instead of 2, and 1.75 payloads instead of 1:
    # 65 x (14,336 / 450e9 + 14 x 3 us) = 2.732 ms, 7x TP = 2's 0.391 ms
    assert t8 == pytest.approx(65 * (1.75 * 8192 / 450e9 + 42e-6), rel=1e-12)
    assert t8 / t2 == pytest.approx(6.9841, abs=1e-4)


# ---------------------------------------------------------------- vLLM's all-reduce dispatch


def test_decode_goes_custom_and_prefill_goes_nccl():
    decode = impl.allreduce_payload_bytes(1, HIDDEN)
    prefill = impl.allreduce_payload_bytes(2048, HIDDEN)
    for world, nvlink in ((2, False), (2, True), (4, True), (8, True)):
        assert impl.choose_allreduce(decode, world, nvlink) == "custom"
        assert impl.choose_allreduce(prefill, world, nvlink) == "nccl"   # 16 MiB > 8 MiB


def test_custom_limit_is_strictly_below_8_mib():
    assert impl.choose_allreduce(8 * MiB - 16, 2, False) == "custom"
    assert impl.choose_allreduce(8 * MiB, 2, False) == "nccl"            # inp_size < max_size
    # a smaller max_size (Hopper with symmetric memory at 8 GPUs: 256 KiB) moves the line
    assert impl.choose_allreduce(256 * 1024 - 16, 8, True, max_size=256 * 1024) == "custom"
    assert impl.choose_allreduce(256 * 1024, 8, True, max_size=256 * 1024) == "nccl"


def test_custom_needs_two_gpus_or_full_nvlink():
    # PCIe-only: two GPUs still go custom, four do not
    assert impl.choose_allreduce(8192, 2, False) == "custom"
    assert impl.choose_allreduce(8192, 4, False) == "nccl"
    assert impl.choose_allreduce(8192, 8, False) == "nccl"
    # world sizes the custom kernel was not built for: NCCL even on full NVLink
    for world in (3, 5, 7, 16):
        assert impl.choose_allreduce(8192, world, True) == "nccl", world
    assert impl.choose_allreduce(8192, 6, True) == "custom"


def test_custom_needs_16_byte_multiples_and_contiguity():
    assert impl.choose_allreduce(8192 + 8, 2, True) == "nccl"            # 8,200 % 16 == 8
    assert impl.choose_allreduce(8192 + 16, 2, True) == "custom"
    assert impl.choose_allreduce(8192, 2, True, contiguous=False) == "nccl"
    assert impl.choose_allreduce(0, 2, True) == "custom"                 # 0 % 16 == 0 and 0 < 8 MiB
    assert impl.choose_allreduce(0, 2, True, max_size=1) == "custom"     # max_size 1 is allowed


def test_one_rank_needs_no_allreduce():
    assert impl.choose_allreduce(8192, 1, True) == "none"
    assert impl.choose_allreduce(16 * MiB, 1, False) == "none"


# ---------------------------------------------------------------- fitting alpha and beta


def test_fit_alpha_beta_recovers_a_line_exactly():
    alpha, beta = 20e-6, 1 / 1.5e9
    sizes = [4096, 65536, 1 * MiB, 4 * MiB, 16 * MiB]
    got = impl.fit_alpha_beta([(n, alpha + beta * n) for n in sizes])
    assert got[0] == pytest.approx(alpha, rel=1e-9) and got[1] == pytest.approx(beta, rel=1e-9)
    # two points define the line; the order of the samples does not matter
    got = impl.fit_alpha_beta([(2000, 3e-3), (1000, 2e-3)])
    assert got[0] == pytest.approx(1e-3, rel=1e-9) and got[1] == pytest.approx(1e-6, rel=1e-9)
    # an empty message (nbytes 0) is a valid sample: it measures alpha alone
    got = impl.fit_alpha_beta([(0, 1e-3), (1000, 2e-3)])
    assert got[0] == pytest.approx(1e-3, rel=1e-9) and got[1] == pytest.approx(1e-6, rel=1e-9)


def test_fit_alpha_beta_is_least_squares():
    # noisy samples: the fit equals numpy's own least-squares line (np.polyfit, degree 1)
    rng = np.random.default_rng(0)
    n = np.array([1e3, 1e4, 1e5, 1e6, 4e6, 1.6e7])
    t = 500e-6 + n / 0.8e9 + rng.normal(0, 50e-6, n.size)
    slope, intercept = np.polyfit(n, t, 1)
    alpha, beta = impl.fit_alpha_beta(zip(n.tolist(), t.tolist(), strict=True))
    assert alpha == pytest.approx(intercept, rel=1e-6) and beta == pytest.approx(slope, rel=1e-6)


# ---------------------------------------------------------------- bad input


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 1"):
        impl.allreduce_payload_bytes(0, HIDDEN)
    with pytest.raises(ValueError, match="hidden_size"):
        impl.allreduce_payload_bytes(1, 4096.0)
    with pytest.raises(ValueError, match="hidden_size must be an integer >= 1"):
        impl.allreduce_payload_bytes(1, 0)
    with pytest.raises(ValueError, match="dtype_bytes"):
        impl.allreduce_payload_bytes(1, HIDDEN, True)
    with pytest.raises(ValueError, match="dtype_bytes must be an integer >= 1"):
        impl.allreduce_payload_bytes(1, HIDDEN, 0)
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        impl.ring_allreduce_traffic_per_rank(8192, 0)
    with pytest.raises(ValueError, match="payload_bytes"):
        impl.ring_allreduce_traffic_per_rank(-1, 2)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        impl.allreduce_time_s(8192, 2, 0.0, 1e-6)
    with pytest.raises(ValueError, match="latency_s"):
        impl.allreduce_time_s(8192, 2, 1e9, -1e-6)
    with pytest.raises(ValueError, match="num_layers must be an integer >= 1"):
        impl.allreduces_per_step(0)
    with pytest.raises(ValueError, match="num_layers"):
        impl.tp_comm_time_per_step(0, 8192, 2, 1e9, 1e-6)
    with pytest.raises(ValueError, match="compute_s"):
        impl.comm_fraction(1e-3, 0.0)
    with pytest.raises(ValueError, match="comm_s"):
        impl.comm_fraction(float("nan"), 1e-3)
    with pytest.raises(ValueError, match="nbytes must be an integer >= 0"):
        impl.choose_allreduce(-16, 2, True)
    with pytest.raises(ValueError, match="world_size"):
        impl.choose_allreduce(16, 0, True)
    with pytest.raises(ValueError, match="max_size"):
        impl.choose_allreduce(16, 2, True, max_size=0)
    with pytest.raises(ValueError, match="at least two distinct nbytes"):
        impl.fit_alpha_beta([(4096, 1e-3), (4096, 2e-3)])
    with pytest.raises(ValueError, match="samples must be .nbytes, seconds. pairs"):
        impl.fit_alpha_beta([(4096, 1e-3, 0), (8192, 2e-3, 0)])
    with pytest.raises(ValueError, match="pairs of finite numbers"):
        impl.fit_alpha_beta([(4096, 1e-3), (8192, float("inf"))])
    with pytest.raises(ValueError, match="seconds > 0"):
        impl.fit_alpha_beta([(4096, 1e-3), (8192, 0.0)])
    with pytest.raises(ValueError, match="nbytes >= 0"):
        impl.fit_alpha_beta([(-4096, 1e-3), (8192, 2e-3)])
