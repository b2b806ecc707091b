"""Capture a piece once per batch shape, replay it after: ``CUDAGraphWrapper``.

A CUDA graph records the kernels a piece launches, with the addresses of every
tensor they touch. Replaying it relaunches them all at once, from the GPU,
with no Python in between; but it always reads the *same* addresses. So the
wrapper keeps, per ``BatchDescriptor``, the inputs it captured with (the static
buffers) and, before each replay, copies the new inputs into them. Inputs that
already live at the captured address (weights; the output of the previous
captured piece) need no copy. The outputs are the graph's own buffers:
valid until the next replay of the same graph.

The runtime mode and descriptor come from the forward context: a wrapper
replays only when the step was dispatched to its mode (PIECEWISE here) and
otherwise calls the piece eagerly. On a CPU there is nothing to capture; the
wrapper calls through, and the padding it relies on is still applied, so the
CPU tests exercise everything but the recording itself.

upstream: vllm/compilation/cuda_graph.py:145 CUDAGraphWrapper
upstream: vllm/compilation/cuda_graph.py:233 CUDAGraphWrapper.__call__
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_vllm.compilation.config import CUDAGraphMode


@dataclass
class CUDAGraphEntry:
    graph: torch.cuda.CUDAGraph
    inputs: list  # the static input buffers (tensors) or values captured with
    output: object  # the graph's output tensors
    num_replays: int = 0


class CUDAGraphWrapper(torch.nn.Module):
    """Stands in for one piece of the split graph (an ``nn.Module``, so FX can hold it)."""

    def __init__(self, runnable, runtime_mode: CUDAGraphMode) -> None:
        super().__init__()
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.entries: dict = {}  # BatchDescriptor -> CUDAGraphEntry
        self.num_eager_calls = 0

    def forward(self, *args):
        from mini_vllm.compilation.forward_context import get_forward_context

        ctx = get_forward_context()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        on_cuda = bool(tensors) and tensors[0].is_cuda
        if ctx.cudagraph_runtime_mode != self.runtime_mode or not on_cuda:
            self.num_eager_calls += 1
            return self.runnable(*args)
        key = ctx.batch_descriptor
        entry = self.entries.get(key)
        if entry is None:
            return self._capture(key, args, ctx.static_ptrs)
        for static, new in zip(entry.inputs, args, strict=True):
            if isinstance(new, torch.Tensor) and new.data_ptr() != static.data_ptr():
                static.copy_(new)
        entry.graph.replay()
        entry.num_replays += 1
        return entry.output

    def _capture(self, key, args, static_ptrs):
        # Weights keep their address for the engine's lifetime: captured in place.
        # Everything else gets a buffer of its own that replays copy into.
        inputs = [a.clone() if isinstance(a, torch.Tensor) and a.data_ptr() not in static_ptrs else a
                  for a in args]
        torch.cuda.synchronize()
        self.runnable(*inputs)  # warm-up: lazy initialisation must not be recorded
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = self.runnable(*inputs)
        self.entries[key] = CUDAGraphEntry(graph, inputs, output)
        graph.replay()  # the captured run only recorded: run it once for this step's answer
        return output
