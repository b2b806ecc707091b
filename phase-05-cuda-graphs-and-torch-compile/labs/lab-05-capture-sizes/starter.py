"""Lab 05-05 — the capture-size ladder, exactly as vLLM builds it (your implementation).

A CUDA graph replays one fixed shape. vLLM therefore records one graph per
*capture size*, a number of tokens, at start-up, and pads every later batch up
to the nearest recorded size; a batch larger than the largest size runs eager.
The list of sizes is the *ladder*. Its rungs decide three things at once: how
many graphs are captured (start-up time and graph memory), how many padded
rows every step computes for nothing, and which batches never get a graph.

vLLM does not ask the user for the ladder. ``VllmConfig`` derives it from the
scheduler's limits when the engine is built:

* the top rung is ``min(max_num_seqs * (1 + num_speculative_tokens) * 2, 512)``
  unless the user set ``max_cudagraph_capture_size``, and never more than
  ``max_num_batched_tokens``;
* the rungs are 1, 2, 4, then every 8 below 256, then every 16 from 256 on
  (``performance_mode="interactivity"`` replaces 1, 2, 4 by every size 1..32);
* ``max_num_batched_tokens`` itself is added when it is the binding limit.

At run time the dispatcher looks each batch's token count up in a table built
once from the ladder: index ``n`` holds the smallest rung ``>= n``.

* ``batch_defaults`` (given) — the ``max_num_seqs`` / ``max_num_batched_tokens``
  vLLM picks when the user sets neither.
* ``check_capture_sizes`` (given) — validate a ladder.
* ``round_capture_sizes_for_spec_decode`` (given) — the later rounding of the
  ladder to multiples of the decode query length (speculative decoding with
  FULL decode graphs).
* ``default_capture_sizes`` — the ladder.
* ``padded_size_table`` — the dispatcher's lookup table.
* ``select_capture_size`` — the rung one batch is padded to, or ``None``.
* ``trace_waste`` — padding over a trace of batch sizes.

All sizes are numbers of *tokens* in one forward pass (for a pure decode step
without speculation, tokens equal requests).

upstream: vllm/config/vllm.py:1597 _set_cudagraph_sizes
upstream: vllm/v1/cudagraph_dispatcher.py:76 _compute_bs_to_padded_graph_size
upstream: vllm/engine/arg_utils.py:2282 get_batch_defaults
upstream: vllm/config/compilation.py:1464 adjust_cudagraph_sizes_for_spec_decode
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
DEFAULT_MAX_CAPTURE_SIZE = 512  # the top rung when the user names none
INTERACTIVITY_MAX = 32  # interactivity mode captures every size up to this
LARGE_GPU_GIB = 70  # get_batch_defaults: at least this much memory (and not an A100)
ENTRYPOINTS = ("llm", "serve")  # the LLM class, or the OpenAI-compatible server


def _check_int(name: str, value: object, low: int) -> int:
    """Refuse anything but an int (bools excluded) of at least ``low``, naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def batch_defaults(device_memory_gib: float, device_name: str = "", entrypoint: str = "llm",
                   performance_mode: str = "balanced") -> tuple[int, int]:
    """Given. The ``(max_num_seqs, max_num_batched_tokens)`` vLLM picks when the user sets neither.

    ``device_memory_gib``: total memory of one GPU in GiB (an H100 80GB reports
    about 79.2); ``device_name``: as ``torch.cuda.get_device_name`` prints it;
    ``entrypoint``: ``"llm"`` for the ``LLM`` class, ``"serve"`` for
    ``vllm serve``. A GPU with at least 70 GiB whose name does not contain
    "a100" gets the large defaults (1024 sequences; 16384 tokens for ``LLM``,
    8192 for the server), every other GPU the small ones (256 sequences;
    8192 tokens for ``LLM``, 2048 for the server). ``performance_mode=
    "throughput"`` doubles both. CUDA GPUs only: the TPU and CPU branches of
    upstream are left out.

    Raises ValueError naming ``device_memory_gib`` (negative), ``entrypoint``
    or ``performance_mode`` (not one of the allowed values).

    upstream: vllm/engine/arg_utils.py:2282 get_batch_defaults
    upstream: vllm/engine/arg_utils.py:2508 performance_mode
    """
    if device_memory_gib < 0:
        raise ValueError(f"device_memory_gib must be >= 0, got {device_memory_gib!r}")
    if entrypoint not in ENTRYPOINTS:
        raise ValueError(f"entrypoint must be one of {ENTRYPOINTS}, got {entrypoint!r}")
    if performance_mode not in PERFORMANCE_MODES:
        raise ValueError(f"performance_mode must be one of {PERFORMANCE_MODES}, got {performance_mode!r}")
    if device_memory_gib >= LARGE_GPU_GIB and "a100" not in device_name.lower():
        seqs, tokens = 1024, (16384 if entrypoint == "llm" else 8192)
    else:
        seqs, tokens = 256, (8192 if entrypoint == "llm" else 2048)
    if performance_mode == "throughput":
        seqs, tokens = seqs * 2, tokens * 2
    return seqs, tokens


def check_capture_sizes(capture_sizes: Iterable[int]) -> list[int]:
    """Given. Validate a ladder and return it as a new list.

    A ladder is a non-empty, strictly increasing sequence of ints ``>= 1``
    (what ``default_capture_sizes`` returns, and what upstream holds in
    ``compilation_config.cudagraph_capture_sizes`` after start-up). Raises
    ValueError naming ``capture_sizes`` otherwise.
    """
    sizes = list(capture_sizes)
    if not sizes:
        raise ValueError("capture_sizes must hold at least one size")
    for i, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"capture_sizes must hold integers >= 1, got {size!r}")
        if i and size <= sizes[i - 1]:
            raise ValueError(f"capture_sizes must be strictly increasing, got {sizes[i - 1]} then {size}")
    return sizes


def round_capture_sizes_for_spec_decode(capture_sizes: Iterable[int],
                                        uniform_decode_query_len: int) -> list[int]:
    """Given. The ladder after upstream rounds it for speculative decoding.

    When decode steps use FULL graphs and each request verifies
    ``uniform_decode_query_len = 1 + num_speculative_tokens`` tokens, vLLM
    rounds every rung up to a multiple of that length, drops the ones that
    then exceed the old top rung, and de-duplicates. If none is left but the
    length itself fits under the top rung, the ladder is ``[length]``. A
    length of 1 leaves the ladder unchanged.

    Raises ValueError naming ``capture_sizes`` (see ``check_capture_sizes``,
    or nothing left after rounding) or ``uniform_decode_query_len`` (< 1).

    upstream: vllm/config/compilation.py:1464 adjust_cudagraph_sizes_for_spec_decode
    """
    sizes = check_capture_sizes(capture_sizes)
    q = _check_int("uniform_decode_query_len", uniform_decode_query_len, 1)
    if q == 1:
        return sizes
    top = sizes[-1]
    rounded = sorted({-(-s // q) * q for s in sizes if -(-s // q) * q <= top})
    if not rounded and q <= top:
        rounded = [q]
    if not rounded:
        raise ValueError(f"capture_sizes {sizes} keep no size after rounding up to a multiple of {q}")
    return rounded


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                          num_speculative_tokens: int = 0, max_capture_size: int | None = None,
                          performance_mode: str = "balanced") -> list[int]:
    """The capture sizes vLLM derives when the user lists none.

    Inputs are the engine's final limits (after ``batch_defaults`` or the
    user's flags): ``max_num_seqs`` (requests per step), ``max_num_batched_tokens``
    (tokens per step), ``num_speculative_tokens`` (0 without speculative
    decoding), ``max_capture_size`` (``compilation_config.
    max_cudagraph_capture_size``; ``None`` lets vLLM choose) and
    ``performance_mode``.

    The top rung ``cap`` is ``min(max_num_seqs * (1 + num_speculative_tokens)
    * 2, 512)`` when ``max_capture_size`` is None, else ``max_capture_size``;
    then ``cap = min(cap, max_num_batched_tokens)``. The ladder is 1, 2, 4
    (those ``<= cap``; in ``"interactivity"`` mode instead every size from 1 to
    ``min(cap, 32)``), then the multiples of 8 from 8 to ``min(cap, 255)``,
    then 256, 272, ... up to ``cap`` in steps of 16, plus
    ``max_num_batched_tokens`` when it is ``<= cap``. Returns a new list of
    ints, strictly increasing; its last element is the effective top rung,
    which may be smaller than ``cap`` (a cap of 23 captures up to 16).
    ``"throughput"`` builds the same ladder as ``"balanced"``.

    Raises ValueError naming ``max_num_seqs`` (< 1), ``max_num_batched_tokens``
    (< 1, or below ``max_num_seqs``, which vLLM's scheduler config refuses),
    ``num_speculative_tokens`` (< 0), ``max_capture_size`` (< 1) or
    ``performance_mode`` (not one of ``PERFORMANCE_MODES``); ints only.

    upstream: vllm/config/vllm.py:1597 _set_cudagraph_sizes
    upstream: vllm/config/scheduler.py:273 max_num_batched_tokens
    """
    raise NotImplementedError("default_capture_sizes: the top rung first, then the rungs below it")


def padded_size_table(capture_sizes: Iterable[int]) -> list[int]:
    """The dispatcher's lookup table: ``table[n]`` is the rung a batch of ``n`` tokens uses.

    ``capture_sizes``: a ladder (see ``check_capture_sizes``). Returns a list
    of ``capture_sizes[-1] + 1`` ints: ``table[0] == 0`` and, for
    ``1 <= n <= capture_sizes[-1]``, ``table[n]`` is the smallest size
    ``>= n``. Sizes above the top rung have no entry (they run eager).

    Raises ValueError naming ``capture_sizes`` when it is not a ladder.

    upstream: vllm/v1/cudagraph_dispatcher.py:76 _compute_bs_to_padded_graph_size
    """
    raise NotImplementedError("padded_size_table: walk the gaps between consecutive rungs")


def select_capture_size(n: int, capture_sizes: Iterable[int]) -> int | None:
    """The rung a batch of ``n`` tokens is padded to, or ``None`` when it runs eager.

    ``n``: tokens in the step (int >= 1); ``capture_sizes``: a ladder. Returns
    the smallest size ``>= n`` (``n`` itself when it is a rung), or ``None``
    when ``n`` is above the top rung. Equal to ``padded_size_table(...)[n]``
    wherever the table has an entry.

    Raises ValueError naming ``n`` (< 1, or not an int) or ``capture_sizes``.

    upstream: vllm/v1/cudagraph_dispatcher.py:282 max_size
    """
    raise NotImplementedError("select_capture_size: None above the top rung, else the first rung >= n")


@dataclass(frozen=True)
class TraceWaste:
    """Padding over a trace of steps (given).

    ``steps``: steps in the trace; ``eager_steps``: steps above the top rung
    (no graph, no padding); ``real_rows``: tokens the steps asked for, all
    steps; ``pad_rows``: rows added by padding (``padded - n`` summed over the
    graph steps); ``graphs_used``: the distinct rungs replayed, ascending.
    ``waste`` is ``pad_rows / real_rows``: the one denominator of this lab.
    """

    steps: int
    eager_steps: int
    real_rows: int
    pad_rows: int
    graphs_used: tuple[int, ...]

    @property
    def waste(self) -> float:
        return self.pad_rows / self.real_rows


def trace_waste(batch_sizes: Iterable[int], capture_sizes: Iterable[int]) -> TraceWaste:
    """Replay a trace of per-step token counts against a ladder and count the padding.

    ``batch_sizes``: tokens of each step, in order (ints >= 1, at least one);
    ``capture_sizes``: a ladder. Each step is padded to
    ``select_capture_size(n, capture_sizes)``; a step with no rung runs eager
    and adds ``n`` real rows and no pad rows. Returns a ``TraceWaste``.

    Raises ValueError naming ``batch_sizes`` (empty, or an entry < 1 or not an
    int) or ``capture_sizes``.
    """
    raise NotImplementedError("trace_waste: pad each step with select_capture_size and count")


def _show(sizes: list[int]) -> str:
    """A ladder in one line: the first six rungs, the last two, and the count."""
    if len(sizes) <= 10:
        return f"{len(sizes)} sizes: {sizes}"
    head = ", ".join(map(str, sizes[:6]))
    return f"{len(sizes)} sizes: [{head}, ..., {sizes[-2]}, {sizes[-1]}]"


if __name__ == "__main__":
    ladder = default_capture_sizes(*batch_defaults(22.5, "NVIDIA L4"))
    print("LLM on an L4  ", _show(ladder))
    print("LLM on an H100", _show(default_capture_sizes(*batch_defaults(79.2, "NVIDIA H100 80GB HBM3"))))
    print("max_num_seqs 8", _show(default_capture_sizes(8, 8192)))
    for n in (33, 249, 257, 513):
        print(f"{n} tokens -> {select_capture_size(n, ladder)}")
    t = trace_waste([1, 3, 33, 100, 600], ladder)
    print(f"trace: {t.real_rows} real rows, {t.pad_rows} pad rows, {t.eager_steps} eager step, "
          f"waste {t.waste:.3f} (pad / real)")
