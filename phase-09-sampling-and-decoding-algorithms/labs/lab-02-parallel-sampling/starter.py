"""Lab 09-02 — n > 1: what the children of one prompt share (your implementation).

``SamplingParams(n=4)`` asks for four completions of one prompt. vLLM does not
run one request with four rows: the frontend splits it into four *child*
requests (``ParentRequest``), each with ``n = 1`` and, when the parent has a
seed, a seed of its own (``seed + index``). The children meet again only in
the KV cache. The first one admitted computes the whole prompt; every later
child looks up its prompt's block hashes, finds the first child's full blocks,
and computes only what the lookup could not give it.

How much the lookup gives is fixed by two rules of the KV cache manager:

* a hit is made of whole blocks (a block is cached once its ``block_size``
  tokens are known, and looked up by the hash of its tokens and its parent's);
* a hit never covers the whole prompt: the last prompt token must run through
  the model again, because its logits are what the first output token is
  sampled from. The lookup is capped at ``prompt_len - 1`` tokens, and then
  rounded down to whole blocks.

So each later child hits ``((prompt_len - 1) // block_size) * block_size``
tokens. With a 2,000-token prompt, blocks of 16 and ``n = 4``: 1,984 hits per
later child, 2,000 + 3 * 16 = 2,048 tokens computed instead of 8,000, and a
prefix-cache hit rate of 3 * 1,984 / 8,000 = 74.4 %. A prompt of exactly k
blocks recomputes its whole last block; a prompt shorter than one block
shares nothing.

Blocks are cached when they are *allocated*, in the scheduling step, not
after the forward pass that fills them. So when the n children are admitted
in the same step (``LLM.generate`` adds them together), children 2..n already
hit child 1's blocks in that very step: the model writes each layer's K/V for
the whole batch before any attention of that layer reads it.

You write the calculator, and the tests hold it against mini_vllm's counters
(``RequestOutput.outputs[i].metrics.num_cached_tokens``, ``engine.stats``):

* ``child_seeds``: the seeds of the n children (upstream's rule);
* ``cacheable_prefix_tokens``: the longest cache hit a prompt can get;
* ``expected_hit_tokens``: the hit of each child, in order;
* ``expected_prefill_tokens``: prompt tokens actually computed, all children;
* ``expected_hit_rate``: hits / prompt tokens looked up, vLLM's metric;
* ``expected_blocks``: KV blocks the children hold at the step that samples
  their ``num_output_tokens``-th token (the peak of a run).

All of them assume a cold cache (nothing cached before this prompt) and
that the children are admitted in one step and never preempted.

upstream: vllm/v1/engine/parallel_sampling.py:13 ParentRequest
upstream: vllm/v1/engine/parallel_sampling.py:52 _get_child_sampling_params
upstream: vllm/v1/engine/llm_engine.py:271 ParentRequest
upstream: vllm/v1/core/kv_cache_manager.py:219 max_cache_hit_length
upstream: vllm/v1/core/single_type_kv_cache_manager.py:507 max_num_blocks
upstream: vllm/v1/core/kv_cache_manager.py:421 num_tokens_to_cache
upstream: vllm/v1/metrics/stats.py:131 record
"""
from __future__ import annotations


def _check_int(name: str, value: object, low: int) -> int:
    """Given. ``value`` if it is an int (not a bool) >= ``low``; else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_caching(enable_caching: object) -> bool:
    """Given. ``enable_caching`` if it is a bool; else a ValueError naming it."""
    if not isinstance(enable_caching, bool):
        raise ValueError(f"enable_caching must be True or False, got {enable_caching!r}")
    return enable_caching


# ---------------------------------------------------------------- the children's seeds


def child_seeds(seed: int | None, n: int) -> list[int | None]:
    """The seed of each of the ``n`` children of a request whose seed is ``seed``.

    seed: ``None`` or an integer >= 0 (mini_vllm's ``SamplingParams`` range).
    n: the number of children, an integer >= 1.

    Returns a list of length ``n``: ``seed + i`` for child ``i`` (0-based), so
    child 0 keeps the parent's seed and no two children share one; all
    ``None`` when ``seed`` is None (upstream then reuses one parameter object
    for every child, and they draw from the engine's shared random stream).

    Raises ValueError naming ``seed`` (not None and not an integer >= 0, or a
    bool) or ``n`` (not an integer >= 1).

    upstream: vllm/v1/engine/parallel_sampling.py:80 child_sampling_params.seed
    """
    raise NotImplementedError("child_seeds: seed + i for child i; all None when seed is None")


# ---------------------------------------------------------------- the prefix-cache arithmetic


def cacheable_prefix_tokens(prompt_len: int, block_size: int) -> int:
    """The most prompt tokens a request can take from the prefix cache.

    prompt_len: tokens in the prompt, an integer >= 1.
    block_size: tokens per KV block, an integer >= 1.

    Returns the largest multiple of ``block_size`` that is at most
    ``prompt_len - 1``: the lookup stops one token short of the prompt (the
    last token is recomputed for its logits) and then keeps whole blocks
    only. 0 for a prompt of at most one block.

    Raises ValueError naming ``prompt_len`` or ``block_size`` (not an integer
    >= 1, or a bool).

    upstream: vllm/v1/core/kv_cache_manager.py:219 max_cache_hit_length
    upstream: vllm/v1/core/single_type_kv_cache_manager.py:507 max_num_blocks
    """
    raise NotImplementedError("cacheable_prefix_tokens: cap at prompt_len - 1, then whole blocks")


def expected_hit_tokens(prompt_len: int, n: int, block_size: int,
                        enable_caching: bool = True) -> list[int]:
    """The prefix-cache hit of each child, in the order they were added.

    prompt_len, block_size: as in ``cacheable_prefix_tokens``.
    n: the number of children, an integer >= 1.
    enable_caching: the engine's prefix caching switch.

    Returns a list of ``n`` ints: 0 for child 0 (the cache is cold), then
    ``cacheable_prefix_tokens(prompt_len, block_size)`` for each later child;
    all zeros when ``enable_caching`` is False. This is what mini_vllm
    reports as ``RequestOutput.outputs[i].metrics.num_cached_tokens``.

    Raises ValueError naming ``prompt_len``, ``n``, ``block_size`` (not an
    integer >= 1) or ``enable_caching`` (not a bool).
    """
    raise NotImplementedError("expected_hit_tokens: child 0 hits 0, each later child the cacheable prefix")


def expected_prefill_tokens(prompt_len: int, n: int, block_size: int,
                            enable_caching: bool = True) -> int:
    """Prompt tokens the model computes for all ``n`` children together.

    Arguments and errors as in ``expected_hit_tokens``.

    Returns ``n * prompt_len`` minus the hits: ``prompt_len`` for child 0
    plus ``prompt_len - cacheable_prefix_tokens(...)`` (between 1 and
    ``block_size`` tokens) for each later child. 2,048 for a 2,000-token
    prompt, blocks of 16 and n = 4; ``n * prompt_len`` without caching.
    """
    raise NotImplementedError("expected_prefill_tokens: n * prompt_len minus the hits")


def expected_hit_rate(prompt_len: int, n: int, block_size: int,
                      enable_caching: bool = True) -> float:
    """vLLM's prefix-cache hit rate over the ``n`` children: hits / queries.

    Arguments and errors as in ``expected_hit_tokens``.

    Every child's lookup counts: it queries ``prompt_len`` tokens and hits
    ``expected_hit_tokens(...)[i]`` of them, so the rate is the sum of the
    hits over ``n * prompt_len`` (child 0's miss included). A float in
    [0, 1): 0.744 for 2,000 tokens, blocks of 16, n = 4; always below
    ``(n - 1) / n``.

    upstream: vllm/v1/metrics/stats.py:131 record
    """
    raise NotImplementedError("expected_hit_rate: sum of the hits over n * prompt_len")


def expected_blocks(prompt_len: int, n: int, block_size: int, num_output_tokens: int,
                    enable_caching: bool = True) -> int:
    """KV blocks held by the ``n`` children in the step that samples their ``num_output_tokens``-th token.

    prompt_len, n, block_size, enable_caching: as in ``expected_hit_tokens``.
    num_output_tokens: an integer >= 1; with ``max_tokens = num_output_tokens``
    (and no early stop) this is the run's peak, mini_vllm's
    ``max(s.blocks_used for s in engine.stats)``.

    In that step each child has KV for ``prompt_len + num_output_tokens - 1``
    tokens (the newest sampled token is not computed yet), so it holds
    ``ceil((prompt_len + num_output_tokens - 1) / block_size)`` blocks. With
    caching, the ``cacheable_prefix_tokens(...) // block_size`` leading
    blocks are the same physical blocks in every child and count once;
    every other block (the rest of the prompt and the outputs) is private.
    Without caching nothing is shared. 132 for 2,000 tokens, blocks of 16,
    n = 4 and 3 output tokens (124 shared + 4 * 2 private); 504 without
    caching.

    Raises ValueError naming ``prompt_len``, ``n``, ``block_size``,
    ``num_output_tokens`` (not an integer >= 1) or ``enable_caching``.
    """
    raise NotImplementedError("expected_blocks: the shared blocks once, each child's other blocks n times")


if __name__ == "__main__":
    for case in ((2000, 4, 16), (10, 4, 16), (64, 4, 16), (37, 3, 8)):
        print(f"prompt_len={case[0]}, n={case[1]}, block_size={case[2]}: "
              f"hits={expected_hit_tokens(*case)}, computed={expected_prefill_tokens(*case)} "
              f"of {case[0] * case[1]}, hit rate={expected_hit_rate(*case):.1%}, "
              f"peak blocks (1 output token)={expected_blocks(*case, 1)} "
              f"vs {expected_blocks(*case, 1, enable_caching=False)} without caching")
    print(f"child_seeds(7, 4) = {child_seeds(7, 4)}; child_seeds(None, 2) = {child_seeds(None, 2)}")
