"""Lab 07-02 — A Triton grouped GEMM over sorted token ids (reference solution).

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
        pid = tl.program_id(axis=0)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        # The id buffer may be longer than what is in use (upstream sizes it for
        # the worst case); blocks past the end have nothing to do.
        num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
        if pid_m * BLOCK_M >= num_tokens_post_padded:
            return

        offs_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slot = tl.load(sorted_token_ids_ptr + offs_id).to(tl.int64)
        slot_mask = slot < num_valid_tokens  # False on padding ids
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        # Gather: the top_k slots of one token all read that token's row.
        a_rows = a_ptr + (slot // top_k)[:, None] * stride_am
        b_cols = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            k = kt * BLOCK_K + offs_k
            a = tl.load(a_rows + k[None, :] * stride_ak,
                        mask=slot_mask[:, None] & (k[None, :] < K), other=0.0)
            # B tile [BLOCK_K, BLOCK_N]: element (k, n) is B[e, n, k]
            b = tl.load(b_cols + k[:, None] * stride_bk,
                        mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")

        if MUL_ROUTED_WEIGHT:
            w = tl.load(topk_weights_ptr + slot, mask=slot_mask, other=0.0)
            acc = acc * w.to(tl.float32)[:, None]

        c_ptrs = c_ptr + slot[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
                 mask=slot_mask[:, None] & (offs_n[None, :] < N))

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
    if triton is None:
        raise RuntimeError("invoke_fused_moe_kernel needs torch and triton "
                           "(pip install -e '.[triton]')")
    block_m = _check_block(block_m, "block_m")
    block_n = _check_block(block_n, "block_n")
    block_k = _check_block(block_k, "block_k")
    top_k = _check_size(top_k, "top_k")
    if not isinstance(A, torch.Tensor) or A.dim() != 2 \
            or A.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"A must be a 2-D float16 or float32 tensor, got "
                         f"{getattr(A, 'dtype', type(A).__name__)} "
                         f"{tuple(getattr(A, 'shape', ()))}")
    M, K = A.shape
    if not isinstance(B, torch.Tensor) or B.dim() != 3 or B.dtype != A.dtype or B.shape[2] != K:
        raise ValueError(f"B must be [E, N, {K}] with A's dtype {A.dtype}, got "
                         f"{getattr(B, 'dtype', None)} {tuple(getattr(B, 'shape', ()))}")
    E, N = B.shape[0], B.shape[1]
    if not isinstance(C, torch.Tensor) or tuple(C.shape) != (M * top_k, N) or C.dtype != A.dtype:
        raise ValueError(f"C must be [{M * top_k}, {N}] (M * top_k, N) with A's dtype, got "
                         f"{getattr(C, 'dtype', None)} {tuple(getattr(C, 'shape', ()))}")
    if mul_routed_weight:
        if not isinstance(topk_weights, torch.Tensor) or topk_weights.numel() != M * top_k \
                or not topk_weights.is_contiguous() or not topk_weights.is_floating_point():
            raise ValueError(f"topk_weights must be {M * top_k} (M * top_k) contiguous floats "
                             f"when mul_routed_weight, got {type(topk_weights).__name__}")
    else:
        topk_weights = C  # never read: MUL_ROUTED_WEIGHT is a constexpr False
    ids = sorted_token_ids
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point() \
            or ids.numel() % block_m:
        raise ValueError(f"sorted_token_ids must be a 1-D integer tensor whose length is a "
                         f"multiple of block_m={block_m}")
    EM = ids.numel()
    if not isinstance(expert_ids, torch.Tensor) or expert_ids.dim() != 1 \
            or expert_ids.is_floating_point() or expert_ids.numel() != EM // block_m:
        raise ValueError(f"expert_ids must be a 1-D integer tensor of {EM // block_m} "
                         f"(EM // block_m) experts")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= E):
        raise ValueError(f"expert_ids must lie in [0, {E}) (B.shape[0])")
    if isinstance(num_tokens_post_padded, torch.Tensor):
        if num_tokens_post_padded.numel() != 1 or num_tokens_post_padded.is_floating_point():
            raise ValueError("num_tokens_post_padded must be an int or a one-element "
                             "integer tensor")
        used = int(num_tokens_post_padded.item())
    elif isinstance(num_tokens_post_padded, (int, np.integer)) \
            and not isinstance(num_tokens_post_padded, bool):
        used = int(num_tokens_post_padded)
    else:
        raise ValueError("num_tokens_post_padded must be an int or a one-element integer tensor")
    if not 0 <= used <= EM or used % block_m:
        raise ValueError(f"num_tokens_post_padded must be a multiple of block_m={block_m} "
                         f"in [0, {EM}], got {used}")
    ntpp = torch.tensor([used], dtype=torch.int32, device=A.device)
    grid = (triton.cdiv(EM, block_m) * triton.cdiv(N, block_n),)
    fused_moe_kernel[grid](
        A, B, C, topk_weights, ids, expert_ids, ntpp,
        N, K, EM, M * top_k,
        A.stride(0), A.stride(1),
        B.stride(0), B.stride(1), B.stride(2),
        C.stride(0), C.stride(1),
        top_k=top_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        MUL_ROUTED_WEIGHT=bool(mul_routed_weight),
    )
    return C


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
    if tuple(topk_ids.shape[:1]) != (x.shape[0],) or topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [T, k] with T = {x.shape[0]}, "
                         f"got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    T, k = topk_ids.shape
    sorted_ids, expert_ids, used = moe_align_block_size(
        topk_ids.cpu().numpy().astype(np.int64), block_m, w13.shape[0])
    dev = x.device
    sorted_ids = torch.from_numpy(sorted_ids).to(dev)
    expert_ids = torch.from_numpy(expert_ids).to(dev)
    weights = topk_weights.reshape(-1).contiguous().to(torch.float32)

    cache1 = torch.empty((T * k, w13.shape[1]), dtype=x.dtype, device=dev)
    invoke_fused_moe_kernel(x, w13, cache1, None, sorted_ids, expert_ids, used,
                            top_k=k, mul_routed_weight=False,
                            block_m=block_m, block_n=block_n, block_k=block_k)
    cache2 = silu_and_mul(cache1)
    cache3 = torch.empty((T * k, w2.shape[1]), dtype=x.dtype, device=dev)
    # cache2 already has one row per slot: the slot id is the row, so top_k = 1.
    invoke_fused_moe_kernel(cache2, w2, cache3, weights, sorted_ids, expert_ids, used,
                            top_k=1, mul_routed_weight=True,
                            block_m=block_m, block_n=block_n, block_k=block_k)
    return cache3.view(T, k, -1).sum(dim=1)  # moe_sum: each token's k rows


# ---------------------------------------------------------------- the trace parser


def kernel_category(name: str) -> str:
    """The family of a GPU kernel, from its name.

    The name is lower-cased and checked against ``KERNEL_CATEGORIES`` in order;
    the first category with a substring in the name wins. No match: ``"other"``.
    ``"fused_moe_kernel"`` is ``"fused_moe"`` (not ``"gemm"``, though it is
    one); ``"_moe_align_block_size_kernel"`` is ``"moe_routing"``.

    Raises ValueError naming ``name`` unless it is a string.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {type(name).__name__}")
    low = name.lower()
    for category, needles in KERNEL_CATEGORIES:
        if any(n in low for n in needles):
            return category
    return "other"


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
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("trace must be a dict with a 'traceEvents' list (a Chrome trace)")
    count: dict[str, int] = {}
    time: dict[str, float] = {}
    for ev in trace["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        if str(ev.get("cat", "")).lower() != "kernel":
            continue
        dur = ev.get("dur")
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or dur < 0:
            raise ValueError(f"dur must be a duration >= 0 in every kernel event, got {dur!r} "
                             f"for {ev.get('name')!r}")
        cat = kernel_category(ev.get("name", ""))
        count[cat] = count.get(cat, 0) + 1
        time[cat] = time.get(cat, 0.0) + float(dur)
    total = sum(time.values())
    rows = [(c, count[c], time[c], time[c] / total if total else 0.0) for c in time]
    return sorted(rows, key=lambda r: (-r[2], r[0]))
