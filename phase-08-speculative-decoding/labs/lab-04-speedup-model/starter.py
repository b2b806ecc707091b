"""Lab 08-04 — what speculation buys, in three numbers (your implementation).

A speculative step drafts ``k`` tokens cheaply, then runs the target model
once over all of them. The target keeps the drafts up to the first one it
rejects and then adds one token of its own (the replacement for the rejected
draft, or the bonus token when no draft was rejected). So every verify emits
between 1 and ``k + 1`` tokens, and the question "is it worth it?" is
arithmetic over three inputs:

* ``alpha``: the chance that a draft token is accepted *given that every
  draft before it was accepted* (a conditional rate, taken as the same at
  every position: the model's one simplification);
* ``c``: the cost of one draft step as a fraction of one target step;
* ``k``: how many tokens are drafted per step (vLLM's
  ``num_speculative_tokens``).

Position ``i`` (0-based) survives only if positions ``0..i`` are all
accepted, probability ``alpha ** (i + 1)``; summing over positions plus the
one token the target always adds::

    E[tokens per verify] = 1 + alpha + ... + alpha**k = (1 - alpha**(k + 1)) / (1 - alpha)
    speedup               = E / (k * c + 1)        (a plain decode step costs 1)

vLLM logs exactly these quantities: its "Mean acceptance length" is
``1 + accepted / drafts`` (bonus token included), that is E, and its
"Per-position acceptance rate" is the fraction of drafts whose position ``i``
was accepted, ``alpha ** (i + 1)`` in this model.

upstream: vllm/v1/spec_decode/metrics.py:95 mean_acceptance_length
upstream: vllm/v1/core/sched/scheduler.py:1373 num_accepted
upstream: vllm/v1/sample/rejection_sampler.py:762 rejection_random_sample_kernel
upstream: vllm/v1/spec_decode/utils.py:599 unconditional_to_conditional_rates
"""
from __future__ import annotations

import math
import numbers

import numpy as np

K_MAX_DEFAULT = 32  # optimal_k searches k = 0 .. k_max; no drafter worth running needs more


# ---------------------------------------------------------------- given helpers


def _check_alpha(alpha) -> float:
    """Given. ``alpha`` as a float; ValueError naming ``alpha`` unless it is a number in [0, 1]."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_int(value, name: str, minimum: int) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_nonneg(value, name: str, allow_zero: bool = True) -> float:
    """Given. ``value`` as a float; ValueError naming ``name`` unless it is finite and >= 0 (> 0
    when ``allow_zero`` is False)."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and math.isfinite(value) and (value >= 0 if allow_zero else value > 0))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------- the model


def expected_tokens_per_verify(alpha, k) -> float:
    """Expected tokens emitted by one target verify of ``k`` drafts.

    alpha: conditional acceptance rate per position, a number in [0, 1].
    k: number of draft tokens, an integer >= 0 (k = 0 is plain decoding).
    Returns the float ``1 + alpha + alpha**2 + ... + alpha**k``, which is
    ``(1 - alpha**(k + 1)) / (1 - alpha)`` for alpha < 1 and exactly
    ``k + 1`` for alpha == 1. Always in [1, k + 1]; never above
    ``1 / (1 - alpha)`` whatever k is.

    Raises ValueError naming ``alpha`` (outside [0, 1]) or ``k`` (not an
    integer >= 0).
    """
    raise NotImplementedError("expected_tokens_per_verify: validate alpha and k; "
                              "return k + 1 when alpha == 1, else (1 - alpha**(k+1)) / (1 - alpha)")


def per_position_acceptance(alpha, k) -> np.ndarray:
    """The fraction of verifies whose draft position ``i`` is accepted, i = 0 .. k-1.

    Position ``i`` is kept only when positions 0..i are all accepted, so the
    model predicts ``alpha ** (i + 1)``: float64 array of shape ``(k,)``
    (empty for k = 0), non-increasing. ``1 + sum(...)`` equals
    ``expected_tokens_per_verify(alpha, k)``. This is what vLLM logs as
    "Per-position acceptance rate" and what its synthetic rejection mode
    takes as ``synthetic_acceptance_rates``.

    Raises ValueError naming ``alpha`` or ``k`` as
    ``expected_tokens_per_verify`` does.
    """
    raise NotImplementedError("per_position_acceptance: validate; "
                              "alpha ** (i + 1) for i = 0 .. k-1, as float64")


def simulate_accepted(alpha, k, n_cycles, rng) -> np.ndarray:
    """Simulate ``n_cycles`` verifies and return how many drafts each one kept.

    Draw ``u = rng.random((n_cycles, k))`` once (one uniform per draft
    position; rng is a ``numpy.random.Generator`` or anything with the same
    ``random(shape)`` method). Position ``i`` of cycle ``t`` passes its test
    when ``u[t, i] < alpha``; a cycle keeps the *leading run* of passing
    positions and nothing after its first failure, as vLLM's rejection
    kernel does. Returns int64 ``(n_cycles,)`` with values in [0, k]; the
    tokens a cycle emits are this plus one. No Python loop over cycles.

    Raises ValueError naming ``alpha``, ``k`` (integer >= 0) or ``n_cycles``
    (integer >= 1).
    """
    raise NotImplementedError("simulate_accepted: u = rng.random((n_cycles, k)) < alpha; "
                              "count the leading run of True per row (np.cumprod)")


def speedup(alpha, c, k) -> float:
    """Tokens per unit of target time, relative to plain decoding.

    One speculative step costs ``k * c`` (k draft steps) plus 1 (the verify,
    priced as one target step) and emits ``expected_tokens_per_verify(alpha,
    k)`` tokens; plain decoding emits 1 token per 1. Returns
    ``E / (k * c + 1)`` as a float; exactly 1.0 at k = 0. Below 1 means
    speculation slows decoding down.

    c: a finite number >= 0 (0 for a drafter that costs nothing, such as
    n-gram lookup, in this model).

    Raises ValueError naming ``alpha``, ``k`` (as
    ``expected_tokens_per_verify``) or ``c`` (negative or not finite).
    """
    raise NotImplementedError("speedup: validate c; "
                              "expected_tokens_per_verify(alpha, k) / (k * c + 1)")


def optimal_k(alpha, c, k_max=K_MAX_DEFAULT) -> int:
    """The draft length with the largest ``speedup(alpha, c, k)`` for k in 0 .. k_max.

    Returns an int in [0, k_max]; 0 means "do not speculate". On an exact
    tie the smallest such k wins (fewer drafts, less work, the same speed).

    Raises ValueError naming ``alpha``, ``c`` (as ``speedup``) or ``k_max``
    (not an integer >= 0).
    """
    raise NotImplementedError("optimal_k: validate k_max; "
                              "the first k in 0..k_max with the largest speedup")


def predicted_itl_ms(baseline_itl_ms, alpha, c, k) -> float:
    """Inter-token latency with speculation, from the latency without it.

    A plain decode step takes ``baseline_itl_ms`` and emits one token; a
    speculative step takes ``baseline_itl_ms * (k * c + 1)`` and emits
    ``expected_tokens_per_verify(alpha, k)`` tokens on average. Returns the
    time per token, ``baseline_itl_ms / speedup(alpha, c, k)``, as a float.

    Raises ValueError naming ``baseline_itl_ms`` (not a finite number > 0),
    or ``alpha``, ``c``, ``k`` as ``speedup`` does.
    """
    raise NotImplementedError("predicted_itl_ms: validate baseline_itl_ms (> 0); "
                              "baseline_itl_ms / speedup(alpha, c, k)")


if __name__ == "__main__":
    for a, cost in ((0.7, 0.05), (0.5, 0.05), (0.9, 0.05), (0.2, 0.5)):
        best = optimal_k(a, cost)
        print(f"alpha={a:.2f} c={cost:.2f}: E(k=5)={expected_tokens_per_verify(a, 5):.3f} "
              f"speedup(k=5)={speedup(a, cost, 5):.3f}  best k={best} "
              f"({speedup(a, cost, best):.3f}x)  ceiling 1/(1-alpha)={1 / (1 - a):.2f}")
    runs = simulate_accepted(0.7, 5, 200_000, np.random.default_rng(0))
    print(f"simulated 200,000 verifies at alpha=0.70, k=5: {1 + runs.mean():.4f} tokens each "
          f"(model {expected_tokens_per_verify(0.7, 5):.4f})")
    print(f"ITL 20.0 ms without speculation -> {predicted_itl_ms(20.0, 0.7, 0.05, 5):.2f} ms "
          f"at alpha=0.70, c=0.05, k=5")
