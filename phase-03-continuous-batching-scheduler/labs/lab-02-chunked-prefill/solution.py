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

    The threshold caps it when it is set (> 0); the budget always caps it.
    """
    _check("long_prefill_token_threshold", long_prefill_token_threshold, 0)
    _check("max_num_batched_tokens", max_num_batched_tokens, 1)
    if long_prefill_token_threshold == 0:
        return max_num_batched_tokens
    return min(long_prefill_token_threshold, max_num_batched_tokens)


def prefill_chunks(prompt_len: int, long_prefill_token_threshold: int, max_num_batched_tokens: int) -> list[int]:
    """The tokens scheduled at each prefill step of a lone request: full chunks, then the rest."""
    _check("prompt_len", prompt_len, 1)
    size = chunk_size(long_prefill_token_threshold, max_num_batched_tokens)
    full, rest = divmod(prompt_len, size)
    return [size] * full + ([rest] if rest else [])


def num_prefill_steps(prompt_len: int, long_prefill_token_threshold: int, max_num_batched_tokens: int) -> int:
    """ceil(prompt_len / chunk): the step that finishes the prompt also samples token 1,
    so this is also the lone request's time to first token, in steps."""
    _check("prompt_len", prompt_len, 1)
    size = chunk_size(long_prefill_token_threshold, max_num_batched_tokens)
    return -(-prompt_len // size)


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

    All prompts are added before the first step. Returns the outputs and the
    per-step record.
    """
    engine = LLMEngine(model, max_num_batched_tokens=max_num_batched_tokens,
                       long_prefill_token_threshold=long_prefill_token_threshold)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
    return GenerateResult(
        token_ids=[list(r.output_token_ids) for r in reqs],
        first_token_steps=[r.metrics.first_token_step for r in reqs],
        step_tokens=[dict(s.num_scheduled_tokens) for s in engine.stats],
        request_ids=[r.request_id for r in reqs],
    )
