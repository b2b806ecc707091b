"""Lab 06-04 — activation outliers and SmoothQuant, on SmolLM2's activations (your implementation).

Weight-only formats (labs 01 and 03) keep the matmul in floating point. W8A8
runs the matmul itself on 8-bit integers, so the activations must be rounded
to 8 bits too, on the fly, with a scale that costs almost nothing to compute:
one scale per tensor, or one per token (row). Neither has a scale per input
*channel*, and that is exactly where language models put their trouble: a few
channels of the hidden state are an order of magnitude louder than the rest,
on every token. One scale sized for the loud channel leaves the quiet ones a
handful of integer levels.

SmoothQuant's answer is a reparametrization. For each input channel ``j``
pick ``s_j > 0``, divide column ``j`` of the activations by it and multiply
column ``j`` of the weight (``W`` is ``[out, in]``) by it::

    (X / s) @ (W * s).T  ==  X @ W.T          (exactly, before rounding)

    s_j = max|X[:, j]| ** alpha / max|W[:, j]| ** (1 - alpha)

The product is unchanged; the loudness moved into the weights, whose scales
are per output channel and absorb it. The division never costs a runtime op:
it is folded into the RMSNorm weight that produced ``X``.

What you write:

* ``quantize_per_tensor`` / ``quantize_per_row`` — symmetric int8 codes and
  scales (one per tensor; one per row: per token for X, per output channel
  for W);
* ``fake_quant`` — round to int8 and back, to see what the rounding did;
* ``w8a8_matmul`` — int8 x int8 with int32 accumulation, scaled back;
* ``channel_absmax`` / ``outlier_ratio`` — the measurement: loudest channel
  over the median channel;
* ``smoothing_scales`` / ``smooth`` — the migration;
* ``fold_into_norm`` — where ``1 / s`` goes in a real model.

Given (identical in starter.py): ``relative_error`` and
``capture_layer_input``, which runs mini_vllm's SmolLM2 forward on a prompt
with a hook on ``rms_norm`` and returns the input of one layer's attention
(or MLP).

upstream: vllm/_custom_ops.py:2059 scaled_int8_quant
upstream: csrc/libtorch_stable/quantization/w8a8/int8/scaled_quant.cu:143 dynamic_scaled_int8_quant_kernel
upstream: vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:26 CompressedTensorsW8A8Int8
upstream: vllm/model_executor/kernels/linear/scaled_mm/cutlass.py:132 scaled_int8_quant
"""
from __future__ import annotations

import numpy as np

QMAX = 127  # symmetric int8: codes in [-127, 127]; -128 is never produced


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


def relative_error(ref: np.ndarray, approx: np.ndarray) -> float:
    """Given. ``||approx - ref|| / ||ref||`` (Frobenius norms), in float64."""
    ref = np.asarray(ref, dtype=np.float64)
    approx = np.asarray(approx, dtype=np.float64)
    if ref.shape != approx.shape:
        raise ValueError(f"approx must have the shape of ref {ref.shape}, got {approx.shape}")
    norm = np.linalg.norm(ref)
    if norm == 0:
        raise ValueError("ref must not be all zero (the relative error is undefined)")
    return float(np.linalg.norm(approx - ref) / norm)


class _StopForward(Exception):
    """Raised by the hook once the wanted activation is captured."""


def capture_layer_input(model, token_ids, layer: int = 0, sublayer: str = "attn") -> np.ndarray:
    """Given. One layer's attention (or MLP) input for one prompt: float64 ``[T, hidden]``.

    ``model`` is a mini_vllm numpy ``LlamaForCausalLM`` (``get_model("smollm2")``).
    Each decoder layer calls ``rms_norm`` twice: first on the residual stream
    before attention (its output is what ``qkv_proj`` reads), then before the
    MLP (what ``gate_up_proj`` reads). The hook replaces
    ``mini_vllm.models.llama.rms_norm`` for one forward call, records the
    outputs in call order, and stops the forward as soon as call
    ``2 * layer + (sublayer == "mlp")`` has been seen, so capturing layer 0
    costs one embedding lookup and one norm. The model's KV cache is put back
    as it was.

    Raises ValueError naming ``token_ids`` (empty), ``layer`` (outside
    ``[0, num_hidden_layers)``) or ``sublayer`` (not "attn" or "mlp").
    """
    import mini_vllm.models.llama as llama
    from mini_vllm.models.runner import Chunk, make_model_input

    token_ids = [int(t) for t in token_ids]
    if not token_ids:
        raise ValueError("token_ids must hold at least one token id")
    num_layers = model.config.num_hidden_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"layer must be an integer in [0, {num_layers}), got {layer!r}")
    if sublayer not in ("attn", "mlp"):
        raise ValueError(f"sublayer must be 'attn' or 'mlp', got {sublayer!r}")
    wanted = 2 * layer + (sublayer == "mlp")

    block_size = 16
    num_blocks = -(-len(token_ids) // block_size)
    model_input = make_model_input(
        [Chunk(token_ids, 0, list(range(1, num_blocks + 1)))], block_size)
    calls: list[np.ndarray] = []
    original = llama.rms_norm

    def hook(x, weight, eps):
        out = original(x, weight, eps)
        calls.append(out)
        if len(calls) > wanted:
            raise _StopForward
        return out

    saved_cache = model.kv_cache
    model.init_kv_cache(num_blocks + 1, block_size)  # block 0 stays unused, as in the engine
    llama.rms_norm = hook
    try:
        model.forward(model_input)
    except _StopForward:
        pass
    finally:
        llama.rms_norm = original
        model.kv_cache = saved_cache
    return np.asarray(calls[wanted], dtype=np.float64)


def _matrix(x, name: str) -> np.ndarray:
    """float64 copy of a non-empty, finite 2-D array-like, or ValueError naming ``name``."""
    arr = np.array(x, dtype=np.float64)
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must hold only finite values")
    return arr


# --------------------------------------------------------------------------
# Your work
# --------------------------------------------------------------------------


def quantize_per_tensor(x) -> tuple[np.ndarray, float]:
    """Symmetric int8 with one scale for the whole tensor.

    x: non-empty, finite 2-D array-like. ``scale = max|x| / 127`` (1.0 when x
    is all zero, so dequantizing gives zeros and never divides by zero);
    ``q = rint(x / scale)`` (round half to even, like the CUDA kernel's
    ``nearbyint``) clipped to ``[-127, 127]``. Returns ``(q int8, scale float)``;
    ``q * scale`` approximates x within ``scale / 2`` everywhere.

    Raises ValueError naming ``x`` when it is not a non-empty finite 2-D array.

    upstream: vllm/_custom_ops.py:2059 scaled_int8_quant
    """
    raise NotImplementedError("quantize_per_tensor: one scale from max|x|; rint; clip to +-127")


def quantize_per_row(x) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 with one scale per row.

    For activations ``X [T, in]`` a row is a token (vLLM's dynamic per-token
    mode); for weights ``W [out, in]`` a row is an output channel. Same rules
    as ``quantize_per_tensor``, row by row (an all-zero row gets scale 1.0).
    Returns ``(q int8 [rows, cols], scales float64 [rows, 1])``.

    Raises ValueError naming ``x`` when it is not a non-empty finite 2-D array.

    upstream: csrc/libtorch_stable/quantization/w8a8/int8/scaled_quant.cu:143 dynamic_scaled_int8_quant_kernel
    """
    raise NotImplementedError("quantize_per_row: per tensor, with the max along axis=1")


def fake_quant(x, per: str = "tensor") -> np.ndarray:
    """Quantize to int8 and dequantize again: what the matmul will actually see.

    ``per`` is "tensor" (one scale) or "row" (one scale per row). Returns
    float64 with x's shape.

    Raises ValueError naming ``per`` for any other value, and ``x`` as above.
    """
    raise NotImplementedError("fake_quant: quantize, then codes times scale")


def w8a8_matmul(x, w, act: str = "tensor") -> np.ndarray:
    """``x @ w.T`` the W8A8 way: both operands int8, products summed in int32.

    x: activations ``[T, in]``; w: weight ``[out, in]`` (vLLM's layout).
    The weight is quantized per output channel (``quantize_per_row(w)``); the
    activations per tensor (``act="tensor"``, a static scale) or per token
    (``act="token"``, vLLM's dynamic mode). The int32 accumulator is scaled
    back by ``x_scale * w_scale`` per output element. Returns float64
    ``[T, out]``.

    Raises ValueError naming ``w`` when its column count differs from x's,
    ``act`` for a mode other than "tensor" or "token", and ``x``/``w`` when
    either is not a non-empty finite 2-D array.

    upstream: vllm/model_executor/kernels/linear/scaled_mm/cutlass.py:132 scaled_int8_quant
    """
    raise NotImplementedError("w8a8_matmul: int8 codes, int32 matmul, scale back")


def channel_absmax(x) -> np.ndarray:
    """``max |x[:, j]|`` over the rows, for every column ``j``: float64 ``[cols]``.

    For activations that is each input channel's loudest value over the
    tokens; for a weight ``[out, in]`` it is each input channel's largest
    weight over the output channels.

    Raises ValueError naming ``x`` when it is not a non-empty finite 2-D array.
    """
    raise NotImplementedError("channel_absmax: the largest |value| of each column")


def outlier_ratio(x) -> float:
    """The loudest channel over the median channel: ``max(absmax) / median(absmax)``.

    ``absmax = channel_absmax(x)``. About 1-3 for Gaussian noise, tens for an
    LLM's hidden state.

    Raises ValueError naming ``x`` when the median channel is all zero (the
    ratio is undefined) or x is not a non-empty finite 2-D array.
    """
    raise NotImplementedError("outlier_ratio: max over median of channel_absmax")


def smoothing_scales(act_absmax, w_absmax, alpha: float = 0.5) -> np.ndarray:
    """SmoothQuant's per-channel factors ``s_j = a_j ** alpha / w_j ** (1 - alpha)``.

    act_absmax, w_absmax: 1-D, same length, non-negative, finite (from
    ``channel_absmax`` of X and of W). alpha in [0, 1] decides where the
    range ends up: with 1, ``s_j = a_j`` and every smoothed activation channel
    peaks at 1 (all of the trouble moves into W); with 0, ``s_j = 1 / w_j``
    and every weight column peaks at 1 (the trouble moves into X, worse than
    not smoothing); 0.5 gives both the same per-channel peak
    ``sqrt(a_j * w_j)``. A channel where either maximum is 0
    gets ``s_j = 1`` (nothing to migrate, and no division by zero). Returns
    float64, every entry > 0.

    Raises ValueError naming ``alpha`` outside [0, 1], ``act_absmax`` or
    ``w_absmax`` when not 1-D, negative or not finite, and ``w_absmax`` when
    the lengths differ.
    """
    raise NotImplementedError("smoothing_scales: a**alpha / w**(1-alpha); 1 where either is 0")


def smooth(x, w, alpha: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Migrate activation range into the weight: ``(x / s, w * s, s)``.

    x: ``[T, in]``; w: ``[out, in]``; ``s = smoothing_scales(channel_absmax(x),
    channel_absmax(w), alpha)`` ``[in]``. Column ``j`` of x is divided by
    ``s_j`` and column ``j`` of w (the weights that read channel ``j``) is
    multiplied by it, so ``x_hat @ w_hat.T == x @ w.T`` up to float rounding.
    Returns float64 arrays; the inputs are not modified.

    Raises ValueError naming ``w`` when its column count differs from x's,
    ``alpha`` outside [0, 1], and ``x``/``w`` when not non-empty finite 2-D.
    """
    raise NotImplementedError("smooth: x / s and w * s, s from both maxima")


def fold_into_norm(norm_weight, w, s) -> tuple[np.ndarray, np.ndarray]:
    """Make smoothing free at run time: ``(norm_weight / s, w * s)``.

    An RMSNorm output is ``g * x / rms(x)``, linear in its weight ``g``
    ``[in]``, so dividing ``g`` by ``s`` divides the norm's output columns by
    ``s``. ``w`` ``[out, in]`` is every weight that reads that norm's output
    (for a Llama attention input: q, k and v stacked, all of them). Returns
    float64 copies.

    Raises ValueError naming ``s`` when it is not 1-D with ``len(norm_weight)``
    finite entries > 0, ``norm_weight`` when it is not 1-D, and ``w`` when its
    column count differs from ``len(norm_weight)``.
    """
    raise NotImplementedError("fold_into_norm: norm weight / s, reading weights * s")


# --------------------------------------------------------------------------
# python solution.py
# --------------------------------------------------------------------------

PROMPT = ("The quick brown fox jumps over the lazy dog while the cat sleeps in the warm "
          "afternoon sun by the window.")


def outlier_setup(seed: int = 0, tokens: int = 64, channels: int = 256, loud=(17, 200),
                  loudness: float = 80.0):
    """Synthetic activations with ``loud`` channels ``loudness`` times louder, and a weight."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, channels))
    x[:, list(loud)] *= loudness
    w = rng.standard_normal((channels, channels)) / np.sqrt(channels)
    return x, w


def _report(name: str, x: np.ndarray, w: np.ndarray, alpha: float = 0.5) -> None:
    ref = x @ w.T
    x_hat, w_hat, _ = smooth(x, w, alpha)
    naive = relative_error(ref, w8a8_matmul(x, w))
    smoothed = relative_error(ref, w8a8_matmul(x_hat, w_hat))
    print(f"{name}: outlier ratio {outlier_ratio(x):.1f}x -> {outlier_ratio(x_hat):.1f}x; "
          f"W8A8 error {naive:.2%} -> {smoothed:.2%} ({naive / smoothed:.2f}x better)")


def main() -> None:
    x, w = outlier_setup()
    _report("synthetic, 2 loud channels of 256", x, w)
    try:
        import threadpoolctl

        from mini_vllm.models import get_model
        from mini_vllm.models.hub import model_path
    except ImportError:
        return
    if model_path("smollm2") is None:
        print("SmolLM2 not downloaded: python -m mini_vllm download smollm2")
        return
    with threadpoolctl.threadpool_limits(1, "blas"):
        model = get_model("smollm2")
        ids = model.tokenizer.encode(PROMPT)
        x = capture_layer_input(model, ids)
        c = model.config
        w = model.weights.layers[0].qkv_proj[:, :c.q_size].T.astype(np.float64)  # [out, in]
        print(f"SmolLM2 layer 0, {len(ids)} tokens, loudest channel "
              f"{int(channel_absmax(x).argmax())}")
        _report("SmolLM2 attention input x q_proj", x, w)


if __name__ == "__main__":
    main()
