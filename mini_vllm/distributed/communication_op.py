"""The two collectives a tensor-parallel model calls, on the current TP group.

Model code never touches process groups: a row-parallel layer calls
``tensor_model_parallel_all_reduce`` and the LM head calls
``tensor_model_parallel_gather`` (or ``..._all_gather``), exactly as vLLM's
layers do; ``parallel_state`` decides which group and which backend.

upstream: vllm/distributed/communication_op.py:12 tensor_model_parallel_all_reduce
upstream: vllm/distributed/communication_op.py:17 tensor_model_parallel_all_gather
upstream: vllm/distributed/communication_op.py:31 tensor_model_parallel_gather
"""
from __future__ import annotations

import torch

from mini_vllm.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum ``input_`` across the TP group (every rank gets the sum)."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate the ranks' ``input_`` along ``dim`` in rank order, on every rank."""
    return get_tp_group().all_gather(input_, dim)


def tensor_model_parallel_gather(input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
    """Concatenate along ``dim`` on rank ``dst`` only; the other ranks get ``None``."""
    return get_tp_group().gather(input_, dst, dim)
