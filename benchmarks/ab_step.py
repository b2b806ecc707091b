"""Before/after: one SmolLM2-shaped forward step with the model code of a git revision vs now.

    python benchmarks/ab_step.py --before 6b0700c

Loads ``mini_vllm/models/llama.py`` and ``attention.py`` as they were at
``--before`` (read with ``git show``) next to the working tree's, builds both
models on the same seeded random weights of SmolLM2-135M's shape, and times a
prefill step (16 prompts of 37-45 tokens, like the chat benchmark) and a
decode step (16 requests at 100-110 tokens of context), alternating old and
new. CPU time of this process (``time.process_time``), best of ``--repeats``:
on a shared machine that moves less than wall time. Both must give the same
greedy tokens and logits within 1e-5 of their largest magnitude, or the script stops.
"""
from __future__ import annotations

import argparse
import os

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--before", required=True, help="git revision of the old model code")
ap.add_argument("--repeats", type=int, default=5)
ARGS = ap.parse_args()
if ARGS.repeats < 1:
    ap.error(f"--repeats must be >= 1, got {ARGS.repeats}")
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import importlib.util  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import mini_vllm.models.llama as new_llama  # noqa: E402
from mini_vllm.models.config import ModelConfig  # noqa: E402
from mini_vllm.models.runner import Chunk, make_model_input  # noqa: E402


def old_module(name: str, path: str, tmp: str):
    source = subprocess.run(["git", "show", f"{ARGS.before}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    file = os.path.join(tmp, name + ".py")
    with open(file, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="ab_step_")
    old_attention = old_module("old_attention", "mini_vllm/models/attention.py", tmp)
    old_llama = old_module("old_llama", "mini_vllm/models/llama.py", tmp)
    # The old llama.py imported attention from the package (today's); point it at the old one.
    old_llama.paged_attention = old_attention.paged_attention
    old_llama.write_kv = old_attention.write_kv

    cfg = ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576,
                      intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e5,
                      max_position_embeddings=8192, tie_word_embeddings=True)
    weights = new_llama.random_weights(cfg, seed=0)
    models = {"before": old_llama.LlamaForCausalLM(cfg, weights),
              "after": new_llama.LlamaForCausalLM(cfg, weights)}
    rng = np.random.default_rng(0)
    lens = rng.integers(37, 46, 16)
    tables = [list(range(1 + 8 * i, 1 + 8 * (i + 1))) for i in range(16)]
    prefill = make_model_input([Chunk(rng.integers(3, 49152, int(n)).tolist(), 0, tables[i])
                                for i, n in enumerate(lens)], 16)
    decode = make_model_input([Chunk([7], int(n) + 64, tables[i])
                               for i, n in enumerate(lens)], 16)
    for m in models.values():
        m.init_kv_cache(16 * 8 + 1, 16)
    # The decode step reads 100+ tokens of context per request: the same random K/V for both.
    context = rng.standard_normal(models["after"].kv_cache.shape, dtype=np.float32)
    for m in models.values():
        m.kv_cache[:] = context

    print(f"before = {ARGS.before} (git), after = the working tree; CPU time per step, "
          f"best of {ARGS.repeats}, 1 BLAS thread\n")
    print("| step | before ms | after ms | speedup |")
    print("|---|---|---|---|")
    for label, mi in ((f"prefill, {prefill.num_tokens} tokens of 16 prompts", prefill),
                      ("decode, 16 requests", decode)):
        best = {k: float("inf") for k in models}
        logits = {}
        for _ in range(ARGS.repeats):
            for name, m in models.items():  # alternate old and new
                t = time.process_time()
                logits[name] = m.execute(mi)
                best[name] = min(best[name], time.process_time() - t)
        # Same math, different float32 rounding (silu is written another way): the
        # logits agree to ~1e-6 of their scale and pick the same greedy tokens.
        scale = np.abs(logits["before"]).max()
        np.testing.assert_allclose(logits["after"], logits["before"], atol=1e-5 * scale, rtol=0)
        assert (logits["after"].argmax(-1) == logits["before"].argmax(-1)).all()
        print(f"| {label} | {best['before'] * 1e3:.1f} | {best['after'] * 1e3:.1f} "
              f"| {best['before'] / best['after']:.2f}x |")


if __name__ == "__main__":
    main()
