"""Which graph serves a step: pad the batch to a capture size, then look the key up.

The dispatcher is built once from the capture sizes and the mode. For each
step it rounds the token count up to the next capture size (``padded``) and
returns the runtime mode and the ``BatchDescriptor`` that names the graph:

* a PIECEWISE key carries only the padded token count: the pieces between
  attention ops see ``[num_tokens, hidden]`` and nothing else, so one graph
  serves any mix of requests;
* a FULL key (attention inside the graph) also carries the request count and
  whether the batch is a uniform decode, because the attention kernel's launch
  depends on them;
* above the largest capture size, or with graphs off, the step runs eager.

upstream: vllm/v1/cudagraph_dispatcher.py:15 CudagraphDispatcher
upstream: vllm/v1/cudagraph_dispatcher.py:239 dispatch
upstream: vllm/forward_context.py:30 BatchDescriptor
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from mini_vllm.compilation.config import CUDAGraphMode


@dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int  # padded
    num_reqs: int | None = None  # None: any number of requests (PIECEWISE keys)
    uniform: bool = False  # every request has the same query length (a uniform decode)


class CudagraphDispatcher:
    def __init__(self, capture_sizes: list[int], max_num_seqs: int, cudagraph_mode: CUDAGraphMode,
                 uniform_decode_query_len: int = 1) -> None:
        if cudagraph_mode and not capture_sizes:
            raise ValueError(f"capture_sizes must not be empty with cudagraph_mode {cudagraph_mode.name}")
        self.capture_sizes = sorted(capture_sizes)
        self.max_num_seqs = max_num_seqs
        self.mode = cudagraph_mode
        self.uniform_decode_query_len = uniform_decode_query_len
        self.keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(), CUDAGraphMode.FULL: set()}
        if not cudagraph_mode:
            return
        if cudagraph_mode.mixed_mode():
            for size in self.capture_sizes:
                desc = self._padded(size, uniform=False)
                if cudagraph_mode.mixed_mode() == CUDAGraphMode.PIECEWISE:
                    desc = replace(desc, num_reqs=None, uniform=False)  # the relaxed key
                self.keys[cudagraph_mode.mixed_mode()].add(desc)
        if cudagraph_mode.decode_mode() == CUDAGraphMode.FULL and cudagraph_mode.separate_routine():
            q = uniform_decode_query_len
            for size in self.capture_sizes:
                if q <= size <= q * max_num_seqs:
                    self.keys[CUDAGraphMode.FULL].add(self._padded(size, uniform=True))

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def padded_size(self, num_tokens: int) -> int | None:
        """The smallest capture size >= num_tokens, or None above the ladder."""
        for size in self.capture_sizes:
            if size >= num_tokens:
                return size
        return None

    def _padded(self, num_tokens: int, uniform: bool) -> BatchDescriptor:
        padded = self.padded_size(num_tokens)
        if uniform and self.mode.has_mode(CUDAGraphMode.FULL):
            return BatchDescriptor(padded, min(padded // self.uniform_decode_query_len, self.max_num_seqs),
                                   True)
        return BatchDescriptor(padded, min(padded, self.max_num_seqs), False)

    def dispatch(self, num_tokens: int, uniform_decode: bool = False) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """(runtime mode, descriptor): FULL if its key exists, else the relaxed PIECEWISE key, else eager."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
        if not self.mode or num_tokens > self.max_capture_size:
            return CUDAGraphMode.NONE, BatchDescriptor(num_tokens)
        desc = self._padded(num_tokens, uniform_decode and self.mode.separate_routine())
        if desc in self.keys[CUDAGraphMode.FULL]:
            return CUDAGraphMode.FULL, desc
        relaxed = replace(desc, num_reqs=None, uniform=False)
        if relaxed in self.keys[CUDAGraphMode.PIECEWISE]:
            return CUDAGraphMode.PIECEWISE, relaxed
        return CUDAGraphMode.NONE, BatchDescriptor(num_tokens)
