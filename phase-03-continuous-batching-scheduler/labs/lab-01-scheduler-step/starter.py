"""Lab 03-01 — the scheduler step: one token budget, running first, then waiting.

You rebuild the heart of ``Scheduler.schedule()``: every step, hand out at most
``max_num_batched_tokens`` tokens, first to the requests already running, then
to the waiting queue in arrival order, never more than ``max_num_seqs`` running
at once, and preempt the newest running request when KV memory runs out.

The lab ships the pieces you do not write: ``Req`` (a request reduced to its two
counters), ``FakeKV`` (block-granular KV memory with no prefix cache: the same
capacity arithmetic as ``mini_vllm.kv_cache.KVCacheManager(enable_caching=False)``),
``StepOutput`` and ``run_workload`` (the engine loop). You write ``clamp``,
``schedule_step`` and ``finish_step``.

upstream: vllm/v1/core/sched/scheduler.py:329 Scheduler.schedule
upstream: vllm/v1/core/sched/scheduler.py:929 Scheduler._preempt_request
upstream: vllm/v1/core/sched/scheduler.py:1283 Scheduler.update_from_output
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(eq=False)
class Req:
    """A request reduced to what the scheduler looks at: two counters and a length cap.

    ``num_tokens`` (prompt + output so far) is how far the request *should* be;
    ``num_computed_tokens`` is how far its KV *is*. A step that closes the gap
    emits one new token, which makes ``num_tokens`` grow by one again.
    """

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError(f"num_prompt_tokens must be >= 1, got {self.num_prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def finished(self) -> bool:
        return self.num_output_tokens >= self.max_tokens


class FakeKV:
    """KV memory counted in blocks, no prefix cache, block 0 reserved.

    ``num_blocks`` includes one block that is never handed out (mini_vllm's null
    block), so ``num_blocks - 1`` blocks are usable. A request holding
    ``num_computed_tokens + n`` tokens needs ``ceil((num_computed_tokens + n) / block_size)``
    blocks; ``allocate`` grants the missing ones or refuses, changing nothing.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_blocks must be an integer >= 2 (block 0 is reserved), got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size
        self.num_free_blocks = num_blocks - 1
        self.held: dict[str, int] = {}

    def blocks_needed(self, req: Req, num_new_tokens: int) -> int:
        total = req.num_computed_tokens + num_new_tokens
        return max(-(-total // self.block_size) - self.held.get(req.request_id, 0), 0)

    def allocate(self, req: Req, num_new_tokens: int) -> bool:
        need = self.blocks_needed(req, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        self.held[req.request_id] = self.held.get(req.request_id, 0) + need
        self.num_free_blocks -= need
        return True

    def free(self, req: Req) -> None:
        self.num_free_blocks += self.held.pop(req.request_id, 0)


@dataclass
class StepOutput:
    """What one step runs: tokens per request id, and who was preempted."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted_req_ids: list[str] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


def clamp(num_new_tokens: int, token_budget: int, long_prefill_token_threshold: int = 0) -> int:
    """How many of ``num_new_tokens`` a request gets this step.

    Recipe:
    1. If ``0 < long_prefill_token_threshold < num_new_tokens``, cut
       ``num_new_tokens`` down to the threshold (0 means "no cap", not "zero").
    2. Then take the smaller of that and ``token_budget``.
    3. Never return a negative number.

    upstream: vllm/v1/core/sched/scheduler.py:390-392 long_prefill_token_threshold
    """
    raise NotImplementedError("clamp: apply the threshold, then the budget (see the docstring)")


def schedule_step(
    running: list[Req],
    waiting: deque[Req],
    kv: FakeKV,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    long_prefill_token_threshold: int = 0,
) -> StepOutput:
    """One ``schedule()`` call. Mutates ``running``, ``waiting`` and ``kv``.

    Recipe:
    1. ``token_budget = max_num_batched_tokens``; ``out = StepOutput()``.
    2. RUNNING pass: walk ``running`` with an index ``i`` while
       ``i < len(running)`` and ``token_budget > 0``. For ``req = running[i]``:
       ``n = clamp(req.num_tokens - req.num_computed_tokens, token_budget, threshold)``.
       Try ``kv.allocate(req, n)``. While it fails: ``victim = running.pop()``
       (the newest), ``kv.free(victim)``, ``victim.num_computed_tokens = 0``,
       ``victim.num_preemptions += 1``, ``waiting.appendleft(victim)``, record
       its id in ``out.preempted_req_ids``; if the victim *is* ``req`` stop
       retrying, else retry the allocation. If ``req`` still has no memory,
       end the RUNNING pass. Otherwise record ``n``, subtract it from the
       budget, ``i += 1``.
    3. WAITING pass, only if nothing was preempted this step: while
       ``waiting`` is not empty, ``token_budget > 0`` and
       ``len(running) < max_num_seqs``: look at ``waiting[0]`` (do not pop
       yet), clamp its gap the same way, try ``kv.allocate``; on failure stop
       admitting (head-of-line: nobody behind it jumps ahead); on success pop
       it, append it to ``running``, record ``n``, subtract it from the budget.
    4. Return ``out``.

    upstream: vllm/v1/core/sched/scheduler.py:329 Scheduler.schedule
    """
    raise NotImplementedError("schedule_step: running pass, then waiting pass (see the docstring)")


def finish_step(running: list[Req], output: StepOutput, kv: FakeKV) -> list[Req]:
    """The model ran: advance counters, emit tokens, reap the finished.

    Recipe:
    1. For each ``(request_id, n)`` in ``output.num_scheduled_tokens``, find the
       request in ``running`` and add ``n`` to its ``num_computed_tokens``.
    2. If that makes ``num_computed_tokens == num_tokens``, the step computed
       its last known token: it emits one (``num_output_tokens += 1``).
       A mid-prefill chunk emits nothing.
    3. Requests with ``finished`` true leave ``running`` (keep the others in
       order) and ``kv.free`` their blocks. Return the finished ones in their
       ``running`` order.

    upstream: vllm/v1/core/sched/scheduler.py:1283 Scheduler.update_from_output
    """
    raise NotImplementedError("finish_step: advance, emit, reap (see the docstring)")


def run_workload(
    arrivals: list[tuple[int, Req]],
    kv: FakeKV,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    long_prefill_token_threshold: int = 0,
    max_steps: int = 10_000,
) -> list[StepOutput]:
    """Drive ``schedule_step`` / ``finish_step`` until every request finishes.

    ``arrivals`` holds ``(step, request)``: a request joins ``waiting`` at the
    start of that step (steps count from 0). Returns one ``StepOutput`` per
    step, empty for a step with nothing to run.
    """
    pending = sorted(arrivals, key=lambda a: a[0])
    running: list[Req] = []
    waiting: deque[Req] = deque()
    trace: list[StepOutput] = []
    for step in range(max_steps):
        while pending and pending[0][0] <= step:
            waiting.append(pending.pop(0)[1])
        if not (pending or running or waiting):
            return trace
        out = schedule_step(
            running, waiting, kv, max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold
        )
        finish_step(running, out, kv)
        trace.append(out)
    raise RuntimeError(f"run_workload: still busy after max_steps={max_steps} steps")
