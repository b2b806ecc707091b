"""Lab 05-03 — the CUDA graph mode algebra and the dispatcher (reference solution).

vLLM can run one forward pass in three ways: eagerly (``NONE``), as a chain
of CUDA graphs that stop at every attention call so attention itself runs
eagerly between them (``PIECEWISE``), or as one graph for the whole model,
attention included (``FULL``). A *configured* mode may also name two of them
at once, one routine for batches made only of decodes and another for every
other batch: ``FULL_DECODE_ONLY`` is (FULL, NONE), ``FULL_AND_PIECEWISE`` is
(FULL, PIECEWISE), the default at ``-O2``.

Three decisions follow from that setting, and this lab rebuilds each one as the
pin (vLLM v0.22.1) makes it:

* ``resolve_cudagraph_mode`` — the weakest attention backend of the model
  (``min_cudagraph_support``) may not be able to run inside a full graph, or
  only for uniform batches; the configured mode is then downgraded, or refused
  with a ``ValueError``.
* ``CudagraphDispatcher.initialize_cudagraph_keys`` — which graphs will be
  captured: one key (a ``BatchDescriptor``) per capture size for the mixed
  routine, and one per capture size that fits ``max_num_seqs`` decodes for the
  decode routine.
* ``CudagraphDispatcher.dispatch`` — at every step, the batch's token count is
  padded up to a capture size and looked up: first as an exact FULL key, then
  as a relaxed PIECEWISE key (any number of requests), else the step runs
  eagerly.

Left out on purpose (documented in the README): LoRA keys (``has_lora``,
``num_active_loras`` are always off), ``compile_sizes`` validation, the
rounding of capture sizes for speculative decoding (give the dispatcher sizes
that are already multiples of the decode query length) and the Mamba block
check. Speculative decoding's uniform batches (query length ``1 + k``) are in.

Given (identical in starter.py): ``AttentionCGSupport``, ``BatchDescriptor``,
``bs_to_padded_graph_size`` and the dispatcher's constructor.

upstream: vllm/config/compilation.py:53 CUDAGraphMode
upstream: vllm/config/compilation.py:1318 resolve_cudagraph_mode_and_sizes
upstream: vllm/v1/cudagraph_dispatcher.py:15 CudagraphDispatcher
upstream: vllm/v1/cudagraph_dispatcher.py:170 initialize_cudagraph_keys
upstream: vllm/v1/cudagraph_dispatcher.py:239 dispatch
upstream: vllm/forward_context.py:30 BatchDescriptor
upstream: vllm/v1/attention/backend.py:499 AttentionCGSupport
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

# --------------------------------------------------------------------------
# The modes (member values given; the methods are your work)
# --------------------------------------------------------------------------


class CUDAGraphMode(enum.Enum):
    """A configured CUDA graph mode, or (NONE, PIECEWISE, FULL only) a runtime mode.

    The three plain members are integers; the two composite members are tuples
    ``(decode routine, mixed routine)`` of those integers. Inside the class body
    ``FULL`` and ``NONE`` are still the plain ints 2 and 0, so
    ``FULL_DECODE_ONLY.value == (2, 0)`` and ``FULL_AND_PIECEWISE.value == (2, 1)``.

    upstream: vllm/config/compilation.py:53 CUDAGraphMode
    """

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True for the two composite modes (decode and mixed batches get different routines).

        upstream: vllm/config/compilation.py:89 separate_routine
        """
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CUDAGraphMode:
        """The runtime mode used for a batch of uniform decodes.

        Composite: the member whose value is the tuple's first entry. Plain:
        the mode itself. Always one of NONE, PIECEWISE, FULL.

        upstream: vllm/config/compilation.py:65 decode_mode
        """
        if not self.separate_routine():
            return self
        return CUDAGraphMode(self.value[0])

    def mixed_mode(self) -> CUDAGraphMode:
        """The runtime mode used for every other batch (prefills, mixed, non-uniform).

        Composite: the member of the tuple's second entry. Plain: the mode itself.

        upstream: vllm/config/compilation.py:68 mixed_mode
        """
        if not self.separate_routine():
            return self
        return CUDAGraphMode(self.value[1])

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """Whether this configured mode ever runs the runtime mode ``mode``.

        ``mode`` must be NONE, PIECEWISE or FULL; a composite is a ValueError
        naming ``mode`` (upstream asserts). Composite self: ``mode`` is one of
        its two routines. Plain self: ``mode`` is self.

        upstream: vllm/config/compilation.py:71 has_mode
        """
        if mode.separate_routine():
            raise ValueError(f"mode must be NONE, PIECEWISE or FULL (a runtime mode), got {mode.name}")
        if self.separate_routine():
            return mode.value in self.value
        return self == mode

    def requires_piecewise_compilation(self) -> bool:
        """True when some routine is PIECEWISE: the model must be split at attention.

        upstream: vllm/config/compilation.py:77 requires_piecewise_compilation
        """
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        """The strongest routine: the member of the larger tuple entry, or self if plain.

        upstream: vllm/config/compilation.py:80 max_cudagraph_mode
        """
        if not self.separate_routine():
            return self
        return CUDAGraphMode(max(self.value))

    def has_full_cudagraphs(self) -> bool:
        """True when some routine captures a FULL graph.

        upstream: vllm/config/compilation.py:83 has_full_cudagraphs
        """
        return self.max_cudagraph_mode() == CUDAGraphMode.FULL

    def has_piecewise_cudagraphs(self) -> bool:
        """Same answer as ``requires_piecewise_compilation`` (upstream keeps both names).

        upstream: vllm/config/compilation.py:86 has_piecewise_cudagraphs
        """
        return self.requires_piecewise_compilation()

    @classmethod
    def valid_runtime_modes(cls) -> frozenset[CUDAGraphMode]:
        """The modes a single forward pass can run in: NONE, PIECEWISE and FULL.

        upstream: vllm/config/compilation.py:93 valid_runtime_modes
        """
        return frozenset({cls.NONE, cls.PIECEWISE, cls.FULL})

    def is_valid_runtime_mode(self) -> bool:
        """True for NONE, PIECEWISE and FULL; False for the composites.

        upstream: vllm/config/compilation.py:96 is_valid_runtime_mode
        """
        return self in CUDAGraphMode.valid_runtime_modes()

    def __str__(self) -> str:
        """The member's name ("FULL_AND_PIECEWISE"), as upstream's logs print it."""
        return self.name

    def __bool__(self) -> bool:
        """False only for NONE, so ``if mode:`` means "some CUDA graph is used"."""
        return self != CUDAGraphMode.NONE


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


class AttentionCGSupport(enum.Enum):
    """Given. How much of a CUDA graph an attention backend can live inside.

    Ordered by value: ALWAYS (any batch, even mixed prefill/decode) >
    UNIFORM_BATCH (batches whose requests all have the same query length, such
    as speculative-decoding verification) > UNIFORM_SINGLE_TOKEN_DECODE (pure
    one-token decodes) > NEVER.

    upstream: vllm/v1/attention/backend.py:499 AttentionCGSupport
    """

    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


@dataclass(frozen=True)
class BatchDescriptor:
    """Given. The key of one captured graph (upstream's first three fields).

    ``num_tokens``: the padded token count; ``num_reqs``: the number of
    requests the graph was captured for, or None for a PIECEWISE graph, which
    serves any number; ``uniform``: every request has the same query length.
    Frozen, so it hashes and compares by value. Upstream also has
    ``has_lora`` and ``num_active_loras``; this lab leaves LoRA out.

    upstream: vllm/forward_context.py:30 BatchDescriptor
    """

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


def bs_to_padded_graph_size(capture_sizes: Sequence[int]) -> list[int]:
    """Given (lab 05 has you write it). Index ``n`` -> the capture size a batch of ``n`` tokens pads to.

    ``capture_sizes`` must be sorted ascending, without repeats, all >= 1.
    Returns a list of length ``capture_sizes[-1] + 1``: entry 0 is 0, entry
    ``n`` is the smallest capture size >= ``n``. Sizes above the last one have
    no entry: such batches run eagerly.

    upstream: vllm/v1/cudagraph_dispatcher.py:76 _compute_bs_to_padded_graph_size
    """
    max_size = capture_sizes[-1]
    table = [0] * (max_size + 1)
    for end, start in zip([*capture_sizes, max_size + 1], [0, *capture_sizes], strict=True):
        for bs in range(start, end):
            table[bs] = start if bs == start else end
    return table


# --------------------------------------------------------------------------
# Your work: the backend's support and the resolved mode
# --------------------------------------------------------------------------


def min_cudagraph_support(
    backends: Iterable[tuple[str, AttentionCGSupport]],
) -> tuple[AttentionCGSupport, str | None]:
    """The weakest CUDA graph support among a model's attention backends.

    Input: ``(backend name, support)`` pairs, one per backend the model uses
    (a hybrid model has several). Output: ``(support, name)`` of the pair with
    the smallest ``support.value``; on a tie the *first* such backend keeps
    the name. No backend at all: ``(AttentionCGSupport.ALWAYS, None)``.
    Errors: a support that is not an ``AttentionCGSupport`` is a ValueError
    naming ``backends``.

    upstream: vllm/v1/worker/gpu_model_runner.py:6681 min_cg_support
    """
    min_cg_support = AttentionCGSupport.ALWAYS
    min_cg_attn_backend = None
    for name, support in backends:
        if not isinstance(support, AttentionCGSupport):
            raise ValueError(f"backends: the support of {name!r} must be an AttentionCGSupport, got {support!r}")
        # Strictly smaller: a later backend of equal support does not take the name.
        if support.value < min_cg_support.value:
            min_cg_support = support
            min_cg_attn_backend = name
    return min_cg_support, min_cg_attn_backend


def resolve_cudagraph_mode(
    cudagraph_mode: CUDAGraphMode | None,
    min_cg_support: AttentionCGSupport,
    *,
    attention_in_splitting_ops: bool = True,
    vllm_compile: bool = True,
    use_inductor_graph_partition: bool = False,
    uniform_decode_query_len: int = 1,
    backend_name: str | None = None,
) -> CUDAGraphMode:
    """The configured mode after the attention backend's support has had its say.

    Inputs: the configured ``cudagraph_mode`` (None means NONE); the weakest
    backend's ``min_cg_support``; whether every attention op is a splitting
    op of the piecewise compilation (``attention_in_splitting_ops``); whether
    the compilation mode is VLLM_COMPILE (``vllm_compile``); whether Inductor
    partitions the graph instead (``use_inductor_graph_partition``); the
    query length of a uniform decode batch (1, or 1 + speculative tokens);
    ``backend_name`` only for messages.

    Output: the resolved mode, by upstream's four checks in order, each one
    applied to the result of the previous:

    1. the mixed routine is FULL but support is not ALWAYS: NEVER is a
       ValueError; otherwise FULL_AND_PIECEWISE if attention is a splitting
       op, else FULL_DECODE_ONLY;
    2. the decode routine is FULL and support is NEVER: PIECEWISE if
       ``vllm_compile`` and (attention is a splitting op or Inductor
       partitions), else NONE;
    3. the decode routine is FULL, ``uniform_decode_query_len > 1`` and
       support is below UNIFORM_BATCH: PIECEWISE if attention is a splitting
       op, else NONE;
    4. any FULL routine left with NEVER support: ValueError.

    Errors (ValueError): the refusals of checks 1 and 4 name ``min_cg_support``
    and ``cudagraph_mode``; ``uniform_decode_query_len`` < 1 names itself.

    upstream: vllm/config/compilation.py:1318 resolve_cudagraph_mode_and_sizes
    """
    if uniform_decode_query_len < 1:
        raise ValueError(f"uniform_decode_query_len must be >= 1, got {uniform_decode_query_len}")
    mode = cudagraph_mode
    if mode is None or mode == CUDAGraphMode.NONE:
        return CUDAGraphMode.NONE
    never = AttentionCGSupport.NEVER

    # 1. A FULL mixed routine needs a backend that runs any batch in a graph.
    if mode.mixed_mode() == CUDAGraphMode.FULL and min_cg_support != AttentionCGSupport.ALWAYS:
        if min_cg_support == never:
            raise ValueError(
                f"cudagraph_mode {mode.name} needs full graphs, but min_cg_support is NEVER "
                f"({backend_name}); try cudagraph_mode=PIECEWISE with VLLM_COMPILE"
            )
        mode = CUDAGraphMode.FULL_AND_PIECEWISE if attention_in_splitting_ops else CUDAGraphMode.FULL_DECODE_ONLY

    # 2. A FULL decode routine with a backend that never fits in a graph.
    if mode.decode_mode() == CUDAGraphMode.FULL and min_cg_support == never:
        attention_piecewise = vllm_compile and (attention_in_splitting_ops or use_inductor_graph_partition)
        mode = CUDAGraphMode.PIECEWISE if attention_piecewise else CUDAGraphMode.NONE

    # 3. Speculative decoding: a "decode" has 1 + k query tokens per request,
    #    which only UNIFORM_BATCH (or ALWAYS) backends capture.
    if (
        mode.decode_mode() == CUDAGraphMode.FULL
        and uniform_decode_query_len > 1
        and min_cg_support.value < AttentionCGSupport.UNIFORM_BATCH.value
    ):
        mode = CUDAGraphMode.PIECEWISE if attention_in_splitting_ops else CUDAGraphMode.NONE

    # 4. The safety net after the downgrades.
    if mode.has_full_cudagraphs() and min_cg_support == never:
        raise ValueError(
            f"cudagraph_mode {mode.name} still has full graphs, but min_cg_support is NEVER "
            f"({backend_name}); try cudagraph_mode=PIECEWISE with VLLM_COMPILE"
        )
    return mode


# --------------------------------------------------------------------------
# The dispatcher (constructor given; the methods are your work)
# --------------------------------------------------------------------------


class CudagraphDispatcher:
    """Which graphs exist (keys per runtime mode) and which one a batch uses.

    Build it with the scheduler's numbers, call ``initialize_cudagraph_keys``
    once with the resolved mode, then ``dispatch`` every step.

    upstream: vllm/v1/cudagraph_dispatcher.py:15 CudagraphDispatcher
    """

    def __init__(self, capture_sizes: Sequence[int], max_num_seqs: int,
                 num_speculative_tokens: int = 0) -> None:
        """Given. Store the configuration; no keys yet, mode NONE.

        ``capture_sizes``: the capture-size ladder (lab 05), any order, each
        >= 1; stored sorted without repeats, and its largest entry is
        ``max_capture_size``. ``max_num_seqs`` >= 1: the most requests in a
        batch. ``num_speculative_tokens`` >= 0: a uniform decode batch has
        ``uniform_decode_query_len = 1 + num_speculative_tokens`` tokens per
        request (upstream passes this number to the constructor and again to
        ``initialize_cudagraph_keys``; here it is given once).
        Errors: ValueError naming the bad parameter.
        """
        sizes = sorted(set(int(s) for s in capture_sizes))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"capture_sizes must be a non-empty list of sizes >= 1, got {list(capture_sizes)}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
        self.capture_sizes: list[int] = sizes
        self.max_capture_size: int = sizes[-1]
        self.max_num_seqs = max_num_seqs
        self.uniform_decode_query_len = 1 + num_speculative_tokens
        self.cudagraph_keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(),
            CUDAGraphMode.FULL: set(),
        }
        self.keys_initialized = False
        self.cudagraph_mode = CUDAGraphMode.NONE
        self._bs_to_padded_graph_size: list[int] = []

    def _create_padded_batch_descriptor(self, num_tokens: int, uniform_decode: bool) -> BatchDescriptor:
        """The key of the graph a batch of ``num_tokens`` tokens would use.

        Requires ``0 <= num_tokens <= max_capture_size`` and the padding table
        (``self._bs_to_padded_graph_size``, filled by
        ``initialize_cudagraph_keys``). ``num_tokens`` is padded up to a
        capture size ``p``. If ``uniform_decode`` and the configured mode has
        a FULL routine: ``BatchDescriptor(p, min(p // q, max_num_seqs), True)``
        with ``q = uniform_decode_query_len``. Otherwise
        ``BatchDescriptor(p, min(p, max_num_seqs), False)``: one request per
        token at most.
        Errors: a uniform ``p`` that is not a multiple of ``q`` is a
        ValueError naming ``uniform_decode_query_len`` (upstream asserts).

        upstream: vllm/v1/cudagraph_dispatcher.py:136 _create_padded_batch_descriptor
        """
        padded = self._bs_to_padded_graph_size[num_tokens]
        q = self.uniform_decode_query_len
        if uniform_decode and self.cudagraph_mode.has_mode(CUDAGraphMode.FULL):
            if padded % q != 0:
                raise ValueError(
                    f"a uniform batch of {num_tokens} tokens pads to {padded}, not a multiple of "
                    f"uniform_decode_query_len={q}: use capture_sizes that are multiples of it"
                )
            # Requests are counted from the *padded* size: the graph was captured for p // q.
            return BatchDescriptor(padded, min(padded // q, self.max_num_seqs), True)
        return BatchDescriptor(padded, min(padded, self.max_num_seqs), False)

    def initialize_cudagraph_keys(self, cudagraph_mode: CUDAGraphMode) -> None:
        """Record the resolved mode and create every key that will be captured.

        NONE: no keys, and ``keys_initialized`` becomes True. Otherwise fill
        ``self._bs_to_padded_graph_size`` (with ``bs_to_padded_graph_size``), then:

        * mixed routine not NONE: for every capture size ``s``, the key of
          ``_create_padded_batch_descriptor(s, False)`` under the mixed
          routine's runtime mode; a PIECEWISE key is *relaxed* to
          ``BatchDescriptor(s)`` (num_reqs None, not uniform), a FULL key
          keeps its ``num_reqs``;
        * composite mode whose decode routine is FULL: for every capture size
          ``s`` with ``q <= s <= q * max_num_seqs``, the FULL key of
          ``_create_padded_batch_descriptor(s, True)``.

        Errors: ``cudagraph_mode`` not a CUDAGraphMode is a ValueError naming
        it; a decode size that is not a multiple of ``q`` raises as
        ``_create_padded_batch_descriptor`` does.

        upstream: vllm/v1/cudagraph_dispatcher.py:170 initialize_cudagraph_keys
        """
        if not isinstance(cudagraph_mode, CUDAGraphMode):
            raise ValueError(f"cudagraph_mode must be a CUDAGraphMode, got {cudagraph_mode!r}")
        self.cudagraph_mode = cudagraph_mode
        if cudagraph_mode == CUDAGraphMode.NONE:
            self.keys_initialized = True
            return
        self._bs_to_padded_graph_size = bs_to_padded_graph_size(self.capture_sizes)

        mixed = cudagraph_mode.mixed_mode()
        if mixed != CUDAGraphMode.NONE:
            for bs in self.capture_sizes:
                desc = self._create_padded_batch_descriptor(bs, False)
                # Only PIECEWISE graphs serve any request count; a FULL graph's
                # attention metadata was built for exactly num_reqs requests.
                if mixed == CUDAGraphMode.PIECEWISE:
                    desc = replace(desc, num_reqs=None, uniform=False)
                self.cudagraph_keys[mixed].add(desc)

        if cudagraph_mode.decode_mode() == CUDAGraphMode.FULL and cudagraph_mode.separate_routine():
            q = self.uniform_decode_query_len
            max_num_tokens = q * self.max_num_seqs
            for bs in self.capture_sizes:
                if q <= bs <= max_num_tokens:
                    self.cudagraph_keys[CUDAGraphMode.FULL].add(self._create_padded_batch_descriptor(bs, True))
        self.keys_initialized = True

    def dispatch(
        self,
        num_tokens: int,
        uniform_decode: bool = False,
        valid_modes: AbstractSet[CUDAGraphMode] | None = None,
        invalid_modes: AbstractSet[CUDAGraphMode] | None = None,
    ) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """The runtime mode and key for one step of ``num_tokens`` tokens.

        ``uniform_decode``: every request has exactly ``q`` query tokens.
        ``valid_modes``: allowed runtime modes (None, or an empty set, means
        all three); ``invalid_modes``: removed from them (cascade attention
        passes ``{FULL}``).

        Returns ``(NONE, BatchDescriptor(num_tokens))`` when keys are not
        initialized, the mode is NONE, ``num_tokens > max_capture_size``, or
        only NONE is allowed. Otherwise builds the padded key with
        ``uniform_decode`` kept only for a composite mode, and returns
        ``(FULL, key)`` if FULL is allowed and the key is a FULL key, else
        ``(PIECEWISE, relaxed key)`` if PIECEWISE is allowed and
        ``BatchDescriptor(key.num_tokens)`` is a PIECEWISE key, else
        ``(NONE, BatchDescriptor(num_tokens))``.

        Errors (ValueError): ``num_tokens`` < 0 names ``num_tokens``; no mode
        left after ``invalid_modes``, or no graph found while NONE is not
        allowed, names ``valid_modes`` (upstream asserts both).

        upstream: vllm/v1/cudagraph_dispatcher.py:239 dispatch
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        # Upstream's `or`: an empty valid_modes means "all", like None.
        allowed = set(valid_modes or CUDAGraphMode.valid_runtime_modes())
        if invalid_modes:
            allowed -= set(invalid_modes)
        if not allowed:
            raise ValueError(f"valid_modes minus invalid_modes leaves no mode: {valid_modes} - {invalid_modes}")

        eager = (CUDAGraphMode.NONE, BatchDescriptor(num_tokens))
        if (
            not self.keys_initialized
            or self.cudagraph_mode == CUDAGraphMode.NONE
            or num_tokens > self.max_capture_size
            or allowed <= {CUDAGraphMode.NONE}
        ):
            return eager

        # A uniform batch can only hit a dedicated decode graph in a composite mode.
        uniform = uniform_decode and self.cudagraph_mode.separate_routine()
        desc = self._create_padded_batch_descriptor(num_tokens, uniform)

        if CUDAGraphMode.FULL in allowed and desc in self.cudagraph_keys[CUDAGraphMode.FULL]:
            return CUDAGraphMode.FULL, desc
        if CUDAGraphMode.PIECEWISE in allowed:
            relaxed = replace(desc, num_reqs=None, uniform=False)
            if relaxed in self.cudagraph_keys[CUDAGraphMode.PIECEWISE]:
                return CUDAGraphMode.PIECEWISE, relaxed
        if CUDAGraphMode.NONE not in allowed:
            raise ValueError(f"no graph for {num_tokens} tokens and NONE is not in valid_modes={valid_modes}")
        return eager

    def get_capture_descs(self) -> list[tuple[CUDAGraphMode, list[BatchDescriptor]]]:
        """What the model runner captures, in capture order.

        ``[]`` before ``initialize_cudagraph_keys`` or with mode NONE.
        Otherwise ``(PIECEWISE, keys)`` then ``(FULL, keys)``, each only if it
        has keys, with keys sorted by ``num_tokens``, largest first (the
        largest graph is captured first so smaller ones reuse its memory pool).

        upstream: vllm/v1/cudagraph_dispatcher.py:330 get_capture_descs
        """
        if not self.keys_initialized or self.cudagraph_mode == CUDAGraphMode.NONE:
            return []
        result = []
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            descs = sorted(self.cudagraph_keys[mode], key=lambda d: d.num_tokens, reverse=True)
            if descs:
                result.append((mode, descs))
        return result


# --------------------------------------------------------------------------
# Example
# --------------------------------------------------------------------------


def default_capture_sizes(max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                          num_speculative_tokens: int = 0) -> list[int]:
    """Given. vLLM's default capture-size ladder (lab 05 has you derive it).

    The cap is ``min(max_num_seqs * (1 + num_speculative_tokens) * 2, 512,
    max_num_batched_tokens)``; the rungs are ``[1, 2, 4]``, every 8 from 8
    below 256, every 16 from 256, none above the cap; ``max_num_batched_tokens``
    is added when it is at most the cap. Sorted ascending.

    upstream: vllm/config/vllm.py:1597 _set_cudagraph_sizes
    """
    cap = min(max_num_seqs * (1 + num_speculative_tokens) * 2, 512)
    cap = min(max_num_batched_tokens, cap)
    sizes = [i for i in [1, 2, 4] if i <= cap]
    if cap >= 8:
        sizes += list(range(8, min(cap + 1, 256), 8))
    if cap >= 256:
        sizes += list(range(256, cap + 1, 16))
    if max_num_batched_tokens <= cap and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def main() -> None:
    """Print the keys and a few dispatches of the defaults (`LLM` on a < 70 GiB card)."""
    disp = CudagraphDispatcher(default_capture_sizes(), max_num_seqs=256)
    mode = resolve_cudagraph_mode(CUDAGraphMode.FULL_AND_PIECEWISE, AttentionCGSupport.UNIFORM_BATCH)
    disp.initialize_cudagraph_keys(mode)
    print(f"resolved mode: {mode}")
    for runtime, descs in disp.get_capture_descs():
        print(f"{runtime}: {len(descs)} graphs, {descs[-1].num_tokens}..{descs[0].num_tokens} tokens")
    for n, uniform in [(33, True), (33, False), (257, True), (513, False)]:
        runtime, desc = disp.dispatch(n, uniform)
        print(f"dispatch({n}, uniform_decode={uniform}) -> {runtime}, {desc}")
    print("FULL on FA2 (UNIFORM_BATCH) ->",
          resolve_cudagraph_mode(CUDAGraphMode.FULL, AttentionCGSupport.UNIFORM_BATCH))


if __name__ == "__main__":
    main()
