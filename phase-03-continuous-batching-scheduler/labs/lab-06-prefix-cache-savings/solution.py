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
    """Greedy-generate for all prompts at once; sum every step's scheduled tokens."""
    engine = LLMEngine(model, block_size=block_size, enable_caching=enable_caching)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    reqs = engine.generate(prompts, params)
    first = {}
    for s in engine.stats:
        for rid, n in s.num_scheduled_tokens.items():
            first.setdefault(rid, n)
    return CountedRun(
        total_scheduled_tokens=sum(sum(s.num_scheduled_tokens.values()) for s in engine.stats),
        token_ids=[list(r.output_token_ids) for r in reqs],
        cached_tokens=[r.metrics.num_cached_tokens for r in reqs],
        first_step_tokens=[first[r.request_id] for r in reqs],
    )


def predicted_total(num_requests: int, prompt_len: int, max_tokens: int) -> int:
    """Scheduled tokens with no cache: every prompt token, and every output token but the last."""
    _check("num_requests", num_requests, 1)
    _check("prompt_len", prompt_len, 1)
    _check("max_tokens", max_tokens, 1)
    return num_requests * (prompt_len + max_tokens - 1)


def predicted_savings(num_requests: int, prompt_len: int, shared_prefix_len: int, block_size: int) -> int:
    """Tokens the cache saves when all requests are admitted in one step (see the module docstring)."""
    _check("num_requests", num_requests, 1)
    _check("prompt_len", prompt_len, 1)
    _check("block_size", block_size, 1)
    _check("shared_prefix_len", shared_prefix_len, 0)
    if shared_prefix_len > prompt_len:
        raise ValueError(f"shared_prefix_len ({shared_prefix_len}) must be <= prompt_len ({prompt_len})")
    blocks = min(shared_prefix_len // block_size, (prompt_len - 1) // block_size)
    return (num_requests - 1) * blocks * block_size
