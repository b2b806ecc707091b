"""Lab 10-04 — the pipeline-parallel bubble, and a real two-stage pipeline (your implementation).

Pipeline parallelism cuts the model by layers: stage ``s`` of ``p`` holds a
contiguous block of layers and hands its hidden states to stage ``s + 1``.
One batch alone would keep one stage busy at a time, so the batch is cut into
``m`` micro-batches that follow each other through the stages. Micro-batch
``b`` runs on stage ``s`` at tick ``s + b``; the last one leaves the last
stage at tick ``p + m - 2``, so a step takes ``p + m - 1`` ticks, of which each
stage is busy for ``m``. The idle share, the bubble, is::

    bubble = (p - 1) / (p + m - 1)

This lab computes it, simulates the schedule cell by cell, finds how many
micro-batches a bubble budget needs, and reimplements three pieces of vLLM
that follow from it: how layers are divided among stages
(``get_pp_indices``), how many batches the engine keeps in flight
(``max_concurrent_batches``) and which worker returns the step's output
(``_get_output_rank``). Then it runs a real two-stage pipeline: two forked
processes joined by gloo, stage 0 sending each micro-batch's hidden states
to stage 1 with ``torch.distributed.send``, whose output must equal the
unsplit model's.

upstream: vllm/distributed/utils.py:95 get_pp_indices
upstream: vllm/v1/executor/multiproc_executor.py:475 max_concurrent_batches
upstream: vllm/v1/executor/multiproc_executor.py:480 _get_output_rank
"""
from __future__ import annotations

import numbers

import numpy as np

IDLE = -1  # a cell of the schedule where the stage does nothing


# ---------------------------------------------------------------- given helpers


def _check_int(value, name: str, low: int) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def make_mlp_stack(num_layers: int, hidden: int,
                   seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Given. A toy model: ``num_layers`` residual MLP layers of float64 ``(W [hidden, hidden],
    b [hidden])``, scaled so the hidden states stay of order 1 through many layers."""
    rng = np.random.default_rng(seed)
    scale = 0.5 / np.sqrt(hidden)
    return [(rng.standard_normal((hidden, hidden)) * scale, rng.standard_normal(hidden) * 0.1)
            for _ in range(num_layers)]


def apply_layers(layers, h: np.ndarray) -> np.ndarray:
    """Given. Runs ``h [tokens, hidden]`` through ``layers`` in order:
    ``h = h + tanh(h @ W + b)`` per layer. Row ``t`` of the output depends on row
    ``t`` of the input only, so any split of the tokens into micro-batches gives
    the same rows."""
    for W, b in layers:
        h = h + np.tanh(h @ W + b)
    return h


# ---------------------------------------------------------------- the bubble


def pipeline_total_ticks(p: int, m: int) -> int:
    """Ticks for ``m`` micro-batches to pass through ``p`` stages: ``p + m - 1``.

    One tick is one stage processing one micro-batch (all stages equally
    fast). p, m: integers >= 1. Raises ValueError naming ``p`` or ``m``.
    """
    raise NotImplementedError("pipeline_total_ticks: "
                              "the last micro-batch enters at tick m - 1 and needs p ticks")


def bubble_fraction(p: int, m: int) -> float:
    """Idle share of the ``p x (p + m - 1)`` stage-ticks: ``(p - 1) / (p + m - 1)``.

    Busy cells are ``p * m`` (each stage processes each micro-batch once), so
    idle ones are ``p * (p - 1)``. 0.0 for one stage; 0.75 for p = 4, m = 1.
    p, m: integers >= 1. Raises ValueError naming ``p`` or ``m``.
    """
    raise NotImplementedError("bubble_fraction: "
                              "idle stage-ticks over all stage-ticks: (p - 1) / (p + m - 1)")


def simulate_schedule(p: int, m: int) -> np.ndarray:
    """The fill-and-drain schedule as a grid.

    Returns an int64 array of shape ``[p, p + m - 1]``: cell ``[s, t]`` is the
    micro-batch that stage ``s`` processes at tick ``t``, or ``IDLE`` (-1).
    Micro-batch ``b`` is on stage ``s`` at tick ``s + b``: it can start on a
    stage only once the previous stage has finished it and the stage has
    finished micro-batch ``b - 1``.

    p, m: integers >= 1. Raises ValueError naming ``p`` or ``m``.
    """
    raise NotImplementedError("simulate_schedule: "
                              "a [p, p + m - 1] grid of -1, then grid[s, s + b] = b")


def min_microbatches_for_bubble(p: int, budget: float) -> int:
    """Smallest ``m >= 1`` with ``bubble_fraction(p, m) <= budget``.

    p: integer >= 1. budget: real in (0, 1). For p = 8 and a 10% budget:
    7 / (7 + m) <= 0.1 needs m >= 63. The answer must agree exactly with
    ``bubble_fraction``'s own float comparison (``ceil`` of the closed form
    lands one too high on some float roundings), and must come in a few
    steps even when it is huge: p = 8 at a budget of 1e-9 needs
    6,999,999,993 micro-batches, too many to count up to.

    Raises ValueError naming ``p`` or ``budget``.
    """
    raise NotImplementedError("min_microbatches_for_bubble: "
                              "solve (p - 1) / (p - 1 + m) <= budget, settle on bubble_fraction")


# ---------------------------------------------------------------- vLLM's pieces


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """Layers ``[start, end)`` of stage ``pp_rank``, as vLLM's ``get_pp_indices`` divides them.

    Every stage gets ``num_layers // pp_size``; the ``r = num_layers % pp_size``
    leftover layers go one each to the ``r`` stages just before the last one
    (stages ``pp_size - 1 - r`` to ``pp_size - 2``): the last stage also holds
    the final norm and the LM head, so it is never given an extra layer.
    10 layers over 4 stages: ``[2, 3, 3, 2]``; 7 over 2: ``[4, 3]``.

    num_layers: integer >= pp_size. pp_rank: integer in [0, pp_size).
    pp_size: integer >= 1. Raises ValueError naming ``pp_size``,
    ``num_layers`` or ``pp_rank``.
    """
    raise NotImplementedError("pp_layer_range: "
                              "num_layers // pp_size each; leftovers to the stages before the last")


def max_concurrent_batches(pp_size: int, async_scheduling: bool) -> int:
    """How many scheduled batches vLLM's engine keeps in flight (its batch queue's size).

    ``pp_size`` batches fill a pipeline of ``pp_size`` stages; without PP,
    async scheduling still keeps 2 (one running, the next one scheduled);
    otherwise 1. pp_size: integer >= 1. Raises ValueError naming ``pp_size``.
    """
    raise NotImplementedError("max_concurrent_batches: "
                              "pp_size, except 2 for pp_size 1 with async scheduling")


def output_rank(tp_size: int, pp_size: int, pcp_size: int = 1) -> int:
    """The global rank whose output the executor returns: TP rank 0 (and prefill-context-
    parallel rank 0) of the last pipeline stage.

    Ranks are numbered with TP fastest, then PCP, then PP, so the last stage's
    ranks are the top ``tp_size * pcp_size`` of the ``tp_size * pcp_size *
    pp_size`` world, and its first is ``world - tp_size * pcp_size``.
    TP 8, PP 4: ranks 24 to 31 form the last stage, and 24 answers.

    All three: integers >= 1. Raises ValueError naming the parameter.
    """
    raise NotImplementedError("output_rank: world - tp_size * pcp_size")


# ---------------------------------------------------------------- a real pipeline


def pipeline_forward(rank: int, world_size: int, layers, x: np.ndarray,
                     num_microbatches: int) -> dict:
    """One rank of a real ``world_size``-stage pipeline; run it with
    ``run_in_processes(world_size, pipeline_forward, layers, x, num_microbatches)``.

    Every rank receives the whole model (``layers``, a list of ``(W, b)``) and
    the whole input ``x [tokens, hidden]`` (float64); it keeps only its layers,
    ``pp_layer_range(len(layers), rank, world_size)``. ``x`` is cut into
    ``num_microbatches`` consecutive row blocks with ``np.array_split``. For
    each block in order: stage 0 takes it from ``x``, every other stage
    receives it from ``rank - 1`` with ``torch.distributed.recv`` (a float64
    tensor of the block's shape); the stage applies its layers
    (``apply_layers``); every stage but the last sends the result to
    ``rank + 1`` with ``torch.distributed.send``.

    Returns ``{"layers": (start, end), "sent": int, "received": int,
    "output": array or None}``: the counts of send and recv calls this rank
    made, and on the last rank the blocks' outputs concatenated in order
    (``[tokens, hidden]``, equal to ``apply_layers(layers, x)``); None on the
    others.

    Raises ValueError naming ``num_microbatches`` unless it is an integer in
    ``[1, tokens]``, and naming ``x`` unless it is a 2-D float64 array.
    """
    raise NotImplementedError("pipeline_forward: "
                              "per block: recv (not stage 0), apply your layers, send (not last)")


if __name__ == "__main__":
    for p in (2, 4, 8):
        row = ", ".join(f"m={m}: {bubble_fraction(p, m):5.1%}" for m in (1, 4, 16, 64))
        print(f"p={p}: ticks(m=16)={pipeline_total_ticks(p, 16):2d}  bubble {row}")
    print("p=4, m=3 schedule (-1 = idle):")
    print(simulate_schedule(4, 3))
    print(f"p=8, bubble <= 10%: m >= {min_microbatches_for_bubble(8, 0.10)}")
    print(f"layers of 10 over 4 stages: {[pp_layer_range(10, r, 4) for r in range(4)]}")
    print(f"max_concurrent_batches: PP=1 async {max_concurrent_batches(1, True)}, "
          f"PP=1 sync {max_concurrent_batches(1, False)}, PP=4 {max_concurrent_batches(4, True)}")
    print(f"output rank, TP=8 PP=4: {output_rank(8, 4)}")

    from mini_vllm.distributed import run_in_processes

    model = make_mlp_stack(7, 16)
    x = np.random.default_rng(1).standard_normal((12, 16))
    res = run_in_processes(2, pipeline_forward, model, x, 4)
    dense = apply_layers(model, x)
    print(f"real 2-stage pipeline over gloo: layers {res[0]['layers']} and {res[1]['layers']}, "
          f"{res[0]['sent']} sends; max |pipeline - dense| = "
          f"{np.abs(res[1]['output'] - dense).max():.1e}")
