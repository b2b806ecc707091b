"""Lab 05-06 tests: the piece rules on hand-built FX graphs, then the real compiled model.

The hand-built graphs (no Dynamo, milliseconds) pin each rule of upstream's
``split_graph`` in isolation. Two module fixtures then compile mini_vllm's
tiny-random model (2 layers) once each, dynamic and static, and every test of
the real graph reads their records: Dynamo's first trace costs about 2 s here,
a symbolic graph another 2-3 s, a static one about 0.5 s.
"""
from __future__ import annotations

import operator

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.fx

from course import load_impl

impl = load_impl(__file__)

import mini_vllm.models.torch_backend  # noqa: E402,F401  (registers torch.ops.mini_vllm.unified_attention)
from mini_vllm.compilation.backend import split_graph as mini_vllm_split_graph  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

ATTN = impl.ATTENTION_OP
SIZES = (1, 5, 9)

# ------------------------------------------------------------------ test ops
# Stand-ins for vLLM's two attention ops: a KV-cache write and attention. The
# "cache" is a module-level tensor the write fills and a later op can read
# without any data edge between them, which is exactly the hazard of the real
# KV cache.
CACHE = torch.zeros(4)


@torch.library.custom_op("lab0506::kv_write", mutates_args=())
def kv_write(x: torch.Tensor) -> torch.Tensor:
    CACHE.copy_(x)
    return x.clone()


@torch.library.custom_op("lab0506::attn", mutates_args=())
def attn(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.library.custom_op("lab0506::read_cache", mutates_args=())
def read_cache(x: torch.Tensor) -> torch.Tensor:
    return CACHE + 0 * x


@torch.library.custom_op("lab0506::pair", mutates_args=())
def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, x - 1


KV_WRITE, ATTN_T, READ, PAIR = "lab0506::kv_write", "lab0506::attn", "lab0506::read_cache", "lab0506::pair"
OPS = [KV_WRITE, ATTN_T, PAIR]  # read_cache is an ordinary op


def build(fn) -> torch.fx.GraphModule:
    """A GraphModule from ``fn(graph, x) -> output value``, one placeholder ``x``."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(fn(g, x))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def call(g, target, *args):
    return g.call_function(target, args)


def submod_calls(split_gm) -> list[str]:
    """The order in which the stitching module calls its pieces."""
    return [n.target for n in split_gm.graph.nodes if n.op == "call_module"]


def pieces_by_name(split_gm_items):
    return [(it.submod_name, it.is_splitting_graph, impl.body_names(it.graph)) for it in split_gm_items]


# ------------------------------------------------------------------ is_splitting_op


def test_splitting_op_matches_packets_and_overloads_by_name():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    packet = call(g, torch.ops.mini_vllm.unified_attention, x, x, x, 0)
    overload = call(g, torch.ops.mini_vllm.unified_attention.default, x, x, x, 0)
    add_tensor = call(g, torch.ops.aten.add.Tensor, x, x)
    builtin = call(g, operator.add, x, x)
    method = g.call_method("unified_attention", (x,))
    split = impl.is_splitting_op
    # Dynamo records a custom op as the packet: only the bare name matches it.
    assert split(packet, [ATTN]) is True
    assert split(packet, [ATTN + ".default"]) is False
    assert split(packet, ["mini_vllm::unified"]) is False  # names, not prefixes
    # An overload matches its name and its name + ".default".
    assert split(overload, [ATTN]) is True
    assert split(overload, ["lab0506::x", ATTN + ".default"]) is True
    assert split(add_tensor, ["aten::add.Tensor"]) is True
    assert split(add_tensor, [ATTN]) is False
    # Not a torch op: never a splitting op, whatever its name.
    assert split(builtin, ["aten::add", ATTN]) is False
    assert split(method, [ATTN, "unified_attention"]) is False
    assert split(x, [ATTN, "x"]) is False


# ------------------------------------------------------------------ assign_pieces on hand-built graphs


def layers(g, x, n, ops=(ATTN_T,)):
    """n layers of: add 1, then the splitting op(s) in a row; a final multiply."""
    for _ in range(n):
        x = call(g, operator.add, x, 1)
        for op in ops:
            x = call(g, getattr(torch.ops.lab0506, op.split("::")[1]), x)
    return call(g, operator.mul, x, 3)


def test_each_splitting_op_opens_a_piece_and_closes_it():
    gm = build(lambda g, x: layers(g, x, 2))
    pieces, splitting = impl.assign_pieces(gm, OPS)
    # add | attn | add | attn_1 | mul  ->  0, 1, 2, 3, 4
    assert pieces == {"add": 0, "attn": 1, "add_1": 2, "attn_1": 3, "mul": 4}
    assert splitting == [1, 3]


def test_consecutive_splitting_ops_share_one_piece():
    # vLLM's KV-cache write and attention come back to back: one piece, not two.
    gm = build(lambda g, x: layers(g, x, 2, ops=(KV_WRITE, ATTN_T)))
    pieces, splitting = impl.assign_pieces(gm, OPS)
    assert pieces == {"add": 0, "kv_write": 1, "attn": 1, "add_1": 2, "kv_write_1": 3, "attn_1": 3,
                      "mul": 4}
    assert splitting == [1, 3]
    # Three in a row, and a graph that starts with them: no piece 0 at all.
    gm = build(lambda g, x: call(g, operator.mul, call(g, torch.ops.lab0506.attn, call(
        g, torch.ops.lab0506.attn, call(g, torch.ops.lab0506.kv_write, x))), 3))
    pieces, splitting = impl.assign_pieces(gm, OPS)
    assert pieces == {"kv_write": 1, "attn": 1, "attn_1": 1, "mul": 2} and splitting == [1]
    split_gm, items = impl.split_graph(gm, OPS)
    assert [(it.submod_name, it.graph_id, it.is_splitting_graph) for it in items] == [
        ("submod_1", 1, True), ("submod_2", 2, False)]
    assert torch.equal(split_gm(torch.ones(4)), gm(torch.ones(4)))


def test_a_graph_without_splitting_ops_is_one_piece():
    gm = build(lambda g, x: call(g, operator.mul, call(g, torch.ops.lab0506.read_cache, x), 2))
    pieces, splitting = impl.assign_pieces(gm, OPS)
    assert pieces == {"read_cache": 0, "mul": 0} and splitting == []
    # A splitting op as the very last node: the piece after it stays empty.
    gm = build(lambda g, x: call(g, torch.ops.lab0506.attn, call(g, operator.add, x, 1)))
    assert impl.assign_pieces(gm, OPS) == ({"add": 0, "attn": 1}, [1])


def test_getitem_stays_with_the_tuple_it_reads():
    def fn(g, x):
        parts = g.call_method("split", (x, 2))  # piece 0
        first = call(g, operator.getitem, parts, 0)  # piece 0
        a = call(g, torch.ops.lab0506.attn, first)  # piece 1
        second = call(g, operator.getitem, parts, 1)  # after attention, but with its tuple: 0
        p = call(g, torch.ops.lab0506.pair, a)  # a splitting op returning a tuple: piece 3
        hi = call(g, operator.getitem, p, 0)  # its elements stay in piece 3
        lo = call(g, operator.getitem, p, 1)
        row = call(g, operator.getitem, x, 0)  # getitem on a placeholder: the current piece
        return call(g, operator.add, call(g, operator.add, hi, lo), call(g, operator.add, second, row))

    gm = build(fn)
    pieces, splitting = impl.assign_pieces(gm, OPS)
    assert pieces == {"split": 0, "getitem": 0, "attn": 1, "getitem_1": 0, "pair": 3, "getitem_2": 3,
                      "getitem_3": 3, "getitem_4": 4, "add": 4, "add_1": 4, "add_2": 4}
    assert splitting == [1, 3]
    split_gm, items = impl.split_graph(gm, OPS)
    # The tuple never crosses a piece boundary: the pair piece hands on two tensors.
    # Piece 2 is empty (getitem_1 went back to piece 0), so there is no submod_2.
    assert [it.graph_id for it in items] == [0, 1, 3, 4]
    # The tuple never crosses a piece boundary: the pair piece hands on two tensors.
    assert items[2].submod_name == "submod_3" and [n.target for n in items[2].graph.graph.nodes][1:-1] == [
        torch.ops.lab0506.pair, operator.getitem, operator.getitem]
    x = torch.arange(4.0)
    assert torch.equal(split_gm(x), gm(x))


# ------------------------------------------------------------------ split_graph on hand-built graphs


def test_pieces_run_in_the_original_order_around_the_cache_write():
    # read_cache reads what kv_write wrote but takes only x: no data edge orders them.
    def fn(g, x):
        h = call(g, operator.add, x, 1)
        w = call(g, torch.ops.lab0506.kv_write, h)
        return (w, call(g, torch.ops.lab0506.read_cache, x))

    gm = build(fn)
    split_gm, items = impl.split_graph(gm, OPS)
    assert pieces_by_name(items) == [("submod_0", False, ["add"]), ("submod_1", True, ["kv_write"]),
                                     ("submod_2", False, ["read_cache"])]
    # submod_2 needs only x: ordered by data dependencies alone, it would be called first.
    assert submod_calls(split_gm) == ["submod_0", "submod_1", "submod_2"]
    CACHE.zero_()
    out = split_gm(torch.ones(4))
    # ... and it would read the cache before the write: zeros instead of x + 1 = 2.
    assert torch.equal(out[1], torch.full((4,), 2.0)) and torch.equal(out[0], torch.full((4,), 2.0))


def test_pieces_are_sorted_by_integer_id():
    # 6 attention calls -> 13 pieces; by name, submod_10 would sort before submod_2.
    gm = build(lambda g, x: layers(g, x, 6))
    split_gm, items = impl.split_graph(gm, OPS)
    assert [it.graph_id for it in items] == list(range(13))
    assert [it.submod_name for it in items] == [f"submod_{i}" for i in range(13)]
    assert [it.is_splitting_graph for it in items] == [i % 2 == 1 for i in range(13)]
    assert all(it.graph is getattr(split_gm, it.submod_name) for it in items)
    x = torch.arange(4.0)
    # each layer: (x + 1) * 2, six times, then * 3
    assert torch.equal(split_gm(x), gm(x)) and torch.equal(gm(x), (x * 64 + 126) * 3)


def test_split_at_attention_is_a_backend_that_records():
    gm = build(lambda g, x: layers(g, x, 1))
    log = []
    out = impl.split_at_attention(gm, [torch.ones(4)], log=log, splitting_ops=OPS)
    assert isinstance(out, torch.fx.GraphModule) and submod_calls(out) == ["submod_0", "submod_1", "submod_2"]
    assert len(log) == 1 and log[0].graph is gm and log[0].split is out
    assert [it.is_splitting_graph for it in log[0].items] == [False, True, False]
    # No log: still a backend. The default splitting op is mini_vllm's attention.
    assert submod_calls(impl.split_at_attention(gm, [], splitting_ops=OPS)) == ["submod_0", "submod_1", "submod_2"]
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(call(g, operator.neg, call(g, torch.ops.mini_vllm.unified_attention, x, x, x, 0)))
    attn_gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert submod_calls(impl.split_at_attention(attn_gm, [])) == ["submod_1", "submod_2"]


def test_bad_arguments_are_refused_naming_the_parameter():
    gm = build(lambda g, x: layers(g, x, 1))
    for bad in (ATTN, [], (), ["unified_attention"], [ATTN, 3], None):
        with pytest.raises(ValueError, match="splitting_ops"):
            impl.assign_pieces(gm, bad)
    with pytest.raises(ValueError, match="splitting_ops"):
        impl.split_graph(gm, ATTN)
    with pytest.raises(ValueError, match="gm must be a torch.fx.GraphModule"):
        impl.split_graph(torch.nn.Linear(2, 2), [ATTN])
    model = get_model("tiny-random", backend="torch")
    for bad in (None, 1, "True"):
        with pytest.raises(ValueError, match="dynamic must be True or False"):
            impl.compile_model(model, bad)
    with pytest.raises(ValueError, match="model must have a forward_tokens"):
        impl.compile_model(object(), True)


def test_fullgraph_turns_a_graph_break_into_an_error():
    class Breaks:
        def forward_tokens(self, input_ids, positions):
            y = input_ids + positions
            torch._dynamo.graph_break()
            return y * 2

    fn, log = impl.compile_model(Breaks(), dynamic=False)
    assert log == []  # Dynamo traces on the first call, not before
    with pytest.raises(torch._dynamo.exc.Unsupported):
        fn(torch.ones(3), torch.ones(3))


# ------------------------------------------------------------------ the real model, compiled


@pytest.fixture(scope="module")
def model():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors this small only lose time to a second thread
    m = get_model("tiny-random", backend="torch")
    m.init_kv_cache(num_blocks=8, block_size=4)
    yield m
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def eager_logits(model):
    return {n: impl.run_step(model, None, impl.prefill_input(n)) for n in SIZES}


def compile_and_run(model, dynamic):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    fn, log = impl.compile_model(model, dynamic=dynamic)
    logits = {n: impl.run_step(model, fn, impl.prefill_input(n)) for n in SIZES}
    counters = {k: dict(torch._dynamo.utils.counters[k]) for k in ("graph_break", "stats")}
    return fn, list(log), logits, counters, log


GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": list(range(10, 23))}, {"prompt_token_ids": [7]},
           {"prompt_token_ids": [3, 1, 4, 1, 5, 9]}]


@pytest.fixture(scope="module")
def dynamic_run(model, eager_logits):
    fn, graphs, logits, counters, live_log = compile_and_run(model, True)
    # The engine, eager and then with the compiled forward (budget 5: chunked prefills).
    eager_engine = LLMEngine(model, block_size=4, num_blocks=32, max_num_batched_tokens=5)
    eager_tokens = [list(r.output_token_ids) for r in eager_engine.generate(PROMPTS, GREEDY)]
    engine = LLMEngine(model, block_size=4, num_blocks=32, max_num_batched_tokens=5)
    model._forward_fn = fn
    try:
        compiled_tokens = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    finally:
        model._forward_fn = model.forward_tokens
        model.init_kv_cache(num_blocks=8, block_size=4)
    step_sizes = sorted({sum(s.num_scheduled_tokens.values()) for s in engine.stats})
    return {"log": graphs, "logits": logits, "counters": counters, "eager_tokens": eager_tokens,
            "tokens": compiled_tokens, "graphs_after_engine": len(live_log), "step_sizes": step_sizes}


@pytest.fixture(scope="module")
def static_run(model, eager_logits):
    _, graphs, logits, counters, _ = compile_and_run(model, False)
    return {"log": graphs, "logits": logits, "counters": counters}


def test_dynamic_shapes_give_two_graphs_because_0_and_1_are_specialized(dynamic_run):
    log = dynamic_run["log"]
    # Size 1 comes first: Dynamo never makes a size of 0 or 1 symbolic (a 1 broadcasts
    # differently), so graph 0 is for exactly 1 token. Size 5 fails its guard and
    # gets a symbolic graph guarded by "size >= 2"; size 9 passes that guard.
    assert len(log) == 2
    assert log[0].graph is not log[1].graph
    assert impl.token_dim(log[0].graph) == 1
    assert isinstance(impl.token_dim(log[1].graph), str) and impl.token_dim(log[1].graph).startswith("s")
    assert dynamic_run["counters"]["stats"]["unique_graphs"] == 2


def test_static_shapes_give_one_graph_per_size(static_run):
    log = static_run["log"]
    assert [impl.token_dim(r.graph) for r in log] == [1, 5, 9]
    assert static_run["counters"]["stats"]["unique_graphs"] == 3


def test_no_graph_breaks(dynamic_run, static_run):
    assert dynamic_run["counters"]["graph_break"] == {}
    assert static_run["counters"]["graph_break"] == {}


@pytest.mark.parametrize("run", ["dynamic_run", "static_run"])
def test_compiled_logits_equal_eager(run, request, eager_logits):
    logits = request.getfixturevalue(run)["logits"]
    for n in SIZES:
        assert logits[n].shape == (n, 257)
        np.testing.assert_allclose(logits[n], eager_logits[n], rtol=0, atol=1e-6)


@pytest.mark.parametrize("run", ["dynamic_run", "static_run"])
def test_two_layers_make_five_pieces_with_attention_alone_in_two(run, request):
    for record in request.getfixturevalue(run)["log"]:
        assert [(it.submod_name, it.graph_id, it.is_splitting_graph) for it in record.items] == [
            ("submod_0", 0, False), ("submod_1", 1, True), ("submod_2", 2, False), ("submod_3", 3, True),
            ("submod_4", 4, False)]
        assert submod_calls(record.split) == [f"submod_{i}" for i in range(5)]
        for it in record.items:
            targets = [n.target for n in it.graph.graph.nodes if n.op not in ("placeholder", "output")]
            if it.is_splitting_graph:
                assert targets == [torch.ops.mini_vllm.unified_attention]
            else:
                assert torch.ops.mini_vllm.unified_attention not in targets and targets
        # every node of the traced graph lands in exactly one piece
        assert sum(len(impl.body_names(it.graph)) for it in record.items) == len(impl.body_names(record.graph))


def test_rope_tables_sliced_in_layer_1_stay_in_piece_0(dynamic_run):
    gm = dynamic_run["log"][1].graph
    pieces, splitting = impl.assign_pieces(gm, [ATTN])
    assert splitting == [1, 3] and sorted(set(pieces.values())) == [0, 1, 2, 3, 4]
    # cos[:, None, :] and sin[:, None, :] are getitems of cos and sin (piece 0). Layer 1
    # slices them after the first attention, yet the slices ride with their source.
    trig = [n for n in gm.graph.nodes if n.target in (torch.cos, torch.sin)]
    slices = [n for n in gm.graph.nodes if n.target is operator.getitem and n.args[0] in trig]
    assert len(trig) == 2 and len(slices) == 8  # (cos, sin) x (q, k) x 2 layers
    assert {pieces[n.name] for n in slices} == {0}
    # the embedding lookup is a getitem of a placeholder (the table): ordinary, piece 0
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    assert first.target is operator.getitem and pieces[first.name] == 0


@pytest.mark.parametrize("run", ["dynamic_run", "static_run"])
def test_pieces_equal_mini_vllms_own_split(run, request):
    for record in request.getfixturevalue(run)["log"]:
        _, theirs = mini_vllm_split_graph(record.graph, [ATTN])
        assert pieces_by_name(record.items) == pieces_by_name(theirs)


def test_engine_greedy_tokens_identical_with_the_compiled_forward(dynamic_run):
    assert dynamic_run["tokens"] == dynamic_run["eager_tokens"]
    assert all(len(t) == 6 for t in dynamic_run["tokens"])
    # Steps of 1 (decodes) up to 5 tokens, and not one new Dynamo graph.
    assert dynamic_run["step_sizes"][0] == 1 and dynamic_run["step_sizes"][-1] == 5
    assert dynamic_run["graphs_after_engine"] == 2
