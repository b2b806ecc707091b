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

    ``"fcfs"``: by arrival step (ties by request id). ``"priority"``: by
    ``(priority, arrival_step, request_id)``, lower priority value first, the
    order of vLLM's ``Request.__lt__``.

    upstream: vllm/v1/request.py:301 Request.__lt__
    """
    if policy == "fcfs":
        return sorted(queue, key=lambda a: (a.arrival_step, a.request_id))
    if policy == "priority":
        return sorted(queue, key=lambda a: (a.priority, a.arrival_step, a.request_id))
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


def simulate(
    workload: list[Arrival],
    mode: str,
    max_batch: int = 8,
    policy: str = "fcfs",
    max_num_batched_tokens: int = 2048,
    max_ticks: int = 100_000,
) -> RunResult:
    """Serve ``workload`` with static or continuous batching; return every request's timeline.

    Each tick: queue the requests whose ``arrival_step`` has come; hand free
    seats to queued requests in ``admission_order``; if the engine has work,
    run one ``engine.step()``. Seats: in ``"continuous"`` mode a seat frees the
    moment its request finishes; in ``"static"`` mode new requests enter only
    when the engine is completely empty, up to ``max_batch`` at once.
    """
    if mode not in ("static", "continuous"):
        raise ValueError(f"mode must be 'static' or 'continuous', got {mode!r}")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    admission_order([], policy)  # validates the policy name
    engine = LLMEngine("toy", max_num_seqs=max_batch, max_num_batched_tokens=max_num_batched_tokens)
    params = {a.request_id: SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
              for a in workload}
    pending = sorted(workload, key=lambda a: (a.arrival_step, a.request_id))
    queue: list[Arrival] = []
    tick_of_step: dict[int, int] = {}  # engine step number (1-based) -> tick
    requests = {}
    step_tokens: list[int] = []
    tick = 0
    while pending or queue or engine.has_unfinished_requests():
        if tick >= max_ticks:
            raise RuntimeError(f"simulate: not done after max_ticks={max_ticks}")
        while pending and pending[0].arrival_step <= tick:
            queue.append(pending.pop(0))
        in_engine = engine.scheduler.get_num_unfinished_requests()
        seats = max_batch - in_engine if mode == "continuous" or in_engine == 0 else 0
        if seats > 0 and queue:
            chosen = admission_order(queue, policy)[:seats]
            for a in chosen:
                queue.remove(a)
                engine.add_request(_prompt(a), params[a.request_id], request_id=a.request_id)
                requests[a.request_id] = engine.scheduler.requests[a.request_id]
        if engine.has_unfinished_requests():
            engine.step()
            tick_of_step[engine.num_steps] = tick
            step_tokens.append(sum(engine.stats[-1].num_scheduled_tokens.values()))
        else:
            step_tokens.append(0)
        tick += 1

    timelines = []
    for a in workload:
        req = requests[a.request_id]
        m = req.metrics
        steps = [m.first_token_step]
        for gap in m.inter_token_steps:
            steps.append(steps[-1] + gap)
        first_sched = min(s.step for s in engine.stats if a.request_id in s.num_scheduled_tokens)
        timelines.append(Timeline(a.request_id, a.arrival_step, tick_of_step[first_sched],
                                  [tick_of_step[s] for s in steps], list(req.output_token_ids),
                                  a.priority))
    makespan = max(t.finish_step for t in timelines) + 1
    return RunResult(mode, timelines, makespan, step_tokens[:makespan])


def summarize(result: RunResult) -> dict[str, float]:
    """Throughput and latency, all in steps.

    * ``throughput``: output tokens per step over the makespan;
    * ``ttft_*``: steps from arrival to the end of the step that sampled the
      first token (a request that arrives and prefills in the same tick has
      TTFT 1); mean, p50, p99;
    * ``itl_*``: steps between consecutive tokens of a request; p50, p99;
    * ``itl_work_p99``: the p99, over every token after the first, of the total
      tokens scheduled in the step that produced it (lab-05's "cost seen from
      the victim's seat");
    * ``mean_in_system``: the time-average number of requests that have
      arrived but not finished (Little's L).
    """
    tl = result.timelines
    ttft = [t.first_token_step + 1 - t.arrival_step for t in tl]
    itl = [b - a for t in tl for a, b in zip(t.token_steps, t.token_steps[1:], strict=False)]
    work = [result.step_tokens[s] for t in tl for s in t.token_steps[1:]]
    tokens = sum(len(t.token_steps) for t in tl)
    in_system = sum(t.finish_step + 1 - t.arrival_step for t in tl)
    return {
        "throughput": tokens / result.makespan,
        "ttft_mean": float(np.mean(ttft)),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": percentile(itl, 50) if itl else 0.0,
        "itl_p99": percentile(itl, 99) if itl else 0.0,
        "itl_work_p99": percentile(work, 99) if work else 0.0,
        "mean_in_system": in_system / result.makespan,
        "mean_time_in_system": in_system / len(tl),
        "arrival_rate": len(tl) / result.makespan,
    }


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
