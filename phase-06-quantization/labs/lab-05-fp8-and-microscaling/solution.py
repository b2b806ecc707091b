"""Lab 06-05 — FP8 W8A8 with torch._scaled_mm, MXFP4 and NVFP4 blocks (reference solution).

Integer formats spread their codes evenly; the formats here are tiny floating
point numbers, so their codes crowd near zero and thin out towards the top.
The range is fixed by the format, and a *scale* maps each tensor, row or
block of weights into that range.

Three formats, three scale granularities:

* **FP8 E4M3** (``torch.float8_e4m3fn``, largest finite value 448): vLLM's
  ``fp8`` method. ``scaled_fp8_quant`` mirrors vLLM's op of the same name: one
  float32 scale per tensor or per row (token), computed from the data
  (dynamic) or given (static); values are clamped to +-448 before the cast.
  ``fp8_linear`` runs the W8A8 product with ``torch._scaled_mm``, which on this
  CPU accepts a float32 scale per tensor or a scale per row of ``x`` and per
  column of the output.
* **MXFP4** (OCP microscaling; ggml type 39): blocks of 32 weights share one
  power-of-two scale, stored as an E8M0 byte (a bare exponent); each weight is
  an E2M1 code (1 sign, 2 exponent, 1 mantissa bit: +-0, 0.5, 1, 1.5, 2, 3, 4,
  6). 17 bytes per 32 weights. ``quantize_mxfp4`` is bit-exact with
  ``gguf.quants.quantize``; ``dequantize_mxfp4`` with ``gguf.quants.dequantize``.
* **NVFP4** (NVIDIA; ggml type 40): the same E2M1 codes in sub-blocks of 16,
  each with an unsigned E4M3 scale; ggml stores 64 weights (four sub-blocks)
  in 36 bytes. NVIDIA's checkpoints add one float32 scale per tensor on top,
  which ggml's block has no room for. ``dequantize_nvfp4`` is bit-exact with
  ``gguf.quants.dequantize`` and applies the per-tensor scale the way vLLM's
  emulation path does.

upstream: vllm/_custom_ops.py:1905 scaled_fp8_quant
upstream: vllm/model_executor/kernels/linear/scaled_mm/pytorch.py:81 _scaled_mm
upstream: vllm/model_executor/layers/quantization/modelopt.py:1110 weight_scale_2
upstream: vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py:403 global_scale
"""
from __future__ import annotations

import numpy as np
import torch

# ---------------------------------------------------------------- given constants

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn
FP8_E5M2_MAX = 57344.0  # largest finite float8_e5m2
# vLLM's floor on a dynamic FP8 scale: 1 / (448 * 512), from min_scaling_factor
FP8_MIN_SCALE = 1.0 / (FP8_E4M3_MAX * 512.0)
# E2M1 value of each 4-bit code: bit 3 is the sign, bits 0-2 the magnitude.
# Code 8 is "negative zero"; ggml's table decodes it as +0.0, and so does this one.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32  # weights per MXFP4 block
MXFP4_BYTES = 17  # 1 byte E8M0 exponent + 16 bytes of codes
NVFP4_BLOCK = 64  # weights per ggml NVFP4 block
NVFP4_SUB = 16  # weights per NVFP4 scale
NVFP4_BYTES = 36  # 4 bytes of UE4M3 scales + 32 bytes of codes


def _check_2d_float(x, name: str) -> torch.Tensor:
    """Given. ``x`` as a float32 torch tensor, refused (naming ``name``) unless 2-D floating."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.is_floating_point() \
            or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"{name} must be a 2-D float tensor [rows, cols], got "
                         f"{getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
    return x.to(torch.float32)


# ---------------------------------------------------------------- FP8


def fp8_e4m3_cast_np(x) -> np.ndarray:
    """Cast a numpy array to ``ml_dtypes.float8_e4m3fn`` without ever producing NaN.

    x: float array, any shape, already divided by its scale. Values beyond +-448
    are clamped to +-448 first (``ml_dtypes`` turns them into NaN: E4M3 has no
    infinity). NaN in ``x`` stays NaN. Returns an array of dtype
    ``ml_dtypes.float8_e4m3fn``, same shape (the numpy twin of the kernel's
    ``fminf(fmaxf(...))``).
    """
    import ml_dtypes

    arr = np.asarray(x, dtype=np.float32)
    return np.clip(arr, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)


def scaled_fp8_quant(x, scale=None, use_per_token_if_dynamic=False):
    """Quantize a 2-D tensor to FP8 E4M3, as vLLM's ``scaled_fp8_quant`` does.

    x: float tensor ``[M, K]``. Three modes:

    * ``scale`` given (static): a float32 tensor with one element, > 0; the
      result uses it and returns it unchanged (as float32 ``[1]``).
    * dynamic per tensor (``scale=None``, default): ``scale = max(amax(|x|) /
      448, FP8_MIN_SCALE)``, float32 ``[1]``.
    * dynamic per token (``use_per_token_if_dynamic=True``): one scale per row,
      the same formula over the row, float32 ``[M, 1]``.

    Codes: per-tensor scales (static or dynamic) multiply ``x`` by the float32
    reciprocal ``1 / scale``; per-token scales divide ``x`` by the scale (the
    two CUDA kernels differ exactly so). The quotient is clamped to [-448, 448]
    and cast to ``torch.float8_e4m3fn`` (round to nearest even).
    Returns ``(x_fp8 [M, K], scale)``; ``x ~= x_fp8.float() * scale``.

    Raises ValueError naming ``x`` if it is not a 2-D float tensor, naming
    ``scale`` if it is given with more than one element or a value that is not
    > 0 and finite.

    upstream: vllm/_custom_ops.py:1905 scaled_fp8_quant
    """
    xf = _check_2d_float(x, "x")
    if scale is not None:
        s = torch.as_tensor(scale, dtype=torch.float32).reshape(-1)
        if s.numel() != 1 or not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
            raise ValueError(f"scale must be one finite float32 value > 0, got {scale!r}")
        scaled = xf * torch.reciprocal(s)
    elif use_per_token_if_dynamic:
        # one scale per row (token); the floor keeps an all-zero row finite
        amax = xf.abs().amax(dim=1, keepdim=True)
        s = torch.clamp(amax / FP8_E4M3_MAX, min=FP8_MIN_SCALE)
        scaled = xf / s
    else:
        amax = xf.abs().amax().reshape(1)
        s = torch.clamp(amax / FP8_E4M3_MAX, min=FP8_MIN_SCALE)
        scaled = xf * torch.reciprocal(s)
    # the clamp is what the CUDA kernel does before its conversion instruction
    q = torch.clamp(scaled, -FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, s


def fp8_linear(x, w_fp8, w_scale, x_scale=None):
    """W8A8 linear layer: ``y = x @ W.T`` from FP8 operands with ``torch._scaled_mm``.

    x: float tensor ``[M, K]`` (activations, not yet quantized).
    w_fp8: ``torch.float8_e4m3fn`` ``[N, K]`` (the weight as a Linear layer stores it).
    w_scale: float32, one element (per tensor) or ``[N, 1]`` (per output channel,
    as ``scaled_fp8_quant(W, use_per_token_if_dynamic=True)`` returns it).
    x_scale: None to quantize ``x`` dynamically (per token when ``w_scale`` is
    per channel, per tensor when it is per tensor: the pairings the CPU
    ``_scaled_mm`` accepts), or one float32 value for static quantization.

    ``_scaled_mm(a, b, scale_a, scale_b)`` wants ``b`` as ``[K, N]`` in
    column-major order (``w_fp8.t()``, a view); both scales one element, or
    ``scale_a [M, 1]`` with ``scale_b [1, N]``. A static per-tensor ``x_scale``
    with a per-channel weight is widened to ``[M, 1]``. Returns float32 ``[M, N]``.

    Raises ValueError naming ``w_fp8`` (not float8_e4m3fn 2-D, or K differs
    from x's), ``w_scale`` (not 1 or N elements) or ``x`` (see scaled_fp8_quant).

    upstream: vllm/model_executor/kernels/linear/scaled_mm/pytorch.py:81 _scaled_mm
    """
    xf = _check_2d_float(x, "x")
    if not isinstance(w_fp8, torch.Tensor) or w_fp8.dtype != torch.float8_e4m3fn \
            or w_fp8.ndim != 2 or w_fp8.shape[1] != xf.shape[1]:
        raise ValueError(f"w_fp8 must be float8_e4m3fn [N, K] with K = {xf.shape[1]}, got "
                         f"{getattr(w_fp8, 'dtype', type(w_fp8))} "
                         f"{tuple(getattr(w_fp8, 'shape', ()))}")
    n = w_fp8.shape[0]
    ws = torch.as_tensor(w_scale, dtype=torch.float32)
    if ws.numel() == 1:
        per_channel = False
    elif ws.numel() == n:
        per_channel = True
    else:
        raise ValueError(f"w_scale must hold 1 or N = {n} values, got shape {tuple(ws.shape)}")
    if x_scale is None:
        xq, xs = scaled_fp8_quant(xf, use_per_token_if_dynamic=per_channel)
    else:
        xq, xs = scaled_fp8_quant(xf, scale=x_scale)
    if per_channel:
        # rowwise: scale_a [M, 1] (one per row of x), scale_b [1, N] (one per output column)
        scale_a = xs.reshape(-1, 1).expand(xf.shape[0], 1).contiguous()
        scale_b = ws.reshape(1, n).contiguous()
    else:
        scale_a, scale_b = xs.reshape(()), ws.reshape(())
    # w_fp8.t() is [K, N] column-major: the layout the matmul kernels want for b
    return torch._scaled_mm(xq, w_fp8.t(), scale_a=scale_a, scale_b=scale_b,
                            out_dtype=torch.float32)


# ---------------------------------------------------------------- MXFP4


def _e2m1_table() -> np.ndarray:
    """Given. ``E2M1_VALUES`` as a float32 array, indexed by code."""
    return np.array(E2M1_VALUES, dtype=np.float32)


def quantize_mxfp4(W) -> np.ndarray:
    """Quantize to MXFP4 blocks, byte for byte as ``gguf.quants.quantize(W, MXFP4)``.

    W: float array ``[..., n]``, ``n`` a multiple of 32; computed in float32.
    Per block of 32 consecutive weights along the last axis:

    * ``amax = max |w|``; the E8M0 byte is ``e = floor(log2(amax)) - 2 + 127``
      with ``log2`` taken in float32 (as gguf-py does), or 0 when ``amax == 0``;
      values of ``e`` below 0 are clamped to 0. The block scale is ``2 ** (e - 127)``:
      the block's largest weight lands in [4, 8) scale units, 6 being E2M1's top.
    * each weight gets the code ``c`` whose ``E2M1_VALUES[c] * scale`` is nearest,
      the distance measured in float32; on a tie the lowest code wins (so ties go
      to the smaller magnitude, and every zero, even -0.0, is code 0).
    * bytes: ``[e, 16 bytes]``, byte ``j`` = ``code[j] | code[j + 16] << 4``.

    Returns uint8 ``[..., n / 32 * 17]`` (4.25 bits per weight).
    Raises ValueError naming ``W`` when the last axis is not a positive multiple
    of 32 or a value is not finite.

    upstream: vllm/model_executor/layers/quantization/mxfp4.py:41 Mxfp4Config
    """
    w = np.asarray(W, dtype=np.float32)
    if w.ndim == 0 or w.shape[-1] == 0 or w.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"W: the last axis must be a positive multiple of {MXFP4_BLOCK}, "
                         f"got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("W must be finite (no NaN or inf)")
    blocks = w.reshape(-1, MXFP4_BLOCK)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        # float32 log2: just below a power of two it can round up to the integer
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0)
    e = np.clip(e, 0, 254).astype(np.uint8)
    scale = np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)
    # distance to each of the 16 representable values; argmin keeps the first on ties
    errs = np.abs(scale[:, :, None] * _e2m1_table() - blocks[:, :, None])
    codes = np.argmin(errs, axis=-1).astype(np.uint8)
    packed = codes[:, :16] | (codes[:, 16:] << np.uint8(4))
    out = np.concatenate([e, packed], axis=-1)
    return out.reshape(*w.shape[:-1], -1)


def dequantize_mxfp4(raw) -> np.ndarray:
    """MXFP4 bytes (``quantize_mxfp4``'s layout) to float32, as ``gguf.quants.dequantize``.

    raw: uint8 ``[..., 17 * nb]``. Weight ``i`` of a block is
    ``E2M1_VALUES[code_i] * 2 ** (e - 127)``, in float32 (exact: a power of two
    times a value with two significant bits).
    Returns float32 ``[..., 32 * nb]``.
    Raises ValueError naming ``raw`` when it is not uint8, its last axis is
    not a positive multiple of 17, or an exponent byte is 0xFF (E8M0's NaN).
    """
    arr = np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim == 0 or arr.shape[-1] == 0 \
            or arr.shape[-1] % MXFP4_BYTES:
        raise ValueError(f"raw must be uint8 [..., 17 * blocks], got {arr.dtype} {arr.shape}")
    blocks = arr.reshape(-1, MXFP4_BYTES)
    if (blocks[:, 0] == 0xFF).any():
        raise ValueError("raw: E8M0 byte 0xFF is NaN, not a scale")
    e = blocks[:, :1].astype(np.int32)
    scale = np.ldexp(np.float32(1), e - 127).astype(np.float32)
    qs = blocks[:, 1:]
    codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)
    vals = _e2m1_table()[codes] * scale
    return vals.reshape(*arr.shape[:-1], -1)


# ---------------------------------------------------------------- NVFP4


def dequantize_nvfp4(raw, global_scale=None) -> np.ndarray:
    """ggml NVFP4 bytes to float32, bit-exact with ``gguf.quants.dequantize``.

    raw: uint8 ``[..., 36 * nb]``. A block holds 64 weights as four sub-blocks
    of 16: bytes 0-3 are the sub-blocks' scales, then 8 bytes per sub-block
    where byte ``j`` holds weight ``j`` (low nibble) and weight ``j + 8`` (high
    nibble) of that sub-block.

    A scale byte is an *unsigned* E4M3 number: bits 3-6 an exponent ``E``
    (bias 7), bits 0-2 a mantissa ``m``: ``(1 + m/8) * 2**(E - 7)``, or
    ``m * 2**-9`` when ``E == 0``; 0x7F (E4M3's NaN) reads as 0, as ggml does.
    Weight = ``E2M1_VALUES[code] * scale``.

    global_scale: None, or NVIDIA's per-tensor float32 scale (``weight_scale_2``
    in a ModelOpt checkpoint). Given, the weight is
    ``E2M1_VALUES[code] * (scale * global_scale)``, each product in float32, in
    that order (vLLM's emulation multiplies the two scales first).

    Returns float32 ``[..., 64 * nb]``.
    Raises ValueError naming ``raw`` (not uint8, last axis not a positive
    multiple of 36, or a scale byte with bit 7 set: the scale is unsigned) and
    ``global_scale`` (not a finite value > 0).

    upstream: vllm/model_executor/layers/quantization/modelopt.py:1110 weight_scale_2
    upstream: vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py:403 global_scale
    """
    arr = np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim == 0 or arr.shape[-1] == 0 \
            or arr.shape[-1] % NVFP4_BYTES:
        raise ValueError(f"raw must be uint8 [..., 36 * blocks], got {arr.dtype} {arr.shape}")
    if global_scale is not None:
        g = np.float32(global_scale)
        if not np.isfinite(g) or g <= 0:
            raise ValueError(f"global_scale must be a finite value > 0, got {global_scale!r}")
    blocks = arr.reshape(-1, NVFP4_BYTES)
    sbytes = blocks[:, :4]
    if (sbytes & 0x80).any():
        raise ValueError("raw: an NVFP4 scale byte has bit 7 set; the scale is unsigned E4M3")
    exp = (sbytes >> 3).astype(np.int32)
    man = (sbytes & 0x7).astype(np.float32)
    normal = (1 + man / np.float32(8)) * np.ldexp(np.float32(1), exp - 7).astype(np.float32)
    sub = man * np.float32(2.0 ** -9)
    scale = np.where(exp == 0, sub, normal).astype(np.float32)
    scale = np.where(sbytes == 0x7F, np.float32(0), scale)
    if global_scale is not None:
        scale = (scale * g).astype(np.float32)
    qs = blocks[:, 4:].reshape(-1, 4, 8)
    codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)  # [nb, 4, 16]
    vals = _e2m1_table()[codes] * scale[:, :, None]
    return vals.astype(np.float32).reshape(*arr.shape[:-1], -1)


if __name__ == "__main__":  # pragma: no cover - the README's example
    x = torch.tensor([[500.0, -1.0, 0.0]])
    q, s = scaled_fp8_quant(x, scale=torch.tensor([1.0]))
    print("static scale 1, [500, -1, 0] ->", q.float().tolist()[0])
    rows = torch.tensor([[100.0, 3.0], [0.01, 0.003]])
    for per_token in (False, True):
        q, s = scaled_fp8_quant(rows, use_per_token_if_dynamic=per_token)
        err = ((q.float() * s - rows).abs() / rows.abs()).max().item()
        print(f"per_token={per_token!s:5}: scales {[f'{v:.3g}' for v in s.ravel().tolist()]}, "
              f"worst relative error {err:.3g}")
    w = np.linspace(-1, 1, 32, dtype=np.float32)
    raw = quantize_mxfp4(w)
    print("MXFP4 of linspace(-1, 1, 32): e =", int(raw[0]), "bytes", raw.size)
