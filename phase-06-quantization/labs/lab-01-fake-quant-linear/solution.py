"""Lab 06-01 — int8 weights, one scale per output channel (W8A16) (reference solution).

The cheapest useful quantization keeps the arithmetic in floating point and
shrinks only the weights: each float32 weight becomes a signed 8-bit code, and
each *output channel* (a row of ``W [out, in]``, the layout vLLM and torch's
``F.linear`` use) keeps one float32 scale. A matmul reads a quarter of the
bytes, dequantizes on the fly and multiplies by full-precision activations:
"W8A16" (8-bit weights, 16-bit activations on a GPU; float32 here).

Symmetric int8, per row ``o``::

    scale[o] = max_i |W[o, i]| / 127          (1.0 for an all-zero row)
    q[o, i]  = clip(rint(W[o, i] / scale[o]), -127, 127)   as int8
    W[o, i] ~= q[o, i] * scale[o]

``rint`` rounds half to even, as ``torch.round`` does upstream. The code -128
exists in int8 but is never produced: the grid is symmetric around 0.

The second half of the lab is the shape vLLM gives every quantization format,
``QuantizeMethodBase``: ``create_weights`` declares the layer's storage,
the loader fills it, ``process_weights_after_loading`` converts it, and
``apply`` runs it on every forward. ``Int8LinearMethod`` is that shape for
this format; ``Lab01Int8Config`` registers it under the name ``"lab01-int8"``
so that ``LLMEngine("tiny-random", quantization="lab01-int8")`` builds every
linear layer of the model with it.

upstream: vllm/model_executor/layers/quantization/online/int8.py:56 _quantize_weights
upstream: vllm/model_executor/layers/quantization/base_config.py:19 QuantizeMethodBase
upstream: vllm/model_executor/layers/quantization/__init__.py:59 register_quantization_config
"""
from __future__ import annotations

import numpy as np

from mini_vllm.quantization import (
    LinearLayer,
    LinearMethodBase,
    QuantizationConfig,
    register_quantization_config,
)

QMAX = 127  # the largest int8 code used; -QMAX is the smallest (symmetric grid)


# ---------------------------------------------------------------- given helpers


def _as_matrix(a, name: str) -> np.ndarray:
    """Given. ``a`` as a float32 2-D array (no copy when it already is one).

    Raises ValueError naming ``name`` unless ``a`` is a non-empty 2-D array of
    finite numbers.
    """
    arr = np.asarray(a)
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a non-empty 2-D array of numbers, got shape "
                         f"{arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must hold finite numbers (no NaN or inf)")
    return arr


# ---------------------------------------------------------------- the format


def quantize_per_channel(W) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization with one scale per output channel (row).

    W: float ``[out, in]`` (computed in float32; not modified).
    Returns ``(q, scales)``: ``q`` int8 ``[out, in]`` with every code in
    [-127, 127]; ``scales`` float32 ``[out]`` with
    ``scales[o] = max|W[o, :]| / 127``, or 1.0 for a row that is all zero.
    ``q[o, i] = clip(rint(W[o, i] / scales[o]), -127, 127)``.

    Raises ValueError naming ``W`` unless it is a non-empty 2-D array of
    finite numbers.
    """
    w = _as_matrix(W, "W")
    absmax = np.abs(w).max(axis=1)  # one value per output row
    # An all-zero row would give scale 0 and 0 / 0 = NaN codes; scale 1 gives
    # codes 0, and 0 * 1 reproduces the row exactly.
    scales = np.where(absmax > 0, absmax / np.float32(QMAX), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(w / scales[:, None]), -QMAX, QMAX).astype(np.int8)
    return q, scales


def quantize_per_tensor(W) -> tuple[np.ndarray, np.float32]:
    """Symmetric int8 quantization with a single scale for the whole matrix.

    W: float ``[out, in]`` (computed in float32; not modified).
    Returns ``(q, scale)``: ``q`` int8 ``[out, in]`` in [-127, 127] and
    ``scale`` a float32 scalar, ``max|W| / 127`` (1.0 when W is all zero).

    Raises ValueError naming ``W`` unless it is a non-empty 2-D array of
    finite numbers.
    """
    w = _as_matrix(W, "W")
    absmax = np.abs(w).max()
    scale = np.float32(absmax / np.float32(QMAX)) if absmax > 0 else np.float32(1.0)
    q = np.clip(np.rint(w / scale), -QMAX, QMAX).astype(np.int8)
    return q, scale


def dequantize(q, scales) -> np.ndarray:
    """Codes back to float32 weights: ``W_hat[o, i] = q[o, i] * scales[o]``.

    q: int8 ``[out, in]``. scales: float ``[out]`` (per channel) or a scalar
    (per tensor). Returns float32 ``[out, in]``.

    Raises ValueError naming ``q`` unless it is a 2-D int8 array, and naming
    ``scales`` unless its shape is ``(out,)`` or ``()``.
    """
    codes = np.asarray(q)
    if codes.ndim != 2 or codes.dtype != np.int8:
        raise ValueError(f"q must be a 2-D int8 array, got shape {codes.shape} dtype {codes.dtype}")
    s = np.asarray(scales, dtype=np.float32)
    if s.shape not in ((codes.shape[0],), ()):
        raise ValueError(f"scales must have shape ({codes.shape[0]},) (one per output row of q) "
                         f"or be a scalar, got shape {s.shape}")
    # the scale belongs to an output row: broadcast it down the columns
    return codes.astype(np.float32) * (s[:, None] if s.ndim else s)


def quant_linear(x, q, scales, bias=None) -> np.ndarray:
    """The W8A16 linear layer: ``x @ dequantize(q, scales).T + bias``.

    x: float ``[T, in]`` (computed in float32; not modified). q, scales: as
    ``dequantize`` takes them, ``q`` of shape ``[out, in]``. bias: float
    ``[out]`` or None. Returns float32 ``[T, out]``.

    Raises ValueError naming ``x`` unless it is a non-empty 2-D array whose
    width equals ``q.shape[1]`` (and as ``dequantize`` does for ``q`` and
    ``scales``).
    """
    w_hat = dequantize(q, scales)
    xs = _as_matrix(x, "x")
    if xs.shape[1] != w_hat.shape[1]:
        raise ValueError(f"x must have {w_hat.shape[1]} columns (the in_features of q), "
                         f"got shape {xs.shape}")
    out = xs @ w_hat.T
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float32)
    return out


def memory_bytes(W, dtype=np.float32) -> int:
    """Bytes to store ``W`` unquantized as ``dtype`` (default float32): numel * itemsize.

    A 100 x 100 matrix is 40,000 bytes in float32 and 20,000 in float16,
    whatever dtype the array passed in happens to have.
    """
    return int(np.size(W)) * np.dtype(dtype).itemsize


def memory_bytes_quant(q, scales) -> int:
    """Bytes of a quantized weight as stored: the codes plus the scales.

    For a 100 x 100 matrix per channel: 10,000 (int8 codes) + 400 (100
    float32 scales) = 10,400; per tensor, 10,000 + 4.
    """
    return int(np.asarray(q).nbytes + np.asarray(scales).nbytes)


# ---------------------------------------------------------------- the method


class Int8LinearMethod(LinearMethodBase):
    """W8A16 for one mini_vllm linear layer, in vLLM's three calls.

    After ``process_weights_after_loading`` the layer holds exactly two
    arrays: ``layer.weight`` (int8 codes ``[out, in]``, replacing the float32
    weight, as upstream's online methods replace theirs) and
    ``layer.weight_scale`` (float32 ``[out]``). Nothing else: the layer's
    ``weight_bytes()`` is ``out * in + 4 * out``.

    upstream: vllm/model_executor/layers/quantization/online/fp8.py:145 process_weights_after_loading
    """

    def create_weights(self, layer: LinearLayer, input_size: int, output_size: int) -> None:
        """Declare the float32 placeholder the loader fills: ``layer.weight``
        of shape ``[output_size, input_size]``, dtype float32.

        Raises ValueError naming ``input_size`` / ``output_size`` unless each is
        an integer >= 1.
        """
        for name, value in (("input_size", input_size), ("output_size", output_size)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        layer.weight = np.zeros((output_size, input_size), dtype=np.float32)

    def process_weights_after_loading(self, layer: LinearLayer) -> None:
        """Quantize the loaded ``layer.weight`` per channel: afterwards
        ``layer.weight`` is the int8 codes and ``layer.weight_scale`` the
        float32 scales; no float32 copy of the weight stays on the layer.
        """
        q, scales = quantize_per_channel(layer.weight)
        layer.weight = q  # the float32 array is dropped: that is the saving
        layer.weight_scale = scales

    def apply(self, layer: LinearLayer, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """``x [T, in]`` float32 -> ``[T, out]`` float32, through ``quant_linear``
        on the layer's codes and scales, with ``bias`` added when given."""
        return quant_linear(x, layer.weight, layer.weight_scale, bias)


# ---------------------------------------------------------------- the registration (given)


@register_quantization_config("lab01-int8")
class Lab01Int8Config(QuantizationConfig):
    """Given. ``quantization="lab01-int8"``: every linear layer runs ``Int8LinearMethod``.

    Registering under a name is all it takes for the engine to find the
    format; re-registering a name replaces the earlier class, as upstream does.
    """

    def get_name(self) -> str:
        return "lab01-int8"

    @classmethod
    def from_config(cls, config: dict) -> Lab01Int8Config:
        if config:
            raise ValueError(f"quantization_config: 'lab01-int8' takes no options, got {sorted(config)}")
        return cls()

    def get_quant_method(self, layer: LinearLayer, prefix: str) -> Int8LinearMethod:
        return Int8LinearMethod()


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    W = rng.standard_normal((100, 100)).astype(np.float32)
    q, s = quantize_per_channel(W)
    print(f"100 x 100 float32: {memory_bytes(W):,} bytes; int8 per channel: "
          f"{memory_bytes_quant(q, s):,} bytes")
    W[7] *= 100  # one loud row
    for name, fn in (("per tensor ", quantize_per_tensor), ("per channel", quantize_per_channel)):
        qq, ss = fn(W)
        err = np.linalg.norm(dequantize(qq, ss)[:7] - W[:7]) / np.linalg.norm(W[:7])
        print(f"{name}: relative error of the quiet rows {err:.4f}")
