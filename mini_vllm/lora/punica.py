"""Batched LoRA over a mixed batch, the Punica way, in numpy.

Every adapter that may run in a step sits in a slot of a stacked weight:
``lora_a_stacked[i]`` is ``[max_loras, 1, max_lora_rank, in]`` and
``lora_b_stacked[i]`` is ``[max_loras, 1, out_i, max_lora_rank]`` for output
slice ``i`` of a packed layer (q, k, v of ``qkv_proj``). Ranks below
``max_lora_rank`` are zero-padded, which adds exact zeros. Each row of the
flat batch has a slot index in ``token_lora_indices``; -1 means "no adapter",
and such a row must come out exactly as the base layer made it.

``add_lora_linear`` adds, for each slice, ``shrink`` (``x @ A.T``, the rank-r
buffer) then ``expand`` (``buffer @ B.T``, into the slice's columns of y). This
version groups rows by slot, so each adapter costs two small matmuls per slice
and rows with -1 are never touched.

At the pin, vLLM's CPU path (``PunicaWrapperCPU`` over the torch ops) indexes the
stacks with the row indices directly, so a -1 row picks the *last* slot's
adapter; the GPU Triton kernels skip -1. mini_vllm skips it, as the GPU does
(Phase 11, lab 01).

upstream: vllm/lora/punica_wrapper/punica_base.py:88 add_lora_linear
upstream: vllm/lora/punica_wrapper/punica_cpu.py:265 add_lora_linear
upstream: vllm/lora/ops/torch_ops/lora_ops.py:67 bgmv_shrink
"""
from __future__ import annotations

import numpy as np


class PunicaWrapperNumpy:
    """Holds the step's per-row slot indices and applies the stacked adapters with them."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.token_lora_indices = np.zeros(0, dtype=np.int64)
        self._groups: list[tuple[int, np.ndarray]] = []  # (slot, rows), slots in increasing order

    @property
    def no_lora(self) -> bool:
        return not self._groups

    def update_metadata(self, token_lora_indices: np.ndarray) -> None:
        """Set the slot of every row of the next forward pass (-1: no adapter)."""
        idx = np.asarray(token_lora_indices, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError(f"token_lora_indices must be 1-D, got shape {idx.shape}")
        bad = idx[(idx < -1) | (idx >= self.max_loras)]
        if bad.size:
            raise ValueError(f"token_lora_indices must be -1 (no adapter) or a slot in [0, {self.max_loras}), "
                             f"got {bad[:5].tolist()}")
        self.token_lora_indices = idx
        self._groups = [(int(s), np.flatnonzero(idx == s)) for s in np.unique(idx) if s >= 0]

    def add_lora_linear(self, y: np.ndarray, x: np.ndarray, lora_a_stacked: tuple[np.ndarray, ...],
                        lora_b_stacked: tuple[np.ndarray, ...], scale: float,
                        output_slices: tuple[int, ...]) -> None:
        """``y[:, slice i] += scale * (x @ A_i[slot].T) @ B_i[slot].T`` for each row's slot, in place.

        x: [T, in]; y: [T, sum(output_slices)]. Rows whose slot is -1 are left as they are.
        """
        if len(x) != len(self.token_lora_indices) or len(y) != len(x):
            raise ValueError(f"x has {len(x)} rows and y {len(y)}, but token_lora_indices has "
                             f"{len(self.token_lora_indices)}: call update_metadata for this batch first")
        if sum(output_slices) != y.shape[1]:
            raise ValueError(f"output_slices {output_slices} must sum to y's width {y.shape[1]}")
        for slot, rows in self._groups:
            xs = x[rows]
            offset = 0
            for a, b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
                buffer = xs @ a[slot, 0].T  # shrink: [rows, max_lora_rank]
                if scale != 1.0:
                    buffer *= np.float32(scale)
                y[rows, offset:offset + size] += buffer @ b[slot, 0].T  # expand into slice i
                offset += size
