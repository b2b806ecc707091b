"""Lab 05-05 tests: vLLM's capture-size ladder, its lookup table, and the padding it costs."""
from __future__ import annotations

import ast
import contextlib
import io
import itertools
import pathlib
import runpy
from types import SimpleNamespace

import pytest

import course
from course import load_impl

impl = load_impl(__file__)

HERE = pathlib.Path(__file__).resolve().parent
UPSTREAM = course.UPSTREAM

# The ladder at LLM defaults, written out from the rule (not from the code under test):
# 1, 2, 4; 8, 16, ..., 248 (31 rungs); 256, 272, ..., 512 (17 rungs). 3 + 31 + 17 = 51.
DEFAULT_LADDER = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))


def ladder(*args, **kwargs):
    return impl.default_capture_sizes(*args, **kwargs)


# ---------------------------------------------------------------- the ladder


def test_llm_defaults_give_51_rungs_up_to_512():
    assert len(DEFAULT_LADDER) == 51
    got = ladder(256, 8192)
    assert got == DEFAULT_LADDER
    assert type(got) is list and all(type(s) is int for s in got)
    # Cards with >= 70 GiB (not A100): 1024 seqs would allow 2048, but 512 caps it.
    assert ladder(1024, 16384) == DEFAULT_LADDER
    # vllm serve on a small card: 2048 batched tokens is still above 512.
    assert ladder(256, 2048) == DEFAULT_LADDER
    # FULL decode graphs use the rungs <= max_num_seqs (x the decode length): 35 of the 51.
    assert sum(1 for s in got if s <= 256) == 35


def test_small_max_num_seqs_caps_the_ladder_at_twice_the_seqs():
    assert ladder(8, 8192) == [1, 2, 4, 8, 16]  # cap 16
    assert ladder(4, 8192) == [1, 2, 4, 8]  # cap 8: the first multiple of 8 is a rung
    assert ladder(3, 8192) == [1, 2, 4]  # cap 6: no rung between 4 and 6, so the top is 4
    assert ladder(1, 8192) == [1, 2]
    assert ladder(128, 8192) == DEFAULT_LADDER[:35]  # cap 256 exactly: 256 is a rung
    # cap 400: the 16-step rungs stop at 400 (256 + 9 * 16).
    assert ladder(200, 8192) == DEFAULT_LADDER[:34] + list(range(256, 401, 16))
    assert len(ladder(200, 8192)) == 44
    # cap 30 (not a multiple of 8): the 8-step rungs stop at 24.
    assert ladder(15, 8192) == [1, 2, 4, 8, 16, 24]


def test_speculative_tokens_multiply_the_decode_length():
    # 32 seqs x (1 + 3) tokens x 2 = 256: rungs up to 256, 35 of them.
    got = ladder(32, 8192, num_speculative_tokens=3)
    assert got == DEFAULT_LADDER[:35] and got[-1] == 256
    assert ladder(32, 8192) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]  # without: cap 64
    assert ladder(256, 8192, num_speculative_tokens=3) == DEFAULT_LADDER  # 2048, capped at 512
    assert ladder(1, 8192, num_speculative_tokens=1) == [1, 2, 4]  # 1 x 2 x 2
    assert ladder(3, 8192, num_speculative_tokens=2) == [1, 2, 4, 8, 16]  # 3 x 3 x 2 = 18


def test_batched_token_limit_caps_the_ladder_and_is_captured():
    # cap min(128, 512, 100) = 100: rungs to 96, then 100 itself is appended.
    got = ladder(64, 100)
    assert got == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]
    assert len(got) == 16
    assert ladder(64, 64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]  # already a rung: no duplicate
    assert ladder(256, 300) == DEFAULT_LADDER[:37] + [300]  # ..., 256, 272, 288, then 300
    assert ladder(4, 5) == [1, 2, 4, 5]
    assert ladder(1, 1) == [1]
    # The limit is captured only when it binds: 8192 tokens never enter a 512 ladder.
    assert 8192 not in ladder(256, 8192)
    assert ladder(8, 17) == [1, 2, 4, 8, 16]  # cap 16 < 17: 17 is not added


def test_user_max_capture_size_replaces_the_default_cap():
    # No doubling and no 512: a user cap of 1024 keeps 16-step rungs to 1024.
    got = ladder(8, 8192, max_capture_size=1024)
    assert got == [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 1025, 16))
    assert len(got) == 83
    assert ladder(8, 8192, num_speculative_tokens=3, max_capture_size=16) == [1, 2, 4, 8, 16]
    # A cap off the stride is truncated to the last rung below it (upstream logs a warning).
    assert ladder(256, 8192, max_capture_size=23) == [1, 2, 4, 8, 16]
    assert ladder(256, 8192, max_capture_size=100)[-2:] == [88, 96]
    assert ladder(256, 8192, max_capture_size=1) == [1]
    # One below a 16-step rung: 271 keeps 256 as its top (272 would exceed the cap).
    assert ladder(256, 8192, max_capture_size=271)[-2:] == [248, 256]
    assert ladder(256, 271)[-3:] == [248, 256, 271]  # the budget, appended after 256
    # ... but the batched-token limit still wins over the user's cap.
    assert ladder(64, 100, max_capture_size=1024)[-3:] == [88, 96, 100]


def test_interactivity_mode_captures_every_size_up_to_32():
    got = ladder(256, 8192, performance_mode="interactivity")
    assert got[:33] == list(range(1, 33)) + [40]
    assert got == list(range(1, 33)) + list(range(40, 256, 8)) + list(range(256, 513, 16))
    assert len(got) == 76
    assert ladder(8, 8192, performance_mode="interactivity") == list(range(1, 17))
    assert ladder(2, 8192, performance_mode="interactivity") == [1, 2, 3, 4]
    assert ladder(64, 100, performance_mode="interactivity")[-3:] == [88, 96, 100]
    # "throughput" changes the batch defaults, not the ladder rule.
    for args in ((256, 8192), (8, 8192), (64, 100), (32, 8192, 3)):
        assert ladder(*args, performance_mode="throughput") == ladder(*args)


# ---------------------------------------------------------------- padding


def test_padded_size_table_maps_each_size_to_the_next_rung():
    assert impl.padded_size_table([1, 2, 4, 8]) == [0, 1, 2, 4, 4, 8, 8, 8, 8]
    assert impl.padded_size_table([3, 5]) == [0, 3, 3, 3, 5, 5]
    assert impl.padded_size_table((1,)) == [0, 1]
    table = impl.padded_size_table(DEFAULT_LADDER)
    assert len(table) == 513 and table[0] == 0
    assert (table[33], table[249], table[256], table[257], table[511]) == (40, 256, 256, 272, 512)
    assert all(table[s] == s for s in DEFAULT_LADDER)
    # Monotone, and every entry is the smallest rung at or above its index.
    assert all(table[n] == min(s for s in DEFAULT_LADDER if s >= n) for n in range(1, 513))


def test_select_capture_size_pads_up_or_runs_eager():
    assert impl.select_capture_size(33, DEFAULT_LADDER) == 40  # 7 pad rows
    assert impl.select_capture_size(249, DEFAULT_LADDER) == 256
    assert impl.select_capture_size(257, DEFAULT_LADDER) == 272
    assert impl.select_capture_size(512, DEFAULT_LADDER) == 512
    assert impl.select_capture_size(513, DEFAULT_LADDER) is None  # eager
    assert impl.select_capture_size(1, DEFAULT_LADDER) == 1
    assert impl.select_capture_size(3, DEFAULT_LADDER) == 4
    assert impl.select_capture_size(1, [5]) == 5
    assert impl.select_capture_size(6, [5]) is None
    table = impl.padded_size_table(DEFAULT_LADDER)
    assert all(impl.select_capture_size(n, DEFAULT_LADDER) == table[n] for n in range(1, 513))


def test_trace_waste_counts_pad_rows_and_eager_steps():
    # 1 -> 1, 3 -> 4, 33 -> 40, 100 -> 104, 600 -> eager: 0 + 1 + 7 + 4 pad rows.
    t = impl.trace_waste([1, 3, 33, 100, 600], DEFAULT_LADDER)
    assert (t.steps, t.eager_steps, t.real_rows, t.pad_rows) == (5, 1, 737, 12)
    assert t.graphs_used == (1, 4, 40, 104)
    assert t.waste == pytest.approx(12 / 737, abs=1e-15)
    t = impl.trace_waste(iter([600, 513]), DEFAULT_LADDER)  # any iterable
    assert (t.steps, t.eager_steps, t.real_rows, t.pad_rows, t.graphs_used) == (2, 2, 1113, 0, ())
    t = impl.trace_waste([40, 40, 33], DEFAULT_LADDER)  # a graph used twice is one graph
    assert (t.pad_rows, t.graphs_used) == (7, (40,))


def test_waste_is_pad_rows_over_real_rows():
    # One denominator: real rows. 3 -> 4 is 1/3, not 1/4; 33 -> 40 is 7/33, not 7/40.
    assert impl.trace_waste([3], [1, 2, 4]).waste == pytest.approx(1 / 3, abs=1e-15)
    assert impl.trace_waste([33], DEFAULT_LADDER).waste == pytest.approx(7 / 33, abs=1e-15)
    assert impl.trace_waste([8, 16], DEFAULT_LADDER).waste == 0.0


def test_finer_ladder_trades_graphs_for_padding():
    # Every batch size from 1 to 32 once. Balanced pads 3 (1), 5-7 (3+2+1),
    # 9-15, 17-23, 25-31 (28 each): 91 pad rows over 528 real rows, 7 graphs.
    trace = list(range(1, 33))
    coarse = impl.trace_waste(trace, ladder(256, 8192))
    fine = impl.trace_waste(trace, ladder(256, 8192, performance_mode="interactivity"))
    assert (coarse.real_rows, coarse.pad_rows, len(coarse.graphs_used)) == (528, 91, 7)
    assert (fine.real_rows, fine.pad_rows, len(fine.graphs_used)) == (528, 0, 32)


# ---------------------------------------------------------------- given helpers, used


def test_batch_defaults_feed_the_ladder():
    cases = [
        ((22.5, "NVIDIA L4"), (256, 8192)),
        ((22.5, "NVIDIA L4", "serve"), (256, 2048)),
        ((79.2, "NVIDIA H100 80GB HBM3"), (1024, 16384)),
        ((79.2, "NVIDIA H100 80GB HBM3", "serve"), (1024, 8192)),
        ((79.3, "NVIDIA A100-SXM4-80GB"), (256, 8192)),  # A100 excluded by name
        ((70, ""), (1024, 16384)),  # the threshold is inclusive
        ((22.5, "NVIDIA L4", "llm", "throughput"), (512, 16384)),
    ]
    for args, want in cases:
        assert impl.batch_defaults(*args) == want
        assert ladder(*want) == DEFAULT_LADDER  # every default deployment: the same 51 rungs


def test_spec_decode_rounding_of_the_ladder():
    # 3 speculative tokens: the 35 rungs rounded up to multiples of 4 -> 1, 2, 4 merge into 4.
    got = impl.round_capture_sizes_for_spec_decode(ladder(32, 8192, 3), 4)
    assert got == [4] + DEFAULT_LADDER[3:35] and len(got) == 33
    assert impl.round_capture_sizes_for_spec_decode(ladder(8, 8192), 1) == [1, 2, 4, 8, 16]
    # 100 rounds to 102, above the old top rung: dropped. 88 -> 90, 96 stays.
    assert impl.round_capture_sizes_for_spec_decode(ladder(64, 100), 3)[-2:] == [90, 96]


# ---------------------------------------------------------------- errors


def test_bad_arguments_raise_value_error_naming_the_parameter():
    bad = [
        (lambda: ladder(0, 8192), "max_num_seqs"),
        (lambda: ladder(8, 0), "max_num_batched_tokens"),
        (lambda: ladder(64, 63), "max_num_batched_tokens"),
        (lambda: ladder(8, 8192, -1), "num_speculative_tokens"),
        (lambda: ladder(8, 8192, 0, 0), "max_capture_size"),
        (lambda: ladder(8, 8192, performance_mode="fast"), "performance_mode"),
        (lambda: ladder(8.0, 8192), "max_num_seqs"),
        (lambda: ladder(8, 8192.0), "max_num_batched_tokens"),
        (lambda: impl.padded_size_table([]), "capture_sizes"),
        (lambda: impl.padded_size_table([1, 4, 2]), "capture_sizes"),
        (lambda: impl.select_capture_size(0, DEFAULT_LADDER), "n"),
        (lambda: impl.select_capture_size(2, [0, 4]), "capture_sizes"),
        (lambda: impl.trace_waste([], DEFAULT_LADDER), "batch_sizes"),
        (lambda: impl.trace_waste([4, 0], DEFAULT_LADDER), "batch_sizes"),
        (lambda: impl.trace_waste([4], [2, 2]), "capture_sizes"),
    ]
    for call, name in bad:
        with pytest.raises(ValueError, match=name):
            call()
    # The edges themselves are legal.
    assert ladder(64, 64, 0, 1) == [1]
    assert impl.select_capture_size(1, [1]) == 1
    assert impl.trace_waste([1], [1]).pad_rows == 0


# ---------------------------------------------------------------- README and script


def row_summary(sizes):
    if len(sizes) <= 8:
        return ", ".join(map(str, sizes))
    return ", ".join(map(str, sizes[:5])) + ", ..., " + ", ".join(map(str, sizes[-2:]))


# (label, GPU GiB, GPU name, entrypoint, performance mode, overrides, speculative tokens,
#  rounded for FULL spec-decode graphs)
DEPLOYMENTS = [
    ("`LLM(model)` on an L4 (24 GB)", 22.5, "NVIDIA L4", "llm", "balanced", {}, 0, False),
    ("`vllm serve` on an L4", 22.5, "NVIDIA L4", "serve", "balanced", {}, 0, False),
    ("`LLM(model)` on an A100 80GB", 79.3, "NVIDIA A100-SXM4-80GB", "llm", "balanced", {}, 0, False),
    ("`LLM(model)` on an H100 80GB", 79.2, "NVIDIA H100 80GB HBM3", "llm", "balanced", {}, 0, False),
    ("`vllm serve --performance-mode throughput` on an H100", 79.2, "NVIDIA H100 80GB HBM3",
     "serve", "throughput", {}, 0, False),
    ("`vllm serve --performance-mode interactivity` on an H100", 79.2, "NVIDIA H100 80GB HBM3",
     "serve", "interactivity", {}, 0, False),
    ("`vllm serve --max-num-seqs 16` on an L4", 22.5, "NVIDIA L4", "serve", "balanced",
     {"seqs": 16}, 0, False),
    ("`--max-num-seqs 32`, 3 speculative tokens (config)", 22.5, "NVIDIA L4", "serve",
     "balanced", {"seqs": 32}, 3, False),
    ("`--max-num-seqs 32`, 3 speculative tokens (FULL decode graphs)", 22.5, "NVIDIA L4",
     "serve", "balanced", {"seqs": 32}, 3, True),
    ("`--max-num-seqs 64 --max-num-batched-tokens 100`", 22.5, "NVIDIA L4", "serve",
     "balanced", {"seqs": 64, "tokens": 100}, 0, False),
]


def test_readme_deployment_table_matches_the_solution():
    readme = (HERE / "README.md").read_text()
    for label, gib, name, entry, mode, over, spec, rounded in DEPLOYMENTS:
        seqs, tokens = impl.batch_defaults(gib, name, entry, mode)
        seqs, tokens = over.get("seqs", seqs), over.get("tokens", tokens)
        sizes = ladder(seqs, tokens, spec, performance_mode=mode)
        if rounded:
            sizes = impl.round_capture_sizes_for_spec_decode(sizes, 1 + spec)
        row = f"| {label} | {seqs} | {tokens} | {len(sizes)} | {sizes[-1]} | {row_summary(sizes)} |"
        assert row in readme, row


def test_script_prints_the_readme_numbers():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(impl.__file__), run_name="__main__")
    readme = (HERE / "README.md").read_text()
    lines = out.getvalue().splitlines()
    assert len(lines) == 8 and lines[3] == "33 tokens -> 40" and lines[6] == "513 tokens -> None"
    for line in lines:
        assert line in readme, line


# ---------------------------------------------------------------- upstream


def upstream_function(relpath, class_name, method):
    """The FunctionDef of class_name.method in upstream/, compiled alone."""
    tree = ast.parse((UPSTREAM / relpath).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return compile(ast.Module(body=[fn], type_ignores=[]), relpath, "exec")


def run_upstream_ladder(code, seqs, tokens, spec, user_cap, mode):
    none = object()  # CUDAGraphMode.NONE: anything the mode below is not
    ns = {"CUDAGraphMode": SimpleNamespace(NONE=none),
          "logger": SimpleNamespace(warning=lambda *a, **k: None)}
    exec(code, ns)
    cc = SimpleNamespace(cudagraph_mode="FULL_AND_PIECEWISE", max_cudagraph_capture_size=user_cap,
                         cudagraph_capture_sizes=None, pass_config=SimpleNamespace(enable_sp=False),
                         post_init_cudagraph_sizes=lambda: None)
    cfg = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=False), compilation_config=cc,
        scheduler_config=SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=tokens),
        speculative_config=SimpleNamespace(num_speculative_tokens=spec) if spec else None,
        parallel_config=SimpleNamespace(tensor_parallel_size=1), performance_mode=mode)
    ns["_set_cudagraph_sizes"](cfg)
    assert cc.max_cudagraph_capture_size == cc.cudagraph_capture_sizes[-1]
    return cc.cudagraph_capture_sizes


@pytest.mark.upstream
def test_ladder_matches_upstream_set_cudagraph_sizes():
    code = upstream_function("vllm/config/vllm.py", "VllmConfig", "_set_cudagraph_sizes")
    seqs_choices = (1, 2, 3, 4, 8, 15, 32, 64, 100, 128, 200, 256, 1024)
    token_choices = (1, 5, 64, 100, 300, 2048, 8192, 16384)
    configs = [
        (seqs, tokens, spec, cap, mode)
        for seqs, tokens, spec, cap, mode in itertools.product(
            seqs_choices, token_choices, (0, 1, 3), (None, 1, 23, 100, 1024), impl.PERFORMANCE_MODES)
        if tokens >= seqs
    ]
    assert len(configs) == 3285  # 73 (seqs, tokens) pairs with tokens >= seqs, x 3 x 5 x 3
    tops = set()
    for seqs, tokens, spec, cap, mode in configs:
        want = run_upstream_ladder(code, seqs, tokens, spec, cap, mode)
        assert ladder(seqs, tokens, spec, cap, mode) == want, (seqs, tokens, spec, cap, mode)
        tops.add(want[-1])
    assert {1, 16, 96, 100, 256, 512, 1024} <= tops  # the grid reaches every branch


@pytest.mark.upstream
def test_padded_table_matches_upstream_dispatcher():
    code = upstream_function("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher",
                             "_compute_bs_to_padded_graph_size")
    ns = {}
    exec(code, ns)
    for sizes in (DEFAULT_LADDER, [1], [3, 5], ladder(64, 100), ladder(256, 8192, 0, None, "interactivity"),
                  ladder(8, 8192, 0, 1024)):
        cc = SimpleNamespace(max_cudagraph_capture_size=sizes[-1], cudagraph_capture_sizes=list(sizes),
                             compile_sizes=None)
        me = SimpleNamespace(compilation_config=cc, cudagraph_mode=None)
        ns["_compute_bs_to_padded_graph_size"](me)
        assert impl.padded_size_table(sizes) == me._bs_to_padded_graph_size


@pytest.mark.upstream
def test_spec_decode_rounding_matches_upstream():
    code = upstream_function("vllm/config/compilation.py", "CompilationConfig",
                             "adjust_cudagraph_sizes_for_spec_decode")
    ns = {"round_up": lambda x, y: ((x + y - 1) // y) * y}
    exec(code, ns)
    for seqs, tokens, spec in ((32, 8192, 3), (8, 8192, 1), (64, 100, 2), (1, 8192, 4), (2, 8192, 7)):
        sizes = ladder(seqs, tokens, spec)
        cc = SimpleNamespace(cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=sizes[-1],
                             pass_config=SimpleNamespace(enable_sp=False))
        ns["adjust_cudagraph_sizes_for_spec_decode"](cc, 1 + spec, 1)
        assert impl.round_capture_sizes_for_spec_decode(sizes, 1 + spec) == cc.cudagraph_capture_sizes
