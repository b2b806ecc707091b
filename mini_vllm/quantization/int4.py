"""W4A16: symmetric group-wise int4 weights, packed eight to an int32 as GPTQ does.

The weight is viewed ``[k, n]`` = ``[in, out]`` (GPTQ's layout, and the one
mini_vllm's model multiplies by). Along ``k`` it is cut into groups of
``group_size`` rows; each group of each output column has one float16 scale::

    scale = max(max / 7, -min / 8)         (1.0 for an all-zero group)
    code  = clip(rint(w / scale), -8, 7) + 8   in 0..15, the zero point 8 implied

and is dequantized as ``(code - 8) * scale``. Codes are packed along ``k``:
int32 ``qweight[r, c]`` holds the codes of rows ``8r .. 8r + 7`` of column c,
row ``8r + i`` in bits ``4i .. 4i + 3`` (upstream's ``pack_rows``). So the
stored weight is ``k/8 x n`` int32 (half a byte per weight) plus
``k/group_size x n`` float16 scales: 4 + 16/group_size bits per weight.

``group_size`` must divide the layer's input size: SmolLM2's hidden size is
576, so groups of 32, 64, 192 or 576 work and 128, GPTQ's usual choice, does
not; the error says so at load time rather than mid-forward.

``apply`` unpacks and dequantizes the codes on every call, then multiplies in
float32: what a W4A16 kernel does in registers, here in numpy. Slower than
float32 on a CPU; the point is the bytes stored, and the numbers they give.

upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:556 quantize_weights
upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:704 pack_rows
upstream: vllm/model_executor/layers/quantization/auto_gptq.py:302 AutoGPTQLinearMethod
"""
from __future__ import annotations

import numpy as np

from mini_vllm.quantization.base_config import (
    LinearLayer,
    LinearMethodBase,
    QuantizationConfig,
    check_options,
)

PACK_FACTOR = 8  # 4-bit codes per int32
ZERO_POINT = 8


def quantize_int4_groups(w_kn: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """w [k, n] float -> (codes uint8 [k, n] in 0..15, scales float16 [k / group_size, n])."""
    k, n = w_kn.shape
    groups = w_kn.astype(np.float32).reshape(k // group_size, group_size, n)
    scale = np.maximum(groups.max(axis=1) / np.float32(7), -groups.min(axis=1) / np.float32(8))
    scales = np.where(scale > 0, scale, np.float32(1)).astype(np.float16)
    # Codes from the float16 scale actually stored, so dequantization inverts them.
    codes = np.clip(np.rint(groups / scales.astype(np.float32)[:, None, :]), -8, 7) + ZERO_POINT
    return codes.reshape(k, n).astype(np.uint8), scales


def pack_rows(codes: np.ndarray) -> np.ndarray:
    """codes uint8 [k, n] (0..15) -> int32 [k / 8, n]; row 8r + i in bits 4i..4i+3."""
    k, n = codes.shape
    packed = np.zeros((k // PACK_FACTOR, n), dtype=np.uint32)
    for i in range(PACK_FACTOR):
        packed |= codes[i::PACK_FACTOR].astype(np.uint32) << np.uint32(4 * i)
    return packed.view(np.int32)


def unpack_rows(packed: np.ndarray) -> np.ndarray:
    """The inverse of ``pack_rows``: int32 [k / 8, n] -> uint8 [k, n]."""
    u = packed.view(np.uint32)
    shifts = (np.arange(PACK_FACTOR, dtype=np.uint32) * 4)[None, :, None]  # [1, 8, 1]
    codes = (u[:, None, :] >> shifts) & np.uint32(0xF)  # [k/8, 8, n]: row 8r + i at [r, i]
    return codes.reshape(-1, u.shape[1]).astype(np.uint8)


class Int4GroupLinearMethod(LinearMethodBase):
    """Stores ``qweight`` int32 [in/8, out] and ``scales`` float16 [in/group_size, out]."""

    def __init__(self, group_size: int = 32) -> None:
        self.group_size = group_size

    def create_weights(self, layer: LinearLayer, input_size: int, output_size: int) -> None:
        if input_size % self.group_size:
            raise ValueError(f"group_size must divide the input size of {layer.prefix or 'the layer'} "
                             f"({input_size}), got {self.group_size}")
        if input_size % PACK_FACTOR:
            raise ValueError(f"int4 packs {PACK_FACTOR} rows per int32: the input size of "
                             f"{layer.prefix or 'the layer'} must be a multiple of {PACK_FACTOR}, "
                             f"got {input_size}")
        super().create_weights(layer, input_size, output_size)

    def process_weights_after_loading(self, layer: LinearLayer) -> None:
        codes, layer.scales = quantize_int4_groups(layer.weight.T, self.group_size)
        layer.qweight = pack_rows(codes)
        del layer.weight

    def dequantize(self, layer: LinearLayer) -> np.ndarray:
        """The weight the method multiplies by: float32 [in, out]."""
        codes = unpack_rows(layer.qweight).astype(np.float32) - np.float32(ZERO_POINT)
        k, n = codes.shape
        scales = layer.scales.astype(np.float32)
        return (codes.reshape(-1, self.group_size, n) * scales[:, None, :]).reshape(k, n)

    def apply(self, layer: LinearLayer, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        out = x @ self.dequantize(layer)
        if bias is not None:
            out += bias
        return out


class Int4GroupConfig(QuantizationConfig):
    """``quantization="int4"``, option ``{"group_size": 32}``: a multiple of 8 that must also
    divide the input size of every linear layer (checked when the model is built)."""

    def __init__(self, group_size: int = 32) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < PACK_FACTOR \
                or group_size % PACK_FACTOR:
            raise ValueError(f"group_size must be a multiple of {PACK_FACTOR} that is >= "
                             f"{PACK_FACTOR}, got {group_size!r}")
        self.group_size = group_size

    def get_name(self) -> str:
        return "int4"

    @classmethod
    def from_config(cls, config: dict) -> Int4GroupConfig:
        check_options("int4", config, ("group_size",))
        return cls(**config)

    def get_quant_method(self, layer: LinearLayer, prefix: str) -> Int4GroupLinearMethod:
        return Int4GroupLinearMethod(self.group_size)
