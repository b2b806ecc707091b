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
from collections import deque
from typing import NamedTuple

from mini_vllm.engine import LLMEngine
from mini_vllm.sampling_params import SamplingParams


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
    """Run greedy, ignore-EOS requests to completion; return (ids in prompt order, one record per step)."""
    _check_int("max_tokens", max_tokens, 1)
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    engine = LLMEngine(**engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    scheduler = engine.scheduler
    original = scheduler.schedule
    records: list[StepRecord] = []

    def probe():
        # Classify before scheduling: after it, counters and queues have moved.
        context = {r.request_id for r in (*scheduler.running, *scheduler.waiting)
                   if r.num_output_tokens == 0}
        out = original()
        scheduled = dict(out.num_scheduled_tokens)  # a copy, never the scheduler's own dict
        records.append(StepRecord(
            step=len(records) + 1,
            scheduled=scheduled,
            prefill={k: v for k, v in scheduled.items() if k in context},
            decode={k: v for k, v in scheduled.items() if k not in context},
            waiting=[r.request_id for r in scheduler.waiting],
        ))
        return out  # unchanged: the probe must not alter what the engine does

    scheduler.schedule = probe
    while engine.has_unfinished_requests():
        engine.step()
    return ids, records


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
    """
    _check_int("max_tokens", max_tokens, 1)
    _check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
    _check_int("long_prefill_token_threshold", long_prefill_token_threshold, 0)
    _check_int("max_num_seqs", max_num_seqs, 1)
    for n in prompt_lens:
        _check_int("prompt_lens[i]", n, 1)

    def clamp(remaining: int, budget: int) -> int:
        if 0 < long_prefill_token_threshold < remaining:
            remaining = long_prefill_token_threshold
        return min(remaining, budget)

    tokens = list(prompt_lens)
    computed = [0] * len(tokens)
    outputs = [0] * len(tokens)
    waiting = deque(range(len(tokens)))
    running: list[int] = []
    steps = []
    while waiting or running:
        budget = max_num_batched_tokens
        plan: dict[int, int] = {}
        for i in running:
            if budget == 0:
                break
            plan[i] = clamp(tokens[i] - computed[i], budget)
            budget -= plan[i]
        while waiting and budget > 0 and len(running) < max_num_seqs:
            i = waiting.popleft()
            running.append(i)
            plan[i] = clamp(tokens[i], budget)
            budget -= plan[i]
        for i, n in plan.items():
            computed[i] += n
            if computed[i] == tokens[i]:  # caught up: one token sampled
                tokens[i] += 1
                outputs[i] += 1
        running = [i for i in running if outputs[i] < max_tokens]
        steps.append(plan)
    return steps


def batch_summary(ids: list[str], records: list[StepRecord]) -> dict:
    """The facts a maintainer reads off a batch trace."""
    per_request = {rid: sum(r.scheduled.get(rid, 0) for r in records) for rid in ids}
    first = {rid: next(r.step for r in records if rid in r.scheduled) for rid in ids}
    return {
        "num_steps": len(records),
        "tokens_per_request": per_request,
        "first_scheduled_step": first,
        "max_step_tokens": max(sum(r.scheduled.values()) for r in records),
        "mixed_steps": [r.step for r in records if r.prefill and r.decode],
    }


def batch_matrix(ids: list[str], records: list[StepRecord]) -> list[list[int]]:
    """Row per step, column per request (in ``ids`` order): tokens scheduled, 0 if none."""
    return [[r.scheduled.get(rid, 0) for rid in ids] for r in records]


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
