"""Lab 05-01 tests: real launch counts, one recording per padded size, static-buffer replays."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import runpy

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from course import load_impl

impl = load_impl(__file__)

MM, RELU = "aten.mm.default", "aten.relu.default"
SIZES = [1, 2, 4, 8]

_gen = torch.Generator().manual_seed(0)
W1 = torch.randn(4, 8, generator=_gen)
W2 = torch.randn(8, 4, generator=_gen)


def mlp(x):
    """Three launching ops (mm, relu, mm), row by row: the lab's model of a tiny network."""
    return torch.relu(x @ W1) @ W2


def with_views(x):
    """Seven aten ops, four of them views: t, slice, view, unsqueeze launch nothing.

    ``.contiguous()`` of a transposed tensor is a real copy (aten.clone): a launch.
    """
    y = x.t().contiguous()
    return (y[:2] * 2).reshape(-1).unsqueeze(0) + 1


def rows(n, value=None, seed=1):
    if value is not None:
        return torch.full((n, 4), float(value))
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))


def make_runner(fn=mlp, sizes=SIZES):
    counter = impl.LaunchCounter()
    return impl.GraphRunner(fn, sizes, counter), counter


def close(a, b):
    # A padded batch may take another BLAS blocking than the unpadded one, so the real rows
    # agree to rounding, not bit for bit (the same holds for CUDA graphs on a GPU).
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- counting launches


def test_eager_pays_one_launch_per_non_view_op():
    counter = impl.LaunchCounter()
    assert counter.n == 0 and counter.launches == []
    x = rows(5)
    out = impl.run_eager(mlp, x, counter=counter)
    assert torch.equal(out, mlp(x))  # the same ops on the same input: bit for bit
    assert counter.launches == [MM, RELU, MM] and counter.n == 3
    # 7 aten ops, of which t, slice, view and unsqueeze are views: 3 launches
    out = impl.run_eager(with_views, torch.arange(12.0).reshape(3, 4), counter=counter)
    assert torch.equal(out, with_views(torch.arange(12.0).reshape(3, 4)))
    assert counter.launches[3:] == ["aten.clone.default", "aten.mul.Tensor", "aten.add.Tensor"]
    assert counter.n == 6
    # nothing is counted outside the with-block
    mlp(x)
    assert counter.n == 6
    counter.reset()
    assert counter.n == 0 and counter.launches == []
    impl.run_eager(mlp, x, counter=counter)
    assert counter.n == 3


def test_record_counts_one_named_launch():
    counter = impl.LaunchCounter()
    counter.record("replay:8")
    counter.record("replay:8")
    assert counter.launches == ["replay:8", "replay:8"] and counter.n == 2


def test_run_eager_passes_every_argument():
    counter = impl.LaunchCounter()
    out = impl.run_eager(torch.add, torch.ones(2), torch.full((2,), 2.0), counter=counter)
    assert torch.equal(out, torch.full((2,), 3.0)) and counter.launches == ["aten.add.Tensor"]


def test_count_graph_ops_counts_launching_nodes_only():
    # mlp's graph: a placeholder, two get_attr constants (W1, W2), mm, relu, mm, the output
    gm = make_fx(mlp)(rows(8))
    assert len(gm.graph.nodes) == 7
    assert impl.count_graph_ops(gm) == 3
    # with_views' graph: 7 call_function nodes, 4 of them views
    gm = make_fx(with_views)(rows(3))
    assert sum(node.op == "call_function" for node in gm.graph.nodes) == 7
    assert impl.count_graph_ops(gm) == 3
    # only views: nothing to launch
    assert impl.count_graph_ops(make_fx(lambda x: x.t()[1:])(rows(3))) == 0


# ---------------------------------------------------------------- capture and replay


def test_capture_then_replay_is_one_launch():
    runner, counter = make_runner()
    x = rows(8)
    close(runner(x), mlp(x))
    # the capture runs the recording once: its 3 ops are launched
    assert counter.launches == [MM, RELU, MM]
    entry = runner.graphs[8]
    assert (entry.size, entry.num_ops, entry.num_replays) == (8, 3, 0)
    assert isinstance(entry.graph, torch.fx.GraphModule)
    y = rows(8, seed=2)
    close(runner(y), mlp(y))
    # the replay is one launch, whatever the recording holds
    assert counter.launches == [MM, RELU, MM, "replay:8"] and entry.num_replays == 1
    runner(y)
    assert counter.n == 5 and entry.num_replays == 2 and runner.num_captured == 1


@pytest.mark.parametrize("n", range(1, 9))
def test_replay_equals_eager_on_the_real_rows(n):
    runner, _ = make_runner()
    runner(rows(n, value=3))  # capture
    x = rows(n, seed=10 + n)
    out = runner(x)  # replay
    assert out.shape == (n, 4) and out.dtype == torch.float32
    close(out, mlp(x))


def test_replay_reads_the_new_input_from_the_static_buffer():
    runner, _ = make_runner()
    runner(rows(3, value=1))  # recorded on ones, padded to 4 rows
    entry = runner.graphs[4]
    address = entry.static_input.data_ptr()
    out = runner(rows(3, value=5))
    # a runner that did not copy the new rows in would return mlp(ones) again
    close(out, mlp(rows(3, value=5)))
    assert not torch.allclose(out, mlp(rows(3, value=1)))
    # the buffer now holds the new rows and zero padding, at the address it was recorded with
    assert torch.equal(entry.static_input, torch.cat([rows(3, value=5), torch.zeros(1, 4)]))
    assert entry.static_input.data_ptr() == address


def test_pad_rows_of_a_shorter_batch_are_zero_in_the_buffer():
    runner, _ = make_runner()
    runner(rows(7, value=2))  # capture at 8: one pad row
    runner(rows(5, value=9))  # replay: rows 5, 6, 7 are padding now
    expect = torch.cat([rows(5, value=9), torch.zeros(3, 4)])
    assert torch.equal(runner.graphs[8].static_input, expect)


def test_the_runner_owns_its_buffer():
    runner, _ = make_runner()
    x = rows(4, value=1)  # exactly a capture size: nothing to pad
    runner(x)
    assert runner.graphs[4].static_input.data_ptr() != x.data_ptr()
    runner(rows(4, value=5))
    assert torch.equal(x, rows(4, value=1))  # the caller's tensor is never written


def test_batches_5_and_7_reuse_the_graph_of_8():
    runner, counter = make_runner()
    close(runner(rows(5)), mlp(rows(5)))
    close(runner(rows(7, seed=3)), mlp(rows(7, seed=3)))
    assert list(runner.graphs) == [8] and runner.num_captured == 1
    assert counter.launches == [MM, RELU, MM, "replay:8"]


def test_padded_size_is_the_next_capture_size():
    runner, _ = make_runner()
    table = {n: runner.padded_size(n) for n in range(1, 10)}
    assert table == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8, 9: None}
    for n in (1, 3, 4, 8):  # an exact rung is recorded as itself
        runner(rows(n))
    assert sorted(runner.graphs) == [1, 4, 8]


def test_capture_sizes_are_sorted_and_deduplicated():
    runner, _ = make_runner(sizes=[8, 2, 4, 2, 1])
    assert runner.capture_sizes == [1, 2, 4, 8]
    assert runner.padded_size(3) == 4 and runner.padded_size(5) == 8
    runner(rows(3))
    assert list(runner.graphs) == [4]
    runner, _ = make_runner(sizes=iter([16, 3]))  # any iterable
    assert runner.capture_sizes == [3, 16] and runner.padded_size(4) == 16


def test_a_batch_above_the_ladder_runs_eager():
    runner, counter = make_runner()
    x = rows(9)
    out = runner(x)
    assert torch.equal(out, mlp(x))  # unpadded, the very same ops
    assert counter.launches == [MM, RELU, MM]
    assert runner.num_captured == 0 and runner.num_eager_calls == 1
    runner(rows(12))
    assert counter.n == 6 and runner.num_eager_calls == 2 and runner.graphs == {}


def test_python_runs_once_per_recorded_size():
    calls = []

    def traced(x):
        calls.append(x.shape[0])
        return mlp(x)

    runner, _ = make_runner(traced)
    for _ in range(10):
        runner(rows(5))
    assert calls == [8]  # make_fx ran the Python once; nine replays ran the recording only
    runner(rows(2))
    assert calls == [8, 2]
    runner(rows(9))
    runner(rows(9))
    assert calls == [8, 2, 9, 9]  # eager: the Python runs every time
    assert runner.graphs[8].num_replays == 9 and runner.graphs[2].num_replays == 0


def test_graphs_win_when_launches_dominate():
    eager = impl.LaunchCounter()
    for _ in range(100):
        impl.run_eager(mlp, rows(5), counter=eager)
    runner, counter = make_runner()
    for _ in range(100):
        runner(rows(5))
    # 100 x 3 eager; 3 for the capture + 99 replays with a graph
    assert (eager.n, counter.n) == (300, 102)
    assert runner.graphs[8].num_replays == 99


def test_views_do_not_count_in_the_recording():
    runner, counter = make_runner(with_views, sizes=[4])
    x = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(runner(x), with_views(torch.cat([x, torch.zeros(1, 4)]))[:3])
    assert runner.graphs[4].num_ops == 3
    assert counter.launches == ["aten.clone.default", "aten.mul.Tensor", "aten.add.Tensor"]


def test_padding_assumes_rows_are_independent():
    """A function that mixes rows (here: subtract the batch mean) sees the zero pad rows,
    so its graph output differs from eager: why vLLM keeps attention, which mixes
    requests through metadata, outside its piecewise graphs."""
    runner, _ = make_runner(lambda x: x - x.mean(dim=0), sizes=[8])
    x = rows(5)
    padded = torch.cat([x, torch.zeros(3, 4)])
    close(runner(x), (padded - padded.mean(dim=0))[:5])
    assert not torch.allclose(runner(x), x - x.mean(dim=0))


# ---------------------------------------------------------------- pad_rows


def test_pad_rows_appends_zero_rows():
    x = torch.arange(6, dtype=torch.int64).reshape(3, 2)
    out = impl.pad_rows(x, 5)
    assert out.dtype == torch.int64 and out.shape == (5, 2)
    assert torch.equal(out, torch.tensor([[0, 1], [2, 3], [4, 5], [0, 0], [0, 0]]))
    assert torch.equal(x, torch.arange(6).reshape(3, 2))  # input untouched
    assert impl.pad_rows(x, 3) is x  # nothing to pad: no copy
    three_d = impl.pad_rows(torch.ones(1, 2, 3, dtype=torch.float64), 2)
    assert three_d.shape == (2, 2, 3) and three_d.dtype == torch.float64
    assert three_d[1].abs().sum() == 0
    with pytest.raises(ValueError, match="size"):
        impl.pad_rows(x, 2)


# ---------------------------------------------------------------- refusals


def test_a_recorded_size_refuses_other_shapes_and_dtypes():
    runner, counter = make_runner(lambda x: x * 2)
    runner(torch.ones(5, 4))
    entry = runner.graphs[8]
    before = entry.static_input.clone()
    with pytest.raises(ValueError, match="x"):
        runner(torch.ones(6, 3))
    with pytest.raises(ValueError, match="x"):
        runner(torch.ones(6, 4, dtype=torch.float64))
    # refused before touching anything
    assert torch.equal(entry.static_input, before) and entry.num_replays == 0 and counter.n == 1
    # another size is another recording, with its own shape
    assert torch.equal(runner(torch.ones(2, 3, dtype=torch.float64)),
                       torch.full((2, 3), 2.0, dtype=torch.float64))


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"fn": 3}, "fn"),
    ({"capture_sizes": []}, "capture_sizes"),
    ({"capture_sizes": [0, 2]}, "capture_sizes"),
    ({"capture_sizes": [2, True]}, "capture_sizes"),
    ({"capture_sizes": [2.0]}, "capture_sizes"),
    ({"counter": None}, "counter"),
])
def test_runner_rejects_bad_arguments(kwargs, name):
    args = {"fn": mlp, "capture_sizes": SIZES, "counter": impl.LaunchCounter()}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        impl.GraphRunner(**args)


def test_calls_reject_bad_arguments():
    runner, counter = make_runner()
    with pytest.raises(ValueError, match="x"):
        runner(torch.tensor(1.0))
    with pytest.raises(ValueError, match="x"):
        runner(torch.zeros(0, 4))
    with pytest.raises(ValueError, match="n"):
        runner.padded_size(0)
    with pytest.raises(ValueError, match="fn"):
        impl.run_eager("mlp", rows(2), counter=counter)
    with pytest.raises(ValueError, match="counter"):
        impl.run_eager(mlp, rows(2), counter=None)
    assert counter.n == 0 and runner.num_captured == 0


# ---------------------------------------------------------------- mini_vllm's decode step


def tiny_model(num_layers):
    """tiny-random's shape and seeded weights with ``num_layers`` layers, in torch on the CPU."""
    from mini_vllm.models.config import tiny_random_config
    from mini_vllm.models.llama import LlamaForCausalLM, random_weights
    from mini_vllm.models.torch_backend import TorchLlamaForCausalLM

    config = dataclasses.replace(tiny_random_config(), num_hidden_layers=num_layers)
    model = TorchLlamaForCausalLM.from_numpy(LlamaForCausalLM(config, random_weights(config, 0)))
    model.init_kv_cache(num_blocks=80, block_size=4)
    return model


def decode_input(batch, context=6, block_size=4):
    """One decode token per request, each with ``context`` tokens already cached."""
    from mini_vllm.model_input import ModelInput

    blocks = -(-(context + 1) // block_size)
    tables = np.arange(1, 1 + batch * blocks, dtype=np.int64).reshape(batch, blocks)
    idx = np.arange(batch, dtype=np.int64)
    return ModelInput(
        token_ids=idx + 3, positions=np.full(batch, context, dtype=np.int64),
        query_start_loc=np.arange(batch + 1, dtype=np.int64),
        seq_lens=np.full(batch, context + 1, dtype=np.int64), block_tables=tables,
        slot_mapping=tables[:, context // block_size] * block_size + context % block_size,
        logits_indices=idx, block_size=block_size)


def decode_launches(model, batch):
    counter = impl.LaunchCounter()
    with torch.inference_mode():  # as LLMEngine runs it (TorchLlamaForCausalLM.execute)
        impl.run_eager(model.forward, decode_input(batch), counter=counter)
    return counter


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors this small only lose time to a second thread
    yield {layers: tiny_model(layers) for layers in (1, 2, 4, 30)}
    torch.set_num_threads(threads)


def test_mini_vllm_decode_step_launches_are_linear_in_layers_and_flat_in_batch(models):
    # Measured (torch 2.13, CPU): model.forward of a one-token-per-request decode step.
    counts = {layers: decode_launches(models[layers], 1) for layers in (1, 2, 4)}
    assert {layers: c.n for layers, c in counts.items()} == {1: 39, 2: 74, 4: 144}
    # The attention custom op is one launch per layer; what it runs inside is not seen.
    for layers, c in counts.items():
        assert c.launches.count("mini_vllm.unified_attention.default") == layers
    # Three depths fix a line and check it: 35 launches per layer, 4 outside the layers
    # (embedding lookup, RoPE angles, cos, sin).
    per_layer = counts[2].n - counts[1].n
    fixed = counts[1].n - per_layer
    assert (per_layer, fixed) == (35, 4)
    assert counts[4].n == fixed + 4 * per_layer
    # The law predicts SmolLM2's depth, and a 30-layer model of this shape measures it.
    assert decode_launches(models[30], 1).n == fixed + 30 * per_layer == 1054
    # Flat in batch: 4 and 16 requests issue the same kernels, with more rows each.
    assert [decode_launches(models[2], batch).n for batch in (4, 16)] == [74, 74]


def test_the_dtype_cast_hides_behind_a_view_schema(models):
    """``positions.to(float32)`` copies, but inside inference_mode it reaches the counter as
    aten.to.dtype, whose schema may alias its input, so ``is_view`` is True and it is not
    counted. With autograd on it arrives as aten._to_copy: one launch more."""
    counter = impl.LaunchCounter()
    impl.run_eager(models[1].forward, decode_input(1), counter=counter)
    assert counter.n == 40 and counter.launches.count("aten._to_copy.default") == 1
    assert "aten._to_copy.default" not in decode_launches(models[1], 1).launches


# ---------------------------------------------------------------- the script


def test_script_prints_the_readme_numbers():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(impl.__file__, run_name="__main__")
    assert out.getvalue().splitlines() == [
        "one eager call: ['aten.mm.default', 'aten.relu.default', 'aten.mm.default']",
        "100 calls of batch 5: eager 300 launches, graph 102",
        "recorded sizes: [8] ops per graph: 3 replays: 99",
        "after batches 7 and 9: graphs 1 eager calls 1 last launches "
        "['replay:8', 'aten.mm.default', 'aten.relu.default', 'aten.mm.default']",
    ]
