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
    """Cache-hit tokens of each prompt when all are admitted, in order, in one step.

    Inputs: ``prompts`` (lists of token ids, none empty), ``block_size`` (an int
    >= 1) and ``enable_caching``.
    Returns: one int per prompt, a multiple of ``block_size``. A prompt of ``L``
    tokens hits a leading run of its full blocks, each of whose *whole prefix*
    (every token from the start to the block's end) an earlier prompt in the list
    has already cached, and never its last token: at most ``(L - 1) // block_size``
    blocks. Once looked up, a prompt caches every one of its full blocks. With
    caching off every entry is 0.
    Errors: ``ValueError`` for a bad ``block_size`` (``_check_block_size``) or an
    empty prompt.
    """
    raise NotImplementedError("prefix_cache_hits: the contract is in the docstring, hints in README.md")


def hit_rate(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> float:
    """vLLM's prefix-cache hit rate: hit tokens over queried tokens, where a prompt
    queries its full length. A float in [0, 1).
    """
    raise NotImplementedError("hit_rate: the contract is in the docstring, hints in README.md")


def format_hit_rate(rate: float) -> str:
    """The rate as vLLM's log line prints it: a percentage with one decimal,
    rounded (not truncated), and a ``%`` sign; 15/16 prints as ``"93.8%"``.
    """
    raise NotImplementedError("format_hit_rate: the contract is in the docstring, hints in README.md")


def blocks_after_admission(prompts: list[list[int]], block_size: int, enable_caching: bool = True) -> int:
    """Distinct KV blocks in use once every prompt is admitted (nobody finished yet).

    Each prompt holds the blocks its tokens fill, a partial last block included;
    its hit blocks are someone else's and count only once, for their owner.
    Returns an int. Errors: as ``prefix_cache_hits``.
    """
    raise NotImplementedError("blocks_after_admission: the contract is in the docstring, hints in README.md")


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
    """Run ``prompts`` (strings) through mini_vllm all at once and read the cache.

    The engine uses ``block_size``, ``enable_caching`` and a token budget large
    enough to admit every prompt in step 1; decoding is greedy and each request
    produces ``max_tokens`` tokens whatever it samples.
    Returns: a ``TwinResult`` with each request's cache-hit tokens at admission,
    the prompt-token total, their ratio, the blocks in use right after step 1,
    and the output token ids, all in prompt order.
    Errors: ``ValueError`` naming ``max_tokens`` below 2 (a request that ends in
    step 1 frees its blocks before they are counted), and a ``ValueError`` saying
    "step 1" when step 1 did not admit every prompt.
    """
    raise NotImplementedError("measure_twin: the contract is in the docstring, hints in README.md")


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
