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
    """Greedy-generate for all prompts at once; sum every step's scheduled tokens.

    Recipe:
    1. ``engine = LLMEngine(model, block_size=block_size, enable_caching=enable_caching)``.
    2. ``reqs = engine.generate(prompts, SamplingParams(temperature=0,
       max_tokens=max_tokens, ignore_eos=True))`` -- all prompts are added
       before the first step, so they are admitted together.
    3. The odometer: the sum over ``engine.stats`` of the values of each
       record's ``num_scheduled_tokens``.
    4. Per request (prompt order): ``output_token_ids``,
       ``metrics.num_cached_tokens``, and the tokens scheduled for it in the
       first step record that mentions its id.
    """
    raise NotImplementedError("run_and_count: see the recipe in the docstring")


def predicted_total(num_requests: int, prompt_len: int, max_tokens: int) -> int:
    """Scheduled tokens with no cache: every prompt token, and every output token but the last.

    Recipe: validate the three arguments (integers >= 1, ``ValueError`` naming
    the parameter); the last sampled token is never fed back, so each request
    costs ``prompt_len + max_tokens - 1``.
    """
    raise NotImplementedError("predicted_total: see the recipe in the docstring")


def predicted_savings(num_requests: int, prompt_len: int, shared_prefix_len: int, block_size: int) -> int:
    """Tokens the cache saves when all requests are admitted in one step (see the module docstring).

    Recipe: validate (``num_requests``, ``prompt_len``, ``block_size`` >= 1;
    ``shared_prefix_len`` >= 0 and <= ``prompt_len``). Followers hit
    ``min(shared_prefix_len // block_size, (prompt_len - 1) // block_size)``
    blocks each; the first request hits nothing. Multiply out.
    """
    raise NotImplementedError("predicted_savings: see the recipe in the docstring")
