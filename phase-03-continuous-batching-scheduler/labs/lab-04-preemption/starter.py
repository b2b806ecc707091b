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
    """KV slots one request has filled by the time it finishes.

    Inputs: ``prompt_len`` and ``max_tokens``, ints >= 1 (``bool`` is not an int
    here). Returns an int: every token that is ever fed through the model needs a
    slot; the last sampled token never is.
    Errors: ``ValueError`` naming the offending parameter.
    """
    raise NotImplementedError("kv_slots_needed: the contract is in the docstring, hints in README.md")


def min_num_blocks(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """The smallest ``num_blocks`` for an engine in which one such request can run
    to the end alone.

    Inputs: as ``kv_slots_needed``, plus ``block_size`` (an int >= 1).
    Returns: an int that counts whole blocks for the request's slots (a partial
    block is a whole block) plus the null block, which is never handed out.
    Errors: ``ValueError`` naming the offending parameter.
    """
    raise NotImplementedError("min_num_blocks: the contract is in the docstring, hints in README.md")


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
    """Greedy-generate for every prompt (token ids) in an engine of ``num_blocks``
    blocks of ``block_size`` slots, with prefix caching as given.

    Every request produces exactly ``max_tokens`` tokens, EOS or not.
    Returns: a ``PreemptionRun`` with, in prompt order, the output token ids and
    each request's preemption count; every preemption as ``(engine step, request
    id)`` with the engine's own (1-based) step numbers; the number of steps; what
    each step scheduled; and the request ids.
    Errors: a request that could never fit is refused by ``add_request`` with a
    ``ValueError``; let it propagate.
    """
    raise NotImplementedError("run: the contract is in the docstring, hints in README.md")
