"""Lab 00-03 — from logits to a token: sampling basics (reference solution).

One row of logits in, one token id out, through the same pipeline as
mini_vllm's ``Sampler`` (mini_vllm/sampler.py):

    temperature == 0  ->  argmax (no randomness, the generator is not touched)
    otherwise         ->  logits / temperature
                      ->  min-p   (-inf below min_p x the top probability)
                      ->  top-k   (keep the k largest logits, ties included)
                      ->  top-p   (keep the smallest most-likely set with mass >= p)
                      ->  softmax
                      ->  one draw: generator.choice(vocab, p=probs)

This is also vLLM v1's order: min-p is an argmax-invariant logits processor
that runs on the temperature-scaled logits before the top-k/top-p sampler.
The draw consumes the generator exactly as mini_vllm does, so with the same
seed the two samplers return the same token, draw after draw.

upstream: vllm/v1/sample/sampler.py:238 Sampler.sample
upstream: vllm/v1/sample/logits_processor/builtin.py:101 MinPLogitsProcessor.apply
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:328 apply_top_k_top_p_pytorch
"""
from __future__ import annotations

import sys

import numpy as np


def _as_row(logits: np.ndarray) -> np.ndarray:
    row = np.asarray(logits, dtype=np.float64)
    if row.ndim != 1 or row.size == 0:
        raise ValueError(f"logits must be one non-empty row [vocab], got shape {row.shape}")
    return row


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities from logits; subtracting the max first keeps exp() finite."""
    row = _as_row(logits)
    e = np.exp(row - row.max())
    return e / e.sum()


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Divide by the temperature: below 1 sharpens, above 1 flattens."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 here (0 means greedy), got {temperature}")
    return _as_row(logits) / temperature


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Set every logit below the k-th largest to -inf (ties with it survive).

    ``k`` of 0 or -1 disables the filter, as does a k at least the vocabulary size.
    """
    row = _as_row(logits)
    if k < -1:
        raise ValueError(f"top_k must be -1 or 0 (disabled) or >= 1, got {k}")
    if k <= 0 or k >= row.size:
        return row.copy()
    kth = np.partition(row, row.size - k)[row.size - k]
    return np.where(row < kth, -np.inf, row)


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability reaches ``p``.

    Sorted from least to most likely, a token is dropped when the mass at or below
    it is <= 1 - p; the most likely token is never dropped. The token whose
    probability crosses ``p`` is therefore kept (p=0.5 over [0.4, 0.4, 0.2] keeps two).
    """
    row = _as_row(logits)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    if p == 1.0:
        return row.copy()
    order = np.argsort(row, kind="stable")
    cumulative = np.cumsum(softmax(row)[order])
    drop = cumulative <= 1.0 - p
    drop[-1] = False
    out = row.copy()
    out[order[drop]] = -np.inf
    return out


def apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Set to -inf every logit whose probability is below ``min_p`` x the largest.

    The probabilities are the softmax of ``logits`` as given (already divided by
    the temperature). The most likely token always survives, so min-p never
    changes a greedy pick. Renormalising is left to the final softmax.
    """
    row = _as_row(logits)
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    if min_p == 0.0:
        return row.copy()
    probs = softmax(row)
    return np.where(probs < min_p * probs.max(), -np.inf, row)


def filtered_probs(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """The distribution a non-greedy draw uses, after every filter, in pipeline order."""
    row = apply_temperature(logits, temperature)
    row = apply_min_p(row, min_p)
    row = apply_top_k(row, top_k)
    row = apply_top_p(row, top_p)
    return softmax(row)


def sample(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: np.random.Generator | None = None,
) -> int:
    """One token id. Greedy (argmax, lowest id on ties) when ``temperature == 0``."""
    row = _as_row(logits)
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if temperature == 0:
        return int(np.argmax(row))
    probs = filtered_probs(row, temperature, top_k, top_p, min_p)
    rng = generator if generator is not None else np.random.default_rng()
    return int(rng.choice(len(probs), p=probs))


def main(out: str = "temperature.png") -> None:
    """Show what the knobs do to one small distribution, and plot temperature."""
    words = [" Paris", " Lyon", " a", " the", " banana"]
    logits = np.array([4.0, 1.5, 1.0, 0.5, -3.0])
    print("token      p(T=1)  p(T=0.5)  p(T=2)  top-k=2  top-p=0.9")
    cols = [
        softmax(logits),
        filtered_probs(logits, 0.5),
        filtered_probs(logits, 2.0),
        filtered_probs(logits, 1.0, top_k=2),
        filtered_probs(logits, 1.0, top_p=0.9),
    ]
    for i, w in enumerate(words):
        print(f"{w:<9}" + "".join(f"{c[i]:>9.3f}" for c in cols))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = [0.25, 0.5, 1.0, 2.0, 4.0]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.15
    for j, t in enumerate(temps):
        ax.bar(np.arange(len(words)) + j * width, filtered_probs(logits, t), width, label=f"T={t}")
    ax.set_xticks(np.arange(len(words)) + 2 * width, [w.strip() for w in words])
    ax.set_ylabel("probability")
    ax.set_title("Temperature reshapes one distribution")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
