"""Lab 05-02 tests: the launch model, the crossover, the step-time floor, real launch counts."""
from __future__ import annotations

import contextlib
import io
import math
import pathlib
import re
from collections import Counter

import pytest

import course
from course import load_impl

impl = load_impl(__file__)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = course.REPO_ROOT
US = 1e-6
MS = 1e-3


def brute_crossover(num_ops, cost, limit=10_000):
    """Independent oracle: walk the calls and compare cumulative launches directly."""
    for k in range(1, limit + 1):
        if cost + (k - 1) < k * num_ops:
            return k
    return None


@pytest.fixture(scope="module")
def measured():
    """Launch counts of one tiny-random decode step, by (layers, batch), forward and whole step.

    One model per depth, reused across batch sizes. About 20 ms of forwards; the first call of the
    attention custom op imports torch._dynamo once (about 1.5 s on a 2-core CPU).
    """
    forward, whole = {}, {}
    for layers in (1, 2, 4):
        model = impl.tiny_random_torch(layers)
        for batch in (1, 4, 16):
            forward[layers, batch] = impl.decode_step_launches(layers, batch, model=model)
        whole[layers] = impl.decode_step_launches(layers, 1, whole_step=True, model=model)
    return forward, whole


# ---------------------------------------------------------------- the launch model


def test_eager_pays_every_op_on_every_call():
    assert impl.eager_launches(1, 3) == 3
    assert impl.eager_launches(100, 3) == 300
    assert impl.eager_launches(7, 1054) == 7378
    assert impl.eager_launches(5, 1) == 5  # one op is a legal function
    assert type(impl.eager_launches(2, 5)) is int


def test_graphs_pay_the_capture_once_then_one_launch_per_call():
    # First call = the capture alone (3 ops issued while recording), no replay on top of it.
    assert impl.graph_launches(1, 3) == 3
    assert impl.graph_launches(2, 3) == 4
    # The lab-01 number: 100 calls of a 3-op function, 3 + 99 = 102 (a replay on the
    # capturing call too would give 103).
    assert impl.graph_launches(100, 3) == 102
    assert impl.graph_launches(1, 1054) == 1054
    assert impl.graph_launches(5, 1) == 5  # one op: capture 1 + 4 replays, no better than eager
    assert type(impl.graph_launches(2, 5)) is int


def test_an_explicit_capture_cost_replaces_the_default_even_when_zero():
    assert impl.graph_launches(100, 3, capture_cost=6) == 105  # warm-up + capture: 2 x 3
    assert impl.graph_launches(100, 3, capture_cost=0) == 99  # `capture_cost or num_ops` gives 102
    assert impl.graph_launches(1, 3, capture_cost=0) == 0
    assert impl.graph_launches(10, 1054, capture_cost=2108) == 2117


def test_graphs_win_from_the_second_call_when_there_is_more_than_one_op():
    for n in (2, 3, 10, 1054):
        assert impl.crossover(n) == 2
        # call 1 ties (both issued n), call 2 is n + 1 against 2n
        assert impl.graph_launches(1, n) == impl.eager_launches(1, n)
        assert impl.graph_launches(2, n) < impl.eager_launches(2, n)


def test_a_one_op_function_never_pays_unless_the_capture_is_free():
    assert impl.crossover(1) is None
    assert impl.crossover(1, 5) is None
    assert impl.crossover(1, 1) is None  # 1 + (k - 1) == k: a tie forever
    assert impl.crossover(1, 0) == 1  # 0 < 1 on the first call


def test_a_tie_is_not_a_win():
    # 3 ops, capture 5: call 2 is 6 against 6, call 3 is 7 against 9.
    assert impl.graph_launches(2, 3, 5) == impl.eager_launches(2, 3) == 6
    assert impl.crossover(3, 5) == 3
    # 10 ops, capture 1000: call 111 ties at 1110; call 112 wins, 1111 < 1120.
    assert impl.crossover(10, 1000) == 112
    assert impl.crossover(2, 2) == 2  # call 1: 2 vs 2; call 2: 3 vs 4


def test_vllm_warmup_plus_capture_moves_the_crossover_to_the_third_call():
    # vLLM runs one eager warm-up before capturing (cudagraph_num_of_warmups = 1), and the
    # capture issues every op again: 2 x num_ops. 2n + k - 1 < k n  <=>  k > (2n - 1) / (n - 1).
    assert impl.crossover(300, 600) == 3
    assert impl.crossover(3, 6) == 3
    assert impl.crossover(2, 4) == 4  # (2*2 - 1) / 1 = 3, so k = 4


def test_crossover_matches_a_call_by_call_walk():
    for n in range(1, 13):
        for cost in range(0, 41):
            assert impl.crossover(n, cost) == brute_crossover(n, cost), (n, cost)
    assert impl.crossover(5, 0) == 1 and impl.crossover(2, 1) == 1  # cheap captures win at once


def test_the_ratio_approaches_num_ops_from_below():
    assert impl.asymptotic_speedup(3) == 3.0 and type(impl.asymptotic_speedup(3)) is float
    assert impl.asymptotic_speedup(1054) == 1054.0
    assert impl.asymptotic_speedup(1) == 1.0
    ratios = [impl.eager_launches(k, 3) / impl.graph_launches(k, 3) for k in (1, 10, 100, 10**6)]
    assert ratios == sorted(ratios) and len(set(ratios)) == 4  # strictly rising
    assert all(r < impl.asymptotic_speedup(3) for r in ratios)
    assert ratios[0] == 1.0 and ratios[2] == pytest.approx(300 / 102)
    assert ratios[-1] == pytest.approx(3.0, rel=1e-5)


def test_launch_model_rejects_bad_arguments():
    for call, name in [(lambda: impl.eager_launches(0, 3), "k"),
                       (lambda: impl.eager_launches(2, 0), "num_ops"),
                       (lambda: impl.eager_launches(True, 3), "k"),
                       (lambda: impl.graph_launches(0, 3), "k"),
                       (lambda: impl.graph_launches(2, 0), "num_ops"),
                       (lambda: impl.graph_launches(2, 3, -1), "capture_cost"),
                       (lambda: impl.graph_launches(2, 3, 1.5), "capture_cost"),
                       (lambda: impl.graph_launches(2, 2.0), "num_ops"),
                       (lambda: impl.crossover(0), "num_ops"),
                       (lambda: impl.crossover(3, -1), "capture_cost"),
                       (lambda: impl.crossover(1, -1), "capture_cost"),
                       (lambda: impl.asymptotic_speedup(0), "num_ops"),
                       (lambda: impl.asymptotic_speedup(2.5), "num_ops")]:
        with pytest.raises(ValueError, match=name):
            call()
    with pytest.raises(ValueError, match=r"k must be an integer >= 1, got 0"):
        impl.graph_launches(0, 3)


# ---------------------------------------------------------------- the step-time floor


def test_step_time_floor_is_the_slower_of_cpu_and_gpu():
    # SmolLM2 depth in mini_vllm: 1,054 launches x 5 us = 5.27 ms, no GPU time given.
    assert impl.step_time_floor(1054, 5 * US) == pytest.approx(5.27 * MS, rel=1e-12)
    # The guide's Qwen2.5-0.5B, batch 1: 244 x 5 us = 1,220 us of CPU, GPU floor 299 us.
    assert impl.step_time_floor(244, 5 * US, 299 * US) == pytest.approx(1220 * US, rel=1e-12)
    # The guide's Llama-3.1-8B: 324 x 5 us = 1,620 us of CPU under a 4,833 us GPU floor.
    assert impl.step_time_floor(324, 5 * US, 4833 * US) == pytest.approx(4833 * US, rel=1e-12)
    # Piecewise graphs at SmolLM2 depth: 61 launches.
    assert impl.step_time_floor(61, 5 * US) == pytest.approx(305 * US, rel=1e-12)
    assert impl.step_time_floor(0, 5 * US) == 0.0
    assert impl.step_time_floor(10, 0, 2 * US) == 2 * US
    assert type(impl.step_time_floor(3, 1)) is float and impl.step_time_floor(3, 1) == 3.0


def test_step_time_floor_rejects_bad_arguments():
    for args, name in [((-1, 5 * US), "num_launches"), ((1.5, 5 * US), "num_launches"),
                       ((True, 5 * US), "num_launches"),
                       ((10, -1 * US), "per_launch_s"), ((10, math.nan), "per_launch_s"),
                       ((10, math.inf), "per_launch_s"), ((10, "5us"), "per_launch_s"),
                       ((10, 5 * US, -1.0), "gpu_time_s"), ((10, 5 * US, math.nan), "gpu_time_s"),
                       ((10, 5 * US, math.inf), "gpu_time_s"), ((10, 5 * US, None), "gpu_time_s")]:
        with pytest.raises(ValueError, match=name):
            impl.step_time_floor(*args)


# ---------------------------------------------------------------- fitting real counts


def test_fit_is_exact_and_order_free():
    assert impl.fit_launch_counts({4: 144, 1: 39, 2: 74}) == (4, 35)
    assert impl.fit_launch_counts({2: 74, 4: 144}) == (4, 35)  # not "the count at 1 layer minus 35"
    assert impl.fit_launch_counts({4: 152, 1: 47}) == (12, 35)
    assert impl.fit_launch_counts({3: 10, 5: 10}) == (10, 0)
    assert impl.fit_launch_counts({1: 0, 7: 0}) == (0, 0)
    per_step, per_layer = impl.fit_launch_counts({1: 39, 2: 74})
    assert type(per_step) is int and type(per_layer) is int


def test_fit_rejects_counts_that_are_not_one_line():
    bad = [{1: 39, 2: 75, 4: 144},  # the middle point is off the line through the ends
           {1: 39, 3: 74},  # slope 17.5: not a whole number of launches per layer
           {1: 39},  # one depth fixes no slope
           {},
           {0: 4, 1: 39},  # zero layers is not a depth
           {1: -1, 2: 3},
           {True: 39, 2: 74},
           {1: 39.0, 2: 74},
           {2: 10, 3: 20}]  # -10 + 10 L: negative launches outside the layers
    for counts in bad:
        with pytest.raises(ValueError, match="counts"):
            impl.fit_launch_counts(counts)
    with pytest.raises(ValueError, match="counts"):
        impl.fit_launch_counts([(1, 39), (2, 74)])  # pairs, not a mapping


def test_mini_vllm_decode_step_launches_are_linear_in_layers_and_flat_in_batch(measured):
    forward, whole = measured
    # Counted today on mini_vllm's torch model (the pinned numbers the README quotes):
    for batch in (1, 4, 16):
        assert [forward[layers, batch] for layers in (1, 2, 4)] == [39, 74, 144]
    per_step, per_layer = impl.fit_launch_counts({n: forward[n, 1] for n in (1, 2, 4)})
    assert (per_step, per_layer) == (4, 35)
    # execute() adds the LM head path: the logits row pick, a final RMSNorm (6 ops), the matmul.
    assert whole == {1: 47, 2: 82, 4: 152}
    assert impl.fit_launch_counts(whole) == (12, 35)


def test_what_one_layer_launches(measured):
    # The 35 ops one decoder layer adds (2 layers minus 1 layer), by name. RMSNorm is 6 unfused
    # ops (x*x, mean, +eps, sqrt, divide, *weight), RoPE 7 per tensor (4 mul, sub, add, cat),
    # attention 1 (the custom op; the ops inside it run below the counter).
    names = {layers: Counter(impl.decode_step_ops(layers, 1)) for layers in (1, 2)}
    per_layer = names[2] - names[1]
    assert per_layer == Counter({
        "aten.mul.Tensor": 13, "aten.add.Tensor": 6, "aten.matmul.default": 4, "aten.mean.dim": 2,
        "aten.sqrt.default": 2, "aten.div.Tensor": 2, "aten.sub.Tensor": 2, "aten.cat.default": 2,
        "aten.silu.default": 1, "mini_vllm.unified_attention.default": 1})
    assert impl.fit_launch_counts({1: sum(names[1].values()), 2: sum(names[2].values())}) == (
        4, sum(per_layer.values()))


def test_given_helpers_refuse_bad_arguments_and_the_measurement_feeds_the_floor():
    with pytest.raises(ValueError, match="num_layers"):
        impl.tiny_random_torch(0)
    with pytest.raises(ValueError, match="batch_size"):
        impl.decode_step_launches(1, 17)
    with pytest.raises(ValueError, match="batch_size"):
        impl.decode_step_launches(1, 0)
    with pytest.raises(ValueError, match="n must"):
        impl.measure_dispatch_overhead(0)
    per_op = impl.measure_dispatch_overhead(200)  # machine-dependent: only its type and sign
    assert isinstance(per_op, float) and per_op > 0
    assert impl.step_time_floor(1054, per_op) == pytest.approx(1054 * per_op, rel=1e-12)


# ---------------------------------------------------------------- PIECEWISE and SmolLM2


def test_piecewise_graphs_replay_each_piece_and_launch_each_attention_op():
    # tiny-random (2 layers): 3 pieces + 2 attention ops = the 5 submodules mini_vllm's backend
    # splits it into; 74 launches become 5.
    assert impl.piecewise_launches(74, 2) == 5
    # SmolLM2 depth: 31 pieces + 30 attention ops.
    assert impl.piecewise_launches(1054, 30) == 61
    assert impl.piecewise_launches(5, 2) == 5  # the fewest ops that leave every piece non-empty
    assert impl.piecewise_launches(39, 0) == 1  # nothing to split out: one graph for the step
    assert impl.piecewise_launches(1, 0) == 1
    for args, name in [((4, 2), "num_attention_ops"), ((0, 0), "^num_ops must"),
                       ((10, -1), "num_attention_ops"), ((10.0, 1), "num_ops"),
                       ((10, True), "num_attention_ops")]:
        with pytest.raises(ValueError, match=name):
            impl.piecewise_launches(*args)


def smollm2_derivation(measured):
    """The README's derived numbers, from the measured counts and the calculator."""
    forward, _ = measured
    per_step, per_layer = impl.fit_launch_counts({n: forward[n, 1] for n in (1, 2, 4)})
    eager = per_step + per_layer * impl.SMOLLM2_NUM_LAYERS
    graphs = impl.piecewise_launches(eager, impl.SMOLLM2_NUM_LAYERS)
    return eager, graphs


def test_smollm2_depth_derived_numbers(measured):
    eager, graphs = smollm2_derivation(measured)
    assert impl.SMOLLM2_NUM_LAYERS == 30 and impl.ASSUMED_LAUNCH_S == 5e-6
    assert (eager, graphs, eager - graphs) == (1054, 61, 993)
    assert impl.step_time_floor(eager, impl.ASSUMED_LAUNCH_S) == pytest.approx(5.27 * MS)
    assert impl.step_time_floor(eager + 8, impl.ASSUMED_LAUNCH_S) == pytest.approx(5.31 * MS)
    saved = impl.step_time_floor(eager, 5 * US) - impl.step_time_floor(graphs, 5 * US)
    assert saved == pytest.approx(4.965 * MS)
    # graphs pay for themselves from the 2nd call (3rd with vLLM's warm-up), and approach 1,054x
    assert impl.crossover(eager) == 2 and impl.crossover(eager, 2 * eager) == 3
    assert impl.asymptotic_speedup(eager) == 1054.0


# ---------------------------------------------------------------- the README agrees


def _table(text, header_start):
    """Rows (lists of cell strings) of the markdown table whose header begins with header_start."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _ms(cell):
    return float(re.fullmatch(r"([\d.]+) ms", cell).group(1))


def test_readme_h200_table_matches_the_benchmark_and_the_calculator(measured):
    readme = (HERE / "README.md").read_text()
    rows = _table(readme, "| batch | eager (captured)")
    assert [row[0] for row in rows] == ["1", "8", "64"]
    # The captured columns are quoted exactly from mini_vllm/BENCHMARKS.md.
    bench = {r[0]: r for r in _table((ROOT / "mini_vllm" / "BENCHMARKS.md").read_text(),
                                      "| batch | eager | `VLLM_COMPILE` |")}
    eager, graphs = smollm2_derivation(measured)
    removed = eager - graphs
    for batch, eager_ms, graph_ms, saved_ms, predicted_ms, floor_ms, implied_us in rows:
        assert eager_ms == bench[batch][1] and graph_ms == bench[batch][3]
        saved = _ms(eager_ms) - _ms(graph_ms)
        assert _ms(saved_ms) == pytest.approx(saved, abs=0.005)
        predicted = (impl.step_time_floor(eager, impl.ASSUMED_LAUNCH_S)
                     - impl.step_time_floor(graphs, impl.ASSUMED_LAUNCH_S))
        assert _ms(predicted_ms) == pytest.approx(predicted / MS, abs=0.0005)
        floor = impl.step_time_floor(eager, impl.ASSUMED_LAUNCH_S)
        assert _ms(floor_ms) == pytest.approx(floor / MS, abs=0.0005)
        assert floor / MS <= _ms(eager_ms)  # a floor, so never above what was measured
        assert float(implied_us) == pytest.approx(saved * 1e3 / removed, abs=0.005)


def test_script_prints_the_readme_numbers():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        impl.main()
    lines = out.getvalue().splitlines()
    readme = (HERE / "README.md").read_text()
    shown = readme.split("## What you should see", 1)[1]
    block = shown.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert lines[:5] == block[:5]
    # The last line is a timing of this machine: its shape only.
    assert re.fullmatch(r"this CPU: [\d.]+ us per tiny torch add \(measured, machine-dependent\); "
                        r"1,054 such ops = [\d.]+ ms", lines[5])
    assert len(lines) == 6
