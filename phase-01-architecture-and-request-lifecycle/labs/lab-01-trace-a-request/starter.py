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

    Recipe:
      1. Reject a ``max_tokens`` that is not an int >= 1 (bools too) with a
         ValueError whose message names ``max_tokens``.
      2. ``engine = LLMEngine(**engine_kwargs)``; add the prompt with
         ``SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)``
         and KEEP THE ID IT RETURNS. Never type an id yourself.
      3. Record Event(0, ...) right away: the request is WAITING, 0 computed.
      4. ``while engine.has_unfinished_requests():`` call ``engine.step()``
         and record Event(step, ...). Find the request with ``_find``: after its
         last step it is no longer in ``engine.scheduler.running``; it is only
         in the list ``step()`` returned.
    """
    raise NotImplementedError("trace_request: drive LLMEngine.step() and snapshot after each step")


def summarize(events: list[Event], num_prompt_tokens: int) -> Summary:
    """Read the lifecycle off a trace: the status path and what each step did.

    Recipe:
      - ValueError if ``events`` is empty.
      - ``statuses``: each status once, in order of first appearance.
      - ``num_steps``: the step of the last event.
      - ``first_token_step``: the first event whose num_tokens > num_prompt_tokens.
      - For each pair (before, after) of consecutive events: a prefill step
        if before.num_computed_tokens < num_prompt_tokens; otherwise a decode
        step if the computed counter moved by exactly 1.
    """
    raise NotImplementedError("summarize: walk consecutive events and classify each step")


def expected_num_steps(
    num_prompt_tokens: int,
    max_tokens: int,
    max_num_batched_tokens: int = 2048,
    long_prefill_token_threshold: int = 0,
) -> int:
    """Steps a lone request takes: one per prefill chunk, then max_tokens - 1 decodes.

    Recipe:
      - ValueError (naming the parameter) if num_prompt_tokens, max_tokens or
        max_num_batched_tokens is not an int >= 1.
      - The chunk size is the budget, lowered to the threshold when
        0 < threshold < budget.
      - Chunks = ceil(num_prompt_tokens / chunk). The last chunk samples token
        1, so add max_tokens - 1.
    """
    raise NotImplementedError("expected_num_steps: chunks + max_tokens - 1")


if __name__ == "__main__":
    for event in trace_request("hello", max_tokens=4):
        print(event)
