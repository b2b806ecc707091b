"""Lab 03-04 — preemption: a tight but feasible pool, and outputs that do not change.

Two requests that cannot both finish in the pool, each of which fits alone.
The scheduler must evict one (recompute-style: drop its KV, keep its tokens),
let the other finish, and replay the victim. The outputs must be exactly those
of a pool with room to spare.

``min_num_blocks`` is the feasibility rule the seed's version of this lab
broke: with 5 blocks of 4 slots (one of them the null block) not even one
request of 8 prompt tokens and 20 output tokens fits.

upstream: vllm/v1/core/sched/scheduler.py:443-491 preempted_req
upstream: vllm/v1/core/sched/scheduler.py:929 Scheduler._preempt_request
upstream: vllm/v1/core/kv_cache_utils.py:794 check_enough_kv_cache_memory
"""
from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.engine import LLMEngine  # noqa: F401  (used by the code you write)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401


def kv_slots_needed(prompt_len: int, max_tokens: int) -> int:
    """KV slots a request fills by the time it finishes.

    Every prompt token and every output token except the last is fed back
    through the model, so ``prompt_len + max_tokens - 1``.
    """
    for name, value in (("prompt_len", prompt_len), ("max_tokens", max_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return prompt_len + max_tokens - 1


def min_num_blocks(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """The smallest ``num_blocks`` in which one such request can run to the end alone.

    Its slots in whole blocks, plus the null block (block 0 is never handed out).
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    return -(-kv_slots_needed(prompt_len, max_tokens) // block_size) + 1


@dataclass
class PreemptionRun:
    token_ids: list[list[int]]  # per prompt, in prompt order
    num_preemptions: list[int]  # per prompt
    preemptions: list[tuple[int, str]]  # (engine step, request id) for every preemption
    num_steps: int
    step_tokens: list[dict[str, int]]  # what every engine step scheduled
    request_ids: list[str]


def run(
    prompts: list[list[int]],
    num_blocks: int,
    block_size: int = 4,
    max_tokens: int = 20,
    enable_caching: bool = False,
    model: str = "tiny-random",
) -> PreemptionRun:
    """Greedy-generate for every prompt in a pool of ``num_blocks`` blocks; record preemptions."""
    engine = LLMEngine(model, block_size=block_size, num_blocks=num_blocks,
                       enable_caching=enable_caching)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
    return PreemptionRun(
        token_ids=[list(r.output_token_ids) for r in reqs],
        num_preemptions=[r.num_preemptions for r in reqs],
        preemptions=[(s.step, rid) for s in engine.stats for rid in s.preempted],
        num_steps=len(engine.stats),
        step_tokens=[dict(s.num_scheduled_tokens) for s in engine.stats],
        request_ids=[r.request_id for r in reqs],
    )
