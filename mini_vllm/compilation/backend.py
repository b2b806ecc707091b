"""mini_vllm's torch.compile backend: cut the traced graph at attention, wrap the pieces.

``torch.compile(fn, backend=MiniVllmBackend(...))`` hands this class the FX
graph Dynamo traced from the model's forward (tensor ops, plus one opaque
``mini_vllm::unified_attention`` call per layer). ``split_graph`` cuts it so
each attention call is a piece of its own and every run of ops between two
attention calls is another: for L layers, L attention pieces and L + 1 others.
The non-attention pieces are where CUDA graphs go (``CUDAGraphWrapper``): their
shapes depend only on the token count, while attention's launch depends on the
step's metadata. vLLM's ``VllmBackend`` does the same and then compiles each
piece with Inductor; mini_vllm runs the traced pieces as they are (Inductor's
first compile takes tens of seconds on a small CPU).

upstream: vllm/compilation/backends.py:548 split_graph
upstream: vllm/compilation/backends.py:800 VllmBackend
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from mini_vllm.compilation.config import CompilationConfig, CUDAGraphMode
from mini_vllm.compilation.cuda_graph import CUDAGraphWrapper


@dataclass
class SplitItem:
    submod_name: str
    graph_id: int
    is_splitting_graph: bool  # an attention piece
    graph: torch.fx.GraphModule


def _is_splitting_op(node: torch.fx.Node, splitting_ops: list[str]) -> bool:
    """Dynamo's graph calls an op as a packet (``torch.ops.ns.op``) or an overload (``...default``).

    upstream: vllm/compilation/partition_rules.py:14 should_split
    """
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name in splitting_ops
    if isinstance(target, torch._ops.OpOverload):
        return target.name() in splitting_ops or f"{target.name()}.{target._overloadname}" in splitting_ops
    return False


def split_graph(gm: torch.fx.GraphModule, splitting_ops: list[str]) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Assign every node a piece id, each splitting op alone in its piece, then split in order."""
    piece = 0
    piece_of: dict[torch.fx.Node, int] = {}
    splitting: list[int] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target == operator.getitem and node.args[0].op != "placeholder":
            piece_of[node] = piece_of[node.args[0]]  # keep a tuple and its getitems together
            continue
        if _is_splitting_op(node, splitting_ops):
            piece += 1
            piece_of[node] = piece
            splitting.append(piece)
            # back-to-back splitting ops share one piece: the next one's += 1 lands here again
            piece += -1 if _is_splitting_op(node.next, splitting_ops) else 1
        else:
            piece_of[node] = piece
    # keep_original_order: the attention op writes the KV cache, so no node may move across it
    split_gm = split_module(gm, None, lambda node: piece_of[node], keep_original_order=True)
    items = [SplitItem(name, int(name.removeprefix("submod_")), int(name.removeprefix("submod_")) in splitting,
                       module)
             for name, module in split_gm.named_children() if name.startswith("submod_")]
    return split_gm, sorted(items, key=lambda item: item.graph_id)


class MiniVllmBackend:
    """A torch.compile backend: split at attention; with PIECEWISE graphs, wrap the other pieces."""

    def __init__(self, config: CompilationConfig) -> None:
        self.config = config
        self.graphs_compiled = 0  # Dynamo graphs handed to this backend (recompiles show up here)
        self.split_items: list[SplitItem] = []
        self.wrappers: list[CUDAGraphWrapper] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
        self.graphs_compiled += 1
        split_gm, self.split_items = split_graph(gm, list(self.config.splitting_ops))
        if self.config.cudagraph_mode.requires_piecewise_compilation():
            for item in self.split_items:
                if not item.is_splitting_graph:
                    wrapper = CUDAGraphWrapper(item.graph, CUDAGraphMode.PIECEWISE)
                    self.wrappers.append(wrapper)
                    setattr(split_gm, item.submod_name, wrapper)
        return split_gm
