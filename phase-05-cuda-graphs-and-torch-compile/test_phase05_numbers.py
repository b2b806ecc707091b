"""Every worked number in Phase 05's guide and cheatsheet, recomputed.

The pages quote these values; if one of them changes here, the text is wrong. Numbers that rest
on an assumption (a launch cost, a bandwidth, a kernel count per layer) take it from the
ASSUMPTIONS block below, which the guide states in the same words. Pure Python, standard library
only, well under a second; the two tests that read ``upstream/`` skip when it is absent.
"""

from __future__ import annotations

import math
import re

import pytest

import course

UPSTREAM = course.UPSTREAM

# -- ASSUMPTIONS (labelled as such in the guide, section 1) ----------------------------------
LAUNCH_US = 5.0                 # CPU time to issue one kernel from eager PyTorch, in µs
KERNELS_PER_LAYER = 10          # add+norm, QKV, RoPE, KV write, attention, O, add+norm,
                                # gate_up, SiLU*mul, down
KERNELS_PER_STEP_EXTRA = 4      # embedding, final norm, LM head, sampling
HBM_BYTES_PER_S = 3.35e12       # H100 SXM datasheet peak; real kernels reach less
BF16_FLOPS = 989e12             # H100 SXM dense bf16 datasheet peak
CONTEXT = 1000                  # tokens of context per request, for the KV term
BYTES_PER_PARAM = 2             # bf16


def matrix_params(layers, hidden, inter, vocab, kv_heads, head_dim, heads, tied):
    """Weight-matrix parameters of a Llama-style model (norm vectors and biases left out)."""
    per_layer = (hidden * heads * head_dim * 2       # q and o
                 + 2 * hidden * kv_heads * head_dim  # k and v
                 + 3 * hidden * inter)               # gate, up, down
    return layers * per_layer + vocab * hidden * (1 if tied else 2)


# Published configs (config.json of each model on the Hugging Face Hub).
QWEN_05B = dict(layers=24, hidden=896, inter=4864, vocab=151936, kv_heads=2, head_dim=64,
                heads=14, tied=True)
LLAMA_8B = dict(layers=32, hidden=4096, inter=14336, vocab=128256, kv_heads=8, head_dim=128,
                heads=32, tied=False)


def kv_bytes_per_token(m):
    return m["layers"] * 2 * m["kv_heads"] * m["head_dim"] * BYTES_PER_PARAM


def cpu_us(m):
    return (m["layers"] * KERNELS_PER_LAYER + KERNELS_PER_STEP_EXTRA) * LAUNCH_US


def gpu_us(m, batch):
    """Lower bound: every weight and every request's KV read once from HBM."""
    weights = matrix_params(**m) * BYTES_PER_PARAM
    return (weights + batch * CONTEXT * kv_bytes_per_token(m)) / HBM_BYTES_PER_S * 1e6


def test_model_sizes():
    assert matrix_params(**QWEN_05B) == 493_961_216            # "0.49B"
    assert matrix_params(**LLAMA_8B) == 8_029_995_008          # "8.03B"
    assert matrix_params(**QWEN_05B) * 2 == 987_922_432        # 0.99 GB of bf16 weights
    assert matrix_params(**LLAMA_8B) * 2 == 16_059_990_016     # 16.06 GB
    assert kv_bytes_per_token(QWEN_05B) == 12_288              # 12 KiB per token
    assert kv_bytes_per_token(LLAMA_8B) == 131_072             # 128 KiB per token


def test_launches_and_cpu_time_per_step():
    assert QWEN_05B["layers"] * KERNELS_PER_LAYER + KERNELS_PER_STEP_EXTRA == 244
    assert LLAMA_8B["layers"] * KERNELS_PER_LAYER + KERNELS_PER_STEP_EXTRA == 324
    assert cpu_us(QWEN_05B) == 1220.0 and cpu_us(LLAMA_8B) == 1620.0


def test_gpu_floor_at_batch_1_and_64():
    assert round(gpu_us(QWEN_05B, 1)) == 299
    assert round(gpu_us(QWEN_05B, 64)) == 530
    assert round(gpu_us(LLAMA_8B, 1)) == 4833
    assert round(gpu_us(LLAMA_8B, 64)) == 7298


def test_who_waits():
    # 0.5B at batch 1: the CPU needs 1220 µs, the GPU at least 299: the GPU idles >= 75%
    ratio = cpu_us(QWEN_05B) / gpu_us(QWEN_05B, 1)
    assert round(ratio, 2) == 4.09
    assert round(1 - gpu_us(QWEN_05B, 1) / cpu_us(QWEN_05B), 2) == 0.76
    # 8B at batch 1: the GPU is the bottleneck under these assumptions
    assert gpu_us(LLAMA_8B, 1) > cpu_us(LLAMA_8B)


def test_batch_where_the_gpu_catches_up():
    """The largest batch at which the 0.5B step is still launch-bound."""
    m = QWEN_05B
    budget = cpu_us(m) * 1e-6 * HBM_BYTES_PER_S - matrix_params(**m) * BYTES_PER_PARAM
    b_star = math.floor(budget / (CONTEXT * kv_bytes_per_token(m)))
    assert b_star == 252
    assert gpu_us(m, 252) < cpu_us(m) < gpu_us(m, 253)


def test_memory_bound_below_the_ridge():
    # a bf16 GEMM over B token rows does 2*P*B flops on 2*P bytes of weights: B flops/byte
    assert round(BF16_FLOPS / HBM_BYTES_PER_S) == 295
    assert 252 < 295


def test_tokens_per_second_and_launch_cost_per_token():
    assert round(1e6 / cpu_us(QWEN_05B)) == 820          # eager, batch 1, launch-bound
    assert round(1e6 / gpu_us(QWEN_05B, 1)) == 3349      # at the HBM floor
    assert cpu_us(QWEN_05B) / 64 == pytest.approx(19.06, abs=0.01)   # µs of launch per token


def test_piecewise_and_full_launch_counts():
    layers = QWEN_05B["layers"]
    submodules = 2 * layers + 1
    compiled, splitting = layers + 1, layers
    assert (submodules, compiled, splitting) == (49, 25, 24)
    piecewise = compiled + splitting * 2        # one replay per piece; KV write + attention eager
    assert piecewise == 73
    assert piecewise * LAUNCH_US == 365.0
    assert round(cpu_us(QWEN_05B) / max(piecewise * LAUNCH_US, gpu_us(QWEN_05B, 1)), 2) == 3.34
    assert round(cpu_us(QWEN_05B) / max(1 * LAUNCH_US, gpu_us(QWEN_05B, 1)), 2) == 4.09
    # the two-layer tiny model of lab 06
    assert (2 * 2 + 1, 2 + 1, 2) == (5, 3, 2)


def test_replay_simulator_counts():
    # lab 01: 100 calls of a 3-op function
    calls, ops = 100, 3
    assert calls * ops == 300
    assert ops + (calls - 1) == 102
    # lab 02: the second call is where graphs break even; the ratio tends to num_ops
    for n in (2, 3, 50):
        eager = [k * n for k in (1, 2)]
        graph = [n + (k - 1) for k in (1, 2)]
        assert graph[0] == eager[0] and graph[1] < eager[1]
    assert [1 * k for k in (1, 2)] == [1 + (k - 1) for k in (1, 2)]   # n == 1: never
    k = 10_000
    assert round(k * 300 / (300 + k - 1), 1) == 291.3


def ladder(max_num_seqs, max_num_batched_tokens, spec=0, mode="balanced"):
    """vllm/config/vllm.py:1597 _set_cudagraph_sizes, transcribed (lab 05 builds it)."""
    cap = min(min(max_num_seqs * (1 + spec) * 2, 512), max_num_batched_tokens)
    head = range(1, min(cap, 32) + 1) if mode == "interactivity" else [s for s in (1, 2, 4) if s <= cap]
    sizes = [*head, *range(8, min(cap + 1, 256), 8), *range(256, cap + 1, 16)]
    if max_num_batched_tokens <= cap:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def pad(n, sizes):
    return next((s for s in sizes if s >= n), None)


def test_capture_ladder():
    small, big = ladder(256, 8192), ladder(1024, 16384)
    assert small == big and len(small) == 51 and small[:6] == [1, 2, 4, 8, 16, 24]
    assert small[-3:] == [480, 496, 512]
    assert len(ladder(1024, 8192, mode="interactivity")) == 76
    assert len([s for s in small if s <= 256]) == 35          # FULL decode keys
    assert 51 + 35 == 86                                      # graphs at start-up
    assert ladder(8, 2048) == [1, 2, 4, 8, 16]
    assert len(ladder(256, 8192)) != 67                       # not "every 8 up to 512"
    assert len([1, 2, 4] + list(range(8, 513, 8))) == 67


def test_padding_examples():
    sizes = ladder(256, 8192)
    assert (pad(33, sizes), pad(249, sizes), pad(257, sizes), pad(512, sizes)) == (40, 256, 272, 512)
    assert pad(513, sizes) is None
    assert round(7 / 33, 3) == 0.212 and round(7 / 40, 3) == 0.175
    # the worst pad in each stretch of the ladder, over real rows
    assert round(7 / 9, 2) == 0.78 and round(15 / 257, 3) == 0.058


@pytest.mark.upstream
def test_default_modes_at_the_pin():
    path = UPSTREAM / "vllm/config/vllm.py"
    text = path.read_text(encoding="utf-8")
    modes = []
    for level in range(4):
        body = text[text.index(f"OPTIMIZATION_LEVEL_0{level} = {{"):]
        modes.append(re.search(r'"cudagraph_mode": CUDAGraphMode\.(\w+)', body).group(1))
    assert modes == ["NONE", "PIECEWISE", "FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE"]
    assert "optimization_level: OptimizationLevel = OptimizationLevel.O2" in text


@pytest.mark.upstream
def test_enum_values_at_the_pin():
    path = UPSTREAM / "vllm/config/compilation.py"
    text = path.read_text(encoding="utf-8")
    for name, value in [("NONE", 0), ("STOCK_TORCH_COMPILE", 1), ("DYNAMO_TRACE_ONCE", 2),
                        ("VLLM_COMPILE", 3)]:
        assert f"    {name} = {value}\n" in text
    assert "    FULL_DECODE_ONLY = (FULL, NONE)\n" in text
    assert "    FULL_AND_PIECEWISE = (FULL, PIECEWISE)\n" in text
    backend = (UPSTREAM / "vllm/v1/attention/backend.py").read_text(encoding="utf-8")
    for name, value in [("ALWAYS", 3), ("UNIFORM_BATCH", 2), ("UNIFORM_SINGLE_TOKEN_DECODE", 1),
                        ("NEVER", 0)]:
        assert f"    {name} = {value}\n" in backend


def test_prefill_is_not_launch_bound():
    flops = 2 * matrix_params(**QWEN_05B) * 2000         # a 2,000-token prompt
    assert round(flops / 1e12, 1) == 2.0
    assert round(flops / BF16_FLOPS * 1e3, 1) == 2.0        # ms at the datasheet peak
    assert flops / BF16_FLOPS * 1e6 > cpu_us(QWEN_05B)
