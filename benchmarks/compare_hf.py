"""mini_vllm's continuous batching vs transformers.generate on one CPU, same weights.

    python benchmarks/compare_hf.py                # the full run (about 2-4 minutes)
    python benchmarks/compare_hf.py --quick        # 16 requests, 1 repeat: a smoke test

The workload is seeded and offline: N requests (default 64) with prompt
lengths uniform in [16, 256] and output lengths uniform in [32, 128], random
token ids, greedy decoding, EOS ignored so both sides produce exactly the
requested tokens. The model is ``tiny-random`` (2 layers, hidden 64, 4 query
heads on 2 KV heads, vocab 257), saved as a safetensors folder that both
mini_vllm and transformers load: the same weights on both sides.

- mini_vllm: ``LLMEngine`` with continuous batching at several
  ``max_num_seqs`` (block_size 16, chunked prefill with a 2048-token budget).
- transformers: ``model.generate`` on static batches, prompts left-padded to
  the longest in the batch; a batch runs until its longest output is done,
  so shorter requests' extra tokens are wasted work (only requested tokens
  count as output).

Reported: output tokens per second (requested tokens / wall time; best of
``--repeats`` rounds, the median alongside, because this machine is shared;
each round runs every configuration once),
peak KV memory (mini_vllm: most blocks in use at once x bytes per block;
transformers: the largest KV cache a batch built, read from its tensors),
and where mini_vllm's step time goes. Both sides run with one compute thread
(numpy's BLAS and torch), set before either library is imported.

Everything printed is measured by this script; BENCHMARKS.md pastes its output.
"""
from __future__ import annotations

import argparse
import os
import sys


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5, help="rounds; each runs every configuration once")
    p.add_argument("--threads", type=int, default=1, help="BLAS / torch threads for both sides")
    p.add_argument("--mini-batch-sizes", default="1,4,16,64", help="max_num_seqs values")
    p.add_argument("--hf-batch-sizes", default="8,16,64", help="static batch sizes")
    p.add_argument("--quick", action="store_true", help="16 requests, 1 repeat, small sweeps")
    args = p.parse_args()
    if args.quick:
        args.num_requests, args.repeats = 16, 1
        args.mini_batch_sizes, args.hf_batch_sizes = "4,16", "16"
    for name in ("num_requests", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


ARGS = _parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)  # before numpy / torch load their thread pools

import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import mini_vllm.engine as engine_mod  # noqa: E402
import mini_vllm.models.llama as llama_mod  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.models.loader import save_checkpoint  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

BLOCK_SIZE = 16


def workload(n: int, seed: int):
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(16, 257, n)
    output_lens = rng.integers(32, 129, n)
    prompts = [rng.integers(0, 256, int(p)).tolist() for p in prompt_lens]
    return prompts, [int(o) for o in output_lens]


def hardware() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import transformers

    return {
        "cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(),
        "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": ARGS.threads,
    }


def load_avg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ---- mini_vllm --------------------------------------------------------------------------


def run_mini(folder: str, prompts, outs, max_num_seqs: int):
    model = get_model(folder)
    need = sum(-(-(len(p) + o) // BLOCK_SIZE) for p, o in zip(prompts, outs, strict=True))
    engine = LLMEngine(model=model, block_size=BLOCK_SIZE, num_blocks=need + 1,
                       max_num_batched_tokens=2048, max_num_seqs=max_num_seqs)
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
    t0 = time.perf_counter()
    reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
    wall = time.perf_counter() - t0
    tokens = [list(r.output_token_ids) for r in reqs]
    assert [len(t) for t in tokens] == outs
    peak_blocks = max(s.blocks_used for s in engine.stats)
    block_bytes = BLOCK_SIZE * model.config.kv_bytes_per_token()
    return {"wall": wall, "steps": len(engine.stats), "peak_kv": peak_blocks * block_bytes,
            "pool_kv": model.kv_cache_bytes, "tokens": tokens}


def profile_mini(folder: str, prompts, outs, max_num_seqs: int) -> dict[str, float]:
    """Wall time per engine phase (seconds, summed over the run), by wrapping the calls."""
    acc: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    saved = (engine_mod.prepare_inputs, llama_mod.paged_attention)
    engine_mod.prepare_inputs = timed("prepare_inputs", saved[0])
    llama_mod.paged_attention = timed("attention (gather + softmax)", saved[1])
    try:
        model = get_model(folder)
        need = sum(-(-(len(p) + o) // BLOCK_SIZE) for p, o in zip(prompts, outs, strict=True))
        engine = LLMEngine(model=model, block_size=BLOCK_SIZE, num_blocks=need + 1,
                           max_num_batched_tokens=2048, max_num_seqs=max_num_seqs)
        engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)
        engine.scheduler.update_from_output = timed("update_from_output",
                                                    engine.scheduler.update_from_output)
        model.execute = timed("model.execute (all)", model.execute)
        engine.sampler.sample = timed("sample", engine.sampler.sample)
        params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
        for p, sp in zip(prompts, params, strict=True):
            engine.add_request({"prompt_token_ids": p}, sp)
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        acc["step (total)"] = time.perf_counter() - t0
        acc["_steps"] = len(engine.stats)
    finally:
        engine_mod.prepare_inputs, llama_mod.paged_attention = saved
    return acc


# ---- transformers -----------------------------------------------------------------------


def run_hf(hf, prompts, outs, batch_size: int):
    import torch

    tokens, peak_kv, generated = [], 0, 0
    t0 = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        batch, want = prompts[s:s + batch_size], outs[s:s + batch_size]
        width, new = max(map(len, batch)), max(want)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              pad_token_id=0, return_dict_in_generate=True)
        cache = out.past_key_values
        peak_kv = max(peak_kv, sum(layer.keys.nbytes + layer.values.nbytes
                                   for layer in cache.layers))
        generated += len(batch) * new
        tokens += [out.sequences[i, width:width + w].tolist() for i, w in enumerate(want)]
    return {"wall": time.perf_counter() - t0, "peak_kv": peak_kv, "generated": generated,
            "tokens": tokens}


# ---- report -----------------------------------------------------------------------------


def best_and_median(runs):
    walls = [r["wall"] for r in runs]
    return min(walls), statistics.median(walls)


def main() -> None:
    import torch
    import transformers

    torch.set_num_threads(ARGS.threads)
    transformers.logging.set_verbosity_error()
    prompts, outs = workload(ARGS.num_requests, ARGS.seed)
    useful = sum(outs)
    hw, load_before = hardware(), load_avg()
    folder = tempfile.mkdtemp(prefix="mini_vllm_bench_")
    model = get_model("tiny-random")
    save_checkpoint(folder, model.config, model.weights)
    cfg = model.config
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # Like SamplingParams(ignore_eos=True): EOS may be generated but never stops
    # a sequence. (min_new_tokens would instead forbid EOS: different tokens.)
    hf.generation_config.eos_token_id = None
    attn_impl = hf.config._attn_implementation

    mini_sizes = [int(x) for x in ARGS.mini_batch_sizes.split(",")]
    hf_sizes = [int(x) for x in ARGS.hf_batch_sizes.split(",")]
    run_mini(folder, prompts[:4], [4] * 4, 4)  # warm-up (imports, allocator)
    run_hf(hf, prompts[:4], [4] * 4, 4)
    # Round-robin: every configuration once per round, so a burst of load from
    # elsewhere on the machine hits all of them alike, not one unlucky row.
    mini_runs: dict[int, list] = {b: [] for b in mini_sizes}
    hf_runs: dict[int, list] = {b: [] for b in hf_sizes}
    for _ in range(ARGS.repeats):
        for b in mini_sizes:
            mini_runs[b].append(run_mini(folder, prompts, outs, b))
        for b in hf_sizes:
            hf_runs[b].append(run_hf(hf, prompts, outs, b))
    prof = profile_mini(folder, prompts, outs, max(mini_sizes))
    load_after = load_avg()

    ref = mini_runs[max(mini_sizes)][0]["tokens"]
    same_mini = all(r["tokens"] == ref for runs in mini_runs.values() for r in runs)
    hf_ref = hf_runs[max(hf_sizes)][0]["tokens"]
    agree = sum(a == b for a, b in zip(ref, hf_ref, strict=True))

    print("## Setup (printed by benchmarks/compare_hf.py)\n")
    command = " ".join(["python benchmarks/compare_hf.py", *sys.argv[1:]])
    print(f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; command: `{command}`")
    print(f"- CPU: {hw['cpu']}, {hw['cores']} cores visible; {hw['os']}")
    print(f"- Python {hw['python']}, numpy {hw['numpy']}, torch {hw['torch']}, "
          f"transformers {hw['transformers']} (attention: {attn_impl}); "
          f"{hw['threads']} compute thread(s) per side")
    print(f"- Load average (1/5/15 min) before: {load_before}; after: {load_after} "
          "(the machine is shared; best-of-runs is the fairer figure)")
    print(f"- Model: tiny-random ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, head_dim "
          f"{cfg.head_dim}, vocab {cfg.vocab_size}), float32, "
          f"{cfg.kv_bytes_per_token()} bytes of KV per token")
    print(f"- Workload: {len(prompts)} requests, seed {ARGS.seed}, prompt lengths "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} "
          f"(sum {sum(map(len, prompts))}), output lengths {min(outs)}-{max(outs)} "
          f"(sum {useful}), greedy, EOS ignored; {ARGS.repeats} run(s) per row")
    print(f"- Same greedy tokens in every mini_vllm run: {same_mini}; requests whose tokens "
          f"equal transformers' (batch {max(hf_sizes)}, left-padded): {agree}/{len(prompts)}\n")

    print("## Throughput and KV memory\n")
    print("| system | batch | output tok/s (best) | tok/s (median) | wall s (best) "
          "| steps or tokens generated | peak KV in use |")
    print("|---|---|---|---|---|---|---|")
    best_mini, best_hf = 0.0, 0.0
    for b, runs in mini_runs.items():
        lo, med = best_and_median(runs)
        best_mini = max(best_mini, useful / lo)
        print(f"| mini_vllm (continuous) | max_num_seqs={b} | {useful / lo:,.0f} | "
              f"{useful / med:,.0f} | {lo:.2f} | {runs[0]['steps']} steps | "
              f"{runs[0]['peak_kv'] / 2**20:.2f} MiB |")
    for b, runs in hf_runs.items():
        lo, med = best_and_median(runs)
        best_hf = max(best_hf, useful / lo)
        print(f"| transformers.generate (static, padded) | {b} | {useful / lo:,.0f} | "
              f"{useful / med:,.0f} | {lo:.2f} | {runs[0]['generated']:,} generated "
              f"({useful:,} requested) | {runs[0]['peak_kv'] / 2**20:.2f} MiB |")
    big_mini, big_hf = mini_runs[max(mini_sizes)][0], hf_runs[max(hf_sizes)][0]
    print(f"\nmini_vllm preallocates its block pool ({big_mini['pool_kv'] / 2**20:.2f} MiB here, "
          "sized to fit every request at once); the peak column is what was in use.")
    print(f"\n**Ratio (best mini_vllm / best transformers, output tok/s): "
          f"{best_mini / best_hf:.2f}x.** Peak KV at the largest batch: mini_vllm "
          f"{big_mini['peak_kv'] / 2**20:.2f} MiB vs transformers "
          f"{big_hf['peak_kv'] / 2**20:.2f} MiB "
          f"({big_hf['peak_kv'] / max(big_mini['peak_kv'], 1):.1f}x).\n")

    steps = prof.pop("_steps")
    total = prof["step (total)"]
    print(f"## Where a mini_vllm step goes (max_num_seqs={max(mini_sizes)}, one profiled run, "
          f"{steps} steps)\n")
    print("| phase | total s | ms per step | share of step time |")
    print("|---|---|---|---|")
    order = ["schedule", "prepare_inputs", "model.execute (all)",
             "attention (gather + softmax)", "sample", "update_from_output", "step (total)"]
    for name in order:
        v = prof.get(name, 0.0)
        print(f"| {name} | {v:.3f} | {v / steps * 1e3:.2f} | {v / total:.0%} |")
    print("\n(attention is part of model.execute; the rest of execute is the matmuls, norms, "
          "RoPE and the LM head.)")
    json.dump({"mini": {b: [r["wall"] for r in v] for b, v in mini_runs.items()},
               "hf": {b: [r["wall"] for r in v] for b, v in hf_runs.items()},
               "profile": prof}, sys.stderr)
    sys.stderr.write("\n")


if __name__ == "__main__":
    main()
