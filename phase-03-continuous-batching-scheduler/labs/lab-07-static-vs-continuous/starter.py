"""Lab 03-07 — static vs continuous batching, on one seeded arrival workload.

Requests arrive at random (a Poisson process, in engine steps) with mixed prompt
and output lengths. Two servers handle the same arrivals with the same engine
(mini_vllm's ``LLMEngine``, toy model) and the same concurrency cap ``B``:

* static batching: when the previous batch has *completely* finished, take up
  to ``B`` requests that have arrived and run them together; nobody joins a
  batch in flight, so a finished request's seat stays empty until the batch's
  longest request is done;
* continuous batching (Orca's iteration-level scheduling): every step, free
  seats are refilled from the queue.

Time is counted in engine steps ("ticks"). A tick in which nothing has arrived
yet is idle. All metrics come from the per-request step numbers the engine
records (``Request.metrics``).

upstream: vllm/v1/core/sched/scheduler.py:544-550 max_num_running_reqs
upstream: vllm/v1/core/sched/request_queue.py:131 PriorityRequestQueue
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from mini_vllm.engine import LLMEngine  # noqa: F401  (used by the code you write)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401

POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class Arrival:
    """One request of the workload: when it arrives and how big it is."""

    request_id: str
    arrival_step: int
    prompt_len: int
    max_tokens: int
    priority: int = 0  # lower runs first under the "priority" policy (vLLM's convention)


@dataclass
class Timeline:
    """What happened to one request, in ticks (0-based)."""

    request_id: str
    arrival_step: int
    admitted_step: int  # the tick of its first scheduled step
    token_steps: list[int]  # the tick at which each output token was sampled
    token_ids: list[int]
    priority: int = 0

    @property
    def first_token_step(self) -> int:
        return self.token_steps[0]

    @property
    def finish_step(self) -> int:
        return self.token_steps[-1]


@dataclass
class RunResult:
    mode: str
    timelines: list[Timeline]
    makespan: int  # ticks until the last request finished
    step_tokens: list[int] = field(default_factory=list)  # total scheduled tokens per tick


# ---- helpers the lab ships (not learner code) ----------------------------------


def poisson_workload(
    num_requests: int = 32,
    rate: float = 0.25,
    prompt_lens: tuple[int, ...] = (16, 32, 64, 128),
    output_lens: tuple[int, ...] = (4, 8, 16, 32, 64, 128),
    seed: int = 0,
    high_priority_fraction: float = 0.0,
) -> list[Arrival]:
    """A seeded workload: exponential gaps of mean ``1/rate`` steps, floored to ticks."""
    if not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (requests per step), got {rate!r}")
    if not 0.0 <= high_priority_fraction <= 1.0:
        raise ValueError(f"high_priority_fraction must be in [0, 1], got {high_priority_fraction!r}")
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=num_requests))
    prompts = rng.choice(prompt_lens, size=num_requests)
    outputs = rng.choice(output_lens, size=num_requests)
    urgent = rng.random(num_requests) < high_priority_fraction
    return [
        Arrival(f"r{i:02d}", int(t), int(p), int(m), 0 if u else 1)
        for i, (t, p, m, u) in enumerate(zip(times, prompts, outputs, urgent, strict=True))
    ]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (an actual sample, no interpolation)."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q}")
    ordered = sorted(values)
    rank = max(int(np.ceil(q / 100 * len(ordered))), 1)
    return float(ordered[rank - 1])


def _prompt(arrival: Arrival) -> dict:
    # Distinct token ids per request, so prefix caching cannot blur the comparison.
    base = int(arrival.request_id[1:]) * 7 % 200
    return {"prompt_token_ids": [(base + k) % 250 + 1 for k in range(arrival.prompt_len)]}


# ---- what the learner writes ---------------------------------------------------


def admission_order(queue: list[Arrival], policy: str) -> list[Arrival]:
    """The order in which queued requests get free seats.

    Inputs: ``queue`` (any order) and ``policy``, one of ``POLICIES``.
    Returns: a new list holding the same ``Arrival`` objects, sorted. ``"fcfs"``:
    earliest ``arrival_step`` first, equal steps by ``request_id``. ``"priority"``:
    lowest ``priority`` value first, then as ``"fcfs"`` (the order of vLLM's
    ``Request.__lt__``). ``queue`` itself is left unchanged.
    Errors: ``ValueError`` naming ``policy`` and the allowed values, even for an
    empty queue.

    upstream: vllm/v1/request.py:301 Request.__lt__
    """
    raise NotImplementedError("admission_order: the contract is in the docstring, hints in README.md")


def simulate(
    workload: list[Arrival],
    mode: str,
    max_batch: int = 8,
    policy: str = "fcfs",
    max_num_batched_tokens: int = 2048,
    max_ticks: int = 100_000,
) -> RunResult:
    """Serve ``workload`` with static or continuous batching on ``LLMEngine("toy")``.

    Time runs in ticks 0, 1, 2, ...; each tick, the requests whose
    ``arrival_step`` has come join a queue, free seats go to queued requests in
    ``admission_order(queue, policy)``, and the engine runs one step if it has
    work (a tick with none is idle). A request holds its seat from the moment it
    is handed to the engine until it finishes, whether or not the engine has
    scheduled it yet; at most ``max_batch`` requests ever hold seats.
    ``"continuous"``: a freed seat can be refilled at the next tick.
    ``"static"``: new requests are handed over only when the engine is empty,
    up to ``max_batch`` of them. The engine uses ``max_num_batched_tokens``; every
    request decodes greedily to exactly its ``max_tokens`` (prompt: ``_prompt(a)``,
    request id: ``a.request_id``).
    Returns: a ``RunResult`` with one ``Timeline`` per arrival in workload order
    (tick of its first scheduled step, tick of every sampled token, its token
    ids), ``makespan`` = the number of ticks up to and including the last finish,
    and ``step_tokens`` = total tokens scheduled at each tick (0 when idle), one
    entry per tick of the makespan.
    Errors: ``ValueError`` naming ``mode``, ``max_batch`` (an int >= 1) or
    ``policy``; ``RuntimeError`` if the work is not done after ``max_ticks``.
    """
    raise NotImplementedError("simulate: the contract is in the docstring, hints in README.md")


def summarize(result: RunResult) -> dict[str, float]:
    """Throughput and latency of a run, all in ticks. Returns a dict with exactly:

    * ``throughput``: output tokens per tick over the makespan;
    * ``ttft_mean``, ``ttft_p50``, ``ttft_p99``: TTFT runs from arrival to the
      *end* of the tick that sampled the first token (a request that arrives and
      prefills in the same tick has TTFT 1); percentiles are ``percentile``'s;
    * ``itl_p50``, ``itl_p99``: ticks between consecutive tokens of a request
      (0.0 when no request has two tokens);
    * ``itl_work_p99``: p99, over every token but each request's first, of the
      total tokens scheduled at the tick that produced it (0.0 when none);
    * ``mean_in_system`` (Little's L: time-average number of requests that have
      arrived and not finished), ``mean_time_in_system`` (W, per request, counting
      the finishing tick) and ``arrival_rate`` (requests per tick of makespan), so
      that L = arrival_rate x W holds exactly.
    """
    raise NotImplementedError("summarize: the contract is in the docstring, hints in README.md")


def load_sweep(
    rates: tuple[float, ...] = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5),
    mode: str = "continuous",
    num_requests: int = 32,
    max_batch: int = 8,
    seed: int = 0,
) -> list[dict[str, float]]:
    """``summarize`` of one run per arrival rate (same seed): the saturation curve."""
    rows = []
    for rate in rates:
        row = summarize(simulate(poisson_workload(num_requests, rate, seed=seed), mode, max_batch))
        row["rate"] = rate
        rows.append(row)
    return rows


def plot_timelines(static: RunResult, continuous: RunResult, path: str = "static_vs_continuous.png") -> str:
    """One row per request: a thin line while it waits, a thick bar while it runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    for ax, res in zip(axes, (static, continuous), strict=True):
        s = summarize(res)
        for row, t in enumerate(res.timelines):
            ax.hlines(row, t.arrival_step, t.admitted_step, colors="0.7", linewidth=1)
            ax.hlines(row, t.admitted_step, t.finish_step + 1, colors="tab:blue", linewidth=4)
            ax.plot(t.first_token_step + 1, row, "k|", markersize=7)
        ax.set_title(f"{res.mode} batching: makespan {res.makespan} steps, "
                     f"{s['throughput']:.2f} tokens/step, mean TTFT {s['ttft_mean']:.1f} steps")
        ax.set_ylabel("request")
        ax.invert_yaxis()
    axes[-1].set_xlabel("engine step (grey: waiting, blue: running, |: first token)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    wl = poisson_workload()
    st, ct = simulate(wl, "static"), simulate(wl, "continuous")
    for res in (st, ct):
        s = summarize(res)
        print(f"{res.mode:>10}: makespan {res.makespan:4d} steps  throughput {s['throughput']:.3f} tok/step  "
              f"TTFT mean {s['ttft_mean']:.1f} p50 {s['ttft_p50']:.0f} p99 {s['ttft_p99']:.0f}  "
              f"ITL p50 {s['itl_p50']:.0f} p99 {s['itl_p99']:.0f}  ITL work p99 {s['itl_work_p99']:.0f}")
    print("wrote", plot_timelines(st, ct, sys.argv[1] if len(sys.argv) > 1 else "static_vs_continuous.png"))
