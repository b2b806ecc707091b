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

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HEADER = re.compile(
    r"^(?:\((?P<process>[^()]+?) pid=(?P<pid>\d+)\)\s+)?"
    r".*?"  # an optional VLLM_LOGGING_PREFIX
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<timestamp>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[(?P<source>[^\]]+?):(?P<lineno>\d+)\] "
    r"(?P<message>.*)$"
)
_ITERATION = re.compile(
    r"^Iteration\((?P<index>\d+)\): "
    r"(?P<cr>\d+) context requests, (?P<ct>\d+) context tokens, "
    r"(?P<gr>\d+) generation requests, (?P<gt>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>\d+(?:\.\d+)?) ms$"
)
_KV_SIZE = re.compile(r"^GPU KV cache size: (?P<tokens>[\d,]+) tokens$")
_CONCURRENCY = re.compile(
    r"^Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>\d+(?:\.\d+)?)x$"
)
_VERSION = re.compile(r"^Initializing a V1 LLM engine \(v(?P<version>[^)]*)\) with config: ")
_STATS = re.compile(r"^Engine (?P<engine>\d+): (?P<body>Avg prompt throughput: .*)$")
_STAT_PART = re.compile(r"^(?P<name>[A-Za-z ]+): (?P<value>-?\d+(?:\.\d+)?)(?: ?(?:tokens/s|reqs|%))?$")


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
    """Split one line of vLLM output into header fields and message; None if not a log line."""
    m = _HEADER.match(_ANSI.sub("", line.rstrip("\r\n")))
    if m is None:
        return None
    pid = m.group("pid")
    return LogLine(
        process=m.group("process"),
        pid=int(pid) if pid is not None else None,
        level=m.group("level"),
        timestamp=m.group("timestamp"),
        source=m.group("source"),
        lineno=int(m.group("lineno")),
        message=m.group("message"),
    )


def parse_iteration(message: str) -> Iteration | None:
    """The per-step line of EngineCore.log_iteration_details, or None."""
    m = _ITERATION.match(message)
    if m is None:
        return None
    return Iteration(
        index=int(m.group("index")),
        context_requests=int(m.group("cr")),
        context_tokens=int(m.group("ct")),
        generation_requests=int(m.group("gr")),
        generation_tokens=int(m.group("gt")),
        elapsed_ms=float(m.group("ms")),
    )


def parse_kv_cache(message: str) -> dict[str, float] | None:
    """The two start-up capacity lines: {"kv_cache_tokens": n} or
    {"max_model_len": n, "max_concurrency": x}; None for any other message."""
    if m := _KV_SIZE.match(message):
        return {"kv_cache_tokens": int(m.group("tokens").replace(",", ""))}
    if m := _CONCURRENCY.match(message):
        return {
            "max_model_len": int(m.group("len").replace(",", "")),
            "max_concurrency": float(m.group("x")),
        }
    return None


def parse_stats(message: str) -> dict[str, float] | None:
    """The periodic stat line ("Engine 000: Avg prompt throughput: ...") as
    {"engine": 0, "avg_prompt_throughput": ..., "running": ..., ...}; None otherwise.

    Every part is "Name: number[unit]", so the optional parts (Deferred,
    Preemptions, ...) come out too, keyed by their snake_cased names.
    """
    m = _STATS.match(message)
    if m is None:
        return None
    out: dict[str, float] = {"engine": int(m.group("engine"))}
    for part in m.group("body").split(", "):
        p = _STAT_PART.match(part)
        if p is None:
            return None
        out[p.group("name").strip().lower().replace(" ", "_")] = float(p.group("value"))
    return out


def where_from(message: str) -> str | None:
    """Name the upstream code that printed this message, or None if it is not one we track."""
    if _ITERATION.match(message):
        return "EngineCore.step"  # printed by log_iteration_details around the step's wait
    if _KV_SIZE.match(message) or _CONCURRENCY.match(message):
        return "_report_kv_cache_config"
    if _VERSION.match(message):
        return "EngineCore.__init__"
    if message in ("EngineCore waiting for work.", "EngineCore loop active."):
        return "EngineCoreProc._process_input_queue"
    if _STATS.match(message):
        return "LoggingStatLogger.log"
    return None


def read_log(lines: Iterable[str]) -> EngineLog:
    """Fold a whole log into an EngineLog."""
    log = EngineLog()
    for raw in lines:
        line = parse_line(raw)
        if line is None:
            log.unparsed += 1
            continue
        msg = line.message
        if (it := parse_iteration(msg)) is not None:
            log.iterations.append(it)
        elif (kv := parse_kv_cache(msg)) is not None:
            if "kv_cache_tokens" in kv:
                log.kv_cache_tokens = int(kv["kv_cache_tokens"])
            else:
                log.max_model_len = int(kv["max_model_len"])
                log.max_concurrency = kv["max_concurrency"]
        elif (v := _VERSION.match(msg)) is not None:
            log.version = v.group("version")
        elif msg == "EngineCore waiting for work.":
            log.idle_waits += 1
        elif msg == "EngineCore loop active.":
            log.wakeups += 1
        elif (s := parse_stats(msg)) is not None:
            log.stats.append(s)
    return log


def expected_iterations(
    num_prompt_tokens: int, max_tokens: int, max_num_batched_tokens: int
) -> list[tuple[int, int, int, int]]:
    """The Iteration lines one lone request must produce, as
    (context requests, context tokens, generation requests, generation tokens).

    A request counts as "context" while it has no output token yet
    (vllm/v1/utils.py:693 compute_iteration_details), so every prefill chunk
    is a context iteration, the last chunk samples token 1, and each of the
    remaining max_tokens - 1 tokens costs one generation iteration.
    """
    for name, value in (
        ("num_prompt_tokens", num_prompt_tokens),
        ("max_tokens", max_tokens),
        ("max_num_batched_tokens", max_num_batched_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    out = []
    left = num_prompt_tokens
    while left > 0:
        chunk = min(left, max_num_batched_tokens)
        out.append((1, chunk, 0, 0))
        left -= chunk
    out.extend([(0, 0, 1, 1)] * (max_tokens - 1))
    return out


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
    """
    for name, value in (
        ("num_blocks", num_blocks),
        ("block_size", block_size),
        ("max_model_len", max_model_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    blocks_per_request = -(-max_model_len // block_size)
    concurrency = num_blocks / blocks_per_request
    return int(concurrency * max_model_len), concurrency


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
    """
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_size", head_size),
        ("dtype_bytes", dtype_bytes),
        ("block_size", block_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(kv_cache_bytes, bool) or not isinstance(kv_cache_bytes, int) or kv_cache_bytes < 0:
        raise ValueError(f"kv_cache_bytes must be an integer >= 0, got {kv_cache_bytes!r}")
    page_size = 2 * block_size * num_kv_heads * head_size * dtype_bytes  # one layer's block
    return kv_cache_bytes // page_size // num_layers


if __name__ == "__main__":
    # The numbers behind the README's illustrative log (OPT-125m: 12 layers,
    # 12 KV heads of size 64, fp16; an assumed 8 GiB left for the KV cache).
    blocks = blocks_for_memory(8 * 2**30, 12, 12, 64, 2, 16)
    tokens, concurrency = kv_capacity(blocks, 16, 256)
    print(f"{blocks} blocks -> GPU KV cache size: {tokens:,} tokens; "
          f"Maximum concurrency for 256 tokens per request: {concurrency:.2f}x")
    for shape in expected_iterations(6, 16, 8192)[:3]:
        print(shape)
