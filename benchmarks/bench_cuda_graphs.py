"""Decode steps of a SmolLM2-shaped model on a GPU: eager vs compiled vs piecewise CUDA graphs.

    python benchmarks/bench_cuda_graphs.py [--batches 1,8,64] [--steps 32]

mini_vllm's torch model with SmolLM2-135M's shape (30 layers, hidden 576, 9
query heads over 3 KV heads, vocab 49152) and seeded random weights (the real
weights need not travel to a GPU machine: the launch count, not the values,
decides what graphs save). For each batch size it prefills that many requests
(48-token prompts), then times ``--steps`` decode steps through ``LLMEngine``
three ways: eager, ``{"mode": "VLLM_COMPILE"}`` and
``{"mode": "VLLM_COMPILE", "cudagraph_mode": "PIECEWISE"}``. It prints ms per
decode step (median) and checks that all three produced the same greedy
tokens. Needs a CUDA GPU; on a CPU it says so and exits.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def build(device: str):
    from mini_vllm.models.config import ModelConfig
    from mini_vllm.models.llama import LlamaForCausalLM, random_weights
    from mini_vllm.models.torch_backend import TorchLlamaForCausalLM
    from mini_vllm.tokenizer import ByteTokenizer

    cfg = ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                      rms_norm_eps=1e-5, rope_theta=1e5, max_position_embeddings=8192,
                      tie_word_embeddings=True, eos_token_ids=(0,))
    ref = LlamaForCausalLM(cfg, random_weights(cfg, seed=0), tokenizer=ByteTokenizer(), name="smollm2-shaped")
    return TorchLlamaForCausalLM.from_numpy(ref, device)


def measure(config, batch: int, steps: int, device: str):
    import torch

    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    engine = LLMEngine(build(device), block_size=16, num_blocks=batch * 8 + 8, max_num_seqs=max(batch, 1),
                       max_num_batched_tokens=max(64 * batch, 512), compilation_config=config)
    rng = np.random.default_rng(0)
    for _ in range(batch):
        engine.add_request({"prompt_token_ids": rng.integers(1, 49152, 48).tolist()},
                           SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True))
    engine.step()  # the prefills
    for _ in range(3):  # warm-up decodes: compilation and capture happen here
        engine.step()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tokens = [list(r.output_token_ids) for r in engine.scheduler.running]
    return statistics.median(times) * 1e3, tokens, engine.stats[-1].cudagraph_mode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (torch.cuda.is_available() is False)")
    batches = [int(b) for b in args.batches.split(",")]
    configs = {"eager": None, "compiled": {"mode": "VLLM_COMPILE"},
               "piecewise graphs": {"mode": "VLLM_COMPILE", "cudagraph_mode": "PIECEWISE"}}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; SmolLM2-shaped random weights, "
          f"float32, TORCH_GATHER attention; median of {args.steps} decode steps")
    print(f"{'batch':>5} " + " ".join(f"{name:>18}" for name in configs) + "  graphs/eager  same tokens")
    for batch in batches:
        results = {name: measure(cfg, batch, args.steps, "cuda") for name, cfg in configs.items()}
        ms = [results[name][0] for name in configs]
        same = all(results[name][1] == results["eager"][1] for name in configs)
        print(f"{batch:>5} " + " ".join(f"{m:>15.2f} ms" for m in ms)
              + f"  {ms[2] / ms[0]:>11.2f}x  {'yes' if same else 'NO'}  ({results['piecewise graphs'][2]})")


if __name__ == "__main__":
    main()
