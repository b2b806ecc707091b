"""Lab 06-02 — bits per weight against damage, measured on SmolLM2 (starter: your file).

Every quantization format is a trade: fewer bits per weight, more error in
the weights. What a server cares about is not the weight error but what it
does to the model's output, so this lab measures that: run SmolLM2-135M on a
prompt once with the reference weights and once with every linear layer
quantized and dequantized again (a "fake-quant" round trip), and compare the
two sets of next-token distributions position by position.

Three measures of damage:

* ``kl_divergence(ref, q)``: the mean over positions of KL(P_ref || P_q),
  in nats. Zero only when the distributions agree; it grows with every
  probability the quantized model moves, not only the top one.
* ``top1_agreement(ref, q)``: how often the greedy token is still the same.
* ``perplexity(logits, ids)``: the model's own quality on the text, which
  needs no reference at all (position t is scored on token t + 1).

and one measure of cost, ``bits_per_weight(fmt, shape)``: payload bits plus
every scale, minimum and block header, divided by the weight count.

The reference. mini_vllm's SmolLM2 is the shipped Q4_1 GGUF file
dequantized to float32. No bf16 original is available offline, so the
"reference" is itself a 5-bit model and every format here quantizes it a
second time. That is harsh on 4-bit formats (their grid rarely lines up with
Q4_1's) and kind to 8-bit ones; the ranking is still informative.

What you write: ``log_softmax``, ``kl_divergence``, ``top1_agreement``,
``perplexity``, ``bits_per_weight``, ``fake_quant_int4``,
``fake_quant_fp8`` and ``requantize``.

Given (identical in starter.py): ``gguf_round_trip`` (the GGUF block formats
through ``gguf.quants``, bit-exact with llama.cpp's reference code),
``all_logits`` and ``requantized_model`` (mini_vllm plumbing), the KV-cache
calculator ``kv_bytes_per_token`` / ``extra_kv_tokens``, and ``main``.

upstream: vllm/model_executor/layers/quantization/gguf.py:429 GGUFLinearMethod
upstream: vllm/_custom_ops.py:1905 scaled_fp8_quant
upstream: vllm/model_executor/layers/quantization/utils/quant_utils.py:27 get_fp8_min_max
upstream: vllm/v1/core/kv_cache_utils.py:1709 _report_kv_cache_config
upstream: vllm/v1/worker/gpu_model_runner.py:5133 model_memory_usage
"""
from __future__ import annotations

import dataclasses

import numpy as np

FP8_MAX = 448.0  # largest finite float8_e4m3fn value

# format name -> what it is. bits_per_weight knows all of them; requantize all
# but nvfp4 (gguf-py can dequantize NVFP4 blocks but not produce them).
FORMATS = {
    "q8_0": "GGUF Q8_0: 32 int8 codes + one fp16 scale",
    "q4_1": "GGUF Q4_1: 32 4-bit codes + fp16 scale + fp16 minimum (the shipped file)",
    "q4_0": "GGUF Q4_0: 32 4-bit codes + one fp16 scale",
    "mxfp4": "OCP MXFP4: 32 E2M1 values + one E8M0 exponent",
    "nvfp4": "NVFP4: 16 E2M1 values + one E4M3 scale, + one fp32 scale per tensor",
    "int4_g32": "int4 symmetric, groups of 32 along in, fp16 scales (GPTQ/AWQ style)",
    "int4_g64": "int4 symmetric, groups of 64 along in, fp16 scales",
    "fp8_tensor": "FP8 E4M3, one fp32 scale per tensor",
    "fp8_channel": "FP8 E4M3, one fp32 scale per output channel",
}
REQUANT_FORMATS = tuple(f for f in FORMATS if f != "nvfp4")
# weights each format's block (or group) covers along in_features
BLOCK = {"q8_0": 32, "q4_1": 32, "q4_0": 32, "mxfp4": 32, "nvfp4": 64,
         "int4_g32": 32, "int4_g64": 64, "fp8_tensor": 1, "fp8_channel": 1}


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


def _weight(w, name: str = "w") -> np.ndarray:
    """float32 copy of a non-empty, finite 2-D array-like, or ValueError naming ``name``."""
    arr = np.array(w, dtype=np.float32)
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D [in, out] array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must hold only finite values")
    return arr


def gguf_round_trip(w, fmt: str) -> np.ndarray:
    """Given. Quantize ``w`` ``[in, out]`` to a GGUF block format and back: float32 ``[in, out]``.

    ``fmt`` is "q8_0", "q4_0", "q4_1" or "mxfp4". GGUF stores a weight as
    ``[out, in]`` rows and cuts each row into blocks of 32 consecutive
    weights, so the blocks run along ``in`` (the reduction axis): the matrix
    is transposed, handed to ``gguf.quants.quantize`` (llama.cpp's reference
    quantizers ported to numpy, bit-exact with the C code), dequantized with
    ``gguf.quants.dequantize`` and transposed back.

    Raises ValueError naming ``fmt`` (not one of the four) and ``w`` (not a
    non-empty finite 2-D array, or ``in`` not a multiple of 32).
    """
    from gguf import GGMLQuantizationType, quants

    types = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
             "q4_1": GGMLQuantizationType.Q4_1, "mxfp4": GGMLQuantizationType.MXFP4}
    if fmt not in types:
        raise ValueError(f"fmt must be one of {', '.join(types)}, got {fmt!r}")
    w = _weight(w)
    if w.shape[0] % 32:
        raise ValueError(f"w: in_features must be a multiple of 32 for {fmt}, got shape {w.shape}")
    rows = np.ascontiguousarray(w.T)  # [out, in]: blocks along in
    raw = quants.quantize(rows, types[fmt])
    return np.ascontiguousarray(quants.dequantize(raw, types[fmt]).T, dtype=np.float32)


def all_logits(model, token_ids) -> np.ndarray:
    """Given. The logits at every position of one prefill: float32 ``[T, vocab]``.

    mini_vllm's ``execute`` keeps only the last row of each request (what the
    sampler needs); here every row is wanted, so this runs ``model.forward``
    (the residual stream after the last layer, ``[T, hidden]``) and then
    ``model.compute_logits`` (final norm and LM head) on all rows. Row ``t``
    is the distribution of token ``t + 1``. The model's KV cache is put back
    as it was.

    Raises ValueError naming ``token_ids`` when it is empty.
    """
    from mini_vllm.models.runner import Chunk, make_model_input

    token_ids = [int(t) for t in token_ids]
    if not token_ids:
        raise ValueError("token_ids must hold at least one token id")
    block_size = 16
    num_blocks = -(-len(token_ids) // block_size)
    model_input = make_model_input([Chunk(token_ids, 0, list(range(1, num_blocks + 1)))],
                                   block_size)
    saved = model.kv_cache
    model.init_kv_cache(num_blocks + 1, block_size)  # block 0 stays unused, as in the engine
    try:
        return model.compute_logits(model.forward(model_input))
    finally:
        model.kv_cache = saved


LINEAR_FIELDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def requantized_model(model, fmt: str, layers=None, quantize=None):
    """Given. A new model whose linear weights went through ``quantize(w, fmt)``.

    ``model`` is a mini_vllm numpy ``LlamaForCausalLM``; it is not modified:
    the new model gets new ``LayerWeights`` for the chosen ``layers`` (default:
    all) with ``qkv_proj``, ``o_proj``, ``gate_up_proj`` and ``down_proj``
    replaced, and shares every other array (embedding, norms, LM head, the
    untouched layers) with the original. ``quantize`` defaults to this
    module's ``requantize``. The tied embedding / LM head is left alone, as
    vLLM leaves it for most formats.
    """
    from mini_vllm.models import LlamaForCausalLM

    quantize = requantize if quantize is None else quantize
    n = model.config.num_hidden_layers
    chosen = range(n) if layers is None else [int(i) for i in layers]
    for i in chosen:
        if not 0 <= i < n:
            raise ValueError(f"layers must hold indices in [0, {n}), got {i}")
    w = model.weights
    new_layers = list(w.layers)
    for i in chosen:
        lw = w.layers[i]
        new_layers[i] = dataclasses.replace(
            lw, **{f: quantize(getattr(lw, f), fmt) for f in LINEAR_FIELDS})
    return LlamaForCausalLM(model.config, dataclasses.replace(w, layers=new_layers),
                            tokenizer=model.tokenizer, max_model_len=model.max_model_len,
                            name=f"{model.name}-{fmt}")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Given. KV-cache bytes one token occupies: ``layers * 2 (K and V) * kv_heads * head_dim * dtype_bytes``.

    Qwen2.5-0.5B (24 layers, 2 KV heads of 64, fp16): 24 * 2 * 2 * 64 * 2 =
    12,288 bytes. Raises ValueError naming the first argument that is not an
    integer >= 1.
    """
    for name, v in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                    ("dtype_bytes", dtype_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return layers * 2 * kv_heads * head_dim * dtype_bytes


def extra_kv_tokens(freed_bytes: int, bytes_per_token: int, block_size: int = 16) -> tuple[int, int]:
    """Given. What freed weight memory buys in KV cache: ``(tokens, blocks)``, both rounded down.

    vLLM sizes the KV pool from whatever memory is left after the weights (and
    the activation peak), so bytes freed in the weights become KV tokens one
    for one: ``freed_bytes // bytes_per_token`` tokens, ``tokens //
    block_size`` whole blocks. Raises ValueError naming ``freed_bytes`` (< 0),
    ``bytes_per_token`` or ``block_size`` (< 1).
    """
    if isinstance(freed_bytes, bool) or not isinstance(freed_bytes, int) or freed_bytes < 0:
        raise ValueError(f"freed_bytes must be an integer >= 0, got {freed_bytes!r}")
    for name, v in (("bytes_per_token", bytes_per_token), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    tokens = freed_bytes // bytes_per_token
    return tokens, tokens // block_size


# --------------------------------------------------------------------------
# Your work
# --------------------------------------------------------------------------


def _logits(x, name: str) -> np.ndarray:
    arr = np.array(x, dtype=np.float64)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"{name} must be a non-empty 2-D [positions, vocab] array, "
                         f"got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must hold only finite values")
    return arr


def log_softmax(logits) -> np.ndarray:
    """Log-probabilities over the last axis, in float64, without overflow.

    ``log_softmax(x)_i = x_i - log(sum_j exp(x_j))``. Computed as
    ``z = x - max(x)`` first, so every ``exp`` is of a number <= 0 and the
    largest is exactly 1: logits of 1e4 (or -1e4) give finite, exact
    results. Returns float64 with ``logits``' shape.

    Raises ValueError naming ``logits`` when it is not a non-empty finite
    2-D array ``[positions, vocab]``.
    """
    raise NotImplementedError("log_softmax: subtract each row's max, then z - log(sum(exp(z)))")


def kl_divergence(ref_logits, logits) -> float:
    """Mean over positions of KL(P_ref || P), in nats.

    ``ref_logits``, ``logits``: ``[positions, vocab]``, the same shape.
    Per position, ``KL = sum_i p_i * (log p_i - log q_i)`` with ``p =
    softmax(ref_logits)``, ``q = softmax(logits)``, both logs from
    ``log_softmax`` (a log of a rounded probability is -inf where the
    probability underflows; a log-softmax is not). The direction matters:
    KL(P || Q) weighs the reference's likely tokens. Returns a float >= 0,
    exactly 0 when the two are equal.

    Raises ValueError naming ``ref_logits`` or ``logits`` when not a
    non-empty finite 2-D array, and ``logits`` when its shape differs.
    """
    raise NotImplementedError("kl_divergence: sum over the vocab of exp(logp) * (logp - logq), then the mean over positions")


def top1_agreement(ref_logits, logits) -> float:
    """Fraction of positions whose greedy token (argmax over the vocab) is the same.

    Shapes and errors as ``kl_divergence``. Returns a float in [0, 1].
    """
    raise NotImplementedError("top1_agreement: compare argmax over the last axis, then take the mean")


def perplexity(logits, token_ids) -> float:
    """The model's perplexity on its own prompt: ``exp(mean NLL of the next token)``.

    ``logits[t]`` (``[T, vocab]``, every position of one prefill) is the
    distribution of token ``t + 1``, so position ``t`` is scored on
    ``token_ids[t + 1]`` for ``t = 0 .. T - 2``; the last row predicts a token
    that is not there and is not used. Uniform logits over V tokens give
    exactly V. Returns a float >= 1.

    Raises ValueError naming ``logits`` (not a non-empty finite 2-D array),
    ``token_ids`` (not 1-D with one id per row, fewer than 2 ids, or an id
    outside ``[0, vocab)``).
    """
    raise NotImplementedError("perplexity: row t scores token_ids[t + 1]: exp(mean(-logp[t, ids[t + 1]]))")


def bits_per_weight(fmt: str, shape) -> float:
    """Storage bits per weight of a ``shape = (in, out)`` matrix in format ``fmt``, exactly.

    Everything stored counts: codes, scales, minimums, per-tensor scales.

    ==============  ====================================  ====================
    fmt             stored                                bits per weight
    ==============  ====================================  ====================
    q8_0            34 bytes per 32 (fp16 d, 32 int8)     8.5
    q4_1            20 bytes per 32 (fp16 d, fp16 m)      5.0
    q4_0            18 bytes per 32 (fp16 d)              4.5
    mxfp4           17 bytes per 32 (E8M0, 32 E2M1)       4.25
    nvfp4           36 bytes per 64 + fp32 per tensor     4.5 + 32 / numel
    int4_g32        4 bits + fp16 scale per 32            4.5
    int4_g64        4 bits + fp16 scale per 64            4.25
    fp8_tensor      8 bits + one fp32 scale               8 + 32 / numel
    fp8_channel     8 bits + fp32 scale per out column    8 + 32 / in
    ==============  ====================================  ====================

    Raises ValueError naming ``fmt`` (unknown; the message lists the valid
    names) and ``shape`` (not two integers >= 1, or ``in`` not a multiple of
    the format's block: 32, or 64 for nvfp4 and int4_g64).
    """
    raise NotImplementedError("bits_per_weight: bytes per block * 8 / weights per block, plus any per-tensor or per-channel fp32 scales")


def fake_quant_int4(w, group_size: int) -> np.ndarray:
    """Symmetric int4 with one fp16 scale per group of ``group_size`` along ``in``: round trip.

    ``w``: ``[in, out]`` (mini_vllm's layout; ``in`` is the reduction axis, as
    in GPTQ/AWQ checkpoints). Rows ``g*G .. g*G + G - 1`` of one column form
    a group. Per group: ``scale = max(hi / 7, -lo / 8)`` from the group's max
    ``hi`` and min ``lo`` (so the grid -8..7 reaches both ends), 1.0 for an
    all-zero group, rounded to float16 (what is stored); codes
    ``clip(rint(w / scale), -8, 7)``; result ``codes * scale`` in float32.

    Raises ValueError naming ``group_size`` (not an integer >= 1 dividing
    ``in``) and ``w`` (not a non-empty finite 2-D array).
    """
    raise NotImplementedError("fake_quant_int4: reshape to [in // G, G, out], scale from each group's max/min, fp16, rint, clip to -8..7")


def fake_quant_fp8(w, per: str = "tensor", scale=None) -> np.ndarray:
    """FP8 E4M3 with a float32 scale per tensor or per output channel: round trip.

    ``w``: ``[in, out]``. Without ``scale`` (dynamic, as vLLM quantizes
    weights at load time): ``per="tensor"`` uses ``max|w| / 448``;
    ``per="channel"`` one scale per output column, ``max |w[:, j]| / 448``
    (shape ``[1, out]``); a zero scale becomes 1.0. A given ``scale`` (static,
    as a checkpoint or a calibration supplies it) is a positive number for
    "tensor", or ``out`` positive numbers for "channel". Then
    ``clip(w / scale, -448, 448)`` is cast to ``ml_dtypes.float8_e4m3fn``
    and back, times the scale. The clip is not optional: with a static scale
    a weight can land far beyond 448, and ml_dtypes turns anything at or
    above 464 into NaN (torch saturates; vLLM clamps before its cast).
    Returns float32.

    Raises ValueError naming ``per`` (not "tensor" or "channel"), ``scale``
    (wrong shape, not finite or not > 0) and ``w``.
    """
    raise NotImplementedError("fake_quant_fp8: scale = amax / 448, clip(w / scale, -448, 448), cast to float8_e4m3fn and back")


def requantize(w, fmt: str) -> np.ndarray:
    """Round-trip one ``[in, out]`` weight through format ``fmt``: float32 ``[in, out]``.

    Dispatch: "q8_0", "q4_0", "q4_1", "mxfp4" -> ``gguf_round_trip``;
    "int4_g32" / "int4_g64" -> ``fake_quant_int4`` with 32 / 64;
    "fp8_tensor" / "fp8_channel" -> ``fake_quant_fp8`` per tensor / channel.
    ``w`` is never modified.

    Raises ValueError naming ``fmt`` for anything else (the message lists
    the valid names; "nvfp4" included, since it has no quantizer here), and
    ``w`` as the format's function does.
    """
    raise NotImplementedError("requantize: dispatch on fmt to gguf_round_trip, fake_quant_int4 or fake_quant_fp8")


# --------------------------------------------------------------------------
# python solution.py
# --------------------------------------------------------------------------

# About 256 SmolLM2 tokens of plain English, written for this lab.
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he "
    "could see the whole bay: the fishing boats coming home, the gulls circling the harbour, "
    "and the long line of hills that turned purple as the sun went down. He lit the lamp, "
    "wound the clockwork that turned the lens, and wrote the weather in a small leather book. "
    "In winter the storms came from the north, and the waves broke so high against the rocks "
    "that salt spray reached the windows of the lamp room. On those nights he did not sleep. "
    "He sat by the stove with a pot of tea and listened to the wind, and every hour he climbed "
    "the stairs again to clean the glass. In summer the work was easier. Children from the "
    "village rowed out to the island to bring him bread and letters, and he showed them how "
    "the lens caught the light of a single flame and threw it twenty miles across the water. "
    "When he retired, the lamp was replaced by an electric beacon that needed no keeper at "
    "all, but the villagers still called the island by his name, and the leather books, forty "
    "years of wind and rain, were kept in the library of the little school."
)

PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top "
          "he could see the whole bay and the fishing boats.")

TABLE_FORMATS = ("q8_0", "fp8_channel", "fp8_tensor", "q4_1", "q4_0", "int4_g32",
                 "int4_g64", "mxfp4")


def measure(model, token_ids, ref, fmt: str, layers=None) -> dict:
    """KL, top-1 agreement and perplexity of ``fmt`` against the reference logits ``ref``."""
    logits = all_logits(requantized_model(model, fmt, layers), token_ids)
    return {"kl": kl_divergence(ref, logits), "top1": top1_agreement(ref, logits),
            "ppl": perplexity(logits, token_ids)}


def main(text: str = TEXT, plot: str | None = "pareto.png") -> list[tuple]:
    import threadpoolctl

    from mini_vllm.models import get_model

    rows = []
    with threadpoolctl.threadpool_limits(1, "blas"):
        model = get_model("smollm2")
        ids = model.tokenizer.encode(text)
        ref = all_logits(model, ids)
        shape = (model.config.hidden_size, model.config.hidden_size)
        print(f"SmolLM2-135M, {len(ids)} tokens, all {model.config.num_hidden_layers} layers' "
              f"linear weights requantized; reference = the Q4_1 file in float32 "
              f"(perplexity {perplexity(ref, ids):.3f})")
        print(f"{'format':<12} {'bits/w':>7} {'KL (nats)':>10} {'top-1':>7} {'ppl':>8}")
        for fmt in TABLE_FORMATS:
            m = measure(model, ids, ref, fmt)
            bits = bits_per_weight(fmt, shape)
            rows.append((fmt, bits, m["kl"], m["top1"], m["ppl"]))
            print(f"{fmt:<12} {bits:>7.3f} {m['kl']:>10.2e} {m['top1']:>7.1%} {m['ppl']:>8.3f}")
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot")
            return rows
        fig, ax = plt.subplots(figsize=(6, 4))
        for fmt, bits, kl, _, _ in rows:
            ax.scatter(bits, max(kl, 1e-7))
            ax.annotate(fmt, (bits, max(kl, 1e-7)), textcoords="offset points", xytext=(4, 4))
        ax.set_yscale("log")
        ax.set_xlabel("bits per weight (576 x 576 matrix)")
        ax.set_ylabel("mean KL(ref || quantized), nats")
        ax.set_title("SmolLM2-135M: requantizing the Q4_1 reference")
        fig.tight_layout()
        fig.savefig(plot, dpi=100)
        print(f"saved {plot}")
    return rows


if __name__ == "__main__":
    main()
    # The KV-cache side of the trade (illustrative; run.py measures it on a GPU).
    per_token = kv_bytes_per_token(24, 2, 64, 2)  # Qwen2.5-0.5B, fp16 KV
    # fused qkv_proj, o_proj, gate_up_proj, down_proj [in, out] of each of 24 layers
    qwen = [(896, 1152), (896, 896), (896, 9728), (4864, 896)]
    freed = round(sum(24 * k * n * (16 - bits_per_weight("fp8_tensor", (k, n)))
                      for k, n in qwen) / 8)
    tokens, blocks = extra_kv_tokens(freed, per_token)
    print(f"Qwen2.5-0.5B: {per_token:,} KV bytes/token; fp8 weights free {freed:,} bytes "
          f"= {tokens:,} tokens = {blocks:,} blocks of 16")
