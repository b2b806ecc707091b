"""Lab 01-04 — watch the batch: what every engine step schedules, measured and predicted.

A probe wraps ``engine.scheduler.schedule`` and records, for every step, how
many tokens each request got, split into prefill ("context": the request has
no output token yet, upstream's rule) and decode. A small simulator predicts
the same table from the scheduling rules alone, so the numbers can be
derived on paper and then checked against the engine.

upstream: vllm/v1/core/sched/scheduler.py:329 Scheduler.schedule
upstream: vllm/v1/utils.py:693 compute_iteration_details
"""
from __future__ import annotations

import sys
from collections import deque  # noqa: F401  (you will need it)
from typing import NamedTuple

from mini_vllm.engine import LLMEngine  # noqa: F401  (you will need it)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401


class StepRecord(NamedTuple):
    step: int  # 1 for the engine's first step
    scheduled: dict[str, int]  # request id -> tokens scheduled this step
    prefill: dict[str, int]  # the part of `scheduled` for requests with no output token yet
    decode: dict[str, int]  # the rest
    waiting: list[str]  # ids still waiting after this step's schedule(): admission deferred


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def trace_batches(
    prompts: list[str], max_tokens: int = 4, **engine_kwargs
) -> tuple[list[str], list[StepRecord]]:
    """Run greedy, ignore-EOS requests to completion; return (ids in prompt order, one record per step).

    Inputs: the prompts, ``max_tokens`` for each, and keyword arguments passed
    unchanged to ``LLMEngine``.
    Output: the IDs the engine gave the requests, in prompt order, and one
    ``StepRecord`` per engine step, numbered from 1, whose fields are defined
    next to the class. A request counts as prefill in a step when it had no
    output token before that step (upstream's rule), however many tokens it got.
    Invariants: the records are a faithful copy, unaffected by anything the
    scheduler does to its own objects later; observing changes nothing, so the
    engine schedules exactly what it would without the probe.
    Errors: ValueError naming ``max_tokens`` for a value that is not an int
    >= 1; ValueError naming ``prompts`` for an empty list.
    """
    raise NotImplementedError("trace_batches: wrap scheduler.schedule with a probe, then run")


def predict_batches(
    prompt_lens: list[int],
    max_tokens: int,
    max_num_batched_tokens: int,
    long_prefill_token_threshold: int = 0,
    max_num_seqs: int = 256,
) -> list[dict[int, int]]:
    """The scheduled tokens of every step, from the rules alone (requests named 0, 1, 2, ...).

    Rules: running requests first, in admission order, then waiting ones,
    first come first served; each gets its remaining tokens, capped by the
    long-prefill threshold (when > 0) and by what is left of the step's token
    budget; admission stops when the budget is gone or max_num_seqs run. A
    request samples when its computed tokens catch up, and leaves after its
    max_tokens-th token. The KV cache is assumed large enough.

    Output: one dict per engine step, ``{request index: tokens scheduled}``,
    listing only requests that got at least one token; for the same workload it
    equals what ``trace_batches`` measures, with IDs replaced by indices.
    The caller's ``prompt_lens`` is left unchanged.
    Errors: ValueError naming the parameter (``prompt_lens`` for a bad length)
    for a value that is not an int or is below its minimum: 1 for the prompt
    lengths, ``max_tokens``, ``max_num_batched_tokens`` and ``max_num_seqs``,
    0 for ``long_prefill_token_threshold``.
    """
    raise NotImplementedError("predict_batches: simulate budget, chunking and FCFS admission")


def batch_summary(ids: list[str], records: list[StepRecord]) -> dict:
    """The facts a maintainer reads off a batch trace.

    Inputs: the two values ``trace_batches`` returns (every ID is scheduled at
    least once). Output: a dict with exactly these keys:
      "num_steps"            the number of records
      "tokens_per_request"   {id: total tokens scheduled over all steps}
      "first_scheduled_step" {id: the step number (StepRecord.step) that first scheduled it}
      "max_step_tokens"      the largest total scheduled in one step, all requests together
      "mixed_steps"          the step numbers, in order, of steps that scheduled at
                             least one prefill request and at least one decode request
    """
    raise NotImplementedError("batch_summary: totals, first steps, mixed steps")


def batch_matrix(ids: list[str], records: list[StepRecord]) -> list[list[int]]:
    """Row per step, column per request (in ``ids`` order): tokens scheduled, 0 if none.

    Output: ``len(records)`` rows of ``len(ids)`` ints; entry [i][j] is what
    step ``records[i]`` scheduled for ``ids[j]``.
    """
    raise NotImplementedError("batch_matrix: one row per step, one column per id")


def plot_batches(ids: list[str], records: list[StepRecord], path: str = "watch-the-batch.png") -> str:
    """Stacked bars: one bar per step, one colour per request; hatched = prefill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    matrix = batch_matrix(ids, records)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bottoms = [0] * len(records)
    steps = [r.step for r in records]
    handles = []
    for j, rid in enumerate(ids):
        heights = [row[j] for row in matrix]
        colour = f"C{j % 10}"
        bars = ax.bar(steps, heights, bottom=bottoms, color=colour)
        for bar, r in zip(bars, records, strict=True):
            bar.set_hatch("//" if rid in r.prefill else "")
        handles.append(Patch(color=colour, label=rid))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens scheduled")
    ax.set_title("Batch composition per step (hatched = prefill)")
    ax.set_xticks(steps)
    ax.legend(handles=handles)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    ids, records = trace_batches(["hello world", "goodbye"], max_tokens=4, max_num_batched_tokens=8)
    names = dict(zip(ids, "AB", strict=True))
    for r in records:
        print(r.step, {names[k]: v for k, v in r.scheduled.items()},
              "prefill:", {names[k]: v for k, v in r.prefill.items()},
              "waiting:", [names[k] for k in r.waiting])
    print(plot_batches(ids, records, sys.argv[1] if len(sys.argv) > 1 else "watch-the-batch.png"))
