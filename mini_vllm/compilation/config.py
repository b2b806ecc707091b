"""What to compile and what to capture: vLLM's two switches, and the capture-size ladder.

Two independent axes, as in vLLM (and a third there, the ``-O`` optimization
level, which only picks defaults for these two):

* ``CompilationMode`` — how the model's Python becomes a graph. mini_vllm runs
  ``NONE`` (eager torch, its default) and ``VLLM_COMPILE`` (``torch.compile``
  with mini_vllm's backend: the graph split at attention, each piece run or
  compiled on its own).
* ``CUDAGraphMode`` — which steps replay captured CUDA graphs. mini_vllm runs
  ``NONE`` and ``PIECEWISE`` (graphs of the pieces between attention ops). The
  ``FULL`` modes need an attention kernel whose launches can be recorded with
  fixed metadata; mini_vllm's kernels read numpy metadata on the host, so they
  cannot be captured, and asking for ``FULL`` is an error rather than a quiet
  downgrade.

upstream: vllm/config/compilation.py:37 CompilationMode
upstream: vllm/config/compilation.py:53 CUDAGraphMode
upstream: vllm/config/vllm.py:1597 _set_cudagraph_sizes
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

ATTENTION_OP = "mini_vllm::unified_attention"


class CompilationMode(enum.IntEnum):
    NONE = 0  # eager: the model's Python runs as written
    STOCK_TORCH_COMPILE = 1  # torch.compile with a stock backend (not run by mini_vllm)
    DYNAMO_TRACE_ONCE = 2  # one Dynamo trace, no recompiles (not run by mini_vllm)
    VLLM_COMPILE = 3  # split at attention, pieces compiled and captured separately


class CUDAGraphMode(enum.Enum):
    """A concrete runtime mode (NONE, PIECEWISE, FULL) or a pair (decode mode, mixed mode)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """A pair: uniform-decode batches and mixed batches get different modes."""
        return isinstance(self.value, tuple)

    def _pair(self) -> tuple[CUDAGraphMode, CUDAGraphMode]:
        """(mode for uniform decodes, mode for everything else); a plain mode serves both."""
        if not isinstance(self.value, tuple):
            return self, self
        return CUDAGraphMode(self.value[0]), CUDAGraphMode(self.value[1])

    def decode_mode(self) -> CUDAGraphMode:
        return self._pair()[0]

    def mixed_mode(self) -> CUDAGraphMode:
        return self._pair()[1]

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """Does this setting ever run ``mode`` (NONE, PIECEWISE or FULL) for some batch?"""
        if isinstance(mode.value, tuple):
            raise ValueError(f"mode must be a runtime mode (NONE, PIECEWISE, FULL), got {mode.name}")
        return mode in self._pair()

    def requires_piecewise_compilation(self) -> bool:
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def __bool__(self) -> bool:
        return self != CUDAGraphMode.NONE


def _enum(cls, value, name):
    """An enum member from a member, its name (any case) or, for IntEnums, its number."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str) and value.upper() in cls.__members__:
        return cls[value.upper()]
    if cls is CompilationMode and isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    raise ValueError(f"{name} must be one of {', '.join(cls.__members__)}, got {value!r}")


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                          num_speculative_tokens: int = 0,
                          max_cudagraph_capture_size: int | None = None) -> list[int]:
    """vLLM's default ladder: 1, 2, 4, then every 8 below 256, then every 16, up to a cap.

    cap = min(max_cudagraph_capture_size or max_num_seqs * (1 + num_speculative_tokens) * 2
    (at most 512), max_num_batched_tokens). When the token budget itself is the
    cap it is added even off the stride, so the biggest batch the scheduler can
    build still has a graph. At vLLM's defaults (256, 8192) that is 51 sizes.
    """
    for name, value, low in (("max_num_seqs", max_num_seqs, 1),
                             ("max_num_batched_tokens", max_num_batched_tokens, 1),
                             ("num_speculative_tokens", num_speculative_tokens, 0),
                             ("max_cudagraph_capture_size", max_cudagraph_capture_size or 1, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    cap = max_cudagraph_capture_size or min(max_num_seqs * (1 + num_speculative_tokens) * 2, 512)
    cap = min(cap, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= cap]
    if cap >= 8:
        sizes += range(8, min(cap + 1, 256), 8)
    if cap >= 256:
        sizes += range(256, cap + 1, 16)
    if max_num_batched_tokens <= cap:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


@dataclass
class CompilationConfig:
    """``LLMEngine(compilation_config=...)``: a dict of these fields, or this object.

    ``cudagraph_capture_sizes`` defaults to ``default_capture_sizes`` of the
    engine's limits; ``backend`` says how each piece between attention ops
    runs once split: only ``"eager"`` (the FX piece as traced) in mini_vllm,
    where vLLM hands each piece to Inductor.
    """

    mode: CompilationMode = CompilationMode.NONE
    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.NONE
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    splitting_ops: list[str] = field(default_factory=lambda: [ATTENTION_OP])
    backend: str = "eager"

    @classmethod
    def from_any(cls, value) -> CompilationConfig:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"compilation_config must be a dict or a CompilationConfig, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"compilation_config: unknown keys {unknown}; valid keys: {sorted(known)}")
        return cls(**value)

    def __post_init__(self) -> None:
        self.mode = _enum(CompilationMode, self.mode, "compilation_config.mode")
        self.cudagraph_mode = _enum(CUDAGraphMode, self.cudagraph_mode, "compilation_config.cudagraph_mode")
        if self.mode not in (CompilationMode.NONE, CompilationMode.VLLM_COMPILE):
            raise ValueError(f"compilation_config.mode must be NONE or VLLM_COMPILE in mini_vllm, "
                             f"got {self.mode.name}")
        if self.cudagraph_mode not in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE):
            raise ValueError(f"compilation_config.cudagraph_mode must be NONE or PIECEWISE in mini_vllm "
                             f"(FULL graphs need an attention kernel that can be captured; mini_vllm's "
                             f"read their metadata on the host), got {self.cudagraph_mode.name}")
        if self.cudagraph_mode.requires_piecewise_compilation() and self.mode != CompilationMode.VLLM_COMPILE:
            raise ValueError("compilation_config.cudagraph_mode PIECEWISE needs mode VLLM_COMPILE "
                             "(the pieces come from splitting the compiled graph)")
        if self.backend != "eager":
            raise ValueError(f"compilation_config.backend must be 'eager' (the pieces run as traced; "
                             f"vLLM compiles them with Inductor), got {self.backend!r}")
        if list(self.splitting_ops) != [ATTENTION_OP]:
            raise ValueError(f"compilation_config.splitting_ops must be [{ATTENTION_OP!r}] "
                             f"(the one attention op mini_vllm has), got {self.splitting_ops!r}")
        if self.max_cudagraph_capture_size is not None and (
                isinstance(self.max_cudagraph_capture_size, bool)
                or not isinstance(self.max_cudagraph_capture_size, int) or self.max_cudagraph_capture_size < 1):
            raise ValueError(f"compilation_config.max_cudagraph_capture_size must be an integer >= 1, "
                             f"got {self.max_cudagraph_capture_size!r}")
        if self.cudagraph_capture_sizes is not None:
            sizes = self.cudagraph_capture_sizes
            if (not isinstance(sizes, list | tuple) or not sizes
                    or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
                raise ValueError(f"compilation_config.cudagraph_capture_sizes must be a non-empty list of "
                                 f"integers >= 1, got {sizes!r}")
            self.cudagraph_capture_sizes = sorted(set(sizes))

    def resolve_capture_sizes(self, max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
        """The sizes graphs are captured for ([] when no graphs), capped as vLLM caps them."""
        if not self.cudagraph_mode:
            return []
        if self.cudagraph_capture_sizes is None:
            return default_capture_sizes(max_num_seqs, max_num_batched_tokens,
                                         max_cudagraph_capture_size=self.max_cudagraph_capture_size)
        limit = min(max_num_batched_tokens, self.max_cudagraph_capture_size or max_num_batched_tokens)
        return [s for s in self.cudagraph_capture_sizes if s <= limit]
