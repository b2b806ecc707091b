"""Lab 01-01 — trace one request's lifecycle through mini_vllm, step by step.

You drive the engine loop yourself (``step()`` after ``step()``) and, between
steps, write down the request's status and its two counters. The result is the
request's whole life as data you can assert on.

upstream: vllm/v1/engine/core.py:428 EngineCore.step
upstream: vllm/v1/request.py:315 RequestStatus
upstream: vllm/v1/core/sched/scheduler.py:330-338 num_computed_tokens
"""
from __future__ import annotations

from typing import NamedTuple

from mini_vllm.engine import LLMEngine
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams


class Event(NamedTuple):
    """One snapshot of one request. Step 0 is the moment after ``add_request``."""

    step: int
    request_id: str
    status: str  # a RequestStatus name: "WAITING", "RUNNING", "FINISHED_LENGTH_CAPPED", ...
    num_computed_tokens: int
    num_tokens: int


class Summary(NamedTuple):
    statuses: list[str]  # the distinct statuses in the order they first appeared
    num_steps: int  # engine steps from add_request to finished
    first_token_step: int  # the first step after which num_tokens exceeds the prompt
    prefill_steps: int  # steps that computed prompt tokens
    decode_steps: int  # steps that computed exactly one generated token


def _find(engine: LLMEngine, request_id: str, finished: list[Request]) -> Request:
    """Where a request is now: running, waiting, or just returned by step()."""
    for request in (*engine.scheduler.running, *engine.scheduler.waiting, *finished):
        if request.request_id == request_id:
            return request
    raise LookupError(f"request {request_id!r} is in neither queue nor the finished list")


def trace_request(prompt: str, max_tokens: int = 4, **engine_kwargs) -> list[Event]:
    """Run one greedy, ignore-EOS request to completion; one Event per step, plus step 0."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    engine = LLMEngine(**engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request_id = engine.add_request(prompt, params)

    def snap(step: int, finished: list[Request]) -> Event:
        r = _find(engine, request_id, finished)
        return Event(step, r.request_id, r.status.name, r.num_computed_tokens, r.num_tokens)

    events = [snap(0, [])]
    step = 0
    while engine.has_unfinished_requests():
        finished = engine.step()  # a finished request has already left `running`
        step += 1
        events.append(snap(step, finished))
    return events


def summarize(events: list[Event], num_prompt_tokens: int) -> Summary:
    """Read the lifecycle off a trace: the status path and what each step did."""
    if not events:
        raise ValueError("events must hold at least the step-0 snapshot")
    statuses: list[str] = []
    for e in events:
        if e.status not in statuses:
            statuses.append(e.status)
    first_token_step = next(e.step for e in events if e.num_tokens > num_prompt_tokens)
    prefill = decode = 0
    for before, after in zip(events, events[1:], strict=False):
        if before.num_computed_tokens < num_prompt_tokens:
            prefill += 1
        elif after.num_computed_tokens - before.num_computed_tokens == 1:
            decode += 1
    return Summary(statuses, events[-1].step, first_token_step, prefill, decode)


def expected_num_steps(
    num_prompt_tokens: int,
    max_tokens: int,
    max_num_batched_tokens: int = 2048,
    long_prefill_token_threshold: int = 0,
) -> int:
    """Steps a lone request takes: one per prefill chunk, then max_tokens - 1 decodes.

    The last chunk samples token 1, so only max_tokens - 1 steps remain.
    """
    for name, value, low in (
        ("num_prompt_tokens", num_prompt_tokens, 1),
        ("max_tokens", max_tokens, 1),
        ("max_num_batched_tokens", max_num_batched_tokens, 1),
        ("long_prefill_token_threshold", long_prefill_token_threshold, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    chunk = max_num_batched_tokens
    if 0 < long_prefill_token_threshold < chunk:
        chunk = long_prefill_token_threshold
    num_chunks = -(-num_prompt_tokens // chunk)
    return num_chunks + max_tokens - 1


if __name__ == "__main__":
    for event in trace_request("hello", max_tokens=4):
        print(event)
