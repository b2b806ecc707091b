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
    """How many of a request's ``num_new_tokens`` it may compute in this step.

    Inputs: ``num_new_tokens`` (the request's gap, >= 0), ``token_budget`` (what
    is left of the step's budget) and ``long_prefill_token_threshold`` (a per-request
    cap per step; 0 disables it).
    Returns: an int ``n`` with ``0 <= n <= token_budget`` and ``n <= num_new_tokens``;
    ``n`` is also at most the threshold whenever the threshold is set.
    A threshold of 0 is "no cap", never "cap at zero".

    upstream: vllm/v1/core/sched/scheduler.py:390-392 long_prefill_token_threshold
    """
    raise NotImplementedError("clamp: the contract is in the docstring, hints in README.md")


def schedule_step(
    running: list[Req],
    waiting: deque[Req],
    kv: FakeKV,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    long_prefill_token_threshold: int = 0,
) -> StepOutput:
    """One ``schedule()`` call: decide what runs in this step.

    Inputs: ``running`` (admission order, oldest first), ``waiting`` (arrival
    order, head first), ``kv`` (block accounting), the step's token budget
    ``max_num_batched_tokens``, the seat cap ``max_num_seqs`` and the per-request
    ``long_prefill_token_threshold`` (0: none).
    Returns: a ``StepOutput`` whose ``num_scheduled_tokens`` maps each scheduled
    request id to its token count (every count >= 1; a request that gets nothing
    is absent), and whose ``preempted_req_ids`` lists this step's victims in the
    order they were evicted.

    Invariants the tests check against mini_vllm's ``Scheduler``:

    * the counts sum to at most ``max_num_batched_tokens``, and each is what
      ``clamp`` allows for that request's gap at that point of the step;
    * running requests are served before any waiting one;
    * ``len(running) <= max_num_seqs`` after admission; seats are checked only
      when admitting;
    * when memory for a running request runs out, the most recently admitted
      running request is preempted (blocks freed, ``num_computed_tokens`` back to
      0, ``num_preemptions`` + 1, put at the *head* of ``waiting``) until the
      request fits or was itself the victim; a request with no memory ends the
      running pass;
    * a step that preempted admits nobody;
    * waiting requests are admitted strictly in queue order: the first one that
      does not fit in memory stops admission (nobody overtakes it).

    Side effects: mutates ``running``, ``waiting`` and ``kv``; nothing else.

    upstream: vllm/v1/core/sched/scheduler.py:329 Scheduler.schedule
    """
    raise NotImplementedError("schedule_step: the contract is in the docstring, hints in README.md")


def finish_step(running: list[Req], output: StepOutput, kv: FakeKV) -> list[Req]:
    """The model ran the step in ``output``: update the counters and reap the finished.

    Inputs: ``running``, the ``StepOutput`` that ``schedule_step`` returned for it,
    and ``kv``.
    Effects: each scheduled request's ``num_computed_tokens`` grows by its count;
    a request whose two counters are then equal has computed everything it knows
    and emits one token (``num_output_tokens`` + 1); a partial prefill chunk
    emits nothing. Requests that reached ``max_tokens`` leave ``running`` (the
    others keep their order) and give their blocks back to ``kv``.
    Returns: the requests that finished, in their ``running`` order (may be empty).

    upstream: vllm/v1/core/sched/scheduler.py:1283 Scheduler.update_from_output
    """
    raise NotImplementedError("finish_step: the contract is in the docstring, hints in README.md")


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
