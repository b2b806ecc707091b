"""Lab 05-02 — launch overhead: when do CUDA graphs pay? (reference)

An eager forward pass asks the GPU for one kernel per operation, and every
request costs the CPU a few microseconds. A CUDA graph is recorded once and
then replayed with a single call, so after the recording the CPU pays one
launch where eager paid ``num_ops``. This lab turns that sentence into
arithmetic you can test, then feeds it real numbers.

The launch model, in launch-equivalents of CPU work:

* eager, ``k`` calls of a function of ``num_ops`` operations: ``k * num_ops``;
* graphs: the first call records (it issues every operation once more:
  ``capture_cost``, ``num_ops`` by default), each later call replays, one
  launch each: ``capture_cost + (k - 1)``;
* the *crossover* is the first ``k`` at which graphs have issued strictly
  fewer launches than eager, and the ratio eager / graphs tends to
  ``num_ops`` as ``k`` grows.

Then three pieces that connect the model to a real engine:

* ``fit_launch_counts``: launches per decode step of mini_vllm's torch model,
  measured for a few depths, are exactly ``per_step + per_layer * L``; the fit
  extrapolates to a deeper model (SmolLM2 has 30 layers);
* ``piecewise_launches``: with attention left out of the graphs (vLLM's
  PIECEWISE mode), a step replays one graph per piece between attention ops
  and still launches every attention op;
* ``step_time_floor``: the shortest a step can be, given its launches, a cost
  per launch and the GPU's own time.

Given (identical in starter.py): ``LaunchCounter`` (lab 01's counter of
non-view aten ops), ``tiny_random_torch``, ``decode_step_ops`` and
``decode_step_launches`` (build mini_vllm's tiny-random torch model at any
depth, list and count the ops of one decode step),
and ``measure_dispatch_overhead`` (times tiny torch adds on this CPU; printed
by ``python solution.py``, never asserted).

upstream: vllm/compilation/cuda_graph.py:313 torch.cuda.graph
upstream: vllm/compilation/cuda_graph.py:360 entry.cudagraph.replay
upstream: vllm/v1/worker/gpu_model_runner.py:6463 _warmup_and_capture
upstream: vllm/compilation/backends.py:548 split_graph
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping

# Assumption, not a measurement: the CPU time to issue one kernel from eager
# PyTorch (the guide's section 1 uses the same figure). measure_dispatch_overhead
# shows what a tiny CPU op costs on your machine.
ASSUMED_LAUNCH_S = 5e-6
SMOLLM2_NUM_LAYERS = 30  # SmolLM2-135M's num_hidden_layers


def _check_int(name: str, value: object, low: int) -> int:
    """Refuse anything but an int (bools excluded) of at least ``low``, naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_seconds(name: str, value: object) -> float:
    """Refuse anything but a finite real number >= 0 (bools excluded), naming ``name``."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


class LaunchCounter:
    """Given. Counts the non-view aten ops run while it is active (lab 01 builds it).

    Use as ``with LaunchCounter() as c: ...`` then read ``c.n``. Each op that
    reaches the dispatcher and is not a view (``func.is_view`` is False) is one
    kernel launch on a GPU; a view only rewrites strides and launches nothing.
    A custom op such as ``mini_vllm::unified_attention`` counts once: the ops
    inside it run below the mode and are not seen. ``names`` lists the ops in
    order.
    """

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not func.is_view:
                    counter.names.append(str(func))
                return func(*args, **(kwargs or {}))

        self.names: list[str] = []
        self._mode = _Mode()

    @property
    def n(self) -> int:
        return len(self.names)

    def __enter__(self) -> LaunchCounter:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


def tiny_random_torch(num_layers: int = 2):
    """Given. mini_vllm's tiny-random model in torch (CPU), with ``num_layers`` layers.

    ``num_layers=2`` is exactly ``get_model("tiny-random", backend="torch")``;
    other depths replace ``num_hidden_layers`` in the same config and draw
    seeded random weights the same way (seed 0). The KV cache is initialized
    (64 blocks of 4 tokens). Raises ValueError naming ``num_layers`` below 1.
    """
    _check_int("num_layers", num_layers, 1)
    from mini_vllm.models import get_model
    from mini_vllm.models.config import tiny_random_config
    from mini_vllm.models.llama import LlamaForCausalLM, random_weights
    from mini_vllm.models.torch_backend import TorchLlamaForCausalLM

    if num_layers == 2:
        model = get_model("tiny-random", backend="torch")
    else:
        cfg = dataclasses.replace(tiny_random_config(), num_hidden_layers=num_layers)
        model = TorchLlamaForCausalLM.from_numpy(
            LlamaForCausalLM(cfg, random_weights(cfg, seed=0), name="tiny-random"))
    model.init_kv_cache(num_blocks=64, block_size=4)
    return model


def decode_step_ops(num_layers: int = 2, batch_size: int = 1, whole_step: bool = False,
                    model=None) -> list[str]:
    """Given. The ops of one tiny-random decode step, in order, as ``LaunchCounter`` sees them.

    The step holds ``batch_size`` requests (1..16) with one new token each,
    request ``b`` at position 6 (6 tokens of context) in blocks ``2b, 2b+1``.
    It runs ``model.forward(model_input)`` (embedding and decoder layers, the
    part a compiled graph covers); ``whole_step=True`` runs
    ``model.execute(model_input)``, which adds the final norm and LM head.
    Both run under ``torch.inference_mode()``, as the engine runs them (outside
    it the mode sees one more op, the positions' cast to float, and ``mm``
    where it now sees ``matmul``). ``model`` defaults to
    ``tiny_random_torch(num_layers)``. One torch thread for the duration (tiny
    tensors; the ops do not depend on it). Raises ValueError naming
    ``num_layers`` or ``batch_size``.
    """
    _check_int("num_layers", num_layers, 1)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 16:
        raise ValueError(f"batch_size must be an integer in 1..16, got {batch_size!r}")
    import torch

    from mini_vllm.models.runner import Chunk, make_model_input

    model = tiny_random_torch(num_layers) if model is None else model
    step = make_model_input([Chunk([5 + b], 6, [2 * b, 2 * b + 1]) for b in range(batch_size)],
                            block_size=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(), LaunchCounter() as counter:
            if whole_step:
                model.execute(step)
            else:
                model.forward(step)
    finally:
        torch.set_num_threads(threads)
    return counter.names


def decode_step_launches(num_layers: int = 2, batch_size: int = 1, whole_step: bool = False,
                         model=None) -> int:
    """Given. ``len(decode_step_ops(...))``: the launches of that decode step."""
    return len(decode_step_ops(num_layers, batch_size, whole_step, model))


def measure_dispatch_overhead(n: int = 10_000) -> float:
    """Given. Seconds per tiny CPU op: ``n`` in-place adds of two 1-element tensors.

    The tensors are so small that the add itself is nothing: what is timed is
    PyTorch's path from Python through the dispatcher to the kernel, the CPU
    side of every eager launch (a GPU launch adds the driver's enqueue on top).
    Best of three runs. Machine-dependent: printed, never asserted. Raises
    ValueError naming ``n`` below 1.
    """
    _check_int("n", n, 1)
    import torch

    a, b = torch.zeros(1), torch.ones(1)
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            a.add_(b)
        best = min(best, time.perf_counter() - t0)
    return best / n


# --------------------------------------------------------------------------
# The launch model
# --------------------------------------------------------------------------


def eager_launches(k: int, num_ops: int) -> int:
    """Launches of ``k`` eager calls of a function of ``num_ops`` operations.

    ``k`` >= 1 and ``num_ops`` >= 1, ints. Every call issues every operation:
    ``k * num_ops``. Raises ValueError naming ``k`` or ``num_ops``.
    """
    _check_int("k", k, 1)
    _check_int("num_ops", num_ops, 1)
    return k * num_ops


def graph_launches(k: int, num_ops: int, capture_cost: int | None = None) -> int:
    """Launches of ``k`` calls when the first records a graph and the rest replay it.

    ``capture_cost``: launch-equivalents the first call costs, int >= 0;
    ``None`` means ``num_ops`` (the recording issues every operation once). Each
    of the ``k - 1`` later calls is one replay. Returns
    ``capture_cost + (k - 1)``. Raises ValueError naming ``k``, ``num_ops`` or
    ``capture_cost``.
    """
    _check_int("k", k, 1)
    _check_int("num_ops", num_ops, 1)
    cost = num_ops if capture_cost is None else _check_int("capture_cost", capture_cost, 0)
    return cost + (k - 1)


def crossover(num_ops: int, capture_cost: int | None = None) -> int | None:
    """The first call count ``k`` (>= 1) at which graphs have launched fewer than eager.

    "Fewer" is strict: a tie is not a win. Cumulative counts, as in
    ``graph_launches`` and ``eager_launches``. Returns None when graphs never
    catch up (a one-op function with a capture that costs anything: each
    replay saves nothing). Raises ValueError naming ``num_ops`` or
    ``capture_cost``.
    """
    _check_int("num_ops", num_ops, 1)
    cost = num_ops if capture_cost is None else _check_int("capture_cost", capture_cost, 0)
    # cost + k - 1 < k * num_ops  <=>  k * (num_ops - 1) > cost - 1.
    if num_ops == 1:
        return 1 if cost == 0 else None  # each replay saves nothing; only a free capture wins
    # The smallest integer k with k > (cost - 1) / (num_ops - 1); floor division
    # rounds toward -inf, so cost = 0 gives 0 here and the max() lifts it to 1.
    return max(1, (cost - 1) // (num_ops - 1) + 1)


def asymptotic_speedup(num_ops: int) -> float:
    """The limit of eager / graph launches as the call count grows: ``float(num_ops)``.

    The capture is paid once, so it vanishes from the ratio; what remains is
    ``num_ops`` eager launches against one replay per call. The finite-``k``
    ratio approaches it from below whenever ``capture_cost >= 1``. Raises
    ValueError naming ``num_ops``.
    """
    return float(_check_int("num_ops", num_ops, 1))


# --------------------------------------------------------------------------
# From the model to a real engine
# --------------------------------------------------------------------------


def fit_launch_counts(counts: Mapping[int, int]) -> tuple[int, int]:
    """Fit launches as ``per_step + per_layer * num_layers``; return ``(per_step, per_layer)``.

    ``counts`` maps a number of layers (int >= 1) to the launches measured at
    that depth (int >= 0), at least two distinct depths, in any order. Every
    layer of a decoder issues the same operations, so the counts must lie
    *exactly* on one line with an integer slope; the fit is exact, not least
    squares. Raises ValueError naming ``counts`` when there are fewer than two
    depths, a key or value is not an allowed int, the slope between two depths
    is not an integer, a point is off the line through the others, or the line
    implies a negative count for zero layers.
    """
    if not isinstance(counts, Mapping) or len(counts) < 2:
        raise ValueError(f"counts must map at least 2 layer counts to launch counts, "
                         f"got {counts!r}")
    for layers, launches in counts.items():
        if (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1
                or isinstance(launches, bool) or not isinstance(launches, int) or launches < 0):
            raise ValueError(f"counts must map ints >= 1 (layers) to ints >= 0 (launches), "
                             f"got {layers!r}: {launches!r}")
    points = sorted(counts.items())
    (l0, c0), (l1, c1) = points[0], points[-1]
    per_layer, rest = divmod(c1 - c0, l1 - l0)
    if rest:
        raise ValueError(f"counts must grow by a whole number of launches per layer: "
                         f"{c0} at {l0} layers, {c1} at {l1}")
    per_step = c0 - per_layer * l0
    if per_step < 0:
        raise ValueError(f"counts must imply launches >= 0 outside the layers, got "
                         f"{per_step} + {per_layer} x L")
    for layers, launches in points[1:-1]:  # the ends are on the line by construction
        if per_step + per_layer * layers != launches:
            raise ValueError(f"counts must be exactly linear in the layer count: {launches} at "
                             f"{layers} layers, but {per_step} + {per_layer} x {layers} = "
                             f"{per_step + per_layer * layers}")
    return per_step, per_layer


def piecewise_launches(num_ops: int, num_attention_ops: int) -> int:
    """Launches of one step with PIECEWISE graphs: one replay per piece, attention eager.

    Splitting a step of ``num_ops`` operations at each of its
    ``num_attention_ops`` attention ops leaves ``num_attention_ops + 1`` pieces
    between them (mini_vllm's and vLLM's forward passes start and end with
    non-attention work). Each piece is one replay and each attention op still
    launches: ``2 * num_attention_ops + 1``. Every piece needs at least one op,
    so ``num_ops >= 2 * num_attention_ops + 1``. Raises ValueError naming
    ``num_ops`` (below 1) or ``num_attention_ops`` (below 0, or too many for
    ``num_ops``).
    """
    _check_int("num_ops", num_ops, 1)
    _check_int("num_attention_ops", num_attention_ops, 0)
    if num_ops < 2 * num_attention_ops + 1:
        raise ValueError(f"num_attention_ops must leave a non-empty piece around each attention "
                         f"op (num_ops >= 2 * num_attention_ops + 1), got {num_attention_ops} "
                         f"attention ops in {num_ops} ops")
    return 2 * num_attention_ops + 1


def step_time_floor(num_launches: int, per_launch_s: float, gpu_time_s: float = 0.0) -> float:
    """The shortest a step can take: ``max(num_launches * per_launch_s, gpu_time_s)``, in seconds.

    Launches are asynchronous: the CPU enqueues a kernel and goes on to the
    next while the GPU runs the queue. The two sides overlap, so the step ends
    no sooner than the slower of the CPU's issuing (serial, one launch after
    the other) and the GPU's running. That is a floor: any synchronization
    (a host copy, a ``.cpu()``) breaks the overlap and pushes the step towards
    the sum. ``num_launches``: int >= 0; ``per_launch_s`` and ``gpu_time_s``:
    finite seconds >= 0. Raises ValueError naming the parameter.
    """
    _check_int("num_launches", num_launches, 0)
    cpu_s = num_launches * _check_seconds("per_launch_s", per_launch_s)
    return max(cpu_s, _check_seconds("gpu_time_s", gpu_time_s))


# --------------------------------------------------------------------------
# python solution.py
# --------------------------------------------------------------------------


def main() -> None:
    print(f"100 calls of a 3-op function: eager {eager_launches(100, 3)}, "
          f"graphs {graph_launches(100, 3)} launches")
    print(f"crossover: call {crossover(3)} for 3 ops; call {crossover(300, 600)} for 300 ops "
          f"when warm-up + capture cost 600; never ({crossover(1)}) for 1 op")
    counts = {layers: decode_step_launches(layers) for layers in (1, 2, 4)}
    per_step, per_layer = fit_launch_counts(counts)
    print(f"tiny-random decode step, forward launches by layers: {counts} "
          f"-> {per_step} + {per_layer} x L")
    eager = per_step + per_layer * SMOLLM2_NUM_LAYERS
    graphs = piecewise_launches(eager, SMOLLM2_NUM_LAYERS)
    print(f"SmolLM2 depth ({SMOLLM2_NUM_LAYERS} layers): {eager:,} launches eager, {graphs} with "
          f"piecewise graphs ({eager - graphs} fewer)")
    print(f"derived at {ASSUMED_LAUNCH_S * 1e6:.0f} us per launch: floor "
          f"{step_time_floor(eager, ASSUMED_LAUNCH_S) * 1e3:.2f} ms eager, "
          f"{step_time_floor(graphs, ASSUMED_LAUNCH_S) * 1e3:.3f} ms with graphs")
    per_op = measure_dispatch_overhead()
    print(f"this CPU: {per_op * 1e6:.2f} us per tiny torch add (measured, machine-dependent); "
          f"{eager:,} such ops = {step_time_floor(eager, per_op) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
