"""Lab 07-05 — who runs your FP8 GEMM? vLLM's kernel selector, rebuilt (your implementation).

An FP8 checkpoint says nothing about *which* matrix-multiply kernel will run
it. When vLLM builds an FP8 linear layer (``Fp8LinearMethod``, compressed
tensors, ModelOpt, online FP8), it describes the layer with two scale layouts
(how the activations are scaled, how the weight is scaled) and hands that
description to one selector. The selector walks a fixed, per-platform list of
kernels, best first, and returns the first one that

1. is not named in ``VLLM_DISABLED_KERNELS``,
2. says ``is_supported`` for this device (platform, compute capability,
   installed libraries, a few environment switches), and
3. says ``can_implement`` for this layer (the scale layouts).

On CUDA the list is Marlin, FlashInfer, CUTLASS, then two torch fallbacks;
on a CPU it is the two torch kernels. Because Marlin comes first and refuses
every card of capability 8.9 or newer, the list reads as a story: older cards
(no FP8 tensor cores) run FP8 checkpoints weight-only through Marlin; Ada and
Hopper run CUTLASS; Blackwell with FlashInfer installed runs FlashInfer, but
only when both scales are per tensor.

Two knobs change the walk. ``force_kernel`` is tried first and, if it cannot
run, silently dropped (a log line, no error). ``--linear-backend`` filters the
platform list down to one family first and raises if the family has no FP8
kernel on this platform.

What you write: ``capability_to_int``, ``is_supported``, ``can_implement``,
``check_kernel``, ``choose_fp8_kernel`` and ``fp8_linear_scales``.
Given (identical in starter.py): the kernel names, the scale layouts, the
table ``POSSIBLE_FP8_KERNELS``, the FP8 rows of the backend map, the reason
strings, ``Device``, ``Env``, ``FP8Config``, ``check_device`` and ``main``.

Left out on purpose: ROCm and XPU (their lists exist upstream; their
``is_supported`` methods ask about AMD and Intel hardware), the block-scaled
table that a per-group activation layout is routed to, and the CUDA-version
test hidden inside ``cutlass_scaled_mm_supports_fp8`` (assumed to be a recent
toolkit: 12.4 or newer).

upstream: vllm/model_executor/kernels/linear/__init__.py:272 _POSSIBLE_FP8_KERNELS
upstream: vllm/model_executor/kernels/linear/__init__.py:412 is_supported_and_can_implement_kernel
upstream: vllm/model_executor/kernels/linear/__init__.py:437 choose_scaled_mm_linear_kernel
upstream: vllm/model_executor/kernels/linear/scaled_mm/marlin.py:36 is_supported
upstream: vllm/model_executor/kernels/linear/scaled_mm/flashinfer.py:39 is_supported
upstream: vllm/model_executor/layers/quantization/fp8.py:307 kFp8StaticTensorSym
"""
from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------
# Given (identical in starter.py)

# Kernel names: the upstream class names, so that a log line can be matched.
MARLIN = "MarlinFP8ScaledMMLinearKernel"
FLASHINFER = "FlashInferFP8ScaledMMLinearKernel"
CUTLASS = "CutlassFP8ScaledMMLinearKernel"
TORCH_PER_TENSOR = "PerTensorTorchFP8ScaledMMLinearKernel"
TORCH_CHANNELWISE = "ChannelWiseTorchFP8ScaledMMLinearKernel"
KERNELS = (MARLIN, FLASHINFER, CUTLASS, TORCH_PER_TENSOR, TORCH_CHANNELWISE)

# Scale layouts as upstream's GroupShape (row, col): -1 means "the whole axis".
# A per-tensor scale covers every row and column; a per-token activation scale
# covers one row (one token); a per-channel weight scale covers one output row
# of W [out, in] -- upstream writes it as (-1, 1) in the GEMM's [K, N] view.
PER_TENSOR = (-1, -1)
PER_TOKEN = (1, -1)
PER_CHANNEL = (-1, 1)
LAYOUTS = (PER_TENSOR, PER_TOKEN, PER_CHANNEL)

# The selector's table, best first, transcribed from the pin (the test marked
# ``upstream`` re-reads it from the source).
POSSIBLE_FP8_KERNELS = {
    "cuda": (MARLIN, FLASHINFER, CUTLASS, TORCH_PER_TENSOR, TORCH_CHANNELWISE),
    "cpu": (TORCH_PER_TENSOR, TORCH_CHANNELWISE),
}

# The FP8 rows of --linear-backend's map. Upstream's map has more families
# (triton, deep_gemm, machete, ...), none of which holds one of these five
# kernels, so for this table they behave like an unknown name.
LINEAR_BACKENDS = {
    "cutlass": frozenset({CUTLASS}),
    "flashinfer_cutlass": frozenset({FLASHINFER}),
    "marlin": frozenset({MARLIN}),
    "torch": frozenset({TORCH_PER_TENSOR, TORCH_CHANNELWISE}),
}

# The reasons upstream's methods return, word for word.
R_NEEDS_CUDA = "requires CUDA."
R_MARLIN_SM75 = "FP8 Marlin requires compute capability 7.5 or higher"
R_MARLIN_BATCH_INVARIANT = "FP8 Marlin not supported for batch invariant execution."
R_MARLIN_FORCE = ("To apply FP8 Marlin on high-capability GPUs, please set "
                  "VLLM_TEST_FORCE_FP8_MARLIN=1")
R_NEEDS_FLASHINFER = "requires FlashInfer to be installed."
R_NEEDS_SM100 = "requires compute capability 100 and above."
R_NEEDS_SM89 = "requires compute capability 89 and above."
R_NEEDS_PER_TENSOR = "requires per tensor activation and weight scales."
R_NOT_PER_TENSOR = "cannot be used with per tensor activation and weight scales."

PLATFORMS = ("cuda", "cpu")


@dataclass(frozen=True)
class Device:
    """Where the layer runs. ``platform`` is ``"cuda"`` or ``"cpu"``;
    ``capability`` is the integer ``major * 10 + minor`` on CUDA (80 for an
    A100, 90 for an H100) and ``None`` on a CPU; ``has_flashinfer`` says
    whether the ``flashinfer`` package is importable."""

    platform: str
    capability: int | None
    has_flashinfer: bool = False


@dataclass(frozen=True)
class Env:
    """The environment switches the selector reads.

    ``force_fp8_marlin`` is ``VLLM_TEST_FORCE_FP8_MARLIN=1``;
    ``batch_invariant`` is ``VLLM_BATCH_INVARIANT=1``; ``disabled_kernels``
    is ``VLLM_DISABLED_KERNELS`` split on commas (kernel class names)."""

    force_fp8_marlin: bool = False
    batch_invariant: bool = False
    disabled_kernels: tuple[str, ...] = ()


@dataclass(frozen=True)
class FP8Config:
    """A linear layer as the selector sees it: the activation scale layout and
    the weight scale layout, each one of ``LAYOUTS`` (or, for activations, a
    per-group ``(1, g)`` layout, which the selector refuses)."""

    activation: tuple[int, int]
    weight: tuple[int, int]


def check_device(device) -> None:
    """Given. Raise ``ValueError`` naming ``device`` unless it is a ``Device``
    whose platform is in ``PLATFORMS``, with an int capability in [0, 200) on
    CUDA and ``None`` on a CPU."""
    if not isinstance(device, Device):
        raise ValueError(f"device must be a Device, got {type(device).__name__}")
    if device.platform not in PLATFORMS:
        raise ValueError(f"device.platform must be one of {PLATFORMS}, got {device.platform!r}")
    if device.platform == "cpu":
        if device.capability is not None:
            raise ValueError(f"device.capability must be None on a CPU, got {device.capability!r}")
    elif (not isinstance(device.capability, int) or isinstance(device.capability, bool)
          or not 0 <= device.capability < 200):
        raise ValueError("device.capability must be an int in [0, 200) on CUDA "
                         f"(major * 10 + minor), got {device.capability!r}")


# --------------------------------------------------------------------------
# What you write


def capability_to_int(capability) -> int | None:
    """A ``(major, minor)`` compute capability as upstream's integer.

    ``(8, 0)`` -> 80, ``(8, 9)`` -> 89, ``(10, 0)`` -> 100, ``None`` -> None
    (a CPU has no compute capability). The encoding ``major * 10 + minor``
    assumes a one-digit minor, as upstream's ``DeviceCapability.to_int`` does.

    Raises ValueError naming ``capability`` unless it is None or a pair of
    ints with ``major >= 0`` and ``0 <= minor <= 9``.
    """
    raise NotImplementedError("capability_to_int: major * 10 + minor; None stays None; check minor is one digit")


def is_supported(kernel: str, device: Device, env: Env) -> tuple[bool, str | None]:
    """Can ``kernel`` run on ``device`` at all (ignoring the layer)?

    Returns ``(True, None)`` or ``(False, reason)`` with ``reason`` one of the
    ``R_*`` strings, checked in upstream's order:

    * Marlin: CUDA (else ``R_NEEDS_CUDA``); capability >= 75 (else
      ``R_MARLIN_SM75``); not ``env.batch_invariant`` (else
      ``R_MARLIN_BATCH_INVARIANT``); capability < 89 unless
      ``env.force_fp8_marlin`` (else ``R_MARLIN_FORCE``).
    * FlashInfer: CUDA; ``device.has_flashinfer`` (else ``R_NEEDS_FLASHINFER``);
      capability >= 100 (else ``R_NEEDS_SM100``).
    * CUTLASS: CUDA, nothing else.
    * both torch kernels: a capability below 89 refuses (``R_NEEDS_SM89``);
      a CPU has none, so it passes.

    ``env.disabled_kernels`` is *not* looked at here (see ``check_kernel``).
    Raises ValueError naming ``kernel`` (not in ``KERNELS``) or ``device``.
    """
    raise NotImplementedError("is_supported: one branch per kernel; test in upstream's order, return the first R_* that applies")


def can_implement(kernel: str, config: FP8Config) -> tuple[bool, str | None]:
    """Can ``kernel`` compute this layer's scale layouts?

    Marlin and CUTLASS take any layout. FlashInfer and the per-tensor torch
    kernel need *both* scales per tensor (else ``R_NEEDS_PER_TENSOR``). The
    channel-wise torch kernel takes everything *except* both-per-tensor (else
    ``R_NOT_PER_TENSOR``), so exactly one torch kernel fits any layer.

    Returns ``(True, None)`` or ``(False, reason)``. Raises ValueError naming
    ``kernel`` (not in ``KERNELS``) or ``config`` (not an ``FP8Config``).
    """
    raise NotImplementedError("can_implement: compare config.activation and config.weight with PER_TENSOR")


def check_kernel(kernel: str, config: FP8Config, device: Device, env: Env) -> tuple[bool, str]:
    """One candidate, judged as upstream's ``is_supported_and_can_implement_kernel``.

    Returns ``(True, "")`` or ``(False, message)``. In order:

    * ``kernel`` in ``env.disabled_kernels``: message
      ``f" {kernel} is disabled by environment variable"`` (leading space, no
      final period -- upstream's exact text);
    * ``is_supported`` fails: ``f"{kernel} {reason}."``;
    * ``can_implement`` fails: ``f"{kernel} {reason}."``.

    Most reasons already end in a period, so most messages end in ``..``:
    that too is upstream's text. Raises ValueError as ``is_supported`` and
    ``can_implement`` do.
    """
    raise NotImplementedError("check_kernel: disabled first, then is_supported, then can_implement; format the message")


def choose_fp8_kernel(config: FP8Config, device: Device, env: Env | None = None,
                      force_kernel: str | None = None, linear_backend: str = "auto") -> str:
    """The kernel vLLM builds for an FP8 linear layer on ``device``.

    1. ``force_kernel`` (if not None) is judged with ``check_kernel`` and
       returned if it passes; if not, it is dropped silently.
    2. The candidates are ``POSSIBLE_FP8_KERNELS[device.platform]``, in order.
       Unless ``linear_backend == "auto"``, keep only those in
       ``LINEAR_BACKENDS[linear_backend]`` (an unknown name keeps none); if
       none is kept, raise ``ValueError(f"--linear-backend={linear_backend}
       was requested but no '{linear_backend}' kernel exists for this layer
       type.")``.
    3. Return the first candidate ``check_kernel`` accepts. If none does,
       raise ``ValueError("Failed to find a kernel that can implement the
       ScaledMM linear layer. Reasons: \\n" + "\\n".join(messages))`` with
       every candidate's message in order.

    ``env`` None means ``Env()``. Raises ValueError naming ``config`` when it
    is not an ``FP8Config`` or its activation layout is per group ``(1, g)``
    (vLLM sends those layers to a different, block-scaled table), or when
    either layout is not one of ``LAYOUTS``; naming ``force_kernel`` when it
    is not None and not in ``KERNELS``; naming ``device`` as ``check_device``.
    """
    raise NotImplementedError("choose_fp8_kernel: validate, try force_kernel, filter by linear_backend, walk the list")


def fp8_linear_scales(device: Device, static_activation: bool) -> FP8Config:
    """The scale layouts ``Fp8LinearMethod`` asks for (a non-block FP8 checkpoint).

    The weight scale is always per tensor. The activation scale is per tensor
    when the checkpoint ships static input scales (``static_activation``);
    otherwise activations are quantized on the fly, per token when the
    CUTLASS FP8 GEMM exists on this card (CUDA, capability >= 89) and per
    tensor everywhere else. Raises ValueError naming ``device``.
    """
    raise NotImplementedError("fp8_linear_scales: weight per tensor; activation per token only for dynamic scales on CUDA >= 89")


# --------------------------------------------------------------------------
# Given (identical in starter.py): the README's table


GPUS = {"T4": 75, "A100": 80, "A10G": 86, "L4": 89, "H100": 90, "B200": 100}
SHORT = {MARLIN: "Marlin", FLASHINFER: "FlashInfer", CUTLASS: "CUTLASS",
         TORCH_PER_TENSOR: "torch per-tensor", TORCH_CHANNELWISE: "torch channel-wise"}
COLUMNS = (("both per-tensor", FP8Config(PER_TENSOR, PER_TENSOR)),
           ("per-token activations", FP8Config(PER_TOKEN, PER_TENSOR)),
           ("per-channel weight", FP8Config(PER_TOKEN, PER_CHANNEL)))


def selection_rows() -> list[list[str]]:
    """Given. One row per README table line: device, then the short kernel
    name chosen for each of ``COLUMNS`` (uses ``choose_fp8_kernel``)."""
    devices = [(f"{name} ({cap})", Device("cuda", cap)) for name, cap in GPUS.items()]
    devices.append(("B200 (100) + FlashInfer", Device("cuda", 100, has_flashinfer=True)))
    devices.append(("CPU", Device("cpu", None)))
    return [[label] + [SHORT[choose_fp8_kernel(cfg, dev)] for _, cfg in COLUMNS]
            for label, dev in devices]


def main() -> None:
    print("| device | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for row in selection_rows():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
