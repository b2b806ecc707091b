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

    Recipe: validate both arguments (integers >= 1, else ``ValueError`` naming
    the parameter). Every prompt token, and every output token except the last
    one (it is sampled but never fed back), needs a slot.
    """
    raise NotImplementedError("kv_slots_needed: see the recipe in the docstring")


def min_num_blocks(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """The smallest ``num_blocks`` in which one such request can run to the end alone.

    Recipe: validate ``block_size`` (integer >= 1); turn ``kv_slots_needed`` into
    whole blocks (ceiling division) and add 1 for the null block, which the
    pool never hands out. ``min_num_blocks(8, 20, 4) == 8``.
    """
    raise NotImplementedError("min_num_blocks: see the recipe in the docstring")


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
    """Greedy-generate for every prompt in a pool of ``num_blocks`` blocks; record preemptions.

    Recipe:
    1. ``engine = LLMEngine(model, block_size=..., num_blocks=..., enable_caching=...)``.
    2. ``params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)``.
    3. ``reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)``
       (a request that can never fit raises ``ValueError`` here: let it propagate).
    4. From the requests: ``output_token_ids`` and ``num_preemptions``. From
       ``engine.stats``: ``(s.step, request_id)`` for every id in ``s.preempted``,
       the number of steps, and a copy of each ``s.num_scheduled_tokens``.
    """
    raise NotImplementedError("run: see the recipe in the docstring")
