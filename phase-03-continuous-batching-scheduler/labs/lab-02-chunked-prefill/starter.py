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
    """The most prompt tokens a lone request can compute in one step.

    Inputs: ``long_prefill_token_threshold`` (an int >= 0; 0 means the threshold
    is off) and ``max_num_batched_tokens`` (an int >= 1).
    Returns: an int >= 1, never above the budget, and never above the threshold
    when the threshold is on.
    Errors: ``ValueError`` naming the parameter for a value below its floor or a
    non-integer (``_check`` does exactly that).
    """
    raise NotImplementedError("chunk_size: the contract is in the docstring, hints in README.md")


def prefill_chunks(prompt_len: int, long_prefill_token_threshold: int, max_num_batched_tokens: int) -> list[int]:
    """The tokens a lone request is scheduled at each of its prefill steps.

    Inputs: ``prompt_len`` (an int >= 1) and the two knobs of ``chunk_size``.
    Returns: a list of positive ints that sums to ``prompt_len``; every entry
    equals ``chunk_size(...)`` except possibly the last, which is smaller (and
    never 0). Example: 257 tokens at threshold 32 give eight 32s and then a 1.
    Errors: ``ValueError`` naming ``prompt_len`` (or the knob) when out of range.
    """
    raise NotImplementedError("prefill_chunks: the contract is in the docstring, hints in README.md")


def num_prefill_steps(prompt_len: int, long_prefill_token_threshold: int, max_num_batched_tokens: int) -> int:
    """How many steps a lone request's prefill takes; also its time to first token,
    in steps, because the step that finishes the prompt samples token 1.

    Inputs and errors: as ``prefill_chunks``.
    Returns: ``len(prefill_chunks(...))``, computed with integer arithmetic only.
    """
    raise NotImplementedError("num_prefill_steps: the contract is in the docstring, hints in README.md")


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
    """Greedy-generate ``max_tokens`` tokens for every prompt (token ids) on
    mini_vllm's ``LLMEngine`` built with the two scheduling knobs.

    All prompts are queued before the first step. Every request produces exactly
    ``max_tokens`` tokens, EOS or not, so runs with different knobs can be
    compared token for token.
    Returns: a ``GenerateResult`` with, in prompt order, the output token ids and
    the 1-based engine step that sampled each first token; what every engine step
    scheduled (a copy of its ``num_scheduled_tokens``); and the request ids.
    """
    raise NotImplementedError("generate: the contract is in the docstring, hints in README.md")
