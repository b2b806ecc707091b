"""W8A16: int8 weights with one float32 scale per output channel.

Each row ``W[o, :]`` (one output channel) gets ``scale[o] = max|W[o, :]| / 127``
and is stored as ``round(W[o, :] / scale[o])`` in int8, symmetric, so the codes
stay in [-127, 127] and 0.0 is exact. An all-zero row gets scale 1.0 (its
codes are all 0, and nothing divides by zero). The multiplication runs in
float32 on the dequantized codes; because the scale belongs to the output
channel it can be pulled out of the sum::

    y[t, o] = sum_i x[t, i] * q[o, i] * scale[o] = (x @ q.T)[t, o] * scale[o]

so ``apply`` multiplies by the float codes and scales the result columns,
never building the float weight. That is the W8A16 trade: a quarter of the
float32 bytes to read, the arithmetic unchanged.

Upstream's closest relative is ``int8_per_channel_weight_only``, an online
shorthand that quantizes MoE experts this way (its linear layers stay
unquantized).

upstream: vllm/config/quantization.py:126 int8_per_channel_weight_only
"""
from __future__ import annotations

import numpy as np

from mini_vllm.quantization.base_config import (
    LinearLayer,
    LinearMethodBase,
    QuantizationConfig,
    check_options,
)

INT8_MAX = 127


def quantize_int8_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] float -> (codes int8 [out, in], scales float32 [out])."""
    amax = np.abs(w).max(axis=1).astype(np.float32)
    scales = np.where(amax > 0, amax / np.float32(INT8_MAX), np.float32(1.0)).astype(np.float32)
    codes = np.clip(np.rint(w / scales[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return codes, scales


class Int8LinearMethod(LinearMethodBase):
    """Replaces ``weight`` by its int8 codes [out, in] and adds ``weight_scale`` [out].

    Keeping the name ``weight`` for the quantized tensor is upstream's habit
    too (its online methods swap the parameter in place).
    """

    def process_weights_after_loading(self, layer: LinearLayer) -> None:
        # Rebinding ``weight`` drops the layer's reference to the float32 matrix.
        layer.weight, layer.weight_scale = quantize_int8_per_channel(layer.weight)

    def apply(self, layer: LinearLayer, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        out = x @ layer.weight.T.astype(np.float32)
        out *= layer.weight_scale
        if bias is not None:
            out += bias
        return out


class Int8Config(QuantizationConfig):
    """``quantization="int8"``: every linear layer W8A16, no options."""

    def get_name(self) -> str:
        return "int8"

    @classmethod
    def from_config(cls, config: dict) -> Int8Config:
        check_options("int8", config, ())
        return cls()

    def get_quant_method(self, layer: LinearLayer, prefix: str) -> Int8LinearMethod:
        return Int8LinearMethod()
