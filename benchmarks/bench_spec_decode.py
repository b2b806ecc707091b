"""N-gram speculative decoding on SmolLM2-135M in mini_vllm: steps, acceptance, time.

    python -m mini_vllm download smollm2        # once
    python benchmarks/bench_spec_decode.py      # about two minutes here

Five chat prompts, greedy, 48 tokens at most (EOS ends a request): two that ask the model to
repeat itself (the friendly case: the answer copies its context), a small piece of code, a list
of numbers, and one open question.
For each ``speculative_config`` the script prints the engine steps, the draft acceptance rate
(accepted / drafted), the mean acceptance length (1 + accepted / drafts, the bonus token
counted, as vLLM logs it) and the wall time, and checks that the tokens equal the run without
speculation. One BLAS thread, numpy backend, best of 2 runs for the time.
"""
from __future__ import annotations

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

PROMPTS = {
    "repeat": "Repeat this text exactly: The quick brown fox jumps over the lazy dog. "
              "The quick brown fox jumps over the lazy dog.",
    "repeat-word": "Write the word 'hello' ten times.",
    "code": "Write a Python function add(a, b) that returns a + b, then call it three times with "
            "different numbers.",
    "list": "List the numbers from 1 to 20, separated by commas.",
    "open": "Write two sentences about why the sky is blue.",
}
CONFIGS = [
    ("off", None),
    ("ngram k=3 n=[1,3]", {"method": "ngram", "num_speculative_tokens": 3,
                           "prompt_lookup_min": 1, "prompt_lookup_max": 3}),
    ("ngram k=5 n=[2,4]", {"method": "ngram", "num_speculative_tokens": 5,
                           "prompt_lookup_min": 2, "prompt_lookup_max": 4}),
    ("ngram k=5 n=5", {"method": "ngram", "num_speculative_tokens": 5}),  # vLLM's default n
]


def run(model, prompt_ids: list[int], config: dict | None) -> tuple[list[int], LLMEngine, float]:
    params = SamplingParams(temperature=0.0, max_tokens=48)
    best, result = float("inf"), None
    for _ in range(2):
        engine = LLMEngine(model, block_size=16, num_blocks=64, speculative_config=config)
        start = time.perf_counter()
        out = engine.generate([{"prompt_token_ids": prompt_ids}], params)[0]
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, result = elapsed, (list(out.output_token_ids), engine)
    return result[0], result[1], best


def main() -> None:
    with threadpoolctl.threadpool_limits(1, "blas"):
        model = get_model("smollm2")
        tok = model.tokenizer
        print(f"SmolLM2-135M-Instruct, numpy backend, 1 BLAS thread; {platform.processor() or '?'} "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}")
        for name, text in PROMPTS.items():
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True)
            print(f"\nprompt {name!r} ({len(ids)} tokens)")
            print(f"{'speculative_config':<20} {'tokens':>6} {'steps':>5} {'acc. rate':>10} "
                  f"{'mean len':>8} {'time s':>7}")
            reference = None
            for label, config in CONFIGS:
                tokens, engine, seconds = run(model, ids, config)
                if reference is None:
                    reference = tokens
                assert tokens == reference, f"{label}: greedy tokens differ from the plain run"
                stats = engine.spec_decoding_stats
                rate = "-" if stats is None or not stats.num_draft_tokens else \
                    f"{100 * stats.draft_acceptance_rate:.1f}%"
                mean = "-" if stats is None or not stats.num_drafts else \
                    f"{stats.mean_acceptance_length:.2f}"
                print(f"{label:<20} {len(tokens):>6} {engine.num_steps:>5} {rate:>10} {mean:>8} "
                      f"{seconds:>7.2f}")
            print("text:", repr(tok.decode(reference)))


if __name__ == "__main__":
    main()
