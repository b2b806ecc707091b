"""Lab 03-05 — the decode-latency spike a long prefill causes, and how chunking caps it.

A short request ("the victim") is decoding. Right after its first token a
request with a long prompt arrives. Every step the victim runs in is as long as
the whole step, and a step's length grows with the tokens scheduled in it. So
the victim's inter-token latency is set by *everyone's* work in that step.

We measure it from the victim's seat: for each of its decode steps, the total
tokens scheduled in that step. A cost model turns tokens into milliseconds:
``step_ms = fixed_ms + per_token_ms * tokens``. Its default parameters
(10 ms per step plus 0.1 ms per token) are an assumption for illustration, not
a measurement; the token counts are exact.

upstream: vllm/v1/core/sched/scheduler.py:364-366 token_budget
upstream: vllm/v1/core/sched/scheduler.py:390-392 long_prefill_token_threshold
"""
from __future__ import annotations

import sys

from mini_vllm.engine import LLMEngine  # noqa: F401  (used by the code you write)
from mini_vllm.sampling_params import SamplingParams  # noqa: F401

FIXED_MS = 10.0  # assumed per-step overhead (launches, scheduler, sampler)
PER_TOKEN_MS = 0.1  # assumed cost of one more token through the model


def victim_profile(
    long_prompt_len: int = 256,
    long_prefill_token_threshold: int = 0,
    max_num_batched_tokens: int = 2048,
    victim_prompt_len: int = 8,
    victim_max_tokens: int = 16,
    long_max_tokens: int = 2,
) -> dict:
    """Stage the collision on ``LLMEngine("toy")`` and measure it from the victim's seat.

    The engine is built with the given ``max_num_batched_tokens`` and
    ``long_prefill_token_threshold``. The victim (``victim_prompt_len`` prompt
    tokens, ``victim_max_tokens`` output tokens) is queued alone and runs one step,
    its prefill, which samples its first token. Then the long request
    (``long_prompt_len`` prompt tokens, ``long_max_tokens`` outputs) arrives, and
    the engine runs until both are done. Both decode greedily and produce all
    their tokens, EOS or not.

    Returns ``{"costs": [...], "victim_tokens": [...], "long_ttft_steps": int}``:
    ``costs[k]`` is the total tokens scheduled (by everyone) in the step that
    produced the victim's token ``k + 2``, one entry per later step the victim ran
    in and none for steps it was not in; ``victim_tokens`` are its output ids;
    ``long_ttft_steps`` counts the steps from the long request's arrival to the
    end of the step that sampled its first token (1 when that is the very next step).
    Errors: ``ValueError`` naming ``long_prompt_len`` unless it is an int >= 1.
    """
    raise NotImplementedError("victim_profile: the contract is in the docstring, hints in README.md")


def decode_step_costs(long_prompt_len: int = 256, long_prefill_token_threshold: int = 0, **kw) -> list[int]:
    """Just the victim's per-step costs (see ``victim_profile``)."""
    return victim_profile(long_prompt_len, long_prefill_token_threshold, **kw)["costs"]


def itl_ms(costs: list[int], fixed_ms: float = FIXED_MS, per_token_ms: float = PER_TOKEN_MS) -> list[float]:
    """Inter-token latency of each victim token under the linear step-cost model.

    Returns one float per cost ``c``: ``fixed_ms + per_token_ms * c``, rounded to
    6 decimals (so 10 + 0.1 x 257 is exactly 35.7). Zero parameters are allowed.
    Errors: ``ValueError`` naming ``fixed_ms`` and ``per_token_ms`` when either is
    negative.
    """
    raise NotImplementedError("itl_ms: the contract is in the docstring, hints in README.md")


def threshold_sweep(thresholds: tuple[int, ...] = (0, 16, 32, 64, 128, 256),
                    long_prompt_len: int = 256) -> list[dict]:
    """For each threshold: the victim's worst step, and the long request's TTFT in steps."""
    rows = []
    for t in thresholds:
        p = victim_profile(long_prompt_len, t)
        rows.append({"threshold": t, "worst_cost": max(p["costs"]),
                     "long_ttft_steps": p["long_ttft_steps"]})
    return rows


def plot_profiles(path: str = "decode_latency.png", thresholds: tuple[int, ...] = (0, 32)) -> str:
    """Per-step latency of the victim (cost model) for each threshold, one line each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for t in thresholds:
        ms = itl_ms(decode_step_costs(256, t))
        label = "threshold 0 (unchunked)" if t == 0 else f"threshold {t}"
        ax.step(range(2, len(ms) + 2), ms, where="mid", marker="o", label=label)
    ax.set_xlabel("victim's output token")
    ax.set_ylabel(f"inter-token latency, ms (model: {FIXED_MS:g} + {PER_TOKEN_MS:g} x tokens)")
    ax.set_title("A 256-token prompt lands while a request decodes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def runs(values: list) -> str:
    """``[33, 33, 2]`` -> ``"33 (x2), 2"``: long profiles, short lines."""
    out: list[str] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ", ".join(f"{v} (x{n})" if n > 1 else f"{v}" for v, n in out)


if __name__ == "__main__":
    for t in (0, 32):
        c = decode_step_costs(256, t)
        print(f"threshold={t:<3} costs: {runs(c)}   ITL ms: {runs(itl_ms(c))}")
    for row in threshold_sweep():
        print(row)
    print("wrote", plot_profiles(sys.argv[1] if len(sys.argv) > 1 else "decode_latency.png"))
