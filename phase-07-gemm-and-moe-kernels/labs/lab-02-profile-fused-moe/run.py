"""Lab 07-02 on a GPU: time your fused-MoE kernel, then profile a real MoE model in vLLM.

Not run by the tests. Needs a CUDA GPU, torch and triton; part 2 also needs
``vllm==0.22.1`` and the model's weights (downloaded from the Hugging Face Hub).

Part 1 times one MoE layer three ways on the GPU, with CUDA events, median of
``--iters`` runs after warm-up:

* a per-expert torch loop (gather the expert's tokens, two matmuls, a weighted
  ``index_add_``): the obvious code, one small launch chain per expert;
* your ``fused_experts_triton`` from ``solution.py`` (or ``starter.py`` with
  ``--impl starter``): two launches of your kernel;
* and checks that both agree with each other.

Part 2 serves a small MoE model with vLLM's engine profiler. The engine core
runs in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING`` defaults to 1), so
a ``torch.profiler`` context around ``llm.generate`` in this process would see
no model kernels; ``profiler_config`` plus ``llm.start_profile()`` /
``llm.stop_profile()`` make the worker write its own trace. The newest
``*.pt.trace.json.gz`` in the directory is then read with your
``kernel_shares``.

    python run.py --part kernel
    python run.py --part vllm --model ibm-granite/granite-3.1-1b-a400m-instruct
    python run.py --part vllm --model allenai/OLMoE-1B-7B-0924-Instruct   # ~14 GB bf16
    python run.py --trace /path/to/rank0.pt.trace.json.gz                  # parse only (CPU)

upstream: vllm/entrypoints/llm.py:786 start_profile
upstream: vllm/config/profiler.py:34 ProfilerConfig
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import pathlib
import statistics
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def load(impl: str):
    spec = importlib.util.spec_from_file_location(f"lab02_{impl}", HERE / f"{impl}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def per_expert_loop(x, w13, w2, topk_weights, topk_ids):
    """The obvious torch MoE: for each expert, gather its tokens, run it, add back."""
    import torch

    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for e in range(w13.shape[0]):
        tok, j = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x[tok] @ w13[e].T
        h = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = (h @ w2[e].T) * topk_weights[tok, j, None].to(x.dtype)
        out.index_add_(0, tok, y)
    return out


def time_ms(fn, iters: int) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def part_kernel(mod, args) -> None:
    import torch

    torch.manual_seed(0)
    E, H, inter, k = args.experts, args.hidden, args.inter, args.top_k
    dt = torch.float16
    w13 = (torch.randn(E, 2 * inter, H, device="cuda") / H ** 0.5).to(dt)
    w2 = (torch.randn(E, H, inter, device="cuda") / inter ** 0.5).to(dt)
    router = torch.randn(H, E, device="cuda")
    print(f"E={E} top_k={k} H={H} I={inter} float16 on {torch.cuda.get_device_name()}")
    print(f"{'tokens':>7} {'torch loop ms':>14} {'your kernel ms':>15} {'speed-up':>9} "
          f"{'max |diff|':>11}")
    for T in args.tokens:
        x = torch.randn(T, H, device="cuda").to(dt)
        probs = torch.softmax(x.float() @ router, dim=-1)
        tw, ti = torch.topk(probs, k, dim=-1)
        tw = tw / tw.sum(-1, keepdim=True)
        ref = per_expert_loop(x, w13, w2, tw, ti)
        got = mod.fused_experts_triton(x, w13, w2, tw, ti, block_m=args.block_m,
                                       block_n=64, block_k=32)
        diff = (ref.float() - got.float()).abs().max().item()
        inputs = (x, w13, w2, tw, ti)
        t_loop = time_ms(lambda a=inputs: per_expert_loop(*a), args.iters)
        t_kern = time_ms(lambda a=inputs: mod.fused_experts_triton(
            *a, block_m=args.block_m, block_n=64, block_k=32), args.iters)
        print(f"{T:>7} {t_loop:>14.3f} {t_kern:>15.3f} {t_loop / t_kern:>8.2f}x {diff:>11.2e}")
    print("(your launcher aligns on the CPU with numpy: at small T that host work, not the "
          "kernel, is most of its time)")


def part_vllm(mod, args) -> str:
    from vllm import LLM, SamplingParams

    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="lab02-trace-")
    llm = LLM(model=args.model, max_model_len=2048, gpu_memory_utilization=0.8,
              enforce_eager=args.eager,
              profiler_config={"profiler": "torch", "torch_profiler_dir": trace_dir})
    prompts = [f"Write two sentences about the number {i}." for i in range(args.prompts)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    llm.generate(prompts[:2], params)  # warm-up: compile and autotune outside the profile
    llm.start_profile()
    llm.generate(prompts, params)
    llm.stop_profile()
    del llm
    traces = sorted(glob.glob(os.path.join(trace_dir, "**", "*.pt.trace.json*"), recursive=True),
                    key=os.path.getmtime)
    if not traces:
        raise SystemExit(f"no trace written under {trace_dir}")
    return traces[-1]


def print_shares(mod, path: str) -> None:
    rows = mod.kernel_shares(mod.load_trace(path))
    print(f"trace: {path}")
    print(f"{'category':<12} {'kernels':>8} {'GPU ms':>9} {'share':>7}")
    for cat, n, us, share in rows:
        print(f"{cat:<12} {n:>8} {us / 1000:>9.2f} {share:>7.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["solution", "starter"], default="solution")
    p.add_argument("--part", choices=["kernel", "vllm", "both"], default="both")
    p.add_argument("--trace", help="only parse this trace file (works on a CPU)")
    p.add_argument("--model", default="ibm-granite/granite-3.1-1b-a400m-instruct")
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--block-m", type=int, default=16)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256, 2048])
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    mod = load(args.impl)
    if args.trace:
        print_shares(mod, args.trace)
        return
    if args.part in ("kernel", "both"):
        part_kernel(mod, args)
    if args.part in ("vllm", "both"):
        print_shares(mod, part_vllm(mod, args))


if __name__ == "__main__":
    main()
