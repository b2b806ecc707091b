"""Lab 10-05 tests: vLLM's rank layout by hand, against upstream's code, and on real gloo groups."""
from __future__ import annotations

import ast
import functools
import itertools
import re

import numpy as np
import pytest
import torch
import torch.distributed as dist

import course
from course import load_impl
from mini_vllm.distributed import run_in_processes

impl = load_impl(__file__)

PARALLEL_STATE = course.UPSTREAM / "vllm/distributed/parallel_state.py"

# ---------------------------------------------------------------- hand-derived layouts
#
# In rank_grid(8, tp=2, pp=2, dp=2) rank r sits at (dp, pp, tp) = (r // 4, r // 2 % 2, r % 2).
# A group of one kind holds the ranks that agree on every other coordinate. The order of the
# groups is the order of the remaining axes after upstream's transpose: for DP, transpose(1, 4)
# leaves (tp, pp, pcp) in front, so the groups come tp-major: (tp 0, pp 0) = [0, 4],
# (tp 0, pp 1) = [2, 6], (tp 1, pp 0) = [1, 5], (tp 1, pp 1) = [3, 7].
# EP: for each pipeline stage, every DP x TP rank: stage 0 = {0, 1, 4, 5}, stage 1 = {2, 3, 6, 7}.
TP2_PP2_DP2_MOE = {
    "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "dcp": [[r] for r in range(8)],
    "pcp": [[r] for r in range(8)],
    "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
    "dp": [[0, 4], [2, 6], [1, 5], [3, 7]],
    "ep": [[0, 1, 4, 5], [2, 3, 6, 7]],
}

# TP 4, PCP 2 (dense), DCP 2: rank r = pcp * 4 + tp. DCP cuts each TP group of 4 into two
# neighbouring pairs. PCP pairs rank r with r + 4. With PP = DP = 1 their groups are
# singletons, listed in the order of the axes in front after the transpose: (tp, pcp) for PP,
# so 0, 4, 1, 5, ... and not 0, 1, 2, ...
TP4_PCP2_DCP2 = {
    "tp": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "dcp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "pcp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "pp": [[0], [4], [1], [5], [2], [6], [3], [7]],
    "dp": [[0], [4], [1], [5], [2], [6], [3], [7]],
}

# The example in initialize_model_parallel's docstring: 8 GPUs, TP 2, PP 4 (dense).
TP2_PP4 = {
    "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "dcp": [[r] for r in range(8)],
    "pcp": [[r] for r in range(8)],
    "pp": [[0, 2, 4, 6], [1, 3, 5, 7]],
    "dp": [[0], [2], [4], [6], [1], [3], [5], [7]],
}

# (world, tp, pp, pcp, dp, dcp, is_moe) of the three layouts above
LAYOUTS = {
    "tp2_pp2_dp2_moe": ((8, 2, 2, 1, 2, 1, True), TP2_PP2_DP2_MOE),
    "tp4_pcp2_dcp2": ((8, 4, 1, 2, 1, 2, False), TP4_PCP2_DCP2),
    "tp2_pp4": ((8, 2, 4, 1, 1, 1, False), TP2_PP4),
}


def layout(world, tp, pp, pcp, dp, dcp=1, is_moe=False):
    grid = impl.rank_grid(world, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                          prefill_context_parallel_size=pcp, data_parallel_size=dp)
    return impl.all_group_ranks(grid, decode_context_parallel_size=dcp, is_moe=is_moe)


def configs():
    """Every (world, tp, pp, pcp, dp, dcp) with sizes up to 4 / 3 / 2 / 3, one or two
    external-DP copies, and every DCP size that divides TP: 144 layouts, 288 with their DCP
    sizes."""
    for tp, pp, pcp, dp, copies in itertools.product((1, 2, 3, 4), (1, 2, 3), (1, 2), (1, 2, 3),
                                                     (1, 2)):
        for dcp in (d for d in range(1, tp + 1) if tp % d == 0):
            yield copies * tp * pp * pcp * dp, tp, pp, pcp, dp, dcp


# ---------------------------------------------------------------- the grid


def test_grid_puts_tp_innermost_and_dp_outermost():
    grid = impl.rank_grid(8, tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2)
    assert isinstance(grid, np.ndarray) and grid.dtype == np.int64
    assert grid.shape == (1, 2, 2, 1, 2)  # (ext_dp, dp, pp, pcp, tp)
    for r in range(8):
        assert grid[0, r // 4, r // 2 % 2, 0, r % 2] == r
    # a second copy of the whole layout goes on axis 0 (external DP): ranks 8..15
    grid = impl.rank_grid(16, tensor_parallel_size=2, pipeline_parallel_size=2,
                          data_parallel_size=2)
    assert grid.shape == (2, 2, 2, 1, 2) and grid[1].min() == 8
    # PCP sits between PP and TP: TP 2, PCP 3 -> rank 5 is pcp 2, tp 1
    grid = impl.rank_grid(6, tensor_parallel_size=2, prefill_context_parallel_size=3)
    assert grid.shape == (1, 1, 1, 3, 2) and grid[0, 0, 0, 2, 1] == 5


# ---------------------------------------------------------------- groups by hand


def test_docstring_example_tp2_pp4():
    groups = layout(*LAYOUTS["tp2_pp4"][0][:6])
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["pp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert groups == TP2_PP4  # every kind, and no "ep" for a dense model
    assert all(type(r) is int for g in groups["pp"] for r in g)  # Python ints, not numpy


def test_tp2_pp2_dp2_every_kind_in_upstreams_order():
    groups = layout(*LAYOUTS["tp2_pp2_dp2_moe"][0])
    assert list(groups) == ["tp", "dcp", "pcp", "pp", "dp", "ep"]
    for kind, want in TP2_PP2_DP2_MOE.items():
        assert groups[kind] == want, kind
    # the DP groups come tp-major: moving the DP axis last with moveaxis instead of
    # upstream's transpose (swapaxes) gives the same pairs in pp-major order
    assert groups["dp"] != [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_dp2_tp2_moe_is_one_ep_group_and_dense_has_none():
    groups = layout(4, 2, 1, 1, 2, 1, is_moe=True)
    assert groups["ep"] == [[0, 1, 2, 3]]
    assert groups["dp"] == [[0, 2], [1, 3]] and groups["tp"] == [[0, 1], [2, 3]]
    assert "ep" not in layout(4, 2, 1, 1, 2)
    # with PP, EP stops at the stage: one EP group per pipeline stage, each DP x TP wide
    groups = layout(8, 2, 2, 1, 2, is_moe=True)
    assert groups["ep"] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # with PCP, EP spans it too: DP 2 x PCP 2 x TP 2 = every one of the 8 ranks
    assert layout(8, 2, 1, 2, 2, is_moe=True)["ep"] == [list(range(8))]


def test_pcp_and_dcp_by_hand():
    groups = layout(*LAYOUTS["tp4_pcp2_dcp2"][0][:6])
    assert groups == TP4_PCP2_DCP2
    # DCP = TP: one DCP group per TP group; DCP = 1: singletons
    grid = impl.rank_grid(8, tensor_parallel_size=4, prefill_context_parallel_size=2)
    assert impl.group_ranks(grid, "dcp", 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert impl.group_ranks(grid, "dcp") == [[r] for r in range(8)]
    # TP 2, PCP 2, PP 2: rank = pp * 4 + pcp * 2 + tp. PP's transpose leaves (tp, pcp) in front,
    # so the order is (tp 0, pcp 0), (tp 0, pcp 1), (tp 1, pcp 0), (tp 1, pcp 1)
    groups = layout(8, 2, 2, 2, 1, is_moe=True)
    assert groups["pp"] == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert groups["pcp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_every_kind_partitions_the_world_and_positions_match_the_grid():
    checked = 0
    for world, tp, pp, pcp, dp, dcp in configs():
        grid = impl.rank_grid(world, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                              prefill_context_parallel_size=pcp, data_parallel_size=dp)
        groups = impl.all_group_ranks(grid, decode_context_parallel_size=dcp, is_moe=True)
        size = {"tp": tp, "dcp": dcp, "pcp": pcp, "pp": pp, "dp": dp, "ep": dp * pcp * tp}
        for kind, gs in groups.items():
            flat = sorted(r for g in gs for r in g)
            assert flat == list(range(world)), (kind, world, tp, pp, pcp, dp, dcp)
            assert all(len(g) == size[kind] and g == sorted(g) for g in gs), kind
        for r in range(world):
            _, d, p, c, t = np.unravel_index(r, (world // (dp * pp * pcp * tp), dp, pp, pcp, tp))
            # a rank's position in its group is its coordinate along that kind's axis
            want = {"tp": t, "dcp": t % dcp, "pcp": c, "pp": p, "dp": d,
                    "ep": (d * pcp + c) * tp + t}
            for kind, gs in groups.items():
                members, pos = impl.locate(r, gs)
                assert pos == want[kind], (kind, r, world, tp, pp, pcp, dp, dcp)
                assert members[pos] == r
        checked += 1
    assert checked == 288


# ---------------------------------------------------------------- a rank's place


def test_locate_returns_the_position_inside_the_group():
    dp_groups = TP2_PP2_DP2_MOE["dp"]
    assert impl.locate(5, dp_groups) == ([1, 5], 1)  # group index 2, position 1
    assert impl.locate(6, dp_groups) == ([2, 6], 1)
    # in a PP group [0, 2] rank 2 is at position 1; "rank % group size" would say 0
    assert impl.locate(2, TP2_PP4["pp"]) == ([0, 2, 4, 6], 1)
    assert impl.locate(4, TP2_PP4["pp"]) == ([0, 2, 4, 6], 2)
    members, pos = impl.locate(np.int64(3), [np.array([1, 3])])
    assert members == [1, 3] and pos == 1 and type(members[0]) is int


def test_locate_refuses_a_rank_in_no_group_or_in_two():
    with pytest.raises(ValueError, match="rank"):
        impl.locate(4, [[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="rank"):
        impl.locate(-1, [[-1, 0]])
    with pytest.raises(ValueError, match="rank"):
        impl.locate(True, [[0, 1]])
    with pytest.raises(ValueError, match="groups"):
        impl.locate(1, [[0, 1], [1, 2]])


def test_global_rank_offsets_each_replica_by_its_dp_index():
    # init_distributed_environment: replica d's worker r becomes d * world_size + r
    assert impl.global_rank(0, 3, 4) == 3
    assert impl.global_rank(1, 1, 4) == 5
    assert impl.global_rank(2, 0, 6) == 12
    # and that is exactly the grid's DP axis: TP 2 x PP 2 per replica, 3 replicas
    grid = impl.rank_grid(12, tensor_parallel_size=2, pipeline_parallel_size=2,
                          data_parallel_size=3)
    for d in range(3):
        for r in range(4):
            assert grid[0, d, r // 2, 0, r % 2] == impl.global_rank(d, r, 4)
    for bad in (4, -1):
        with pytest.raises(ValueError, match="rank"):
            impl.global_rank(0, bad, 4)
    with pytest.raises(ValueError, match="data_parallel_rank"):
        impl.global_rank(-1, 0, 4)
    with pytest.raises(ValueError, match="world_size"):
        impl.global_rank(0, 0, 0)


def test_tp_stays_on_a_node_and_pp_crosses_nodes():
    # TP 8 x PP 2 on two 8-GPU nodes: each TP group is one whole node, each PP group spans both
    grid = impl.rank_grid(16, tensor_parallel_size=8, pipeline_parallel_size=2)
    assert [impl.nodes_spanned(g, 8) for g in impl.group_ranks(grid, "tp")] == [1, 1]
    assert [impl.nodes_spanned(g, 8) for g in impl.group_ranks(grid, "pp")] == [2] * 8
    # where the ranks are, not how many: 2 ranks can span 2 nodes, 4 ranks can fit in 1
    assert impl.nodes_spanned([3, 4], 4) == 2
    assert impl.nodes_spanned([4, 5, 6, 7], 4) == 1
    assert impl.nodes_spanned([0, 2, 4, 6], 4) == 2
    assert impl.nodes_spanned([0, 8, 16], 8) == 3
    assert impl.nodes_spanned([7], 8) == 1
    with pytest.raises(ValueError, match="gpus_per_node"):
        impl.nodes_spanned([0], 0)
    with pytest.raises(ValueError, match="ranks"):
        impl.nodes_spanned([], 8)
    for bad in ([0, -1], [True], [0.5]):
        with pytest.raises(ValueError, match="ranks"):
            impl.nodes_spanned(bad, 8)


def test_assignment_line_by_hand():
    # rank 5 = (dp 1, pp 0, tp 1); in its EP group [0, 1, 4, 5] it is fourth
    assert impl.assignment_line(5, TP2_PP2_DP2_MOE) == (
        "rank 5 in world size 8 is assigned as DP rank 1, PP rank 0, PCP rank 0, TP rank 1, "
        "EP rank 3, EPLB rank N/A")
    assert impl.assignment_line(6, TP2_PP4) == (
        "rank 6 in world size 8 is assigned as DP rank 0, PP rank 3, PCP rank 0, TP rank 0, "
        "EP rank N/A, EPLB rank N/A")
    assert impl.assignment_line(7, TP4_PCP2_DCP2) == (
        "rank 7 in world size 8 is assigned as DP rank 0, PP rank 0, PCP rank 1, TP rank 3, "
        "EP rank N/A, EPLB rank N/A")
    with pytest.raises(ValueError, match="groups_by_kind"):
        impl.assignment_line(0, {"tp": [[0, 1]], "pp": [[0], [1]]})


def test_bad_sizes_name_the_parameter():
    with pytest.raises(ValueError, match="world_size"):
        impl.rank_grid(6, tensor_parallel_size=4)
    with pytest.raises(ValueError, match="world_size"):
        impl.rank_grid(0)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        impl.rank_grid(8, tensor_parallel_size=0)
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        impl.rank_grid(8, pipeline_parallel_size=True)
    with pytest.raises(ValueError, match="prefill_context_parallel_size"):
        impl.rank_grid(8, prefill_context_parallel_size=2.0)
    with pytest.raises(ValueError, match="data_parallel_size"):
        impl.rank_grid(8, data_parallel_size=-2)
    grid = impl.rank_grid(8, tensor_parallel_size=4, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="kind"):
        impl.group_ranks(grid, "tensor")
    with pytest.raises(ValueError, match="decode_context_parallel_size"):
        impl.group_ranks(grid, "dcp", 3)  # 3 does not divide TP 4
    with pytest.raises(ValueError, match="decode_context_parallel_size"):
        impl.group_ranks(grid, "tp", 8)  # checked whatever the kind
    with pytest.raises(ValueError, match="decode_context_parallel_size"):
        impl.all_group_ranks(grid, decode_context_parallel_size=0)
    with pytest.raises(ValueError, match="grid"):
        impl.group_ranks(np.arange(8).reshape(2, 4), "tp")


# ---------------------------------------------------------------- against upstream's own code

GLOBAL_KINDS = {"_TP": "tp", "_DCP": "dcp", "_PCP": "pcp", "_PP": "pp", "_DP": "dp", "_EP": "ep"}


@functools.lru_cache(maxsize=1)
def _upstream_function():
    tree = ast.parse(PARALLEL_STATE.read_text())
    return next(n for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == "initialize_model_parallel")


@functools.lru_cache(maxsize=1)
def _upstream_layout_code():
    """The expressions initialize_model_parallel builds its groups with, read with ``ast``.

    ``all_ranks = torch.arange(world_size).reshape(...)`` and, after each ``global _TP`` (``_DCP``,
    ``_PCP``, ``_PP``, ``_DP``, ``_EP``), the first ``group_ranks = ...`` that reads
    ``all_ranks`` (the elastic-EP variants read ``local_all_ranks`` and are skipped). Nothing
    of vLLM is imported: the expressions are evaluated with torch on plain tensors.
    """
    fn = _upstream_function()
    grid_expr, kind, exprs = None, None, {}
    for stmt in fn.body:
        if isinstance(stmt, ast.Global) and stmt.names[0] in GLOBAL_KINDS:
            kind = GLOBAL_KINDS[stmt.names[0]]
            continue
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                continue
            reads_grid = any(isinstance(n, ast.Name) and n.id == "all_ranks"
                             for n in ast.walk(node.value))
            if node.targets[0].id == "all_ranks" and grid_expr is None:
                grid_expr = node.value
            elif node.targets[0].id == "group_ranks" and reads_grid and kind and kind not in exprs:
                exprs[kind] = node.value
    assert grid_expr is not None and set(exprs) == set(impl.KINDS)

    def code(expr):
        return compile(ast.Expression(body=expr), str(PARALLEL_STATE), "eval")

    return code(grid_expr), {kind: code(e) for kind, e in exprs.items()}


def upstream_layout(world, tp, pp, pcp, dp, dcp):
    grid_code, codes = _upstream_layout_code()
    names = {"torch": torch, "world_size": world, "tensor_model_parallel_size": tp,
             "pipeline_model_parallel_size": pp, "prefill_context_model_parallel_size": pcp,
             "data_parallel_size": dp, "decode_context_model_parallel_size": dcp}
    names["all_ranks"] = eval(grid_code, names)  # noqa: S307 - upstream's own expression
    groups = {kind: [t.tolist() for t in eval(c, names)] for kind, c in codes.items()}  # noqa: S307
    return names["all_ranks"].numpy(), groups


@pytest.mark.upstream
def test_matches_upstreams_layout_code_on_288_layouts():
    for world, tp, pp, pcp, dp, dcp in configs():
        want_grid, want = upstream_layout(world, tp, pp, pcp, dp, dcp)
        grid = impl.rank_grid(world, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                              prefill_context_parallel_size=pcp, data_parallel_size=dp)
        np.testing.assert_array_equal(grid, want_grid)
        got = impl.all_group_ranks(grid, decode_context_parallel_size=dcp, is_moe=True)
        assert got == want, (world, tp, pp, pcp, dp, dcp)  # every kind, groups in the same order
    # the three layouts written out above (and run on gloo below) are upstream's too
    for (world, tp, pp, pcp, dp, dcp, is_moe), groups in LAYOUTS.values():
        _, want = upstream_layout(world, tp, pp, pcp, dp, dcp)
        if not is_moe:
            del want["ep"]
        assert groups == want == layout(world, tp, pp, pcp, dp, dcp, is_moe)


@pytest.mark.upstream
def test_docstring_example_is_what_upstream_documents():
    doc = ast.get_docstring(_upstream_function())
    prose = " ".join(doc.split())
    assert "total of 8 GPUs" in prose and "2 GPUs to parallelize the model tensor" in prose
    assert "4 GPUs to parallelize the model pipeline" in prose
    lines = doc.splitlines()

    def listed(header):
        line = lines[next(i for i, s in enumerate(lines) if s.strip() == header) + 1]
        return [[int(g) for g in re.findall(r"g(\d+)", grp)]
                for grp in re.findall(r"\[[^\]]*\]", line)]

    groups = layout(8, 2, 4, 1, 1)
    assert listed("4 tensor model-parallel groups:") == groups["tp"]
    assert listed("2 pipeline model-parallel groups:") == groups["pp"]


@pytest.mark.upstream
def test_assignment_line_uses_upstreams_format():
    calls = [n for n in ast.walk(_upstream_function()) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "info_once"]
    fmt = calls[0].args[0].value
    assert fmt.startswith("rank %s in world size %s is assigned as DP rank %s")
    # rank 6 of TP 2 x PP 2 x DP 2 (MoE) = (dp 1, pp 1, tp 0); EP group [2, 3, 6, 7] -> 2
    assert impl.assignment_line(6, TP2_PP2_DP2_MOE) == fmt % (6, 8, 1, 1, 0, 0, 2, "N/A")
    assert impl.assignment_line(3, TP2_PP4) == fmt % (3, 8, 0, 1, 0, 1, "N/A", "N/A")


# ---------------------------------------------------------------- real groups on gloo


def _in_each_rank(rank, world_size, init_rank_groups, layouts):
    """Runs in every forked rank: build each layout's groups with the learner's code, then
    all-reduce and all-gather the rank id inside each of this rank's groups."""
    out = {}
    for name, groups_by_kind in layouts.items():
        mine = init_rank_groups(rank, groups_by_kind)
        seen = {}
        for kind, group in mine.items():
            total = torch.tensor([rank], dtype=torch.int64)
            dist.all_reduce(total, group=group.process_group)
            parts = [torch.zeros(1, dtype=torch.int64) for _ in range(group.world_size)]
            dist.all_gather(parts, torch.tensor([rank], dtype=torch.int64),
                            group=group.process_group)
            seen[kind] = {"kind": group.kind, "ranks": [int(r) for r in group.ranks],
                          "rank_in_group": int(group.rank_in_group), "sum": int(total.item()),
                          "gathered": [int(p.item()) for p in parts],
                          "pg_rank": dist.get_rank(group.process_group),
                          "pg_size": dist.get_world_size(group.process_group)}
        out[name] = seen
    return out


@pytest.fixture(scope="module")
def world():
    """One gloo world of 8 forked ranks for every real check (about half a second here)."""
    layouts = {name: groups for name, (_, groups) in LAYOUTS.items()}
    return run_in_processes(8, _in_each_rank, impl.init_rank_groups, layouts, timeout=20.0)


def test_real_groups_all_reduce_to_the_sum_of_their_members(world):
    for name, (_, groups_by_kind) in LAYOUTS.items():
        for rank in range(8):
            seen = world[rank][name]
            assert list(seen) == list(groups_by_kind), (name, rank)  # one group per kind
            for kind, groups in groups_by_kind.items():
                members = next(g for g in groups if rank in g)
                # e.g. rank 5's DP group [1, 5] sums to 6, its EP group [0, 1, 4, 5] to 10;
                # the whole world would give 28
                assert seen[kind]["sum"] == sum(members), (name, rank, kind)


def test_real_groups_keep_this_ranks_group_and_position(world):
    for name, (_, groups_by_kind) in LAYOUTS.items():
        for rank in range(8):
            for kind, groups in groups_by_kind.items():
                members = next(g for g in groups if rank in g)
                got = world[rank][name][kind]
                assert got["kind"] == kind
                assert got["ranks"] == members and got["rank_in_group"] == members.index(rank)
                # torch numbers a group's members in increasing global rank, the same order
                assert got["pg_rank"] == got["rank_in_group"] and got["pg_size"] == len(members)
                assert got["gathered"] == members, (name, rank, kind)


def test_init_rank_groups_checks_every_kind_before_creating_any():
    # no world here: a version that calls dist.new_group before checking fails inside torch
    # ("Default process group has not been initialized") instead of naming the rank
    with pytest.raises(ValueError, match="rank"):
        impl.init_rank_groups(3, {"tp": [[0, 1], [2, 3]], "pp": [[0, 2]]})
    with pytest.raises(ValueError, match="groups"):
        impl.init_rank_groups(1, {"tp": [[0, 1], [1, 2]]})
