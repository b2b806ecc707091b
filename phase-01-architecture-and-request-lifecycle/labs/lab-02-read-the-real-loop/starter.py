"""Lab 01-02 — read the real engine loop out of vLLM's own log lines.

``run.py`` runs real vLLM (a GPU machine) with debug logging and per-step
iteration logging on. This module reads the log it produces and ties each
line back to the code that printed it, above all one ``Iteration(...)`` line
per ``EngineCore.step``. It also holds the small calculators that predict what
the log must say, so the prediction can be checked on a CPU.

The formats this reader understands, at the pin (see the lab README for the
exact lines):

  every line        vllm/logger.py:22-26 _FORMAT  ("%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s")
  child process     vllm/utils/system_utils.py:209 prefix  ("(EngineCore pid=123) ")
  engine start      vllm/v1/engine/core.py:112-116 logger.info
  KV cache size     vllm/v1/core/kv_cache_utils.py:1733-1738 _report_kv_cache_config
  one step          vllm/v1/engine/core.py:399-423 EngineCore.log_iteration_details
  idle / busy       vllm/v1/engine/core.py:1215, :1227 EngineCoreProc._process_input_queue
  periodic stats    vllm/v1/metrics/loggers.py:223-275 LoggingStatLogger.log
"""
from __future__ import annotations

import re  # noqa: F401  (you will need it)
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LogLine:
    process: str | None  # "EngineCore" when the engine-core child process printed it
    pid: int | None
    level: str
    timestamp: str  # "MM-DD HH:MM:SS", vLLM's date format
    source: str  # "core.py", or "v1/engine/core.py" when the level is DEBUG
    lineno: int
    message: str


@dataclass(frozen=True, slots=True)
class Iteration:
    """One ``EngineCore.step`` that ran the model, as log_iteration_details prints it."""

    index: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (
            self.context_requests,
            self.context_tokens,
            self.generation_requests,
            self.generation_tokens,
        )


@dataclass(slots=True)
class EngineLog:
    version: str | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    iterations: list[Iteration] = field(default_factory=list)
    idle_waits: int = 0  # "EngineCore waiting for work."
    wakeups: int = 0  # "EngineCore loop active."
    stats: list[dict[str, float]] = field(default_factory=list)
    unparsed: int = 0  # lines without vLLM's header (print output, tracebacks, tqdm)


def parse_line(line: str) -> LogLine | None:
    """Split one line of vLLM output into header fields and message; None if not a log line.

    Recipe:
      - Strip ANSI colour codes first (``\x1b[...m``): a terminal run colours
        the level, the time and the process prefix.
      - A line from a child process starts with ``(NAME pid=N) ``
        (vllm/utils/system_utils.py:209); front-end lines do not.
      - Then, possibly after a user-chosen VLLM_LOGGING_PREFIX, comes vLLM's
        format (vllm/logger.py:22-26): ``LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE``.
        LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL.
      - Anything else (print output, tqdm bars, tracebacks, "") returns None.
    One regular expression with named groups does it.
    """
    raise NotImplementedError("parse_line: one regex for vLLM's log header")


def parse_iteration(message: str) -> Iteration | None:
    """The per-step line of EngineCore.log_iteration_details, or None.

    The message is built by "".join at vllm/v1/engine/core.py:407-423:
    ``Iteration(I): A context requests, B context tokens, C generation requests,
    D generation tokens, iteration elapsed time: T ms`` (one line; T has two decimals).
    """
    raise NotImplementedError("parse_iteration: match the Iteration(...) message")


def parse_kv_cache(message: str) -> dict[str, float] | None:
    """The two start-up capacity lines: {"kv_cache_tokens": n} or
    {"max_model_len": n, "max_concurrency": x}; None for any other message.

    Formats (vllm/v1/core/kv_cache_utils.py:1733-1738): "GPU KV cache size: %s tokens"
    and "Maximum concurrency for %s tokens per request: %.2fx", where both %s are
    integers printed with thousands separators ("233,008").
    """
    raise NotImplementedError("parse_kv_cache: two formats, commas in the numbers")


def parse_stats(message: str) -> dict[str, float] | None:
    """The periodic stat line ("Engine 000: Avg prompt throughput: ...") as
    {"engine": 0, "avg_prompt_throughput": ..., "running": ..., ...}; None otherwise.

    Every part is "Name: number[unit]", so the optional parts (Deferred,
    Preemptions, ...) come out too, keyed by their snake_cased names.

    Recipe: match "Engine NNN: " followed by a body starting "Avg prompt throughput: ";
    split the body on ", "; each part is a name, ": ", a number, and an optional
    unit ("tokens/s", "reqs" or "%"). Key = name lower-cased with spaces -> "_".
    Return None if any part does not fit. Format: vllm/v1/metrics/loggers.py:223-275.
    """
    raise NotImplementedError("parse_stats: split the parts, parse name: number[unit]")


def where_from(message: str) -> str | None:
    """Name the upstream code that printed this message, or None if it is not one we track.

    Return exactly one of:
      "EngineCore.step"                       an Iteration(...) line
      "_report_kv_cache_config"               either start-up capacity line
      "EngineCore.__init__"                   "Initializing a V1 LLM engine (v...) with config: ..."
      "EngineCoreProc._process_input_queue"   "EngineCore waiting for work." / "EngineCore loop active."
      "LoggingStatLogger.log"                 "Engine NNN: Avg prompt throughput: ..."
    """
    raise NotImplementedError("where_from: map each message kind to its upstream function")


def read_log(lines: Iterable[str]) -> EngineLog:
    """Fold a whole log into an EngineLog.

    For each line: not a log line -> unparsed += 1. Otherwise, by message:
    an Iteration -> append; a capacity line -> set kv_cache_tokens, or
    max_model_len and max_concurrency; the "Initializing" line -> version
    (the text between "(v" and ")"); the two busy-loop lines -> idle_waits /
    wakeups; a stat line -> append its dict to stats. Ignore everything else.
    """
    raise NotImplementedError("read_log: parse_line, then dispatch on the message")


def expected_iterations(
    num_prompt_tokens: int, max_tokens: int, max_num_batched_tokens: int
) -> list[tuple[int, int, int, int]]:
    """The Iteration lines one lone request must produce, as
    (context requests, context tokens, generation requests, generation tokens).

    A request counts as "context" while it has no output token yet
    (vllm/v1/utils.py:693 compute_iteration_details), so every prefill chunk
    is a context iteration, the last chunk samples token 1, and each of the
    remaining max_tokens - 1 tokens costs one generation iteration.

    Recipe: ValueError naming the parameter unless all three are ints >= 1.
    Cut the prompt into chunks of at most max_num_batched_tokens: one
    (1, chunk, 0, 0) each; then max_tokens - 1 times (0, 0, 1, 1).
    """
    raise NotImplementedError("expected_iterations: prefill chunks, then max_tokens - 1 decodes")


def check_log(
    log: EngineLog, num_prompt_tokens: int, max_tokens: int, max_num_batched_tokens: int
) -> list[str]:
    """Compare a log with the prediction; return one message per disagreement ([] = all good).

    Steps that scheduled nothing are left out of the comparison: after the
    last request finishes, the busy loop steps once more with an empty batch
    because the scheduler still has a finished id to hand to the workers
    (vllm/v1/core/sched/interface.py:185-188 has_requests).
    """
    expected = expected_iterations(num_prompt_tokens, max_tokens, max_num_batched_tokens)
    got = [it.shape for it in log.iterations if it.shape != (0, 0, 0, 0)]
    problems = []
    if len(got) != len(expected):
        problems.append(f"{len(got)} non-empty Iteration lines, expected {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        if g != e:
            problems.append(f"iteration {i}: got {g}, expected {e}")
    indices = [it.index for it in log.iterations]
    if indices and indices != list(range(indices[0], indices[0] + len(indices))):
        problems.append(f"iteration indices are not consecutive: {indices}")
    return problems


def kv_capacity(num_blocks: int, block_size: int, max_model_len: int) -> tuple[int, float]:
    """(tokens, max concurrency) as the two start-up lines report them for a
    full-attention model: a request may need ceil(max_model_len / block_size)
    blocks; concurrency = num_blocks / that; tokens = int(concurrency * max_model_len).

    upstream: vllm/v1/core/kv_cache_utils.py:877 get_max_concurrency_for_kv_cache_config

    ValueError naming the parameter unless all three are ints >= 1.
    """
    raise NotImplementedError("kv_capacity: blocks per request, then concurrency and tokens")


def blocks_for_memory(
    kv_cache_bytes: int,
    num_layers: int,
    num_kv_heads: int,
    head_size: int,
    dtype_bytes: int,
    block_size: int,
) -> int:
    """KV blocks that fit in ``kv_cache_bytes``: one block holds K and V of
    ``block_size`` tokens in every layer.

    upstream: vllm/v1/core/kv_cache_utils.py:935 get_num_blocks

    Recipe: ValueError naming the parameter unless the five sizes are ints >= 1
    and kv_cache_bytes an int >= 0 (bools are not ints here). One layer's block
    (a "page") is 2 * block_size * num_kv_heads * head_size * dtype_bytes bytes;
    the answer is kv_cache_bytes // page // num_layers, as upstream computes it.
    """
    raise NotImplementedError("blocks_for_memory: bytes // page size // layers")


if __name__ == "__main__":
    # The numbers behind the README's illustrative log (OPT-125m: 12 layers,
    # 12 KV heads of size 64, fp16; an assumed 8 GiB left for the KV cache).
    blocks = blocks_for_memory(8 * 2**30, 12, 12, 64, 2, 16)
    tokens, concurrency = kv_capacity(blocks, 16, 256)
    print(f"{blocks} blocks -> GPU KV cache size: {tokens:,} tokens; "
          f"Maximum concurrency for 256 tokens per request: {concurrency:.2f}x")
    for shape in expected_iterations(6, 16, 8192)[:3]:
        print(shape)
