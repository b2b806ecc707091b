"""Compilation and CUDA graphs for the torch model (off by default).

``config`` (CompilationMode, CUDAGraphMode, CompilationConfig, the capture-size
ladder), ``dispatcher`` (BatchDescriptor, CudagraphDispatcher), ``forward_context``
(the step's metadata for the attention op), ``backend`` (the torch.compile backend
that splits at attention) and ``cuda_graph`` (CUDAGraphWrapper). The torch model
in ``mini_vllm/models/torch_backend.py`` puts them together.
"""
from mini_vllm.compilation.config import (
    ATTENTION_OP,
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    default_capture_sizes,
)
from mini_vllm.compilation.dispatcher import BatchDescriptor, CudagraphDispatcher

__all__ = ["ATTENTION_OP", "BatchDescriptor", "CUDAGraphMode", "CompilationConfig", "CompilationMode",
           "CudagraphDispatcher", "default_capture_sizes"]
