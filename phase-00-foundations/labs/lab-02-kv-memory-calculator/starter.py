"""Lab 00-02 — the KV-cache memory calculator (starter: your work).

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
    """Bytes of KV cache one token occupies, summed over all layers.

    Both K and V are stored, for every layer and every KV head (under GQA several
    query heads share one KV head, so only the KV heads count). Returns an ``int``;
    ``dtype_bytes`` may be fractional (0.5 for a 4-bit cache) and the product is
    truncated only at the end. Llama-3.1-8B in bf16: 131,072.
    Errors: any argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("kv_bytes_per_token: your turn (see the docstring)")


def kv_bytes_per_seq(bytes_per_token: int, seq_len: int) -> int:
    """Bytes of KV cache one sequence of ``seq_len`` tokens occupies.

    Errors: either argument not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("kv_bytes_per_seq: your turn (see the docstring)")


def num_params(cfg: ModelConfig) -> int:
    """Parameter count of a Llama-style model, from its config alone.

    Counts, per layer, the four attention projections (Q and O sized by the
    query heads, K and V by the KV heads), the three MLP matrices and the two
    norm vectors; once, the embedding table, the LM head (absent when
    ``tie_word_embeddings``: it reuses the embedding) and the final norm.
    No biases. Llama-3.1-8B gives 8,030,261,248.
    """
    raise NotImplementedError("num_params: your turn (see the docstring)")


def weight_bytes(cfg: ModelConfig, dtype_bytes: float) -> int:
    """Bytes of weights at ``dtype_bytes`` per parameter (2 for bf16, 1 for fp8, 0.5 for int4).

    Returns an ``int``, truncated only after multiplying.
    Errors: ``dtype_bytes`` not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("weight_bytes: your turn (see the docstring)")


def max_concurrent_seqs(
    gpu_bytes: int,
    weights: int,
    seq_bytes: int,
    gpu_memory_utilization: float = 1.0,
) -> int:
    """Whole sequences of ``seq_bytes`` that fit in what the weights leave free.

    The engine may use ``gpu_memory_utilization`` of the card; the weights come
    off that budget first; what remains holds whole sequences only (an ``int``,
    rounded down). Weights that do not fit the budget give 0, never a negative count.
    Errors (ValueError naming the parameter): ``gpu_bytes`` or ``seq_bytes`` not
    > 0, ``weights`` < 0, ``gpu_memory_utilization`` outside (0, 1].
    """
    raise NotImplementedError("max_concurrent_seqs: your turn (see the docstring)")


def num_kv_blocks(kv_budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """Whole blocks of ``block_size`` token slots that fit in ``kv_budget_bytes``.

    Returns an ``int`` (a partial block is no block).
    Errors (ValueError naming the parameter): ``bytes_per_token`` or
    ``block_size`` not > 0, ``kv_budget_bytes`` < 0.
    """
    raise NotImplementedError("num_kv_blocks: your turn (see the docstring)")


def max_concurrency(num_blocks: int, block_size: int, max_model_len: int) -> float:
    """vLLM's "Maximum concurrency" figure: pool blocks / blocks one max-length request needs.

    A request of ``max_model_len`` tokens occupies whole blocks, so a partly
    filled last block counts as a block. Returns a float: 8788 blocks of 16 for
    2,048 tokens gives 68.65625.
    Errors (ValueError naming the parameter): ``block_size`` or ``max_model_len``
    not > 0, ``num_blocks`` < 0.
    """
    raise NotImplementedError("max_concurrency: your turn (see the docstring)")


def concurrency_log_line(max_model_len: int, concurrency: float) -> str:
    """The startup line vLLM prints, in its exact format.

    The token count with thousands separators, the concurrency with two decimals
    and an "x": "Maximum concurrency for 2,048 tokens per request: 68.66x".
    """
    raise NotImplementedError("concurrency_log_line: your turn (see the docstring)")


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
