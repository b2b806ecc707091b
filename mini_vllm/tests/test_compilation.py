"""Compilation and CUDA graphs: the config, the ladder, the dispatcher, the split, and equality.

The torch model compiled with ``MiniVllmBackend`` (split at attention, pieces
run as traced) must give exactly the eager model's greedy tokens, under chunked
prefill, prefix caching and preemption, padded to capture sizes or not. On a
CPU the CUDA-graph wrapper calls through; the ``gpu`` test captures and
replays real graphs.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.compilation import (
    BatchDescriptor,
    CompilationConfig,
    CompilationMode,
    CudagraphDispatcher,
    CUDAGraphMode,
    default_capture_sizes,
)
from mini_vllm.engine import LLMEngine
from mini_vllm.sampling_params import SamplingParams

torch = pytest.importorskip("torch")

NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL


# ------------------------------------------------------------------ modes and config
@pytest.mark.parametrize("mode, decode, mixed, piecewise", [
    (NONE, NONE, NONE, False), (PIECEWISE, PIECEWISE, PIECEWISE, True), (FULL, FULL, FULL, False),
    (CUDAGraphMode.FULL_DECODE_ONLY, FULL, NONE, False),
    (CUDAGraphMode.FULL_AND_PIECEWISE, FULL, PIECEWISE, True)])
def test_the_mode_algebra(mode, decode, mixed, piecewise):
    assert (mode.decode_mode(), mode.mixed_mode()) == (decode, mixed)
    assert mode.requires_piecewise_compilation() is piecewise
    assert mode.separate_routine() is (mode.name.startswith("FULL_"))
    assert bool(mode) is (mode != NONE)


def test_has_mode_refuses_a_pair():
    with pytest.raises(ValueError, match="mode must be a runtime mode"):
        PIECEWISE.has_mode(CUDAGraphMode.FULL_AND_PIECEWISE)


@pytest.mark.parametrize("args, n, tail", [
    ((256, 8192), 51, [480, 496, 512]),         # vLLM's LLM defaults below 70 GiB
    ((1024, 16384), 51, [480, 496, 512]),       # and above: the cap is still 512
    ((8, 8192), 5, [4, 8, 16]),                 # cap 2 * 8
    ((3, 8192), 3, [1, 2, 4]),                  # cap 6 is not a rung and not the budget
    ((64, 100), 16, [88, 96, 100]),             # the budget is the cap: appended off-stride
    ((32, 8192, 3), 35, [240, 248, 256]),       # 3 speculative tokens: cap 32 * 4 * 2 = 256
])
def test_the_default_ladder(args, n, tail):
    sizes = default_capture_sizes(*args)
    assert len(sizes) == n and sizes[-3:] == tail and sizes[:3] == [1, 2, 4][:len(sizes[:3])]
    assert sizes == sorted(set(sizes))


def test_config_parses_names_numbers_and_refuses_what_mini_vllm_cannot_run():
    cfg = CompilationConfig.from_any({"mode": 3, "cudagraph_mode": "piecewise"})
    assert (cfg.mode, cfg.cudagraph_mode) == (CompilationMode.VLLM_COMPILE, PIECEWISE)
    assert CompilationConfig.from_any(None).mode == CompilationMode.NONE
    for bad, match in [({"mode": "STOCK_TORCH_COMPILE"}, "mode must be NONE or VLLM_COMPILE"),
                       ({"mode": 7}, "mode must be one of NONE"),
                       ({"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}, "cudagraph_mode must be NONE or PIECEWISE"),
                       ({"cudagraph_mode": "PIECEWISE"}, "PIECEWISE needs mode VLLM_COMPILE"),
                       ({"mode": 3, "backend": "inductor"}, "backend must be 'eager'"),
                       ({"mode": 3, "splitting_ops": []}, "splitting_ops must be"),
                       ({"mode": 3, "cudagraph_capture_sizes": [0, 4]}, "cudagraph_capture_sizes must be"),
                       ({"mode": 3, "max_cudagraph_capture_size": 0}, "max_cudagraph_capture_size must be"),
                       ({"level": 3}, r"unknown keys \['level'\]"),
                       ([3], "compilation_config must be a dict")]:
        with pytest.raises(ValueError, match=match):
            CompilationConfig.from_any(bad)


def test_capture_sizes_resolve_like_vllms():
    pw = {"mode": 3, "cudagraph_mode": "PIECEWISE"}
    assert CompilationConfig.from_any({"mode": 3}).resolve_capture_sizes(256, 8192) == []
    assert len(CompilationConfig.from_any(pw).resolve_capture_sizes(256, 8192)) == 51
    explicit = CompilationConfig.from_any({**pw, "cudagraph_capture_sizes": [16, 4, 4, 64, 1]})
    assert explicit.resolve_capture_sizes(256, 32) == [1, 4, 16]  # sorted, de-duplicated, <= budget
    capped = CompilationConfig.from_any({**pw, "max_cudagraph_capture_size": 20})
    assert capped.resolve_capture_sizes(256, 8192) == [1, 2, 4, 8, 16]


# ------------------------------------------------------------------ the dispatcher
def test_piecewise_keys_are_relaxed_and_batches_pad_up():
    d = CudagraphDispatcher(default_capture_sizes(256, 8192), 256, PIECEWISE)
    assert len(d.keys[PIECEWISE]) == 51 and not d.keys[FULL]
    assert d.dispatch(33) == (PIECEWISE, BatchDescriptor(40))
    assert d.dispatch(33, uniform_decode=True) == (PIECEWISE, BatchDescriptor(40))
    assert d.dispatch(249) == (PIECEWISE, BatchDescriptor(256))
    assert d.dispatch(257) == (PIECEWISE, BatchDescriptor(272))
    assert d.dispatch(512) == (PIECEWISE, BatchDescriptor(512))
    assert d.dispatch(513) == (NONE, BatchDescriptor(513))  # above the ladder: eager
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 1"):
        d.dispatch(0)


def test_full_and_piecewise_keys_as_vllm_builds_them():
    d = CudagraphDispatcher(default_capture_sizes(256, 8192), 256, CUDAGraphMode.FULL_AND_PIECEWISE)
    assert len(d.keys[PIECEWISE]) == 51
    assert len(d.keys[FULL]) == 35  # uniform decodes of up to max_num_seqs = 256 requests
    assert d.dispatch(33, uniform_decode=True) == (FULL, BatchDescriptor(40, 40, True))
    assert d.dispatch(33, uniform_decode=False) == (PIECEWISE, BatchDescriptor(40))
    assert d.dispatch(300, uniform_decode=True) == (PIECEWISE, BatchDescriptor(304))
    off = CudagraphDispatcher([], 256, NONE)
    assert off.dispatch(8) == (NONE, BatchDescriptor(8))


# ------------------------------------------------------------------ the torch model, compiled
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SHARED = list(range(40, 61))
PROMPTS = [{"prompt_token_ids": SHARED + [1, 2, 3]}, {"prompt_token_ids": [200]},
           {"prompt_token_ids": SHARED + [9]}, {"prompt_token_ids": list(range(100, 137))},
           {"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11, 12]}]
COMPILED = {"mode": "VLLM_COMPILE"}
GRAPHS = {"mode": "VLLM_COMPILE", "cudagraph_mode": "PIECEWISE"}


def run(config=None, device="cpu", **kw):
    from mini_vllm.models import get_model

    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 128)
    kw.setdefault("max_num_batched_tokens", 7)
    model = get_model("tiny-random", backend="torch", device=device)
    engine = LLMEngine(model, compilation_config=config, **kw)
    logits, execute = [], engine.model.execute
    engine.model.execute = lambda mi: logits.append(execute(mi)) or logits[-1]
    tokens = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    return tokens, logits, engine


@pytest.fixture(scope="module")
def eager(one_torch_thread):
    return run()


def test_compiled_equals_eager_through_chunks_and_prefix_hits(eager):
    tokens, logits, engine = run(COMPILED)
    assert tokens == eager[0]
    for a, b in zip(logits, eager[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    backend = engine.model.compile_backend
    # 2 layers -> 5 pieces: attention alone in pieces 1 and 3, the rest around them
    assert [(i.submod_name, i.is_splitting_graph) for i in backend.split_items] == [
        ("submod_0", False), ("submod_1", True), ("submod_2", False), ("submod_3", True), ("submod_4", False)]
    # one symbolic graph for every token count >= 2, one more for 1 (Dynamo specializes 0 and 1)
    assert backend.graphs_compiled == 2
    second = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    assert second == eager[0] and sum(s.num_cached_tokens for s in engine.stats) >= 60
    assert all(s.padded_tokens == 0 and s.cudagraph_mode == "NONE" for s in engine.stats)


def test_padding_to_capture_sizes_changes_nothing_but_the_row_count(eager):
    tokens, logits, engine = run(GRAPHS)
    assert tokens == eager[0]
    for a, b in zip(logits, eager[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    # budget 7 -> ladder [1, 2, 4, 7]: a step of 5, 6 or 3 tokens is padded up to 7, 7 or 4
    assert engine.model.dispatcher.capture_sizes == [1, 2, 4, 7]
    ladder = {1: 0, 2: 0, 3: 1, 4: 0, 5: 2, 6: 1, 7: 0}
    for s in engine.stats:
        n = sum(s.num_scheduled_tokens.values())
        assert s.padded_tokens == ladder[n] and s.cudagraph_mode == "PIECEWISE"
    assert any(s.padded_tokens for s in engine.stats)
    # on a CPU the wrappers call the pieces through: 3 non-attention pieces per Dynamo graph
    # (2 graphs: one for 1-token steps), and every step runs the 3 pieces of one of them
    backend = engine.model.compile_backend
    assert len(backend.wrappers) == 3 * backend.graphs_compiled == 6
    assert sum(w.num_eager_calls for w in backend.wrappers) == 3 * len(engine.stats)


def test_preemption_under_compilation_changes_nothing(eager):
    tokens, _, engine = run(GRAPHS, num_blocks=14)
    assert tokens == eager[0] and sum(len(s.preempted) for s in engine.stats) >= 1


def test_enforce_eager_wins_and_the_numpy_model_refuses_compilation():
    engine = LLMEngine("tiny-random", model_backend="torch", compilation_config=GRAPHS, enforce_eager=True)
    cfg = engine.compilation_config
    assert (cfg.mode, cfg.cudagraph_mode) == (CompilationMode.NONE, NONE)
    assert engine.model.compile_backend is None
    with pytest.raises(ValueError, match="compilation_config applies to the torch model"):
        LLMEngine("tiny-random", compilation_config=COMPILED)
    assert LLMEngine("tiny-random", compilation_config={"mode": "NONE"}).compilation_config.mode == 0
    with pytest.raises(ValueError, match="enforce_eager must be True or False"):
        LLMEngine("tiny-random", enforce_eager="yes")


def test_the_attention_op_needs_a_forward_context():
    import mini_vllm.models.torch_backend  # noqa: F401  (registers the op)

    q = torch.zeros(2, 4, 16)
    with pytest.raises(RuntimeError, match="no forward context is set"):
        torch.ops.mini_vllm.unified_attention(q, q[:, :2], q[:, :2], 0)


@pytest.mark.gpu
def test_piecewise_cuda_graphs_replay_and_equal_eager_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    eager_tokens, eager_logits, _ = run(device="cuda")
    tokens, logits, engine = run(GRAPHS, device="cuda")
    assert tokens == eager_tokens
    for a, b in zip(logits, eager_logits, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    wrappers = engine.model.compile_backend.wrappers
    assert len(wrappers) == 3 * engine.model.compile_backend.graphs_compiled
    captured = {key.num_tokens for w in wrappers for key in w.entries}
    assert captured <= {1, 2, 4, 7} and captured
    assert all(w.num_eager_calls == 0 for w in wrappers)
    assert sum(e.num_replays for w in wrappers for e in w.entries.values()) > 0


def test_split_graph_cuts_at_attention_and_keeps_back_to_back_ops_together():
    import torch.fx

    import mini_vllm.models.torch_backend  # noqa: F401  (registers the op)
    from mini_vllm.compilation.backend import split_graph

    def f(q, k, v):
        a = torch.ops.mini_vllm.unified_attention(q * 2, k, v, 0)
        b = torch.ops.mini_vllm.unified_attention(a, k, v, 1)  # right after the first
        return torch.ops.mini_vllm.unified_attention(b + 1, k, v, 2) - 3

    gm = torch.fx.symbolic_trace(f)
    _, items = split_graph(gm, ["mini_vllm::unified_attention"])
    # pieces: [q * 2], [attn 0, attn 1], [+ 1], [attn 2], [- 3]
    assert [i.is_splitting_graph for i in items] == [False, True, False, True, False]
    ops = [[n.target for n in i.graph.graph.nodes if n.op == "call_function"] for i in items]
    assert [len(o) for o in ops] == [1, 2, 1, 1, 1]
