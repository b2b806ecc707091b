from __future__ import annotations

import subprocess
import sys

import pytest

from mini_vllm.__main__ import main


def _run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_generate_prints_the_step_trace_and_the_completion(capsys):
    code, out = _run(capsys, "generate", "hello world", "goodbye", "--model", "toy", "--block-size", "4",
                     "--max-tokens", "4", "--max-num-batched-tokens", "8", "--ignore-eos")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:9] == ["step", "reqs", "tokens", "prefill", "decode", "run", "wait", "blocks", "hits"]
    assert lines[1].split() == ["1", "1", "8", "8", "0", "1", "1", "2/1023", "0", "req-0:8"]
    assert lines[3].split()[:5] == ["3", "2", "3", "2", "1"]  # prefill and decode in one step
    assert "finished req-1" in lines[6]
    assert "[req-0] prompt (11 tokens): 'hello world'" in out
    assert "completion (4 tokens, finish_reason=length, first token at step 2" in out


def test_generate_trace_shows_preemptions_and_cache_hits(capsys):
    code, out = _run(capsys, "generate", "a" * 12, "b" * 12, "--model", "toy", "--block-size", "4",
                     "--num-blocks", "8", "--max-tokens", "6", "--ignore-eos")
    assert code == 0 and "PREEMPTED req-1" in out and "preemptions=1" in out


def test_quiet_prints_only_completions(capsys):
    _, out = _run(capsys, "generate", "hi", "--model", "toy", "--quiet", "--max-tokens", "2")
    assert out.startswith("[req-0]") and "prefill" not in out and len(out.splitlines()) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "x", "--block-size", "0"], "argument --block-size: must be an integer >= 1, got 0"),
        (["generate", "x", "--num-blocks", "1"], "argument --num-blocks: must be an integer >= 2, got 1"),
        (["generate", "x", "--max-tokens", "two"], "argument --max-tokens: must be an integer >= 1, got 'two'"),
        (["generate", "x", "--bogus"], "unrecognized arguments: --bogus"),
        (["generate", "x", "--model", "toy", "--top-p", "2"], "top_p must be in (0, 1], got 2.0"),
        (["generate", "x" * 40, "--model", "toy", "--num-blocks", "2"], "KV blocks"),
        (["bench", "--num-requests", "10,a"], "--num-requests must be comma-separated integers >= 1"),
        (["bench", "--num-requests", "0"], "--num-requests must be comma-separated integers >= 1"),
        (["generate", "x", "--model", "/no/such/model-folder"], "/no/such/model-folder: no such model folder"),
        (["generate", "x", "--model", "toy", "--temperature", "0.001"], "temperature must be 0 (greedy) or a finite number >= 0.01"),
        (["generate", "x", "--model", "toy", "--top-k", "-2"], "top_k must be -1 or 0 (disabled) or >= 1"),
        (["generate", "x", "--model", "toy", "--min-p", "nan"], "min_p must be in [0, 1]"),
        (["generate", "x", "--model", "toy", "--stop", ""], "stop must be a non-empty string"),
        (["generate", "x", "--model", "toy", "--max-model-len", "1"], "argument --max-model-len: must be an integer >= 2"),
        (["generate", "x" * 10, "--model", "toy", "--max-model-len", "12", "--max-tokens", "3"], "exceeds max_model_len = 12"),
        (["generate", "x", "--model", "toy", "--long-prefill-token-threshold", "-1"], "must be an integer >= 0"),
        ([], "required: command"),
    ],
)
def test_bad_input_is_a_one_line_error(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_bench_prints_one_row_per_level(capsys):
    code, out = _run(capsys, "bench", "--num-requests", "5,20", "--max-tokens", "3")
    rows = out.splitlines()
    assert code == 0 and rows[0].split()[0] == "requests"
    assert [r.split()[0] for r in rows[1:3]] == ["5", "20"]
    assert rows[2].split()[2] == "20"  # peak running: everyone admitted at once


def test_module_entry_point_and_help():
    res = subprocess.run([sys.executable, "-m", "mini_vllm", "generate", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for flag in ["--max-tokens", "--block-size", "--num-blocks", "--max-num-batched-tokens",
                 "--enable-caching", "--long-prefill-token-threshold", "--max-num-seqs"]:
        assert flag in res.stdout


def test_the_trace_quoted_in_the_course_readme_is_what_the_cli_prints(capsys):
    """README.md's Quick start quotes this command's trace as captured: keep it true."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    # The SmolLM2 trace comes first (test_smollm2_model.py checks it); this one follows.
    quick_start = quick_start.split('generate "The capital of France is"', 1)[1]
    quoted = [ln for ln in quick_start.splitlines() if re.match(r"^\s+\d+\s+\d+\s", ln)]
    assert len(quoted) >= 4, "the Quick start no longer quotes the trace"
    code, out = _run(capsys, "generate", "The capital of France is", "--max-tokens", "16")
    assert code == 0
    printed = {ln.split()[0]: ln.split() for ln in out.splitlines()[1:] if ln[:4].strip().isdigit()}
    for line in quoted:
        assert printed[line.split()[0]] == line.split(), line
