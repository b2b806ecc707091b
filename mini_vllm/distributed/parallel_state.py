"""Process groups for tensor parallelism: who talks to whom, and the collectives they run.

vLLM wraps each ``torch.distributed`` group in a ``GroupCoordinator`` that
knows its ranks and dispatches ``all_reduce`` / ``all_gather`` to the fastest
communicator for the device (custom all-reduce or NCCL on GPUs, gloo or
shared memory on CPUs). mini_vllm keeps the class and its two calls, with
one communicator: whatever backend the default group was created with
(gloo on the CPU, NCCL on GPUs). Each coordinator counts the collectives it
runs (``num_collectives``), so a test can check "one all-reduce per
row-parallel layer" instead of trusting it.

Only the tensor-parallel group exists here (pipeline, data and context
parallelism are Phase 10's labs, not engine features): with TP = N the whole
world is one TP group ``[0, ..., N - 1]``.

upstream: vllm/distributed/parallel_state.py:290 GroupCoordinator
upstream: vllm/distributed/parallel_state.py:1370 init_distributed_environment
upstream: vllm/distributed/parallel_state.py:1506 initialize_model_parallel
upstream: vllm/distributed/parallel_state.py:1241 get_tp_group
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


class GroupCoordinator:
    """One process group: ``rank`` (within the group), ``world_size``, ``ranks`` (global ids).

    ``all_reduce`` and ``all_gather`` return new tensors and leave their input
    alone, as upstream's do; with a group of one they return the input and
    count nothing (upstream's "bypass the function if we are using only 1 GPU").

    upstream: vllm/distributed/parallel_state.py:514 GroupCoordinator.all_reduce
    upstream: vllm/distributed/parallel_state.py:543 GroupCoordinator.all_gather
    """

    def __init__(self, ranks: list[int], group_name: str = "tp") -> None:
        self.ranks = list(ranks)
        self.world_size = len(self.ranks)
        self.rank = self.ranks.index(dist.get_rank())
        self.unique_name = group_name
        # new_group must be called by every process of the world, in the same order.
        self.device_group = dist.new_group(self.ranks)
        self.num_collectives = 0  # all-reduces and gathers run through this group

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of ``input_`` over the group's ranks (same shape)."""
        if self.world_size == 1:
            return input_
        out = input_.clone()
        dist.all_reduce(out, group=self.device_group)
        self.num_collectives += 1
        return out

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' tensors concatenated along ``dim`` in rank order (every rank gets it)."""
        if self.world_size == 1:
            return input_
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_.contiguous(), group=self.device_group)
        self.num_collectives += 1
        return torch.cat(parts, dim=dim)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Like ``all_gather`` but only rank ``dst`` receives the result; the others get ``None``.

        upstream: vllm/distributed/parallel_state.py:602 GroupCoordinator.gather
        """
        if self.world_size == 1:
            return input_
        input_ = input_.contiguous()
        parts = [torch.empty_like(input_) for _ in range(self.world_size)] if self.rank == dst else None
        dist.gather(input_, parts, dst=self.ranks[dst], group=self.device_group)
        self.num_collectives += 1
        return torch.cat(parts, dim=dim) if self.rank == dst else None


_TP: GroupCoordinator | None = None


def init_distributed_environment(world_size: int, rank: int, distributed_init_method: str,
                                 backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """Join the default process group (``gloo`` on the CPU, ``nccl`` on GPUs).

    ``distributed_init_method`` is a rendezvous URL; mini_vllm uses ``file://``
    in a fresh temporary folder, so parallel worlds never meet. ``timeout_s``
    bounds how long a collective may wait for its peers inside torch; the
    executor's own (shorter) timeout kills a hung world first.
    """
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=distributed_init_method, rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))


def initialize_model_parallel(tensor_model_parallel_size: int = 1) -> None:
    """Build the TP groups: consecutive ranks, ``world_size / tp`` groups of ``tp`` ranks.

    Upstream lays all ranks out as ``arange(world).reshape(-1, DP, PP, PCP, TP)``
    and takes TP groups along the last axis; with PP = DP = PCP = 1 that is
    this ``view(-1, tp)``.

    upstream: vllm/distributed/parallel_state.py:1581 all_ranks
    """
    global _TP
    world_size = dist.get_world_size()
    if world_size % tensor_model_parallel_size:
        raise ValueError(f"tensor_model_parallel_size ({tensor_model_parallel_size}) must divide "
                         f"the world size ({world_size})")
    groups = torch.arange(world_size).view(-1, tensor_model_parallel_size).tolist()
    for ranks in groups:  # every rank creates every group, as new_group requires
        coordinator = GroupCoordinator(ranks, "tp")
        if dist.get_rank() in ranks:
            _TP = coordinator


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> GroupCoordinator:
    if _TP is None:
        raise RuntimeError("tensor model parallel group is not initialized "
                           "(call initialize_model_parallel first)")
    return _TP


def get_tensor_model_parallel_world_size() -> int:
    """upstream: vllm/distributed/parallel_state.py:1849 get_tensor_model_parallel_world_size"""
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    """upstream: vllm/distributed/parallel_state.py:1854 get_tensor_model_parallel_rank"""
    return get_tp_group().rank


def destroy_model_parallel() -> None:
    """Forget the groups and leave the default process group (a worker's last act)."""
    global _TP
    _TP = None
    if dist.is_initialized():
        dist.destroy_process_group()
