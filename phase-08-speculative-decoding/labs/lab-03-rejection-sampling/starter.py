"""Lab 08-03 — lossless speculation with temperature (your implementation).

Speculative decoding lets a cheap drafter guess the next token and the target
model check the guess. Under greedy decoding the check is an equality test.
Under sampling (any temperature above zero) it must be a *random* test, and
the question is which one leaves the output distributed exactly as if the
target had sampled on its own. The answer is a rejection sampler:

* the drafter proposes ``x`` with probability ``q[x]``;
* the target keeps it with probability ``min(1, p[x] / q[x])``;
* otherwise the target draws a *recovered* token from the residual
  ``max(0, p - q)``, normalized.

Over- and under-served tokens cancel exactly, so the output is ``p``, for any
drafter ``q``. The drafter only decides the speed: a token is accepted with
probability ``sum(min(p, q))``, the overlap of the two distributions.

vLLM runs two variants of the same test. A drafter that hands over its
probabilities (a draft model with ``draft_sample_method="probabilistic"``)
gets the ratio test above. A drafter that hands over only token ids (n-gram
lookup, or a draft model in the default ``"greedy"`` mode) is treated as
one-hot: ``q = e_x``, so the draft is kept with probability ``p[x]`` and the
recovered token comes from ``p`` with ``x`` removed. Both recoveries, and
vLLM's ordinary sampler, draw from a categorical distribution with the
*exponential race*: ``argmax(w / E)`` with ``E ~ Exp(1)`` per token, which
needs no normalization and no cumulative sum.

All probability vectors here are 1-D array-likes over a vocabulary of ``V``
tokens (``V >= 1``), entries in ``[0, 1]``, summing to 1 within ``1e-6``.
Randomness comes from a ``numpy.random.Generator`` the caller passes in.

upstream: vllm/v1/sample/rejection_sampler.py:762 rejection_random_sample_kernel
upstream: vllm/v1/sample/rejection_sampler.py:854 sample_recovered_tokens_kernel
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:395 random_sample
upstream: vllm/config/speculative.py:256 draft_sample_method
"""
from __future__ import annotations

import numbers

import numpy as np

# ---------------------------------------------------------------- given helpers

SUM_TOL = 1e-6  # how far from 1 a probability vector's sum may be


def _as_probs(p, name: str) -> np.ndarray:
    """Given. ``p`` as a float64 1-D probability vector, or ValueError naming ``name``.

    Refused: not 1-D, empty, non-finite, a negative entry, or a sum farther
    than ``SUM_TOL`` from 1. The input is copied, never modified.
    """
    arr = np.array(p, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D probability vector, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite probabilities >= 0")
    if abs(arr.sum() - 1.0) > SUM_TOL:
        raise ValueError(f"{name} must sum to 1 (within {SUM_TOL}), got {arr.sum():.8g}")
    return arr


def _as_pair(p, q) -> tuple[np.ndarray, np.ndarray]:
    """Given. Target ``p`` and draft ``q`` over the same vocabulary (ValueError naming ``q`` if not)."""
    p, q = _as_probs(p, "p"), _as_probs(q, "q")
    if q.shape != p.shape:
        raise ValueError(f"q must have the shape of p {p.shape}, got {q.shape}")
    return p, q


def _check_token(x, vocab_size: int) -> int:
    """Given. ``x`` as a Python int in ``[0, vocab_size)``, or ValueError naming ``x``."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or not 0 <= x < vocab_size:
        raise ValueError(f"x must be a token id in [0, {vocab_size}), got {x!r}")
    return int(x)


def _check_count(n) -> int:
    """Given. ``n`` as a Python int >= 1, or ValueError naming ``n``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    return int(n)


def _as_weights(weights) -> np.ndarray:
    """Given. ``weights`` as a float64 array ``[..., V]``, or ValueError naming ``weights``.

    Refused: 0-d or an empty last axis, a non-finite or negative entry, or a
    row (along the last axis) whose sum is not positive.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 0 or w.shape[-1] == 0:
        raise ValueError(f"weights must have a non-empty last (vocabulary) axis, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and >= 0")
    if np.any(w.sum(axis=-1) <= 0):
        raise ValueError("weights: every row needs a positive sum")
    return w


def one_hot(x: int, vocab_size: int) -> np.ndarray:
    """Given. The float64 distribution that puts all its mass on token ``x``."""
    out = np.zeros(vocab_size, dtype=np.float64)
    out[_check_token(x, vocab_size)] = 1.0
    return out


def softmax(logits, temperature: float = 1.0) -> np.ndarray:
    """Given. ``softmax(logits / temperature)`` over the last axis, float64.

    This is where temperature enters: the target's ``p`` and the drafter's
    ``q`` must both be computed at the request's temperature (and with its
    top-k/top-p) before they meet in the rejection test. Raises ValueError
    naming ``temperature`` unless it is a finite number > 0 (temperature 0 is
    greedy decoding, which needs no rejection sampler).
    """
    if not (isinstance(temperature, numbers.Real) and np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- the rejection test


def accept_prob(p, q, x) -> float:
    """Probability that the target keeps the draft token ``x``.

    p: target distribution ``[V]``; q: draft distribution ``[V]`` (the one
    ``x`` was sampled from); x: int token id in ``[0, V)``.
    Returns ``min(1, p[x] / q[x])`` as a Python float in ``[0, 1]``. When
    ``q[x] == 0`` (a draft that ``q`` could not have produced) it returns 0.0,
    as vLLM's kernel rejects such a draft, with no division warning.

    Raises ValueError naming ``p`` or ``q`` (not a probability vector, shapes
    differ) or ``x`` (not an int in range).
    """
    raise NotImplementedError("accept_prob: min(1, p[x] / q[x]), and 0.0 when q[x] == 0")


def residual_distribution(p, q) -> np.ndarray:
    """The distribution a rejected position is re-drawn from: ``normalize(max(0, p - q))``.

    p, q: as in ``accept_prob``. Returns float64 ``[V]`` summing to 1: zero
    wherever the drafter already gives ``x`` at least its share (``q >= p``),
    proportional to the shortfall ``p - q`` elsewhere. When ``p == q`` there is
    no shortfall and a draft is never rejected; the function then returns a
    copy of ``p`` so that it is defined for every input.

    Raises ValueError naming ``p`` or ``q`` as ``accept_prob`` does.
    """
    raise NotImplementedError("residual_distribution: surplus = max(p - q, 0); divide by its sum (return p.copy() when the sum is 0)")


def expected_acceptance_rate(p, q) -> float:
    """Probability that one draft ``x ~ q`` is accepted: ``sum(min(p, q))``.

    Equals ``1 - TV(p, q)``, the overlap of the two distributions: 1 when
    ``p == q``, 0 when they share no token. Returns a Python float.
    Raises ValueError naming ``p`` or ``q`` as ``accept_prob`` does.
    """
    raise NotImplementedError("expected_acceptance_rate: the overlap: sum of the elementwise minimum of p and q")


# ---------------------------------------------------------------- sampling


def sample_by_exponential_race(weights, rng: np.random.Generator) -> np.ndarray:
    """Draw one token per row of ``weights`` with the exponential race.

    weights: float array ``[..., V]`` of finite non-negative weights; each row
    must have a positive sum but need *not* sum to 1 (the race is invariant
    to scaling a row). rng: a ``numpy.random.Generator``.

    Draws ``E = rng.standard_exponential(weights.shape)`` (exactly that one
    call, so a test can replay it) and returns ``argmax(weights / E)`` over the
    last axis, as int64 ``[...]`` (a 0-d array for a 1-D ``weights``). Token
    ``i`` wins with probability ``weights[i] / sum(weights)``; a zero weight
    never wins.

    Raises ValueError naming ``weights`` (0-d, non-finite, negative, or a row
    of zeros).
    """
    raise NotImplementedError("sample_by_exponential_race: E = rng.standard_exponential(w.shape); argmax(w / E) over the last axis")


def speculative_token(p, q, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` independent one-token speculations with a drafter that shares its probabilities.

    p: target distribution ``[V]``; q: draft distribution ``[V]``; rng: a
    ``numpy.random.Generator``; n: int >= 1. For each of the ``n`` trials:
    draw the draft ``x ~ q``, keep it with probability ``accept_prob(p, q, x)``
    (a uniform ``u`` in ``[0, 1)``, accepted when ``u < p[x] / q[x]``, or
    ``u <= ...``: both are exact), otherwise output a recovered token drawn
    from ``residual_distribution(p, q)``.

    Returns ``(tokens, accepted)``: int64 ``[n]`` output tokens and bool
    ``[n]`` flags. Invariants: the tokens are distributed as ``p``; the
    accepted fraction converges to ``expected_acceptance_rate(p, q)``;
    ``accepted`` is all True when ``p == q`` and all False when ``p`` and
    ``q`` share no token. How ``rng`` is consumed is up to you.

    Raises ValueError naming ``p``, ``q`` or ``n``.
    """
    raise NotImplementedError("speculative_token: drafts ~ q, keep where u < min(1, p/q), else a token from residual_distribution(p, q)")


def verify_one_hot_draft(p, x, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` independent verifications of the draft ``x`` from a drafter without probabilities.

    This is vLLM's path for n-gram drafts and for greedy draft models: the
    draft distribution is taken to be one-hot at ``x``. p: target
    distribution ``[V]``; x: int token id in ``[0, V)``; rng: a
    ``numpy.random.Generator``; n: int >= 1. Each trial keeps ``x`` with
    probability ``p[x]``, otherwise outputs a token drawn from ``p`` with
    ``x`` removed (``p[y] / (1 - p[x])`` for ``y != x``), i.e. the residual
    of ``p`` against the one-hot draft.

    Returns ``(tokens, accepted)`` as ``speculative_token`` does. Invariants:
    tokens distributed as ``p``; a rejected trial never outputs ``x``; when
    ``p[x] == 1`` every trial is accepted.

    Raises ValueError naming ``p``, ``x`` or ``n``.
    """
    raise NotImplementedError("verify_one_hot_draft: keep x where u < p[x], else a token from residual_distribution(p, one_hot(x))")


if __name__ == "__main__":
    p = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(0)
    for name, q in (("uniform drafter", np.full(3, 1 / 3)), ("q = [0.2, 0.3, 0.5]", np.array([0.2, 0.3, 0.5]))):
        tokens, accepted = speculative_token(p, q, rng, 200_000)
        freq = np.bincount(tokens, minlength=3) / tokens.size
        print(f"{name:20s}: acceptance {accepted.mean():.4f} (expected {expected_acceptance_rate(p, q):.4f}),"
              f" output {np.round(freq, 4).tolist()}")
    tokens, accepted = verify_one_hot_draft(p, 0, rng, 200_000)
    freq = np.bincount(tokens, minlength=3) / tokens.size
    print(f"{'one-hot draft x = 0':20s}: acceptance {accepted.mean():.4f} (expected 0.5000),"
          f" output {np.round(freq, 4).tolist()}")
