"""Quantized SmolLM2-135M in mini_vllm: weight bytes, quality against float32, decode speed.

    python -m mini_vllm download smollm2        # once
    python benchmarks/bench_quantization.py     # about two minutes here

One row per method of ``mini_vllm.quantization.quality.METHODS``:

- **linear bytes**: what the 120 linear layers store (codes + scales), from
  ``model.linear_weight_bytes()``; the embedding (tied LM head) stays float32
  in every row and is reported once.
- **KL / top-1**: teacher-forced logits at all 44 positions of ``EVAL_TEXT``
  against the float32 model's (``compare_logits``: mean and max KL in nats,
  the fraction of positions with the same argmax). ``test_quantization.py``
  recomputes these and holds them to the printed values.
- **greedy**: the 4 golden chat prompts of ``mini_vllm/tests/golden/smollm2.json``,
  16 greedy tokens each: how many of the 64 tokens equal the float32 run's, and
  how many of the 4 answers are identical.
- **KV B/token**: bytes of K and V per cached token, all 30 layers.
- **decode tok/s**: 8 chat prompts, 32 tokens each, ``max_num_seqs=8``, one
  BLAS thread, best of 2 runs (generated tokens / wall time, prefill included).

The "float32" reference is SmolLM2's shipped Q4_1 GGUF dequantized: there is
no higher-precision original on this machine, so every row re-quantizes
weights that were already 4-bit once; the 4-bit rows pay for that.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time

import numpy as np
import threadpoolctl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from mini_vllm import LLMEngine, SamplingParams  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.quantization import make_quant_config  # noqa: E402
from mini_vllm.quantization.quality import EVAL_TEXT, METHODS, compare_logits, prefill_logits  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "mini_vllm/tests/golden/smollm2.json"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [list(r.output_token_ids) for r in engine.generate([{"prompt_token_ids": p} for p in prompts],
                                                              params)]


def main() -> None:
    golden = json.loads(GOLDEN.read_text())
    chat = [c["prompt_ids"] for c in golden["chat"]]
    speed_prompts = (chat * 2)[:8]
    with threadpoolctl.threadpool_limits(1, "blas"):
        base = get_model("smollm2")
        ids = base.tokenizer.encode(EVAL_TEXT)
        ref_logits = prefill_logits(base, ids)
        embed_bytes = base.weights.embed_tokens.nbytes
        print(f"# {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"numpy {np.__version__}, 1 BLAS thread")
        print(f"# EVAL_TEXT: {len(ids)} tokens; embedding (tied LM head, float32 in every row): "
              f"{embed_bytes:,} B")
        print()
        print("| method | linear bytes | vs float32 | KL mean | KL max | top-1 | greedy tokens | "
              "same answers | KV B/token | decode tok/s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        ref_greedy = None
        for label, quantization, options, kv_dtype in METHODS:
            model = base if quantization is None else base.quantized(make_quant_config(quantization, options))
            q = compare_logits(ref_logits, prefill_logits(model, ids, kv_cache_dtype=kv_dtype))
            engine_kw = dict(quantization=quantization, quantization_config=options, kv_cache_dtype=kv_dtype)
            engine = LLMEngine("smollm2", max_num_seqs=8, num_blocks=128, **engine_kw)
            tokens = greedy(engine, chat, 16)
            if ref_greedy is None:
                ref_greedy = tokens
            same_tokens = sum(a == b for t, r in zip(tokens, ref_greedy, strict=True) for a, b in zip(t, r, strict=True))
            same_answers = sum(t == r for t, r in zip(tokens, ref_greedy, strict=True))
            best = float("inf")
            for _ in range(2):
                engine = LLMEngine("smollm2", max_num_seqs=8, num_blocks=128, **engine_kw)
                start = time.perf_counter()
                out = greedy(engine, speed_prompts, 32)
                best = min(best, time.perf_counter() - start)
            tps = sum(map(len, out)) / best
            kv_per_token = engine.model.kv_cache_bytes // (128 * engine.kv_cache_manager.block_size)
            nbytes = model.linear_weight_bytes()
            print(f"| {label} | {nbytes:,} | {nbytes / base.linear_weight_bytes():.3f} | {q['kl']:.2e} | "
                  f"{q['kl_max']:.2e} | {q['top1']:.3f} | {same_tokens}/64 | {same_answers}/4 | {kv_per_token:,} | {tps:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
