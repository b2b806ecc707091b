"""Lab 02-03 — from GPU memory to KV blocks to concurrency (your implementation).

vLLM decides its KV capacity once, at startup:

1. ``requested = ceil(total_gpu_memory * gpu_memory_utilization)``
   (upstream: vllm/v1/worker/utils.py:403 request_memory)
2. it profiles one worst-case forward pass and subtracts what is not KV:
   weights + peak activations + non-torch memory (+ the CUDA-graph estimate)
   (upstream: vllm/v1/worker/gpu_worker.py:358 Worker.determine_available_memory)
3. it divides what is left by the bytes of one block in one layer, then by the
   number of layers (upstream: vllm/v1/core/kv_cache_utils.py:935 get_num_blocks)
4. it logs ``GPU KV cache size`` and ``Maximum concurrency``
   (upstream: vllm/v1/core/kv_cache_utils.py:1709 _report_kv_cache_config)

This file is that arithmetic, for full-attention decoder models, plus the
prefix-cache hit rate to expect from N identical prompts and a parser for the
startup log lines. ``run.py`` reads the real numbers from a real engine.
"""
from __future__ import annotations

import math  # noqa: F401  (requested_memory rounds up with math.ceil)
import re
from dataclasses import dataclass

GiB = 1 << 30

# Fields from each model's published config.json (Hugging Face hub), trimmed to
# what sizes the KV cache. Qwen3 sets head_dim explicitly (128, not 1024 / 16).
MODEL_CONFIGS: dict[str, dict] = {
    "facebook/opt-125m": {
        "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
        "max_position_embeddings": 2048, "torch_dtype": "float16",
    },
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "hidden_size": 896, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-0.6B": {
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "hidden_size": 1024, "head_dim": 128, "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    },
    "meta-llama/Llama-3.1-8B-Instruct": {
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "hidden_size": 4096, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    },
}


@dataclass(frozen=True, slots=True)
class KVSpec:
    """What sizes one token's KV: layers x KV heads x head_dim x bytes per value."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2


def kv_spec_from_hf_config(config: dict, dtype_bytes: int = 2) -> KVSpec:
    """Read layers, KV heads and head_dim from a Hugging Face config dict.

    A missing or null ``num_key_value_heads`` means no GQA (as many KV heads as
    attention heads); a missing or null ``head_dim`` means ``hidden_size`` split
    evenly over the attention (query) heads. Returns a ``KVSpec`` carrying
    ``dtype_bytes``.

    Raises ValueError naming the key when ``num_hidden_layers`` or
    ``num_attention_heads`` is missing, and naming ``dtype_bytes`` unless it is
    1, 2 or 4.
    """
    raise NotImplementedError("kv_spec_from_hf_config: not implemented yet")


def kv_bytes_per_token(spec: KVSpec) -> int:
    """Bytes of KV cache one token occupies: its K and its V, in every layer."""
    raise NotImplementedError("kv_bytes_per_token: not implemented yet")


def page_size_bytes(spec: KVSpec, block_size: int) -> int:
    """Bytes of one block in ONE layer: K and V of ``block_size`` tokens.

    Upstream keeps one KV tensor per layer and sizes pages per layer, so there is
    no layer factor here. Raises ValueError naming ``block_size`` when it is < 1.
    """
    raise NotImplementedError("page_size_bytes: not implemented yet")


def requested_memory(total_bytes: int, gpu_memory_utilization: float) -> int:
    """The bytes of the card vLLM may use: ``total * utilization``, rounded up.

    Raises ValueError naming ``gpu_memory_utilization`` unless it is in (0, 1].
    """
    raise NotImplementedError("requested_memory: not implemented yet")


def available_kv_memory(
    total_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    peak_activation_bytes: int,
    non_torch_bytes: int = 0,
    cudagraph_bytes: int = 0,
) -> int:
    """The bytes left for KV blocks: the requested memory minus every non-KV cost
    (weights, peak activations, non-torch memory, the CUDA-graph estimate).

    Raises ValueError naming ``gpu_memory_utilization`` when nothing is left
    (zero bytes included): the fix is a higher utilization or a smaller model.
    """
    raise NotImplementedError("available_kv_memory: not implemented yet")


def num_gpu_blocks(available_bytes: int, spec: KVSpec, block_size: int) -> int:
    """How many whole blocks (each spanning every layer) fit in ``available_bytes``.

    Integer arithmetic as upstream's ``get_num_blocks``; never negative.
    """
    raise NotImplementedError("num_gpu_blocks: not implemented yet")


def max_concurrency(num_blocks: int, max_model_len: int, block_size: int) -> float:
    """How many requests of ``max_model_len`` tokens fit in ``num_blocks`` at once, as a
    float: blocks over the blocks one such request needs (a partial block counts whole).

    Raises ValueError naming ``max_model_len`` when it is < 1.
    """
    raise NotImplementedError("max_concurrency: not implemented yet")


def kv_cache_size_tokens(num_blocks: int, max_model_len: int, block_size: int) -> int:
    """The token count the startup log prints, computed as upstream does: the maximum
    concurrency times ``max_model_len``, truncated to an integer (not rounded, and not
    ``num_blocks * block_size``, which differs when ``max_model_len`` is not a multiple
    of ``block_size``)."""
    raise NotImplementedError("kv_cache_size_tokens: not implemented yet")


def startup_log_lines(num_blocks: int, max_model_len: int, block_size: int) -> list[str]:
    """The two lines upstream's ``_report_kv_cache_config`` logs, character for character:

    ``GPU KV cache size: 140,608 tokens`` and
    ``Maximum concurrency for 2,048 tokens per request: 68.66x`` (thousands separators,
    two decimals).
    """
    raise NotImplementedError("startup_log_lines: not implemented yet")


_LOG_PATTERNS = {
    "available_kv_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_model_len": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request"),
    "max_concurrency": re.compile(r"tokens per request: ([\d.]+)x"),
}


def parse_kv_log(text: str) -> dict[str, float]:
    """Pull the KV-capacity numbers out of a vLLM startup log.

    Returns a dict with a float for each key of ``_LOG_PATTERNS`` whose line appears
    anywhere in ``text`` (after a log prefix too), thousands separators removed;
    keys whose line is absent are left out.
    """
    raise NotImplementedError("parse_kv_log: not implemented yet")


def expected_prefix_hit_rate(prompt_len: int, num_requests: int, block_size: int) -> float:
    """Token hit rate when ``num_requests`` identical prompts arrive together.

    The first request computes everything. Each later one can reuse only full
    blocks, and never its last prompt token (it is always recomputed to get
    logits). vLLM counts hits and queries in tokens: the result is hit tokens over
    all prompt tokens of all requests, in [0, 1).

    Raises ValueError (naming them) when any argument is < 1.
    """
    raise NotImplementedError("expected_prefix_hit_rate: not implemented yet")


def capacity_report(
    model: str,
    total_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    peak_activation_bytes: int,
    non_torch_bytes: int = 0,
    cudagraph_bytes: int = 0,
    block_size: int = 16,
    max_model_len: int = 2048,
) -> dict[str, float | int]:
    """Every number of the startup ritual for one model from MODEL_CONFIGS."""
    spec = kv_spec_from_hf_config(MODEL_CONFIGS[model])
    available = available_kv_memory(total_bytes, gpu_memory_utilization, weights_bytes,
                                    peak_activation_bytes, non_torch_bytes, cudagraph_bytes)
    blocks = num_gpu_blocks(available, spec, block_size)
    return {
        "kv_bytes_per_token": kv_bytes_per_token(spec),
        "block_bytes_all_layers": page_size_bytes(spec, block_size) * spec.num_layers,
        "available_kv_bytes": available,
        "num_gpu_blocks": blocks,
        "kv_cache_tokens": kv_cache_size_tokens(blocks, max_model_len, block_size),
        "max_concurrency": max_concurrency(blocks, max_model_len, block_size),
    }


if __name__ == "__main__":
    for name, cfg in MODEL_CONFIGS.items():
        print(f"{name:34s} {kv_bytes_per_token(kv_spec_from_hf_config(cfg)):>8,} bytes of KV per token")
    for util in (0.5, 0.9):
        r = capacity_report("facebook/opt-125m", 24 * GiB, util, GiB // 4, GiB,
                            non_torch_bytes=GiB // 4, cudagraph_bytes=GiB // 2)
        print(f"util={util}: {r['num_gpu_blocks']:,} blocks; "
              + "; ".join(startup_log_lines(r["num_gpu_blocks"], 2048, 16)))
    for n in (6, 200):
        print(f"8 identical {n}-token prompts -> expected hit rate "
              f"{expected_prefix_hit_rate(n, 8, 16):.1%}")
