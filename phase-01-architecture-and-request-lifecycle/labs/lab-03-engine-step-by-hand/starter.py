"""Lab 01-03 — rebuild the engine step from its parts.

Given a scheduler, a model and a sampler, wire one step of the engine:
schedule -> prepare inputs -> run the model -> sample -> update. The result
must match ``mini_vllm.engine.LLMEngine.step`` token for token.

upstream: vllm/v1/worker/gpu_model_runner.py:2135 logits_indices
upstream: vllm/v1/worker/gpu_model_runner.py:2006-2009 discard_request_mask
upstream: vllm/v1/engine/core.py:428 EngineCore.step
"""
from __future__ import annotations

import numpy as np

from mini_vllm.model_runner import prepare_inputs  # noqa: F401  (you will need it)
from mini_vllm.request import Request
from mini_vllm.sampler import Sampler
from mini_vllm.scheduler import Scheduler, SchedulerOutput


def rows_to_sample(scheduler_output: SchedulerOutput) -> list[tuple[int, Request]]:
    """(row, request) for every scheduled request whose chunk completes its known tokens.

    Row i of the model's logits belongs to ``scheduled_requests[i]``. A request
    whose chunk stops short of ``num_tokens`` (a prefill chunk that is not the
    last) gets no row here: its logits predict a position whose token is known.
    Call this before ``update_from_output`` moves the counters.

    Input: the ``SchedulerOutput`` of one ``schedule()`` call, before the update.
    Output: a list of ``(row, request)`` in increasing row order, where ``row`` is
    the request's position in ``scheduled_requests`` (positions of requests that
    do not sample are skipped, not closed up). Reads only; changes nothing.
    """
    raise NotImplementedError("rows_to_sample: keep the rows whose chunk catches up")


def engine_step(
    scheduler: Scheduler,
    model,
    sampler: Sampler,
    generators: dict[str, np.random.Generator] | None = None,
) -> list[Request]:
    """One step; returns the requests that finished in it.

    ``generators`` maps request id -> that request's random generator and must
    outlive the step (the caller keeps it). A request without one gets
    ``np.random.default_rng(params.seed)`` on its first sample, as LLMEngine
    does for a seeded request. ``None`` is allowed only when every request is greedy.

    Inputs: the parts of one ``LLMEngine`` (its scheduler, model and sampler) and
    the caller's generator dictionary.
    Output: exactly the requests that finished in this step (what
    ``LLMEngine.step`` would return), possibly ``[]``.
    Invariants: after any number of calls, every request's tokens, status and
    finishing step equal those ``LLMEngine.step`` would produce; only requests
    whose chunk completes their known tokens draw a token (and a random number);
    a step that schedules nothing does not run the model; a finished request's
    generator is removed from ``generators``.
    Errors: ValueError naming ``generators`` when it is ``None`` and any waiting
    or running request is not greedy, raised before anything is scheduled.
    """
    raise NotImplementedError("engine_step: schedule, run, sample the caught-up rows, update")
