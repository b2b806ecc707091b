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
upstream: vllm/v1/metrics/loggers.py:248-251 log_parts ("Prefix cache hit rate")
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

    A prompt of ``L`` tokens can hit at most ``(L - 1) // block_size`` blocks,
    and only a run of leading blocks whose whole prefix some earlier prompt
    cached. After its lookup, a prompt caches all its full blocks.
    """
    _check_block_size(block_size)
    if not enable_caching:
        return [0] * len(prompts)
    cached: set[tuple[int, ...]] = set()  # a block is keyed by its whole prefix (a chained hash)
    hits = []
    for p in prompts:
        if not p:
            raise ValueError("prompts must not contain an empty prompt")
        max_blocks = (len(p) - 1) // block_size
        n = 0
        while n < max_blocks and tuple(p[: (n + 1) * block_size]) in cached:
            n += 1
        hits.append(n * block_size)
        for k in range(1, len(p) // block_size + 1):
            cached.add(tuple(p[: k * block_size]))
    return hits


def hit_rate(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> float:
    """vLLM's definition: hit tokens / queried tokens (queries = prompt lengths)."""
    queries = sum(len(p) for p in prompts)
    return sum(prefix_cache_hits(prompts, block_size, enable_caching)) / queries


def format_hit_rate(rate: float) -> str:
    """As vLLM's log line prints it: one decimal, percent (``"%.1f%%"``)."""
    return "%.1f%%" % (rate * 100)


def blocks_after_admission(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> int:
    """Distinct KV blocks held once every prompt is admitted: shared hit blocks count once."""
    hits = prefix_cache_hits(prompts, block_size, enable_caching)
    return sum(-(-len(p) // block_size) - h // block_size for p, h in zip(prompts, hits, strict=True))


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
    """Run the prompts through mini_vllm at once and read hit tokens, blocks and outputs."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (a request finishing in step 1 frees its blocks), got {max_tokens}")
    engine = LLMEngine(model, block_size=block_size, enable_caching=enable_caching,
                       max_num_batched_tokens=8192)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    reqs = engine.generate(prompts, params)
    if len(engine.stats[0].num_scheduled_tokens) != len(prompts):
        raise ValueError("not every prompt was admitted in step 1: use fewer or shorter prompts")
    hits = [r.metrics.num_cached_tokens for r in reqs]
    queries = sum(r.num_prompt_tokens for r in reqs)
    return TwinResult(hits, queries, sum(hits) / queries, engine.stats[0].blocks_used,
                      [list(r.output_token_ids) for r in reqs])


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
