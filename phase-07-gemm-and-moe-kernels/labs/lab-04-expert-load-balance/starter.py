"""Lab 07-04 — load imbalance, capacity drops, and vLLM's EPLB (your implementation).

A router does not share work out evenly. In a batch of T tokens, each picking
k distinct experts out of E, some experts receive far more than the average
T·k/E and some receive almost nothing. The consequences depend on how the
experts are served:

* **Expert parallelism** (one slice of the experts per GPU): a layer is done
  only when its busiest GPU is done, so the step time follows the *largest*
  per-device load, not the mean. ``expert_placement`` reproduces the two
  placements of vLLM's ``determine_expert_map`` ("linear" and
  "round_robin"), and ``ep_step_time`` turns loads into a step time.
* **Capacity-limited training-style MoE** (Switch/GShard): each expert takes
  at most ``capacity = floor(cf · T · k / E)`` assignments and drops the rest.
  ``expert_capacity`` and ``dropped_tokens`` count what is lost. vLLM never
  drops a token; this is the cost it avoids.
* **EPLB** (vLLM's expert-parallel load balancer, from DeepSeek): give the hot
  experts extra *replicas*, then pack the replicas onto GPUs so that every GPU
  carries about the same load. ``replicate_experts`` and ``balanced_packing``
  are upstream's two building blocks, with upstream's exact tie-breaking;
  ``rebalance_global`` composes them the way upstream's global policy does,
  and ``replica_gpu_loads`` measures the result.

Loads are counts of (token, expert) assignments: a token that picks experts 3
and 5 adds one to each.

upstream: vllm/model_executor/layers/fused_moe/expert_map_manager.py:22 determine_expert_map
upstream: vllm/distributed/eplb/policy/default.py:76 replicate_experts
upstream: vllm/distributed/eplb/policy/default.py:23 balanced_packing
upstream: vllm/distributed/eplb/policy/default.py:104 rebalance_experts_hierarchical
"""
from __future__ import annotations

import math  # noqa: F401  (expert_capacity and ep_step_time need it)

import numpy as np

PLACEMENTS = ("linear", "round_robin")  # the strategies determine_expert_map accepts


# ---------------------------------------------------------------- given helpers


def _positive_int(value, name: str) -> int:
    """Given. ``value`` as an int, refused (naming ``name``) unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _load_vector(loads, name: str = "loads") -> np.ndarray:
    """Given. ``loads`` as a float64 1-D array, refused (naming ``name``) unless it is a
    non-empty 1-D array of finite values >= 0."""
    arr = np.asarray(loads, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be a non-empty 1-D array of finite values >= 0")
    return arr


def _weight_matrix(weight, name: str = "weight") -> np.ndarray:
    """Given. ``weight`` as a float64 ``[X, n]`` array, refused (naming ``name``) unless it
    is 2-D with X, n >= 1 and every value finite and >= 0."""
    arr = np.asarray(weight, dtype=np.float64)
    if arr.ndim != 2 or 0 in arr.shape or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be a 2-D [layers, n] array of finite values >= 0")
    return arr


# ---------------------------------------------------------------- measuring the imbalance


def expert_loads(topk_ids, num_experts: int) -> np.ndarray:
    """Count the assignments each expert receives.

    topk_ids: integer ``[T, k]``, the router's choice for each token (as
    ``fused_topk`` returns it); every id in ``[0, num_experts)`` and the k ids
    of a row distinct (a router's top-k never names an expert twice).
    Returns int64 ``[num_experts]``: ``out[e]`` is the number of rows that
    contain ``e``. Experts nobody picked get 0; the sum is ``T * k``.

    Raises ValueError naming ``num_experts`` (not an integer >= 1) or
    ``topk_ids`` (not a 2-D integer array, an id out of range, or a row with a
    repeated id).
    """
    raise NotImplementedError("expert_loads: check the ids, then np.bincount with minlength")


def imbalance(loads) -> float:
    """The imbalance ratio ``max(loads) / mean(loads)``.

    1.0 is perfectly even; ``len(loads)`` is the worst case (one expert takes
    everything). Returns a Python float.

    Raises ValueError naming ``loads`` when it is not a non-empty 1-D array of
    finite values >= 0, or when every load is 0 (no mean to divide by).
    """
    raise NotImplementedError("imbalance: max(loads) / mean(loads), refusing all zeros")


# ---------------------------------------------------------------- expert parallelism


def expert_placement(num_experts: int, num_devices: int, placement: str = "linear") -> np.ndarray:
    """Which device holds each expert, as vLLM's ``determine_expert_map`` places them.

    With ``base = num_experts // num_devices`` and ``rem = num_experts %
    num_devices``, device ``r`` holds ``base + 1`` experts when ``r < rem``
    and ``base`` otherwise (the first ``rem`` devices take one extra each).

    * ``"linear"``: each device holds a contiguous run; device ``r``'s run
      starts at ``r * base + min(r, rem)``.
    * ``"round_robin"``: expert ``e`` lives on device ``e % num_devices``.

    Returns int64 ``[num_experts]``, ``out[e]`` the device of expert ``e``.

    Raises ValueError naming ``num_experts`` or ``num_devices`` (not an integer
    >= 1, or more devices than experts: ``num_devices``) and ``placement``
    (not one of ``PLACEMENTS``).

    upstream: vllm/model_executor/layers/fused_moe/expert_map_manager.py:22 determine_expert_map
    """
    raise NotImplementedError("expert_placement: e % D, or runs from r*base + min(r, rem)")


def ep_step_time(loads, num_devices: int, placement: str = "linear",
                 time_per_assignment: float = 1.0) -> float:
    """The time of one MoE layer under expert parallelism.

    Each device computes the assignments of the experts it holds
    (``expert_placement(len(loads), num_devices, placement)``) at
    ``time_per_assignment`` each; the layer ends when the busiest device ends.
    Returns ``time_per_assignment * max over devices of (sum of its experts'
    loads)``, a Python float.

    Raises ValueError naming ``loads`` (see ``imbalance``; all zeros are
    allowed here), ``time_per_assignment`` (not finite and > 0), and whatever
    ``expert_placement`` raises.
    """
    raise NotImplementedError("ep_step_time: sum the loads per device, take the max")


# ---------------------------------------------------------------- capacity and drops


def expert_capacity(capacity_factor: float, tokens: int, top_k: int, num_experts: int) -> int:
    """Assignments one expert may take: ``floor(capacity_factor * tokens * top_k / num_experts)``.

    ``tokens * top_k / num_experts`` is the load of a perfectly balanced
    expert; the capacity factor is the head-room above it.

    Raises ValueError naming ``capacity_factor`` (not finite and > 0),
    ``tokens``, ``top_k`` or ``num_experts`` (not an integer >= 1), and
    ``top_k`` when it exceeds ``num_experts``.
    """
    raise NotImplementedError("expert_capacity: floor(cf * tokens * top_k / num_experts)")


def dropped_tokens(loads, capacity_factor: float, tokens: int, top_k: int,
                   num_experts: int) -> int:
    """Assignments lost when every expert keeps at most ``expert_capacity(...)``.

    loads: ``[num_experts]`` assignment counts of one batch of ``tokens``
    tokens with ``top_k`` distinct experts each, so they must be integers,
    sum to ``tokens * top_k``, and none may exceed ``tokens`` (a token adds at
    most 1 to an expert). Returns ``sum(max(0, load - capacity))`` as an int.

    Raises ValueError naming ``loads`` (the rules above, or a length other than
    ``num_experts``) and whatever ``expert_capacity`` raises.
    """
    raise NotImplementedError("dropped_tokens: check the loads; sum(max(0, load - capacity))")


# ---------------------------------------------------------------- EPLB


def replicate_experts(weight, num_phy: int) -> tuple[np.ndarray, np.ndarray]:
    """Grow ``num_log`` logical experts into ``num_phy`` replicas, one layer per row.

    weight: ``[X, num_log]`` loads (float64 inside). Replicas ``0 .. num_log -
    1`` of a row are the logical experts themselves. Each further replica
    ``i = num_log .. num_phy - 1`` copies the expert whose load *per replica*,
    ``weight / logcnt``, is the largest right now (the first such expert on a
    tie, as ``np.argmax`` picks), and that expert's count grows by one.

    Returns ``(phy2log, logcnt)``: int64 ``[X, num_phy]``, the logical expert
    of each replica, and int64 ``[X, num_log]``, replicas per expert (each
    >= 1, each row summing to ``num_phy``).

    Raises ValueError naming ``weight`` (see ``_weight_matrix``) and
    ``num_phy`` (not an integer >= 1, or fewer than ``num_log``).

    upstream: vllm/distributed/eplb/policy/default.py:76 replicate_experts
    """
    raise NotImplementedError("replicate_experts: each extra slot copies argmax(weight / logcnt)")


def balanced_packing(weight, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Put ``n`` weighted items into ``num_packs`` packs of exactly ``n / num_packs`` items,
    keeping the pack weights as even as a greedy pass can.

    weight: ``[X, n]`` (float64 inside); each row is packed on its own.

    * When every pack holds one item (``n == num_packs``), item ``j`` goes to
      pack ``j`` with rank 0: no sorting at all.
    * Otherwise the items are visited heaviest first, in the order
      ``np.argsort(-weight, axis=-1)`` gives (upstream's call: tied items keep
      that order), and each goes to the lightest pack that still has room (the
      lowest pack index on a tie). Its rank is the number of items the pack
      held before it.

    Returns ``(pack_index, rank_in_pack)``, both int64 ``[X, n]``: for each
    pack and row, the ranks are ``0 .. n / num_packs - 1``.

    Raises ValueError naming ``weight`` (see ``_weight_matrix``) and
    ``num_packs`` (not an integer >= 1, or not dividing ``n``).

    upstream: vllm/distributed/eplb/policy/default.py:23 balanced_packing
    """
    raise NotImplementedError("balanced_packing: heaviest first, into the lightest pack with room")


def rebalance_global(weight, num_phy: int, num_gpus: int) -> np.ndarray:
    """vLLM's global EPLB policy: replicate, then pack the replicas onto GPUs.

    1. ``phy2log, logcnt = replicate_experts(weight, num_phy)``.
    2. Replica ``p`` of a row carries ``weight[log] / logcnt[log]`` with
       ``log = phy2log[p]`` (an expert's tokens split evenly over its copies).
    3. ``balanced_packing`` of those replica loads into ``num_gpus`` packs.
    4. Replica ``p`` moves to slot ``pack_index[p] * (num_phy // num_gpus) +
       rank_in_pack[p]``; GPU ``g`` owns slots ``g * (num_phy // num_gpus)``
       onward.

    Returns int64 ``[X, num_phy]``: the logical expert in each slot. This is
    upstream's ``rebalance_experts_hierarchical(weight, num_phy, 1, 1,
    num_gpus)``, the path ``rebalance_experts`` takes when the expert groups
    do not divide among the nodes.

    Raises ValueError naming ``weight``, ``num_phy`` (as in
    ``replicate_experts``) and ``num_gpus`` (not an integer >= 1, or not
    dividing ``num_phy``).

    upstream: vllm/distributed/eplb/policy/default.py:104 rebalance_experts_hierarchical
    """
    raise NotImplementedError("rebalance_global: replicate, pack, slot = pack * per_gpu + rank")


def replica_gpu_loads(weight, phy2log, num_gpus: int) -> np.ndarray:
    """Each GPU's load once ``phy2log``'s replicas serve ``weight``.

    weight: ``[X, num_log]``; phy2log: integer ``[X, num_phy]``, every logical
    expert present at least once per row. A logical expert's load is split
    evenly over its copies; GPU ``g`` holds slots ``g * (num_phy // num_gpus)
    .. (g + 1) * (num_phy // num_gpus) - 1``. Returns float64 ``[X,
    num_gpus]``; each row sums to the row of ``weight``.

    Raises ValueError naming ``weight``, ``phy2log`` (not an integer ``[X,
    num_phy]`` array of ids in ``[0, num_log)`` that names every expert) and
    ``num_gpus`` (not an integer >= 1 dividing ``num_phy``).
    """
    raise NotImplementedError("replica_gpu_loads: split each load over its copies, sum per GPU")


if __name__ == "__main__":
    loads = [64, 30, 10, 8, 6, 4, 4, 2]  # T = 64 tokens, top-2, 8 experts
    print(f"loads {loads}: imbalance {imbalance(loads):.3f}")
    print(f"capacity at cf 1.0: {expert_capacity(1.0, 64, 2, 8)}, "
          f"dropped {dropped_tokens(loads, 1.0, 64, 2, 8)} of 128")
    for place in PLACEMENTS:
        print(f"4 devices, {place:<11}: step time {ep_step_time(loads, 4, place):.0f} "
              f"(balanced: {sum(loads) / 4:.0f})")
    before = replica_gpu_loads([loads], [list(range(8))], 4)[0]
    phy2log = rebalance_global([loads], 12, 4)
    after = replica_gpu_loads([loads], phy2log, 4)[0]
    print(f"EPLB, 12 slots on 4 GPUs: slots {phy2log[0].tolist()}")
    print(f"GPU loads {before.tolist()} -> {after.tolist()}; "
          f"max/mean {imbalance(before):.4f} -> {imbalance(after):.4f}")
