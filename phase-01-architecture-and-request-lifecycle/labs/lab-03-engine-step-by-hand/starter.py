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

    Recipe: enumerate ``scheduler_output.scheduled_requests``; with
    n = ``num_scheduled_tokens[request.request_id]``, keep (row, request) when
    ``request.num_computed_tokens + n == request.num_tokens``.
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

    Recipe:
      0. If ``generators is None`` and any request in ``scheduler.running`` or
         ``scheduler.waiting`` is not greedy (``sampling_params.greedy``), raise
         ValueError naming ``generators`` -- before touching the scheduler.
      1. PLAN:   ``out = scheduler.schedule()``.
      2. RUN:    if ``out.total_num_scheduled_tokens > 0``:
                 ``logits = model.execute(prepare_inputs(out, scheduler.kv_cache_manager))``;
                 row i belongs to ``out.scheduled_requests[i]``.
      3. PICK:   for (row, request) in ``rows_to_sample(out)`` only:
                 ``sampler.sample(logits[row], params, generator)``, where the
                 generator is None for greedy requests, else the request's
                 generator from ``generators`` (create it on first use).
                 Collect ``{request_id: token}``.
      4. UPDATE: ``finished = scheduler.update_from_output(out, sampled)`` --
                 ALWAYS, even when nothing was sampled.
      5. Drop the generators of finished requests; return ``finished``.
    """
    raise NotImplementedError("engine_step: schedule, run, sample the caught-up rows, update")
