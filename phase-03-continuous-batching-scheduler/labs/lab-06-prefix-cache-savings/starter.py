"""Lab 03-06 — prefix caching, accounted for to the exact token.

The meter is the engine's odometer: the sum over all steps of the tokens the
scheduler sent through the model. Chunking and batching move tokens between
steps but never change that sum; only the prefix cache does, by replacing
computed tokens with blocks someone already computed. So caching off vs on,
same prompts, isolates the cache's effect exactly.

The prediction, for ``N`` requests whose prompts are ``L`` tokens long and
share their first ``P`` tokens, block size ``B``, all admitted in one step:

    saved tokens = (N - 1) * B * min(P // B, (L - 1) // B)

Only full blocks are shared (``P // B``), and a lookup never covers a prompt's
last token, whose logits must be computed (``(L - 1) // B``).

upstream: vllm/v1/core/kv_cache_manager.py:194 KVCacheManager.get_computed_blocks
upstream: vllm/v1/core/kv_cache_manager.py:421-425 num_tokens_to_cache
"""
from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.engine import LLMEngine  # noqa: F401  (used by the code you write)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401


def _check(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass
class CountedRun:
    total_scheduled_tokens: int  # the odometer: sum over steps of total_num_scheduled_tokens
    token_ids: list[list[int]]  # per prompt, in prompt order
    cached_tokens: list[int]  # prefix-cache hit tokens at admission, per prompt
    first_step_tokens: list[int]  # tokens scheduled for each prompt in its first step


def run_and_count(
    prompts: list[str],
    enable_caching: bool,
    block_size: int = 4,
    max_tokens: int = 4,
    model: str = "tiny-random",
) -> CountedRun:
    """Generate for all ``prompts`` (strings) at once and read the engine's odometer.

    The engine uses ``block_size`` and ``enable_caching`` as given; decoding is
    greedy and every request produces exactly ``max_tokens`` tokens, EOS or not.
    All prompts are queued before the first step.
    Returns: a ``CountedRun`` whose ``total_scheduled_tokens`` is the sum, over
    every engine step, of all tokens that step scheduled; and, in prompt order,
    the output token ids, the prefix-cache hit tokens at admission, and the
    tokens each request was scheduled in the first step it appeared in.
    """
    raise NotImplementedError("run_and_count: the contract is in the docstring, hints in README.md")


def predicted_total(num_requests: int, prompt_len: int, max_tokens: int) -> int:
    """The odometer's reading with no cache: ``num_requests`` identical-length
    requests, each computing every prompt token and every output token that is
    fed back (all but the last).

    Inputs: three ints >= 1. Returns an int.
    Errors: ``ValueError`` naming the parameter for a non-integer or a value
    below 1.
    """
    raise NotImplementedError("predicted_total: the contract is in the docstring, hints in README.md")


def predicted_savings(num_requests: int, prompt_len: int, shared_prefix_len: int, block_size: int) -> int:
    """Tokens the prefix cache saves for ``num_requests`` prompts of ``prompt_len``
    tokens that share their first ``shared_prefix_len``, all admitted in one step.

    Inputs: ``num_requests``, ``prompt_len`` and ``block_size`` ints >= 1;
    ``shared_prefix_len`` an int with ``0 <= shared_prefix_len <= prompt_len``.
    Returns: an int >= 0, a multiple of ``block_size``: the first request pays in
    full, every follower skips the shared *full* blocks, but never its own last
    prompt token (see the module docstring's formula).
    Errors: ``ValueError`` naming the parameter that is out of range.
    """
    raise NotImplementedError("predicted_savings: the contract is in the docstring, hints in README.md")
