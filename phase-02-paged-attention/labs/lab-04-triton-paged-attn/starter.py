"""Lab 02-04 — decode attention in Triton, K/V gathered through a block table (your implementation).

Pieces:

* ``paged_decode_torch`` — the slow, obviously right reference: gather each
  sequence's K/V through its block table with torch indexing, then softmax.
* ``_paged_decode_kernel`` — the Triton kernel: one program per (sequence, query
  head); it walks the sequence's logical blocks, loads each physical block id
  from the table, loads that block's K and V tile, and keeps an online softmax
  (running max ``m``, running sum ``l``, fp32 accumulator) so the score row is
  never materialised.
* ``paged_decode_attention`` — the launcher (shape checks, grid, strides).
* ``decode_bytes_moved`` / ``bandwidth_fraction`` — the arithmetic of a memory
  bound kernel: bytes it must read and write, divided by time, over the card's
  peak. Checked on the CPU; ``benchmark`` measures the time on a GPU.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
On a machine without CUDA the kernel runs through Triton's interpreter
(``TRITON_INTERPRET=1``, set below before triton is imported).

upstream: vllm/v1/attention/ops/triton_decode_attention.py:60 _fwd_kernel_stage1
upstream: vllm/v1/attention/ops/triton_unified_attention.py:179 kernel_unified_attention
upstream: csrc/attention/attention_kernels.cuh:252-253 physical_block_number (block_table read)
"""
from __future__ import annotations

import math
import os

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
except ImportError:  # the bandwidth arithmetic below still works without them
    torch = triton = tl = None

# Datasheet peak memory bandwidth, bytes per second. Match order matters:
# the first key found in torch.cuda.get_device_name() wins.
PEAK_BANDWIDTH: dict[str, float] = {
    "H200": 4.8e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,  # SXM5, HBM3
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,  # 40 GB parts
    "L40S": 864e9,
    "A10": 600e9,
    "L4": 300e9,
    "T4": 320e9,
}


def peak_bandwidth_for(device_name: str) -> float:
    """Datasheet peak bytes/s for a device name as CUDA reports it."""
    for key, value in PEAK_BANDWIDTH.items():
        if key in device_name:
            return value
    raise ValueError(
        f"device_name {device_name!r} is not in PEAK_BANDWIDTH; pass peak_bytes_per_s yourself"
    )


def make_paged_inputs(
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int | None = None,
    dtype=None,
    device: str = "cpu",
    seed: int = 0,
):
    """Random q, K/V caches and shuffled block tables for a batch of sequences.

    Unused slots are filled with 1e4 so a kernel that reads past ``seq_len``
    produces a visibly wrong answer. Returns
    ``(q, k_cache, v_cache, block_tables, seq_lens_tensor)``.
    """
    dtype = dtype or torch.float32
    gen = torch.Generator().manual_seed(seed)
    per_seq = [math.ceil(s / block_size) for s in seq_lens]
    needed = sum(per_seq)
    num_blocks = num_blocks or needed + 3
    if num_blocks < needed:
        raise ValueError(f"num_blocks must be >= {needed} for these seq_lens, got {num_blocks}")
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, 1e4)
    v_cache = torch.full(shape, 1e4)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(per_seq)
    tables = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
    cursor = 0
    for i, (s, n) in enumerate(zip(seq_lens, per_seq, strict=True)):
        ids = order[cursor : cursor + n]
        cursor += n
        tables[i, :n] = torch.tensor(ids, dtype=torch.int32)
        for t in range(s):
            b, off = ids[t // block_size], t % block_size
            k_cache[b, off] = torch.randn((num_kv_heads, head_dim), generator=gen)
            v_cache[b, off] = torch.randn((num_kv_heads, head_dim), generator=gen)
    q = torch.randn((len(seq_lens), num_heads, head_dim), generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return (q.to(dtype).to(device), k_cache.to(dtype).to(device), v_cache.to(dtype).to(device),
            tables.to(device), lens.to(device))


def paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens):
    """Reference decode attention, slow and obviously right: your debugger for the kernel.

    Shapes: ``q [num_seqs, num_heads, head_dim]``; ``k_cache`` and ``v_cache``
    ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``block_tables
    [num_seqs, max_blocks]`` (int); ``seq_lens [num_seqs]``. Token ``t`` of sequence
    ``i`` lives in physical block ``block_tables[i][t // block_size]`` at offset
    ``t % block_size``. Query head ``h`` attends over KV head
    ``h // (num_heads // num_kv_heads)`` (grouped-query attention).

    Returns ``softmax(q . K^T / sqrt(head_dim)) . V`` over the first ``seq_lens[i]``
    tokens of each sequence, shape ``[num_seqs, num_heads, head_dim]``, computed in
    float32 and returned in ``q``'s dtype. Slots past ``seq_lens[i]`` hold garbage
    and must not matter; scores of any size must give a finite answer.
    """
    raise NotImplementedError("paged_decode_torch: gather through the table, then softmax")


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
        scale,
        stride_qs, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_bt,
        stride_os, stride_oh,
        GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        """One program per (sequence, query head): the grid is ``(num_seqs, num_heads)``.

        Writes ``out[seq, head, :]`` = that head's decode attention, exactly what
        ``paged_decode_torch`` computes, in ``out``'s dtype. Contract:

        - K/V are read through the block table, one logical block at a time, and never
          past ``seq_len`` (those slots hold poison); the full score row is never
          materialised: keep a running max, a running sum and an fp32 accumulator.
        - ``GROUP`` query heads share one KV head; ``BLOCK_SIZE`` and ``HEAD_DIM`` are
          powers of two (``tl.arange`` needs them). The ``stride_*`` arguments are the
          element strides of the named tensor dimensions (q: sequence, head; caches:
          block, slot, KV head; block_tables: row; out: sequence, head).
        - A physical block id times a stride can exceed 32 bits on a large cache.
        """
        raise NotImplementedError("_paged_decode_kernel: online softmax over table-indexed blocks")

else:
    _paged_decode_kernel = None


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens):
    """Launch the Triton kernel; same inputs, output and dtype as ``paged_decode_torch``.

    Exactly one launch of ``_paged_decode_kernel``, grid ``(num_seqs, num_heads)``; no
    torch fallback. Raises RuntimeError when triton is missing, and ValueError naming
    the parameter when ``block_size`` is not a power of two, when ``head_dim`` is not
    a power of two or differs from the cache's, when ``num_heads`` is not a multiple
    of ``num_kv_heads``, or when a sequence length is outside
    ``[1, block_tables.shape[1] * block_size]``.
    """
    raise NotImplementedError("paged_decode_attention: validate, then launch the grid")


def decode_bytes_moved(
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype_bytes: int = 2,
    index_bytes: int = 4,
) -> int:
    """The least traffic, in bytes, one decode step must move to and from GPU memory.

    Counts: K and V of every cached token, once (``dtype_bytes`` per value, KV heads
    only); q read and the output written (query heads); one block-table entry per
    logical block each sequence uses (a partly filled block counts) and one length
    per sequence (``index_bytes`` each). Integer arithmetic.

    Raises ValueError naming ``seq_lens`` when it is empty or holds a length < 1, and
    naming any other parameter that is < 1.
    """
    raise NotImplementedError("decode_bytes_moved: count the bytes a decode step must move")


def bandwidth_fraction(bytes_moved: int, seconds: float, peak_bytes_per_s: float) -> float:
    """Achieved bandwidth (bytes / seconds) as a fraction of the card's peak.

    Raises ValueError naming ``seconds`` or ``peak_bytes_per_s`` when it is <= 0.
    """
    raise NotImplementedError("bandwidth_fraction: bytes / time / peak")


def benchmark(
    num_seqs: int = 64, seq_len: int = 2048, num_heads: int = 32, num_kv_heads: int = 8,
    head_dim: int = 128, block_size: int = 16, iters: int = 50,
    peak_bytes_per_s: float | None = None,
) -> dict[str, float]:
    """Time the kernel on a CUDA device (fp16) and report achieved bandwidth."""
    if triton is None or not torch.cuda.is_available():
        raise RuntimeError("benchmark needs a CUDA device with torch and triton")
    seq_lens = [seq_len] * num_seqs
    inputs = make_paged_inputs(seq_lens, num_heads, num_kv_heads, head_dim, block_size,
                               dtype=torch.float16, device="cuda")
    ref = paged_decode_torch(*inputs)
    out = paged_decode_attention(*inputs)
    max_err = (out.float() - ref.float()).abs().max().item()
    for _ in range(5):
        paged_decode_attention(*inputs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        paged_decode_attention(*inputs)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / iters
    moved = decode_bytes_moved(seq_lens, num_heads, num_kv_heads, head_dim, block_size)
    peak = peak_bytes_per_s or peak_bandwidth_for(torch.cuda.get_device_name())
    return {
        "max_abs_err": max_err,
        "seconds": seconds,
        "bytes_moved": moved,
        "achieved_bytes_per_s": moved / seconds,
        "fraction_of_peak": bandwidth_fraction(moved, seconds, peak),
    }


def main() -> None:
    seq_lens = [130, 17, 1]
    inputs = make_paged_inputs(seq_lens, num_heads=2, num_kv_heads=1, head_dim=16, block_size=16)
    ref = paged_decode_torch(*inputs)
    out = paged_decode_attention(*inputs)
    tables = inputs[3]
    print(f"seq_len={seq_lens[0]} block_size=16 -> {-(-seq_lens[0] // 16)} logical blocks, "
          f"physical ids = {tables[0].tolist()}")
    print(f"paged triton vs torch reference: max|diff| = {(out - ref).abs().max().item():.2e}")
    if torch.cuda.is_available():
        print(benchmark())


if __name__ == "__main__":
    main()
