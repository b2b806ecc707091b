"""Lab 00-01 — generation with and without a KV cache (reference solution).

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
    """y[j] = dot(w[j], x): one dot product per row of ``w`` ([out, in] layout)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or x.shape != (w.shape[1],):
        raise ValueError(f"shapes do not match: x {x.shape}, w {w.shape} (need x [in], w [out, in])")
    return w @ x


def softmax(x: np.ndarray) -> np.ndarray:
    """exp(x) / sum(exp(x)), computed after subtracting the max so it cannot overflow."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x))
    return e / e.sum()


def attention_weights(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """softmax(keys @ q / sqrt(head_dim)): how much the query attends to each key."""
    q = np.asarray(q, dtype=np.float64)
    keys = np.asarray(keys, dtype=np.float64)
    return softmax(keys @ q / math.sqrt(q.shape[-1]))


def attend(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, meter: WorkMeter | None = None
) -> np.ndarray:
    """The attention output of one query: the value rows blended by the weights."""
    keys = np.asarray(keys, dtype=np.float64)
    if meter is not None:
        meter.scores += len(keys)
    return attention_weights(q, keys) @ np.asarray(values, dtype=np.float64)


def forward(
    model: TinyModel,
    token_ids: list[int],
    start_pos: int,
    cache: KVCache,
    meter: WorkMeter,
) -> np.ndarray:
    """Run the new tokens ``token_ids`` (positions ``start_pos``...) through the model.

    ``cache`` must already hold exactly ``start_pos`` positions. Every layer computes
    K/V for the new rows only, appends them, and lets each new row attend to every
    cached position up to and including its own. Returns the logits of the last
    new token.
    """
    if not token_ids:
        raise ValueError("token_ids must hold at least one token")
    if len(cache) != start_pos:
        raise ValueError(f"cache holds {len(cache)} positions but start_pos is {start_pos}")
    xs = [model.embed(t, start_pos + i) for i, t in enumerate(token_ids)]
    for layer in range(model.n_layers):
        for i, x in enumerate(xs):
            q, k, v = model.qkv(layer, x, meter)
            cache.append(layer, k, v)
            keys, values = cache.get(layer)  # positions 0 .. start_pos + i
            xs[i] = model.mix(layer, x, attend(q, keys, values, meter))
    return model.logits(xs[-1])


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
    """Greedy generation that recomputes every position at every step."""
    _check_generation_args(model, prompt, n_new)
    meter = WorkMeter()
    tokens = list(prompt)
    for _ in range(n_new):
        cache = model.new_cache(len(tokens))  # a fresh cache: nothing is remembered
        logits = forward(model, tokens, 0, cache, meter)
        tokens.append(int(np.argmax(logits)))
    return tokens, meter


def generate_with_cache(
    model: TinyModel, prompt: list[int], n_new: int
) -> tuple[list[int], WorkMeter]:
    """Greedy generation: prefill the prompt once, then feed one new token per step."""
    _check_generation_args(model, prompt, n_new)
    meter = WorkMeter()
    cache = model.new_cache(len(prompt) + n_new)
    tokens = list(prompt)
    logits = forward(model, tokens, 0, cache, meter)  # prefill
    tokens.append(int(np.argmax(logits)))
    while len(tokens) < len(prompt) + n_new:  # decode
        logits = forward(model, [tokens[-1]], len(tokens) - 1, cache, meter)
        tokens.append(int(np.argmax(logits)))
    return tokens, meter


def kv_rows_no_cache(prompt_len: int, n_new: int) -> int:
    """Token rows pushed through one layer without a cache: P + (P+1) + ... + (P+n-1)."""
    if prompt_len < 1 or n_new < 1:
        raise ValueError("prompt_len and n_new must be >= 1")
    return n_new * prompt_len + n_new * (n_new - 1) // 2


def kv_rows_with_cache(prompt_len: int, n_new: int) -> int:
    """Token rows pushed through one layer with a cache: P for the prefill, 1 per decode."""
    if prompt_len < 1 or n_new < 1:
        raise ValueError("prompt_len and n_new must be >= 1")
    return prompt_len + n_new - 1


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
