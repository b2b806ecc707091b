"""Lab 05-04 — the GPU run: eager against CUDA graphs, on mini_vllm and on real vLLM.

    python run.py                       # mini_vllm at batch 1, 8, 64; then vLLM if it imports
    python run.py --batches 1,8 --steps 16 --skip-vllm
    LAB_IMPL=starter python run.py      # your parsers and predictions instead of the reference

Part 1 times mini_vllm's SmolLM2-shaped torch model eager and with piecewise
CUDA graphs, through ``compare_mini_vllm`` (which reuses
``benchmarks/bench_cuda_graphs.py``). Part 2, only where ``import vllm``
works, runs ``facebook/opt-125m`` with ``enforce_eager=True`` and ``False``,
each in a child process whose log it reads with your ``parse_capture_bar`` /
``parse_capture_finished`` and compares with your ``expected_capture_bars``.
Without CUDA it prints what it would do and exits 0. Never run in CI; the
``gpu`` test in test_lab.py runs a short part 1.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = next(p for p in HERE.parents if (p / "course").is_dir() and (p / "mini_vllm").is_dir())
sys.path.insert(0, str(ROOT))  # `course`, `mini_vllm` and `benchmarks`

from course import load_impl  # noqa: E402

VLLM_MODEL = "facebook/opt-125m"
PROMPT = "The meaning of life is"


def vllm_child(enforce_eager: bool, batches: list[int], max_tokens: int) -> None:
    """Runs in a child process: one LLM, every batch size, one JSON line of results at the end."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=VLLM_MODEL, enforce_eager=enforce_eager, gpu_memory_utilization=0.5)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    results = {}
    for batch in batches:
        llm.generate([PROMPT] * batch, params, use_tqdm=False)  # warm-up at this size
        t0 = time.perf_counter()
        outs = llm.generate([PROMPT] * batch, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        results[batch] = {"tok_s": tokens / seconds, "tokens": [list(o.outputs[0].token_ids) for o in outs]}
    print("RESULT " + json.dumps(results), flush=True)


def run_vllm(impl, batches: list[int], max_tokens: int) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    limits = impl.llm_batch_defaults(props.total_memory / 2**30, props.name)
    print(f"\nvLLM {VLLM_MODEL}: LLM defaults on this card -> max_num_seqs={limits[0]}, "
          f"max_num_batched_tokens={limits[1]}")
    for bar in impl.expected_capture_bars(*limits):
        print(f"  predicted bar: {impl.CAPTURE_DESC_FORMAT.format(bar.kind, bar.mode)}: {bar.total}/{bar.total}")
    tok_s = {}
    for eager in (True, False):
        cmd = [sys.executable, __file__, "--vllm-child", "eager" if eager else "graphs",
               "--batches", ",".join(map(str, batches)), "--max-tokens", str(max_tokens)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, NO_COLOR="1"))
        log = proc.stdout + proc.stderr
        print(f"  enforce_eager={eager}: exit {proc.returncode}")
        for line in log.splitlines():
            bar = impl.parse_capture_bar(line)
            if bar is not None:
                print(f"    parsed bar: ({bar.kind}, {bar.mode}) {bar.done}/{bar.total}")
            done = impl.parse_capture_finished(line)
            if done is not None:
                print(f"    parsed summary: {done.seconds:.0f} s, {done.gib:.2f} GiB")
        result = next((json.loads(s[7:]) for s in log.splitlines() if s.startswith("RESULT ")), None)
        if result is None:
            print("    no result; the log ends with:\n" + "\n".join(log.splitlines()[-15:]))
            return
        tok_s[eager] = result
    print(f"  {'batch':>5} {'eager tok/s':>12} {'graphs tok/s':>13} {'ratio':>6}  same tokens")
    for batch in batches:
        e, g = tok_s[True][str(batch)], tok_s[False][str(batch)]
        print(f"  {batch:>5} {e['tok_s']:>12.1f} {g['tok_s']:>13.1f} {g['tok_s'] / e['tok_s']:>5.2f}x"
              f"  {'yes' if e['tokens'] == g['tokens'] else 'no'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=32, help="timed mini_vllm decode steps per batch")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per vLLM request")
    parser.add_argument("--skip-vllm", action="store_true", help="run part 1 only")
    parser.add_argument("--vllm-child", choices=["eager", "graphs"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.vllm_child:
        vllm_child(args.vllm_child == "eager", batches, args.max_tokens)
        return 0

    impl = load_impl(__file__)
    import importlib.util

    import torch

    has_vllm = importlib.util.find_spec("vllm") is not None
    if not torch.cuda.is_available():
        print("No CUDA device: nothing to measure here. On a GPU this script would:")
        print(f"  1. time mini_vllm decode steps (SmolLM2-shaped, float32) eager and with piecewise "
              f"CUDA graphs at batch {args.batches}, median of {args.steps} steps, and check the tokens;")
        print(f"  2. {'run' if has_vllm else 'skip (vllm is not importable here)'} {VLLM_MODEL} with "
              f"enforce_eager=True/False, {args.max_tokens} tokens per request, and parse its capture log.")
        for name, mem in (("NVIDIA L4", 22.0), ("NVIDIA H100 80GB HBM3", 79.2)):
            bars = impl.expected_capture_bars(*impl.llm_batch_defaults(mem, name))
            print(f"  predicted vLLM bars on {name}: "
                  + "; ".join(f"({b.kind}, {b.mode}) {b.total}" for b in bars))
        return 0

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; mini_vllm SmolLM2-shaped random "
          f"weights, float32; median of {args.steps} decode steps")
    print(f"{'batch':>5} {'eager':>11} {'graphs':>11} {'eager/graphs':>13}  same tokens")
    for row in impl.compare_mini_vllm(batches, args.steps):
        print(f"{row.batch:>5} {row.eager_ms:>8.2f} ms {row.graphs_ms:>8.2f} ms {row.speedup:>12.2f}x"
              f"  {'yes' if row.same_tokens else 'NO'} ({row.graphs_mode})")
    if args.skip_vllm:
        return 0
    if not has_vllm:
        print(f"\nvllm is not importable here: skipping {VLLM_MODEL} (pip install -e '.[vllm]').")
        return 0
    run_vllm(impl, batches, args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
