"""Lab 05-06 — split the compiled graph at attention, as vLLM's backend does (your work).

``torch.compile`` runs in two halves. Dynamo executes the model's Python once
with fake tensors and records every tensor operation into an FX graph; then it
hands that graph to a *backend*, any callable ``backend(gm, example_inputs)``
that returns something callable. vLLM's backend (``VllmBackend``) does not
compile the graph whole. It first cuts it at the attention op:

* every attention call becomes a piece of its own (a *splitting* piece);
* every run of operations between two attention calls becomes another piece,
  and so do the run before the first attention and the run after the last.

The pieces between attention ops only ever see tensors whose shapes depend on
the number of tokens in the step, so each can be captured as a CUDA graph per
token count; attention reads per-step metadata (block tables, sequence
lengths), so it runs eagerly between them. That is a PIECEWISE CUDA graph.

You rebuild the split and the backend around it, on mini_vllm's torch model,
whose attention is one opaque custom op,
``torch.ops.mini_vllm.unified_attention(q, k, v, layer_idx)``:

* ``is_splitting_op`` — does this FX node call one of the splitting ops?
* ``assign_pieces`` — node name -> piece id, upstream's rules: a splitting op
  opens a piece of its own, consecutive splitting ops share one, an
  ``operator.getitem`` stays in the piece of the tuple (or tensor) it reads;
* ``split_graph`` — ``split_module(..., keep_original_order=True)`` on those
  ids, and one ``SplitItem`` per piece, in piece order;
* ``split_at_attention`` — the ``torch.compile`` backend: split, record, and
  return the split module for Dynamo to run;
* ``compile_model`` — ``torch.compile`` of the model's ``forward_tokens`` with
  that backend, ``fullgraph=True``, dynamic in the token count or not.

Given (identical in starter.py): ``SplitItem`` and ``CompiledGraph`` (what the
backend records), ``body_names``, ``token_dim``, ``prefill_input``,
``run_step`` and ``summary``.

upstream: vllm/compilation/partition_rules.py:14 should_split
upstream: vllm/compilation/backends.py:548 split_graph
upstream: vllm/compilation/backends.py:1015 VllmBackend.__call__
"""
from __future__ import annotations

import functools  # noqa: F401  (for compile_model)
import operator  # noqa: F401  (operator.getitem, in assign_pieces)
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch._dynamo
import torch.fx
from torch.fx.passes.split_module import split_module  # noqa: F401  (for split_graph)

from mini_vllm.model_input import ModelInput

ATTENTION_OP = "mini_vllm::unified_attention"  # mini_vllm's one splitting op


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


@dataclass
class SplitItem:
    """Given. One piece of a split graph, as upstream's ``SplitItem``.

    ``submod_name`` is the attribute of the split module that runs the piece
    (``"submod_<graph_id>"``), ``is_splitting_graph`` is True for a piece that
    holds splitting ops (attention) and nothing else, ``graph`` the piece
    itself.

    upstream: vllm/compilation/backends.py:407 SplitItem
    """

    submod_name: str
    graph_id: int
    is_splitting_graph: bool
    graph: torch.fx.GraphModule


@dataclass
class CompiledGraph:
    """Given. What the backend saw and made for one Dynamo graph.

    ``graph`` is the FX graph as Dynamo traced it (before the split), ``split``
    the module the backend returned, ``items`` its pieces in piece order.
    """

    graph: torch.fx.GraphModule
    split: torch.fx.GraphModule
    items: list[SplitItem]


def body_names(gm: torch.fx.GraphModule) -> list[str]:
    """Given. Names of the nodes of ``gm`` that compute something, in graph order.

    Placeholders (inputs) and the output node are left out, so for a piece of a
    split graph this is the list of operations the piece runs.
    """
    return [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def token_dim(gm: torch.fx.GraphModule) -> int | str:
    """Given. The token count a Dynamo graph of ``forward_tokens`` was traced for.

    An ``int`` when the graph is specialized to one size, the symbol's name
    (a ``str`` such as ``"s72"``) when the size is symbolic. Read from the
    fake value Dynamo stored on the ``input_ids`` placeholder.
    """
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.target == "L_input_ids_":
            size = node.meta["example_value"].shape[0]
            return size if isinstance(size, int) else str(size)
    raise ValueError("gm: no placeholder for input_ids; is it a Dynamo graph of forward_tokens?")


def prefill_input(num_tokens: int, block_size: int = 4, seed: int = 0) -> ModelInput:
    """Given. One request prefilling ``num_tokens`` random tokens, logits kept for every row.

    Its blocks are ``1, 2, ...`` (block 0 is the null block), so a KV cache of
    ``ceil(num_tokens / block_size) + 1`` blocks holds it. Deterministic for a
    given ``seed``.
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
    ids = np.random.default_rng(seed).integers(0, 256, num_tokens)
    pos = np.arange(num_tokens)
    blocks = np.arange(1, -(-num_tokens // block_size) + 1)
    return ModelInput(token_ids=ids, positions=pos, query_start_loc=np.array([0, num_tokens]),
                      seq_lens=np.array([num_tokens]), block_tables=blocks[None, :],
                      slot_mapping=blocks[pos // block_size] * block_size + pos % block_size,
                      logits_indices=pos.copy(), block_size=block_size)


def run_step(model, forward_fn: Callable | None, model_input: ModelInput) -> np.ndarray:
    """Given. ``model.execute(model_input)`` with ``forward_fn`` in place of its forward pass.

    ``TorchLlamaForCausalLM.forward`` dispatches the step, sets the forward
    context the attention op reads, and calls ``model._forward_fn(ids,
    positions)``; this swaps in ``forward_fn`` (``None``: the eager
    ``forward_tokens``) for one step and puts the old one back.
    """
    before = model._forward_fn
    model._forward_fn = model.forward_tokens if forward_fn is None else forward_fn
    try:
        return model.execute(model_input)
    finally:
        model._forward_fn = before


def summary(log: Sequence[CompiledGraph]) -> list[str]:
    """Given. One line per Dynamo graph: its token count, then its pieces in order.

    A piece reads ``name:N`` (N operations) or ``name:attn`` for a splitting
    piece, e.g. ``graph 0 (tokens=1): submod_0:45 submod_1:attn ...``.
    """
    lines = []
    for i, record in enumerate(log):
        pieces = " ".join(f"{it.submod_name}:{'attn' if it.is_splitting_graph else len(body_names(it.graph))}"
                          for it in record.items)
        lines.append(f"graph {i} (tokens={token_dim(record.graph)}): {pieces}")
    return lines


# --------------------------------------------------------------------------
# Your work
# --------------------------------------------------------------------------


def is_splitting_op(node: torch.fx.Node, splitting_ops: Sequence[str]) -> bool:
    """True when ``node`` calls one of ``splitting_ops`` (upstream's ``should_split``).

    Inputs: an FX node of a Dynamo graph, whose ``target`` can be anything
    (a Python builtin, a torch function, a method name, an op); and the names
    of the splitting ops, as ``"namespace::name"`` or
    ``"namespace::name.overload"``.
    Output: True only for a ``call_function`` node whose target is a torch op:
    an ``OpOverloadPacket`` (``torch.ops.ns.name``, what Dynamo records for a
    custom op) matches its qualified name ``"ns::name"``; an ``OpOverload``
    (``torch.ops.ns.name.default``) matches its ``name()`` or that name
    followed by a dot and its ``_overloadname`` (``"ns::name.default"``).
    Anything else (a method call, ``operator.add``, a placeholder) is False.
    No errors; the node is not modified.
    """
    raise NotImplementedError("is_splitting_op: only call_function nodes whose target is an OpOverloadPacket or OpOverload")


def assign_pieces(gm: torch.fx.GraphModule,
                  splitting_ops: Sequence[str] = (ATTENTION_OP,)) -> tuple[dict[str, int], list[int]]:
    """The piece every node of ``gm`` goes to, as upstream's ``split_graph`` assigns it.

    Inputs: a ``torch.fx.GraphModule`` (a Dynamo graph, or any FX graph), and
    the names of the splitting ops (a non-empty list or tuple of
    ``"namespace::name"`` strings).
    Output: ``(pieces, splitting)``. ``pieces`` maps the name of every node
    except placeholders and the output to an int piece id; ``splitting`` is
    the ascending list of the ids of the pieces that hold splitting ops. Walking
    the nodes in graph order with a counter that starts at 0:

    * a node that is not a splitting op goes to the current piece;
    * a splitting op goes to a new piece (counter + 1); the piece after it is
      new again (counter + 1 once more), unless the very next node is also a
      splitting op, which then joins the same piece (consecutive splitting
      ops, e.g. a KV-cache write followed by attention, stay together);
    * an ``operator.getitem`` whose first argument is not a placeholder goes
      to the piece of that argument, wherever it sits in the graph (a piece
      must never hand a whole tuple to a later one).

    So a graph with L attention calls and ops around each has pieces
    ``0 .. 2L``, the attention ones ``1, 3, ..., 2L - 1``; a graph without
    splitting ops is one piece, 0. ``gm`` is not modified.
    Errors (ValueError naming ``splitting_ops``): a string instead of a list,
    an empty list, an entry without ``"::"``.

    upstream: vllm/compilation/backends.py:548 split_graph
    """
    raise NotImplementedError("assign_pieces: one counter; a splitting op gets counter + 1, and what follows it + 1 again")


def split_graph(gm: torch.fx.GraphModule,
                splitting_ops: Sequence[str] = (ATTENTION_OP,)) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Cut ``gm`` into pieces at the splitting ops; return the stitching module and the pieces.

    Inputs: a ``torch.fx.GraphModule`` and the splitting ops, as in
    ``assign_pieces``.
    Output: ``(split_gm, items)``. ``split_gm`` is what
    ``torch.fx.passes.split_module.split_module`` builds from the ids of
    ``assign_pieces``, called with ``keep_original_order=True``: a module whose
    ``forward`` calls ``submod_0``, ``submod_1``, ... in the order their first
    nodes had in ``gm`` (the attention op writes the KV cache, a side effect
    no data edge shows, so nothing may be reordered around it); it computes
    what ``gm`` computes. ``items`` holds one ``SplitItem`` per
    ``submod_<id>`` child of ``split_gm``, sorted by the integer id (not the
    name: ``submod_10`` comes after ``submod_9``), ``is_splitting_graph`` True
    for the ids ``assign_pieces`` reported as splitting. ``gm`` is not
    modified.
    Errors (ValueError): ``gm`` not a ``torch.fx.GraphModule`` (names ``gm``);
    bad ``splitting_ops`` as in ``assign_pieces``.

    upstream: vllm/compilation/backends.py:548 split_graph
    """
    raise NotImplementedError("split_graph: torch.fx.passes.split_module.split_module with keep_original_order=True")


def split_at_attention(gm: torch.fx.GraphModule, example_inputs: Sequence,
                       log: list[CompiledGraph] | None = None,
                       splitting_ops: Sequence[str] = (ATTENTION_OP,)) -> torch.fx.GraphModule:
    """A ``torch.compile`` backend: split the Dynamo graph at attention and run the pieces as traced.

    Dynamo calls ``backend(gm, example_inputs)`` once per graph it traces (a
    new graph after every recompilation); bind ``log`` (and, for other ops,
    ``splitting_ops``) with ``functools.partial``.
    Inputs: the graph, Dynamo's example inputs (not used here; vLLM reads
    their shapes), ``log`` (a list or None) and the splitting ops.
    Output: the ``split_gm`` of ``split_graph(gm, splitting_ops)``, which Dynamo
    then calls in place of the model's Python; when ``log`` is a list, one
    ``CompiledGraph(gm, split_gm, items)`` is appended to it first. vLLM hands
    each non-splitting piece to Inductor and wraps it for CUDA graphs; here
    the pieces run as they are.
    Errors: those of ``split_graph``.

    upstream: vllm/compilation/backends.py:1171 split_graph
    """
    raise NotImplementedError("split_at_attention: split, append one CompiledGraph to log, return the split module")


def compile_model(model, dynamic: bool) -> tuple[Callable, list[CompiledGraph]]:
    """``torch.compile`` of ``model.forward_tokens`` with ``split_at_attention``.

    Inputs: a model with a ``forward_tokens(input_ids, positions)`` method
    (mini_vllm's ``TorchLlamaForCausalLM``), and ``dynamic``: True marks the
    input sizes symbolic from the first call (one graph serves every token
    count Dynamo does not specialize), False specializes every graph to the
    sizes it was traced with.
    Output: ``(fn, log)``: ``fn`` is ``torch.compile(model.forward_tokens,
    backend=<split_at_attention logging into log>, fullgraph=True,
    dynamic=dynamic)`` (``fullgraph=True``: a graph break raises instead of
    quietly cutting the model into several Dynamo graphs); ``log`` is the list
    the backend appends to, empty until ``fn`` is first called (Dynamo traces
    lazily). Nothing is compiled by this call.
    Errors (ValueError): ``dynamic`` not a bool (names ``dynamic``); ``model``
    without a callable ``forward_tokens`` (names ``model``).
    """
    raise NotImplementedError("compile_model: torch.compile with your backend bound to a fresh log; fullgraph=True")


def main() -> None:
    from mini_vllm.models import get_model

    torch.set_num_threads(1)
    model = get_model("tiny-random", backend="torch")
    model.init_kv_cache(num_blocks=8, block_size=4)
    for dynamic in (True, False):
        torch._dynamo.reset()
        fn, log = compile_model(model, dynamic=dynamic)
        worst = 0.0
        for n in (1, 5, 9):
            step = prefill_input(n)
            worst = max(worst, float(np.abs(run_step(model, fn, step) - run_step(model, None, step)).max()))
        print(f"dynamic={dynamic}: {len(log)} Dynamo graphs for 1, 5, 9 tokens; "
              f"max |compiled - eager| = {worst:.1e}")
        for line in summary(log):
            print("  " + line)


if __name__ == "__main__":
    main()
