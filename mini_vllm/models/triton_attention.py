"""The ``TRITON_DECODE`` backend: Phase 02's Triton decode kernel behind the backend interface.

Decode rows (requests with exactly one query row this step) go to one Triton
program per (request, query head). It walks the request's block table one
block at a time, loads the physical block's K and V tile, and keeps an online
softmax (max, sum, float32 accumulator), so no score row and no gathered copy
of the keys ever exists. Prefill chunks in the same step take the torch
gather path (``paged_attention_torch``), as vLLM's split backends send decodes
and prefills to different kernels.

Triton is optional: where it cannot be imported the backend reports upstream's
own reason string, ``"ImportError"``, and ``get_attn_backend`` refuses it. The
kernel needs a CUDA tensor (or ``TRITON_INTERPRET=1`` before triton is first
imported, which runs it on the CPU, slowly).

upstream: vllm/v1/attention/ops/triton_decode_attention.py:60 _fwd_kernel_stage1
upstream: vllm/platforms/cuda.py:311 invalid_reasons
"""
from __future__ import annotations

import numpy as np

from mini_vllm.models.attention_backends import AttentionBackend

try:
    import torch
    import triton
    import triton.language as tl
except ImportError:  # the backend then declares itself invalid ("ImportError")
    triton = tl = None


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


if triton is not None:

    @triton.jit
    def _decode_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, seq_lens_ptr, out_ptr, scale,
                       stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_bt,
                       GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
        row = tl.program_id(0)  # one decode request
        head = tl.program_id(1)
        kv_head = head // GROUP
        seq_len = tl.load(seq_lens_ptr + row)
        offs_t = tl.arange(0, BLOCK_SIZE)
        offs_d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + row * stride_qt + head * stride_qh + offs_d).to(tl.float32)
        m = -float("inf")
        denom = 0.0
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        for logical in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
            physical = tl.load(tables_ptr + row * stride_bt + logical).to(tl.int64)
            valid = logical * BLOCK_SIZE + offs_t < seq_len  # never a row past seq_len
            rows = physical * stride_kb + offs_t[:, None] * stride_kt + kv_head * stride_kh
            k = tl.load(k_ptr + rows + offs_d[None, :], mask=valid[:, None], other=0.0)
            scores = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], 1) * scale, -float("inf"))
            m_new = tl.maximum(tl.max(scores, 0), m)
            alpha = tl.exp(m - m_new)
            p = tl.exp(scores - m_new)
            v = tl.load(v_ptr + rows + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
            denom = denom * alpha + tl.sum(p, 0)
            m = m_new
        tl.store(out_ptr + row * stride_qt + head * stride_qh + offs_d, acc / denom)


class TritonDecodeBackend(AttentionBackend):
    """Decodes through the Triton kernel, prefill chunks through the torch gather."""

    name = "TRITON_DECODE"
    platforms = ("cuda",)  # a Triton kernel needs CUDA tensors

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return _power_of_two(head_size)  # tl.arange needs a power of two

    @classmethod
    def supports_block_size(cls, block_size: int) -> bool:
        return _power_of_two(block_size)

    @classmethod
    def validate_configuration(cls, head_size, dtype, block_size, platform="numpy", kv_cache_dtype="auto"):
        if triton is None:
            return ["ImportError"]  # what upstream reports when a backend's import fails
        return super().validate_configuration(head_size, dtype, block_size, platform, kv_cache_dtype)

    def forward(self, q, k_cache, v_cache, model_input, scale):
        from mini_vllm.models.attention import gathered_rows
        from mini_vllm.models.attention_backends import _block_rows_read
        from mini_vllm.models.torch_backend import paged_attention_torch

        qsl = model_input.query_start_loc
        is_decode = np.diff(qsl) == 1
        out = torch.empty_like(q)
        if (~is_decode).any():
            rest = _subset(model_input, np.flatnonzero(~is_decode))
            self.kv_rows_read += gathered_rows(rest, group_size=None)
            rest_rows = torch.from_numpy(_rows_of(qsl, np.flatnonzero(~is_decode))).to(q.device)
            out[rest_rows] = paged_attention_torch(q[rest_rows], k_cache, v_cache, rest, scale)
        if is_decode.any():
            reqs = np.flatnonzero(is_decode)
            dec = _subset(model_input, reqs)
            self.kv_rows_read += _block_rows_read(dec)
            rows = torch.from_numpy(qsl[reqs]).to(q.device)
            qd = q[rows].contiguous()
            res = torch.empty_like(qd)
            tables = torch.from_numpy(dec.block_tables.astype(np.int32)).to(q.device)
            lens = torch.from_numpy(dec.seq_lens.astype(np.int32)).to(q.device)
            num_heads, head_dim = q.shape[1], q.shape[2]
            _decode_kernel[(len(reqs), num_heads)](
                qd, k_cache, v_cache, tables, lens, res, scale,
                qd.stride(0), qd.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                tables.stride(0), GROUP=num_heads // k_cache.shape[2],
                BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim)
            out[rows] = res
        return out


def _rows_of(qsl: np.ndarray, reqs: np.ndarray) -> np.ndarray:
    return np.concatenate([np.arange(qsl[r], qsl[r + 1]) for r in reqs])


def _subset(model_input, reqs: np.ndarray):
    """The metadata of some requests only, their rows renumbered from 0 (a new ModelInput)."""
    from mini_vllm.model_input import ModelInput

    qsl = model_input.query_start_loc
    rows = _rows_of(qsl, reqs)
    counts = qsl[reqs + 1] - qsl[reqs]
    new_qsl = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return ModelInput(token_ids=model_input.token_ids[rows], positions=model_input.positions[rows],
                      query_start_loc=new_qsl, seq_lens=model_input.seq_lens[reqs],
                      block_tables=model_input.block_tables[reqs],
                      slot_mapping=model_input.slot_mapping[rows],
                      logits_indices=new_qsl[1:] - 1, block_size=model_input.block_size)
