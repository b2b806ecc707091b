"""Attention backends: one interface, several kernels, and vLLM's rule for choosing one.

Everything below the attention layer used to be one function,
``attention.paged_attention``. This module puts a seam there. A backend is a
class that declares what it supports (dtypes, head sizes, block sizes, the
platforms it runs on: ``numpy``, ``torch`` on the CPU, ``cuda``) and implements one method::

    forward(q, k_cache, v_cache, model_input, scale) -> out      # [T, heads, head_dim]

``q`` holds every query row of the step; the caches are one layer's
``[num_blocks, block_size, kv_heads, head_dim]`` and already hold this step's
K/V (the model writes first, as vLLM's layer calls ``unified_kv_cache_update``
before the attention op); ``model_input`` is the step's metadata, this
engine's ``CommonAttentionMetadata``. A backend reads the cache and never
writes it.

The backends, all exact (they differ in the order of the additions, so in the
last bits of float32, never in the math):

==================  =========  =======================================================
name                platforms  how it reads the cache
==================  =========  =======================================================
``NUMPY_GATHER``    numpy      gathers each group's keys into a padded array, one
                               masked softmax (``attention.paged_attention``; default)
``NUMPY_FLASH``     numpy      walks each block table one block at a time with the
                               online-softmax state; no gather, no padding
``NUMPY_SPLIT_KV``  numpy      cuts each request's blocks into partitions, attends each,
                               merges the partial results by log-sum-exp
``TORCH_GATHER``    torch,     the torch model's gather and masked softmax (default)
                    cuda
``TORCH_SDPA``      torch,     the same gather, then
                    cuda       ``torch.nn.functional.scaled_dot_product_attention``
``TRITON_DECODE``   cuda       decode rows through a Triton kernel that walks the block
                               table (``triton_attention.py``); prefill chunks gathered
==================  =========  =======================================================

Choosing follows vLLM's two paths (``get_attn_backend``): an explicit choice is
validated and either used or refused with every reason, **never** replaced by
another backend; "auto" walks the platform's priority list and takes the first
backend with no reasons against it.

Each backend instance counts ``kv_rows_read``: K/V rows (one token's key and
value in one layer) it brought in from the cache since the counter was reset,
counted per block or per padded row, the way the kernel actually reads them.

upstream: vllm/v1/attention/backend.py:55 AttentionBackend
upstream: vllm/v1/attention/backend.py:271 AttentionBackend.validate_configuration
upstream: vllm/v1/attention/backends/registry.py:34 AttentionBackendEnum
upstream: vllm/v1/attention/selector.py:52 get_attn_backend
upstream: vllm/platforms/cuda.py:293 CudaPlatformBase.get_attn_backend_cls
upstream: vllm/v1/attention/ops/merge_attn_states.py:9 merge_attn_states
"""
from __future__ import annotations

import enum
import importlib
from typing import ClassVar

import numpy as np

from mini_vllm.model_input import ModelInput
from mini_vllm.models.attention import gathered_rows, paged_attention

PLATFORMS = ("numpy", "torch", "cuda")  # numpy on the CPU; torch on the CPU; torch on a GPU


class AttentionBackend:
    """The declarations and the kernel of one attention implementation.

    Subclasses set the class attributes and override ``forward``; the engine
    validates the class, then makes one instance per model (the instance only
    carries the ``kv_rows_read`` counter). The ``supports_*`` defaults accept
    everything, as upstream's do; a backend narrows only what it must.
    """

    name: ClassVar[str] = ""
    platforms: ClassVar[tuple[str, ...]] = ("numpy",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)

    def __init__(self) -> None:
        self.kv_rows_read = 0

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return True

    @classmethod
    def supports_block_size(cls, block_size: int) -> bool:
        return True

    @classmethod
    def validate_configuration(cls, head_size: int, dtype: str, block_size: int,
                               platform: str = "numpy", kv_cache_dtype: str = "auto") -> list[str]:
        """Every reason this backend cannot serve the configuration; [] when it can.

        The first four strings are upstream's, word for word and in its order;
        the platform check is this engine's stand-in for upstream's split of
        backends between platforms.
        """
        reasons = []
        if not cls.supports_head_size(head_size):
            reasons.append("head_size not supported")
        if dtype not in cls.supported_dtypes:
            reasons.append("dtype not supported")
        if kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            reasons.append("kv_cache_dtype not supported")
        if not cls.supports_block_size(block_size):
            reasons.append("block_size not supported")
        if platform not in cls.platforms:
            reasons.append(f"platform {platform} not supported")
        return reasons

    def forward(self, q, k_cache, v_cache, model_input: ModelInput, scale: float):
        raise NotImplementedError(f"{type(self).__name__}.forward")


# ----------------------------------------------------------------- numpy backends
def _block_rows_read(model_input: ModelInput) -> int:
    """Rows a block-at-a-time kernel reads: ceil(seq_len / block_size) whole blocks each."""
    bs = model_input.block_size
    has_rows = np.diff(model_input.query_start_loc) > 0
    return int((-(-model_input.seq_lens[has_rows] // bs) * bs).sum())


class NumpyGatherBackend(AttentionBackend):
    """Phase 02's kernel, unchanged: gather into a padded array, one masked softmax."""

    name = "NUMPY_GATHER"
    supported_dtypes = ("float32", "float64")
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3")  # gather_kv widens FP8 rows to float32

    def forward(self, q, k_cache, v_cache, model_input, scale):
        self.kv_rows_read += gathered_rows(model_input)
        return paged_attention(q, k_cache, v_cache, model_input, scale)


def _request_query(q: np.ndarray, model_input: ModelInput, b: int, kv_heads: int):
    """Request b's rows grouped by KV head: [kv_heads, group, m, head_dim], and their positions."""
    r0, r1 = model_input.query_start_loc[b], model_input.query_start_loc[b + 1]
    m, num_heads, head_dim = r1 - r0, q.shape[1], q.shape[2]
    qg = q[r0:r1].reshape(m, kv_heads, num_heads // kv_heads, head_dim).transpose(1, 2, 0, 3)
    return qg, model_input.positions[r0:r1], (r0, r1)


def _ungroup(out: np.ndarray) -> np.ndarray:
    """[kv_heads, group, m, head_dim] -> [m, heads, head_dim]."""
    kv_heads, group, m, head_dim = out.shape
    return out.transpose(2, 0, 1, 3).reshape(m, kv_heads * group, head_dim)


def _block_scores(qg, k_cache, block_id, first_pos, num_keys, q_pos, scale):
    """Scores of the query rows against one block's first ``num_keys`` keys, future masked.

    qg: [kv_heads, group, m, hd] -> [kv_heads, group, m, num_keys]. Only the
    valid rows of the block are touched, so stale slots past seq_len never
    become a score (a NaN there would survive any mask).
    """
    k = k_cache[block_id, :num_keys]  # [n, kv_heads, hd]
    scores = (qg @ k.transpose(1, 2, 0)[:, None]) * np.float32(scale)
    future = first_pos + np.arange(num_keys)[None, :] > q_pos[:, None]  # [m, n]
    scores[..., future] = -np.inf
    return scores


class NumpyFlashBackend(AttentionBackend):
    """Streaming attention: one block of K/V at a time, an online softmax per query row.

    For each request, the state (running max ``m``, denominator ``l``,
    unnormalized output ``acc``) absorbs block after block of its table; when
    a block raises the max, ``l`` and ``acc`` are rescaled by ``exp(m - m')``.
    Block 0 holds key 0, which every query row may see, so after it every
    ``m`` is finite and a fully masked later block adds exactly zero. The
    causal limit is bottom-right aligned: a row at position p sees keys
    ``<= p``, so a chunk that starts mid-sequence sees its whole prefix.

    upstream: vllm/v1/attention/ops/triton_unified_attention.py:179 kernel_unified_attention
    """

    name = "NUMPY_FLASH"

    def forward(self, q, k_cache, v_cache, model_input, scale):
        bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
        out = np.empty_like(q)
        for b in range(model_input.num_reqs):
            qg, q_pos, (r0, r1) = _request_query(q, model_input, b, kv_heads)
            if r1 == r0:
                continue
            seq_len = int(model_input.seq_lens[b])
            m = np.full(qg.shape[:3], -np.inf, dtype=np.float32)
            l = np.zeros(qg.shape[:3], dtype=np.float32)  # noqa: E741  (the paper's name)
            acc = np.zeros(qg.shape, dtype=np.float32)
            for i in range(-(-seq_len // bs)):
                block_id = model_input.block_tables[b, i]
                n = min(bs, seq_len - i * bs)
                scores = _block_scores(qg, k_cache, block_id, i * bs, n, q_pos, scale)
                m_new = np.maximum(m, scores.max(axis=-1))
                alpha = np.exp(m - m_new)  # 0 on the first block (m = -inf)
                p = np.exp(scores - m_new[..., None])
                l = l * alpha + p.sum(axis=-1)  # noqa: E741
                acc = acc * alpha[..., None] + p @ v_cache[block_id, :n].transpose(1, 0, 2)[:, None]
                m = m_new
                self.kv_rows_read += bs
            out[r0:r1] = _ungroup(acc / l[..., None])
        return out


def attend_partial(scores: np.ndarray, v: np.ndarray):
    """Softmax of ``scores`` [..., m, n] over its last axis, applied to v [kv, 1, n, hd].

    Returns the *normalized* output and the log-sum-exp of each row, the pair
    ``merge_attn_states`` takes. A row with no visible key (all ``-inf``) gets
    output 0 and LSE ``-inf``, with no NaN on the way.
    """
    row_max = scores.max(axis=-1)
    safe_max = np.where(np.isfinite(row_max), row_max, np.float32(0))
    p = np.exp(scores - safe_max[..., None])
    denom = p.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.log(denom) + safe_max  # log(0) = -inf for an empty row
    out = (p @ v) / np.where(denom > 0, denom, 1)[..., None]
    return out, lse


def merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse):
    """Combine two normalized partial attentions over disjoint key sets (vLLM's merge).

    out = (e^(lse_p - M) out_p + e^(lse_s - M) out_s) / (e^(lse_p - M) + e^(lse_s - M)),
    M = max(lse_p, lse_s); lse = M + log(sum). Rows empty on both sides stay 0 / -inf.

    upstream: vllm/v1/attention/ops/triton_merge_attn_states.py:58 merge_attn_states_kernel
    """
    big = np.maximum(prefix_lse, suffix_lse)
    safe = np.where(np.isfinite(big), big, np.float32(0))
    wp, ws = np.exp(prefix_lse - safe), np.exp(suffix_lse - safe)
    total = wp + ws
    with np.errstate(divide="ignore"):
        lse = np.log(total) + safe
    total = np.where(total > 0, total, 1)
    out = (prefix_out * (wp / total)[..., None]) + (suffix_out * (ws / total)[..., None])
    return out, lse


class NumpySplitKVBackend(AttentionBackend):
    """Flash-decoding: each request's keys in partitions of ``partition_blocks`` blocks.

    Every partition is attended on its own (a normalized output and an LSE per
    query row); the partitions are then merged left to right with
    ``merge_attn_states``. On a GPU the partitions run in parallel and a small
    reduce kernel merges them; here they run one after another, and the point
    is that the merge is exact.

    upstream: csrc/attention/attention_kernels.cuh:529 paged_attention_v2_kernel
    upstream: vllm/v1/attention/ops/triton_unified_attention.py:646 reduce_segments
    """

    name = "NUMPY_SPLIT_KV"
    partition_blocks: ClassVar[int] = 2

    def forward(self, q, k_cache, v_cache, model_input, scale):
        bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
        out = np.empty_like(q)
        step = self.partition_blocks * bs
        for b in range(model_input.num_reqs):
            qg, q_pos, (r0, r1) = _request_query(q, model_input, b, kv_heads)
            if r1 == r0:
                continue
            seq_len = int(model_input.seq_lens[b])
            acc = lse = None
            for start in range(0, seq_len, step):
                parts = []
                for i in range(start // bs, -(-min(start + step, seq_len) // bs)):
                    n = min(bs, seq_len - i * bs)
                    block_id = model_input.block_tables[b, i]
                    parts.append((_block_scores(qg, k_cache, block_id, i * bs, n, q_pos, scale),
                                  v_cache[block_id, :n]))
                    self.kv_rows_read += bs
                scores = np.concatenate([s for s, _ in parts], axis=-1)
                v = np.concatenate([v for _, v in parts]).transpose(1, 0, 2)[:, None]
                part_out, part_lse = attend_partial(scores, v)
                if acc is None:
                    acc, lse = part_out, part_lse
                else:
                    acc, lse = merge_attn_states(acc, lse, part_out, part_lse)
            out[r0:r1] = _ungroup(acc)
        return out


# ----------------------------------------------------------------- torch backends
class TorchGatherBackend(AttentionBackend):
    """The torch model's kernel: the same grouped gather and masked softmax, in torch."""

    name = "TORCH_GATHER"
    platforms = ("torch", "cuda")

    def forward(self, q, k_cache, v_cache, model_input, scale):
        from mini_vllm.models.torch_backend import paged_attention_torch

        self.kv_rows_read += gathered_rows(model_input, group_size=None)
        return paged_attention_torch(q, k_cache, v_cache, model_input, scale)


class TorchSDPABackend(AttentionBackend):
    """The torch gather, then PyTorch's fused ``scaled_dot_product_attention``.

    The mask is explicit (key position <= query position: the bottom-right
    diagonal) because SDPA's own ``is_causal`` aligns top-left, which is wrong
    for a chunk that starts mid-sequence. ``enable_gqa`` lets the kv heads be
    shared without copying them per query head.
    """

    name = "TORCH_SDPA"
    platforms = ("torch", "cuda")

    def forward(self, q, k_cache, v_cache, model_input, scale):
        from mini_vllm.models.torch_backend import paged_attention_torch

        self.kv_rows_read += gathered_rows(model_input, group_size=None)
        return paged_attention_torch(q, k_cache, v_cache, model_input, scale, sdpa=True)


# ----------------------------------------------------------------- registry and selector
class AttentionBackendEnum(enum.Enum):
    """Every backend by name; the value is its class path, imported on ``get_class()``.

    Paths, not classes, as upstream: a backend whose module needs an optional
    package (``TRITON_DECODE`` needs triton) costs nothing until it is chosen.
    """

    NUMPY_GATHER = "mini_vllm.models.attention_backends.NumpyGatherBackend"
    NUMPY_FLASH = "mini_vllm.models.attention_backends.NumpyFlashBackend"
    NUMPY_SPLIT_KV = "mini_vllm.models.attention_backends.NumpySplitKVBackend"
    TORCH_GATHER = "mini_vllm.models.attention_backends.TorchGatherBackend"
    TORCH_SDPA = "mini_vllm.models.attention_backends.TorchSDPABackend"
    TRITON_DECODE = "mini_vllm.models.triton_attention.TritonDecodeBackend"

    def get_class(self) -> type[AttentionBackend]:
        module, _, cls = self.value.rpartition(".")
        return getattr(importlib.import_module(module), cls)

    @classmethod
    def from_name(cls, name: str) -> AttentionBackendEnum:
        """Case-insensitive lookup; an unknown name lists the valid ones (as upstream's enum)."""
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"Unknown attention backend: {name!r}. Valid options are: "
                             f"auto, {', '.join(cls.__members__)}") from None


# "auto" keeps each platform's existing kernel first, so turning the feature on
# changes nothing; the streaming kernels follow in the order they were built.
PRIORITIES: dict[str, tuple[AttentionBackendEnum, ...]] = {
    "numpy": (AttentionBackendEnum.NUMPY_GATHER, AttentionBackendEnum.NUMPY_FLASH,
              AttentionBackendEnum.NUMPY_SPLIT_KV),
    "torch": (AttentionBackendEnum.TORCH_GATHER, AttentionBackendEnum.TORCH_SDPA),
    "cuda": (AttentionBackendEnum.TORCH_GATHER, AttentionBackendEnum.TORCH_SDPA,
             AttentionBackendEnum.TRITON_DECODE),
}


def get_attn_backend(head_size: int, dtype: str, block_size: int,
                     backend: str | type[AttentionBackend] | None = None,
                     platform: str = "numpy", kv_cache_dtype: str = "auto") -> type[AttentionBackend]:
    """The backend class for this configuration, by vLLM's rules.

    ``backend``: ``None`` or ``"auto"`` (walk ``PRIORITIES[platform]``), a
    registry name, or an ``AttentionBackend`` subclass (how a learner plugs in
    a kernel without editing the registry). An explicit choice that fails
    validation raises ``ValueError`` with its reasons and is never replaced.
    """
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    if backend is not None and not (isinstance(backend, str) or
                                    (isinstance(backend, type) and issubclass(backend, AttentionBackend))):
        raise ValueError(f"attention_backend must be 'auto', a backend name or an AttentionBackend "
                         f"subclass, got {backend!r}")
    if isinstance(backend, str) and backend.lower() == "auto":
        backend = None
    config = f"head_size={head_size}, dtype={dtype}, block_size={block_size}, platform={platform}"
    if kv_cache_dtype != "auto":
        config += f", kv_cache_dtype={kv_cache_dtype}"
    if backend is not None:
        cls = AttentionBackendEnum.from_name(backend).get_class() if isinstance(backend, str) else backend
        reasons = cls.validate_configuration(head_size, dtype, block_size, platform, kv_cache_dtype)
        if reasons:
            raise ValueError(f"Selected backend {cls.name or cls.__name__} is not valid for this "
                             f"configuration ({config}). Reason: {reasons}")
        return cls
    invalid = {}
    for member in PRIORITIES[platform]:
        reasons = member.get_class().validate_configuration(head_size, dtype, block_size, platform,
                                                            kv_cache_dtype)
        if not reasons:
            return member.get_class()
        invalid[member.name] = reasons
    detail = ", ".join(f"{name}: {reasons}" for name, reasons in invalid.items())
    raise ValueError(f"No valid attention backend found with {config}. Reasons: {{{detail}}}.")
