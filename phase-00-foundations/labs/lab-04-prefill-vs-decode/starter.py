"""Lab 00-04 — prefill vs decode: the roofline arithmetic (starter: your work).

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

import math  # noqa: F401  (critical_batch_size will need it)
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
    """The arithmetic intensity (FLOPs per byte) at which the roofline turns.

    Inputs: peak FLOP/s and memory bandwidth in bytes per second. Below this
    intensity a step waits on memory; at or above it, on the math units.
    The A100 (312 TFLOP/s, 2.0 TB/s) gives 156.
    Errors: either argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("ridge_point: your turn (see the docstring)")


def arithmetic_intensity(num_params: float, num_tokens: int, dtype_bytes: float) -> float:
    """FLOPs per byte of weights read, for one step over ``num_tokens`` tokens.

    A forward pass does one multiply and one add per parameter per token and reads
    every weight once per step. Returns a float; the parameter count cancels, so
    an 8B and a 70B model have the same intensity. One token in bf16 gives 1.0.
    Errors: any argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("arithmetic_intensity: your turn (see the docstring)")


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: the FLOP/s a step of this intensity can reach on this machine.

    Memory-bound below the ridge (bandwidth x intensity), capped at the peak above it.
    Errors: ``intensity`` not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("attainable_flops: your turn (see the docstring)")


def is_compute_bound(intensity: float, ridge: float) -> bool:
    """True when the math units, not memory, set the pace: at the ridge or past it.

    Errors: ``ridge`` not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("is_compute_bound: your turn (see the docstring)")


def compute_utilization(intensity: float, ridge: float) -> float:
    """The fraction of peak FLOP/s a step of this intensity can use, in (0, 1].

    Grows with the intensity up to the ridge and is exactly 1 from there on.
    Errors: ``ridge`` not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("compute_utilization: your turn (see the docstring)")


def critical_batch_size(ridge: float, dtype_bytes: float) -> int:
    """The smallest whole number of tokens per step whose intensity reaches ``ridge``.

    Returns an ``int``; a fractional answer rounds up, since one token fewer would
    still be memory-bound (the H100's ridge of 295.2 in bf16 needs 296).
    Errors: either argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("critical_batch_size: your turn (see the docstring)")


def step_time(
    num_params: float, num_tokens: int, dtype_bytes: float, peak_flops: float, bandwidth: float
) -> float:
    """Seconds for one forward step over ``num_tokens`` tokens.

    Two costs overlap on a GPU: reading every weight once (independent of the
    number of tokens) and doing the FLOPs (proportional to it). The slower one sets
    the time. Llama-8B in bf16 on an A100: 8 ms for one token, 8 ms for 64.
    Errors: any argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("step_time: your turn (see the docstring)")


def decode_tokens_per_second(
    num_params: float, batch: int, dtype_bytes: float, peak_flops: float, bandwidth: float
) -> float:
    """Tokens per second of a decode batch: each sequence gets one token per step.

    Batch 1 of Llama-8B in bf16 on an A100: 125; batch 64: 8,000.
    Errors: ``batch`` not > 0 is a ValueError naming it, and ``step_time``'s own.
    """
    raise NotImplementedError("decode_tokens_per_second: your turn (see the docstring)")


def sequences_in_flight(tokens_per_second: float, itl_seconds: float) -> float:
    """Little's law for decode: how many sequences keep this token rate busy.

    Each sequence yields one token per ``itl_seconds``. 1,000 tokens/s at 50 ms
    ITL is 50 sequences. Errors: either argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("sequences_in_flight: your turn (see the docstring)")


def kv_crossover_context(weight_bytes: float, batch: int, kv_bytes_per_token: int) -> float:
    """Context length per sequence at which a decode step reads as many KV bytes as weight bytes.

    A decode step over ``batch`` sequences of ``ctx`` tokens reads the KV of all
    of them. Returns a float (not rounded). Errors: any argument not > 0 is a
    ValueError naming it.
    """
    raise NotImplementedError("kv_crossover_context: your turn (see the docstring)")


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
