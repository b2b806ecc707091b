"""Lab 10-05 — Rank groups: which GPUs talk to which (reference solution).

A vLLM deployment with tensor, pipeline, context, data and expert parallelism
is one ``torch.distributed`` world of ``N`` ranks (one process per GPU) cut
into many small process groups. Every collective names a group: the TP
all-reduce after a row-parallel layer runs among the ranks that hold the
shards of the same layer, the PP send goes to the rank holding the next stage,
and so on. ``initialize_model_parallel`` decides which ranks form each group
with one recipe. Number the ranks ``0 .. N-1`` and lay them out as a 5-D grid::

    grid = arange(N).reshape(-1, DP, PP, PCP, TP)     # axes 0..4
           # axis 0 is "external DP": copies of the whole layout, if N allows

TP is the last (fastest-varying) axis, so a TP group is a run of adjacent
ranks, i.e. GPUs on the same node. To get the groups of any other kind, move
that kind's axis to the end, flatten the rest, and read off the rows::

    tp   grid.reshape(-1, TP)
    dcp  grid.reshape(-1, DCP)                  (DCP splits each TP group)
    pcp  grid.transpose(3, 4).reshape(-1, PCP)
    pp   grid.transpose(2, 4).reshape(-1, PP)
    dp   grid.transpose(1, 4).reshape(-1, DP)
    ep   grid.transpose(1, 2).reshape(-1, DP * PCP * TP)   (MoE models only)

Then every rank creates every group with ``torch.distributed.new_group`` in
the same order (the call is collective over the whole world, members or not)
and keeps the one it belongs to, with its position inside it: the rank's
"TP rank", "PP rank" and so on. ``init_rank_groups`` does that for real in a
gloo world started by ``mini_vllm.distributed.run_in_processes``.

upstream: vllm/distributed/parallel_state.py:1506 initialize_model_parallel
upstream: vllm/distributed/parallel_state.py:1581 all_ranks
upstream: vllm/distributed/parallel_state.py:290 GroupCoordinator
upstream: vllm/distributed/parallel_state.py:1402 data_parallel_rank
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist

# The group kinds, in the order initialize_model_parallel creates them.
KINDS = ("tp", "dcp", "pcp", "pp", "dp", "ep")

# Names of the grid's axes, outermost first (axis 0 is the external-DP copy index).
AXES = ("ext_dp", "dp", "pp", "pcp", "tp")


# ---------------------------------------------------------------- given helpers


def _check_int(value, name: str, minimum: int = 1) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an int >= ``minimum``.

    ``bool`` is refused although it is an ``int`` subclass (``True`` is not a size).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_grid(grid) -> np.ndarray:
    """Given. ``grid`` as a 5-D integer array; ValueError naming ``grid`` otherwise."""
    arr = np.asarray(grid)
    if arr.ndim != 5 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise ValueError(f"grid must be the 5-D integer array rank_grid returns "
                         f"(ext_dp, dp, pp, pcp, tp), got shape {arr.shape} dtype {arr.dtype}")
    return arr


@dataclass
class RankGroup:
    """Given. One rank's view of one group, like vLLM's ``GroupCoordinator``.

    kind: one of ``KINDS``. ranks: the global ranks of the group, in the
    group's order. rank_in_group: this rank's position in ``ranks``.
    process_group: the ``torch.distributed`` group to pass as ``group=`` to
    collectives.
    """

    kind: str
    ranks: list[int]
    rank_in_group: int
    process_group: Any

    @property
    def world_size(self) -> int:
        return len(self.ranks)


# ---------------------------------------------------------------- the layout


def rank_grid(world_size, tensor_parallel_size=1, pipeline_parallel_size=1,
              prefill_context_parallel_size=1, data_parallel_size=1) -> np.ndarray:
    """The global ranks laid out as upstream's 5-D grid.

    Returns an int64 array of shape ``(E, DP, PP, PCP, TP)`` holding
    ``0 .. world_size - 1`` in row-major order, where ``E = world_size //
    (DP * PP * PCP * TP)`` is the number of external-DP copies (1 in a plain
    deployment). So rank ``r`` sits at ``np.unravel_index(r, shape)``: TP
    varies fastest, then PCP, PP, DP.

    Raises ValueError naming the parameter unless every argument is an
    integer >= 1, and naming ``world_size`` unless it is a multiple of
    ``DP * PP * PCP * TP``.
    """
    world = _check_int(world_size, "world_size")
    tp = _check_int(tensor_parallel_size, "tensor_parallel_size")
    pp = _check_int(pipeline_parallel_size, "pipeline_parallel_size")
    pcp = _check_int(prefill_context_parallel_size, "prefill_context_parallel_size")
    dp = _check_int(data_parallel_size, "data_parallel_size")
    per_copy = dp * pp * pcp * tp
    if world % per_copy:
        raise ValueError(f"world_size must be a multiple of DP * PP * PCP * TP = {per_copy}, "
                         f"got {world}")
    return np.arange(world, dtype=np.int64).reshape(-1, dp, pp, pcp, tp)


def group_ranks(grid, kind: str, decode_context_parallel_size=1) -> list[list[int]]:
    """The groups of one kind, as lists of global ranks, in upstream's order.

    grid: the array ``rank_grid`` returns, ``(E, DP, PP, PCP, TP)``.
    kind: one of ``KINDS``. For each kind, the axis it names is moved to the
    end by swapping it with the TP axis (``np.swapaxes``, torch's
    ``transpose``), the array is flattened to rows of that axis's length,
    and each row is a group:

    - ``"tp"``: rows of TP adjacent ranks (no swap).
    - ``"dcp"``: rows of ``decode_context_parallel_size`` adjacent ranks:
      each TP group cut into ``TP // DCP`` consecutive pieces.
    - ``"pcp"``: swap axes 3 and 4, rows of PCP.
    - ``"pp"``: swap axes 2 and 4, rows of PP.
    - ``"dp"``: swap axes 1 and 4, rows of DP.
    - ``"ep"``: swap axes 1 and 2 (DP and PP), rows of ``DP * PCP * TP``:
      every rank of one pipeline stage, across the DP replicas.

    Returns a list of lists of Python ints; every rank of the grid appears
    in exactly one group, and each group is increasing.

    Raises ValueError naming ``grid`` unless it is a 5-D integer array,
    naming ``kind`` unless it is in ``KINDS``, and naming
    ``decode_context_parallel_size`` unless it is an integer >= 1 that
    divides TP (the grid's last axis).
    """
    arr = _check_grid(grid)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    dcp = _check_int(decode_context_parallel_size, "decode_context_parallel_size")
    _, dp, pp, pcp, tp = arr.shape
    if tp % dcp:
        raise ValueError(f"decode_context_parallel_size must divide the TP size {tp}, got {dcp}")
    if kind == "tp":
        rows = arr.reshape(-1, tp)
    elif kind == "dcp":
        # DCP adds no GPUs: it cuts each TP group into runs of dcp neighbours.
        rows = arr.reshape(-1, dcp)
    elif kind == "pcp":
        rows = arr.swapaxes(3, 4).reshape(-1, pcp)
    elif kind == "pp":
        rows = arr.swapaxes(2, 4).reshape(-1, pp)
    elif kind == "dp":
        rows = arr.swapaxes(1, 4).reshape(-1, dp)
    else:
        # EP: one group per (external copy, pipeline stage) holding its DP x PCP x TP ranks.
        rows = arr.swapaxes(1, 2).reshape(-1, dp * pcp * tp)
    return [[int(r) for r in row] for row in rows]


def all_group_ranks(grid, decode_context_parallel_size=1,
                    is_moe=False) -> dict[str, list[list[int]]]:
    """Every kind's groups: ``{kind: group_ranks(grid, kind, dcp)}``.

    Keys in ``KINDS`` order; ``"ep"`` is present only when ``is_moe`` is
    true (upstream builds no EP group for a dense model). Raises the
    ValueErrors ``group_ranks`` raises.
    """
    kinds = KINDS if is_moe else tuple(k for k in KINDS if k != "ep")
    return {kind: group_ranks(grid, kind, decode_context_parallel_size) for kind in kinds}


def locate(rank, groups) -> tuple[list[int], int]:
    """The group of ``groups`` that holds ``rank``, and ``rank``'s position in it.

    This is the test ``GroupCoordinator.__init__`` runs over every group it
    creates: the group containing the rank becomes its own, and the index
    there is its ``rank_in_group`` (its "TP rank", "PP rank", ...). Returns
    ``(ranks, rank_in_group)`` with ``ranks`` a list of ints.

    Raises ValueError naming ``rank`` unless it is an integer >= 0 held by
    some group, and naming ``groups`` when it is held by more than one (a
    layout that is not a partition of the ranks).
    """
    r = _check_int(rank, "rank", minimum=0)
    found = [list(map(int, g)) for g in groups if r in g]
    if not found:
        raise ValueError(f"rank {r} is in none of the groups")
    if len(found) > 1:
        raise ValueError(f"groups must not share ranks: rank {r} is in {found}")
    ranks = found[0]
    return ranks, ranks.index(r)


def global_rank(data_parallel_rank, rank, world_size) -> int:
    """The rank a worker gets in the world that spans all DP replicas.

    Each DP replica numbers its ``world_size`` workers (``TP * PP * PCP``)
    from 0; ``init_distributed_environment`` offsets them by the replica
    index, so replica ``d``'s workers are ranks ``d * world_size ..
    (d + 1) * world_size - 1``, the DP axis of the grid.

    Raises ValueError naming ``data_parallel_rank`` unless it is an integer
    >= 0, ``world_size`` unless an integer >= 1, and ``rank`` unless an
    integer in ``[0, world_size)``.
    """
    d = _check_int(data_parallel_rank, "data_parallel_rank", minimum=0)
    w = _check_int(world_size, "world_size")
    r = _check_int(rank, "rank", minimum=0)
    if r >= w:
        raise ValueError(f"rank must be < world_size = {w}, got {r}")
    return d * w + r


def nodes_spanned(ranks, gpus_per_node) -> int:
    """How many nodes a group touches when node ``k`` holds ranks
    ``k * gpus_per_node .. (k + 1) * gpus_per_node - 1``.

    A group on one node talks over NVLink; one spanning nodes goes over the
    network. Raises ValueError naming ``gpus_per_node`` unless it is an
    integer >= 1, and naming ``ranks`` unless it is a non-empty list of
    integers >= 0.
    """
    g = _check_int(gpus_per_node, "gpus_per_node")
    rs = list(ranks)
    if not rs or any(isinstance(r, bool) or not isinstance(r, int | np.integer) or r < 0
                     for r in rs):
        raise ValueError(f"ranks must be a non-empty list of integers >= 0, got {ranks!r}")
    return len({int(r) // g for r in rs})


def assignment_line(rank, groups_by_kind) -> str:
    """The line upstream logs once per rank after building the groups.

    ``"rank 5 in world size 8 is assigned as DP rank 1, PP rank 0, PCP rank
    0, TP rank 1, EP rank 3, EPLB rank N/A"``: the world size is the number
    of ranks the TP groups cover; each "X rank" is ``rank``'s position in its
    group of that kind (``locate``); EP is ``N/A`` when there is no ``"ep"``
    key (a dense model), and EPLB is always ``N/A`` here (no EPLB group).

    Raises ValueError naming ``groups_by_kind`` unless it has the keys
    ``"dp"``, ``"pp"``, ``"pcp"`` and ``"tp"``, and as ``locate`` does.
    """
    missing = [k for k in ("dp", "pp", "pcp", "tp") if k not in groups_by_kind]
    if missing:
        raise ValueError(f"groups_by_kind must have the kinds dp, pp, pcp and tp; "
                         f"missing {missing}")
    world = sum(len(g) for g in groups_by_kind["tp"])
    pos = {k: locate(rank, groups_by_kind[k])[1] for k in ("dp", "pp", "pcp", "tp")}
    ep = locate(rank, groups_by_kind["ep"])[1] if "ep" in groups_by_kind else "N/A"
    return (f"rank {rank} in world size {world} is assigned as DP rank {pos['dp']}, "
            f"PP rank {pos['pp']}, PCP rank {pos['pcp']}, TP rank {pos['tp']}, "
            f"EP rank {ep}, EPLB rank N/A")


# ---------------------------------------------------------------- real groups


def init_rank_groups(rank, groups_by_kind) -> dict[str, RankGroup]:
    """Create every group for real and return this rank's, one per kind.

    Must run in every rank of an initialized ``torch.distributed`` world
    (gloo here), each rank passing the same ``groups_by_kind`` (as
    ``all_group_ranks`` returns it). For each kind in the dict's order and
    each group in the list's order, calls ``dist.new_group(ranks,
    backend="gloo")``: every rank creates every group, even those it is not
    in, because ``new_group`` is collective over the whole world and must be
    called in the same order everywhere. Keeps the group that holds
    ``rank`` as a ``RankGroup(kind, ranks, rank_in_group, process_group)``.

    Before creating anything, checks that ``rank`` is in exactly one group
    of each kind (``locate``): ValueError naming ``rank`` or ``groups``
    otherwise, raised on every rank alike, so no rank is left waiting in a
    collective.
    """
    mine = {kind: locate(rank, groups) for kind, groups in groups_by_kind.items()}
    out: dict[str, RankGroup] = {}
    for kind, groups in groups_by_kind.items():
        for ranks in groups:
            pg = dist.new_group([int(r) for r in ranks], backend="gloo")
            if rank in ranks:
                own, position = mine[kind]
                out[kind] = RankGroup(kind, own, position, pg)
    return out


def _demo_rank(rank, world_size, groups_by_kind):
    """The demo's body in each forked rank: sum the rank ids inside each of its groups."""
    import torch

    sums = {}
    for kind, group in init_rank_groups(rank, groups_by_kind).items():
        t = torch.tensor([rank])
        dist.all_reduce(t, group=group.process_group)
        sums[kind] = int(t.item())
    return sums


if __name__ == "__main__":
    from mini_vllm.distributed import run_in_processes

    grid = rank_grid(8, tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2)
    groups = all_group_ranks(grid, is_moe=True)
    for kind in ("tp", "pp", "dp", "ep"):
        print(f"{kind:>3}: {groups[kind]}")
    for r in (0, 5):
        print(assignment_line(r, groups))
    sums = run_in_processes(8, _demo_rank, groups)
    print("gloo, world 8, rank 5 all-reduces its id in each group:",
          ", ".join(f"{k} {sums[5][k]}" for k in ("tp", "pp", "dp", "ep")))
    big = rank_grid(16, tensor_parallel_size=8, pipeline_parallel_size=2)
    for kind in ("tp", "pp"):
        spans = [nodes_spanned(g, 8) for g in group_ranks(big, kind)]
        print(f"TP 8 x PP 2 on two 8-GPU nodes: {kind} groups span {spans} node(s)")
