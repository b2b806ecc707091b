"""Lab 06-03 — real 4-bit layouts: GGUF Q4_1, GPTQ and AWQ (reference solution).

A 4-bit weight is worthless until two questions are answered: which numbers
turn the 16 codes back into real values (the *scales*, and sometimes a zero
point or a minimum), and where each code sits in memory (the *packing*). Every
format answers both differently, and a loader that gets either wrong produces
a model that runs, at full speed, and talks nonsense.

Three real answers, each checked bit for bit against the code that defines it:

* **GGUF Q4_1** (llama.cpp; the format of the SmolLM2 file this course ships):
  blocks of 32 weights along a row, 20 bytes each: a float16 step ``d``, a
  float16 minimum ``m``, then 16 bytes of codes. Byte ``j`` of a block holds
  weight ``j`` in its low nibble and weight ``j + 16`` in its high nibble.
  ``w = d * q + m``. ``pack_q4_nibbles``, ``unpack_q4_nibbles``,
  ``quantize_q4_1`` and ``dequantize_q4_1`` are bit-exact with ``gguf-py``.
* **Grouped int4 in the GPTQ/AWQ style** (``quantize_grouped``,
  ``dequantize_grouped``): the weight is stored transposed, ``[in_features
  (k), out_features (n)]``; each column is cut into groups of ``group_size``
  consecutive rows, and each group has a float16 scale and an integer zero
  point. ``w = (q - zero) * scale``.
* **Packing into int32**: GPTQ puts eight consecutive *rows* (along k) in one
  int32 (``pack_gptq_rows``: ``[k, n] -> [k / 8, n]``); AWQ puts eight
  consecutive *columns* (along n) in one int32, in the order
  ``[0, 2, 4, 6, 1, 3, 5, 7]`` (``pack_awq``: ``[k, n] -> [k, n / 8]``).

``bits_per_weight`` is the storage bill of a grouped format, scales and zero
points included.

Codes are unsigned 4-bit integers, 0..15, held in ``uint8`` arrays.

upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:556 quantize_weights
upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:704 pack_rows
upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:794 awq_pack
upstream: vllm/model_executor/layers/quantization/awq_triton.py:56 reverse_awq_order_tensor
"""
from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------- given constants

Q4_1_BLOCK = 32  # weights per GGUF Q4_1 block
Q4_1_BYTES = 20  # bytes per block: fp16 d (2) + fp16 m (2) + 16 bytes of nibbles
PACK = 8  # 4-bit codes per int32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds column AWQ_ORDER[i]


def _check_codes(q, name: str) -> np.ndarray:
    """Given. ``q`` as a uint8 array, refused (naming ``name``) unless every value is in 0..15."""
    arr = np.asarray(q)
    if arr.dtype.kind not in "iu" or (arr.size and (arr.min() < 0 or arr.max() > 15)):
        raise ValueError(f"{name} must hold integer 4-bit codes in [0, 15]")
    return arr.astype(np.uint8)


# ---------------------------------------------------------------- GGUF Q4_1


def pack_q4_nibbles(q) -> np.ndarray:
    """Pack 4-bit codes two per byte, in GGUF's Q4 block layout.

    q: integer array ``[..., n]`` of codes 0..15, ``n`` a multiple of 32.
    Returns uint8 ``[..., n / 2]``: for each block of 32 codes ``c[0..31]``,
    16 bytes where byte ``j`` is ``c[j] | c[j + 16] << 4`` (weight ``j`` in
    the low nibble, weight ``j + 16`` in the high one).

    Raises ValueError naming ``q`` when the last axis is not a multiple of 32
    or a value lies outside 0..15.
    """
    codes = _check_codes(q, "q")
    if codes.ndim == 0 or codes.shape[-1] % Q4_1_BLOCK:
        raise ValueError(f"q: the last axis must be a multiple of {Q4_1_BLOCK}, got {codes.shape}")
    blocks = codes.reshape(*codes.shape[:-1], -1, 2, Q4_1_BLOCK // 2)
    # first half of each block -> low nibbles, second half -> high nibbles
    packed = blocks[..., 0, :] | (blocks[..., 1, :] << np.uint8(4))
    return packed.reshape(*codes.shape[:-1], -1)


def unpack_q4_nibbles(packed) -> np.ndarray:
    """Inverse of ``pack_q4_nibbles``.

    packed: uint8 ``[..., m]``, ``m`` a multiple of 16. Returns uint8
    ``[..., 2 * m]`` codes 0..15.

    Raises ValueError naming ``packed`` when it is not uint8 or its last axis is
    not a multiple of 16.
    """
    arr = np.asarray(packed)
    if arr.dtype != np.uint8 or arr.ndim == 0 or arr.shape[-1] % (Q4_1_BLOCK // 2):
        raise ValueError(f"packed must be uint8 with a last axis a multiple of 16, got "
                         f"{arr.dtype} {arr.shape}")
    blocks = arr.reshape(*arr.shape[:-1], -1, Q4_1_BLOCK // 2)
    low, high = blocks & np.uint8(0x0F), blocks >> np.uint8(4)
    return np.concatenate([low, high], axis=-1).reshape(*arr.shape[:-1], -1)


def dequantize_q4_1(raw) -> np.ndarray:
    """GGUF Q4_1 bytes to float32 weights.

    raw: uint8 ``[..., 20 * nb]`` (a tensor row as ``GGUFReader`` hands it:
    ``nb`` blocks of 20 bytes). Each block is: bytes 0-1 ``d`` (float16,
    little-endian), bytes 2-3 ``m`` (float16), bytes 4-19 the codes in
    ``pack_q4_nibbles``' layout. Weight ``i`` of the block is
    ``float32(d) * q[i] + float32(m)``, computed in float32.
    Returns float32 ``[..., 32 * nb]``.

    Raises ValueError naming ``raw`` when it is not uint8 or its last axis is
    not a positive multiple of 20.

    upstream: vllm/model_executor/layers/quantization/gguf.py:198 _fused_mul_mat_gguf
    """
    arr = np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim == 0 or arr.shape[-1] == 0 \
            or arr.shape[-1] % Q4_1_BYTES:
        raise ValueError(f"raw must be uint8 [..., 20 * blocks], got {arr.dtype} {arr.shape}")
    blocks = np.ascontiguousarray(arr).reshape(*arr.shape[:-1], -1, Q4_1_BYTES)
    # the two float16 header fields, read as float16 and widened
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = unpack_q4_nibbles(blocks[..., 4:]).astype(np.float32)
    return (d * q + m).reshape(*arr.shape[:-1], -1)


def quantize_q4_1(W) -> np.ndarray:
    """Float weights to GGUF Q4_1 bytes, exactly as ``gguf.quants.quantize`` does.

    W: float array ``[..., n]``, ``n`` a positive multiple of 32; computed in
    float32. Per block of 32: ``lo = min``, ``hi = max``,
    ``d = (hi - lo) / 15``, ``inv = 1 / d`` (0 when d == 0), and each code is
    ``trunc((w - lo) * inv + 0.5)`` clipped to 0..15 (round half *up*, not
    half to even). ``d`` and ``lo`` are stored as float16; the codes are
    computed from the float32 ``d``. Returns uint8 ``[..., 20 * n / 32]``.

    Raises ValueError naming ``W`` when the last axis is not a positive
    multiple of 32.
    """
    w = np.asarray(W, dtype=np.float32)
    if w.ndim == 0 or w.shape[-1] == 0 or w.shape[-1] % Q4_1_BLOCK:
        raise ValueError(f"W: the last axis must be a positive multiple of {Q4_1_BLOCK}, "
                         f"got {w.shape}")
    blocks = w.reshape(*w.shape[:-1], -1, Q4_1_BLOCK)
    lo = blocks.min(axis=-1, keepdims=True)
    hi = blocks.max(axis=-1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    # gguf-py truncates after adding 0.5: ties go up, and it multiplies by 1/d
    q = np.trunc((blocks - lo) * inv + np.float32(0.5)).astype(np.uint8).clip(0, 15)
    header = np.concatenate([d.astype(np.float16).view(np.uint8),
                             lo.astype(np.float16).view(np.uint8)], axis=-1)
    out = np.concatenate([header, pack_q4_nibbles(q)], axis=-1)
    return out.reshape(*w.shape[:-1], -1)


# ---------------------------------------------------------------- grouped int4 (GPTQ / AWQ)


def quantize_grouped(W, group_size: int, symmetric: bool = True):
    """Group-wise 4-bit quantization of a ``[k, n]`` weight (GPTQ/AWQ layout).

    W: float ``[k, n]`` (in_features, out_features), computed in float32.
    Rows ``g * group_size .. (g + 1) * group_size - 1`` of a column form group
    ``g`` of that column; ``group_size`` must divide ``k``.

    * symmetric (the zero point is the constant 8, never stored):
      ``scale = max(|hi| / 7, |lo| / 8)`` over the group (``hi``/``lo`` its
      max/min), 1.0 for an all-zero group; code ``clip(rint(w / scale), -8, 7) + 8``.
    * asymmetric: the range is widened to include 0 (``lo = min(lo, 0)``,
      ``hi = max(hi, 0)``), ``scale = (hi - lo) / 15`` (1.0 when 0),
      ``zero = clip(rint(-lo / scale), 0, 15)``, code
      ``clip(rint(w / scale) + zero, 0, 15)``.

    ``rint`` rounds half to even (as ``torch.round`` does upstream). The scale
    is rounded to float16 first, and the codes and zero are computed from that
    stored float16 value (widened to float32).

    Returns ``(q, scales, zeros)``: q uint8 ``[k, n]`` in 0..15, scales float16
    ``[k / group_size, n]``, zeros uint8 ``[k / group_size, n]`` (all 8 when
    symmetric).

    Raises ValueError naming ``W`` when it is not 2-D with k, n >= 1, and
    ``group_size`` when it is < 1 or does not divide k.

    upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:556 quantize_weights
    """
    w = np.asarray(W, dtype=np.float32)
    if w.ndim != 2 or 0 in w.shape:
        raise ValueError(f"W must be a non-empty 2-D [k, n] array, got shape {w.shape}")
    k, n = w.shape
    if group_size < 1 or k % group_size:
        raise ValueError(f"group_size must be >= 1 and divide k = {k}, got {group_size}")
    groups = w.reshape(k // group_size, group_size, n)
    hi, lo = groups.max(axis=1), groups.min(axis=1)
    if symmetric:
        scale = np.maximum(np.abs(hi) / np.float32(7), np.abs(lo) / np.float32(8))
        scale = np.where(scale == 0, np.float32(1), scale)
        scales = scale.astype(np.float16)
        s = scales.astype(np.float32)[:, None, :]
        q = np.clip(np.rint(groups / s), -8, 7) + 8
        zeros = np.full(scales.shape, 8, dtype=np.uint8)
    else:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scale = (hi - lo) / np.float32(15)
        scale = np.where(scale == 0, np.float32(1), scale)
        scales = scale.astype(np.float16)
        s32 = scales.astype(np.float32)
        zeros = np.clip(np.rint(-lo / s32), 0, 15).astype(np.uint8)
        q = np.clip(np.rint(groups / s32[:, None, :]) + zeros[:, None, :], 0, 15)
    return q.reshape(k, n).astype(np.uint8), scales, zeros


def dequantize_grouped(q, scales, zeros, group_size: int) -> np.ndarray:
    """``(q - zero) * scale`` per group, in float32.

    q: integer ``[k, n]`` codes 0..15; scales ``[k / group_size, n]`` (any
    float dtype, widened to float32); zeros ``[k / group_size, n]`` integers.
    Row ``r`` of ``q`` uses row ``r // group_size`` of scales and zeros.
    Returns float32 ``[k, n]``.

    Raises ValueError naming ``q`` for codes outside 0..15 or a non-2-D
    array, ``group_size`` when it is < 1 or does not divide k, and ``scales``
    or ``zeros`` when its shape is not ``[k / group_size, n]``.
    """
    codes = _check_codes(q, "q")
    if codes.ndim != 2:
        raise ValueError(f"q must be 2-D [k, n], got shape {codes.shape}")
    k, n = codes.shape
    if group_size < 1 or k % group_size:
        raise ValueError(f"group_size must be >= 1 and divide k = {k}, got {group_size}")
    s = np.asarray(scales).astype(np.float32)
    z = np.asarray(zeros)
    if s.shape != (k // group_size, n):
        raise ValueError(f"scales must have shape {(k // group_size, n)}, got {s.shape}")
    if z.shape != (k // group_size, n):
        raise ValueError(f"zeros must have shape {(k // group_size, n)}, got {z.shape}")
    # one scale and zero per group of rows: repeat them down the rows
    s_rows = np.repeat(s, group_size, axis=0)
    z_rows = np.repeat(z.astype(np.float32), group_size, axis=0)
    return ((codes.astype(np.float32) - z_rows) * s_rows).astype(np.float32)


def pack_gptq_rows(q) -> np.ndarray:
    """GPTQ packing: eight consecutive rows (along k) into one int32.

    q: integer ``[k, n]`` codes 0..15, ``k`` a multiple of 8. Returns int32
    ``[k / 8, n]`` where nibble ``i`` (bits ``4i .. 4i + 3``) of
    ``out[r, c]`` is ``q[8r + i, c]``. A code >= 8 in nibble 7 sets the sign
    bit, so such words are negative int32 values.

    Raises ValueError naming ``q`` when it is not 2-D, k is not a multiple of
    8, or a value lies outside 0..15.

    upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:704 pack_rows
    """
    codes = _check_codes(q, "q")
    if codes.ndim != 2 or codes.shape[0] % PACK:
        raise ValueError(f"q must be 2-D with k a multiple of {PACK}, got shape {codes.shape}")
    wide = codes.astype(np.uint32)
    out = np.zeros((codes.shape[0] // PACK, codes.shape[1]), dtype=np.uint32)
    for i in range(PACK):
        out |= wide[i::PACK] << np.uint32(4 * i)
    return out.view(np.int32)  # same bits, the dtype checkpoints store


def unpack_gptq_rows(packed) -> np.ndarray:
    """Inverse of ``pack_gptq_rows``: int32 ``[k / 8, n]`` to uint8 codes ``[k, n]``.

    Raises ValueError naming ``packed`` when it is not a 2-D int32 array.
    """
    arr = np.asarray(packed)
    if arr.dtype != np.int32 or arr.ndim != 2:
        raise ValueError(f"packed must be 2-D int32, got {arr.dtype} {arr.shape}")
    words = arr.view(np.uint32)  # logical shifts: no sign bits dragged in
    out = np.empty((arr.shape[0] * PACK, arr.shape[1]), dtype=np.uint8)
    for i in range(PACK):
        out[i::PACK] = (words >> np.uint32(4 * i)) & np.uint32(0xF)
    return out


def pack_awq(q) -> np.ndarray:
    """AWQ packing: eight consecutive columns (along n) into one int32, interleaved.

    q: integer ``[k, n]`` codes 0..15, ``n`` a multiple of 8. Returns int32
    ``[k, n / 8]`` where nibble ``i`` of ``out[r, j]`` is
    ``q[r, 8j + AWQ_ORDER[i]]``, ``AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)``:
    columns 0, 2, 4, 6 fill the low four nibbles, columns 1, 3, 5, 7 the high
    four.

    Raises ValueError naming ``q`` when it is not 2-D, n is not a multiple of
    8, or a value lies outside 0..15.

    upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:794 awq_pack
    """
    codes = _check_codes(q, "q")
    if codes.ndim != 2 or codes.shape[1] % PACK:
        raise ValueError(f"q must be 2-D with n a multiple of {PACK}, got shape {codes.shape}")
    k, n = codes.shape
    groups = codes.reshape(k, n // PACK, PACK).astype(np.uint32)
    out = np.zeros((k, n // PACK), dtype=np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        out |= groups[:, :, col] << np.uint32(4 * i)
    return out.view(np.int32)


def unpack_awq(packed) -> np.ndarray:
    """Inverse of ``pack_awq``: int32 ``[k, n / 8]`` to uint8 codes ``[k, n]``.

    Raises ValueError naming ``packed`` when it is not a 2-D int32 array.

    upstream: vllm/model_executor/layers/quantization/awq_triton.py:56 reverse_awq_order_tensor
    """
    arr = np.asarray(packed)
    if arr.dtype != np.int32 or arr.ndim != 2:
        raise ValueError(f"packed must be 2-D int32, got {arr.dtype} {arr.shape}")
    words = arr.view(np.uint32)
    out = np.empty((arr.shape[0], arr.shape[1], PACK), dtype=np.uint8)
    for i, col in enumerate(AWQ_ORDER):
        out[:, :, col] = (words >> np.uint32(4 * i)) & np.uint32(0xF)
    return out.reshape(arr.shape[0], -1)


def bits_per_weight(group_size: int, scale_bits: int = 16, zero_bits: int = 0,
                    weight_bits: int = 4) -> float:
    """Storage cost per weight of a grouped format, in bits.

    Each group of ``group_size`` weights stores ``group_size * weight_bits``
    bits of codes plus one scale (``scale_bits``) and one zero point or
    minimum (``zero_bits``; 0 when the zero is implied, as in symmetric
    GPTQ). Returns ``weight_bits + (scale_bits + zero_bits) / group_size``.

    Raises ValueError naming ``group_size`` (< 1), ``weight_bits`` (< 1),
    ``scale_bits`` or ``zero_bits`` (< 0).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if weight_bits < 1:
        raise ValueError(f"weight_bits must be >= 1, got {weight_bits}")
    if scale_bits < 0:
        raise ValueError(f"scale_bits must be >= 0, got {scale_bits}")
    if zero_bits < 0:
        raise ValueError(f"zero_bits must be >= 0, got {zero_bits}")
    return weight_bits + (scale_bits + zero_bits) / group_size


if __name__ == "__main__":
    codes = np.arange(32) % 16
    print("GGUF nibbles of 0..15,0..15:", pack_q4_nibbles(codes)[:4].tolist())
    column = np.arange(1, 9, dtype=np.uint8).reshape(8, 1)
    print("GPTQ word of rows 1..8:", hex(int(pack_gptq_rows(column)[0, 0]) & 0xFFFFFFFF))
    row = np.arange(8, dtype=np.uint8).reshape(1, 8)
    print("AWQ word of columns 0..7:", hex(int(pack_awq(row)[0, 0]) & 0xFFFFFFFF))
    for g, z in [(128, 0), (128, 4), (32, 0), (32, 16)]:
        print(f"group {g:3d}, zero bits {z:2d}: {bits_per_weight(g, 16, z):.5f} bits/weight")
