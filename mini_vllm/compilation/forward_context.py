"""The step's metadata, where a compiled graph cannot see it: a module-level slot.

Dynamo traces the model's tensor code into a graph; the attention op stays
opaque in that graph and, when it runs, needs what the graph does not carry:
the step's ``ModelInput``, the KV caches, the attention backend, how many rows
are real (the rest is padding). The runner sets them around each forward pass
with ``set_forward_context``; the op reads them with ``get_forward_context``.

upstream: vllm/forward_context.py:30 BatchDescriptor
upstream: vllm/model_executor/layers/attention/attention.py:734 unified_attention_with_output
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from mini_vllm.compilation.config import CUDAGraphMode
from mini_vllm.compilation.dispatcher import BatchDescriptor


@dataclass
class ForwardContext:
    model_input: Any  # the step's ModelInput (real rows only)
    kv_cache: Any  # the model's [layers, 2, blocks, block_size, kv_heads, head_dim] tensor
    attn_backend: Any  # an AttentionBackend instance
    scale: float
    num_tokens: int  # real rows; rows past this are padding
    batch_descriptor: BatchDescriptor
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    slot_mapping: Any = None  # the real rows' slots, as a tensor on the model's device
    static_ptrs: frozenset = frozenset()  # addresses of the weights (never copied into a graph)


_CONTEXT: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _CONTEXT is None:
        raise RuntimeError("no forward context is set: the attention op runs only inside "
                           "set_forward_context(...), during a model step")
    return _CONTEXT


@contextlib.contextmanager
def set_forward_context(context: ForwardContext):
    global _CONTEXT
    previous, _CONTEXT = _CONTEXT, context
    try:
        yield context
    finally:
        _CONTEXT = previous
