"""Lab 00-02 — the KV-cache memory calculator (reference solution).

Napkin math for serving capacity: bytes of KV per token, per sequence, how many
sequences fit next to the weights, and the "Maximum concurrency" figure vLLM
logs at startup. Every number the Phase 00 guide quotes about memory comes out
of these functions and is pinned by test_lab.py.

upstream: vllm/v1/kv_cache_interface.py:166 AttentionSpec.real_page_size_bytes
upstream: vllm/v1/core/kv_cache_utils.py:877 get_max_concurrency_for_kv_cache_config
upstream: vllm/v1/core/kv_cache_utils.py:1709 _report_kv_cache_config
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
GB = 10**9


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The handful of numbers from a model's config.json that size it."""

    name: str
    num_layers: int  # num_hidden_layers
    hidden_size: int
    num_q_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads (GQA: fewer than num_q_heads)
    head_dim: int
    intermediate_size: int  # width of the MLP
    vocab_size: int
    tie_word_embeddings: bool = False


# Values from the published config.json of each model.
LLAMA_3_1_8B = ModelConfig("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_3_1_70B = ModelConfig("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256)


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: float) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per element."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        _positive(name, value)
    return int(2 * num_layers * num_kv_heads * head_dim * dtype_bytes)


def kv_bytes_per_seq(bytes_per_token: int, seq_len: int) -> int:
    """The KV cache of one sequence of ``seq_len`` tokens."""
    _positive("bytes_per_token", bytes_per_token)
    _positive("seq_len", seq_len)
    return bytes_per_token * seq_len


def num_params(cfg: ModelConfig) -> int:
    """Parameter count of a Llama-style model, from its config alone.

    Per layer: Q and O projections (hidden x hidden each), K and V projections
    (hidden x kv_heads*head_dim each), the SwiGLU MLP (three hidden x intermediate
    matrices) and two RMSNorm weight vectors. Plus the embedding table, the LM
    head (unless tied to the embedding) and the final norm.
    """
    h = cfg.hidden_size
    q_out = cfg.num_q_heads * cfg.head_dim
    kv_out = cfg.num_kv_heads * cfg.head_dim
    attention = h * q_out + 2 * h * kv_out + q_out * h
    mlp = 3 * h * cfg.intermediate_size
    per_layer = attention + mlp + 2 * h
    embedding = cfg.vocab_size * h
    lm_head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    return cfg.num_layers * per_layer + embedding + lm_head + h


def weight_bytes(cfg: ModelConfig, dtype_bytes: float) -> int:
    """Bytes of weights at ``dtype_bytes`` per parameter (2 for bf16, 1 for fp8)."""
    _positive("dtype_bytes", dtype_bytes)
    return int(num_params(cfg) * dtype_bytes)


def max_concurrent_seqs(
    gpu_bytes: int,
    weights: int,
    seq_bytes: int,
    gpu_memory_utilization: float = 1.0,
) -> int:
    """Whole sequences of ``seq_bytes`` that fit in what the weights leave free.

    The engine may use ``gpu_memory_utilization`` of the card; the weights come off
    that budget first; the rest, floored to whole sequences, is the answer (0 when
    the weights alone do not fit: never a negative count).
    """
    _positive("gpu_bytes", gpu_bytes)
    _positive("seq_bytes", seq_bytes)
    if weights < 0:
        raise ValueError(f"weights must be >= 0, got {weights}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    free = int(gpu_bytes * gpu_memory_utilization) - weights
    return max(0, free // seq_bytes)


def num_kv_blocks(kv_budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """How many blocks of ``block_size`` token slots fit in ``kv_budget_bytes``."""
    _positive("bytes_per_token", bytes_per_token)
    _positive("block_size", block_size)
    if kv_budget_bytes < 0:
        raise ValueError(f"kv_budget_bytes must be >= 0, got {kv_budget_bytes}")
    return kv_budget_bytes // (bytes_per_token * block_size)


def max_concurrency(num_blocks: int, block_size: int, max_model_len: int) -> float:
    """vLLM's figure: blocks in the pool / blocks one max-length request needs."""
    _positive("block_size", block_size)
    _positive("max_model_len", max_model_len)
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
    blocks_per_request = -(-max_model_len // block_size)  # ceiling division, like cdiv
    return num_blocks / blocks_per_request


def concurrency_log_line(max_model_len: int, concurrency: float) -> str:
    """The startup line vLLM prints, with its exact format ("%s tokens", "%.2fx")."""
    # %-formatting on purpose: the same format string as the logger call upstream.
    return "Maximum concurrency for %s tokens per request: %.2fx" % (  # noqa: UP031
        f"{max_model_len:,}",
        concurrency,
    )


def main(out: str = "kv_capacity.png") -> None:
    """Print a capacity table and plot sequences-that-fit against context length."""
    print(f"{'model':<14} {'KV':<5} {'card':>7} {'context':>8} {'KV/token':>9} {'KV/seq':>10} {'seqs':>5}")
    for cfg in (LLAMA_3_1_8B, LLAMA_3_1_70B):
        w = weight_bytes(cfg, 2)
        for kv_name, kv_dtype in (("bf16", 2), ("fp8", 1)):
            per_tok = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
            for card in (24, 80):
                for ctx in (2048, 8192):
                    seqs = max_concurrent_seqs(card * GiB, w, kv_bytes_per_seq(per_tok, ctx))
                    print(
                        f"{cfg.name:<14} {kv_name:<5} {card:>4}GiB {ctx:>8} "
                        f"{per_tok // KiB:>5} KiB {kv_bytes_per_seq(per_tok, ctx) / MiB:>6.0f} MiB {seqs:>5}"
                    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = LLAMA_3_1_8B
    per_tok = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 2)
    contexts = [512 * i for i in range(1, 65)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for card in (24, 80):
        seqs = [
            max_concurrent_seqs(card * GiB, weight_bytes(cfg, 2), kv_bytes_per_seq(per_tok, c))
            for c in contexts
        ]
        ax.plot(contexts, seqs, label=f"{card} GiB card")
    ax.set_xlabel("context length per sequence (tokens)")
    ax.set_ylabel("sequences that fit (bf16 KV)")
    ax.set_yscale("log")
    ax.set_title("Llama-3.1-8B, bf16 weights: the memory wall")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
