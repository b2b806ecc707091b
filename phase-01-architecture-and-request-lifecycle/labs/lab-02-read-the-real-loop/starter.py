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

    Input: one line as it appears in a captured log, possibly with its newline,
    with ANSI colour codes (a terminal run colours the level, the time and the
    process prefix), with a child process's ``(NAME pid=N) `` prefix
    (vllm/utils/system_utils.py:209) or without one (front-end lines), and
    possibly with a user's VLLM_LOGGING_PREFIX before vLLM's own format
    (vllm/logger.py:22-26): ``LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE``, where
    LEVEL is any of Python's five logging level names.
    Output: a ``LogLine`` with the colours removed, ``pid`` and ``lineno`` as
    ints, ``process`` and ``pid`` None for a front-end line; None for anything
    without that header (print output, tqdm bars, tracebacks, "").
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

    Input: a message (the header already removed). The line is "Engine NNN: "
    and then parts joined by ", ", the first being "Avg prompt throughput";
    each part is a name, ": ", a number and an optional unit ("tokens/s",
    "reqs" or "%"). Format: vllm/v1/metrics/loggers.py:223-275.
    Output: ``{"engine": NNN as an int}`` plus one float per part, keyed by the
    part's name lower-cased with spaces turned into "_"; None when the message
    is not such a line or any one of its parts does not fit.
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

    Input: the lines of a log, in order. Output: an ``EngineLog`` whose fields
    (defined next to the class) summarise them: ``unparsed`` counts the lines
    ``parse_line`` rejects; every Iteration and every stat line is kept, in
    order; the version is the text between "(v" and ")" of the engine-start
    line; log lines of any other kind change nothing.
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

    Output: the lines in the order the engine prints them, for a request alone
    in the engine whose prompt is cut into chunks of at most
    ``max_num_batched_tokens`` tokens (no long-prefill threshold).
    Errors: ValueError naming the parameter unless all three are ints >= 1
    (bools are rejected).
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

    Output: the token count as an int (truncated, as upstream's ``int()`` does)
    and the concurrency as an unrounded float.
    Errors: ValueError naming the parameter unless all three are ints >= 1
    (bools are rejected).
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

    Output: the number of whole blocks (an int >= 0) that fit, every layer
    holding its keys and its values for the block's tokens; a partial block
    does not count.
    Errors: ValueError naming the parameter unless the five sizes are ints >= 1
    and ``kv_cache_bytes`` an int >= 0 (bools are rejected).
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
