"""Lab 07-04 tests: expert loads, EP step time, capacity drops, and vLLM's EPLB bit for bit."""
from __future__ import annotations

import ast
import types

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
EPLB_DEFAULT = UPSTREAM / "vllm/distributed/eplb/policy/default.py"
EXPERT_MAP = UPSTREAM / "vllm/model_executor/layers/fused_moe/expert_map_manager.py"

# The capacity fixture: 64 tokens, top-2, 8 experts -> 128 assignments, a fair share of 16.
# Expert 0 is picked by every token (64, the most a distinct top-k allows).
SKEWED = [64, 30, 10, 8, 6, 4, 4, 2]
# Same 128 assignments, max 48 over a mean of 16: imbalance exactly 3.
THREE_X = [48, 16, 16, 12, 12, 8, 8, 8]


# ---------------------------------------------------------------- loads and imbalance


def test_loads_count_each_expert_once_per_token():
    topk_ids = np.array([[0, 2], [2, 1], [0, 2], [1, 0]])
    loads = impl.expert_loads(topk_ids, 5)
    assert loads.dtype == np.int64
    # experts 3 and 4 were never picked and still get their 0 (5 entries, not 3)
    assert loads.tolist() == [3, 2, 3, 0, 0]
    assert loads.sum() == 4 * 2
    # an empty batch is allowed: nothing routed, all zeros
    assert impl.expert_loads(np.zeros((0, 2), dtype=np.int64), 3).tolist() == [0, 0, 0]


def test_a_hot_expert_never_exceeds_the_token_count():
    # a router biased hard toward expert 0: every one of the 64 tokens takes it, and the
    # other pick is spread over the rest. Distinct top-k caps expert 0 at T = 64, so at
    # capacity 16 expert 0 alone drops at most 64 - 16 = 48 of the 128 assignments.
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 8))
    logits[:, 0] += 100.0
    topk_ids = np.argsort(-logits, axis=1)[:, :2]
    loads = impl.expert_loads(topk_ids, 8)
    assert loads.tolist() == [64, 11, 4, 12, 12, 11, 7, 7]
    assert impl.dropped_tokens(loads, 1.0, 64, 2, 8) == 48


def test_imbalance_is_max_over_mean():
    assert impl.imbalance(THREE_X) == 3.0  # 48 / 16; (max - mean) / mean would be 2
    assert impl.imbalance([16] * 8) == 1.0
    # one expert takes everything: the worst case equals the number of experts (max/min: inf)
    assert impl.imbalance([0, 0, 5, 0]) == 4.0
    assert impl.imbalance(SKEWED) == 4.0
    assert isinstance(impl.imbalance([1, 2, 3]), float)
    assert impl.imbalance([1, 2, 3]) == 1.5


# ---------------------------------------------------------------- placement and step time


def test_linear_and_round_robin_placements():
    assert impl.expert_placement(8, 4, "linear").tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert impl.expert_placement(8, 4, "round_robin").tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # 10 experts on 4 devices: base 2, remainder 2. The *first* two devices take one extra
    # each (3, 3, 2, 2), as the code does; the function's docstring says "the last rank",
    # which would give 2, 2, 2, 4.
    assert impl.expert_placement(10, 4, "linear").tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert impl.expert_placement(10, 4, "round_robin").tolist() == [0, 1, 2, 3] * 2 + [0, 1]
    assert impl.expert_placement(5, 1).tolist() == [0] * 5  # linear is the default
    assert impl.expert_placement(3, 3).dtype == np.int64


def test_step_time_follows_the_busiest_device():
    # one expert per device: the step time is the hottest expert's load
    hot = impl.ep_step_time(THREE_X, 8)
    even = impl.ep_step_time([16] * 8, 8)
    assert (hot, even) == (48.0, 16.0)
    # same 128 assignments, imbalance 3: three times the balanced step
    assert hot / even == impl.imbalance(THREE_X) == 3.0
    # 4 devices: linear pairs (0,1) (2,3) (4,5) (6,7) -> 64, 28, 20, 16;
    # round robin pairs (0,4) (1,5) (2,6) (3,7) -> 60, 24, 24, 20
    assert impl.ep_step_time(THREE_X, 4, "linear") == 64.0
    assert impl.ep_step_time(THREE_X, 4, "round_robin") == 60.0
    assert impl.ep_step_time(SKEWED, 4, "linear", time_per_assignment=0.5) == 47.0  # 94 / 2
    assert impl.ep_step_time(SKEWED, 4, "round_robin") == 70.0  # 64 + 6
    assert impl.ep_step_time([0, 0, 0], 3) == 0.0  # an idle layer is allowed here


# ---------------------------------------------------------------- capacity and drops


def test_capacity_is_floor_of_cf_times_fair_share():
    assert impl.expert_capacity(1.0, 64, 2, 8) == 16  # 64 * 2 / 8; without k it would be 8
    assert impl.expert_capacity(1.25, 64, 2, 8) == 20
    assert impl.expert_capacity(1.1, 64, 2, 8) == 17  # 17.6 floors to 17 (ceil/round: 18)
    assert impl.expert_capacity(0.5, 10, 1, 4) == 1  # 1.25
    assert impl.expert_capacity(2.0, 7, 3, 5) == 8  # 8.4
    assert isinstance(impl.expert_capacity(1.0, 64, 2, 8), int)


def test_dropped_tokens_on_the_pinned_skew():
    # capacity 16: expert 0 drops 64 - 16 = 48, expert 1 drops 30 - 16 = 14, the rest fit
    assert impl.dropped_tokens(SKEWED, 1.0, 64, 2, 8) == 62
    assert impl.dropped_tokens(SKEWED, 2.0, 64, 2, 8) == 32  # capacity 32: 64 - 32 only
    assert impl.dropped_tokens(SKEWED, 4.0, 64, 2, 8) == 0  # capacity 64 holds everything
    assert impl.dropped_tokens([16] * 8, 1.0, 64, 2, 8) == 0  # balanced: nothing lost
    # capacity 17 (17.6 floored): 47 + 13
    assert impl.dropped_tokens(SKEWED, 1.1, 64, 2, 8) == 60
    assert isinstance(impl.dropped_tokens(SKEWED, 1.0, 64, 2, 8), int)


def test_impossible_loads_are_refused():
    # "60% of 128 assignments to one expert" is 77 > 64 tokens: no distinct top-k gives it
    loads = [77, 30, 9, 4, 4, 2, 1, 1]
    assert sum(loads) == 128
    with pytest.raises(ValueError, match="loads"):
        impl.dropped_tokens(loads, 1.0, 64, 2, 8)
    with pytest.raises(ValueError, match="loads"):  # sums to 127, not T * k
        impl.dropped_tokens([63, 30, 10, 8, 6, 4, 4, 2], 1.0, 64, 2, 8)
    with pytest.raises(ValueError, match="loads"):  # 7 entries for 8 experts
        impl.dropped_tokens([64, 30, 10, 8, 6, 6, 4], 1.0, 64, 2, 8)
    with pytest.raises(ValueError, match="loads"):  # not integers
        impl.dropped_tokens([64, 29.5, 10.5, 8, 6, 4, 4, 2], 1.0, 64, 2, 8)


# ---------------------------------------------------------------- EPLB by hand


def test_replicate_the_heaviest_per_replica_load():
    # 4 extra replicas for SKEWED. Load per replica, step by step:
    #   64 -> expert 0 (2 copies, 32 each); 32 -> expert 0 again (3, 21.3);
    #   30 -> expert 1 (2, 15); 21.3 -> expert 0 (4, 16).
    # Replicating by raw weight would copy expert 0 four times; ranking by w / (cnt + 1)
    # would pick 0, 0, 0, 1.
    phy2log, logcnt = impl.replicate_experts([SKEWED], 12)
    assert phy2log.dtype == np.int64 and logcnt.dtype == np.int64
    assert phy2log.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 1, 0]]
    assert logcnt.tolist() == [[4, 2, 1, 1, 1, 1, 1, 1]]
    # a tie goes to the first expert (np.argmax), then the other one's turn comes
    phy2log, logcnt = impl.replicate_experts([[6, 6, 3]], 5)
    assert phy2log.tolist() == [[0, 1, 2, 0, 1]] and logcnt.tolist() == [[2, 2, 1]]
    # no extra slots: the identity, one replica each; rows are independent layers
    phy2log, logcnt = impl.replicate_experts([[1, 2], [9, 1]], 3)
    assert phy2log.tolist() == [[0, 1, 1], [0, 1, 0]]
    assert impl.replicate_experts([[3, 1, 2]], 3)[0].tolist() == [[0, 1, 2]]


def test_packing_fills_the_lightest_pack_that_has_room():
    # [5, 1, 4, 2] into 2 packs of 2: 5 -> pack 0 (a tie at 0 goes to the lower index),
    # 4 -> pack 1, 2 -> pack 1 (4 < 5, now full), 1 -> pack 0. Sums 6 and 6.
    pack, rank = impl.balanced_packing([[5, 1, 4, 2]], 2)
    assert pack.tolist() == [[0, 0, 1, 1]] and rank.tolist() == [[0, 1, 0, 1]]
    assert pack.dtype == np.int64 and rank.dtype == np.int64
    # a full pack is closed even when it is the lightest: 10 -> 0, 3 -> 1, 2 -> 1 (full),
    # and 1 must go to pack 0 (ignoring "full" would put a third item in pack 1)
    pack, rank = impl.balanced_packing([[10, 1, 2, 3]], 2)
    assert pack.tolist() == [[0, 0, 1, 1]] and rank.tolist() == [[0, 1, 1, 0]]
    # heaviest first: 9 -> 0, 3 -> 1, 2 -> 1, 1 -> 0 (sums 10 and 5). Lightest first would
    # give 1 -> 0, 2 -> 1, 3 -> 0, 9 -> 1 (sums 4 and 11)
    pack, _ = impl.balanced_packing([[1, 2, 3, 9]], 2)
    assert pack.tolist() == [[0, 1, 1, 0]]


def test_one_item_per_pack_is_the_identity():
    # upstream short-cuts n == num_packs: item j -> pack j, no sorting (greedy would put the
    # heaviest item, 9, in pack 0)
    pack, rank = impl.balanced_packing([[1, 9, 5]], 3)
    assert pack.tolist() == [[0, 1, 2]] and rank.tolist() == [[0, 0, 0]]
    pack, rank = impl.balanced_packing([[1, 9, 5], [3, 3, 0]], 1)  # one pack takes all
    assert pack.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert sorted(rank[0].tolist()) == [0, 1, 2]
    assert rank[0].tolist() == [2, 0, 1]  # ranked by weight: 9 first, then 5, then 1


def test_packing_invariants_on_random_rows():
    rng = np.random.default_rng(3)
    w = rng.exponential(size=(5, 24))
    pack, rank = impl.balanced_packing(w, 6)
    for row in range(5):
        for p in range(6):
            members = pack[row] == p
            assert members.sum() == 4
            assert sorted(rank[row, members].tolist()) == [0, 1, 2, 3]
    # greedy keeps the heaviest pack within one (largest) item of the lightest
    sums = np.stack([np.bincount(pack[r], weights=w[r], minlength=6) for r in range(5)])
    assert np.all(sums.max(axis=1) - sums.min(axis=1) <= w.max(axis=1))


def test_eplb_cuts_the_pinned_skew():
    # before: 8 experts, 2 per GPU on 4 GPUs (linear) -> 94, 18, 10, 6: max/mean 94/32
    before = impl.replica_gpu_loads([SKEWED], [list(range(8))], 4)
    assert before.tolist() == [[94.0, 18.0, 10.0, 6.0]]
    assert impl.imbalance(before[0]) == 2.9375
    assert before[0].max() == impl.ep_step_time(SKEWED, 4, "linear")
    # after: 12 slots (4 redundant), replica loads 16 x4 (expert 0), 15 x2 (expert 1),
    # 10, 8, 6, 4, 4, 2. Greedy packing by hand:
    #   16, 16, 16, 16 -> one per GPU; 15 -> GPU 0 (31); 15 -> GPU 1 (31); 10 -> GPU 2 (26);
    #   8 -> GPU 3 (24); 6 -> GPU 3 (30, full); 4 -> GPU 2 (30, full); 4 -> GPU 0 (35, full);
    #   2 -> GPU 1 (33)
    phy2log = impl.rebalance_global([SKEWED], 12, 4)
    assert phy2log.dtype == np.int64
    assert phy2log.tolist() == [[0, 1, 6, 0, 1, 7, 0, 2, 5, 0, 3, 4]]
    after = impl.replica_gpu_loads([SKEWED], phy2log, 4)
    assert after.tolist() == [[35.0, 33.0, 30.0, 30.0]]
    assert impl.imbalance(after[0]) == 1.09375 <= 1.2


def test_replica_gpu_loads_split_a_load_over_its_copies():
    # expert 0 (load 12) has three copies, expert 1 (load 6) one: 4, 4 | 4, 6
    loads = impl.replica_gpu_loads([[12, 6]], [[0, 0, 0, 1]], 2)
    assert loads.tolist() == [[8.0, 10.0]]
    assert loads.dtype == np.float64
    rng = np.random.default_rng(4)
    w = rng.integers(0, 50, size=(3, 6)).astype(np.float64)
    p2l = impl.rebalance_global(w, 12, 3)
    np.testing.assert_allclose(impl.replica_gpu_loads(w, p2l, 3).sum(axis=1), w.sum(axis=1))


# ---------------------------------------------------------------- against upstream


def _upstream_policy():
    """``DefaultEplbPolicy`` from upstream's default.py, run on numpy alone.

    The class is cut out of the file with ``ast``; its base class comes from a
    one-line stand-in for ``abstract.py`` (an empty class), and ``torch`` is a
    namespace holding only ``Tensor`` for the annotations, so neither vllm nor
    torch is imported. Every method it runs here is pure numpy.
    """
    tree = ast.parse(EPLB_DEFAULT.read_text())
    cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DefaultEplbPolicy"]
    assert len(cls) == 1

    class AbstractEplbPolicy:  # the abstract.py shim
        pass

    namespace = {"np": np, "torch": types.SimpleNamespace(Tensor=object),
                 "AbstractEplbPolicy": AbstractEplbPolicy}
    exec(compile(ast.Module(body=cls, type_ignores=[]), str(EPLB_DEFAULT), "exec"), namespace)
    return namespace["DefaultEplbPolicy"]


def _random_weights(rng, layers, n):
    """Float loads, small integers full of ties, or an all-zero layer, at random."""
    kind = rng.integers(0, 3)
    if kind == 0:
        return rng.exponential(100.0, size=(layers, n))
    if kind == 1:
        return rng.integers(0, 4, size=(layers, n)).astype(np.float64)
    w = rng.integers(0, 200, size=(layers, n)).astype(np.float64)
    w[0] = 0.0
    return w


@pytest.mark.upstream
def test_replicate_and_pack_match_upstream_on_200_random_matrices():
    up = _upstream_policy()
    rng = np.random.default_rng(2024)
    for _ in range(200):
        layers = int(rng.integers(1, 4))
        num_log = int(rng.integers(1, 13))
        num_phy = num_log + int(rng.integers(0, 9))
        w = _random_weights(rng, layers, num_log)
        want = up.replicate_experts(w.copy(), num_phy)
        got = impl.replicate_experts(w, num_phy)
        for g, u in zip(got, want, strict=True):
            assert g.dtype == np.int64
            np.testing.assert_array_equal(g, u)
        # pack num_phy items into a pack count that divides it
        divisors = [d for d in range(1, num_phy + 1) if num_phy % d == 0]
        packs = int(rng.choice(divisors))
        items = _random_weights(rng, layers, num_phy)
        want = up.balanced_packing(items.copy(), packs)
        got = impl.balanced_packing(items, packs)
        for g, u in zip(got, want, strict=True):
            assert g.dtype == np.int64
            np.testing.assert_array_equal(g, u)


@pytest.mark.upstream
def test_rebalance_global_matches_upstream_hierarchical_with_one_group_one_node():
    up = _upstream_policy()
    rng = np.random.default_rng(7)
    for _ in range(60):
        layers = int(rng.integers(1, 4))
        num_log = int(rng.integers(2, 17))
        num_gpus = int(rng.integers(1, 5))
        # the smallest multiple of num_gpus that holds every expert, plus 0-2 GPUs' worth
        num_phy = num_gpus * (-(-num_log // num_gpus) + int(rng.integers(0, 3)))
        w = _random_weights(rng, layers, num_log)
        want = up.rebalance_experts_hierarchical(w.copy(), num_phy, 1, 1, num_gpus)
        np.testing.assert_array_equal(impl.rebalance_global(w, num_phy, num_gpus), want)


@pytest.mark.upstream
def test_placement_matches_upstream_determine_expert_map():
    # determine_expert_map cut out with ast, run against a numpy stand-in for the three
    # torch calls it makes (full, arange, int32)
    tree = ast.parse(EXPERT_MAP.read_text())
    fn = [n for n in tree.body
          if isinstance(n, ast.FunctionDef) and n.name == "determine_expert_map"]
    fake_torch = types.SimpleNamespace(
        Tensor=np.ndarray, int32=np.int32,
        full=lambda shape, value, dtype: np.full(shape, value, dtype=dtype),
        arange=lambda *args, dtype: np.arange(*args, dtype=dtype))
    namespace = {"torch": fake_torch, "ExpertPlacementStrategy": str}
    exec(compile(ast.Module(body=fn, type_ignores=[]), str(EXPERT_MAP), "exec"), namespace)
    determine = namespace["determine_expert_map"]
    for experts in range(1, 13):
        for devices in range(1, experts + 1):
            for strategy in ("linear", "round_robin"):
                want = np.zeros(experts, dtype=np.int64)
                if devices > 1:
                    for rank in range(devices):
                        _, expert_map, _ = determine(devices, rank, experts, strategy)
                        want[expert_map >= 0] = rank
                got = impl.expert_placement(experts, devices, strategy)
                np.testing.assert_array_equal(got, want, err_msg=f"{experts} {devices} {strategy}")


# ---------------------------------------------------------------- inputs


def test_inputs_are_not_modified():
    w = np.array([[5.0, 1.0, 4.0, 2.0]])
    keep = w.copy()
    impl.replicate_experts(w, 6)
    impl.balanced_packing(w, 2)
    impl.rebalance_global(w, 6, 2)
    impl.replica_gpu_loads(w, [[0, 1, 2, 3]], 2)
    np.testing.assert_array_equal(w, keep)
    ids = np.array([[1, 0], [0, 1]])
    impl.expert_loads(ids, 2)
    assert ids.tolist() == [[1, 0], [0, 1]]


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="num_experts"):
        impl.expert_loads([[0, 1]], 0)
    with pytest.raises(ValueError, match="topk_ids"):
        impl.expert_loads([[0, 0], [1, 2]], 3)  # a token that names expert 0 twice
    with pytest.raises(ValueError, match="topk_ids"):
        impl.expert_loads([[2, 2]], 3)  # a one-token batch is checked too
    with pytest.raises(ValueError, match="topk_ids"):
        impl.expert_loads([[0, 3]], 3)
    with pytest.raises(ValueError, match="topk_ids"):
        impl.expert_loads([[0, -1]], 3)
    with pytest.raises(ValueError, match="topk_ids"):
        impl.expert_loads([0, 1], 3)  # 1-D
    with pytest.raises(ValueError, match="topk_ids"):
        impl.expert_loads([[0.0, 1.0]], 3)  # float ids
    with pytest.raises(ValueError, match="loads"):
        impl.imbalance([0, 0, 0])
    with pytest.raises(ValueError, match="loads"):
        impl.imbalance([3, -1])
    with pytest.raises(ValueError, match="loads"):
        impl.imbalance([])
    with pytest.raises(ValueError, match="num_devices"):
        impl.expert_placement(4, 0)
    with pytest.raises(ValueError, match="num_devices"):
        impl.expert_placement(4, 5)
    with pytest.raises(ValueError, match="num_experts"):
        impl.expert_placement(0, 1)
    with pytest.raises(ValueError, match="num_experts"):
        impl.expert_placement(2.5, 1)
    with pytest.raises(ValueError, match="placement"):
        impl.expert_placement(4, 2, "random")
    with pytest.raises(ValueError, match="time_per_assignment"):
        impl.ep_step_time([1, 2], 2, time_per_assignment=0.0)
    with pytest.raises(ValueError, match="capacity_factor"):
        impl.expert_capacity(0.0, 64, 2, 8)
    with pytest.raises(ValueError, match="capacity_factor"):
        impl.expert_capacity(float("inf"), 64, 2, 8)
    with pytest.raises(ValueError, match="tokens"):
        impl.expert_capacity(1.0, 0, 2, 8)
    with pytest.raises(ValueError, match="top_k"):
        impl.expert_capacity(1.0, 64, 9, 8)
    with pytest.raises(ValueError, match="top_k"):
        impl.expert_capacity(1.0, 64, 0, 8)
    with pytest.raises(ValueError, match="num_experts"):
        impl.expert_capacity(1.0, 64, 2, 8.5)
    assert impl.expert_capacity(1.0, 4, 8, 8) == 4  # top_k == num_experts: all experts, all tokens
    with pytest.raises(ValueError, match="num_phy"):
        impl.replicate_experts([[1, 2]], 3.0)
    with pytest.raises(ValueError, match="num_packs"):
        impl.balanced_packing([[1, 2]], 0)
    with pytest.raises(ValueError, match="num_gpus"):
        impl.rebalance_global([[1, 2]], 2, 0)
    with pytest.raises(ValueError, match="num_gpus"):
        impl.replica_gpu_loads([[1, 2]], [[0, 1]], 0)
    for bad in ([0, 1, 2], [[0.0, 1.0, 2.0]], [[0, 1, 2], [0, 1, 2]], [[0, 1, 2, 3]],
                [[0, 1, 2, -1]]):
        with pytest.raises(ValueError, match="phy2log"):
            impl.replica_gpu_loads([[1, 2, 3]], bad, 1)
    with pytest.raises(ValueError, match="num_phy"):
        impl.replicate_experts([[1, 2, 3]], 2)
    with pytest.raises(ValueError, match="weight"):
        impl.replicate_experts([1, 2, 3], 4)  # 1-D: a layer axis is required
    with pytest.raises(ValueError, match="weight"):
        impl.balanced_packing([[1.0, -2.0]], 1)
    with pytest.raises(ValueError, match="num_packs"):
        impl.balanced_packing([[1, 2, 3]], 2)
    with pytest.raises(ValueError, match="num_gpus"):
        impl.rebalance_global([[1, 2, 3]], 4, 3)
    with pytest.raises(ValueError, match="phy2log"):
        impl.replica_gpu_loads([[1, 2, 3]], [[0, 1, 1]], 1)  # expert 2 has no copy
    with pytest.raises(ValueError, match="num_gpus"):
        impl.replica_gpu_loads([[1, 2, 3]], [[0, 1, 2]], 2)
