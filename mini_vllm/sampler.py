"""Sampler: one request's logits row -> one token id.

Order, the same as vLLM v1's ``Sampler.sample`` (its class docstring lists
it as steps 7a-7e, cited first below): greedy when
``temperature == 0``; otherwise divide by the temperature, then min-p, then
top-k, then top-p, then softmax and one draw from what is left.

- Min-p looks at the softmax of the temperature-scaled logits (the full
  distribution, before any other filter) and sets to -inf every logit whose
  probability is below ``min_p`` x the largest probability. It can never remove
  the most likely token, so it cannot change a greedy pick: upstream calls it
  an argmax-invariant logits processor and runs it before top-k/top-p.
- Top-k keeps every token tied with the k-th largest logit.
- Top-p keeps the smallest set of most likely tokens whose mass reaches
  ``top_p`` (always at least one). It measures mass after min-p has removed
  the tail, so min-p then top-p can keep fewer tokens than top-p then min-p.

Each request draws from its own ``np.random.Generator`` (seeded from
``SamplingParams.seed``), so its tokens never depend on its batch neighbours.

Differences from upstream: one row at a time in float64 (upstream samples
the whole batch in float32 on the GPU); the draw is ``Generator.choice`` where
upstream takes ``argmax(probs / q)`` with ``q`` exponential noise, which picks
from the same distribution but consumes a different random stream, so a seed
gives different tokens in the two engines; among logits tied at the top-p
boundary, which one survives may differ (upstream's sort is not stable).

upstream: vllm/v1/sample/sampler.py:41-48 min_p
upstream: vllm/v1/sample/sampler.py:238 Sampler.sample
upstream: vllm/v1/sample/sampler.py:223 Sampler.apply_temperature
upstream: vllm/v1/sample/sampler.py:277-278 argmax_invariant
upstream: vllm/v1/sample/logits_processor/builtin.py:101 MinPLogitsProcessor.apply
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:328 apply_top_k_top_p_pytorch
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:395 random_sample
"""
from __future__ import annotations

import numpy as np

from mini_vllm.sampling_params import SamplingParams


class Sampler:
    def sample(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        generator: np.random.Generator | None = None,
    ) -> int:
        logits = np.asarray(logits, dtype=np.float64)
        if logits.ndim != 1:
            raise ValueError(f"logits must be one row [vocab], got shape {logits.shape}")
        if params.temperature == 0:
            return int(np.argmax(logits))  # ties -> lowest id, like torch.argmax
        probs = self.probs(logits, params)
        rng = generator if generator is not None else np.random.default_rng(params.seed)
        return int(rng.choice(len(probs), p=probs))

    def probs(self, logits: np.ndarray, params: SamplingParams) -> np.ndarray:
        """The distribution a non-greedy draw uses (after all filters)."""
        logits = np.asarray(logits, dtype=np.float64) / params.temperature
        if params.min_p > 0.0:
            logits = _apply_min_p(logits, params.min_p)
        if params.top_k > 0:
            logits = _apply_top_k(logits, params.top_k)
        if params.top_p < 1.0:
            logits = _apply_top_p(logits, params.top_p)
        return _softmax(logits)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


def _apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    # As upstream: threshold = min_p x the top probability of the full
    # (temperature-scaled) distribution; tokens strictly below it become -inf.
    probs = _softmax(logits)
    return np.where(probs < min_p * probs.max(), -np.inf, logits)


def _apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    if k >= len(logits):
        return logits
    kth = np.partition(logits, len(logits) - k)[len(logits) - k]
    return np.where(logits < kth, -np.inf, logits)


def _apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    # As upstream: sort ascending, drop the tokens whose cumulative mass from the
    # bottom is <= 1 - p, and never drop the most likely one.
    order = np.argsort(logits, kind="stable")
    cum = np.cumsum(_softmax(logits)[order])
    drop = cum <= 1.0 - p
    drop[-1] = False
    out = logits.copy()
    out[order[drop]] = -np.inf
    return out
