"""Lab 05-03 tests: the mode algebra, the downgrades and the dispatcher, as at the pin."""
from __future__ import annotations

import ast
import dataclasses
import enum
import itertools
import pathlib
import sys
import types

import pytest

import course
from course import load_impl

impl = load_impl(__file__)

M = impl.CUDAGraphMode
S = impl.AttentionCGSupport
BD = impl.BatchDescriptor

UPSTREAM = course.UPSTREAM

# The default ladder of `LLM` on a card under 70 GiB (max_num_seqs 256,
# max_num_batched_tokens 8192): cap min(256 * 2, 512, 8192) = 512, so
# [1, 2, 4] (3) + 8, 16, ..., 248 (31) + 256, 272, ..., 512 (17) = 51 sizes.
SIZES = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
# The 35 sizes a decode graph can use with 256 one-token requests: those <= 256.
DECODE_SIZES = [s for s in SIZES if s <= 256]

ALL_MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def dispatcher(mode, sizes=SIZES, max_num_seqs=256, num_speculative_tokens=0):
    d = impl.CudagraphDispatcher(sizes, max_num_seqs, num_speculative_tokens)
    d.initialize_cudagraph_keys(mode)
    return d


def resolve(mode, support, **kwargs):
    return impl.resolve_cudagraph_mode(mode, support, **kwargs)


# ---------------------------------------------------------------- the mode algebra


def test_routing_table_of_the_five_modes():
    # mode -> (decode routine, mixed routine, needs piecewise compilation, two routines)
    table = {
        M.NONE: (M.NONE, M.NONE, False, False),
        M.PIECEWISE: (M.PIECEWISE, M.PIECEWISE, True, False),
        M.FULL: (M.FULL, M.FULL, False, False),
        M.FULL_DECODE_ONLY: (M.FULL, M.NONE, False, True),
        M.FULL_AND_PIECEWISE: (M.FULL, M.PIECEWISE, True, True),
    }
    for mode, (decode, mixed, piecewise, separate) in table.items():
        assert mode.decode_mode() is decode, mode.name
        assert mode.mixed_mode() is mixed, mode.name
        assert mode.requires_piecewise_compilation() is piecewise, mode.name
        assert mode.separate_routine() is separate, mode.name
    # The composite values are pairs of the plain values: (decode, mixed).
    assert M.FULL_DECODE_ONLY.value == (2, 0) and M.FULL_AND_PIECEWISE.value == (2, 1)


def test_strongest_routine_and_the_two_flags():
    # mode -> (max_cudagraph_mode, has_full_cudagraphs, has_piecewise_cudagraphs)
    table = {
        M.NONE: (M.NONE, False, False),
        M.PIECEWISE: (M.PIECEWISE, False, True),
        M.FULL: (M.FULL, True, False),
        M.FULL_DECODE_ONLY: (M.FULL, True, False),
        M.FULL_AND_PIECEWISE: (M.FULL, True, True),
    }
    for mode, (strongest, full, piecewise) in table.items():
        assert mode.max_cudagraph_mode() is strongest, mode.name
        assert mode.has_full_cudagraphs() is full, mode.name
        assert mode.has_piecewise_cudagraphs() is piecewise, mode.name


def test_has_mode_asks_about_runtime_modes_only():
    runtime = [M.NONE, M.PIECEWISE, M.FULL]
    expected = {
        M.NONE: [True, False, False],
        M.PIECEWISE: [False, True, False],
        M.FULL: [False, False, True],
        # FULL_DECODE_ONLY runs mixed batches eagerly: NONE is one of its routines.
        M.FULL_DECODE_ONLY: [True, False, True],
        M.FULL_AND_PIECEWISE: [False, True, True],
    }
    for mode, answers in expected.items():
        assert [mode.has_mode(r) for r in runtime] == answers, mode.name
    for composite in (M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE):
        with pytest.raises(ValueError, match="mode"):
            M.FULL_AND_PIECEWISE.has_mode(composite)


def test_runtime_modes_names_and_truth():
    valid = M.valid_runtime_modes()
    assert valid == frozenset({M.NONE, M.PIECEWISE, M.FULL}) and isinstance(valid, frozenset)
    assert [M[n].is_valid_runtime_mode() for n in ALL_MODES] == [True, True, True, False, False]
    assert [str(M[n]) for n in ALL_MODES] == ALL_MODES
    assert f"{M.FULL_DECODE_ONLY}" == "FULL_DECODE_ONLY"
    # Only NONE is falsy: `if mode:` reads "some graph is used".
    assert [bool(M[n]) for n in ALL_MODES] == [False, True, True, True, True]


# ---------------------------------------------------------------- support and downgrades


def test_weakest_backend_decides_and_a_tie_keeps_the_first_name():
    assert impl.min_cudagraph_support([]) == (S.ALWAYS, None)
    # Nothing is below the starting point ALWAYS: no backend name is recorded.
    assert impl.min_cudagraph_support([("TRITON_ATTN", S.ALWAYS)]) == (S.ALWAYS, None)
    hybrid = [("FLASH_ATTN", S.UNIFORM_BATCH), ("MAMBA", S.UNIFORM_BATCH)]
    assert impl.min_cudagraph_support(hybrid) == (S.UNIFORM_BATCH, "FLASH_ATTN")
    three = [("FLASH_ATTN", S.UNIFORM_BATCH), ("FLASHINFER", S.UNIFORM_SINGLE_TOKEN_DECODE),
             ("LINEAR", S.UNIFORM_SINGLE_TOKEN_DECODE), ("TRITON_ATTN", S.ALWAYS)]
    assert impl.min_cudagraph_support(iter(three)) == (S.UNIFORM_SINGLE_TOKEN_DECODE, "FLASHINFER")
    assert impl.min_cudagraph_support([("A", S.ALWAYS), ("B", S.NEVER)]) == (S.NEVER, "B")
    with pytest.raises(ValueError, match="backends"):
        impl.min_cudagraph_support([("FLASH_ATTN", 2)])


def test_supported_modes_are_kept():
    assert resolve(None, S.NEVER) is M.NONE
    assert resolve(M.NONE, S.NEVER) is M.NONE
    assert resolve(M.FULL, S.ALWAYS) is M.FULL
    assert resolve(M.FULL_AND_PIECEWISE, S.ALWAYS) is M.FULL_AND_PIECEWISE
    assert resolve(M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE) is M.FULL_AND_PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE) is M.FULL_DECODE_ONLY
    assert resolve(M.PIECEWISE, S.NEVER) is M.PIECEWISE
    # Speculative decoding with a backend that captures uniform batches: kept.
    assert resolve(M.FULL_DECODE_ONLY, S.UNIFORM_BATCH, uniform_decode_query_len=4) is M.FULL_DECODE_ONLY
    assert resolve(M.FULL, S.ALWAYS, uniform_decode_query_len=4) is M.FULL


def test_full_on_a_backend_without_mixed_graphs_splits_into_two_routines():
    # FlashAttention 2 declares UNIFORM_BATCH: FULL cannot serve mixed batches.
    assert resolve(M.FULL, S.UNIFORM_BATCH) is M.FULL_AND_PIECEWISE
    assert resolve(M.FULL, S.UNIFORM_SINGLE_TOKEN_DECODE) is M.FULL_AND_PIECEWISE
    # No piecewise split available: mixed batches fall back to eager.
    assert resolve(M.FULL, S.UNIFORM_BATCH, attention_in_splitting_ops=False) is M.FULL_DECODE_ONLY
    # The first check reads the splitting ops only, not the compilation mode.
    assert resolve(M.FULL, S.UNIFORM_BATCH, vllm_compile=False) is M.FULL_AND_PIECEWISE


def test_never_refuses_full_and_downgrades_the_composites():
    with pytest.raises(ValueError, match="min_cg_support"):
        resolve(M.FULL, S.NEVER)
    with pytest.raises(ValueError, match="cudagraph_mode FULL "):
        resolve(M.FULL, S.NEVER, attention_in_splitting_ops=False, backend_name="X")
    assert resolve(M.FULL_AND_PIECEWISE, S.NEVER) is M.PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, S.NEVER) is M.PIECEWISE
    # PIECEWISE needs VLLM_COMPILE and attention compiled piecewise (split or Inductor-partitioned).
    assert resolve(M.FULL_AND_PIECEWISE, S.NEVER, vllm_compile=False) is M.NONE
    assert resolve(M.FULL_AND_PIECEWISE, S.NEVER, attention_in_splitting_ops=False) is M.NONE
    assert resolve(M.FULL_DECODE_ONLY, S.NEVER, attention_in_splitting_ops=False,
                   use_inductor_graph_partition=True) is M.PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, S.NEVER, attention_in_splitting_ops=False,
                   use_inductor_graph_partition=True, vllm_compile=False) is M.NONE


def test_spec_decode_needs_a_uniform_batch_backend():
    # q = 1 + 3 speculative tokens: a "decode" batch has 4 tokens per request.
    usd = S.UNIFORM_SINGLE_TOKEN_DECODE
    assert resolve(M.FULL_DECODE_ONLY, usd, uniform_decode_query_len=4) is M.PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, usd, uniform_decode_query_len=2) is M.PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, usd, uniform_decode_query_len=1) is M.FULL_DECODE_ONLY
    assert resolve(M.FULL_AND_PIECEWISE, usd, uniform_decode_query_len=4) is M.PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, usd, uniform_decode_query_len=4,
                   attention_in_splitting_ops=False) is M.NONE
    # This check reads the splitting ops only: VLLM_COMPILE off changes nothing here.
    assert resolve(M.FULL_DECODE_ONLY, usd, uniform_decode_query_len=4, vllm_compile=False) is M.PIECEWISE
    assert resolve(M.FULL_DECODE_ONLY, usd, uniform_decode_query_len=4, attention_in_splitting_ops=False,
                   use_inductor_graph_partition=True) is M.NONE
    # Two downgrades in a row: FULL -> FULL_AND_PIECEWISE (check 1) -> PIECEWISE (check 3),
    # or without a split FULL -> FULL_DECODE_ONLY -> NONE.
    assert resolve(M.FULL, usd, uniform_decode_query_len=4) is M.PIECEWISE
    assert resolve(M.FULL, usd, uniform_decode_query_len=4, attention_in_splitting_ops=False) is M.NONE
    assert resolve(M.FULL, S.UNIFORM_BATCH, uniform_decode_query_len=4) is M.FULL_AND_PIECEWISE
    with pytest.raises(ValueError, match="uniform_decode_query_len"):
        resolve(M.FULL, S.ALWAYS, uniform_decode_query_len=0)


# ---------------------------------------------------------------- keys


def test_default_keys_are_51_piecewise_and_35_full():
    assert len(SIZES) == 51 and len(DECODE_SIZES) == 35
    assert impl.default_capture_sizes() == SIZES  # the given helper builds the same ladder
    d = dispatcher(M.FULL_AND_PIECEWISE)
    # Mixed routine PIECEWISE: one relaxed key per size (any request count).
    assert d.cudagraph_keys[M.PIECEWISE] == {BD(s) for s in SIZES}
    # Decode routine FULL: sizes that fit 256 one-token requests, num_reqs = size.
    assert d.cudagraph_keys[M.FULL] == {BD(s, s, True) for s in DECODE_SIZES}
    assert (len(d.cudagraph_keys[M.PIECEWISE]), len(d.cudagraph_keys[M.FULL])) == (51, 35)
    assert d.keys_initialized and d.cudagraph_mode is M.FULL_AND_PIECEWISE


def test_keys_of_the_other_modes():
    d = dispatcher(M.NONE)
    assert d.cudagraph_keys == {M.PIECEWISE: set(), M.FULL: set()} and d.keys_initialized
    d = dispatcher(M.PIECEWISE)
    assert d.cudagraph_keys[M.PIECEWISE] == {BD(s) for s in SIZES} and not d.cudagraph_keys[M.FULL]
    # FULL is one routine for every batch: keys keep num_reqs (capped by max_num_seqs), never uniform.
    d = dispatcher(M.FULL)
    assert d.cudagraph_keys[M.FULL] == {BD(s, min(s, 256), False) for s in SIZES}
    assert not d.cudagraph_keys[M.PIECEWISE]
    assert BD(512, 256, False) in d.cudagraph_keys[M.FULL]
    d = dispatcher(M.FULL_DECODE_ONLY)
    assert d.cudagraph_keys[M.FULL] == {BD(s, s, True) for s in DECODE_SIZES}
    assert not d.cudagraph_keys[M.PIECEWISE]


def test_small_max_num_seqs_caps_decode_keys_and_request_counts():
    sizes = [1, 2, 4, 8, 16]  # lab 05's ladder for max_num_seqs = 8 (cap 16)
    assert impl.default_capture_sizes(8) == sizes
    d = dispatcher(M.FULL_AND_PIECEWISE, sizes, max_num_seqs=8)
    assert d.cudagraph_keys[M.FULL] == {BD(1, 1, True), BD(2, 2, True), BD(4, 4, True), BD(8, 8, True)}
    assert d.cudagraph_keys[M.PIECEWISE] == {BD(s) for s in sizes}
    d = dispatcher(M.FULL, sizes, max_num_seqs=8)
    assert BD(16, 8, False) in d.cudagraph_keys[M.FULL]
    # 12 tokens pad to 16; at most 8 requests, whatever the token count.
    assert d.dispatch(12) == (M.FULL, BD(16, 8, False))


def test_spec_decode_keys_count_requests_of_q_tokens():
    # 3 speculative tokens: q = 4. The ladder for 8 requests has cap min(8*4*2, 512) = 64;
    # resolve rounds it to multiples of 4: [4, 8, 16, ..., 64]. Decode sizes: 4..32 (8 * 4).
    sizes = [4, 8, 16, 24, 32, 40, 48, 56, 64]
    d = dispatcher(M.FULL_AND_PIECEWISE, sizes, max_num_seqs=8, num_speculative_tokens=3)
    assert d.uniform_decode_query_len == 4
    assert d.cudagraph_keys[M.FULL] == {BD(4, 1, True), BD(8, 2, True), BD(16, 4, True),
                                        BD(24, 6, True), BD(32, 8, True)}
    assert d.cudagraph_keys[M.PIECEWISE] == {BD(s) for s in sizes}
    # 3 requests x 4 tokens = 12 tokens -> padded 16 = 4 requests of 4.
    mode, desc = d.dispatch(12, uniform_decode=True)
    assert (mode, desc) == (M.FULL, BD(16, 4, True))
    assert type(desc.num_reqs) is int  # 16 // 4, a whole number of requests
    assert d.dispatch(32, uniform_decode=True) == (M.FULL, BD(32, 8, True))
    # 9 requests would be 36 tokens -> 40: more than max_num_seqs decodes, no FULL graph.
    assert d.dispatch(36, uniform_decode=True) == (M.PIECEWISE, BD(40))
    assert d.dispatch(12) == (M.PIECEWISE, BD(16))
    # Sizes below q never become decode keys: the unrounded ladder works the same.
    d = dispatcher(M.FULL_DECODE_ONLY, [1, 2] + sizes, max_num_seqs=8, num_speculative_tokens=3)
    assert {k.num_tokens for k in d.cudagraph_keys[M.FULL]} == {4, 8, 16, 24, 32}
    # FULL (one routine): request counts are not divided by q.
    d = dispatcher(M.FULL, [4, 8, 16], max_num_seqs=8, num_speculative_tokens=3)
    assert d.cudagraph_keys[M.FULL] == {BD(4, 4, False), BD(8, 8, False), BD(16, 8, False)}
    assert d.dispatch(12, uniform_decode=True) == (M.FULL, BD(16, 8, False))


def test_decode_sizes_must_be_multiples_of_q():
    # q = 3: size 4 lies in 3..6 but is not a multiple of 3 (upstream asserts).
    with pytest.raises(ValueError, match="uniform_decode_query_len"):
        dispatcher(M.FULL_AND_PIECEWISE, [1, 2, 4, 8], max_num_seqs=2, num_speculative_tokens=2)
    # q = 4, decode sizes 4 and 8 (<= 2 * 4); 9 uniform tokens pad to 10: not 4k.
    d = dispatcher(M.FULL_AND_PIECEWISE, [4, 8, 10], max_num_seqs=2, num_speculative_tokens=3)
    assert d.cudagraph_keys[M.FULL] == {BD(4, 1, True), BD(8, 2, True)}
    with pytest.raises(ValueError, match="uniform_decode_query_len"):
        d.dispatch(9, uniform_decode=True)
    assert d.dispatch(9) == (M.PIECEWISE, BD(10))
    # Only NONE allowed: the early exit comes before any padding, so nothing is refused.
    assert d.dispatch(9, uniform_decode=True, valid_modes={M.NONE}) == (M.NONE, BD(9))


# ---------------------------------------------------------------- dispatch


def test_33_tokens_pad_to_40():
    d = dispatcher(M.FULL_AND_PIECEWISE)
    # 33 decodes: padded to 40 tokens = 40 requests, the FULL decode graph.
    assert d.dispatch(33, uniform_decode=True) == (M.FULL, BD(40, 40, True))
    # 33 tokens of a mixed batch: the relaxed PIECEWISE key, any number of requests.
    assert d.dispatch(33, uniform_decode=False) == (M.PIECEWISE, BD(40))
    assert d.dispatch(40, uniform_decode=True) == (M.FULL, BD(40, 40, True))
    assert d.dispatch(1, uniform_decode=True) == (M.FULL, BD(1, 1, True))
    assert d.dispatch(3) == (M.PIECEWISE, BD(4))
    assert d.dispatch(249) == (M.PIECEWISE, BD(256))


def test_beyond_the_ladder_runs_eager():
    d = dispatcher(M.FULL_AND_PIECEWISE)
    assert d.dispatch(256, uniform_decode=True) == (M.FULL, BD(256, 256, True))
    # 257 decodes pad to 272, but 272 requests exceed max_num_seqs: no decode graph.
    assert d.dispatch(257, uniform_decode=True) == (M.PIECEWISE, BD(272))
    assert d.dispatch(512) == (M.PIECEWISE, BD(512))
    assert d.dispatch(513) == (M.NONE, BD(513))
    assert d.dispatch(513, uniform_decode=True) == (M.NONE, BD(513))
    assert d.dispatch(0) == (M.NONE, BD(0))


def test_dispatch_in_each_mode():
    d = dispatcher(M.NONE)
    assert d.dispatch(33, uniform_decode=True) == (M.NONE, BD(33))
    d = dispatcher(M.PIECEWISE)
    # One routine: "uniform" is ignored, the relaxed key serves the decode batch.
    assert d.dispatch(33, uniform_decode=True) == (M.PIECEWISE, BD(40))
    d = dispatcher(M.FULL)
    assert d.dispatch(33, uniform_decode=True) == (M.FULL, BD(40, 40, False))
    assert d.dispatch(300) == (M.FULL, BD(304, 256, False))
    d = dispatcher(M.FULL_DECODE_ONLY)
    assert d.dispatch(33, uniform_decode=True) == (M.FULL, BD(40, 40, True))
    assert d.dispatch(33, uniform_decode=False) == (M.NONE, BD(33))
    assert d.dispatch(257, uniform_decode=True) == (M.NONE, BD(257))


def test_dispatch_before_keys_runs_eager():
    d = impl.CudagraphDispatcher(SIZES, 256)
    assert d.dispatch(33, uniform_decode=True) == (M.NONE, BD(33))
    assert d.get_capture_descs() == []


def test_allowed_modes():
    d = dispatcher(M.FULL_AND_PIECEWISE)
    # Cascade attention cannot run in a FULL graph: the PIECEWISE key takes over.
    assert d.dispatch(33, True, invalid_modes={M.FULL}) == (M.PIECEWISE, BD(40))
    assert d.dispatch(33, True, valid_modes={M.PIECEWISE, M.NONE}) == (M.PIECEWISE, BD(40))
    assert d.dispatch(33, True, valid_modes={M.FULL}) == (M.FULL, BD(40, 40, True))
    assert d.dispatch(33, True, valid_modes={M.NONE}) == (M.NONE, BD(33))
    assert d.dispatch(33, True, valid_modes={M.FULL, M.NONE}, invalid_modes={M.FULL}) == (M.NONE, BD(33))
    # An empty valid_modes means "all", as upstream's `or` reads it.
    assert d.dispatch(33, True, valid_modes=set()) == (M.FULL, BD(40, 40, True))
    # A batch above the ladder returns NONE before NONE's absence is noticed.
    assert d.dispatch(600, valid_modes={M.FULL}) == (M.NONE, BD(600))
    with pytest.raises(ValueError, match="valid_modes"):
        d.dispatch(33, False, valid_modes={M.FULL})
    with pytest.raises(ValueError, match="valid_modes"):
        d.dispatch(33, True, invalid_modes={M.NONE, M.PIECEWISE, M.FULL})


def test_capture_order_largest_first_piecewise_then_full():
    d = dispatcher(M.FULL_AND_PIECEWISE)
    descs = d.get_capture_descs()
    assert [mode for mode, _ in descs] == [M.PIECEWISE, M.FULL]
    # The two progress bars of a default startup: 51 and 35 graphs.
    assert descs[0][1] == [BD(s) for s in reversed(SIZES)]
    assert descs[1][1] == [BD(s, s, True) for s in reversed(DECODE_SIZES)]
    assert [m for m, _ in dispatcher(M.FULL_DECODE_ONLY).get_capture_descs()] == [M.FULL]
    assert [m for m, _ in dispatcher(M.PIECEWISE).get_capture_descs()] == [M.PIECEWISE]
    assert dispatcher(M.NONE).get_capture_descs() == []


def test_bad_arguments_raise_value_error_naming_the_parameter():
    d = impl.CudagraphDispatcher(SIZES, 256)
    with pytest.raises(ValueError, match="cudagraph_mode"):
        d.initialize_cudagraph_keys("FULL")
    d.initialize_cudagraph_keys(M.PIECEWISE)
    with pytest.raises(ValueError, match="num_tokens"):
        d.dispatch(-1)
    # The given constructor (sizes are sorted and de-duplicated).
    assert impl.CudagraphDispatcher([8, 1, 8, 4], 4).capture_sizes == [1, 4, 8]
    for kwargs, name in [({"capture_sizes": []}, "capture_sizes"), ({"capture_sizes": [0, 1]}, "capture_sizes"),
                         ({"max_num_seqs": 0}, "max_num_seqs"), ({"num_speculative_tokens": -1},
                                                                 "num_speculative_tokens")]:
        args = {"capture_sizes": [1, 2], "max_num_seqs": 2, **kwargs}
        with pytest.raises(ValueError, match=name):
            impl.CudagraphDispatcher(**args)


# ---------------------------------------------------------------- upstream


def _class_source(path: str, name: str) -> ast.ClassDef:
    tree = ast.parse((UPSTREAM / path).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _exec_class(path: str, name: str, namespace: dict):
    node = _class_source(path, name)
    namespace.setdefault("__name__", __name__)  # dataclasses look the module up in sys.modules
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def _upstream_modes():
    return _exec_class("vllm/config/compilation.py", "CUDAGraphMode", {"enum": enum})


@pytest.mark.upstream
def test_mode_methods_match_upstream():
    up = _upstream_modes()
    methods = {n.name for n in _class_source("vllm/config/compilation.py", "CUDAGraphMode").body
               if isinstance(n, ast.FunctionDef)}
    mine_cls = next(n for n in ast.parse(pathlib.Path(impl.__file__).read_text()).body
                    if isinstance(n, ast.ClassDef) and n.name == "CUDAGraphMode")
    mine = {n.name for n in mine_cls.body if isinstance(n, ast.FunctionDef)}
    assert methods == mine  # a method added at a pin bump shows up here
    assert [m.name for m in up] == [m.name for m in M] == ALL_MODES
    assert {m.name for m in up.valid_runtime_modes()} == {m.name for m in M.valid_runtime_modes()}
    for name in ALL_MODES:
        u, m = up[name], M[name]
        assert u.value == m.value
        for method in ("decode_mode", "mixed_mode", "max_cudagraph_mode"):
            assert getattr(u, method)().name == getattr(m, method)().name, (name, method)
        for method in ("separate_routine", "requires_piecewise_compilation", "has_full_cudagraphs",
                       "has_piecewise_cudagraphs", "is_valid_runtime_mode", "__str__", "__bool__"):
            assert getattr(u, method)() == getattr(m, method)(), (name, method)
        for arg in ALL_MODES:
            if up[arg].separate_routine():
                with pytest.raises(AssertionError):
                    u.has_mode(up[arg])
                with pytest.raises(ValueError):
                    m.has_mode(M[arg])
            else:
                assert u.has_mode(up[arg]) == m.has_mode(M[arg]), (name, arg)


@pytest.mark.upstream
def test_support_values_and_descriptor_fields_match_upstream():
    up = _exec_class("vllm/v1/attention/backend.py", "AttentionCGSupport", {"Enum": enum.Enum})
    assert {m.name: m.value for m in up} == {m.name: m.value for m in S}
    up_bd = _exec_class("vllm/forward_context.py", "BatchDescriptor", {"dataclass": dataclasses.dataclass})
    fields = [(f.name, f.default) for f in dataclasses.fields(up_bd)]
    # Ours are upstream's first three; the last two are the LoRA fields this lab leaves out.
    assert fields[:3] == [(f.name, f.default) for f in dataclasses.fields(BD)]
    assert [f[0] for f in fields[3:]] == ["has_lora", "num_active_loras"]
    assert impl.min_cudagraph_support([("X", S.NEVER)]) == (S.NEVER, "X")


@pytest.fixture
def fake_vllm(monkeypatch):
    """Stub modules for the few `from vllm... import` lines inside upstream's methods."""
    def install(name, **attrs):
        for i in range(1, name.count(".") + 1):
            parent = name.rsplit(".", i)[0]
            if parent not in sys.modules:
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    return install


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (AssertionError, ValueError):
        return "raises"


@pytest.mark.upstream
def test_dispatcher_matches_upstream(fake_vllm):
    up_modes = _upstream_modes()
    up_bd = _exec_class("vllm/forward_context.py", "BatchDescriptor", {"dataclass": dataclasses.dataclass})
    fake_vllm("vllm.compilation.breakable_cudagraph", is_breakable_cudagraph_enabled=lambda: False)
    from collections.abc import Set as AbstractSet
    ns = {"CUDAGraphMode": up_modes, "BatchDescriptor": up_bd, "VllmConfig": object,
          "replace": dataclasses.replace, "product": itertools.product, "AbstractSet": AbstractSet,
          "logger": None, "get_captured_lora_counts": None}
    UpDispatcher = _exec_class("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher", ns)

    def key(desc):
        assert not desc.has_lora and desc.num_active_loras == 0
        return desc.num_tokens, desc.num_reqs, desc.uniform

    configs = [(SIZES, 256, 0), ([1, 2, 4, 8, 16], 8, 0), ([4, 8, 16, 24, 32, 40, 48, 56, 64], 8, 3),
               ([1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], 8, 3), ([2, 3, 6, 9, 12], 3, 2),
               ([5, 7, 100], 50, 0)]
    mode_sets = [(None, None), (None, {"FULL"}), ({"PIECEWISE", "NONE"}, None), ({"FULL"}, None)]
    checked = set()
    for (sizes, seqs, k), name in itertools.product(configs, ALL_MODES):
        cc = types.SimpleNamespace(max_cudagraph_capture_size=max(sizes), cudagraph_capture_sizes=list(sizes),
                                   compile_sizes=[], cudagraph_specialize_lora=True, mode=3, splitting_ops=[],
                                   cudagraph_mode=up_modes[name],
                                   is_attention_compiled_piecewise=lambda: True)
        spec = types.SimpleNamespace(num_speculative_tokens=k) if k else None
        cfg = types.SimpleNamespace(compilation_config=cc, speculative_config=spec, lora_config=None,
                                    scheduler_config=types.SimpleNamespace(max_num_seqs=seqs))
        up = UpDispatcher(cfg)
        up.initialize_cudagraph_keys(up_modes[name], 1 + k)
        mine = impl.CudagraphDispatcher(sizes, seqs, k)
        mine.initialize_cudagraph_keys(M[name])
        for runtime in ("PIECEWISE", "FULL"):
            assert {key(d) for d in up.cudagraph_keys[up_modes[runtime]]} == {
                (d.num_tokens, d.num_reqs, d.uniform) for d in mine.cudagraph_keys[M[runtime]]}, (sizes, name)
        assert [(m.name, [key(d) for d in ds]) for m, ds in up.get_capture_descs()] == [
            (m.name, [(d.num_tokens, d.num_reqs, d.uniform) for d in ds]) for m, ds in mine.get_capture_descs()]
        # Every count up to 40, and each size, its neighbours and the two counts past the ladder.
        counts = sorted(set(range(41)) | {s + d for s in sizes for d in (-1, 0, 1)} | {max(sizes) + 2})
        for n, uniform, (valid, invalid) in itertools.product(counts, (False, True), mode_sets):
            def modes(names, enum_cls):
                return None if names is None else frozenset(enum_cls[x] for x in names)
            want = _outcome(up.dispatch, n, uniform, valid_modes=modes(valid, up_modes),
                            invalid_modes=modes(invalid, up_modes))
            have = _outcome(mine.dispatch, n, uniform, valid_modes=modes(valid, M), invalid_modes=modes(invalid, M))
            if want != "raises":
                want = (want[0].name, key(want[1]))
            if have != "raises":
                have = (have[0].name, (have[1].num_tokens, have[1].num_reqs, have[1].uniform))
            assert have == want, (sizes, seqs, k, name, n, uniform, valid, invalid)
            checked.add(want if want == "raises" else want[0])
    assert checked == {"raises", "NONE", "PIECEWISE", "FULL"}


@pytest.mark.upstream
def test_resolve_matches_upstream(fake_vllm):
    up_modes = _upstream_modes()
    up_support = _exec_class("vllm/v1/attention/backend.py", "AttentionCGSupport", {"Enum": enum.Enum})
    comp_mode = _exec_class("vllm/config/compilation.py", "CompilationMode", {"enum": enum})
    fake_vllm("vllm.v1.attention.backend", AttentionCGSupport=up_support)
    cls = _class_source("vllm/config/compilation.py", "CompilationConfig")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "resolve_cudagraph_mode_and_sizes")
    quiet = types.SimpleNamespace(warning=lambda *a, **k: None)
    ns = {"CUDAGraphMode": up_modes, "CompilationMode": comp_mode, "logger": quiet, "__name__": "up_resolve"}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "compilation.py", "exec"), ns)
    up_resolve = ns["resolve_cudagraph_mode_and_sizes"]
    seen = set()
    for name, support, split, compile_, partition, q in itertools.product(
            [None, *ALL_MODES], [s.name for s in S], (True, False), (True, False), (True, False), (1, 2, 4)):
        cfg = types.SimpleNamespace(
            cudagraph_mode=None if name is None else up_modes[name], use_inductor_graph_partition=partition,
            mode=comp_mode.VLLM_COMPILE if compile_ else comp_mode.NONE,
            splitting_ops_contain_attention=lambda split=split: split,
            adjust_cudagraph_sizes_for_spec_decode=lambda *a: None)
        want = _outcome(up_resolve, cfg, up_support[support], "backend", q)
        have = _outcome(resolve, None if name is None else M[name], S[support], attention_in_splitting_ops=split,
                        vllm_compile=compile_, use_inductor_graph_partition=partition, uniform_decode_query_len=q)
        want = want if want == "raises" else want.name
        have = have if have == "raises" else have.name
        assert have == want, (name, support, split, compile_, partition, q)
        seen.add(want)
    assert seen == {"raises", *ALL_MODES}
