"""Lab 03-03 — prefix-cache hit rate: a calculator, a CPU twin, and (in run.py) real vLLM.

vLLM's "Prefix cache hit rate" is counted in *tokens*: each time a new request
looks up the cache, its prompt length is added to the queries and its cache-hit
length to the hits (``PrefixCacheStats.record``). The hit length is a whole
number of blocks, and never covers the prompt's last token.

``prefix_cache_hits`` predicts the hits of a batch of prompts that are all
admitted in the same step, in order, each caching its full prompt blocks the
moment it is admitted (vLLM and mini_vllm both cache at allocation). The CPU
twin ``measure_twin`` runs the same prompts through mini_vllm's real
transformer and reads the hits, the blocks in use and the outputs, so the
tests can check the calculator exactly. ``run.py`` does the same on real vLLM.

upstream: vllm/v1/core/kv_cache_manager.py:219 max_cache_hit_length
upstream: vllm/v1/metrics/stats.py:131 PrefixCacheStats.record
upstream: vllm/v1/metrics/loggers.py:251 Prefix cache hit rate
"""
from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.engine import LLMEngine  # noqa: F401  (used by the code you write)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401

SYSTEM = "You are a meticulous assistant. Follow instructions carefully. "


def build_prompts(system: str, num_prompts: int = 16) -> list[str]:
    """The lab's workload: one shared system prompt, then a short unique question."""
    return [f"{system}\n\nQuestion {i}: what is {i}+{i}?" for i in range(num_prompts)]


def _check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")


def prefix_cache_hits(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> list[int]:
    """Cache-hit tokens of each prompt, admitted in order in one step (prompts as token ids).

    Recipe:
    1. ``_check_block_size(block_size)``; with caching off every prompt hits 0.
    2. Keep a set of cached blocks. Key a block by the tuple of ALL tokens from
       the start of the prompt to the block's end: that is what a chained block
       hash means (equal keys <=> equal prefixes).
    3. For each prompt ``p`` (an empty one is a ``ValueError``): it may hit at most
       ``(len(p) - 1) // block_size`` blocks (the last token is always computed).
       Count leading blocks whose key is in the set, stop at the first miss;
       record ``count * block_size``.
    4. Then add the keys of all ``len(p) // block_size`` full blocks of ``p``
       (it caches them at admission, before the next prompt looks).
    """
    raise NotImplementedError("prefix_cache_hits: see the recipe in the docstring")


def hit_rate(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> float:
    """vLLM's definition: hit tokens / queried tokens (queries = prompt lengths).

    Recipe: ``sum(prefix_cache_hits(...)) / sum(len(p) for p in prompts)``.
    """
    raise NotImplementedError("hit_rate: see the recipe in the docstring")


def format_hit_rate(rate: float) -> str:
    """As vLLM's log line prints it: one decimal, percent (``"%.1f%%"``).

    Recipe: format ``rate * 100`` with one decimal and a percent sign:
    ``format_hit_rate(0.5) == "50.0%"``.
    """
    raise NotImplementedError("format_hit_rate: see the recipe in the docstring")


def blocks_after_admission(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> int:
    """Distinct KV blocks held once every prompt is admitted: shared hit blocks count once.

    Recipe: each prompt holds ``ceil(len(p) / block_size)`` blocks, of which its
    hit blocks (``hits // block_size``, from ``prefix_cache_hits``) are someone
    else's; sum what is left over all prompts.
    """
    raise NotImplementedError("blocks_after_admission: see the recipe in the docstring")


@dataclass
class TwinResult:
    hits: list[int]  # cache-hit tokens per prompt, as the engine admitted them
    queries: int  # sum of prompt lengths
    hit_rate: float
    blocks_after_admission: int  # blocks in use after step 1 (everyone admitted, nobody done)
    token_ids: list[list[int]]


def measure_twin(
    prompts: list[str],
    enable_caching: bool = True,
    block_size: int = 16,
    max_tokens: int = 2,
    model: str = "tiny-random",
) -> TwinResult:
    """Run the prompts through mini_vllm at once and read hit tokens, blocks and outputs.

    Recipe:
    1. ``max_tokens < 2`` is a ``ValueError`` naming ``max_tokens`` (a request that
       finishes in step 1 frees its blocks before we can count them).
    2. ``engine = LLMEngine(model, block_size=..., enable_caching=...,
       max_num_batched_tokens=8192)``; greedy ``SamplingParams`` with
       ``ignore_eos=True``; ``reqs = engine.generate(prompts, params)``.
    3. If ``engine.stats[0]`` did not schedule every prompt, raise ``ValueError``
       (the calculator assumes one admission step).
    4. ``hits``: each request's ``metrics.num_cached_tokens``; ``queries``: the sum
       of ``num_prompt_tokens``; ``blocks_after_admission``:
       ``engine.stats[0].blocks_used``; ``token_ids``: the outputs.
    """
    raise NotImplementedError("measure_twin: see the recipe in the docstring")


def illustrative_gpu_numbers(prefix_tokens: int = 448, tail_tokens: int = 14, num_prompts: int = 16,
                             block_size: int = 16) -> dict:
    """The calculator on run.py's workload shape, for a tokenizer we did not run.

    run.py trims the system prompt to exactly ``prefix_tokens`` tokens; the
    tails' real lengths depend on the tokenizer (run.py prints them and its own
    prediction). Here every tail is assumed to be ``tail_tokens`` long and to
    differ from the others at its first token.
    """
    prompts = [[1] * prefix_tokens + [1000 + i] * tail_tokens for i in range(num_prompts)]
    hits = prefix_cache_hits(prompts, block_size)
    queries = sum(len(p) for p in prompts)
    return {"queries": queries, "hits": sum(hits), "hit_rate": format_hit_rate(sum(hits) / queries),
            "blocks_on": blocks_after_admission(prompts, block_size, True),
            "blocks_off": blocks_after_admission(prompts, block_size, False)}


if __name__ == "__main__":
    prompts = build_prompts(SYSTEM * 2)
    runs = {caching: measure_twin(prompts, caching) for caching in (False, True)}
    for caching, r in runs.items():
        print(f"caching={'on ' if caching else 'off'} queries={r.queries} hits={sum(r.hits)} "
              f"hit rate={format_hit_rate(r.hit_rate)} blocks after admission={r.blocks_after_admission}")
    print("same outputs in both arms:", runs[False].token_ids == runs[True].token_ids)
    print("illustrative GPU shape:", illustrative_gpu_numbers())
