"""RejectionSampler: keep the longest draft prefix the target agrees with.

Greedy requests: accept draft ``i`` while it equals the target's argmax at
row ``i``; the first disagreement emits the target's argmax instead; if all
``d`` drafts pass, the last row's argmax is the bonus token. The output is
then exactly what non-speculative greedy decoding produces.

Sampled requests (temperature > 0): with draft probabilities ``q``, accept
draft ``x`` with probability ``min(1, p(x) / q(x))``; on rejection draw from
``normalize(max(p - q, 0))``. A drafter with no probabilities (n-gram) is a
one-hot ``q``: accept with probability ``p(x)``, recover from ``p`` with ``x``
zeroed. Either way each emitted token is distributed exactly as ``p``.
Recovered tokens are drawn by the exponential race ``argmax(r / E)``,
``E ~ Exp(1)``, as upstream does. Rejected positions hold ``-1``.

upstream: vllm/v1/sample/rejection_sampler.py:37 RejectionSampler
upstream: vllm/v1/sample/rejection_sampler.py:392 rejection_sample
upstream: vllm/v1/sample/rejection_sampler.py:762 rejection_random_sample_kernel
upstream: vllm/v1/sample/rejection_sampler.py:854 sample_recovered_tokens_kernel
"""
from __future__ import annotations

import numpy as np

from mini_vllm.sampler import Sampler
from mini_vllm.sampling_params import SamplingParams

PLACEHOLDER_TOKEN_ID = -1  # upstream: vllm/v1/sample/rejection_sampler.py:30 PLACEHOLDER_TOKEN_ID


def recovery_probs(target_probs: np.ndarray, draft_token_ids: np.ndarray,
                   draft_probs: np.ndarray | None) -> np.ndarray:
    """Unnormalised residual ``max(p - q, 0)``; a one-hot ``q`` just zeroes the draft."""
    if draft_probs is not None:
        return np.maximum(target_probs - draft_probs, 0.0)
    residual = target_probs.copy()
    np.put_along_axis(residual, draft_token_ids[..., None], 0.0, axis=-1)
    return residual


def rejection_sample(draft_token_ids: np.ndarray, target_probs: np.ndarray,
                     bonus_token_ids: np.ndarray, rng: np.random.Generator,
                     draft_probs: np.ndarray | None = None) -> np.ndarray:
    """The random path, vectorised over a batch of equal-length drafts.

    draft_token_ids [B, d] int; target_probs [B, d, V]; bonus_token_ids [B];
    draft_probs [B, d, V] or None (one-hot drafts). Returns [B, d + 1] int64:
    the accepted drafts, then one recovered or bonus token, then -1s.
    """
    draft = np.asarray(draft_token_ids, dtype=np.int64)
    batch, d = draft.shape
    p_x = np.take_along_axis(target_probs, draft[..., None], axis=-1)[..., 0]
    q_x = np.ones_like(p_x) if draft_probs is None else \
        np.take_along_axis(draft_probs, draft[..., None], axis=-1)[..., 0]
    uniform = rng.random((batch, d))
    # Accept iff p(x) / q(x) >= u (q(x) == 0 rejects, never divides by zero).
    accepted = (q_x > 0) & (p_x >= uniform * q_x)
    residual = recovery_probs(target_probs, draft, draft_probs)
    recovered = np.argmax(residual / rng.exponential(size=residual.shape), axis=-1)
    num_accepted = np.where(accepted.all(axis=1), d, np.argmin(accepted, axis=1))
    out = np.full((batch, d + 1), PLACEHOLDER_TOKEN_ID, dtype=np.int64)
    pos = np.arange(d + 1)
    keep = pos[None, :d] < num_accepted[:, None]
    out[:, :d] = np.where(keep, draft, PLACEHOLDER_TOKEN_ID)
    rows = np.arange(batch)
    last = np.where(num_accepted < d, recovered[rows, np.minimum(num_accepted, d - 1)], bonus_token_ids)
    out[rows, num_accepted] = last
    return out


class RejectionSampler:
    """One request's verify step over its ``d + 1`` logits rows."""

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.sampler = sampler or Sampler()

    def __call__(self, draft_token_ids: list[int], logits: np.ndarray, params: SamplingParams,
                 generator: np.random.Generator, draft_probs: np.ndarray | None = None) -> list[int]:
        """Tokens to append: the accepted drafts plus one recovered or bonus token."""
        d = len(draft_token_ids)
        if logits.shape[0] != d + 1:
            raise ValueError(f"logits must have len(draft_token_ids) + 1 = {d + 1} rows, "
                             f"got {logits.shape[0]}")
        if params.temperature == 0:
            target = np.argmax(logits, axis=-1).tolist()  # ties -> lowest id, as Sampler
            n = 0
            while n < d and draft_token_ids[n] == target[n]:
                n += 1
            return list(draft_token_ids[:n]) + [target[n]]
        probs = np.stack([self.sampler.probs(row, params) for row in logits[:d]])
        bonus = self.sampler.sample(logits[d], params, generator)
        out = rejection_sample(np.array([draft_token_ids]), probs[None], np.array([bonus]),
                               generator, None if draft_probs is None else draft_probs[None])[0]
        return out[out != PLACEHOLDER_TOKEN_ID].tolist()
