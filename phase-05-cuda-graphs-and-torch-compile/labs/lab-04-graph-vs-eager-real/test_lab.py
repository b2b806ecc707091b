"""Lab 05-04 tests: the launch model, vLLM's capture log, and (on a GPU) the real comparison.

Everything but the last test runs on a CPU in well under a second. Log lines
are built from the two format strings of vllm/v1/worker/gpu_model_runner.py
(the ``upstream`` test reads them out of upstream/ itself), laid out the way
tqdm 4 draws a bar and the way vLLM prefixes an engine process's output.
"""
from __future__ import annotations

import ast
import math

import pytest

import course
from course import load_impl

impl = load_impl(__file__)

ROOT = course.REPO_ROOT
PROCESS_PREFIX = "(EngineCore_DP0 pid=4242) "  # vllm/utils/system_utils.py _add_prefix, no colour
LOGGER_PREFIX = "INFO 11-26 13:55:07 [gpu_model_runner.py:6456] "  # vllm/logger.py _FORMAT


def bar_state(desc: str, n: int, total: int, elapsed_s: int = 3) -> str:
    """One redraw of a tqdm bar, laid out as tqdm 4's default format_meter writes it."""
    filled = n * 10 // total
    frac = (n * 10 / total) - filled
    partial = "" if filled == 10 else (" ▏▎▍▌▋▊▉"[int(frac * 8)] if frac else " ")
    bar = ("█" * filled + partial).ljust(10)
    rate = n / elapsed_s if elapsed_s else 0.0
    remaining = (total - n) / rate if rate else None
    rem = "?" if remaining is None else f"00:{int(remaining):02d}"
    rate_s = f"{rate:.2f}it/s" if rate else "?it/s"
    return f"{desc}: {100 * n / total:3.0f}%|{bar}| {n}/{total} [00:{elapsed_s:02d}<{rem}, {rate_s}]"


def bar_line(kind: str, mode: str, counts: list[int], total: int) -> str:
    """A whole captured-log line: the process prefix, then every redraw separated by \\r."""
    desc = impl.CAPTURE_DESC_FORMAT.format(kind, mode)
    states = [bar_state(desc, n, total, elapsed_s=0 if n == 0 else 1 + n // 20) for n in counts]
    return PROCESS_PREFIX + "\r".join(states)


# ---------------------------------------------------------------------------------------------
# The launch model
# ---------------------------------------------------------------------------------------------


def test_step_time_is_the_slower_of_cpu_and_gpu_not_their_sum():
    # 1,054 launches (mini_vllm's SmolLM2-shaped decode forward, 4 + 35 * 30) at 5 us: 5.27 ms of CPU
    assert impl.step_time(1054, 5e-6, 2e-3) == pytest.approx(5.27e-3, rel=1e-12)  # CPU-bound
    assert impl.step_time(1054, 5e-6, 10e-3) == pytest.approx(10e-3, rel=1e-12)  # GPU-bound
    assert impl.step_time(100, 1e-5, 1e-3) == pytest.approx(1e-3, rel=1e-12)  # balanced: 1 ms each
    assert impl.step_time(1, 4e-6, 0.0) == 4e-6  # an idle GPU: the launch alone


def test_speedup_is_one_when_the_gpu_is_the_bottleneck():
    # 0.1 ms of launches either way is hidden under 50 ms of GPU work
    assert impl.predict_speedup(20, 5e-6, 50e-3) == 1.0
    assert impl.predict_speedup(1054, 5e-6, 10e-3, graph_launches=61) == 1.0


def test_speedup_with_an_idle_gpu_is_the_ratio_of_launches():
    assert impl.predict_speedup(1054, 5e-6, 0.0) == pytest.approx(1054.0, rel=1e-12)  # one FULL graph
    assert impl.predict_speedup(1054, 5e-6, 0.0, graph_launches=61) == pytest.approx(1054 / 61, rel=1e-12)
    assert impl.predict_speedup(7, 1e-3, 0.0, graph_launches=7) == 1.0  # nothing saved


def test_readme_speedups_for_piecewise_graphs_on_the_smollm2_shape():
    # eager 1,054 x 5 us = 5.27 ms of CPU; piecewise leaves 61 launches = 0.305 ms
    #   GPU 0.5 ms: 5.27 / max(0.305, 0.5) = 10.54;  GPU 2 ms: 5.27 / 2 = 2.635;  GPU 10 ms: 10 / 10 = 1
    got = [impl.predict_speedup(1054, 5e-6, g, graph_launches=61) for g in (0.5e-3, 2e-3, 10e-3)]
    assert got == pytest.approx([10.54, 2.635, 1.0], rel=1e-12)
    # the graph side is launch-bound below 0.305 ms of GPU time: 1054 / 61 there, whatever the GPU does
    assert impl.predict_speedup(1054, 5e-6, 0.3e-3, graph_launches=61) == pytest.approx(1054 / 61, rel=1e-12)


def test_speedup_falls_as_gpu_time_grows():
    speedups = [impl.predict_speedup(300, 5e-6, g * 1e-4, graph_launches=3) for g in range(0, 40)]
    assert all(a >= b for a, b in zip(speedups, speedups[1:], strict=False))
    assert speedups[0] == pytest.approx(100.0) and speedups[-1] == 1.0  # 3.9 ms > 1.5 ms of launches


@pytest.mark.parametrize("call, name", [
    (lambda: impl.step_time(0, 5e-6, 1e-3), "num_launches"),
    (lambda: impl.step_time(2.0, 5e-6, 1e-3), "num_launches"),
    (lambda: impl.step_time(True, 5e-6, 1e-3), "num_launches"),
    (lambda: impl.step_time(10, 0.0, 1e-3), "per_launch_s"),
    (lambda: impl.step_time(10, -1e-6, 1e-3), "per_launch_s"),
    (lambda: impl.step_time(10, math.inf, 1e-3), "per_launch_s"),
    (lambda: impl.step_time(10, math.nan, 1e-3), "per_launch_s"),
    (lambda: impl.step_time(10, 5e-6, -1e-3), "gpu_time_s"),
    (lambda: impl.step_time(10, 5e-6, math.nan), "gpu_time_s"),
    (lambda: impl.step_time(10, 5e-6, "1"), "gpu_time_s"),
    (lambda: impl.predict_speedup(0, 5e-6, 1e-3), "num_launches"),
    (lambda: impl.predict_speedup(10, 0.0, 1e-3), "per_launch_s"),
    (lambda: impl.predict_speedup(10, 5e-6, -1.0), "gpu_time_s"),
    (lambda: impl.predict_speedup(10, 5e-6, 1e-3, graph_launches=0), "graph_launches"),
    (lambda: impl.predict_speedup(10, 5e-6, 1e-3, graph_launches=11), "graph_launches"),
    (lambda: impl.predict_speedup(10, 5e-6, 1e-3, graph_launches=1.0), "graph_launches"),
])
def test_bad_arguments_raise_value_error_naming_the_parameter(call, name):
    # the message starts with the culprit: a bad num_launches must not be blamed on graph_launches
    with pytest.raises(ValueError, match=rf"^{name} must"):
        call()


def test_smallest_valid_arguments_are_accepted():
    assert impl.step_time(1, 1e-9, 0) == 1e-9  # an int 0 is a valid GPU time
    assert impl.predict_speedup(1, 1e-9, 0) == 1.0
    assert impl.predict_speedup(10, 1e-3, 0.0, graph_launches=10) == 1.0  # graph_launches == num_launches


# ---------------------------------------------------------------------------------------------
# The capture progress bars
# ---------------------------------------------------------------------------------------------

Bar = impl.CaptureBar


def test_parses_the_last_redraw_of_a_finished_bar():
    line = bar_line("mixed prefill-decode", "PIECEWISE", [0, 1, 16, 40, 51], 51)
    assert line.count("\r") == 4 and line.startswith(PROCESS_PREFIX + "Capturing CUDA graphs (mixed")
    assert impl.parse_capture_bar(line) == Bar("mixed prefill-decode", "PIECEWISE", 51, 51)


def test_parses_the_decode_full_bar():
    line = bar_line("decode", "FULL", [0, 17, 35], 35)
    assert impl.parse_capture_bar(line) == Bar("decode", "FULL", 35, 35)


def test_an_interrupted_capture_reports_how_far_it_got():
    # the engine died after 16 of 51 graphs: the bar's last state is 16/51
    line = bar_line("mixed prefill-decode", "FULL", [0, 1, 16], 51)
    assert impl.parse_capture_bar(line) == Bar("mixed prefill-decode", "FULL", 16, 51)
    first_only = bar_line("decode", "PIECEWISE", [0], 7)
    assert impl.parse_capture_bar(first_only) == Bar("decode", "PIECEWISE", 0, 7)


def test_the_bar_is_found_without_the_process_prefix_and_after_a_logger_prefix():
    desc = impl.CAPTURE_DESC_FORMAT.format("decode", "FULL")
    bare = bar_state(desc, 35, 35)
    assert impl.parse_capture_bar(bare) == Bar("decode", "FULL", 35, 35)
    assert impl.parse_capture_bar(LOGGER_PREFIX + bare) == Bar("decode", "FULL", 35, 35)


def test_a_description_without_a_counter_has_no_counts():
    desc = impl.CAPTURE_DESC_FORMAT.format("mixed prefill-decode", "PIECEWISE")
    assert impl.parse_capture_bar(PROCESS_PREFIX + desc) == Bar("mixed prefill-decode", "PIECEWISE", None, None)
    # a redraw with a counter after a bare description: the counter wins (last redraw)
    assert impl.parse_capture_bar(desc + "\r" + bar_state(desc, 3, 4)) == Bar("mixed prefill-decode",
                                                                                "PIECEWISE", 3, 4)


def test_lines_that_are_not_a_capture_bar_give_none():
    for line in ["",
                 PROCESS_PREFIX + LOGGER_PREFIX + impl.CAPTURE_FINISHED_FORMAT % (7, 0.41),
                 "WARNING 11-26 13:55:01 [gpu_model_runner.py:6375] Skipping CUDA graph capture. To turn "
                 "on CUDA graph capture, ensure `cudagraph_mode` was not manually set to `NONE`",
                 "Capturing CUDA graphs (prefill, FULL): 100%|██████████| 3/3",  # no such kind
                 "Capturing CUDA graphs (decode, NONE): 100%|██████████| 3/3",  # NONE is never captured
                 "Loading safetensors checkpoint shards: 100%|██████████| 1/1 [00:00<00:00, 3.21it/s]"]:
        assert impl.parse_capture_bar(line) is None, line


def test_parse_capture_bar_refuses_non_strings():
    with pytest.raises(ValueError, match="line"):
        impl.parse_capture_bar(b"Capturing CUDA graphs (decode, FULL)")


def test_bar_layout_helper_matches_tqdm():
    tqdm = pytest.importorskip("tqdm")  # the helper above must draw bars exactly as tqdm does
    desc = impl.CAPTURE_DESC_FORMAT.format("decode", "FULL")
    for n, total, elapsed in [(0, 35, 0), (17, 35, 1), (35, 35, 2), (16, 51, 1), (51, 51, 3)]:
        assert bar_state(desc, n, total, elapsed) == tqdm.tqdm.format_meter(n, total, elapsed, prefix=desc)
    assert impl.parse_capture_bar(tqdm.tqdm.format_meter(16, 51, 1.5, prefix=desc)) == Bar("decode", "FULL",
                                                                                            16, 51)


# ---------------------------------------------------------------------------------------------
# The summary line
# ---------------------------------------------------------------------------------------------


def test_parses_seconds_and_gib_behind_both_prefixes():
    line = PROCESS_PREFIX + LOGGER_PREFIX + impl.CAPTURE_FINISHED_FORMAT % (7.4, 0.4111)
    assert line.endswith("Graph capturing finished in 7 secs, took 0.41 GiB")
    assert impl.parse_capture_finished(line) == impl.CaptureFinished(7.0, 0.41)


def test_the_memory_figure_can_be_negative():
    # the GiB figure is free memory before minus after: negative when memory was freed meanwhile
    line = LOGGER_PREFIX + impl.CAPTURE_FINISHED_FORMAT % (12.6, -0.0213)
    assert line.endswith("in 13 secs, took -0.02 GiB")
    assert impl.parse_capture_finished(line) == impl.CaptureFinished(13.0, -0.02)


def test_whole_seconds_and_large_values():
    assert impl.parse_capture_finished(impl.CAPTURE_FINISHED_FORMAT % (0.2, 3.14159)) == \
        impl.CaptureFinished(0.0, 3.14)
    assert impl.parse_capture_finished(impl.CAPTURE_FINISHED_FORMAT % (95.5, 12.345)) == \
        impl.CaptureFinished(96.0, 12.35)  # 95.5 rounds half to even (96); 12.345 is stored a hair above


def test_other_lines_are_not_a_summary():
    for line in ["", bar_line("decode", "FULL", [0, 35], 35),
                 "INFO 11-26 13:55:07 [gpu_worker.py:1] Graph capturing finished",
                 "Graph capturing finished in secs, took GiB"]:
        assert impl.parse_capture_finished(line) is None, line
    with pytest.raises(ValueError, match="line"):
        impl.parse_capture_finished(None)


# ---------------------------------------------------------------------------------------------
# Predicting the bars
# ---------------------------------------------------------------------------------------------


def test_llm_defaults_on_a_small_card_give_51_mixed_and_35_decode_graphs():
    # an L4 (22 GiB): max_num_seqs 256 -> ladder top min(512, 512, 8192) = 512: 3 + 31 + 17 = 51 rungs;
    # decode graphs only for rungs <= 256: 1, 2, 4, 8..248 (31), 256 -> 35
    limits = impl.llm_batch_defaults(22.0, "NVIDIA L4")
    assert impl.expected_capture_bars(*limits) == [Bar("mixed prefill-decode", "PIECEWISE", 51, 51),
                                                   Bar("decode", "FULL", 35, 35)]
    # an A100 80GB has the memory but keeps the small defaults (vLLM excludes it by name)
    assert impl.expected_capture_bars(*impl.llm_batch_defaults(79.2, "NVIDIA A100-SXM4-80GB"))[1].total == 35


def test_llm_defaults_on_an_h100_or_h200_give_51_and_51():
    # >= 70 GiB: max_num_seqs 1024, so every one of the 51 rungs (top 512) is also a decode size
    for name, gib in [("NVIDIA H100 80GB HBM3", 79.2), ("NVIDIA H200", 139.8)]:
        assert impl.expected_capture_bars(*impl.llm_batch_defaults(gib, name)) == [
            Bar("mixed prefill-decode", "PIECEWISE", 51, 51), Bar("decode", "FULL", 51, 51)]


@pytest.mark.parametrize("mode, want", [
    ("NONE", []),
    ("PIECEWISE", [Bar("mixed prefill-decode", "PIECEWISE", 51, 51)]),
    ("FULL", [Bar("mixed prefill-decode", "FULL", 51, 51)]),  # one routine: no separate decode keys
    ("FULL_DECODE_ONLY", [Bar("decode", "FULL", 35, 35)]),  # mixed batches run eager
    ("FULL_AND_PIECEWISE", [Bar("mixed prefill-decode", "PIECEWISE", 51, 51), Bar("decode", "FULL", 35, 35)]),
])
def test_each_mode_prints_its_own_bars(mode, want):
    assert impl.expected_capture_bars(256, 8192, mode) == want


def test_small_max_num_seqs_shrinks_both_bars():
    # max_num_seqs 8: top min(16, 512, 8192) = 16 -> [1, 2, 4, 8, 16]; decode rungs <= 8 -> [1, 2, 4, 8]
    assert impl.expected_capture_bars(8, 8192) == [Bar("mixed prefill-decode", "PIECEWISE", 5, 5),
                                                   Bar("decode", "FULL", 4, 4)]
    # max_num_seqs 3: top 6 -> [1, 2, 4]; decode rungs <= 3 -> [1, 2]
    assert impl.expected_capture_bars(3, 8192, "FULL_DECODE_ONLY") == [Bar("decode", "FULL", 2, 2)]
    # a token budget of 100 caps the ladder at 100 and adds it: 1, 2, 4, 8..96 (12), 100 -> 16
    assert impl.expected_capture_bars(64, 100) == [Bar("mixed prefill-decode", "PIECEWISE", 16, 16),
                                                   Bar("decode", "FULL", 11, 11)]  # 1, 2, 4, 8..64


def test_smallest_deployment_captures_one_graph_of_each_kind():
    assert impl.expected_capture_bars(1, 1) == [Bar("mixed prefill-decode", "PIECEWISE", 1, 1),
                                                Bar("decode", "FULL", 1, 1)]


def test_bad_modes_and_limits_raise_value_error():
    with pytest.raises(ValueError, match="cudagraph_mode"):
        impl.expected_capture_bars(256, 8192, "FULL_AND_DECODE")
    with pytest.raises(ValueError, match="cudagraph_mode"):
        impl.expected_capture_bars(256, 8192, "full")
    with pytest.raises(ValueError, match="max_num_seqs"):
        impl.expected_capture_bars(0, 8192)


def test_predicted_bars_round_trip_through_the_parser():
    # what expected_capture_bars predicts, drawn as tqdm would draw it, parses back to the same bars
    for bar in impl.expected_capture_bars(256, 8192):
        line = bar_line(bar.kind, bar.mode, [0, bar.total // 2, bar.total], bar.total)
        assert impl.parse_capture_bar(line) == bar


# ---------------------------------------------------------------------------------------------
# Upstream and GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.upstream
def test_log_lines_built_from_upstreams_own_format_strings_parse():
    """Read both literals out of upstream's capture code, build lines with them, parse them."""
    source = (ROOT / "upstream/vllm/v1/worker/gpu_model_runner.py").read_text()
    literals = {n.value for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    desc_fmt = next(s for s in literals if s.startswith("Capturing CUDA graphs"))
    done_fmt = next(s for s in literals if s.startswith("Graph capturing finished"))
    assert (desc_fmt, done_fmt) == (impl.CAPTURE_DESC_FORMAT, impl.CAPTURE_FINISHED_FORMAT)
    line = PROCESS_PREFIX + bar_state(desc_fmt.format("decode", "FULL"), 35, 35)
    assert impl.parse_capture_bar(line) == Bar("decode", "FULL", 35, 35)
    assert impl.parse_capture_finished(LOGGER_PREFIX + done_fmt % (5.0, 0.25)) == impl.CaptureFinished(5.0, 0.25)


@pytest.mark.gpu
def test_piecewise_graphs_are_not_slower_than_eager_and_give_the_same_tokens():
    rows = impl.compare_mini_vllm(batches=(1, 8), steps=8)
    assert [r.batch for r in rows] == [1, 8]
    # SmolLM2's shape: 1,054 launches eager, 61 with piecewise graphs (31 pieces + 30 attention ops);
    # with no GPU time at all the model's ceiling is 1054 / 61: no measurement can beat it
    ceiling = impl.predict_speedup(1054, 5e-6, 0.0, graph_launches=61)
    for row in rows:
        assert row.same_tokens, row
        assert row.graphs_mode == "PIECEWISE", row  # the timed steps really replayed graphs
        assert row.graphs_ms <= row.eager_ms, row
        assert 1.0 <= row.speedup < ceiling, row
