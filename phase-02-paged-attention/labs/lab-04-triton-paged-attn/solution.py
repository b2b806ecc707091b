"""Lab 02-04 — decode attention in Triton, K/V gathered through a block table (reference).

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
    """Reference decode attention; returns ``[num_seqs, num_heads, head_dim]`` in q's dtype.

    Computes in float32: for each sequence, rows ``block_tables[i][t // bs] * bs
    + t % bs`` for ``t < seq_lens[i]``, then softmax(q.K / sqrt(d)).V per head.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    k_rows = k_cache.reshape(num_blocks * block_size, num_kv_heads, head_dim).float()
    v_rows = v_cache.reshape(num_blocks * block_size, num_kv_heads, head_dim).float()
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=torch.float32, device=q.device)
    for i in range(num_seqs):
        n = int(seq_lens[i])
        t = torch.arange(n, device=q.device)
        slots = block_tables[i].long()[t // block_size] * block_size + t % block_size
        k = k_rows[slots].repeat_interleave(group, dim=1)  # [n, num_heads, d]
        v = v_rows[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].float(), k) / math.sqrt(head_dim)
        out[i] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out.to(q.dtype)


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
        seq = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        seq_len = tl.load(seq_lens_ptr + seq)
        offs_t = tl.arange(0, BLOCK_SIZE)
        offs_d = tl.arange(0, HEAD_DIM)

        q = tl.load(q_ptr + seq * stride_qs + head * stride_qh + offs_d).to(tl.float32)
        m = -float("inf")
        denom = 0.0
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)

        for logical in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
            physical = tl.load(block_tables_ptr + seq * stride_bt + logical).to(tl.int64)
            valid = logical * BLOCK_SIZE + offs_t < seq_len
            rows = physical * stride_kb + offs_t[:, None] * stride_kt + kv_head * stride_kh
            k = tl.load(k_cache_ptr + rows + offs_d[None, :], mask=valid[:, None], other=0.0)
            scores = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
            scores = tl.where(valid, scores, float("-inf"))
            m_new = tl.maximum(tl.max(scores, 0), m)
            rescale = tl.exp(m - m_new)
            p = tl.exp(scores - m_new)
            v = tl.load(v_cache_ptr + rows + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * rescale + tl.sum(p[:, None] * v.to(tl.float32), 0)
            denom = denom * rescale + tl.sum(p, 0)
            m = m_new

        out = acc / denom
        tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d,
                 out.to(out_ptr.dtype.element_ty))

else:
    _paged_decode_kernel = None


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens):
    """Launch the Triton kernel; same contract as ``paged_decode_torch``.

    Raises ValueError when ``block_size`` or ``head_dim`` is not a power of two,
    when the heads do not divide evenly, or when a sequence length is outside
    ``[1, block_tables.shape[1] * block_size]``.
    """
    if triton is None:
        raise RuntimeError("paged_decode_attention needs torch and triton (pip install -e '.[triton]')")
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kv_dim = k_cache.shape
    if not _is_power_of_two(block_size):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if not _is_power_of_two(head_dim) or kv_dim != head_dim:
        raise ValueError(f"head_dim must be a power of two matching the cache, got {head_dim}/{kv_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    lens = [int(s) for s in seq_lens.tolist()]
    limit = block_tables.shape[1] * block_size
    if min(lens) < 1 or max(lens) > limit:
        raise ValueError(f"seq_lens must be in [1, {limit}], got {lens}")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_tables, seq_lens = block_tables.contiguous(), seq_lens.contiguous()
    out = torch.empty_like(q)
    _paged_decode_kernel[(num_seqs, num_heads)](
        q, k_cache, v_cache, block_tables, seq_lens, out,
        1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
    )
    return out


def decode_bytes_moved(
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype_bytes: int = 2,
    index_bytes: int = 4,
) -> int:
    """The least traffic one decode step must move to and from GPU memory.

    K and V of every cached token once (``2 * sum(seq_lens) * num_kv_heads *
    head_dim * dtype_bytes``), q read and out written (``2 * num_seqs *
    num_heads * head_dim * dtype_bytes``), one block-table entry per logical
    block and one length per sequence (``index_bytes`` each).
    """
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError("seq_lens must be a non-empty list of lengths >= 1")
    for name, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("block_size", block_size),
                        ("dtype_bytes", dtype_bytes), ("index_bytes", index_bytes)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    kv = 2 * sum(seq_lens) * num_kv_heads * head_dim * dtype_bytes
    q_and_out = 2 * len(seq_lens) * num_heads * head_dim * dtype_bytes
    tables = sum(-(-s // block_size) for s in seq_lens) * index_bytes
    lens = len(seq_lens) * index_bytes
    return kv + q_and_out + tables + lens


def bandwidth_fraction(bytes_moved: int, seconds: float, peak_bytes_per_s: float) -> float:
    """Achieved bandwidth (bytes / seconds) as a fraction of the card's peak."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    if peak_bytes_per_s <= 0:
        raise ValueError(f"peak_bytes_per_s must be > 0, got {peak_bytes_per_s}")
    return bytes_moved / seconds / peak_bytes_per_s


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
