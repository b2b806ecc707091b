"""Lab 10-03 — the TP communication bill, modeled and dispatched (reference).

Tensor parallelism splits every linear layer across ``N`` ranks and pays for
it with collectives: each transformer layer ends its attention block and its
MLP block with one all-reduce of the hidden states (``RowParallelLinear``),
and the vocab-parallel embedding adds one more per forward pass. Each
all-reduce moves ``tokens x hidden x dtype_bytes`` bytes per rank. This lab
prices those messages with the alpha-beta model of a ring all-reduce::

    traffic per rank = 2 (N - 1) / N * payload          (bytes on each rank's link)
    time             = traffic / bandwidth + 2 (N - 1) * latency

and states the one ratio the rest of the phase uses::

    comm_fraction = comm / (compute + comm)               (share of the step spent talking)

It then reimplements the choice vLLM makes for every all-reduce on NVIDIA
GPUs: its own one-shot "custom" kernel for small payloads on fully NVLinked
GPUs (or exactly two GPUs), NCCL otherwise; and fits ``alpha`` and ``beta``
to measured timings, which ``python solution.py`` takes from real gloo
all-reduces between two forked processes.

upstream: vllm/model_executor/layers/linear.py:1559 tensor_model_parallel_all_reduce
upstream: vllm/distributed/device_communicators/custom_all_reduce.py:232 should_custom_ar
upstream: vllm/distributed/device_communicators/cuda_communicator.py:241 all_reduce
"""
from __future__ import annotations

import math
import numbers

import numpy as np

MiB = 1024 * 1024
CUSTOM_AR_MAX_BYTES = 8 * MiB  # CustomAllreduce's default max_size (8192 * 1024)
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES


# ---------------------------------------------------------------- given helpers


def _check_int(value, name: str, low: int) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_positive(value, name: str, allow_zero: bool = False, allow_inf: bool = False) -> float:
    """Given. ``value`` as a float; ValueError naming ``name`` unless it is a real number > 0
    (>= 0 with ``allow_zero``; ``math.inf`` only with ``allow_inf``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        ok = (value >= 0 if allow_zero else value > 0) and (allow_inf or math.isfinite(value))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        extra = " (inf allowed)" if allow_inf else ""
        raise ValueError(f"{name} must be a finite number {bound}{extra}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------- the model


def allreduce_payload_bytes(num_tokens: int, hidden_size: int, dtype_bytes: int = 2) -> int:
    """Bytes of one TP all-reduce: the hidden states of every token in the batch.

    num_tokens: tokens in the step (a decode step of batch 1 is 1 token; a
    prefill chunk is its length), integer >= 1. hidden_size: integer >= 1.
    dtype_bytes: bytes per element (2 for bf16/fp16, 4 for fp32), integer >= 1.
    Returns ``num_tokens * hidden_size * dtype_bytes`` as an int: 8,192 for one
    bf16 token at hidden 4,096; 16,777,216 (16 MiB) for a 2,048-token chunk.

    Raises ValueError naming ``num_tokens``, ``hidden_size`` or
    ``dtype_bytes`` when it is not an integer >= 1.
    """
    t = _check_int(num_tokens, "num_tokens", 1)
    h = _check_int(hidden_size, "hidden_size", 1)
    b = _check_int(dtype_bytes, "dtype_bytes", 1)
    return t * h * b


def ring_allreduce_traffic_per_rank(payload_bytes: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``payload_bytes``.

    The ring cuts the payload into ``N`` chunks; a reduce-scatter passes
    ``N - 1`` chunks around the ring, an all-gather another ``N - 1``:
    ``2 * (N - 1) / N * payload_bytes``. Exactly one payload at ``N = 2``,
    approaching two payloads as ``N`` grows; 0 at ``N = 1`` (nothing to send).

    payload_bytes: real >= 0. world_size: integer >= 1. Returns a float.
    Raises ValueError naming ``payload_bytes`` or ``world_size``.
    """
    p = _check_positive(payload_bytes, "payload_bytes", allow_zero=True)
    n = _check_int(world_size, "world_size", 1)
    return 2.0 * (n - 1) / n * p


def allreduce_time_s(payload_bytes: float, world_size: int, bandwidth_bytes_per_s: float,
                     latency_s: float) -> float:
    """Seconds for one ring all-reduce in the alpha-beta model.

    ``traffic / bandwidth + 2 * (N - 1) * latency``: the ring takes
    ``2 (N - 1)`` sequential steps, each paying one link latency, and moves
    ``ring_allreduce_traffic_per_rank`` bytes through each rank's link.
    0.0 at ``N = 1``.

    payload_bytes: real >= 0. world_size: integer >= 1.
    bandwidth_bytes_per_s: real > 0, ``math.inf`` allowed (latency only).
    latency_s: real >= 0 (per ring step). Returns a float (seconds).
    Raises ValueError naming the offending parameter.
    """
    traffic = ring_allreduce_traffic_per_rank(payload_bytes, world_size)
    bw = _check_positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s", allow_inf=True)
    lat = _check_positive(latency_s, "latency_s", allow_zero=True)
    return traffic / bw + 2 * (world_size - 1) * lat


def allreduces_per_step(num_layers: int) -> int:
    """All-reduces in one TP forward pass of a decoder of ``num_layers`` layers.

    Two per layer (after the attention output projection and after the MLP's
    down projection, both ``RowParallelLinear``) plus one for the
    vocab-parallel embedding: ``2 * num_layers + 1``. 65 for 32 layers, 5 for
    mini_vllm's 2-layer tiny-random. (The logits add one all-gather, of a
    different size, that this count leaves out.)

    num_layers: integer >= 1. Raises ValueError naming ``num_layers``.
    """
    n = _check_int(num_layers, "num_layers", 1)
    return 2 * n + 1


def tp_comm_time_per_step(num_layers: int, payload_bytes: float, world_size: int,
                          bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """Seconds of all-reduce in one forward step: ``allreduces_per_step(num_layers)``
    all-reduces of ``payload_bytes`` each, one after another (no overlap).

    Arguments as ``allreduces_per_step`` and ``allreduce_time_s`` take them;
    raises ValueError naming the offending parameter.
    """
    count = allreduces_per_step(num_layers)
    return count * allreduce_time_s(payload_bytes, world_size, bandwidth_bytes_per_s, latency_s)


def comm_fraction(comm_s: float, compute_s: float) -> float:
    """Share of a step spent in communication: ``comm_s / (compute_s + comm_s)``.

    The one definition of the phase: the step takes ``compute + comm`` when
    nothing overlaps, and the fraction is of that whole step, so it lies in
    [0, 1). (``comm / compute`` is a different number, and can exceed 1.)

    comm_s: real >= 0. compute_s: real > 0. Raises ValueError naming
    ``comm_s`` or ``compute_s``.
    """
    c = _check_positive(comm_s, "comm_s", allow_zero=True)
    k = _check_positive(compute_s, "compute_s")
    return c / (k + c)


# ---------------------------------------------------------------- vLLM's dispatch


def choose_allreduce(nbytes: int, world_size: int, fully_connected: bool,
                     contiguous: bool = True, max_size: int = CUSTOM_AR_MAX_BYTES) -> str:
    """Which all-reduce vLLM's CUDA path runs for one tensor of ``nbytes`` bytes.

    Returns ``"none"`` when ``world_size == 1`` (``GroupCoordinator.all_reduce``
    returns the input untouched). Otherwise ``"custom"`` when vLLM's custom
    all-reduce is both enabled for this group and accepts the tensor, else
    ``"nccl"``:

    * enabled: ``world_size`` is one of 2, 4, 6, 8, and the GPUs are fully
      connected (NVLink between every pair) unless ``world_size == 2``;
    * accepts: ``nbytes % 16 == 0``, the tensor is ``contiguous``, and
      ``nbytes < max_size`` (8 MiB by default; strictly less).

    nbytes: integer >= 0. world_size: integer >= 1. fully_connected,
    contiguous: bools. max_size: integer >= 1. Raises ValueError naming
    ``nbytes``, ``world_size`` or ``max_size``.
    """
    nbytes = _check_int(nbytes, "nbytes", 0)
    world_size = _check_int(world_size, "world_size", 1)
    max_size = _check_int(max_size, "max_size", 1)
    if world_size == 1:
        return "none"
    # CustomAllreduce.__init__ leaves itself disabled for these groups ...
    if world_size not in CUSTOM_AR_WORLD_SIZES:
        return "nccl"
    if world_size > 2 and not fully_connected:
        return "nccl"
    # ... and should_custom_ar refuses these tensors.
    if nbytes % 16 != 0 or not contiguous:
        return "nccl"
    return "custom" if nbytes < max_size else "nccl"


# ---------------------------------------------------------------- fitting measurements


def fit_alpha_beta(samples) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + beta * nbytes`` to measured all-reduces.

    samples: an iterable of ``(nbytes, seconds)`` pairs, at least two distinct
    ``nbytes`` values, every value finite, ``nbytes >= 0`` and ``seconds > 0``.
    Returns ``(alpha, beta)`` as floats: ``alpha`` the fixed cost in seconds
    (the latency term), ``beta`` the cost per byte in seconds (``1 / beta`` is
    the effective bandwidth). Samples lying exactly on a line give that line
    back to float64 rounding.

    Raises ValueError naming ``samples`` when it is not such a collection.
    """
    arr = np.asarray(list(samples), dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 2 or not np.isfinite(arr).all():
        raise ValueError("samples must be (nbytes, seconds) pairs of finite numbers")
    if (arr[:, 0] < 0).any() or (arr[:, 1] <= 0).any():
        raise ValueError("samples must have nbytes >= 0 and seconds > 0")
    if np.unique(arr[:, 0]).size < 2:
        raise ValueError("samples must hold at least two distinct nbytes values")
    design = np.stack([np.ones(len(arr)), arr[:, 0]], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, arr[:, 1], rcond=None)
    return float(alpha), float(beta)


# ---------------------------------------------------------------- measuring real gloo (script only)


def _time_allreduces(rank: int, world_size: int, sizes: list[int], repeats: int) -> list[float]:
    """Given. Runs inside each forked rank: the median seconds of ``repeats``
    float32 all-reduces for each byte size in ``sizes``."""
    import time

    import torch
    import torch.distributed as dist

    medians = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(t)  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        medians.append(float(np.median(times)))
    return medians


def measure_gloo_allreduce(sizes, world_size: int = 2, repeats: int = 5) -> list[tuple[int, float]]:
    """Given. ``(nbytes, seconds)`` for real gloo all-reduces between ``world_size``
    forked processes on this machine (rank 0's medians)."""
    from mini_vllm.distributed import run_in_processes

    sizes = [int(s) for s in sizes]
    results = run_in_processes(world_size, _time_allreduces, sizes, repeats, timeout=120.0)
    return list(zip(sizes, results[0], strict=True))


if __name__ == "__main__":
    HIDDEN, LAYERS, STEP_S = 4096, 32, 8e-3
    decode = allreduce_payload_bytes(1, HIDDEN)
    prefill = allreduce_payload_bytes(2048, HIDDEN)
    print(f"payload: decode {decode:,} B, 2,048-token prefill chunk {prefill:,} B")
    print(f"all-reduces per step at {LAYERS} layers: {allreduces_per_step(LAYERS)}")
    links = {"NVLink (3 us, 450 GB/s)": (450e9, 3e-6), "10 GbE (50 us, 1.25 GB/s)": (1.25e9, 50e-6)}
    for name, (bw, lat) in links.items():
        for n in (2, 8):
            comm = tp_comm_time_per_step(LAYERS, decode, n, bw, lat)
            print(f"{name:26s} TP={n}: decode comm {comm * 1e3:6.3f} ms, "
                  f"fraction of the step {comm_fraction(comm, STEP_S):.1%}")
    for nbytes in (decode, prefill):
        print(f"dispatch {nbytes:>10,} B at TP=8 on NVLink: {choose_allreduce(nbytes, 8, True)}")
    sizes = [4 * 1024, 64 * 1024, 1 * MiB, 4 * MiB, 16 * MiB]
    measured = measure_gloo_allreduce(sizes)
    print("real gloo all-reduce, 2 forked processes on this machine:")
    for nbytes, sec in measured:
        print(f"  {nbytes:>10,} B: {sec * 1e3:8.3f} ms  ({nbytes / sec / 1e9:6.3f} GB/s)")
    alpha, beta = fit_alpha_beta(measured)
    print(f"fit: alpha = {alpha * 1e6:.0f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s")
