"""Lab 04-02 — the attention backend selector, reimplemented from the pin (reference solution).

vLLM ships several attention kernels for NVIDIA GPUs (FlashAttention,
FlashInfer, a Triton kernel, FlexAttention, and a family of MLA kernels for
DeepSeek-style models). Every ``Attention`` layer asks the platform for one
when it is built. On CUDA the platform answers in one of two ways:

* **explicit** (``attention_backend="FLASHINFER"``): validate that one
  backend; if anything is wrong, raise ``ValueError`` with the reasons. There
  is no fallback: you asked for it, so you get an error, not a surprise.
* **auto** (``attention_backend`` unset or ``"auto"``): walk the priority list
  for this GPU generation, validate every candidate, keep the valid ones, use
  the first. If none is valid, raise with every candidate's reasons.

The CPU platform is different again: it logs that an explicit choice is
ignored and always uses ``CPU_ATTN``.

Validation is a list of human-readable reasons, built in a fixed order from
what each backend class declares: the model dtypes it takes, its head sizes,
its KV-cache dtypes, the kernel block sizes, whether it is an MLA and/or a
sparse backend, and which compute capabilities it runs on. ``BACKENDS``
transcribes those declarations at the pin, one comment per value pointing at
its line.

What you write: ``backend_priorities``, ``validate_configuration`` and
``select_backend``. Given (identical in starter.py): ``BackendSpec``,
``AttnConfig``, ``BACKENDS``, ``check_capability``, ``is_quantized_kv_cache``,
``config_repr`` and ``parse_backend_from_log``.

Left out on purpose (the checks upstream makes that these inputs never
trigger): attention sinks, multimodal-prefix attention, per-head quant scales,
attention types other than decoder, non-causal and batch-invariant modes,
``supports_combination`` (a per-backend hook that looks at the installed
kernels or the model's MLA dimensions; assumed to pass here), FlashAttention 4's
head sizes above 256, the hybrid-model block sizes of FlashAttention, the
``ImportError`` reason for a kernel package that is not installed, and the
``--block-size`` warning after a successful auto-selection.

upstream: vllm/platforms/cuda.py:79 _get_backend_priorities
upstream: vllm/platforms/cuda.py:258 get_valid_backends
upstream: vllm/platforms/cuda.py:293 get_attn_backend_cls
upstream: vllm/platforms/cpu.py:74 get_attn_backend_cls
upstream: vllm/v1/attention/backend.py:271 validate_configuration
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Model dtypes, as torch spells them without the "torch." prefix.
DTYPES = ("float16", "bfloat16", "float32")

# The enum prints itself as "AttentionBackendEnum.NAME" (a plain Enum with no
# __str__), which is what the explicit-choice log lines and errors show.
ENUM_PREFIX = "AttentionBackendEnum."


# --------------------------------------------------------------------------
# Given (identical in starter.py)


@dataclass(frozen=True)
class BackendSpec:
    """What one backend class declares, transcribed at the pin.

    ``dtypes``: model dtypes it accepts (``supported_dtypes``).
    ``kv_cache_dtypes``: KV-cache dtypes it accepts (``supported_kv_cache_dtypes``).
    ``kv_cache_dtypes_sm90``: extra KV-cache dtypes accepted only on compute
    capability 9.x (FlashAttention 3's fp8 cache).
    ``head_sizes``: an explicit list of head sizes; empty means "no list".
    ``head_size_multiple`` / ``head_size_min`` / ``head_size_max``: the rule of
    a ``supports_head_size`` override (``head_size_max=None``: no maximum).
    ``kernel_block_sizes``: the bases of ``get_supported_kernel_block_sizes``;
    a block size is accepted when it is a multiple of any of them (upstream
    treats a fixed size and ``MultipleOf`` alike for this check).
    ``is_mla`` / ``is_sparse``: the kind of attention it implements.
    ``min_capability`` / ``max_capability``: inclusive bounds, ``None`` for none.
    ``capability_majors``: the only major versions it runs on; empty for any.
    """

    name: str
    dtypes: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    kernel_block_sizes: tuple[int, ...]
    head_sizes: tuple[int, ...] = ()
    head_size_multiple: int = 1
    head_size_min: int = 1
    head_size_max: int | None = None
    kv_cache_dtypes_sm90: tuple[str, ...] = ()
    is_mla: bool = False
    is_sparse: bool = False
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    capability_majors: tuple[int, ...] = ()


@dataclass(frozen=True)
class AttnConfig:
    """The selector's inputs for one attention layer.

    ``head_size``: the per-head dimension (>= 1; MLA models pass their latent
    cache width, 576 for DeepSeek-V3).
    ``dtype``: the model dtype, one of ``DTYPES``.
    ``kv_cache_dtype``: ``--kv-cache-dtype``, ``"auto"`` unless set.
    ``block_size``: ``None`` unless the user set ``--block-size`` (upstream
    passes the block size to the selector only in that case).
    ``use_mla`` / ``use_sparse``: the model's attention kind.
    ``num_heads``: query heads per GPU, which only the sparse-MLA ordering on
    10.x looks at.

    Raises ``ValueError`` naming the field for a value out of range.
    """

    head_size: int
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    use_mla: bool = False
    use_sparse: bool = False
    num_heads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.head_size, int) or self.head_size < 1:
            raise ValueError(f"head_size must be an int >= 1, got {self.head_size!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.kv_cache_dtype, str) or not self.kv_cache_dtype:
            raise ValueError(f"kv_cache_dtype must be a non-empty string, got {self.kv_cache_dtype!r}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block_size must be None or an int >= 1, got {self.block_size!r}")
        if self.num_heads is not None and (not isinstance(self.num_heads, int) or self.num_heads < 1):
            raise ValueError(f"num_heads must be None or an int >= 1, got {self.num_heads!r}")


_FP16_BF16 = ("float16", "bfloat16")
_KV_PLAIN = ("auto", "float16", "bfloat16")
_KV_PLAIN_FP8 = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3")
_MLA_HEADS = (320, 576)  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1197 get_supported_head_sizes

BACKENDS: dict[str, BackendSpec] = {
    # ---- ordinary attention
    "FLASH_ATTN": BackendSpec(
        name="FLASH_ATTN",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/flash_attn.py:69 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN,  # upstream: vllm/v1/attention/backends/flash_attn.py:70 supported_kv_cache_dtypes
        kv_cache_dtypes_sm90=("fp8", "fp8_e4m3"),  # upstream: vllm/v1/attention/backends/flash_attn.py:186 kv_cache_dtype
        kernel_block_sizes=(16,),  # upstream: vllm/v1/attention/backends/flash_attn.py:94 MultipleOf
        head_size_multiple=8,  # upstream: vllm/v1/attention/backends/flash_attn.py:174 head_size
        head_size_max=256,  # upstream: vllm/v1/attention/backends/flash_attn.py:176 head_size
        min_capability=(8, 0),  # upstream: vllm/v1/attention/backends/flash_attn.py:203 DeviceCapability
    ),
    "FLASHINFER": BackendSpec(
        name="FLASHINFER",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/flashinfer.py:327 supported_dtypes
        kv_cache_dtypes=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2",
                         "nvfp4"),  # upstream: vllm/v1/attention/backends/flashinfer.py:328 supported_kv_cache_dtypes
        kernel_block_sizes=(16, 32, 64),  # upstream: vllm/v1/attention/backends/flashinfer.py:339 get_supported_kernel_block_sizes
        head_sizes=(64, 128, 256, 512),  # upstream: vllm/v1/attention/backends/flashinfer.py:403 get_supported_head_sizes
        min_capability=(7, 5),  # upstream: vllm/v1/attention/backends/flashinfer.py:409 DeviceCapability
        max_capability=(12, 1),  # upstream: vllm/v1/attention/backends/flashinfer.py:409 DeviceCapability
    ),
    "TRITON_ATTN": BackendSpec(
        name="TRITON_ATTN",
        dtypes=("float16", "bfloat16", "float32"),  # upstream: vllm/v1/attention/backends/triton_attn.py:272 supported_dtypes
        kv_cache_dtypes=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2",
                         "int8_per_token_head",
                         "fp8_per_token_head"),  # upstream: vllm/v1/attention/backends/triton_attn.py:277 supported_kv_cache_dtypes
        kernel_block_sizes=(16,),  # upstream: vllm/v1/attention/backends/triton_attn.py:296 block_size
        head_size_min=32,  # upstream: vllm/v1/attention/backends/triton_attn.py:367 head_size
    ),
    "FLEX_ATTENTION": BackendSpec(
        name="FLEX_ATTENTION",
        dtypes=("float16", "bfloat16", "float32"),  # upstream: vllm/v1/attention/backends/flex_attention.py:81 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN,  # upstream: vllm/v1/attention/backends/flex_attention.py:86 supported_kv_cache_dtypes
        kernel_block_sizes=(16,),  # upstream: vllm/v1/attention/backends/flex_attention.py:144 MultipleOf
        head_sizes=(),  # upstream: vllm/v1/attention/backends/flex_attention.py:139 get_supported_head_sizes
    ),
    "TURBOQUANT": BackendSpec(
        name="TURBOQUANT",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/turboquant_attn.py:96 supported_dtypes
        kv_cache_dtypes=("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                         "turboquant_3bit_nc"),  # upstream: vllm/v1/attention/backends/turboquant_attn.py:100 supported_kv_cache_dtypes
        kernel_block_sizes=(16, 32, 64, 128),  # upstream: vllm/v1/attention/backends/turboquant_attn.py:112 get_supported_kernel_block_sizes
        head_size_min=1,  # upstream: vllm/v1/attention/backends/turboquant_attn.py:173 head_size
    ),
    # ---- MLA (head sizes from MLACommonBackend unless a backend overrides them)
    "FLASH_ATTN_MLA": BackendSpec(
        name="FLASH_ATTN_MLA",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/flashattn_mla.py:44 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN,  # upstream: vllm/v1/attention/backends/mla/flashattn_mla.py:45 supported_kv_cache_dtypes
        kernel_block_sizes=(16,),  # upstream: vllm/v1/attention/backends/mla/flashattn_mla.py:53 MultipleOf
        head_sizes=_MLA_HEADS,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1197 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1201 is_mla
        capability_majors=(9,),  # upstream: vllm/v1/attention/backends/mla/flashattn_mla.py:73 capability
    ),
    "FLASHMLA": BackendSpec(
        name="FLASHMLA",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/flashmla.py:48 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN_FP8,  # upstream: vllm/v1/attention/backends/mla/flashmla.py:49 supported_kv_cache_dtypes
        kernel_block_sizes=(64,),  # upstream: vllm/v1/attention/backends/mla/flashmla.py:58 get_supported_kernel_block_sizes
        head_sizes=_MLA_HEADS,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1197 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1201 is_mla
        capability_majors=(9, 10),  # upstream: vllm/v1/attention/backends/mla/flashmla.py:75 capability
    ),
    "FLASHINFER_MLA": BackendSpec(
        name="FLASHINFER_MLA",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla.py:39 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN_FP8,  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla.py:40 supported_kv_cache_dtypes
        kernel_block_sizes=(32, 64),  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla.py:49 get_supported_kernel_block_sizes
        head_sizes=_MLA_HEADS,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1197 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1201 is_mla
        capability_majors=(10,),  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla.py:66 capability
    ),
    "TRITON_MLA": BackendSpec(
        name="TRITON_MLA",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/triton_mla.py:37 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN_FP8,  # upstream: vllm/v1/attention/backends/mla/triton_mla.py:38 supported_kv_cache_dtypes
        kernel_block_sizes=(16,),  # upstream: vllm/v1/attention/backends/mla/triton_mla.py:58 block_size
        head_sizes=(),  # upstream: vllm/v1/attention/backends/mla/triton_mla.py:47 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1201 is_mla
    ),
    "CUTLASS_MLA": BackendSpec(
        name="CUTLASS_MLA",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/cutlass_mla.py:39 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN_FP8,  # upstream: vllm/v1/attention/backends/mla/cutlass_mla.py:40 supported_kv_cache_dtypes
        kernel_block_sizes=(128,),  # upstream: vllm/v1/attention/backends/mla/cutlass_mla.py:49 get_supported_kernel_block_sizes
        head_sizes=_MLA_HEADS,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1197 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1201 is_mla
        capability_majors=(10,),  # upstream: vllm/v1/attention/backends/mla/cutlass_mla.py:66 capability
    ),
    "TOKENSPEED_MLA": BackendSpec(
        name="TOKENSPEED_MLA",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/tokenspeed_mla.py:60 supported_dtypes
        kv_cache_dtypes=("fp8", "fp8_e4m3"),  # upstream: vllm/v1/attention/backends/mla/tokenspeed_mla.py:61 supported_kv_cache_dtypes
        kernel_block_sizes=(32, 64),  # upstream: vllm/v1/attention/backends/mla/tokenspeed_mla.py:67 get_supported_kernel_block_sizes
        head_sizes=_MLA_HEADS,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1197 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/model_executor/layers/attention/mla_attention.py:1201 is_mla
        capability_majors=(10,),  # upstream: vllm/v1/attention/backends/mla/tokenspeed_mla.py:84 capability
    ),
    "FLASHMLA_SPARSE": BackendSpec(
        name="FLASHMLA_SPARSE",
        dtypes=("bfloat16",),  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:94 supported_dtypes
        kv_cache_dtypes=("auto", "bfloat16", "fp8_ds_mla",
                         "fp8"),  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:95 supported_kv_cache_dtypes
        kernel_block_sizes=(64,),  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:103 get_supported_kernel_block_sizes
        head_sizes=(576,),  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:119 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:127 is_mla
        is_sparse=True,  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:131 is_sparse
        capability_majors=(9, 10),  # upstream: vllm/v1/attention/backends/mla/flashmla_sparse.py:136 capability
    ),
    "FLASHINFER_MLA_SPARSE": BackendSpec(
        name="FLASHINFER_MLA_SPARSE",
        dtypes=_FP16_BF16,  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:62 supported_dtypes
        kv_cache_dtypes=_KV_PLAIN_FP8,  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:63 supported_kv_cache_dtypes
        kernel_block_sizes=(32, 64),  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:72 get_supported_kernel_block_sizes
        head_sizes=(576,),  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:88 get_supported_head_sizes
        is_mla=True,  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:92 is_mla
        is_sparse=True,  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:96 is_sparse
        capability_majors=(10,),  # upstream: vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py:102 capability
    ),
}


def check_capability(capability) -> tuple[int, int]:
    """``capability`` as a ``(major, minor)`` pair of ints, e.g. ``(9, 0)`` for an H100.

    Raises ``ValueError`` naming ``capability`` for anything else (negative
    parts, a minor above 9, the wrong length, floats like ``9.0``).
    """
    ok = (isinstance(capability, tuple) and len(capability) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in capability)
          and capability[0] >= 0 and 0 <= capability[1] <= 9)
    if not ok:
        raise ValueError(f"capability must be a (major, minor) tuple of ints with minor in 0..9, "
                         f"e.g. (9, 0), got {capability!r}")
    return capability


def config_repr(cfg: AttnConfig) -> str:
    """``AttentionSelectorConfig.__repr__`` for ``cfg``, as it appears in the
    "No valid attention backend" error (the fields this lab leaves out are
    shown at their defaults).

    upstream: vllm/v1/attention/selector.py:35 __repr__
    """
    kv = cfg.kv_cache_dtype
    return (f"AttentionSelectorConfig(head_size={cfg.head_size}, dtype=torch.{cfg.dtype}, "
            f"kv_cache_dtype={kv}, block_size={cfg.block_size}, use_mla={cfg.use_mla}, "
            f"has_sink=False, use_sparse={cfg.use_sparse}, use_mm_prefix=False, "
            f"use_per_head_quant_scales=False, attn_type=AttentionType.DECODER, "
            f"use_non_causal=False, use_batch_invariant=False)")


_AUTO_LINE = re.compile(r"Using (\w+) attention backend out of potential backends: ")
_EXPLICIT_LINE = re.compile(r"Using AttentionBackendEnum\.(\w+) backend\.$")
_CPU_LINE = re.compile(r"Cannot use AttentionBackendEnum\.(\w+) backend on CPU\.$")


def parse_backend_from_log(line: str) -> str | None:
    """The backend a selector log line says is in use, or ``None`` for any other line.

    Reads the three lines the selector logs: auto ("Using NAME attention
    backend out of potential backends: [...]."), explicit ("Using
    AttentionBackendEnum.NAME backend.") and CPU ("Cannot use
    AttentionBackendEnum.NAME backend on CPU.", which means ``CPU_ATTN``).
    Leading text (a logger's timestamp and file prefix) is allowed.
    """
    m = _AUTO_LINE.search(line)
    if m:
        return m.group(1)
    m = _EXPLICIT_LINE.search(line)
    if m:
        return m.group(1)
    if _CPU_LINE.search(line):
        return "CPU_ATTN"
    return None


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """True for the KV-cache dtypes upstream counts as quantized: ``fp8*``,
    ``*per_token_head`` and ``nvfp4``.

    upstream: vllm/utils/torch_utils.py:76 is_quantized_kv_cache
    """
    return (kv_cache_dtype.startswith("fp8") or kv_cache_dtype.endswith("per_token_head")
            or kv_cache_dtype == "nvfp4")


# --------------------------------------------------------------------------
# What the learner writes


def backend_priorities(use_mla: bool, capability: tuple[int, int], num_heads: int | None = None,
                       kv_cache_dtype: str | None = None) -> list[str]:
    """The CUDA platform's priority list for a GPU generation, highest first.

    Transcribed from ``_get_backend_priorities``: ordinary attention has one
    list for compute capability 10.x (Blackwell B200/GB200 class) and one for
    every other GPU; MLA likewise, and on 10.x its two sparse MLA backends come
    last in an order that depends on the KV-cache dtype (a quantized cache puts
    FLASHINFER_MLA_SPARSE first) and, for an unquantized cache, on
    ``num_heads`` (16 or fewer puts FLASHINFER_MLA_SPARSE first).

    Raises ``ValueError`` naming ``capability`` for a malformed capability.

    upstream: vllm/platforms/cuda.py:79 _get_backend_priorities
    """
    major, _ = check_capability(capability)
    if use_mla:
        if major == 10:
            if kv_cache_dtype is not None and is_quantized_kv_cache(kv_cache_dtype):
                sparse = ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
            elif num_heads is not None and num_heads <= 16:
                # FlashMLA pads small head counts; FlashInfer does not.
                sparse = ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
            else:
                sparse = ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"]
            return ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA",
                    "FLASHMLA", "TRITON_MLA", *sparse]
        return ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE"]
    if major == 10:
        return ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
    return ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]


def validate_configuration(spec: BackendSpec, cfg: AttnConfig, capability: tuple[int, int]) -> list[str]:
    """Every reason ``spec`` cannot serve ``cfg`` on ``capability``; ``[]`` means valid.

    The strings and their order are upstream's: head size, dtype, KV-cache
    dtype, block size, MLA kind, sparse kind, compute capability. All reasons
    are collected; the check does not stop at the first.

    Raises ``ValueError`` naming ``capability`` for a malformed capability.

    upstream: vllm/v1/attention/backend.py:271 validate_configuration
    """
    major, _ = check_capability(capability)
    reasons: list[str] = []

    h = cfg.head_size
    head_ok = (h % spec.head_size_multiple == 0 and h >= spec.head_size_min
               and (spec.head_size_max is None or h <= spec.head_size_max)
               and (not spec.head_sizes or h in spec.head_sizes))
    if not head_ok:
        reasons.append("head_size not supported")

    if cfg.dtype not in spec.dtypes:
        reasons.append("dtype not supported")

    kv_ok = cfg.kv_cache_dtype in spec.kv_cache_dtypes or (
        major == 9 and cfg.kv_cache_dtype in spec.kv_cache_dtypes_sm90)
    if not kv_ok:
        reasons.append("kv_cache_dtype not supported")

    # Only a block size the user chose is checked; a multiple of any kernel
    # size is enough (the engine splits a large block into kernel blocks).
    if cfg.block_size is not None and not any(cfg.block_size % s == 0 for s in spec.kernel_block_sizes):
        reasons.append("block_size not supported")

    # A mismatch in either direction is a reason, worded from the model's side.
    if cfg.use_mla != spec.is_mla:
        reasons.append("MLA not supported" if cfg.use_mla else "non-MLA not supported")
    if cfg.use_sparse != spec.is_sparse:
        reasons.append("sparse not supported" if cfg.use_sparse else "non-sparse not supported")

    # Capabilities compare as (major, minor) tuples, like DeviceCapability.
    cap_ok = ((spec.min_capability is None or capability >= spec.min_capability)
              and (spec.max_capability is None or capability <= spec.max_capability)
              and (not spec.capability_majors or major in spec.capability_majors))
    if not cap_ok:
        reasons.append("compute capability not supported")
    return reasons


def select_backend(cfg: AttnConfig, capability: tuple[int, int], selected: str | None = None,
                   platform: str = "cuda") -> tuple[str, str]:
    """The backend vLLM uses for ``cfg`` and the INFO line it logs, as ``(name, line)``.

    ``selected`` is ``attention_backend``: ``None`` or ``"auto"`` (any case)
    for automatic selection, else a backend name (upper-cased first, as
    ``AttentionConfig`` does).

    * cuda, explicit: valid → ``"Using AttentionBackendEnum.NAME backend."``;
      invalid → ``ValueError("Selected backend AttentionBackendEnum.NAME is not
      valid for this configuration. Reason: [...]")``, never a fallback.
    * cuda, auto: validate every backend of ``backend_priorities`` in order;
      the first valid one wins, logged as ``"Using NAME attention backend out
      of potential backends: ['A', 'B']."`` listing every valid one; none
      valid → ``ValueError("No valid attention backend found for cuda with
      <config_repr>. Reasons: {NAME: [r1, r2], ...}.")``.
    * cpu: an explicit choice other than ``CPU_ATTN`` is logged as ``"Cannot
      use AttentionBackendEnum.NAME backend on CPU."`` and ignored; MLA and
      sparse models raise ``NotImplementedError`` (after that line); the
      result is ``CPU_ATTN``, with ``""`` as the line when nothing is logged.

    Raises ``ValueError`` naming ``platform`` (not "cuda"/"cpu"), ``selected``
    (not a known backend name) or ``capability`` (malformed; checked on cuda).

    upstream: vllm/platforms/cuda.py:293 get_attn_backend_cls
    upstream: vllm/platforms/cpu.py:74 get_attn_backend_cls
    """
    if platform not in ("cuda", "cpu"):
        raise ValueError(f"platform must be 'cuda' or 'cpu', got {platform!r}")
    if selected is not None:
        if not isinstance(selected, str):
            raise ValueError(f"selected must be None or a backend name, got {selected!r}")
        # AttentionConfig's validator: "auto" means None, names are upper-cased.
        selected = None if selected.lower() == "auto" else selected.upper()
    known = set(BACKENDS) | ({"CPU_ATTN"} if platform == "cpu" else set())
    if selected is not None and selected not in known:
        raise ValueError(f"selected must be one of {sorted(known)} or 'auto', got {selected!r}")

    if platform == "cpu":
        # Ignored, not rejected: the CPU platform has one backend.
        line = ""
        if selected is not None and selected != "CPU_ATTN":
            line = f"Cannot use {ENUM_PREFIX}{selected} backend on CPU."
        if cfg.use_mla:
            raise NotImplementedError("MLA is not supported on CPU.")
        if cfg.use_sparse:
            raise NotImplementedError("Sparse Attention is not supported on CPU.")
        return "CPU_ATTN", line

    # (capability is checked by validate_configuration and backend_priorities)
    if selected is not None:
        reasons = validate_configuration(BACKENDS[selected], cfg, capability)
        if reasons:
            raise ValueError(f"Selected backend {ENUM_PREFIX}{selected} is not valid for "
                             f"this configuration. Reason: {reasons}")
        return selected, f"Using {ENUM_PREFIX}{selected} backend."

    valid: list[str] = []
    invalid: dict[str, list[str]] = {}
    for name in backend_priorities(cfg.use_mla, capability, cfg.num_heads, cfg.kv_cache_dtype):
        reasons = validate_configuration(BACKENDS[name], cfg, capability)
        if reasons:
            invalid[name] = reasons
        else:
            valid.append(name)
    if not valid:
        reasons_str = "{" + ", ".join(f"{n}: [{', '.join(r)}]" for n, r in invalid.items()) + "}"
        raise ValueError(f"No valid attention backend found for cuda with {config_repr(cfg)}. "
                         f"Reasons: {reasons_str}.")
    potential = "[" + ", ".join(f"'{n}'" for n in valid) + "]"
    return valid[0], f"Using {valid[0]} attention backend out of potential backends: {potential}."


# The GPUs of the README's table, with their compute capability.
GPUS = {"T4": (7, 5), "A100": (8, 0), "L4": (8, 9), "H100": (9, 0), "H200": (9, 0), "B200": (10, 0)}


def main() -> None:
    cases = [("bf16, head 64", AttnConfig(64)), ("float32, head 64", AttnConfig(64, "float32")),
             ("MLA bf16, head 576", AttnConfig(576, use_mla=True))]
    for gpu, cap in GPUS.items():
        for label, cfg in cases:
            try:
                name, _ = select_backend(cfg, cap)
            except ValueError:
                name = "(none)"
            print(f"{gpu:5s} {label:20s} -> {name}")
    print(select_backend(AttnConfig(64), GPUS["L4"])[1])


if __name__ == "__main__":
    main()
