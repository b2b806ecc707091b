"""Lab 07-02 — A Triton grouped GEMM over sorted token ids (your implementation).

Lab 01 turned a batch's routing into three arrays: ``sorted_token_ids`` (the
``T * top_k`` slot ids ``t * top_k + j`` grouped by expert, each group padded
to a multiple of ``BLOCK_M`` with the id ``T * top_k``), ``expert_ids`` (the
expert of each block of ``BLOCK_M`` ids) and ``num_tokens_post_padded`` (how
many ids are in use). Here one Triton kernel consumes them. Each program owns
one ``BLOCK_M x BLOCK_N`` tile of output: ``BLOCK_M`` consecutive sorted ids,
all of one expert. It gathers the input rows those ids point at (row
``id // top_k`` of ``A``: several slots of a token share its row), multiplies
them by that expert's weight ``B[e]`` (``[N, K]``, the ``F.linear`` layout),
optionally scales each row by its slot's routing weight, and writes each row
to row ``id`` of ``C``, which has one row per slot. Padding ids (``>=
T * top_k``) are masked: never read, never written.

The MoE layer is two such launches with the activation between them, the
way vLLM's ``fused_experts_impl`` runs it:

1. ``A = x [T, H]``, ``B = w13 [E, 2I, H]``, ``top_k = k``, no routing weight:
   ``cache1 [T*k, 2I]``, one row per slot.
2. ``cache2 = silu(gate) * up`` ``[T*k, I]`` (torch; given).
3. ``A = cache2``, ``B = w2 [E, H, I]``, ``top_k = 1`` (``cache2`` already has
   one row per slot, so the row is the slot id itself), routing weight on:
   ``cache3 [T*k, H]``.
4. ``moe_sum``: ``cache3.view(T, k, H).sum(1)``, each token's ``k`` rows added.

The second half of the lab reads a torch-profiler trace of a real vLLM run and
says where the GPU time went: ``kernel_category`` names a kernel's family and
``kernel_shares`` adds up the durations per family.

upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:295 fused_moe_kernel
upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:708 invoke_fused_moe_triton_kernel
upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:1664 fused_experts_impl
"""
from __future__ import annotations

import gzip
import json
import os

import numpy as np

from mini_vllm.models.moe import moe_align_block_size  # noqa: F401 (fused_experts_triton uses it)

if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch as _torch_probe

        if not _torch_probe.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:
        pass

try:
    import torch
    import triton
    import triton.language as tl
except ImportError:  # the trace parser works without them
    torch = triton = tl = None


# ---------------------------------------------------------------- given helpers


def _check_size(value, name: str) -> int:
    """Given. ``value`` as a Python int; ValueError naming ``name`` unless an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_block(value, name: str) -> int:
    """Given. A block size: a power of two >= 16 (``tl.dot``'s minimum).

    ValueError naming ``name`` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value!r}")
    return int(value)


def silu_and_mul(gate_up):
    """Given. ``[n, 2I] -> [n, I]``: ``silu(gate) * up`` (the gate is the first half).

    upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:1825 apply_moe_activation
    """
    inter = gate_up.shape[1] // 2
    return torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]


# (category, substrings of the lower-cased kernel name), first match wins: the
# MoE kernels come first so "fused_moe_kernel" is never counted as a GEMM.
KERNEL_CATEGORIES = (
    ("fused_moe", ("fused_moe",)),
    ("moe_routing", ("moe_align", "topk", "moe_sum", "count_and_sort")),
    ("attention", ("flash", "attn", "attention", "fmha")),
    ("norm", ("rms_norm", "rmsnorm", "layer_norm", "layernorm", "rsqrt")),
    ("gemm", ("gemm", "cutlass", "cublas", "nvjet", "sm80_xmma", "sm90_xmma", "matmul")),
)


def load_trace(path) -> dict:
    """Given. A torch-profiler Chrome trace (``.json`` or ``.json.gz``) as a dict."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


# ---------------------------------------------------------------- the kernel


if triton is not None:

    @triton.jit
    def fused_moe_kernel(
        a_ptr, b_ptr, c_ptr,
        topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
        N, K, EM, num_valid_tokens,
        stride_am, stride_ak,
        stride_be, stride_bn, stride_bk,
        stride_cm, stride_cn,
        top_k: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        MUL_ROUTED_WEIGHT: tl.constexpr,
    ):
        """One program per (block of sorted ids, column tile); 1-D grid of
        ``cdiv(EM, BLOCK_M) * cdiv(N, BLOCK_N)`` programs, ``pid_m = pid //
        cdiv(N, BLOCK_N)`` and ``pid_n = pid % cdiv(N, BLOCK_N)``.

        Contract:

        - a program whose block starts at or past ``num_tokens_post_padded``
          (read from its one-element tensor) returns without writing;
        - its ``BLOCK_M`` ids are ``sorted_token_ids[pid_m * BLOCK_M + i]``;
          ids ``>= num_valid_tokens`` are padding: masked in every load and in
          the store;
        - the expert is ``expert_ids[pid_m]``; ``B[e]`` is ``[N, K]`` reached
          through ``stride_be``, ``stride_bn``, ``stride_bk``;
        - row ``i`` of the tile is ``A[id // top_k, :] @ B[e].T`` over the
          columns of tile ``pid_n``, accumulated in float32 over K in steps of
          ``BLOCK_K`` with every K index ``>= K`` masked (``tl.dot`` with
          ``input_precision="ieee"``);
        - with ``MUL_ROUTED_WEIGHT`` each row is multiplied once, in float32,
          by ``topk_weights[id]`` (the flat weights, one per slot);
        - the row is stored at row ``id`` of C (``stride_cm``), cast to C's
          dtype, columns ``>= N`` masked.

        upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:295 fused_moe_kernel
        """
        raise NotImplementedError("fused_moe_kernel: pid -> (pid_m, pid_n); stop past "
                                  "num_tokens_post_padded; mask ids >= num_valid_tokens; "
                                  "A rows id // top_k, B[expert]; fp32 tl.dot over masked K; "
                                  "optional weight; store at row id")

else:
    fused_moe_kernel = None


def invoke_fused_moe_kernel(A, B, C, topk_weights, sorted_token_ids, expert_ids,
                            num_tokens_post_padded, top_k: int, mul_routed_weight: bool,
                            block_m: int = 16, block_n: int = 32, block_k: int = 16):
    """Launch ``fused_moe_kernel`` once; it fills the slot rows of ``C``, which is returned.

    A: torch ``[M, K]`` float16 or float32 (any strides). B: ``[E, N, K]``, A's
    dtype. C: ``[M * top_k, N]``, A's dtype, written in place (padding never
    touches it; rows of slots that no block lists are left as they were).
    topk_weights: ``M * top_k`` floats (``[M, top_k]`` or flat), contiguous;
    used only when ``mul_routed_weight`` (may be None otherwise).
    sorted_token_ids: 1-D integer tensor whose length ``EM`` is a multiple of
    ``block_m``; expert_ids: 1-D integer tensor of ``EM // block_m`` experts in
    ``[0, E)``; num_tokens_post_padded: an int or a one-element integer
    tensor, a multiple of ``block_m`` in ``[0, EM]``. All on A's device.

    The grid is ``(cdiv(EM, block_m) * cdiv(N, block_n),)``; no torch code
    computes any part of C.

    Raises RuntimeError when triton or torch is missing. Raises ValueError
    naming ``A`` (not 2-D float16/float32), ``B`` (not 3-D, another dtype, or
    ``B.shape[2] != A.shape[1]``), ``C`` (shape other than ``[M * top_k, N]``
    or another dtype), ``top_k`` (not an integer >= 1), ``topk_weights`` (not
    ``M * top_k`` contiguous values when ``mul_routed_weight``),
    ``sorted_token_ids``, ``expert_ids``, ``num_tokens_post_padded`` (as
    above), and ``block_m`` / ``block_n`` / ``block_k`` (not a power of two >= 16).

    upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:708 invoke_fused_moe_triton_kernel
    """
    raise NotImplementedError("invoke_fused_moe_kernel: validate, put "
                              "num_tokens_post_padded in a 1-element tensor, launch "
                              "fused_moe_kernel once on a 1-D grid")


def fused_experts_triton(x, w13, w2, topk_weights, topk_ids,
                         block_m: int = 16, block_n: int = 32, block_k: int = 16):
    """The MoE layer's output ``[T, H]`` from two launches of the kernel, in vLLM's layout.

    x: torch ``[T, H]``; w13: ``[E, 2I, H]`` (gate rows, then up rows); w2:
    ``[E, H, I]``; topk_weights: float ``[T, k]``; topk_ids: integer ``[T, k]``
    (distinct experts per row). Same dtype and device for x, w13 and w2.

    Steps: align the slots with ``mini_vllm.models.moe.moe_align_block_size``
    (block ``block_m``); launch 1 (``A = x``, ``B = w13``, ``top_k = k``, no
    routing weight) into ``cache1 [T*k, 2I]``; ``cache2 = silu_and_mul(cache1)``;
    launch 2 (``A = cache2``, ``B = w2``, ``top_k = 1``, routing weight applied)
    into ``cache3 [T*k, H]``; return ``cache3.view(T, k, H).sum(1)``.
    The routing weight is applied exactly once, in launch 2.

    Raises ValueError naming ``topk_ids`` unless it is ``[T, k]`` with ``T =
    x.shape[0]``, and naming ``topk_weights`` unless its shape equals
    ``topk_ids``'s; the launcher's own checks apply to each launch.

    upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:1664 fused_experts_impl
    """
    raise NotImplementedError("fused_experts_triton: align; launch w13 (top_k=k, no "
                              "weight); silu_and_mul; launch w2 (top_k=1, weight); "
                              "sum the k rows of each token")


# ---------------------------------------------------------------- the trace parser


def kernel_category(name: str) -> str:
    """The family of a GPU kernel, from its name.

    The name is lower-cased and checked against ``KERNEL_CATEGORIES`` in order;
    the first category with a substring in the name wins. No match: ``"other"``.
    ``"fused_moe_kernel"`` is ``"fused_moe"`` (not ``"gemm"``, though it is
    one); ``"_moe_align_block_size_kernel"`` is ``"moe_routing"``.

    Raises ValueError naming ``name`` unless it is a string.
    """
    raise NotImplementedError("kernel_category: lower-case the name; the first "
                              "KERNEL_CATEGORIES entry with a substring in it, else 'other'")


def kernel_shares(trace: dict) -> list[tuple[str, int, float, float]]:
    """Where the GPU time went: ``[(category, launches, microseconds, share), ...]``.

    trace: a torch-profiler Chrome trace as a dict (``load_trace``): its
    ``"traceEvents"`` list holds complete events (``"ph": "X"``) with a
    ``"cat"``, a ``"name"`` and a ``"dur"`` in microseconds. Only GPU kernels
    count: ``cat`` equal to ``"kernel"`` (any case). CPU ops, runtime calls
    (``cudaLaunchKernel``), memcpy and memset events are ignored, as are
    events without ``ph == "X"``.

    One tuple per category that has at least one kernel: the number of
    kernels, their summed ``dur``, and that sum over the total of all kernels.
    Sorted by microseconds, largest first (ties by category name); shares sum
    to 1. No kernel at all gives ``[]``.

    Raises ValueError naming ``trace`` unless it is a dict with a
    ``"traceEvents"`` list, and naming ``dur`` when a kernel event's duration
    is missing or negative.
    """
    raise NotImplementedError("kernel_shares: keep ph 'X' events with cat 'kernel' (any "
                              "case); count and sum dur per category; share = sum / total")
