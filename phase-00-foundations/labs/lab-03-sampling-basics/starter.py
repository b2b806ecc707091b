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
    """Probabilities of one row of logits.

    Input: ``logits``, one non-empty row ``[vocab]`` (a list or an array; anything
    else is a ValueError naming logits, which ``_as_row`` raises for you).
    Output: a float64 array of the same length, every entry in [0, 1], summing to 1;
    the order of the logits is kept and a -inf logit gets probability 0.
    Must stay finite for logits in the thousands (``[1000, 1001, 1002]`` equals
    the softmax of ``[0, 1, 2]``). Never modifies its input.
    """
    raise NotImplementedError("softmax: your turn (see the docstring)")


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Logits rescaled by ``temperature``: below 1 sharpens, above 1 flattens.

    Output: a new float64 row, ``logits / temperature`` element by element.
    Errors: ``temperature <= 0`` is a ValueError naming temperature (greedy, the
    ``temperature == 0`` case, is handled by ``sample`` and never gets here).
    """
    raise NotImplementedError("apply_temperature: your turn (see the docstring)")


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the ``k`` largest logits; every other one becomes -inf.

    A logit tied with the k-th largest survives too, so more than ``k`` may
    remain. ``k`` of 0 or -1 disables the filter, and so does any ``k`` at least
    the vocabulary size: the result is then an unchanged copy.
    Errors: ``k < -1`` is a ValueError naming top_k. Returns a new array; the
    caller's logits are never modified.
    """
    raise NotImplementedError("apply_top_k: your turn (see the docstring)")


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability reaches ``p``.

    Tokens are taken from most to least likely (among equal logits the higher id
    counts as more likely, as in mini_vllm's stable ascending sort) until their
    mass reaches ``p``; the token that crosses ``p`` is kept, the rest become -inf.
    So p = 0.5 over probabilities [0.4, 0.4, 0.2] keeps two tokens, and four equal
    tokens with p = 0.75 keep three. The most likely token always survives,
    whatever rounding does to the running sum. ``p == 1`` returns an unchanged copy.
    Errors: ``p`` outside (0, 1] is a ValueError naming top_p. Returns a new array.
    """
    raise NotImplementedError("apply_top_p: your turn (see the docstring)")


def apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Set to -inf every logit whose probability is below ``min_p`` x the largest.

    The probabilities are the softmax of ``logits`` as given (already divided by
    the temperature). A probability exactly at the threshold stays, so the most
    likely token (and any token tied with it) always survives and min-p never
    changes a greedy pick. Survivors keep their logits; renormalising is left to
    the final softmax. ``min_p == 0`` returns an unchanged copy.
    Errors: ``min_p`` outside [0, 1] is a ValueError naming min_p. Returns a new array.
    """
    raise NotImplementedError("apply_min_p: your turn (see the docstring)")


def filtered_probs(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """The distribution a non-greedy draw uses, after every filter.

    Output: probabilities over the whole vocabulary (0 for filtered tokens),
    summing to 1. The filters run in vLLM's order: temperature, min-p, top-k,
    top-p, then softmax; the order matters (the README shows an example where
    another order keeps a token this one drops). Errors: as the filters raise them.
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
    """One token id drawn from ``logits``.

    ``temperature == 0`` is greedy: the argmax (the lowest id on ties), and the
    generator is not touched at all. Otherwise the draw uses ``filtered_probs``
    and consumes ``generator`` exactly as mini_vllm's ``Sampler`` does (one
    ``choice`` over the vocabulary), so equal seeds give equal tokens in both.
    Without a generator a fresh unseeded one is used.
    Errors: a negative temperature, or any argument a filter rejects, is a
    ValueError naming it.
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
