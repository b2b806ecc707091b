"""How much a quantized model differs from its float32 self: KL and top-1 at every position.

Quality is measured by teacher forcing: one prefill of a fixed token sequence,
logits at every position, compared position by position with the float32
model's logits for the same tokens::

    KL(p_ref || p_q) = sum_v p_ref(v) * (log p_ref(v) - log p_q(v))   (nats, averaged over positions)
    top-1 agreement  = fraction of positions whose argmax token is the same

Both come from log-softmax in float64, so no logit is exponentiated without
its row max subtracted first. ``benchmarks/bench_quantization.py`` prints the
table in BENCHMARKS.md with these functions, and a test recomputes it.
"""
from __future__ import annotations

import numpy as np

from mini_vllm.models.runner import Chunk, make_model_input

# The text every quality number in BENCHMARKS.md is measured on (44 SmolLM2 tokens).
EVAL_TEXT = ("The committee met on Tuesday to review the budget for the new library. After a long "
             "discussion about costs, staffing and opening hours, they agreed to ask the city for "
             "more money and to open the doors in the spring.")

# (label, quantization, quantization_config, kv_cache_dtype): the rows of the table.
METHODS = (
    ("float32", None, None, "auto"),
    ("int8 W8A16", "int8", None, "auto"),
    ("int4 W4A16 g32", "int4", {"group_size": 32}, "auto"),
    ("int4 W4A16 g64", "int4", {"group_size": 64}, "auto"),
    ("fp8 W8A8", "fp8", None, "auto"),
    ("fp8 KV cache", None, None, "fp8"),
)


def prefill_logits(model, token_ids: list[int], block_size: int = 16,
                   kv_cache_dtype: str = "auto") -> np.ndarray:
    """Float32 logits [len(token_ids), vocab] of one prefill: row t predicts token t + 1."""
    num_blocks = -(-len(token_ids) // block_size)
    if kv_cache_dtype == "auto":
        model.init_kv_cache(num_blocks + 1, block_size)  # block 0 is the null block
    else:
        model.init_kv_cache(num_blocks + 1, block_size, kv_cache_dtype=kv_cache_dtype)
    chunk = Chunk(list(token_ids), 0, list(range(1, num_blocks + 1)))
    model_input = make_model_input([chunk], block_size)
    model_input.logits_indices = np.arange(len(token_ids), dtype=np.int64)
    return model.execute(model_input)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare_logits(ref: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """Mean KL(ref || logits) in nats and the top-1 agreement, over rows (positions)."""
    if ref.shape != logits.shape or ref.ndim != 2:
        raise ValueError(f"ref and logits must be [positions, vocab] of one shape, "
                         f"got {ref.shape} and {logits.shape}")
    lp_ref, lp = log_softmax(ref), log_softmax(logits)
    kl = (np.exp(lp_ref) * (lp_ref - lp)).sum(axis=-1)
    top1 = ref.argmax(axis=-1) == logits.argmax(axis=-1)
    return {"kl": float(kl.mean()), "kl_max": float(kl.max()), "top1": float(top1.mean())}
