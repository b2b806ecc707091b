"""The output the lab READMEs show as *captured* from real vLLM on a CPU, checked
against the calculators that predict it.

The captures come from each lab's ``run.py --device cpu`` (see SETUP.md, "Real vLLM
on an x86-64 laptop"); they are text in the READMEs, so these tests run everywhere,
in the main environment, in milliseconds. A capture edited by hand so that it no
longer matches the arithmetic fails here; so does a calculator that drifts.
"""
from __future__ import annotations

import pathlib
import re

import pytest

from course.loader import import_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_01_02 = ROOT / "phase-01-architecture-and-request-lifecycle/labs/lab-02-read-the-real-loop"
LAB_02_03 = ROOT / "phase-02-paged-attention/labs/lab-03-real-vllm-blocks"
LAB_03_03 = ROOT / "phase-03-continuous-batching-scheduler/labs/lab-03-prefix-cache-hitrate"

GiB = 1 << 30
# SmolLM2-135M-Instruct (its config.json), run in float32; vLLM's CPU block size.
LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES, CPU_BLOCK = 30, 3, 64, 4, 128

_FENCE = re.compile(r"```text\n(.*?)```", re.S)


def captured_block(readme: pathlib.Path, anchor: str) -> str:
    """The ```text block holding ``anchor``, which must follow a "Captured" label."""
    text = readme.read_text()
    for m in _FENCE.finditer(text):
        if anchor in m.group(1):
            before = text[: m.start()].rsplit("\n\n", 2)[-2:]
            assert any("Captured" in part for part in before), f"{readme}: block not labelled"
            return m.group(1)
    pytest.fail(f"{readme.relative_to(ROOT)}: no captured block with {anchor!r}")


def test_phase_01_capture_matches_the_log_readers_calculators():
    reader = import_path(LAB_01_02 / "solution.py")
    block = captured_block(LAB_01_02 / "README.md", "vLLM 0.22.1; KV cache")
    m = re.search(r"KV cache ([\d,]+) tokens; max concurrency ([\d.]+)x at (\d+) tokens", block)
    tokens, concurrency, max_len = int(m[1].replace(",", "")), float(m[2]), int(m[3])
    blocks = reader.blocks_for_memory(1 * GiB, LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES, CPU_BLOCK)
    assert blocks == 182
    assert reader.kv_capacity(blocks, CPU_BLOCK, max_len) == (tokens, concurrency)
    m = re.search(r"prompt: (\d+) tokens; output: (\d+) tokens", block)
    prompt, output = int(m[1]), int(m[2])
    expected = reader.expected_iterations(prompt, output, 2048)  # run.py's default budget
    assert f"prefill {prompt} tokens" in block
    assert f"OK: {len(expected)} steps that ran the model" in block
    assert f"Iteration({len(expected)}): empty" in block  # the step after the last token


def _runs(block: str) -> list[dict]:
    runs = []
    for m in re.finditer(r"kv_cache_memory_bytes=([\d,]+) .*?# KV blocks = ([\d,]+)", block):
        runs.append({"budget": int(m[1].replace(",", "")), "blocks": int(m[2].replace(",", "")),
                     "start": m.end()})
    for i, run in enumerate(runs):
        end = runs[i + 1]["start"] if i + 1 < len(runs) else len(block)
        run["logged"] = re.findall(r"^logged    : (.*)$", block[run["start"]:end], re.M)
    return runs


def test_phase_02_captures_match_the_capacity_calculator_at_two_budgets():
    calc = import_path(LAB_02_03 / "solution.py")
    block = captured_block(LAB_02_03 / "README.md", "device=cpu kv_cache_memory_bytes=")
    runs = _runs(block)
    assert sorted(r["budget"] for r in runs) == [GiB // 2, GiB]
    spec = calc.KVSpec(LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES)
    for run in runs:
        blocks = calc.num_gpu_blocks(run["budget"], spec, CPU_BLOCK)
        assert run["blocks"] == blocks
        assert run["logged"] == calc.startup_log_lines(blocks, 1024, CPU_BLOCK)
    assert block.count("AGREE") == 2 and "DISAGREE" not in block


def test_phase_03_capture_matches_the_prefix_hit_calculator():
    calc = import_path(LAB_03_03 / "solution.py")
    block = captured_block(LAB_03_03 / "README.md", "(block_size 128)")
    arms = re.findall(r"prefix caching (ON |OFF): \d+ prompts, tail lengths \[([\d, ]+)\]\n"
                      r"  predicted: queries=(\d+) hits=(\d+) hit rate=([\d.]+%) "
                      r"blocks after admission=(\d+).*\n"
                      r"  measured : queries=(\d+) hits=(\d+) hit rate=([\d.]+%)", block)
    assert [a[0].strip() for a in arms] == ["OFF", "ON"]
    for arm, tails, *numbers in arms:
        caching = arm.strip() == "ON"
        # 448 shared tokens, then a tail; a 128-token block never reaches into the tails,
        # so their contents do not matter, only their lengths.
        prompts = [[7] * 448 + [1000 + i] * int(t) for i, t in enumerate(tails.split(", "))]
        hits = sum(calc.prefix_cache_hits(prompts, CPU_BLOCK, caching))
        queries = sum(map(len, prompts)) if caching else 0
        rate = calc.format_hit_rate(hits / queries) if queries else "0.0%"
        blocks = calc.blocks_after_admission(prompts, CPU_BLOCK, caching)
        assert numbers == [str(queries), str(hits), rate, str(blocks), str(queries), str(hits), rate]
