"""Lab 05-04 — graphs vs eager, on mini_vllm and on vLLM (reference solution).

Two things decide whether CUDA graphs pay off on a deployment, and both can be
worked out before a GPU is touched:

* **A launch model.** The CPU queues kernels while the GPU runs the ones
  already queued, so a step lasts as long as the slower of the two sides.
  Eager, the CPU side is one launch per kernel; replaying a graph, it is one
  launch per graph (plus whatever still runs eager between the graphs).
  ``step_time`` and ``predict_speedup`` turn that into numbers.
* **What vLLM says at start-up.** vLLM captures its graphs before serving and
  reports it in two kinds of line: one progress bar per batch kind and runtime
  mode ("Capturing CUDA graphs (decode, FULL): ... 35/35 ...") and one summary
  ("Graph capturing finished in 7 secs, took 0.41 GiB").
  ``parse_capture_bar`` and ``parse_capture_finished`` read them out of a log;
  ``expected_capture_bars`` predicts, from the capture-size ladder and the
  CUDA graph mode, which bars appear and how many graphs each one counts.

The GPU half of the lab (``run.py``, and the ``gpu`` test) measures the real
thing: mini_vllm's torch model eager against piecewise graphs through
``compare_mini_vllm`` (given), and real vLLM with ``enforce_eager`` on and off.

Given, complete in both files: ``CaptureBar``, ``CaptureFinished``,
``llm_batch_defaults``, ``capture_ladder``, ``MiniVllmRow`` and
``compare_mini_vllm``.

upstream: vllm/v1/worker/gpu_model_runner.py:6373 capture_model
upstream: vllm/v1/worker/gpu_model_runner.py:6518-6521 cudagraph_runtime_mode.name
upstream: vllm/v1/worker/gpu_model_runner.py:6456 info_once
upstream: vllm/v1/cudagraph_dispatcher.py:170 initialize_cudagraph_keys
upstream: vllm/v1/cudagraph_dispatcher.py:330 get_capture_descs
upstream: vllm/engine/arg_utils.py:2282 get_batch_defaults
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The two log formats, verbatim from vllm/v1/worker/gpu_model_runner.py at the pin.
CAPTURE_DESC_FORMAT = "Capturing CUDA graphs ({}, {})"  # str.format: batch kind, runtime mode
CAPTURE_FINISHED_FORMAT = "Graph capturing finished in %.0f secs, took %.2f GiB"  # %-format
BATCH_KINDS = ("decode", "mixed prefill-decode")  # the first field of the bar's description
RUNTIME_MODES = ("PIECEWISE", "FULL")  # the graphs a bar can capture (NONE is never captured)
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
LARGE_GPU_GIB = 70  # get_batch_defaults: at least this much memory, and not an A100


@dataclass(frozen=True)
class CaptureBar:
    """One "Capturing CUDA graphs" progress bar.

    ``kind`` is "decode" or "mixed prefill-decode", ``mode`` "PIECEWISE" or
    "FULL"; ``done`` / ``total`` are the bar's counter (graphs captured so far,
    graphs to capture), ``None`` when the line carries no counter.
    """

    kind: str
    mode: str
    done: int | None = None
    total: int | None = None


@dataclass(frozen=True)
class CaptureFinished:
    """The summary line: whole seconds spent capturing, GiB of GPU memory the graphs took."""

    seconds: float
    gib: float


def llm_batch_defaults(device_total_memory_gib: float, device_name: str) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` the ``LLM`` class uses when the user sets neither.

    Cards with at least 70 GiB whose name does not contain "a100" (any case)
    get (1024, 16384); every other card (256, 8192). ``vllm serve`` uses other
    token budgets; this is the offline ``LLM`` class only.

    upstream: vllm/engine/arg_utils.py:2282 get_batch_defaults
    """
    if not isinstance(device_total_memory_gib, int | float) or not device_total_memory_gib >= 0:
        raise ValueError(f"device_total_memory_gib must be a number >= 0, got {device_total_memory_gib!r}")
    if not isinstance(device_name, str):
        raise ValueError(f"device_name must be a string, got {device_name!r}")
    if device_total_memory_gib >= LARGE_GPU_GIB and "a100" not in device_name.lower():
        return 1024, 16384
    return 256, 8192


def capture_ladder(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default capture sizes (no speculative decoding, no user cap), ascending.

    mini_vllm's ``default_capture_sizes`` (lab 05 rebuilds it): 1, 2, 4, every 8
    below 256, every 16 from 256, up to ``min(2 * max_num_seqs, 512,
    max_num_batched_tokens)``. Raises ``ValueError`` naming ``max_num_seqs`` or
    ``max_num_batched_tokens`` when one is not an integer >= 1.

    upstream: vllm/config/vllm.py:1597 _set_cudagraph_sizes
    """
    from mini_vllm.compilation.config import default_capture_sizes

    return default_capture_sizes(max_num_seqs, max_num_batched_tokens)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_seconds(name: str, value: object, positive: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------------
# The launch model
# ---------------------------------------------------------------------------------------------


def step_time(num_launches: int, per_launch_s: float, gpu_time_s: float) -> float:
    """Seconds for one step when the CPU launches ``num_launches`` times and the GPU works ``gpu_time_s``.

    The model: launches are asynchronous, so the CPU issues launch after launch
    while the GPU executes what is already queued. The step ends when both sides
    are done: ``max(num_launches * per_launch_s, gpu_time_s)``. (It ignores the
    latency of the first launch and the gaps a starved GPU leaves, so it is a
    floor, not a simulation.)

    ``num_launches`` is an int >= 1, ``per_launch_s`` a finite number > 0,
    ``gpu_time_s`` a finite number >= 0; otherwise ``ValueError`` naming the
    parameter.
    """
    _check_int("num_launches", num_launches, 1)
    per_launch_s = _check_seconds("per_launch_s", per_launch_s, positive=True)
    gpu_time_s = _check_seconds("gpu_time_s", gpu_time_s, positive=False)
    cpu_s = num_launches * per_launch_s  # the CPU side: every launch paid in full
    return max(cpu_s, gpu_time_s)  # overlap: the slower side sets the pace


def predict_speedup(num_launches: int, per_launch_s: float, gpu_time_s: float,
                    graph_launches: int = 1) -> float:
    """Eager step time over graph step time, under ``step_time``'s model.

    Eager pays ``num_launches`` launches; with graphs the CPU pays only
    ``graph_launches`` (1 for one FULL graph; for piecewise graphs, the replays
    plus the launches that still run eager between them). The GPU does the same
    work either way, ``gpu_time_s``. So the speedup is
    ``step_time(num_launches, ...) / step_time(graph_launches, ...)``: 1.0 when
    the GPU is the bottleneck, ``num_launches / graph_launches`` when it is idle.

    Same checks as ``step_time``, plus ``graph_launches`` an int in
    ``1..num_launches`` (``ValueError`` naming ``graph_launches``).
    """
    _check_int("num_launches", num_launches, 1)
    _check_int("graph_launches", graph_launches, 1)
    if graph_launches > num_launches:
        raise ValueError(f"graph_launches must be in 1..num_launches ({num_launches}): graphs never "
                         f"add launches, got {graph_launches}")
    eager = step_time(num_launches, per_launch_s, gpu_time_s)
    graphs = step_time(graph_launches, per_launch_s, gpu_time_s)
    return eager / graphs


# ---------------------------------------------------------------------------------------------
# Reading vLLM's start-up log
# ---------------------------------------------------------------------------------------------

_BAR_RE = re.compile(r"Capturing CUDA graphs \((decode|mixed prefill-decode), (PIECEWISE|FULL)\)")
_COUNTER_RE = re.compile(r"(\d+)/(\d+)")
_FINISHED_RE = re.compile(r"Graph capturing finished in (-?\d+) secs, took (-?\d+\.\d+) GiB")


def parse_capture_bar(line: str) -> CaptureBar | None:
    """The last state of a "Capturing CUDA graphs (KIND, MODE)" progress bar in ``line``, or None.

    tqdm redraws a bar by writing ``\\r`` and the new state, so one line of a
    captured log holds every state of the bar, oldest first, and only the first
    carries the engine process's prefix ("(EngineCore_DP0 pid=...) "). Return
    the *last* state: its kind, mode, and the ``done/total`` counter after the
    description (``None`` for both when that state has no counter). A line
    without such a bar gives ``None``. ``line`` must be a ``str``
    (``ValueError`` naming ``line``).
    """
    if not isinstance(line, str):
        raise ValueError(f"line must be a str, got {type(line).__name__}")
    for state in reversed(line.split("\r")):  # the newest redraw is the last
        match = _BAR_RE.search(state)  # search, not match: a prefix may come first
        if match is None:
            continue
        counter = _COUNTER_RE.search(state, match.end())  # after the description only
        done, total = (int(counter[1]), int(counter[2])) if counter else (None, None)
        return CaptureBar(kind=match[1], mode=match[2], done=done, total=total)
    return None


def parse_capture_finished(line: str) -> CaptureFinished | None:
    """Seconds and GiB from a "Graph capturing finished in S secs, took G GiB" line, or None.

    The line may carry a logger prefix (level, time, file:line) and a process
    prefix in front. The GiB figure is the drop in free GPU memory during
    capture and can be negative when memory was released meanwhile ("took
    -0.02 GiB"). ``line`` must be a ``str`` (``ValueError`` naming ``line``).
    """
    if not isinstance(line, str):
        raise ValueError(f"line must be a str, got {type(line).__name__}")
    match = _FINISHED_RE.search(line)
    if match is None:
        return None
    return CaptureFinished(seconds=float(match[1]), gib=float(match[2]))


# ---------------------------------------------------------------------------------------------
# Predicting the bars
# ---------------------------------------------------------------------------------------------


def expected_capture_bars(max_num_seqs: int, max_num_batched_tokens: int,
                          cudagraph_mode: str = "FULL_AND_PIECEWISE") -> list[CaptureBar]:
    """The progress bars vLLM prints at start-up, in order, each with ``done == total``.

    Which graphs are captured follows from the CUDA graph mode's two halves
    (decode mode, mixed mode; a plain mode is both):

    * mixed mode PIECEWISE or FULL: one graph per rung of the ladder
      (``capture_ladder``), shown as ("mixed prefill-decode", mode);
    * a *pair* whose decode mode is FULL (FULL_DECODE_ONLY, FULL_AND_PIECEWISE):
      FULL graphs for uniform decode batches, one per rung ``<= max_num_seqs``
      (a decode step holds at most one token per sequence), shown as
      ("decode", "FULL").

    PIECEWISE bars come before FULL ones (the dispatcher's capture order);
    NONE captures nothing (empty list). No speculative decoding (the decode
    query length is 1). ``cudagraph_mode`` must be one of ``CUDAGRAPH_MODES``
    (``ValueError`` naming ``cudagraph_mode``); the limits are checked by
    ``capture_ladder``.
    """
    if cudagraph_mode not in CUDAGRAPH_MODES:
        raise ValueError(f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got {cudagraph_mode!r}")
    sizes = capture_ladder(max_num_seqs, max_num_batched_tokens)
    pairs = {"FULL_DECODE_ONLY": ("FULL", "NONE"), "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE")}
    decode_mode, mixed_mode = pairs.get(cudagraph_mode, (cudagraph_mode, cudagraph_mode))
    bars = []
    if mixed_mode != "NONE":
        bars.append(CaptureBar("mixed prefill-decode", mixed_mode, len(sizes), len(sizes)))
    if cudagraph_mode in pairs and decode_mode == "FULL":
        # a plain FULL mode already has its graphs from the mixed keys; only a pair adds decode keys
        n = sum(1 for s in sizes if s <= max_num_seqs)
        bars.append(CaptureBar("decode", "FULL", n, n))
    return sorted(bars, key=lambda bar: RUNTIME_MODES.index(bar.mode))  # stable: PIECEWISE first


# ---------------------------------------------------------------------------------------------
# The GPU measurement (given): benchmarks/bench_cuda_graphs.py, eager against piecewise graphs
# ---------------------------------------------------------------------------------------------

PIECEWISE_CONFIG = {"mode": "VLLM_COMPILE", "cudagraph_mode": "PIECEWISE"}


@dataclass(frozen=True)
class MiniVllmRow:
    """One batch size: median decode-step time eager and with piecewise graphs, and whether
    both produced the same greedy tokens."""

    batch: int
    eager_ms: float
    graphs_ms: float
    same_tokens: bool
    graphs_mode: str  # the last step's StepStats.cudagraph_mode under graphs ("PIECEWISE" if replayed)

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.graphs_ms


def compare_mini_vllm(batches=(1, 8, 64), steps: int = 32, device: str = "cuda") -> list[MiniVllmRow]:
    """Time mini_vllm decode steps eager and with piecewise CUDA graphs, batch by batch.

    Reuses ``measure`` from ``benchmarks/bench_cuda_graphs.py`` (a SmolLM2-shaped
    model with seeded random weights, float32, 48-token prompts, median of
    ``steps`` decode steps after warm-up). Needs CUDA.
    """
    from benchmarks.bench_cuda_graphs import measure

    rows = []
    for batch in batches:
        eager_ms, eager_tokens, _ = measure(None, batch, steps, device)
        graphs_ms, graph_tokens, mode = measure(dict(PIECEWISE_CONFIG), batch, steps, device)
        rows.append(MiniVllmRow(batch, eager_ms, graphs_ms, graph_tokens == eager_tokens, str(mode)))
    return rows


if __name__ == "__main__":
    print("step_time(1054, 5e-6, 2e-3) =", f"{step_time(1054, 5e-6, 2e-3) * 1e3:.2f} ms")
    for gpu_ms in (0.5, 2.0, 10.0):
        print(f"predict_speedup(1054, 5 us, {gpu_ms} ms, graph_launches=61) ="
              f" {predict_speedup(1054, 5e-6, gpu_ms * 1e-3, graph_launches=61):.2f}")
    for name, mem in (("NVIDIA L4", 22.0), ("NVIDIA H200", 139.8)):
        bars = expected_capture_bars(*llm_batch_defaults(mem, name))
        print(f"{name}: " + "; ".join(f"{CAPTURE_DESC_FORMAT.format(b.kind, b.mode)}: {b.total}" for b in bars))
