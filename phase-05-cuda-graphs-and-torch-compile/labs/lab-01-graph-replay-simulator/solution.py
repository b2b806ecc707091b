"""Lab 05-01 — count the launches, capture once, replay forever (reference solution).

On a GPU every operation PyTorch dispatches in eager mode is one kernel launch
the CPU must issue. A CUDA graph records those launches once and replays the
whole recording with a single call. No CPU can record a CUDA graph, but the
two halves of the idea run anywhere:

* **Counting.** ``LaunchCounter`` is a ``TorchDispatchMode``: every aten
  operation dispatched while it is active passes through it. Operations that
  only reinterpret memory (views: ``t``, ``slice``, ``view``, ``unsqueeze``)
  launch nothing; every other one is counted as one launch.
* **Recording.** ``make_fx`` runs a function once and records the aten
  operations it dispatched as an FX graph: the list a CUDA graph would hold.
  Running that graph later does not execute the function's Python at all,
  just as a replay does not.

``GraphRunner`` puts them together the way vLLM's wrapper and model runner
do. A batch of ``n`` rows is padded up to the next capture size; the first
batch of a size records a graph over a buffer the runner owns (the static
input); every later batch of that size copies its rows into that same buffer
and replays, counted as one launch. A batch above the largest capture size
runs eagerly.

upstream: vllm/compilation/cuda_graph.py:128 CUDAGraphEntry
upstream: vllm/compilation/cuda_graph.py:207 concrete_cudagraph_entries
upstream: vllm/compilation/cuda_graph.py:360 entry.cudagraph.replay
upstream: vllm/v1/worker/gpu_model_runner.py:709 input_ids
upstream: vllm/v1/cudagraph_dispatcher.py:282 max_size
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode


class LaunchCounter(TorchDispatchMode):
    """Counts kernel launches: one per non-view aten operation dispatched inside ``with counter:``.

    ``launches`` is the list of what was counted, in order: the operation's
    name (``str(func)``, e.g. ``"aten.mm.default"``) for a dispatched op, or
    whatever name ``record`` was given. ``n`` is its length. A custom op such
    as ``mini_vllm.unified_attention`` counts once; the operations it runs
    inside are not seen (the mode is not active while an op it handles runs).
    """

    def __init__(self) -> None:
        super().__init__()
        self.launches: list[str] = []
        self.reset()

    @property
    def n(self) -> int:
        """How many launches have been counted since the last ``reset``."""
        return len(self.launches)

    def reset(self) -> None:
        """Forget every launch counted so far (``n`` becomes 0)."""
        self.launches = []

    def record(self, name: str) -> None:
        """Count one launch named ``name`` (a graph replay uses this: no op reveals it)."""
        self.launches.append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """Run ``func`` and count it unless it is a view; return its result unchanged.

        ``func`` is a ``torch._ops.OpOverload``; ``func.is_view`` is True for
        operations whose output aliases an input and launch no kernel.
        """
        if not func.is_view:
            self.record(str(func))
        return func(*args, **(kwargs or {}))


def count_graph_ops(graph_module: torch.fx.GraphModule) -> int:
    """The launches one run of a recorded graph issues: its non-view aten operation nodes.

    Counts the ``call_function`` nodes whose target is a ``torch._ops.OpOverload``
    that is not a view. Placeholders, ``get_attr`` constants and the output
    node are bookkeeping, not launches.
    """
    return sum(
        1
        for node in graph_module.graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and not node.target.is_view
    )


def run_eager(fn: Callable[..., torch.Tensor], *args, counter: LaunchCounter) -> torch.Tensor:
    """Call ``fn(*args)`` once with ``counter`` active and return its result.

    Every non-view operation ``fn`` dispatches adds one launch to ``counter``.
    Raises ValueError naming ``fn`` when it is not callable and ``counter``
    when it is not a ``LaunchCounter``.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(counter, LaunchCounter):
        raise ValueError(f"counter must be a LaunchCounter, got {type(counter).__name__}")
    with counter:
        return fn(*args)


def pad_rows(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` ([n, ...]) followed by ``size - n`` rows of zeros: ``[size, ...]``, same dtype.

    Returns ``x`` itself (no copy) when ``n == size``, a new tensor otherwise.
    Raises ValueError naming ``size`` when ``size < n``.
    """
    n = x.shape[0]
    if size < n:
        raise ValueError(f"size must be >= the {n} rows of x, got {size}")
    if size == n:
        return x
    return torch.cat([x, x.new_zeros((size - n, *x.shape[1:]))])


@dataclasses.dataclass
class GraphEntry:
    """One recorded graph: what vLLM keeps per batch descriptor.

    ``size``: the padded row count it was recorded for; ``static_input``: the
    buffer it was recorded over (owned by the runner, ``[size, ...]``);
    ``graph``: the recorded aten operations; ``num_ops``: the launches one run
    of them issues; ``num_replays``: how often it has been replayed.

    upstream: vllm/compilation/cuda_graph.py:128 CUDAGraphEntry
    """

    size: int
    static_input: torch.Tensor
    graph: torch.fx.GraphModule
    num_ops: int
    num_replays: int = 0


class GraphRunner:
    """Runs ``fn`` on batches of rows: recorded once per capture size, replayed afterwards.

    ``fn`` maps ``[n, ...]`` to ``[n, ...]`` row by row (row ``i`` of the
    output depends only on row ``i`` of the input), so padding with zero rows
    and dropping their outputs changes nothing for the real rows.

    upstream: vllm/compilation/cuda_graph.py:145 CUDAGraphWrapper
    """

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], capture_sizes: Iterable[int],
                 counter: LaunchCounter) -> None:
        """Keep ``fn``, the sorted distinct ``capture_sizes`` and ``counter``; record nothing yet.

        ``capture_sizes``: an iterable of ints >= 1 (bools refused), at least
        one, in any order, duplicates allowed; stored as an ascending list
        without duplicates in ``self.capture_sizes``. ``self.graphs`` starts
        empty (a dict from padded size to ``GraphEntry``) and
        ``self.num_eager_calls`` at 0.

        Raises ValueError naming ``fn`` (not callable), ``capture_sizes``
        (empty, or an entry that is not an int >= 1) or ``counter`` (not a
        ``LaunchCounter``).
        """
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {type(fn).__name__}")
        sizes = list(capture_sizes)
        if not sizes:
            raise ValueError("capture_sizes must hold at least one size, got none")
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 1:
                raise ValueError(f"capture_sizes must be ints >= 1, got {s!r}")
        if not isinstance(counter, LaunchCounter):
            raise ValueError(f"counter must be a LaunchCounter, got {type(counter).__name__}")
        self.fn = fn
        self.capture_sizes = sorted(set(sizes))
        self.counter = counter
        self.graphs: dict[int, GraphEntry] = {}
        self.num_eager_calls = 0

    @property
    def num_captured(self) -> int:
        """How many graphs have been recorded (one per padded size seen)."""
        return len(self.graphs)

    def padded_size(self, n: int) -> int | None:
        """The smallest capture size >= ``n``, or None when ``n`` is above the largest.

        Raises ValueError naming ``n`` when ``n < 1``.

        upstream: vllm/v1/cudagraph_dispatcher.py:76 _compute_bs_to_padded_graph_size
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        i = bisect.bisect_left(self.capture_sizes, n)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def capture(self, padded: torch.Tensor) -> torch.Tensor:
        """Record ``fn`` for ``len(padded)`` rows and run the recording once.

        Copies ``padded`` into a new buffer the runner owns (the static input;
        never the caller's tensor), records ``fn`` on it with ``make_fx``,
        stores ``GraphEntry(size, static_input, graph, num_ops)`` in
        ``self.graphs[size]``, then runs the recorded graph on the static input
        with the counter active (the capture costs ``num_ops`` launches) and
        returns that full ``[size, ...]`` output.
        """
        size = padded.shape[0]
        static_input = padded.clone()  # the runner's own buffer: its address is now frozen
        graph = make_fx(self.fn)(static_input)
        entry = GraphEntry(size, static_input, graph, count_graph_ops(graph))
        self.graphs[size] = entry
        return run_eager(entry.graph, entry.static_input, counter=self.counter)

    def replay(self, padded: torch.Tensor) -> torch.Tensor:
        """Replay the graph recorded for ``len(padded)`` rows on ``padded``'s values.

        Copies ``padded`` into that entry's static input in place (same
        address), runs the recorded graph on the static input with the counter
        NOT active, records one launch named ``f"replay:{size}"``, adds 1 to
        the entry's ``num_replays`` and returns the full ``[size, ...]`` output.
        """
        entry = self.graphs[padded.shape[0]]
        # The recording reads from the buffer it was made with: new values must go *into* it.
        entry.static_input.copy_(padded)
        out = entry.graph(entry.static_input)  # no Python of fn runs, no op is counted
        self.counter.record(f"replay:{entry.size}")
        entry.num_replays += 1
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``fn(x)`` for a batch ``x`` of ``n`` rows, through a graph when one fits.

        Pads ``x`` to ``padded_size(n)``; captures on the first batch of that
        size, replays afterwards; returns only the first ``n`` rows. Above the
        largest capture size, calls ``fn(x)`` through ``run_eager`` (unpadded,
        nothing recorded) and adds 1 to ``num_eager_calls``.

        Raises ValueError naming ``x`` when it has no rows (0-d or ``n == 0``),
        or when a graph already recorded for its padded size was recorded for
        other trailing dimensions or another dtype.
        """
        if x.dim() == 0 or x.shape[0] == 0:
            raise ValueError(f"x must have at least one row, got shape {tuple(x.shape)}")
        n = x.shape[0]
        size = self.padded_size(n)
        if size is None:  # above the ladder: no graph, every op launched from Python
            self.num_eager_calls += 1
            return run_eager(self.fn, x, counter=self.counter)
        padded = pad_rows(x, size)
        entry = self.graphs.get(size)
        if entry is None:
            return self.capture(padded)[:n]
        static = entry.static_input
        if padded.shape[1:] != static.shape[1:] or padded.dtype != static.dtype:
            raise ValueError(
                f"x must match the graph recorded for {size} rows: shape [*, "
                f"{', '.join(map(str, static.shape[1:]))}] and {static.dtype}, got "
                f"{tuple(x.shape)} and {x.dtype}"
            )
        return self.replay(padded)[:n]


if __name__ == "__main__":
    gen = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(4, 8, generator=gen), torch.randn(8, 4, generator=gen)

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w1) @ w2

    eager_counter = LaunchCounter()
    for _ in range(100):
        run_eager(mlp, torch.ones(5, 4), counter=eager_counter)
    counter = LaunchCounter()
    runner = GraphRunner(mlp, [1, 2, 4, 8], counter)
    for _ in range(100):
        runner(torch.ones(5, 4))
    print("one eager call:", eager_counter.launches[:3])
    print(f"100 calls of batch 5: eager {eager_counter.n} launches, graph {counter.n}")
    print("recorded sizes:", sorted(runner.graphs), "ops per graph:", runner.graphs[8].num_ops,
          "replays:", runner.graphs[8].num_replays)
    runner(torch.ones(7, 4))
    runner(torch.ones(9, 4))
    print("after batches 7 and 9: graphs", runner.num_captured,
          "eager calls", runner.num_eager_calls, "last launches", counter.launches[-4:])
