"""ToyModel: a stand-in for a transformer that makes the control plane testable.

Its logits are a pure function of (seed, last token, position): cheap,
batched, deterministic, and blind to the KV cache. That is exactly what the
scheduler, block pool and sampler tests need: if chunked prefill, prefix
caching or preemption ever fed a request the wrong token or position, its
greedy output would change. (Whether the *KV contents* are right is tested
with the real model in ``mini_vllm/models``.)

It has the interface every model in mini_vllm has: ``vocab_size``,
``max_model_len``, ``eos_token_id``, ``tokenizer``, ``init_kv_cache`` and
``execute(ModelInput) -> logits [num_reqs, vocab_size]``.
"""
from __future__ import annotations

import numpy as np

from mini_vllm.model_input import ModelInput
from mini_vllm.tokenizer import ByteTokenizer

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a cheap, well-spread uint64 -> uint64 hash."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class ToyModel:
    """Pseudo-logits in ``[0, 4)`` per vocabulary entry, plus ``eos_bias`` on EOS.

    Printable ASCII bytes (32-126) get +4 so that a demo prints letters, not
    mojibake: greedy output is always printable, sampled output mostly.

    The default ``eos_bias=-8`` puts EOS below every other logit: greedy
    decoding never stops early, and sampling at temperature 1 picks EOS with
    probability below 1e-6 per token. A test that needs EOS raises it.
    """

    def __init__(
        self,
        vocab_size: int = 257,
        seed: int = 0,
        max_model_len: int = 4096,
        eos_bias: float = -8.0,
    ) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
            raise ValueError(f"vocab_size must be an integer >= 257 (bytes + EOS), got {vocab_size!r}")
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
            raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if isinstance(eos_bias, bool) or not isinstance(eos_bias, int | float) or not np.isfinite(eos_bias):
            raise ValueError(f"eos_bias must be a finite number, got {eos_bias!r}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.max_model_len = max_model_len
        self.eos_bias = eos_bias
        self.tokenizer = ByteTokenizer()
        self.eos_token_id = self.tokenizer.eos_token_id
        self._vocab = np.arange(vocab_size, dtype=np.uint64) * _GOLDEN
        self._seed_key = np.uint64(seed * int(_M2) % 2**64)
        self._bias = np.zeros(vocab_size)
        self._bias[32:127] = 4.0
        self._bias[self.eos_token_id] = eos_bias

    def init_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Nothing to allocate: the toy model never reads or writes KV."""

    def forward(self, last_tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Logits ``[B, vocab_size]`` (float64) for each (token, position) pair."""
        tokens = np.asarray(last_tokens, dtype=np.int64).astype(np.uint64)
        pos = np.asarray(positions, dtype=np.int64).astype(np.uint64)
        key = _mix(self._seed_key + tokens * _M1 + pos * _GOLDEN)
        bits = _mix(key[:, None] ^ self._vocab[None, :])
        return (bits >> np.uint64(11)).astype(np.float64) * (4.0 / 2.0**53) + self._bias

    def execute(self, model_input: ModelInput) -> np.ndarray:
        """The logits at ``logits_indices``: each request's last scheduled row."""
        rows = model_input.logits_indices
        return self.forward(model_input.token_ids[rows], model_input.positions[rows])
