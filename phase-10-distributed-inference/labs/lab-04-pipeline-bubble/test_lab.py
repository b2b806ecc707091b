"""Lab 10-04 tests: ticks and bubble, the schedule grid, vLLM's PP pieces, a real pipeline."""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mini_vllm.distributed import run_in_processes  # noqa: E402

IDLE = -1

# ---------------------------------------------------------------- ticks and bubble


def test_total_ticks():
    # the last micro-batch (m - 1) enters stage 0 at tick m - 1 and leaves stage p - 1
    # at tick (p - 1) + (m - 1): p + m - 1 ticks in all
    assert impl.pipeline_total_ticks(4, 1) == 4
    assert impl.pipeline_total_ticks(4, 8) == 11
    assert impl.pipeline_total_ticks(1, 5) == 5
    assert impl.pipeline_total_ticks(8, 63) == 70


def test_bubble_formula():
    assert impl.bubble_fraction(1, 7) == 0.0                  # one stage never waits
    assert impl.bubble_fraction(4, 1) == 0.75                 # 3 of 4 stages idle at any tick
    assert impl.bubble_fraction(4, 4) == pytest.approx(3 / 7, rel=1e-15)
    assert impl.bubble_fraction(2, 3) == 0.25
    assert impl.bubble_fraction(8, 63) == pytest.approx(0.1, rel=1e-15)
    # m >> p: the bubble vanishes like (p - 1) / m
    assert impl.bubble_fraction(4, 10_000) == pytest.approx(3 / 10_003, rel=1e-15)
    assert impl.bubble_fraction(4, 10_000) < 1e-3


def test_schedule_grid_by_hand():
    grid = impl.simulate_schedule(3, 2)
    assert grid.shape == (3, 4) and grid.dtype == np.int64
    assert grid.tolist() == [[0, 1, IDLE, IDLE],
                             [IDLE, 0, 1, IDLE],
                             [IDLE, IDLE, 0, 1]]


@pytest.mark.parametrize("p,m", [(1, 1), (1, 4), (2, 3), (4, 1), (4, 4), (8, 5), (3, 10)])
def test_schedule_grid_matches_the_formula(p, m):
    grid = impl.simulate_schedule(p, m)
    assert grid.shape == (p, p + m - 1)
    idle = int((grid == IDLE).sum())
    # idle cells / all cells is the bubble, exactly: p (p - 1) idle of p (p + m - 1)
    assert idle == p * (p - 1)
    assert idle / grid.size == pytest.approx(impl.bubble_fraction(p, m), rel=1e-15)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 4), (8, 5)])
def test_every_microbatch_visits_every_stage_once_in_order(p, m):
    grid = impl.simulate_schedule(p, m)
    for b in range(m):
        stages, ticks = np.nonzero(grid == b)
        # once per stage, stage s strictly after stage s - 1, and as early as possible
        assert stages.tolist() == list(range(p))
        assert ticks.tolist() == [s + b for s in range(p)]
    # a stage processes its micro-batches in order 0, 1, ..., m - 1
    for s in range(p):
        assert grid[s][grid[s] != IDLE].tolist() == list(range(m))


def test_min_microbatches_for_a_bubble_budget():
    # p = 8, 10%: 7 / (7 + m) <= 0.1 <=> m >= 63, and at m = 63 the bubble is exactly 0.1
    assert impl.min_microbatches_for_bubble(8, 0.10) == 63
    assert impl.bubble_fraction(8, 62) > 0.10
    assert impl.min_microbatches_for_bubble(4, 0.20) == 12      # 3 / 15 = 0.2
    assert impl.min_microbatches_for_bubble(2, 0.5) == 1        # 1 / 2 already
    assert impl.min_microbatches_for_bubble(1, 0.01) == 1       # no bubble at all
    assert impl.min_microbatches_for_bubble(16, 0.05) == 285    # 15 / 300 = 0.05


def test_min_microbatches_agrees_with_the_float_comparison():
    # a closed form through ceil lands one too high on float roundings: 3 x (1 - 0.2) / 0.2
    # is 12.000000000000002 in float64 (ceil 13), while 3 / (3 + 12) <= 0.2 holds;
    # 7 x (1 - 0.7) / 0.7 gives ceil 4, while 7 / (7 + 3) = 0.7 <= 0.7 holds
    assert impl.min_microbatches_for_bubble(4, 0.2) == 12
    assert impl.min_microbatches_for_bubble(8, 0.7) == 3
    # 19 x 0.05 / 0.95 is 1.0000000000000002 (ceil 2), while 19 / 20 = 0.95 meets 0.95
    assert impl.min_microbatches_for_bubble(20, 0.95) == 1
    for p in (2, 3, 4, 8, 16):
        for budget in (0.05, 0.1, 0.2, 0.3, 0.7):
            m = impl.min_microbatches_for_bubble(p, budget)
            assert impl.bubble_fraction(p, m) <= budget, (p, budget)
            assert m == 1 or impl.bubble_fraction(p, m - 1) > budget, (p, budget)


def test_min_microbatches_is_computed_not_counted():
    # 7 / (7 + m) <= 1e-9 needs m = 6,999,999,993 (7 / 7,000,000,000 = 1e-9 exactly in
    # float64); counting up from m = 1 would take hours, the closed form a few steps
    m = impl.min_microbatches_for_bubble(8, 1e-9)
    assert m == 6_999_999_993
    assert impl.bubble_fraction(8, m) <= 1e-9 < impl.bubble_fraction(8, m - 1)


# ---------------------------------------------------------------- vLLM's pieces


def test_layers_per_stage_like_get_pp_indices():
    def parts(n, p):
        ranges = [impl.pp_layer_range(n, r, p) for r in range(p)]
        # contiguous, in order, covering [0, n)
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        return [e - s for s, e in ranges]
    assert parts(32, 4) == [8, 8, 8, 8]
    assert parts(7, 2) == [4, 3]                   # the extra layer is not on the last stage
    assert parts(10, 4) == [2, 3, 3, 2]            # 2 extra: the two stages before the last
    assert parts(11, 4) == [3, 3, 3, 2]            # 3 extra: every stage but the last
    assert parts(30, 8) == [3, 4, 4, 4, 4, 4, 4, 3]
    assert parts(5, 1) == [5]


def test_max_concurrent_batches():
    assert impl.max_concurrent_batches(1, False) == 1
    assert impl.max_concurrent_batches(1, True) == 2     # async scheduling without PP
    assert impl.max_concurrent_batches(2, False) == 2
    assert impl.max_concurrent_batches(4, True) == 4     # PP needs pp_size batches in flight
    assert impl.max_concurrent_batches(8, False) == 8


def test_output_rank_is_first_rank_of_last_stage():
    assert impl.output_rank(8, 4) == 24                 # upstream's own example: 32 - 8
    assert impl.output_rank(1, 1) == 0
    assert impl.output_rank(4, 1) == 0                  # TP only: rank 0
    assert impl.output_rank(1, 4) == 3                  # PP only: the last rank
    assert impl.output_rank(2, 3, pcp_size=2) == 8      # world 12, last stage = ranks 8..11


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="p must be an integer >= 1"):
        impl.pipeline_total_ticks(0, 4)
    with pytest.raises(ValueError, match="m must be an integer >= 1"):
        impl.bubble_fraction(4, 0)
    with pytest.raises(ValueError, match="m must be"):
        impl.simulate_schedule(2, 1.0)
    with pytest.raises(ValueError, match=r"budget must be a number in \(0, 1\)"):
        impl.min_microbatches_for_bubble(8, 0.0)
    with pytest.raises(ValueError, match="budget"):
        impl.min_microbatches_for_bubble(8, 1.0)
    with pytest.raises(ValueError, match="p must be"):
        impl.min_microbatches_for_bubble(True, 0.1)
    with pytest.raises(ValueError, match="num_layers must be an integer >= 4"):
        impl.pp_layer_range(3, 0, 4)
    with pytest.raises(ValueError, match="pp_rank must be < pp_size = 4"):
        impl.pp_layer_range(8, 4, 4)
    with pytest.raises(ValueError, match="pp_rank"):
        impl.pp_layer_range(8, -1, 4)
    with pytest.raises(ValueError, match="pp_size must be an integer >= 1"):
        impl.pp_layer_range(8, 0, 0)
    with pytest.raises(ValueError, match="pp_size"):
        impl.max_concurrent_batches(0, True)
    with pytest.raises(ValueError, match="tp_size"):
        impl.output_rank(0, 4)
    with pytest.raises(ValueError, match="pp_size must be an integer >= 1"):
        impl.output_rank(8, 0)
    with pytest.raises(ValueError, match="pcp_size"):
        impl.output_rank(8, 4, pcp_size=0)
    x = np.zeros((4, 3))
    with pytest.raises(ValueError, match="num_microbatches must be <= tokens = 4"):
        impl.pipeline_forward(0, 1, [], x, 5)
    with pytest.raises(ValueError, match="num_microbatches"):
        impl.pipeline_forward(0, 1, [], x, 0)
    with pytest.raises(ValueError, match="x must be a 2-D float64 array"):
        impl.pipeline_forward(0, 1, [], x.astype(np.float32), 2)


# ---------------------------------------------------------------- a real pipeline


def test_single_stage_pipeline_is_the_model():
    # world 1 needs no process group: stage 0 is also the last stage
    layers = impl.make_mlp_stack(3, 8, seed=2)
    x = np.random.default_rng(3).standard_normal((5, 8))
    res = impl.pipeline_forward(0, 1, layers, x, 2)
    assert res["layers"] == (0, 3) and res["sent"] == 0 and res["received"] == 0
    np.testing.assert_array_equal(res["output"], impl.apply_layers(layers, x))
    # one micro-batch, and one per token (6 tokens of width 4: more tokens than width),
    # from a nested list: any m in [1, tokens] and anything np.asarray makes float64
    small = impl.make_mlp_stack(2, 4, seed=4)
    x6 = np.random.default_rng(5).standard_normal((6, 4))
    for m in (1, 6):
        res = impl.pipeline_forward(0, 1, small, x6.tolist(), m)
        np.testing.assert_allclose(res["output"], impl.apply_layers(small, x6), rtol=0, atol=1e-12)


def test_real_two_stage_pipeline_over_gloo_equals_the_unsplit_model():
    # 7 layers over 2 forked processes: stage 0 holds layers 0-3, stage 1 layers 4-6;
    # 10 tokens in 4 micro-batches of 3, 3, 2, 2 rows, each sent once from rank 0 to 1
    layers = impl.make_mlp_stack(7, 16, seed=0)
    x = np.random.default_rng(1).standard_normal((10, 16))
    res = run_in_processes(2, impl.pipeline_forward, layers, x, 4, timeout=60.0)
    assert res[0]["layers"] == (0, 4) and res[1]["layers"] == (4, 7)
    assert (res[0]["sent"], res[0]["received"]) == (4, 0)
    assert (res[1]["sent"], res[1]["received"]) == (0, 4)
    assert res[0]["output"] is None
    dense = impl.apply_layers(layers, x)
    out = res[1]["output"]
    assert out.shape == (10, 16) and out.dtype == np.float64
    # float64 rows computed the same way in both: equal to the last bit here (measured 0.0);
    # the tolerance only allows BLAS blocking to differ between row counts
    np.testing.assert_allclose(out, dense, rtol=0, atol=1e-12)
    # the pipeline really transformed x through all 7 layers (not 4, not 3)
    assert np.abs(out - impl.apply_layers(layers[:4], x)).max() > 0.1
