"""W8A8 FP8: E4M3 weights with one scale per tensor, activations quantized per token.

FP8 E4M3 (``float8_e4m3fn``) has 4 exponent bits and 3 mantissa bits; its
largest finite value is 448 and it has no infinity. A tensor is stored as
``fp8(x / scale)`` with ``scale = amax / 448``, so its largest entry lands on
448. Two details decide whether this works:

- **Clamp before casting.** The division can still overshoot 448 by a
  rounding error (and a static scale can be too small); what a float8 cast does
  then depends on the library: torch's CPU cast saturates here, ``ml_dtypes``
  (used below) returns NaN. The quantizer clamps to [-448, 448] itself, as
  upstream's kernels do, instead of trusting the cast.
- **A floor on the scale.** An all-zero row would get scale 0 and divide by
  it; upstream's per-token kernel floors the scale at ``1 / (448 * 512)``, and
  so does this file, for every scale it computes.

This mirrors upstream's online ``fp8_per_tensor`` method: weights quantized
once at load with a per-tensor scale, activations quantized dynamically per
token on every call. The matmul multiplies the float8 values (exactly
representable in float32, so their products are exact) with float32
accumulation, then applies ``x_scale[t] * w_scale`` to each output: what
``torch._scaled_mm`` computes, emulated in numpy.

upstream: vllm/model_executor/layers/quantization/online/fp8.py:102 Fp8PerTensorOnlineLinearMethod
upstream: vllm/_custom_ops.py:1905 scaled_fp8_quant
upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:27 get_fp8_min_max
upstream: csrc/quantization/utils.cuh:49 min_scaling_factor
"""
from __future__ import annotations

import numpy as np

from mini_vllm.quantization.base_config import (
    LinearLayer,
    LinearMethodBase,
    QuantizationConfig,
    check_options,
)

FP8_E4M3_MAX = 448.0
MIN_SCALE = 1.0 / (FP8_E4M3_MAX * 512.0)


def fp8_dtype():
    """numpy's float8_e4m3fn, from ml_dtypes (an optional dependency: ``pip install ml_dtypes``)."""
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - ml_dtypes is in the dev extras
        raise ImportError("FP8 in numpy needs ml_dtypes (pip install ml_dtypes, or the "
                          "'quant' extra)") from e
    return ml_dtypes.float8_e4m3fn


_FP8_TO_FLOAT32: np.ndarray | None = None


def fp8_to_float32(a: np.ndarray) -> np.ndarray:
    """Widen float8_e4m3fn values to float32 exactly, by table lookup on their 256 bit patterns.

    The same result as ``a.astype(np.float32)``, a few times faster: ml_dtypes
    converts element by element, while indexing a 256-entry table is one
    vectorized gather.
    """
    global _FP8_TO_FLOAT32
    if _FP8_TO_FLOAT32 is None:
        _FP8_TO_FLOAT32 = np.arange(256, dtype=np.uint8).view(fp8_dtype()).astype(np.float32)
    return _FP8_TO_FLOAT32[a.view(np.uint8)]


def to_fp8(x: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """fp8(clamp(x / scale, -448, 448)); ``scale`` broadcasts against x."""
    return np.clip(x / scale, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(fp8_dtype())


def quantize_fp8_per_tensor(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    scale = np.float32(max(float(np.abs(x).max()) / FP8_E4M3_MAX, MIN_SCALE))
    return to_fp8(x, scale), scale


def quantize_fp8_per_token(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, K] -> (fp8 [T, K], scales float32 [T, 1]), one scale per row."""
    amax = np.abs(x).max(axis=1, keepdims=True).astype(np.float32)
    scale = np.maximum(amax / np.float32(FP8_E4M3_MAX), np.float32(MIN_SCALE))
    return to_fp8(x, scale), scale


class Fp8LinearMethod(LinearMethodBase):
    """Replaces ``weight`` by float8_e4m3fn codes [out, in] and adds a float32 ``weight_scale``."""

    def process_weights_after_loading(self, layer: LinearLayer) -> None:
        layer.weight, scale = quantize_fp8_per_tensor(layer.weight)
        layer.weight_scale = np.array(scale, dtype=np.float32)

    def apply(self, layer: LinearLayer, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x_fp8, x_scale = quantize_fp8_per_token(x)
        out = fp8_to_float32(x_fp8) @ fp8_to_float32(layer.weight).T
        out *= x_scale * layer.weight_scale
        if bias is not None:
            out += bias
        return out


class Fp8Config(QuantizationConfig):
    """``quantization="fp8"``: every linear layer W8A8 FP8, no options."""

    def __init__(self) -> None:
        fp8_dtype()  # fail at configuration time, not in the first forward

    def get_name(self) -> str:
        return "fp8"

    @classmethod
    def from_config(cls, config: dict) -> Fp8Config:
        check_options("fp8", config, ())
        return cls()

    def get_quant_method(self, layer: LinearLayer, prefix: str) -> Fp8LinearMethod:
        return Fp8LinearMethod()
