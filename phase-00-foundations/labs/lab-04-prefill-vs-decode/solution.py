"""Lab 00-04 — prefill vs decode: the roofline arithmetic (reference solution).

A first-order model of one forward step of a dense transformer:

* it reads every weight once from GPU memory: ``num_params * dtype_bytes`` bytes;
* it does about 2 FLOPs per parameter per token (one multiply, one add).

Arithmetic intensity (FLOPs per byte) is then ``2 * num_tokens / dtype_bytes``:
the parameter count cancels. The hardware's ridge point (peak FLOP/s divided by
bandwidth in bytes/s) says which side of the roofline a step sits on. Attention
FLOPs and KV-cache reads are left out of the model on purpose; the README says
when that matters, and ``kv_crossover_context`` measures the first of them.
"""
from __future__ import annotations

import math
import sys

# Datasheet figures (dense bf16/fp16 tensor-core peak; HBM bandwidth).
A100_PEAK_FLOPS = 312e12
A100_BANDWIDTH = 2.0e12  # the 80 GB SXM part lists 2,039 GB/s; rounded to 2.0 TB/s
H100_PEAK_FLOPS = 989e12  # H100 SXM, dense bf16 (the 1,979 figure assumes sparsity)
H100_BANDWIDTH = 3.35e12

LLAMA_8B_ROUND = 8e9  # "8 billion", the napkin figure
LLAMA_3_1_8B_PARAMS = 8_030_261_248  # from lab-02's num_params


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """FLOPs per byte at which the roofline turns: peak FLOP/s / bytes per second."""
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def arithmetic_intensity(num_params: float, num_tokens: int, dtype_bytes: float) -> float:
    """FLOPs per byte of one step: 2 * params * tokens over params * dtype_bytes."""
    _positive("num_params", num_params)
    _positive("num_tokens", num_tokens)
    _positive("dtype_bytes", dtype_bytes)
    return (2 * num_params * num_tokens) / (num_params * dtype_bytes)


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: min(peak, bandwidth * intensity)."""
    _positive("intensity", intensity)
    return min(peak_flops, bandwidth * intensity)


def is_compute_bound(intensity: float, ridge: float) -> bool:
    """At or past the ridge the math units, not memory, set the pace."""
    _positive("ridge", ridge)
    return intensity >= ridge


def compute_utilization(intensity: float, ridge: float) -> float:
    """Fraction of peak FLOP/s a step can use: intensity / ridge, capped at 1."""
    _positive("ridge", ridge)
    return min(1.0, intensity / ridge)


def critical_batch_size(ridge: float, dtype_bytes: float) -> int:
    """Smallest whole number of tokens per step whose intensity reaches the ridge."""
    _positive("ridge", ridge)
    _positive("dtype_bytes", dtype_bytes)
    return math.ceil(ridge * dtype_bytes / 2)


def step_time(
    num_params: float, num_tokens: int, dtype_bytes: float, peak_flops: float, bandwidth: float
) -> float:
    """Seconds for one step: the slower of reading the weights and doing the math."""
    _positive("num_params", num_params)
    _positive("num_tokens", num_tokens)
    _positive("dtype_bytes", dtype_bytes)
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    memory_s = num_params * dtype_bytes / bandwidth
    compute_s = 2 * num_params * num_tokens / peak_flops
    return max(memory_s, compute_s)


def decode_tokens_per_second(
    num_params: float, batch: int, dtype_bytes: float, peak_flops: float, bandwidth: float
) -> float:
    """Tokens per second for a decode batch: one token per sequence per step."""
    _positive("batch", batch)
    return batch / step_time(num_params, batch, dtype_bytes, peak_flops, bandwidth)


def sequences_in_flight(tokens_per_second: float, itl_seconds: float) -> float:
    """Little's law for decode: each sequence yields 1/ITL tokens per second."""
    _positive("tokens_per_second", tokens_per_second)
    _positive("itl_seconds", itl_seconds)
    return tokens_per_second * itl_seconds


def kv_crossover_context(weight_bytes: float, batch: int, kv_bytes_per_token: int) -> float:
    """Context length at which a decode step reads as many KV bytes as weight bytes."""
    _positive("weight_bytes", weight_bytes)
    _positive("batch", batch)
    _positive("kv_bytes_per_token", kv_bytes_per_token)
    return weight_bytes / (batch * kv_bytes_per_token)


def main(out: str = "roofline.png") -> None:
    """Print the A100 numbers and draw the roofline with decode and prefill points."""
    ridge = ridge_point(A100_PEAK_FLOPS, A100_BANDWIDTH)
    print(f"A100 ridge point: {ridge:.0f} FLOPs/byte")
    print(f"{'tokens/step':>11} {'intensity':>9} {'bound':>8} {'step ms':>8} {'tokens/s':>9}")
    for tokens in (1, 8, 64, 156, 512, 2048):
        i = arithmetic_intensity(LLAMA_8B_ROUND, tokens, 2)
        t = step_time(LLAMA_8B_ROUND, tokens, 2, A100_PEAK_FLOPS, A100_BANDWIDTH)
        bound = "compute" if is_compute_bound(i, ridge) else "memory"
        print(f"{tokens:>11} {i:>9.0f} {bound:>8} {1e3 * t:>8.2f} {tokens / t:>9.0f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [2 ** (k / 8) for k in range(-8, 8 * 13)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(xs, [attainable_flops(x, A100_PEAK_FLOPS, A100_BANDWIDTH) / 1e12 for x in xs])
    for tokens, label in ((1, "decode b=1"), (64, "decode b=64"), (2048, "prefill 2048")):
        i = arithmetic_intensity(LLAMA_8B_ROUND, tokens, 2)
        ax.plot([i], [attainable_flops(i, A100_PEAK_FLOPS, A100_BANDWIDTH) / 1e12], "o")
        ax.annotate(label, (i, attainable_flops(i, A100_PEAK_FLOPS, A100_BANDWIDTH) / 1e12))
    ax.axvline(ridge, linestyle=":", color="gray")
    ax.set_xlabel("arithmetic intensity (FLOPs/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title("A100 roofline, 8B model in bf16")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
