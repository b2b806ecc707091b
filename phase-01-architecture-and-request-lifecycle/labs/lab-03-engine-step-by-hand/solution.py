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

from mini_vllm.model_runner import prepare_inputs
from mini_vllm.request import Request
from mini_vllm.sampler import Sampler
from mini_vllm.scheduler import Scheduler, SchedulerOutput


def rows_to_sample(scheduler_output: SchedulerOutput) -> list[tuple[int, Request]]:
    """(row, request) for every scheduled request whose chunk completes its known tokens.

    Row i of the model's logits belongs to ``scheduled_requests[i]``. A request
    whose chunk stops short of ``num_tokens`` (a prefill chunk that is not the
    last) gets no row here: its logits predict a position whose token is known.
    Call this before ``update_from_output`` moves the counters.
    """
    rows = []
    for row, request in enumerate(scheduler_output.scheduled_requests):
        n = scheduler_output.num_scheduled_tokens[request.request_id]
        if request.num_computed_tokens + n == request.num_tokens:
            rows.append((row, request))
    return rows


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
    """
    if generators is None and any(
        not r.sampling_params.greedy for r in (*scheduler.running, *scheduler.waiting)
    ):
        raise ValueError(
            "generators: a non-greedy request needs a dict of generators that lives across steps"
        )
    out = scheduler.schedule()
    sampled: dict[str, int] = {}
    if out.total_num_scheduled_tokens > 0:
        logits = model.execute(prepare_inputs(out, scheduler.kv_cache_manager))
        for row, request in rows_to_sample(out):
            params = request.sampling_params
            generator = None
            if not params.greedy:
                rid = request.request_id
                if rid not in generators:
                    generators[rid] = np.random.default_rng(params.seed)
                generator = generators[rid]
            sampled[request.request_id] = sampler.sample(logits[row], params, generator)
    # Always update: a mid-prefill chunk samples nothing but must still advance
    # num_computed_tokens, or the next step would schedule the same chunk again.
    finished = scheduler.update_from_output(out, sampled)
    if generators is not None:
        for request in finished:
            generators.pop(request.request_id, None)
    return finished
