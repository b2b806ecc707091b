"""Lab 01-02 tests: a reader for vLLM's log, checked on a CPU.

Three kinds of tests:
  - embedded sample lines (no GPU, no upstream/): the parser and the calculators;
  - `upstream`: lines rendered with Python's logging from the format strings read
    out of upstream/ at the pin, so a format change upstream fails here;
  - `gpu` + `vllm`: run.py against the real engine (a rented GPU only).
"""
import course
from course import load_impl

impl = load_impl(__file__)

import ast  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
UPSTREAM = course.UPSTREAM

# An illustrative DEBUG log of run.py's default run, trimmed: a 6-token prompt and
# 16 output tokens. Written by hand in vLLM v0.22.1's formats; not captured.
P = "(EngineCore pid=4242) "
SAMPLE = [
    "INFO 05-14 10:11:02 [entrypoints/utils.py:278] non-default args: {'max_model_len': 256, "
    "'gpu_memory_utilization': 0.4, 'enable_logging_iteration_details': True, "
    "'model': 'facebook/opt-125m'}",
    P + "INFO 05-14 10:11:05 [v1/engine/core.py:112] Initializing a V1 LLM engine (v0.22.1) with "
    "config: model='facebook/opt-125m', speculative_config=None, tokenizer='facebook/opt-125m'",
    P + "INFO 05-14 10:11:19 [v1/core/kv_cache_utils.py:1733] GPU KV cache size: 233,008 tokens",
    P + "INFO 05-14 10:11:19 [v1/core/kv_cache_utils.py:1734] Maximum concurrency for 256 tokens "
    "per request: 910.19x",
    P + "DEBUG 05-14 10:11:21 [v1/engine/core.py:1215] EngineCore waiting for work.",
    P + "DEBUG 05-14 10:11:21 [v1/engine/core.py:1227] EngineCore loop active.",
    P + "INFO 05-14 10:11:21 [v1/engine/core.py:407] Iteration(0): 1 context requests, 6 context "
    "tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 14.07 ms",
] + [
    P + f"INFO 05-14 10:11:21 [v1/engine/core.py:407] Iteration({i}): 0 context requests, 0 context "
    f"tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 3.{i:02d} ms"
    for i in range(1, 16)
] + [
    # The busy loop steps once more: the scheduler still holds a finished id to report.
    P + "INFO 05-14 10:11:21 [v1/engine/core.py:407] Iteration(16): 0 context requests, 0 context "
    "tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 0.41 ms",
    P + "DEBUG 05-14 10:11:21 [v1/engine/core.py:1215] EngineCore waiting for work.",
    "RUN_PY_RESULT {\"num_prompt_tokens\": 6, \"num_output_tokens\": 16}",
]


# --------------------------------------------------------------------------- parse_line


def test_parse_line_splits_header_and_message():
    line = impl.parse_line(SAMPLE[4])
    assert line == impl.LogLine(
        process="EngineCore", pid=4242, level="DEBUG", timestamp="05-14 10:11:21",
        source="v1/engine/core.py", lineno=1215, message="EngineCore waiting for work.",
    )
    front = impl.parse_line(SAMPLE[0])
    assert (front.process, front.pid, front.level, front.source, front.lineno) == (
        None, None, "INFO", "entrypoints/utils.py", 278,
    )
    assert front.message.startswith("non-default args:")


def test_parse_line_survives_colours_and_a_logging_prefix():
    coloured = (
        "\x1b[36m(EngineCore_DP0 pid=7)\x1b[0m \x1b[32mINFO\x1b[0m \x1b[90m05-14 10:11:21\x1b[0m "
        "\x1b[90m[core.py:407]\x1b[0m Iteration(3): 0 context requests, 0 context tokens, "
        "1 generation requests, 1 generation tokens, iteration elapsed time: 2.50 ms"
    )
    line = impl.parse_line(coloured)
    assert (line.process, line.pid, line.source, line.lineno) == ("EngineCore_DP0", 7, "core.py", 407)
    assert impl.parse_iteration(line.message).index == 3
    prefixed = impl.parse_line("[node-3] WARNING 01-02 03:04:05 [llm.py:9] careful")
    assert (prefixed.level, prefixed.message) == ("WARNING", "careful")


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
def test_parse_line_reads_every_logging_level(level):
    line = impl.parse_line(f"{level} 12-31 23:59:58 [v1/engine/core.py:9] msg: done")
    assert (line.level, line.timestamp, line.lineno, line.message) == (
        level, "12-31 23:59:58", 9, "msg: done",
    )


@pytest.mark.parametrize("text", [
    "",
    "Processed prompts: 100%|##########| 1/1 [00:00<00:00,  9.31it/s]",
    "Traceback (most recent call last):",
    "RUN_PY_RESULT {}",
    "INFO [core.py:1] no timestamp",
])
def test_lines_without_a_vllm_header_are_not_log_lines(text):
    assert impl.parse_line(text) is None


# --------------------------------------------------------------------------- messages


def test_parse_iteration_reads_every_field():
    it = impl.parse_iteration(
        "Iteration(12): 2 context requests, 300 context tokens, 5 generation requests, "
        "5 generation tokens, iteration elapsed time: 41.25 ms"
    )
    assert it == impl.Iteration(12, 2, 300, 5, 5, 41.25)
    assert it.shape == (2, 300, 5, 5)
    # With speculative decoding a generation request can add several tokens in one step.
    spec = impl.parse_iteration(
        "Iteration(7): 1 context requests, 40 context tokens, 3 generation requests, "
        "9 generation tokens, iteration elapsed time: 5.50 ms"
    )
    assert spec == impl.Iteration(7, 1, 40, 3, 9, 5.5)
    assert impl.parse_iteration("EngineCore loop active.") is None


def test_parse_kv_cache_reads_both_startup_lines():
    assert impl.parse_kv_cache("GPU KV cache size: 1,234,567 tokens") == {"kv_cache_tokens": 1234567}
    assert impl.parse_kv_cache("Maximum concurrency for 2,048 tokens per request: 68.66x") == {
        "max_model_len": 2048, "max_concurrency": 68.66,
    }
    assert impl.parse_kv_cache("GPU KV cache usage: 3.0%") is None


def test_parse_stats_reads_required_and_optional_parts():
    msg = ("Engine 000: Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 80.1 "
           "tokens/s, Running: 3 reqs, Waiting: 1 reqs, Preemptions: 2, GPU KV cache usage: 4.2%, "
           "Prefix cache hit rate: 50.0%")
    assert impl.parse_stats(msg) == {
        "engine": 0, "avg_prompt_throughput": 12.5, "avg_generation_throughput": 80.1,
        "running": 3, "waiting": 1, "preemptions": 2, "gpu_kv_cache_usage": 4.2,
        "prefix_cache_hit_rate": 50.0,
    }
    assert impl.parse_stats("Engine 000: something else") is None
    # A data-parallel rank other than 0, and a line with one part that does not fit.
    assert impl.parse_stats("Engine 003: Avg prompt throughput: 1.0 tokens/s, Running: 2 reqs") == {
        "engine": 3, "avg_prompt_throughput": 1.0, "running": 2,
    }
    assert impl.parse_stats("Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: two reqs") is None


def test_where_from_names_the_code_that_printed_the_line():
    messages = [impl.parse_line(s).message for s in SAMPLE[1:7]]
    assert [impl.where_from(m) for m in messages] == [
        "EngineCore.__init__",
        "_report_kv_cache_config",
        "_report_kv_cache_config",
        "EngineCoreProc._process_input_queue",
        "EngineCoreProc._process_input_queue",
        "EngineCore.step",
    ]
    assert impl.where_from("Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 0 reqs") == (
        "LoggingStatLogger.log"
    )
    assert impl.where_from("non-default args: {}") is None


# --------------------------------------------------------------------------- read_log / check_log


def test_read_log_folds_the_sample_run():
    log = impl.read_log(SAMPLE)
    assert log.version == "0.22.1"
    assert (log.kv_cache_tokens, log.max_model_len, log.max_concurrency) == (233008, 256, 910.19)
    assert len(log.iterations) == 17
    assert log.iterations[0].shape == (1, 6, 0, 0)
    assert all(it.shape == (0, 0, 1, 1) for it in log.iterations[1:16])
    assert log.iterations[16].shape == (0, 0, 0, 0)
    assert [it.index for it in log.iterations] == list(range(17))
    assert (log.idle_waits, log.wakeups, log.unparsed) == (2, 1, 1)
    assert log.stats == []


def test_read_log_collects_periodic_stat_lines():
    stat = ("INFO 05-14 10:11:31 [v1/metrics/loggers.py:271] Engine 000: Avg prompt throughput: "
            "0.6 tokens/s, Avg generation throughput: 1.6 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
            "GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")
    log = impl.read_log(SAMPLE + [stat, stat.replace("Running: 0", "Running: 1")])
    assert [s["running"] for s in log.stats] == [0, 1]
    assert log.stats[0]["avg_generation_throughput"] == 1.6
    assert len(log.iterations) == 17 and log.unparsed == 1  # the stat lines are log lines


def test_check_log_accepts_the_sample_and_flags_every_disagreement():
    log = impl.read_log(SAMPLE)
    assert impl.check_log(log, 6, 16, 2048) == []
    # The seed's capture showed 17 model steps for 16 tokens; 16 is right.
    assert impl.check_log(log, 6, 17, 2048) == ["16 non-empty Iteration lines, expected 17"]
    assert impl.check_log(log, 7, 16, 2048) == ["iteration 0: got (1, 6, 0, 0), expected (1, 7, 0, 0)"]
    gapped = impl.read_log(SAMPLE[:8] + SAMPLE[9:])
    assert any("not consecutive" in p for p in impl.check_log(gapped, 6, 15, 2048))


# --------------------------------------------------------------------------- calculators


def test_expected_iterations_one_prefill_then_decodes():
    plan = impl.expected_iterations(6, 16, 2048)
    assert len(plan) == 16
    assert plan[0] == (1, 6, 0, 0)
    assert plan[1:] == [(0, 0, 1, 1)] * 15


def test_expected_iterations_chunks_a_long_prompt():
    assert impl.expected_iterations(20, 4, 8) == [
        (1, 8, 0, 0), (1, 8, 0, 0), (1, 4, 0, 0), (0, 0, 1, 1), (0, 0, 1, 1), (0, 0, 1, 1),
    ]
    assert impl.expected_iterations(3, 1, 8) == [(1, 3, 0, 0)]


@settings(max_examples=20, deadline=None, derandomize=True)
@given(prompt_len=st.integers(1, 30), max_tokens=st.integers(1, 5), budget=st.integers(1, 40))
def test_expected_iterations_agrees_with_mini_vllm(prompt_len, max_tokens, budget):
    """mini_vllm's scheduler follows the same rules; classify its steps the way
    upstream's compute_iteration_details does (no output token yet = context)."""
    engine = LLMEngine(max_num_batched_tokens=budget)
    rid = engine.add_request("y" * prompt_len, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                               ignore_eos=True))
    request = engine.scheduler.requests[rid]
    shapes = []
    while engine.has_unfinished_requests():
        context = request.num_output_tokens == 0
        engine.step()
        n = engine.stats[-1].num_scheduled_tokens[rid]
        shapes.append((1, n, 0, 0) if context else (0, 0, 1, n))
    assert shapes == impl.expected_iterations(prompt_len, max_tokens, budget)


def test_kv_capacity_gives_the_illustrative_startup_numbers():
    blocks = impl.blocks_for_memory(8 * 2**30, num_layers=12, num_kv_heads=12, head_size=64,
                                    dtype_bytes=2, block_size=16)
    assert blocks == 14563
    tokens, concurrency = impl.kv_capacity(blocks, block_size=16, max_model_len=256)
    assert tokens == 233008 == blocks * 16
    assert concurrency == 910.1875
    assert f"{tokens:,}" == "233,008" and f"{concurrency:.2f}" == "910.19"
    # A max_model_len that is not a whole number of blocks still reserves whole blocks.
    assert impl.kv_capacity(100, 16, 40) == (1333, 100 / 3)
    # 101 / 3 * 40 = 1346.67: upstream truncates with int(), it does not round.
    assert impl.kv_capacity(101, 16, 40) == (1346, 101 / 3)


def test_blocks_for_memory_counts_only_whole_blocks():
    # 2 layers x (K and V) x 2 tokens x 1 head x 4 dims x 2 bytes = 64 bytes per block.
    sizes = dict(num_layers=2, num_kv_heads=1, head_size=4, dtype_bytes=2, block_size=2)
    assert [impl.blocks_for_memory(n, **sizes) for n in (0, 63, 64, 127, 128)] == [0, 0, 1, 1, 2]


def test_calculators_accept_the_smallest_legal_sizes():
    assert impl.kv_capacity(1, 1, 1) == (1, 1.0)
    assert impl.blocks_for_memory(2, 1, 1, 1, 1, 1) == 1  # K and V of one 1-byte value
    assert impl.expected_iterations(1, 1, 1) == [(1, 1, 0, 0)]


_GOOD = {
    impl.expected_iterations: dict(num_prompt_tokens=6, max_tokens=4, max_num_batched_tokens=8),
    impl.kv_capacity: dict(num_blocks=10, block_size=16, max_model_len=256),
    impl.blocks_for_memory: dict(kv_cache_bytes=2**30, num_layers=12, num_kv_heads=12,
                                 head_size=64, dtype_bytes=2, block_size=16),
}
_BAD = [(fn, name, bad) for fn, kwargs in _GOOD.items() for name in kwargs
        for bad in ((-1, 2.5, True) if name == "kv_cache_bytes" else (0, 2.5, True))]


@pytest.mark.parametrize(("fn", "name", "bad"), _BAD,
                         ids=[f"{fn.__name__}-{name}-{bad!r}" for fn, name, bad in _BAD])
def test_calculators_reject_bad_input_with_a_named_error(fn, name, bad):
    with pytest.raises(ValueError, match=name):
        fn(**{**_GOOD[fn], name: bad})


# --------------------------------------------------------------------------- upstream format strings


def _tree(rel: str) -> ast.Module:
    return ast.parse((UPSTREAM / rel).read_text())


def _function(tree: ast.AST, qualname: str) -> ast.FunctionDef:
    *owners, name = qualname.split(".")
    scope = tree
    for owner in owners:
        scope = next(n for n in ast.walk(scope) if isinstance(n, ast.ClassDef) and n.name == owner)
    return next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name)


def _logged_strings(fn: ast.AST) -> list[str]:
    """First-argument string constants of every logger.* call inside fn."""
    out = []
    for node in ast.walk(fn):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "logger"
                and node.args and isinstance(node.args[0], ast.Constant)):
            out.append(node.args[0].value)
    return out


def _upstream_formats() -> dict[str, object]:
    logger_tree = _tree("vllm/logger.py")
    consts = {}
    for node in logger_tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            consts[node.targets[0].id] = node.value
    fmt = "".join(v.value for v in consts["_FORMAT"].values if isinstance(v, ast.Constant))
    datefmt = consts["_DATE_FORMAT"].value

    add_prefix = _function(_tree("vllm/utils/system_utils.py"), "_add_prefix")
    prefix_node = next(
        n.value for n in ast.walk(add_prefix)
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
        and n.targets[0].id == "prefix" and isinstance(n.value, ast.JoinedStr)
        and all(not isinstance(v, ast.FormattedValue) or isinstance(v.value, ast.Name)
                for v in n.value.values)
    )

    core = _tree("vllm/v1/engine/core.py")
    iteration_call = next(
        n for n in ast.walk(_function(core, "EngineCore.log_iteration_details"))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "join"
    )
    iteration_parts = [e.value if isinstance(e, ast.Constant) else None
                       for e in iteration_call.args[0].elts]
    init_msg = next(s for s in _logged_strings(_function(core, "EngineCore.__init__"))
                    if s.startswith("Initializing"))
    idle_msgs = _logged_strings(_function(core, "EngineCoreProc._process_input_queue"))

    kv_msgs = _logged_strings(_function(_tree("vllm/v1/core/kv_cache_utils.py"),
                                        "_report_kv_cache_config"))

    loggers = _tree("vllm/v1/metrics/loggers.py")
    stat_log = _function(loggers, "LoggingStatLogger.log")
    stat_parts = [n.value for n in sorted(
        (n for n in ast.walk(stat_log)
         if isinstance(n, ast.Constant) and isinstance(n.value, str) and "%" in n.value),
        key=lambda n: (n.lineno, n.col_offset),
    )]
    prefix_fn = _function(loggers, "LoggingStatLogger.log_prefix")
    stat_prefix = next(n.value for n in ast.walk(prefix_fn)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return dict(fmt=fmt, datefmt=datefmt, prefix=prefix_node, iteration=iteration_parts,
                init=init_msg, idle=idle_msgs, kv=kv_msgs, stat_parts=stat_parts,
                stat_prefix=stat_prefix)


def _render(f, msg: str, args: tuple, level=logging.INFO, fileinfo="v1/engine/core.py",
            lineno=407, process=("EngineCore", 31337)) -> str:
    record = logging.LogRecord("vllm.x", level, "/x.py", lineno, msg, args, None)
    record.fileinfo = fileinfo
    text = logging.Formatter(f["fmt"], f["datefmt"]).format(record)
    if process is None:
        return text
    names = {"worker_name": process[0], "pid": process[1]}
    prefix = "".join(v.value if isinstance(v, ast.Constant) else str(names[v.value.id])
                     for v in f["prefix"].values)
    return prefix + text


@pytest.mark.upstream
def test_parser_reads_lines_rendered_from_upstream_format_strings():
    f = _upstream_formats()

    # One step: the "".join of literal pieces and values in log_iteration_details.
    values = iter(["5", "1", "6", "0", "0", "13.25"])
    msg = "".join(p if p is not None else next(values) for p in f["iteration"])
    line = impl.parse_line(_render(f, msg, ()))
    assert (line.process, line.pid, line.level, line.source, line.lineno) == (
        "EngineCore", 31337, "INFO", "v1/engine/core.py", 407,
    )
    assert impl.parse_iteration(line.message) == impl.Iteration(5, 1, 6, 0, 0, 13.25)
    assert impl.where_from(line.message) == "EngineCore.step"

    # Start-up capacity lines, rendered with the arguments upstream passes.
    size_fmt, conc_fmt = f["kv"][:2]
    rendered = [_render(f, size_fmt, (f"{233008:,}",), fileinfo="v1/core/kv_cache_utils.py"),
                _render(f, conc_fmt, (f"{256:,}", 910.1875), fileinfo="v1/core/kv_cache_utils.py")]
    assert [impl.parse_kv_cache(impl.parse_line(r).message) for r in rendered] == [
        {"kv_cache_tokens": 233008}, {"max_model_len": 256, "max_concurrency": 910.19},
    ]

    # Engine start and the busy loop's idle/active lines (front-end process: no prefix).
    init = impl.parse_line(_render(f, f["init"], ("0.22.1", "model='m'"), process=None))
    assert init.process is None and impl.where_from(init.message) == "EngineCore.__init__"
    for idle in f["idle"]:
        parsed = impl.parse_line(_render(f, idle, (), level=logging.DEBUG, lineno=1215))
        assert parsed.level == "DEBUG"
        assert impl.where_from(parsed.message) == "EngineCoreProc._process_input_queue"

    # The periodic stat line, every optional part included.
    samples = {"Avg prompt throughput": 12.5, "Avg generation throughput": 80.0, "Running": 3,
               "Waiting": 1, "Deferred": 2, "Preemptions": 4, "GPU KV cache usage": 4.25,
               "Prefix cache hit rate": 50.0}
    parts, args = [], []
    for part in f["stat_parts"]:
        name = part.split(":")[0]
        parts.append(part)
        args.append(samples.get(name, 1.0))
    msg = f["stat_prefix"].format(0) + ", ".join(parts)
    stats = impl.parse_stats(impl.parse_line(_render(f, msg, tuple(args))).message)
    assert stats["engine"] == 0
    assert (stats["running"], stats["waiting"], stats["preemptions"]) == (3, 1, 4)
    assert (stats["gpu_kv_cache_usage"], stats["prefix_cache_hit_rate"]) == (4.2, 50.0)
    assert len(stats) == 1 + len(f["stat_parts"])


def test_run_py_reads_the_shipped_sample_log(capsys):
    from course.loader import import_path

    run = import_path(HERE / "run.py")
    assert run.main(["--from-log", str(HERE / "sample-engine.log")]) == 0
    out = capsys.readouterr().out
    assert "KV cache 233,008 tokens; max concurrency 910.19x at 256 tokens per request" in out
    assert "EngineCore.step #1   Iteration(0): prefill 6 tokens" in out
    assert "EngineCore.step #17  Iteration(16): empty (reports finished ids)" in out
    assert "OK: 16 steps that ran the model, as predicted by expected_iterations" in out


# --------------------------------------------------------------------------- the real engine


@pytest.mark.gpu
@pytest.mark.vllm
def test_run_py_log_matches_the_prediction_on_a_real_gpu(tmp_path):
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--log", str(tmp_path / "engine.log")],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK: 16 steps that ran the model" in result.stdout
