"""The scheduler: each step, decide which requests run and how many tokens each gets.

There is no prefill phase and no decode phase. A request has ``num_tokens``
(prompt + output so far) and ``num_computed_tokens`` (tokens whose KV exists);
each step the scheduler hands out a budget of ``max_num_batched_tokens`` tokens
to let the second counter catch up with the first. A whole prompt, a chunk of
one, one decode token and a recompute after preemption are the same move, so
prefills and decodes mix freely in one batch.

``schedule()`` in two passes, like vLLM v1:

1. RUNNING requests, in order. Each gets ``min(remaining, threshold, budget)``
   tokens. If ``allocate_slots`` has no room, preempt the *last* running
   request (FCFS: the newest loses), free its blocks and retry; if the victim
   is the request itself, stop.
2. WAITING requests, FCFS, only if nothing was preempted this step and fewer
   than ``max_num_seqs`` are running. Each starts from its prefix-cache hit
   (``get_computed_blocks``); the first that does not fit stops admission.
   With ``max_loras`` set (Phase 11), a request whose adapter would be one
   distinct adapter too many for this step is *skipped*, not a barrier: it
   keeps its place in the queue and later requests may still run.

Deliberate differences from upstream (each keeps the file small; none
changes which tokens a request produces):

* ``num_computed_tokens`` advances in ``update_from_output`` (after the model
  ran), not at the end of ``schedule()``. Upstream moves it early so the next
  step can be scheduled while this one runs (async scheduling); mini_vllm is
  synchronous, and this way ``num_computed_tokens`` still marks where the
  scheduled chunk starts while the step executes.
* No full-sequence admission check. Upstream passes
  ``full_sequence_must_fit=scheduler_reserve_full_isl`` (on by default) and
  admits a waiting request only if its whole current sequence fits in the
  free blocks; mini_vllm admits it as soon as its first chunk fits. With
  chunked prefill in a tight pool it may therefore admit a request that
  upstream would keep waiting, and preempt later. ``LLMEngine.add_request``
  guarantees every request fits the pool alone, so preemption always
  resolves it.
* One waiting queue. Upstream parks the requests a step skipped (here: for
  ``max_loras``) in a second queue, ``skipped_waiting``, which FCFS reads
  first; mini_vllm puts them back at the front of its one queue, in order,
  which visits requests in the same order, with one exception: a request
  preempted later goes to the front here, but behind the skipped ones
  upstream (see the ``upstream:`` line for ``_select_waiting_queue_for_scheduling``).
* FCFS only (no priority policy); chunked prefill is always on (no
  ``enable_chunked_prefill=False`` mode); no encoder inputs, KV connectors
  or pausing.
* ``SchedulerOutput`` carries the ``Request`` objects themselves, not
  upstream's ``NewRequestData`` / ``CachedRequestData`` copies meant for a
  worker process; ``preempted_req_ids`` is a list in preemption order, not a set.
* ``update_from_output`` takes ``{request_id: token}`` (a list of tokens
  after a speculative step) instead of a ``ModelRunnerOutput`` and returns
  the finished requests.

Speculative decoding (upstream's scheme, synchronous): a running request
schedules ``num_tokens_with_spec - num_computed_tokens`` tokens, its last token
plus the drafts in ``request.spec_token_ids``, cut by the budget and by
``max_model_len - 1 - num_computed_tokens``; the drafts that fit move to
``SchedulerOutput.scheduled_spec_decode_tokens`` and the request's list is
emptied (the engine proposes new ones after the step). ``update_from_output``
then takes a list of tokens per request, rolls ``num_computed_tokens`` back by
the rejected count (the rejected slots' KV is overwritten next step; no block
is freed) and runs the stop checks token by token, dropping what follows a
stop. ``num_lookahead_tokens`` is 0: upstream's too for n-gram (the draft-model
proposer here keeps no KV of its own, so it needs none either).

upstream: vllm/v1/core/sched/scheduler.py:329 Scheduler.schedule
upstream: vllm/v1/core/sched/scheduler.py:396-398 max_model_len
upstream: vllm/v1/core/sched/scheduler.py:721-731 full_sequence_must_fit
upstream: vllm/v1/core/sched/scheduler.py:1621 _select_waiting_queue_for_scheduling
upstream: vllm/v1/core/sched/output.py:181 SchedulerOutput
upstream: vllm/v1/core/sched/scheduler.py:218 num_lookahead_tokens
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request, RequestStatus


@dataclass(slots=True)
class SchedulerOutput:
    """What one step runs. Batch order: ``scheduled_running_reqs`` then ``scheduled_new_reqs``.

    ``scheduled_new_reqs`` holds newly admitted and resumed (previously
    preempted) requests alike, as upstream's v2 model runner merges them
    (upstream: vllm/v1/core/sched/scheduler.py:850 scheduled_resumed_reqs).
    ``finished_req_ids`` are the requests that finished since the previous
    ``schedule()`` (so a model runner can drop their state).
    """

    scheduled_new_reqs: list[Request] = field(default_factory=list)
    scheduled_running_reqs: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    num_cached_tokens: dict[str, int] = field(default_factory=dict)
    # Draft tokens scheduled after each request's last token (speculative decoding only).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def scheduled_requests(self) -> list[Request]:
        return self.scheduled_running_reqs + self.scheduled_new_reqs


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        long_prefill_token_threshold: int = 0,
        max_model_len: int | None = None,
        max_loras: int | None = None,
    ) -> None:
        if max_loras is not None and (isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1):
            raise ValueError(f"max_loras must be None (LoRA off) or an integer >= 1, got {max_loras!r}")
        self.max_loras = max_loras
        for name, value, low in (
            ("max_num_seqs", max_num_seqs, 1),
            ("max_num_batched_tokens", max_num_batched_tokens, 1),
            ("long_prefill_token_threshold", long_prefill_token_threshold, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max_model_len is not None and (
            isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2
        ):
            raise ValueError(f"max_model_len must be None or an integer >= 2, got {max_model_len!r}")
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()

    def add_request(self, request: Request) -> None:
        """upstream: vllm/v1/core/sched/scheduler.py:1755 Scheduler.add_request"""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def _clamp_new_tokens(self, num_new_tokens: int, token_budget: int) -> int:
        """The long-prefill cap, then the step's remaining budget.

        upstream: vllm/v1/core/sched/scheduler.py:390-392 long_prefill_token_threshold
        """
        if 0 < self.long_prefill_token_threshold < num_new_tokens:
            num_new_tokens = self.long_prefill_token_threshold
        return min(num_new_tokens, token_budget)

    @staticmethod
    def needs_sample(request: Request, num_scheduled_tokens: int) -> bool:
        """True when this step computes the request's last known token: its logits
        give the next token. A mid-prefill chunk samples nothing. (Scheduled draft
        tokens come after the last known token, hence ``>=``.)"""
        return request.num_computed_tokens + num_scheduled_tokens >= request.num_tokens

    def schedule(self) -> SchedulerOutput:
        kv = self.kv_cache_manager
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        token_budget = self.max_num_batched_tokens

        # Pass 1: RUNNING. upstream: vllm/v1/core/sched/scheduler.py:441-491 preempted_req
        i = 0
        while token_budget > 0 and i < len(self.running):
            request = self.running[i]
            num_new = self._clamp_new_tokens(
                request.num_tokens_with_spec - request.num_computed_tokens, token_budget
            )
            if self.max_model_len is not None:
                # Binds only on drafts (upstream: vllm/v1/core/sched/scheduler.py:396-398 max_model_len).
                num_new = min(num_new, self.max_model_len - 1 - request.num_computed_tokens)
            while (new_blocks := kv.allocate_slots(request, num_new)) is None:
                victim = self.running.pop()  # FCFS: the most recently admitted
                self._preempt_request(victim)
                out.preempted_req_ids.append(victim.request_id)
                if victim is request:
                    break
            if new_blocks is None:
                break
            out.scheduled_running_reqs.append(request)
            out.num_scheduled_tokens[request.request_id] = num_new
            if request.spec_token_ids:
                # upstream: vllm/v1/core/sched/scheduler.py:513 scheduled_spec_decode_tokens
                num_spec = num_new + request.num_computed_tokens - request.num_tokens
                if num_spec > 0:
                    out.scheduled_spec_decode_tokens[request.request_id] = request.spec_token_ids[:num_spec]
                request.spec_token_ids = []
            token_budget -= num_new
            i += 1

        # Pass 2: WAITING. upstream: vllm/v1/core/sched/scheduler.py:545 preempted_reqs
        # The adapters this step runs, by id (upstream: vllm/v1/core/sched/scheduler.py:535-542 scheduled_loras).
        scheduled_loras = {r.lora_request.lora_int_id for r in out.scheduled_running_reqs
                           if r.lora_request is not None}
        skipped: list[Request] = []
        while (
            not out.preempted_req_ids
            and self.waiting
            and token_budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            request = self.waiting[0]
            lora = request.lora_request
            if (self.max_loras is not None and lora is not None and len(scheduled_loras) == self.max_loras
                    and lora.lora_int_id not in scheduled_loras):
                # One adapter too many this step: skip it, keep its place
                # (upstream: vllm/v1/core/sched/scheduler.py:572-582 max_loras).
                skipped.append(self.waiting.popleft())
                continue
            hits, num_hit_tokens = kv.get_computed_blocks(request)
            num_new = self._clamp_new_tokens(request.num_tokens - num_hit_tokens, token_budget)
            if kv.allocate_slots(request, num_new, hits, num_hit_tokens) is None:
                break  # head-of-line: later arrivals wait behind it (FCFS)
            self.waiting.popleft()
            if lora is not None:
                scheduled_loras.add(lora.lora_int_id)
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit_tokens
            out.scheduled_new_reqs.append(request)
            out.num_scheduled_tokens[request.request_id] = num_new
            out.num_cached_tokens[request.request_id] = num_hit_tokens
            token_budget -= num_new

        self.waiting.extendleft(reversed(skipped))  # the skipped go back in front, in their order
        out.total_num_scheduled_tokens = self.max_num_batched_tokens - token_budget
        assert len(self.running) <= self.max_num_seqs
        return out

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, go to the front.

        The request keeps ``output_token_ids``; when readmitted it prefills
        prompt + output so far (its prefix-cache lookup uses all of them).
        The caller has already removed it from ``running``.

        upstream: vllm/v1/core/sched/scheduler.py:929 Scheduler._preempt_request
        """
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.spec_token_ids = []
        self.waiting.appendleft(request)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled: dict[str, int | list[int]]
    ) -> list[Request]:
        """Advance each scheduled request, append its sampled token(s), reap the finished.

        ``sampled`` maps request id -> token (or, with scheduled drafts, the list of
        1 to drafts + 1 tokens the rejection sampler kept) for exactly the requests for which
        ``needs_sample`` was true (a token for a request aborted since
        ``schedule()`` is ignored). Anything else is a ``ValueError``, raised
        before any request changes: a lost or extra token would silently
        corrupt the request. One O(len(running)) rebuild removes the finished
        requests, never one ``list.remove`` per request
        (upstream: vllm/v1/core/sched/scheduler.py:1530 remove_all).

        upstream: vllm/v1/core/sched/scheduler.py:1283 Scheduler.update_from_output
        """
        self._check_sampled(scheduler_output, sampled)
        finished: list[Request] = []
        for request in scheduler_output.scheduled_requests:
            if request.is_finished():  # aborted after schedule()
                continue
            request.num_computed_tokens += scheduler_output.num_scheduled_tokens[request.request_id]
            tokens = _as_list(sampled.get(request.request_id))
            if not tokens:
                continue
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(request.request_id)
            if drafts:
                # upstream: vllm/v1/core/sched/scheduler.py:1374 num_rejected
                request.num_computed_tokens -= len(drafts) + 1 - len(tokens)
            for token in tokens:  # stop checks token by token: what follows a stop is dropped
                request.append_output_token(token)
                if request.maybe_finish(self.max_model_len):
                    finished.append(request)
                    break
        if finished:
            self.running = [r for r in self.running if not r.is_finished()]
            for request in finished:
                self._free_request(request)
        return finished

    @classmethod
    def _check_sampled(cls, scheduler_output: SchedulerOutput, sampled: dict[str, int]) -> None:
        scheduled = {r.request_id: r for r in scheduler_output.scheduled_requests}
        unknown = sorted(set(sampled) - set(scheduled))
        if unknown:
            raise ValueError(f"sampled: requests {unknown} were not scheduled in this step")
        for rid, request in scheduled.items():
            if request.is_finished():
                continue
            n = scheduler_output.num_scheduled_tokens[rid]
            needs = cls.needs_sample(request, n)
            if rid in sampled and not needs:
                raise ValueError(
                    f"sampled: request {rid!r} is mid-prefill ({request.num_computed_tokens + n}"
                    f"/{request.num_tokens} tokens after this step) and must not sample"
                )
            if needs and rid not in sampled:
                raise ValueError(f"sampled: request {rid!r} computed its last token and needs a token")
            if rid in sampled:
                limit = 1 + len(scheduler_output.scheduled_spec_decode_tokens.get(rid, ()))
                if not 1 <= len(_as_list(sampled[rid])) <= limit:
                    raise ValueError(f"sampled: request {rid!r} must get 1 to {limit} tokens "
                                     f"(drafts + 1), got {sampled[rid]!r}")

    def finish_requests(self, request_ids: str | list[str], status: RequestStatus) -> None:
        """Finish requests from outside (an abort); unknown or finished ids are ignored.

        upstream: vllm/v1/core/sched/scheduler.py:1779 Scheduler.finish_requests
        """
        if not RequestStatus.is_finished(status):
            raise ValueError(f"status must be a finished status, got {status.name}")
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        requests = [self.requests[i] for i in ids if i in self.requests]
        # Filter by id, in one pass per queue: linear however many are aborted.
        running = {r.request_id for r in requests if r.status == RequestStatus.RUNNING}
        if running:
            self.running = [r for r in self.running if r.request_id not in running]
        if len(running) < len(requests):
            gone = {r.request_id for r in requests}
            self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
        for request in requests:
            request.status = status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        """upstream: vllm/v1/core/sched/scheduler.py:1842 Scheduler._free_request"""
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unfinished_requests(self) -> int:
        """upstream: vllm/v1/core/sched/scheduler.py:1872 Scheduler.get_num_unfinished_requests"""
        return len(self.waiting) + len(self.running)


def _as_list(tokens: int | list[int] | None) -> list[int]:
    return [] if tokens is None else list(tokens) if isinstance(tokens, list | tuple) else [tokens]
