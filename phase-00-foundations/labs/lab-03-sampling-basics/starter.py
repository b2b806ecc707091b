"""Lab 00-03 — from logits to a token: sampling basics (starter: your work).

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
    """Probabilities from logits; subtracting the max first keeps exp() finite.

    Recipe: row = _as_row(logits) (it raises the ValueError for a bad shape);
    e = exp(row - row.max()); return e / e.sum(). -inf logits become 0.
    """
    raise NotImplementedError("softmax: your turn (see the docstring)")


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Divide by the temperature: below 1 sharpens, above 1 flattens.

    Recipe: temperature must be > 0 here (ValueError naming temperature; the
    greedy case never reaches this function); return _as_row(logits) / temperature.
    """
    raise NotImplementedError("apply_temperature: your turn (see the docstring)")


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Set every logit below the k-th largest to -inf (ties with it survive).

    ``k`` of 0 or -1 disables the filter, as does a k at least the vocabulary size.

    Recipe: k < -1 -> ValueError naming top_k. Disabled -> return a copy. Else
    find the k-th largest value in O(vocab) with np.partition(row, n - k)[n - k]
    and return np.where(row < kth, -np.inf, row).
    """
    raise NotImplementedError("apply_top_k: your turn (see the docstring)")


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability reaches ``p``.

    Sorted from least to most likely, a token is dropped when the mass at or below
    it is <= 1 - p; the most likely token is never dropped. The token whose
    probability crosses ``p`` is therefore kept (p=0.5 over [0.4, 0.4, 0.2] keeps two).

    Recipe: p outside (0, 1] -> ValueError naming top_p; p == 1 -> a copy.
    order = np.argsort(row, kind="stable") (ascending); cumulative =
    np.cumsum(softmax(row)[order]); drop = cumulative <= 1 - p; drop[-1] = False;
    set row[order[drop]] to -inf in a copy.
    """
    raise NotImplementedError("apply_top_p: your turn (see the docstring)")


def apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Set to -inf every logit whose probability is below ``min_p`` x the largest.

    The probabilities are the softmax of ``logits`` as given (already divided by
    the temperature). The most likely token always survives, so min-p never
    changes a greedy pick. Renormalising is left to the final softmax.

    Recipe: row = _as_row(logits); min_p outside [0, 1] -> ValueError naming
    min_p; 0 -> a copy. Else probs = softmax(row) and return
    np.where(probs < min_p * probs.max(), -np.inf, row) (strictly below: a
    token exactly at the threshold stays).
    """
    raise NotImplementedError("apply_min_p: your turn (see the docstring)")


def filtered_probs(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """The distribution a non-greedy draw uses, after every filter, in pipeline order.

    Recipe: temperature, then min-p, then top-k, then top-p (all four on
    logits), then softmax. This order is mini_vllm's and vLLM's: top-p must
    measure mass after min-p has cut the tail.
    """
    raise NotImplementedError("filtered_probs: your turn (see the docstring)")


def sample(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: np.random.Generator | None = None,
) -> int:
    """One token id. Greedy (argmax, lowest id on ties) when ``temperature == 0``.

    Recipe:
      1. row = _as_row(logits); temperature < 0 -> ValueError naming temperature.
      2. temperature == 0: return int(np.argmax(row)) and touch no generator.
      3. probs = filtered_probs(...); rng = generator or np.random.default_rng().
      4. return int(rng.choice(len(probs), p=probs)): exactly one draw, the way
         mini_vllm's Sampler draws, so equal seeds give equal tokens.
    """
    raise NotImplementedError("sample: your turn (see the docstring)")


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
