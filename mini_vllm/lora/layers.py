"""A linear layer with a slot-stacked LoRA on top.

``LinearWithLoRA`` wraps one of mini_vllm's ``LinearLayer`` objects (float32 or
quantized, it does not care): the base layer computes ``y`` as always, then
the Punica wrapper adds each row's adapter into it. The stacks are allocated
once, for ``max_loras`` slots of rank ``max_lora_rank``, as vLLM allocates them
when it builds the model; loading an adapter only copies into a slot.

upstream: vllm/lora/layers/base_linear.py:69 BaseLinearLayerWithLoRA
upstream: vllm/lora/layers/base_linear.py:185 apply
"""
from __future__ import annotations

import numpy as np

from mini_vllm.lora.punica import PunicaWrapperNumpy


class LinearWithLoRA:
    def __init__(self, base_layer, output_slices: tuple[int, ...], max_loras: int, max_lora_rank: int,
                 punica_wrapper: PunicaWrapperNumpy) -> None:
        if sum(output_slices) != base_layer.output_size:
            raise ValueError(f"output_slices {output_slices} must sum to the layer's output_size "
                             f"{base_layer.output_size}")
        self.base_layer = base_layer
        self.output_slices = tuple(output_slices)
        self.punica_wrapper = punica_wrapper
        n_in = base_layer.input_size
        self.lora_a_stacked = tuple(np.zeros((max_loras, 1, max_lora_rank, n_in), np.float32)
                                    for _ in output_slices)
        self.lora_b_stacked = tuple(np.zeros((max_loras, 1, n, max_lora_rank), np.float32)
                                    for n in output_slices)

    # the base layer's identity, so code that inspects a model's linears keeps working
    @property
    def input_size(self) -> int:
        return self.base_layer.input_size

    @property
    def output_size(self) -> int:
        return self.base_layer.output_size

    @property
    def prefix(self) -> str:
        return self.base_layer.prefix

    def weight_bytes(self) -> int:
        return self.base_layer.weight_bytes()

    def lora_bytes(self) -> int:
        """Bytes the preallocated slots take, whatever is loaded in them."""
        return sum(a.nbytes for a in self.lora_a_stacked) + sum(b.nbytes for b in self.lora_b_stacked)

    def reset_lora(self, index: int) -> None:
        for a, b in zip(self.lora_a_stacked, self.lora_b_stacked, strict=True):
            a[index] = 0
            b[index] = 0

    def set_lora(self, index: int, lora_a: list[np.ndarray | None], lora_b: list[np.ndarray | None]) -> None:
        """Copy one adapter's pairs (one per output slice, None: that slice not adapted) into slot ``index``."""
        self.reset_lora(index)
        for i, (a, b) in enumerate(zip(lora_a, lora_b, strict=True)):
            if a is None:
                continue
            r = a.shape[0]
            self.lora_a_stacked[i][index, 0, :r, :] = a
            self.lora_b_stacked[i][index, 0, :, :r] = b

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.base_layer(x)
        if not self.punica_wrapper.no_lora:
            self.punica_wrapper.add_lora_linear(y, x, self.lora_a_stacked, self.lora_b_stacked, 1.0,
                                                self.output_slices)
        return y

    def __repr__(self) -> str:
        return f"LinearWithLoRA({self.base_layer!r}, slices={self.output_slices})"
