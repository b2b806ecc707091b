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
from mini_vllm.sampling_params import SamplingParams  # noqa: F401  (you will need it)


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
    """Run one greedy, ignore-EOS request to completion; one Event per step, plus step 0.

    Inputs: the prompt text, ``max_tokens`` (an int >= 1; bools are rejected) and
    keyword arguments passed unchanged to ``LLMEngine``.
    Output: ``[Event(0, ...), Event(1, ...), ..., Event(N, ...)]`` where event 0 is
    the request just after it was added and event k its state after the k-th
    engine step; N is the step that finished it. Every event carries the ID the
    engine gave the request and the status *name* (a str).
    Invariants: the last event's status is FINISHED_LENGTH_CAPPED, even with a
    model that would emit EOS; ``num_computed_tokens`` and ``num_tokens`` never
    decrease.
    Errors: ValueError naming ``max_tokens`` for a bad ``max_tokens``.
    """
    raise NotImplementedError("trace_request: drive LLMEngine.step() and snapshot after each step")


def summarize(events: list[Event], num_prompt_tokens: int) -> Summary:
    """Read the lifecycle off a trace: the status path and what each step did.

    Inputs: a trace as ``trace_request`` returns it (step 0 first; any trace of
    that shape, hand-written ones included) and the prompt length in tokens.
    Output: a ``Summary`` whose fields are defined next to the class above. A
    step is judged by the counters on either side of it: it is a prefill step
    when the computed counter before it was still inside the prompt, and a
    decode step otherwise when the computed counter moved by exactly one.
    A status that appears again later (RUNNING after PREEMPTED) is listed once.
    Errors: ValueError naming ``events`` for an empty trace.
    """
    raise NotImplementedError("summarize: walk consecutive events and classify each step")


def expected_num_steps(
    num_prompt_tokens: int,
    max_tokens: int,
    max_num_batched_tokens: int = 2048,
    long_prefill_token_threshold: int = 0,
) -> int:
    """The number of engine steps a request alone in the engine takes to finish.

    Inputs: the prompt length and ``max_tokens`` (ints >= 1), the engine's token
    budget per step (int >= 1) and its long-prefill threshold (int >= 0; 0 means
    no threshold), with the same meaning as the ``LLMEngine`` arguments.
    Output: an int equal to ``trace_request(...)[-1].step`` for the same
    arguments, computed from the scheduling rules alone, without an engine.
    Errors: ValueError naming the parameter for a value that is not an int
    (bools included) or is below its minimum.
    """
    raise NotImplementedError("expected_num_steps: chunks + max_tokens - 1")


if __name__ == "__main__":
    for event in trace_request("hello", max_tokens=4):
        print(event)
