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

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (no GQA);
    ``head_dim`` defaults to ``hidden_size // num_attention_heads``.

    Recipe:
      1. Read ``num_hidden_layers`` and ``num_attention_heads``; a missing key is a
         ValueError whose message names the key.
      2. ``num_key_value_heads`` if present and truthy, else the attention heads.
      3. ``head_dim`` if present and truthy, else ``hidden_size // heads``.
      4. ValueError naming ``dtype_bytes`` unless it is 1, 2 or 4.
    """
    raise NotImplementedError("kv_spec_from_hf_config: not implemented yet")


def kv_bytes_per_token(spec: KVSpec) -> int:
    """K and V, every layer: 2 * layers * kv_heads * head_dim * dtype_bytes.

    Recipe: one line; multiply the four fields of ``spec`` by 2 (K and V).
    """
    raise NotImplementedError("kv_bytes_per_token: not implemented yet")


def page_size_bytes(spec: KVSpec, block_size: int) -> int:
    """Bytes of one block in ONE layer (upstream's per-layer page size).

    Recipe: ValueError naming ``block_size`` if it is < 1; else
    ``2 * block_size * num_kv_heads * head_dim * dtype_bytes`` (no layer factor:
    upstream keeps one tensor per layer and sizes pages per layer).
    """
    raise NotImplementedError("page_size_bytes: not implemented yet")


def requested_memory(total_bytes: int, gpu_memory_utilization: float) -> int:
    """The share of the card vLLM may use: ceil(total * utilization).

    Recipe: ValueError naming ``gpu_memory_utilization`` unless ``0 < u <= 1``;
    then ``math.ceil(total_bytes * u)``.
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
    """Requested memory minus everything that is not KV cache.

    Raises ValueError (naming gpu_memory_utilization) when nothing is left.

    Recipe: ``requested_memory(...)`` minus weights, peak activations and
    non-torch bytes, minus the CUDA-graph estimate. If the result is <= 0, raise
    ValueError and say to raise ``gpu_memory_utilization`` (name it).
    """
    raise NotImplementedError("available_kv_memory: not implemented yet")


def num_gpu_blocks(available_bytes: int, spec: KVSpec, block_size: int) -> int:
    """available // page_size // num_layers, as upstream's get_num_blocks.

    Recipe: ``available_bytes // page_size_bytes(spec, block_size) // spec.num_layers``,
    floored at 0. Two integer divisions, in that order, as upstream does.
    """
    raise NotImplementedError("num_gpu_blocks: not implemented yet")


def max_concurrency(num_blocks: int, max_model_len: int, block_size: int) -> float:
    """How many max-length requests fit at once: blocks / cdiv(max_model_len, block_size).

    Recipe: ValueError naming ``max_model_len`` if it is < 1; blocks per max-length
    request is ``cdiv(max_model_len, block_size)`` (write ``-(-a // b)``); return
    ``num_blocks`` divided by that, as a float.
    """
    raise NotImplementedError("max_concurrency: not implemented yet")


def kv_cache_size_tokens(num_blocks: int, max_model_len: int, block_size: int) -> int:
    """The token count the startup log prints: int(max_concurrency * max_model_len).

    Recipe: ``int(max_concurrency(...) * max_model_len)``.
    """
    raise NotImplementedError("kv_cache_size_tokens: not implemented yet")


def startup_log_lines(num_blocks: int, max_model_len: int, block_size: int) -> list[str]:
    """The two lines _report_kv_cache_config logs, with upstream's format strings.

    Recipe: format the two lines with upstream's format strings:
    ``"GPU KV cache size: %s tokens" % f"{tokens:,}"`` and
    ``"Maximum concurrency for %s tokens per request: %.2fx" % (f"{max_model_len:,}", conc)``.
    """
    raise NotImplementedError("startup_log_lines: not implemented yet")


_LOG_PATTERNS = {
    "available_kv_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_model_len": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request"),
    "max_concurrency": re.compile(r"tokens per request: ([\d.]+)x"),
}


def parse_kv_log(text: str) -> dict[str, float]:
    """Pull the KV-capacity numbers out of a vLLM startup log (any lines it finds).

    Recipe: for each ``(key, pattern)`` in ``_LOG_PATTERNS``, ``pattern.search(text)``;
    on a match store ``float(group(1))`` with the thousands commas removed.
    Keys that do not match are left out.
    """
    raise NotImplementedError("parse_kv_log: not implemented yet")


def expected_prefix_hit_rate(prompt_len: int, num_requests: int, block_size: int) -> float:
    """Token hit rate when ``num_requests`` identical prompts arrive together.

    The first request computes everything. Each later one can reuse only full
    blocks, and at most ``prompt_len - 1`` tokens (the last token is always
    recomputed to get logits), so it hits ``block_size * ((prompt_len - 1) //
    block_size)`` tokens. vLLM counts hits and queries in tokens.

    Recipe:
      1. ValueError if any argument is < 1.
      2. Each request after the first hits ``block_size * ((prompt_len - 1) // block_size)``
         tokens; the first hits none.
      3. Return total hits / total queried tokens (``num_requests * prompt_len``).
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
