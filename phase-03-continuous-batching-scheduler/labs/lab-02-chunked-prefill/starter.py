"""Lab 03-02 — chunked prefill changes timing, never output.

Two halves. The timing half is arithmetic: how a prompt is cut into chunks by
``long_prefill_token_threshold`` and ``max_num_batched_tokens``, and how many
steps its prefill takes. The output half runs mini_vllm's real transformer
(``tiny-random``: real attention over a paged KV cache) with and without
chunking and returns the token ids, so a test can demand they are identical.

upstream: vllm/v1/core/sched/scheduler.py:654-669 long_prefill_token_threshold
"""
from __future__ import annotations

from dataclasses import dataclass

from mini_vllm.engine import LLMEngine  # noqa: F401  (used by the code you write)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401


def _check(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def chunk_size(long_prefill_token_threshold: int, max_num_batched_tokens: int) -> int:
    """The most prompt tokens one request can compute in one step (alone in the engine).

    Recipe: validate both arguments with ``_check`` (threshold >= 0, budget >= 1).
    A threshold of 0 means "no threshold": the chunk is the whole budget.
    Otherwise the chunk is the smaller of the threshold and the budget.
    """
    raise NotImplementedError("chunk_size: see the recipe in the docstring")


def prefill_chunks(prompt_len: int, long_prefill_token_threshold: int, max_num_batched_tokens: int) -> list[int]:
    """The tokens scheduled at each prefill step of a lone request: full chunks, then the rest.

    Recipe: validate ``prompt_len >= 1``; ``size = chunk_size(...)``; return
    ``prompt_len // size`` copies of ``size``, followed by the remainder if it is
    not zero. Example: ``prefill_chunks(257, 32, 2048) == [32] * 8 + [1]``.
    """
    raise NotImplementedError("prefill_chunks: see the recipe in the docstring")


def num_prefill_steps(prompt_len: int, long_prefill_token_threshold: int, max_num_batched_tokens: int) -> int:
    """ceil(prompt_len / chunk): the step that finishes the prompt also samples token 1,
    so this is also the lone request's time to first token, in steps.

    Recipe: validate ``prompt_len >= 1``; ceiling-divide by ``chunk_size(...)``
    (``-(-a // b)`` in integers; no floats).
    """
    raise NotImplementedError("num_prefill_steps: see the recipe in the docstring")


@dataclass
class GenerateResult:
    token_ids: list[list[int]]  # per prompt, in prompt order
    first_token_steps: list[int]  # engine step (1-based) that sampled each prompt's first token
    step_tokens: list[dict[str, int]]  # what every engine step scheduled
    request_ids: list[str]


def generate(
    prompts: list[list[int]],
    long_prefill_token_threshold: int = 0,
    max_num_batched_tokens: int = 2048,
    max_tokens: int = 8,
    model: str = "tiny-random",
) -> GenerateResult:
    """Greedy-generate ``max_tokens`` tokens for each prompt (given as token ids) on mini_vllm.

    Recipe:
    1. ``engine = LLMEngine(model, max_num_batched_tokens=...,
       long_prefill_token_threshold=...)``.
    2. ``SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)``.
    3. ``reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)``
       (all prompts are added before the first step; results come in prompt order).
    4. Return ``GenerateResult`` with each request's ``output_token_ids``,
       ``metrics.first_token_step``, a copy of every ``engine.stats[i].num_scheduled_tokens``,
       and the request ids.
    """
    raise NotImplementedError("generate: see the recipe in the docstring")
