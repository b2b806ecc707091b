"""Lab 00-01 — generation with and without a KV cache (starter: your work).

A two-layer, one-head decoder small enough to read in full. You write the math
(`linear`, `softmax`, `attention_weights`, `attend`), one `forward` that pushes
new tokens through the model on top of a KV cache, and the two generation loops:
one that throws the cache away after every step and one that keeps it.

The model counts its own work in a `WorkMeter`: one K/V row per token per layer,
and one query-key dot product per attention score. Counting, not timing, is how
the tests pin the O(N^2) versus O(N) difference; the timing table printed by
`python solution.py` is for your eyes only.

upstream: vllm/model_executor/models/llama.py:223 LlamaAttention.forward
upstream: vllm/model_executor/layers/attention/attention.py:177 Attention
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class WorkMeter:
    """What a generation run cost, in units that do not depend on the machine."""

    kv_rows: int = 0  # K/V rows computed, summed over layers
    scores: int = 0  # query . key dot products, summed over layers


class KVCache:
    """Preallocated K and V rows for one sequence, one array pair per layer.

    Row ``p`` of layer ``l`` holds the key/value of the token at position ``p``.
    Rows are only ever appended: a token's K and V depend on the tokens at or
    before it, so they never change once written.
    """

    def __init__(self, n_layers: int, d_model: int, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.keys = np.zeros((n_layers, capacity, d_model))
        self.values = np.zeros((n_layers, capacity, d_model))
        self.lengths = [0] * n_layers

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        n = self.lengths[layer]
        if n == self.keys.shape[1]:
            raise ValueError(f"KV cache is full ({n} positions)")
        self.keys[layer, n] = k
        self.values[layer, n] = v
        self.lengths[layer] = n + 1

    def get(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of every cached K and V row of ``layer``, oldest first."""
        n = self.lengths[layer]
        return self.keys[layer, :n], self.values[layer, :n]

    def __len__(self) -> int:
        return self.lengths[0]


class TinyModel:
    """A seeded, two-layer, single-head decoder over a small vocabulary.

    Weights are stored ``[out_features, in_features]`` (PyTorch's layout), so a
    layer is ``linear(x, W)``: one dot product per row of ``W``. Every method
    works on one token row at a time, which makes the cached and the uncached
    runs do bit-identical arithmetic for the same position.
    """

    def __init__(
        self,
        vocab_size: int = 48,
        d_model: int = 16,
        n_layers: int = 2,
        max_positions: int = 1024,
        seed: int = 0,
    ) -> None:
        rng = np.random.default_rng(seed)
        scale = 1.0 / math.sqrt(d_model)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.max_positions = max_positions
        self.tok_emb = rng.normal(0.0, 1.0, (vocab_size, d_model))
        self.pos_emb = rng.normal(0.0, 0.5, (max_positions, d_model))
        self.wq = rng.normal(0.0, scale, (n_layers, d_model, d_model))
        self.wk = rng.normal(0.0, scale, (n_layers, d_model, d_model))
        self.wv = rng.normal(0.0, scale, (n_layers, d_model, d_model))
        self.wo = rng.normal(0.0, scale, (n_layers, d_model, d_model))
        self.w_lm = rng.normal(0.0, scale, (vocab_size, d_model))

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.n_layers, self.d_model, capacity)

    def embed(self, token_id: int, pos: int) -> np.ndarray:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token_id must be in [0, {self.vocab_size}), got {token_id}")
        if not 0 <= pos < self.max_positions:
            raise ValueError(f"pos must be in [0, {self.max_positions}), got {pos}")
        return self.tok_emb[token_id] + self.pos_emb[pos]

    def qkv(
        self, layer: int, x: np.ndarray, meter: WorkMeter
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Project one hidden row into its query, key and value (counts one K/V row)."""
        meter.kv_rows += 1
        return linear(x, self.wq[layer]), linear(x, self.wk[layer]), linear(x, self.wv[layer])

    def mix(self, layer: int, x: np.ndarray, attn_out: np.ndarray) -> np.ndarray:
        """Residual add of the attention output, then a small nonlinearity."""
        return np.tanh(x + linear(attn_out, self.wo[layer]))

    def logits(self, x: np.ndarray) -> np.ndarray:
        return linear(x, self.w_lm)


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """One dense layer without bias: ``y[j] = dot(w[j], x)``.

    Inputs: ``x`` a vector ``[in]``, ``w`` a matrix ``[out, in]`` (PyTorch's layout;
    lists are fine). Output: a float64 vector ``[out]``.
    Errors: ``w`` not 2-D, or ``len(x) != w.shape[1]``: ValueError whose message
    contains "shapes". Example: ``linear([1, 2, 3], [[1, 0, 1], [0, 1, 1]])`` is [4, 5].
    """
    raise NotImplementedError("linear: write it (see the docstring)")


def softmax(x: np.ndarray) -> np.ndarray:
    """Probabilities from a vector of scores.

    Output: float64, same length, non-negative, summing to 1, order kept.
    Must stay finite for scores around 1000 (exp(1000) overflows float64).
    """
    raise NotImplementedError("softmax: write it (see the docstring)")


def attention_weights(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """How much one query attends to each key: scaled dot products, then softmax.

    Inputs: ``q`` one query ``[d]``, ``keys`` ``[n, d]``. Output: ``[n]`` weights
    summing to 1. The scores are divided by ``sqrt(d)``, the head dimension.
    The guide's example (q = [1, 0], keys [[1, 0], [0, 1], [1, 0]]) gives about
    [0.40, 0.20, 0.40].
    """
    raise NotImplementedError("attention_weights: write it (see the docstring)")


def attend(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, meter: WorkMeter | None = None
) -> np.ndarray:
    """The attention output of one query: the value rows blended by its weights.

    Inputs: ``q`` ``[d]``, ``keys`` ``[n, d]``, ``values`` ``[n, d_v]``. Output: ``[d_v]``.
    When ``meter`` is given, ``meter.scores`` grows by ``n``: one query . key dot
    product per key.
    """
    raise NotImplementedError("attend: write it (see the docstring)")


def forward(
    model: TinyModel,
    token_ids: list[int],
    start_pos: int,
    cache: KVCache,
    meter: WorkMeter,
) -> np.ndarray:
    """Run the new tokens ``token_ids`` (positions ``start_pos``...) through the model.

    Contract:
      * ``cache`` holds exactly ``start_pos`` positions on entry and
        ``start_pos + len(token_ids)`` on return: every layer appends the K/V of
        each new row once (``model.qkv`` counts one K/V row in ``meter`` each time).
      * Causality: the new row at position ``start_pos + i`` attends to positions
        ``0 .. start_pos + i`` only, in every layer, never to a later row of the
        same call.
      * Returns the logits ``[vocab]`` of the last new token.
      * Feeding a prompt in one call or in several chunks on one cache gives
        bit-identical logits: work one row at a time, no batched matmul.
    Errors (before anything is appended): an empty ``token_ids``, or a cache whose
    length is not ``start_pos``, is a ValueError (naming token_ids / start_pos).
    """
    raise NotImplementedError("forward: write it (see the docstring)")


def _check_generation_args(model: TinyModel, prompt: list[int], n_new: int) -> None:
    if len(prompt) == 0:
        raise ValueError("prompt must hold at least one token")
    if n_new < 1:
        raise ValueError(f"n_new must be >= 1, got {n_new}")
    if len(prompt) + n_new > model.max_positions:
        raise ValueError(
            f"len(prompt) + n_new must be <= max_positions={model.max_positions}, "
            f"got {len(prompt) + n_new}"
        )


def generate_no_cache(
    model: TinyModel, prompt: list[int], n_new: int
) -> tuple[list[int], WorkMeter]:
    """Greedy generation that remembers nothing between steps.

    Returns ``(tokens, meter)``: ``tokens`` is the prompt followed by ``n_new``
    generated ids (each the argmax of the logits), and ``meter`` holds the work of
    the whole run. Every step pushes the entire sequence so far through a fresh
    cache. Errors: those of ``_check_generation_args``.
    """
    raise NotImplementedError("generate_no_cache: write it (see the docstring)")


def generate_with_cache(
    model: TinyModel, prompt: list[int], n_new: int
) -> tuple[list[int], WorkMeter]:
    """Greedy generation on one KV cache: the same tokens as ``generate_no_cache``.

    Returns ``(tokens, meter)`` like ``generate_no_cache``. The prompt goes through
    the model once (the prefill); after that each step feeds only the newest
    token (a decode). The last generated token is returned but never fed back, so
    one layer computes ``P + n_new - 1`` K/V rows in all.
    Errors: those of ``_check_generation_args``.
    """
    raise NotImplementedError("generate_with_cache: write it (see the docstring)")


def kv_rows_no_cache(prompt_len: int, n_new: int) -> int:
    """K/V rows one layer computes without a cache: P + (P+1) + ... + (P+n-1).

    Closed form, no loop; returns an exact ``int`` (5, 10 -> 95).
    Errors: ``prompt_len < 1`` or ``n_new < 1`` is a ValueError naming them.
    """
    raise NotImplementedError("kv_rows_no_cache: write it (see the docstring)")


def kv_rows_with_cache(prompt_len: int, n_new: int) -> int:
    """K/V rows one layer computes with a cache: P for the prefill, then one per decode.

    Returns an ``int`` (5, 10 -> 14: the last token is never fed back).
    Errors: ``prompt_len < 1`` or ``n_new < 1`` is a ValueError naming them.
    """
    raise NotImplementedError("kv_rows_with_cache: write it (see the docstring)")


def main(out: str = "kv_cache_work.png", prompt_len: int = 16) -> None:
    """Print a timing table (never asserted) and plot the counted work."""
    model = TinyModel()
    prompt = [i % model.vocab_size for i in range(prompt_len)]
    print(f"prompt_len={prompt_len}; K/V rows summed over {model.n_layers} layers; "
          "times are wall-clock on this machine and are never asserted")
    print(f"{'n_new':>6} {'K/V rows, no cache':>19} {'K/V rows, cached':>17} {'ms no-cache':>12} {'ms cached':>10}")
    for n in (16, 32, 64, 128):
        t0 = time.perf_counter()
        a, ma = generate_no_cache(model, prompt, n)
        t1 = time.perf_counter()
        b, mb = generate_with_cache(model, prompt, n)
        t2 = time.perf_counter()
        assert a == b, "the two loops disagree: the cache changed the output"
        print(f"{n:>6} {ma.kv_rows:>19} {mb.kv_rows:>17} {1e3 * (t1 - t0):>12.1f} {1e3 * (t2 - t1):>10.1f}")
    _plot(prompt_len, out)


def _plot(prompt_len: int, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = list(range(1, 257))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ns, [kv_rows_no_cache(prompt_len, n) for n in ns], label="no cache: O(N^2)")
    ax.plot(ns, [kv_rows_with_cache(prompt_len, n) for n in ns], label="KV cache: O(N)")
    ax.set_xlabel("tokens generated (n_new)")
    ax.set_ylabel("K/V rows computed per layer")
    ax.set_title(f"Work to generate n tokens after a {prompt_len}-token prompt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
