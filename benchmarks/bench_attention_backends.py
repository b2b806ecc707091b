"""Every numpy attention backend on SmolLM2-135M: same tokens, rows read, time per step.

    python benchmarks/bench_attention_backends.py [--requests 8] [--max-tokens 8] [--repeats 3]

Runs the same greedy workload through ``LLMEngine("smollm2", attention_backend=...)``
for each numpy backend: ``--requests`` chat prompts (the golden ones, cycled), a
shared system prompt, one BLAS thread. Prints, per backend, the K/V rows read
(all layers, all steps, from ``StepStats.kv_rows_read``), the attention time
alone (the backend's ``forward`` calls, wrapped and timed) and the whole run,
best of ``--repeats``, and stops with an error if any backend's tokens differ
from ``NUMPY_GATHER``'s. Needs ``python -m mini_vllm download smollm2``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402

from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

BACKENDS = ("NUMPY_GATHER", "NUMPY_FLASH", "NUMPY_SPLIT_KV")
GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "mini_vllm/tests/golden/smollm2.json"


def run_once(model, name: str, prompts, params, block_size: int):
    engine = LLMEngine(model, block_size=block_size, num_blocks=512, attention_backend=name)
    backend = engine.model.attn_backend
    forward, spent = backend.forward, [0.0]

    def timed(*args):
        t0 = time.perf_counter()
        try:
            return forward(*args)
        finally:
            spent[0] += time.perf_counter() - t0

    backend.forward = timed
    t0 = time.perf_counter()
    reqs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    tokens = [list(r.output_token_ids) for r in reqs]
    return tokens, sum(s.kv_rows_read for s in engine.stats), spent[0], wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    for name in ("requests", "max_tokens", "repeats", "block_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    chat = json.loads(GOLDEN.read_text())["chat"]
    prompts = [{"prompt_token_ids": chat[i % len(chat)]["prompt_ids"]} for i in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    model = get_model("smollm2")
    print(f"SmolLM2-135M, {args.requests} requests x {args.max_tokens} tokens, block_size "
          f"{args.block_size}, 1 BLAS thread; {platform.processor() or platform.machine()}, "
          f"numpy {np.__version__}; best of {args.repeats}")
    print(f"{'backend':<16}{'rows read':>12}{'attention s':>13}{'run s':>8}  tokens")
    reference = None
    for name in BACKENDS:
        best = None
        for _ in range(args.repeats):
            tokens, rows, attn, wall = run_once(model, name, prompts, params, args.block_size)
            if best is None or wall < best[3]:
                best = (tokens, rows, attn, wall)
        tokens, rows, attn, wall = best
        reference = reference or tokens
        same = "same" if tokens == reference else "DIFFERENT"
        print(f"{name:<16}{rows:>12,}{attn:>13.3f}{wall:>8.3f}  {same}")
        if tokens != reference:
            raise SystemExit(f"{name} changed the greedy tokens: a backend bug")


if __name__ == "__main__":
    main()
