"""Lab 07-03 — Tiled GEMM and the memory-traffic model (reference solution).

A GPU matmul kernel never multiplies whole matrices. Each program owns one
``tm x tn`` tile of ``C = A @ B`` (``A [M, K]``, ``B [K, N]``), keeps it in a
float32 accumulator, and walks the K axis in steps of ``tk``: load a
``tm x tk`` slab of A and a ``tk x tn`` slab of B, multiply, add, repeat,
then store the tile once. Every element of A is loaded once per column of
tiles and every element of B once per row of tiles, so bigger tiles mean
less traffic. This file counts that traffic exactly (in element loads; bytes
are loads times the dtype's size), and runs the same loop in numpy and,
when Triton is installed, as a Triton kernel.

Pieces:

* ``tiled_gemm`` — the tile loop in numpy; it reports every tile it loads
  through an optional callback, so the loads can be counted.
* ``naive_traffic`` / ``tiled_traffic`` / ``reuse_factor`` /
  ``arithmetic_intensity`` — the traffic model.
* ``tile_order`` — which output tile program ``pid`` computes, in the
  grouped order vLLM's fused-MoE kernel uses so neighbouring programs share
  tiles of A in the L2 cache.
* ``_matmul_kernel`` / ``triton_matmul`` — the tile loop as a Triton kernel
  and its launcher (Triton's interpreter runs it on a CPU).

upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:295 fused_moe_kernel
upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:388 pid_m
upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:482 fused_moe_kernel.accumulator
upstream: vllm/model_executor/layers/batch_invariant.py:42 matmul_kernel_persistent
"""
from __future__ import annotations

import os

import numpy as np

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
except ImportError:  # everything but the Triton kernel works without them
    torch = triton = tl = None


# ---------------------------------------------------------------- given helpers


def _check_size(value, name: str) -> int:
    """Given. ``value`` as a Python int; ValueError naming ``name`` unless an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _as_matrix(a, name: str) -> np.ndarray:
    """Given. ``a`` as a 2-D numpy array (its own dtype), or ValueError naming ``name``.

    Refuses anything but a non-empty 2-D array of real numbers.
    """
    arr = np.asarray(a)
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a non-empty 2-D array of numbers, got shape "
                         f"{arr.shape} dtype {arr.dtype}")
    return arr


# ---------------------------------------------------------------- the tile loop


def tiled_gemm(A, B, tm: int, tn: int, tk: int, on_load=None) -> np.ndarray:
    """``C = A @ B`` computed one ``tm x tn`` output tile at a time, K in steps of ``tk``.

    A: ``[M, K]``, B: ``[K, N]``, any integer or float dtype (not modified).
    Returns float32 ``[M, N]``.

    The loop, which is the contract (a GPU kernel's program order):

    * output tiles in row-major order: row ``i0 = 0, tm, 2*tm, ...``, and
      within it ``j0 = 0, tn, 2*tn, ...``; the tile is rows
      ``[i0, min(i0 + tm, M))`` and columns ``[j0, min(j0 + tn, N))``, so the
      last tile of a row or column is smaller when ``tm`` or ``tn`` does not
      divide ``M`` or ``N`` (never padded, never skipped);
    * for each tile, a float32 accumulator starts at zero; for ``k0 = 0, tk,
      2*tk, ...`` the slab ``A[i0:i1, k0:k1]`` is loaded, then
      ``B[k0:k1, j0:j1]`` (``k1 = min(k0 + tk, K)``), both converted to
      float32, and their product is added to the accumulator;
    * the finished tile is written to ``C`` once.

    on_load: None, or a callable invoked once per slab loaded, in the order
    above, as ``on_load("A", i0, i1, k0, k1)`` then ``on_load("B", k0, k1,
    j0, j1)`` (half-open row and column bounds within that operand).

    Raises ValueError naming ``A`` or ``B`` unless each is a non-empty 2-D
    array of numbers, naming ``B`` when ``B.shape[0] != A.shape[1]``, and
    naming ``tm``, ``tn`` or ``tk`` unless it is an integer >= 1.
    """
    A = _as_matrix(A, "A")
    B = _as_matrix(B, "B")
    M, K = A.shape
    if B.shape[0] != K:
        raise ValueError(f"B must have A.shape[1] = {K} rows, got B of shape {B.shape}")
    tm, tn, tk = _check_size(tm, "tm"), _check_size(tn, "tn"), _check_size(tk, "tk")
    N = B.shape[1]
    C = np.empty((M, N), dtype=np.float32)
    for i0 in range(0, M, tm):
        i1 = min(i0 + tm, M)
        for j0 in range(0, N, tn):
            j1 = min(j0 + tn, N)
            # the "registers": one float32 tile, whatever the inputs' dtype
            acc = np.zeros((i1 - i0, j1 - j0), dtype=np.float32)
            for k0 in range(0, K, tk):
                k1 = min(k0 + tk, K)
                a = A[i0:i1, k0:k1].astype(np.float32)
                b = B[k0:k1, j0:j1].astype(np.float32)
                if on_load is not None:
                    on_load("A", i0, i1, k0, k1)
                    on_load("B", k0, k1, j0, j1)
                acc += a @ b
            C[i0:i1, j0:j1] = acc  # one store per output tile
    return C


# ---------------------------------------------------------------- the traffic model


def naive_traffic(M: int, N: int, K: int) -> int:
    """Element loads of the untiled matmul: each of the ``M * N`` outputs reads its
    row of A and its column of B, ``2 * K`` elements, so ``M * N * 2 * K``.

    Returns an exact Python int (1024^3 gives 2,147,483,648, one more than
    int32 holds). Raises ValueError naming ``M``, ``N`` or ``K`` unless it is
    an integer >= 1.
    """
    M, N, K = _check_size(M, "M"), _check_size(N, "N"), _check_size(K, "K")
    return M * N * 2 * K


def tiled_traffic(M: int, N: int, K: int, tm: int, tn: int) -> int:
    """Element loads of ``tiled_gemm`` with ``tm x tn`` output tiles.

    A is read once per column of tiles and B once per row of tiles::

        M * K * ceil(N / tn)  +  K * N * ceil(M / tm)

    The K step ``tk`` does not appear: it changes how the loads are cut, not
    how many there are. Tiles at least as big as the matrix give
    ``M * K + K * N``, every element once. Returns an exact Python int.

    Raises ValueError naming ``M``, ``N``, ``K``, ``tm`` or ``tn`` unless it is
    an integer >= 1.
    """
    M, N, K = _check_size(M, "M"), _check_size(N, "N"), _check_size(K, "K")
    tm, tn = _check_size(tm, "tm"), _check_size(tn, "tn")
    col_tiles = -(-N // tn)  # ceil in integers: a ragged last tile still costs a full pass
    row_tiles = -(-M // tm)
    return M * K * col_tiles + K * N * row_tiles


def reuse_factor(tm: int, tn: int) -> float:
    """How many times fewer loads a ``tm x tn`` tile needs than the naive loop, when
    the tiles divide the matrix: ``naive / tiled = 2 / (1/tm + 1/tn)``, the
    harmonic mean of the two tile sides.

    128 x 128 gives 128.0; 256 x 16 gives 512 / 17 = 30.12 (the thin side
    dominates); a decode step's ``M = 1`` row gives less than 2 whatever ``tn``
    is. Returns a float. Raises ValueError naming ``tm`` or ``tn`` unless it is
    an integer >= 1.
    """
    tm, tn = _check_size(tm, "tm"), _check_size(tn, "tn")
    return 2 * tm * tn / (tm + tn)


def arithmetic_intensity(M: int, N: int, K: int, tm: int, tn: int, dtype_bytes: int = 2) -> float:
    """FLOPs per byte of memory traffic of the tiled matmul.

    FLOPs: ``2 * M * N * K`` (a multiply and an add per term). Bytes:
    ``dtype_bytes * (tiled_traffic(M, N, K, tm, tn) + M * N)`` — the tile
    loads plus one store of each output element, all in the same dtype
    (2 for fp16 / bf16). Every tile load is counted as a trip to memory,
    which is the worst case: a cache that holds a tile another program just
    loaded makes the real figure higher.

    Returns a float. Raises ValueError naming ``M``, ``N``, ``K``, ``tm``,
    ``tn`` or ``dtype_bytes`` unless it is an integer >= 1.
    """
    dtype_bytes = _check_size(dtype_bytes, "dtype_bytes")
    moved = tiled_traffic(M, N, K, tm, tn) + M * N
    return 2 * M * N * K / (dtype_bytes * moved)


def tile_order(pid: int, num_pid_m: int, num_pid_n: int, group_size_m: int) -> tuple[int, int]:
    """The output tile ``(pid_m, pid_n)`` that program ``pid`` computes, in grouped order.

    Programs are numbered ``0 .. num_pid_m * num_pid_n - 1`` and launch
    roughly in that order. Row-major order would give consecutive programs a
    whole row of tiles: one tile-row of A, every tile-column of B. Grouped
    order walks down a band of ``group_size_m`` tile rows first, column by
    column, so a wave of programs reuses a few tiles of both A and B::

        num_pid_in_group = group_size_m * num_pid_n
        group_id         = pid // num_pid_in_group
        first_pid_m      = group_id * group_size_m
        rows_in_group    = min(num_pid_m - first_pid_m, group_size_m)   # the last band may be short
        pid_m            = first_pid_m + (pid % num_pid_in_group) % rows_in_group
        pid_n            = (pid % num_pid_in_group) // rows_in_group

    ``group_size_m = 1`` is row-major order. Every tile is produced by exactly
    one program. Returns a tuple of two Python ints.

    Raises ValueError naming ``num_pid_m``, ``num_pid_n`` or ``group_size_m``
    unless it is an integer >= 1, and naming ``pid`` unless
    ``0 <= pid < num_pid_m * num_pid_n``.
    """
    num_pid_m = _check_size(num_pid_m, "num_pid_m")
    num_pid_n = _check_size(num_pid_n, "num_pid_n")
    group_size_m = _check_size(group_size_m, "group_size_m")
    total = num_pid_m * num_pid_n
    if isinstance(pid, bool) or not isinstance(pid, (int, np.integer)) or not 0 <= pid < total:
        raise ValueError(f"pid must be an integer in [0, {total}), got {pid!r}")
    pid = int(pid)
    num_pid_in_group = group_size_m * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * group_size_m
    # the bottom band holds fewer rows when group_size_m does not divide num_pid_m
    rows_in_group = min(num_pid_m - first_pid_m, group_size_m)
    pid_m = first_pid_m + (pid % num_pid_in_group) % rows_in_group
    pid_n = (pid % num_pid_in_group) // rows_in_group
    return pid_m, pid_n


# ---------------------------------------------------------------- the Triton kernel


if triton is not None:

    @triton.jit
    def _matmul_kernel(
        a_ptr, b_ptr, c_ptr,
        M, N, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
    ):
        """One program per ``BLOCK_M x BLOCK_N`` tile of C; the grid is 1-D,
        ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)``.

        Contract:

        - program ``pid`` computes the tile that ``tile_order(pid, cdiv(M,
          BLOCK_M), cdiv(N, BLOCK_N), GROUP_SIZE_M)`` names;
        - it accumulates in float32 over K in steps of ``BLOCK_K`` (``tl.dot``
          with ``input_precision="ieee"``, so float32 inputs are not rounded to
          TF32 on a GPU) and stores the tile once, cast to C's dtype;
        - rows past ``M``, columns past ``N`` and K indices past ``K`` are
          masked: loads read 0 there and nothing is stored outside C;
        - the ``stride_*`` arguments are element strides (row, column) of each
          matrix, so transposed and sliced views work.
        """
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_SIZE_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_SIZE_M
        rows_in_group = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + (pid % num_pid_in_group) % rows_in_group
        pid_n = (pid % num_pid_in_group) // rows_in_group

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            k = kt * BLOCK_K + offs_k
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                        mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)
            b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=c_mask)

else:
    _matmul_kernel = None


def triton_matmul(A, B, block_m: int = 16, block_n: int = 16, block_k: int = 16,
                  group_size_m: int = 2):
    """``A @ B`` by one launch of ``_matmul_kernel``; returns a new tensor of A's dtype.

    A: torch ``[M, K]``, B: torch ``[K, N]``, both float16 or both float32, on
    the same device (any strides). The grid is ``(cdiv(M, block_m) *
    cdiv(N, block_n),)``; no torch fallback computes any part of C.

    Raises RuntimeError when triton or torch is missing. Raises ValueError
    naming ``A`` or ``B`` unless each is 2-D, naming ``B`` when its dtype
    differs from A's or ``B.shape[0] != A.shape[1]``, naming ``A`` unless its
    dtype is float16 or float32, naming ``block_m``, ``block_n`` or
    ``block_k`` unless it is a power of two >= 16 (``tl.dot``'s minimum), and
    naming ``group_size_m`` unless it is an integer >= 1.
    """
    if triton is None:
        raise RuntimeError("triton_matmul needs torch and triton (pip install -e '.[triton]')")
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D torch tensor, got {type(t).__name__} "
                             f"of shape {tuple(getattr(t, 'shape', ()))}")
    if A.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"A must be float16 or float32, got {A.dtype}")
    if B.dtype != A.dtype:
        raise ValueError(f"B must have A's dtype {A.dtype}, got {B.dtype}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(f"B must have A.shape[1] = {A.shape[1]} rows, got {tuple(B.shape)}")
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_size(value, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    _check_size(group_size_m, "group_size_m")
    M, K = A.shape
    N = B.shape[1]
    C = torch.empty((M, N), dtype=A.dtype, device=A.device)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _matmul_kernel[grid](
        A, B, C, M, N, K,
        A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_SIZE_M=group_size_m,
    )
    return C


# ---------------------------------------------------------------- the printed example


def _example() -> None:
    M = N = K = 1024
    naive = naive_traffic(M, N, K)
    print(f"naive 1024^3:            {naive:>13,} loads  {naive * 2 / 2**30:7.2f} GiB at fp16")
    for tm, tn in ((16, 16), (64, 64), (128, 128), (256, 16)):
        t = tiled_traffic(M, N, K, tm, tn)
        print(f"tiles {tm:>3} x {tn:<3}:          {t:>13,} loads  {t * 2 / 2**20:7.1f} MiB  "
              f"{naive / t:6.2f}x less (reuse {reuse_factor(tm, tn):.2f})")
    for m in (1, 16, 4096):
        ai = arithmetic_intensity(m, 4096, 4096, 128, 128)
        print(f"M = {m:>4}, N = K = 4096, 128 x 128 tiles: {ai:6.2f} FLOP/byte at fp16")


if __name__ == "__main__":
    _example()
