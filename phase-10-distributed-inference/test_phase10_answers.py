"""Every number in Phase 10's exercises, interview answers and cheatsheet, recomputed.

The pages quote these values; if one changes here, the text is wrong. The rules are restated in
a few lines of numpy (shards, the vocabulary mask, the ring and alpha-beta model, the pipeline,
the rank layout, the DP balancer, the DCP placement and LSE merge); the code answers of items 13
and 14 run as written; item 12's gloo program runs in four real processes through
``mini_vllm.distributed.run_in_processes`` (the one world this file starts, a few tenths of a
second). Where mini_vllm has the piece (``pad_vocab_size`` and the head split, once its
``distributed.sharding`` module exists) the answer is checked against it. The tests marked
``upstream`` read the pinned vLLM source; four of them run functions cut out of it with ``ast``
(``pad_vocab_size``, ``get_pp_indices``, ``should_custom_ar``, the balancer's routing) with
stand-ins for ``self``. Link figures and the roofline peaks are the ASSUMPTIONS below, the same
round numbers the pages state, not measurements.
"""

from __future__ import annotations

import ast
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch  # imported once here: the forked gloo workers of item 12 inherit it

import course

UPSTREAM = course.UPSTREAM
KIB, MIB, GIB = 1024, 1024**2, 1024**3

# -- ASSUMPTIONS (stated as such where the pages use them) -----------------------------------
NVLINK = (3e-6, 450e9)          # alpha (s), beta (B/s): the guide's round numbers
ETH10 = (50e-6, 1.25e9)         # 10 Gb Ethernet
HBM = 3.35e12                   # H100 SXM datasheet bandwidth, B/s
FLOPS = 989e12                  # H100 SXM dense bf16 datasheet peak
MEM_UTIL, GPU_GIB = 0.92, 80

# Llama-3.1 shapes
L70 = dict(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, inter=28672, vocab=128256)
L8 = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256)


def n_params(c):
    h, hd = c["hidden"], c["head_dim"]
    attn = h * c["heads"] * hd + 2 * h * c["kv_heads"] * hd + c["heads"] * hd * h
    per_layer = attn + 3 * h * c["inter"] + 2 * h
    return c["layers"] * per_layer + 2 * c["vocab"] * h + h


def ring_bytes(S, n):
    return 2 * (n - 1) / n * S


def ring_time(S, n, link):
    alpha, beta = link
    return 2 * (n - 1) * alpha + ring_bytes(S, n) / beta


def pad_vocab(v, pad_to=64):
    return -(-v // pad_to) * pad_to


def kv_split(num_kv_heads, tp):
    """(KV heads per rank, replicas), QKVParallelLinear's arithmetic."""
    if tp >= num_kv_heads:
        assert tp % num_kv_heads == 0
        return 1, tp // num_kv_heads
    assert num_kv_heads % tp == 0
    return num_kv_heads // tp, 1


def pp_parts(num_layers, pp):
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def rank_groups(world, dp=1, pp=1, pcp=1, tp=1):
    a = np.arange(world).reshape(-1, dp, pp, pcp, tp)
    return {
        "tp": a.reshape(-1, tp).tolist(),
        "pp": np.swapaxes(a, 2, 4).reshape(-1, pp).tolist(),
        "dp": np.swapaxes(a, 1, 4).reshape(-1, dp).tolist(),
        "ep": np.swapaxes(a, 1, 2).reshape(-1, dp * pcp * tp).tolist(),
    }


def custom_ar(nbytes, world, fully_connected, contiguous=True, max_size=8 * MIB):
    """Constructor checks, then should_custom_ar."""
    if world not in (2, 4, 6, 8) or (world > 2 and not fully_connected):
        return False
    if nbytes % 16 or not contiguous:
        return False
    return (world == 2 or fully_connected) and nbytes < max_size


def route(counts, n, start=0, client_count=1, increment=True):
    counts = [list(c) for c in counts]
    out = []
    for _ in range(n):
        best, idx = None, 0
        for i in range(len(counts)):
            j = (start + i) % len(counts)
            score = counts[j][0] * 4 + counts[j][1]
            if best is None or score < best:
                best, idx = score, j
        if increment:
            counts[idx][0] += client_count
        out.append(idx)
    return out, counts


def dcp_rank(t, dcp, interleave=1):
    return (t // interleave) % dcp


def dcp_local_lens(seq_len, dcp, interleave=1):
    """get_dcp_local_seq_lens for one sequence, every rank."""
    base = seq_len // interleave // dcp * interleave
    rem = seq_len - base * dcp
    return [base + min(max(rem - r * interleave, 0), interleave) for r in range(dcp)]


# -- ast helpers -------------------------------------------------------------------------------

def _source(path):
    return (UPSTREAM / path).read_text(encoding="utf-8")


def _func(path, name, ns, cls=None):
    tree = ast.parse(_source(path))
    if cls is not None:
        tree = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    node.returns = None
    for a in node.args.args + node.args.kwonlyargs:
        a.annotation = None
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(UPSTREAM / path), "exec"), ns)
    return ns[name]


# == 1. MLP shards ================================================================================

def test_ex1_mlp_shard_shapes_and_merged_columns():
    h, i = L8["hidden"], L8["inter"]
    rows = []
    for tp in (2, 4, 8):
        n = i // tp
        rows.append(((h, 2 * n), (n, h), 3 * h * i * 2 // tp))
    assert rows == [((4096, 14336), (7168, 4096), 176_160_768),
                    ((4096, 7168), (3584, 4096), 88_080_384),
                    ((4096, 3584), (1792, 4096), 44_040_192)]
    assert [b / MIB for *_, b in rows] == [168, 84, 42]
    n = i // 4
    assert (n * 1, n * 2 - 1) == (3584, 7167)                      # rank 1's gate columns
    assert (i + n, i + 2 * n - 1) == (17920, 21503)                # its up columns, merged index
    assert (2 * i // 4 * 1, 2 * i // 4 * 2 - 1) == (7168, 14335)   # the naive cut: all gate
    assert 14335 < i


# == 2. Collectives per decode step ==============================================================

def test_ex2_collectives_and_bytes():
    assert 2 * 32 + 1 == 65 and 2 * 80 + 1 == 161 and 2 * 2 + 1 == 5
    payload = L8["hidden"] * 2
    assert payload == 8192 and ring_bytes(payload, 4) == 12_288
    assert 65 * ring_bytes(payload, 4) == 798_720
    logits = 3 / 4 * L8["vocab"] * 2
    assert logits == 192_384
    assert round(logits / (logits + 798_720), 2) == 0.19          # "a fifth"


# == 3. KV-head replication, and the opt-1.3b capacity claim ======================================

def test_ex3_kv_head_replication():
    heads, kv, layers, hd = 32, 2, 28, 128
    per_rank_kv, replicas = kv_split(kv, 8)
    assert (heads // 8, per_rank_kv, replicas) == (4, 1, 4)
    assert 5 // replicas == 1                                      # rank 5 loads KV head 1
    q5 = range(5 * 4, 6 * 4)
    assert list(q5) == [20, 21, 22, 23] and all(q // (heads // kv) == 1 for q in q5)
    assert all((r * 4) // 16 == r // replicas for r in range(8))   # every rank's heads are local
    assert 4 * hd + hd + hd == 768
    per_tok = {tp: 2 * layers * kv_split(kv, tp)[0] * hd * 2 for tp in (1, 2, 8)}
    assert per_tok == {1: 28_672, 2: 14_336, 8: 14_336}
    assert 8 * per_tok[8] == 114_688 == 4 * per_tok[1]
    assert kv // 8 == 0                                            # the wrong formula
    assert kv_split(2, 4) == (1, 2)                                # tiny-random at TP = 4


def test_ex3_against_mini_vllm_head_split():
    sharding = pytest.importorskip("mini_vllm.distributed.sharding")
    from dataclasses import replace

    from mini_vllm.models.config import tiny_random_config
    cfg = tiny_random_config()
    s = sharding.head_split(cfg, 3, 4)
    assert (s.num_heads, s.num_kv_heads, s.num_kv_head_replicas, s.kv_start) == (1, 1, 2, 1)
    big = replace(cfg, num_attention_heads=32, num_key_value_heads=2, head_dim=128)
    s5 = sharding.head_split(big, 5, 8)
    assert (s5.num_heads, s5.num_kv_heads, s5.num_kv_head_replicas, s5.q_start, s5.kv_start) == \
        (4, 1, 4, 20, 1)


def test_ex3_opt_capacity():
    per_tok = 24 * 2 * 2048 * 2
    assert per_tok == 196_608 and per_tok // 2 == 98_304
    block = 16 * per_tok // 2
    assert block == 1_572_864 == 1.5 * MIB
    assert round(28_500 * block / GIB, 1) == 41.7
    assert int(24e9 / block) == 15_258
    assert int((0.8 * 24e9 - 1.3e9) / block) == 11_380


# == 4 and 14. Vocabulary padding and the masked embedding ========================================

def vocab_parallel_lookup(ids, E, tp, zero_masked=True):
    """Item 14's answer, as printed."""
    V, d = E.shape
    Vp = -(-V // 64) * 64
    E_pad = np.concatenate([E, np.zeros((Vp - V, d), E.dtype)])
    per = Vp // tp
    out = np.zeros((len(ids), d), E.dtype)
    for r in range(tp):
        start, end = r * per, (r + 1) * per
        shard = E_pad[start:end]
        mask = (ids < start) | (ids >= end)
        local = np.where(mask, 0, ids - start)
        rows = shard[local]
        if zero_masked:
            rows[mask] = 0.0
        out += rows
    return out


IDS = np.array([7, 20000, 50256, 12576])


def test_ex4_vocab_padding_and_local_ids():
    Vp = pad_vocab(50_257)
    assert Vp == 50_304 == 786 * 64 and Vp // 4 == 12_576 and Vp - 50_257 == 47
    per = Vp // 4
    assert [(int(i) // per, int(i) % per) for i in IDS] == [(0, 7), (1, 7424), (3, 12528), (1, 0)]
    assert [r * per for r in range(4)] == [0, 12576, 25152, 37728]
    assert all(Vp % tp == 0 for tp in (1, 2, 4, 8))


def test_ex14_lookup_equals_dense_and_the_bug_adds_row_zeros():
    rng = np.random.default_rng(0)
    E = rng.standard_normal((50_257, 4))
    for tp in (1, 2, 4, 8):
        assert np.array_equal(vocab_parallel_lookup(IDS, E, tp), E[IDS])
    bad = vocab_parallel_lookup(IDS, E, 4, zero_masked=False)
    assert np.allclose(bad[0], E[7] + E[12576] + E[25152] + E[37728])
    assert np.allclose(bad[1], E[0] + E[20000] + E[25152] + E[37728])
    assert not np.allclose(bad, E[IDS])


def test_ex4_against_mini_vllm_pad_vocab_size():
    sharding = pytest.importorskip("mini_vllm.distributed.sharding")
    assert sharding.pad_vocab_size(50_257) == 50_304 and sharding.pad_vocab_size(257) == 320


@pytest.mark.upstream
def test_ex4_upstreams_pad_vocab_size():
    f = _func("vllm/model_executor/layers/vocab_parallel_embedding.py", "pad_vocab_size",
              {"DEFAULT_VOCAB_PADDING_SIZE": 64})
    assert f(50_257) == 50_304 and f(128_256) == 128_256 and f(257) == 320


# == 5. Ring bytes and alpha-beta ==================================================================

def test_ex5_ring_and_alpha_beta():
    assert [ring_bytes(16 * KIB, n) for n in (2, 4, 8)] == [16_384, 24_576, 28_672]
    S1, S64 = 8192 * 2, 64 * 8192 * 2
    assert S64 == MIB
    t = {(k, s): ring_time(s, 8, link) for k, link in (("nv", NVLINK), ("eth", ETH10))
         for s in (S1, S64)}
    assert round(t["nv", S1] * 1e6, 2) == 42.06 and round(161 * t["nv", S1] * 1e3, 2) == 6.77
    assert round(t["nv", S64] * 1e6, 2) == 46.08 and round(161 * t["nv", S64] * 1e3, 2) == 7.42
    assert round(t["eth", S1] * 1e6, 1) == 722.9 and round(161 * t["eth", S1] * 1e3, 1) == 116.4
    assert round(t["eth", S64] * 1e6) == 2168 and round(161 * t["eth", S64] * 1e3, 1) == 349.0
    assert round(ring_bytes(S1, 8) / NVLINK[1] * 1e6, 2) == 0.06
    assert round(ring_bytes(S64, 8) / NVLINK[1] * 1e6, 2) == 4.08
    assert round(ring_bytes(S1, 8) / ETH10[1] * 1e6, 1) == 22.9
    assert round(ring_bytes(S64, 8) / ETH10[1] * 1e6) == 1468
    assert round(42e-6 / t["nv", S1], 3) == 0.998 and round(42e-6 / t["nv", S64], 2) == 0.91
    assert round(t["nv", S64] / t["nv", S1] - 1, 2) == 0.10
    assert round(161 * 14 * 50e-6 * 1e3) == 113


# == 6. Pipeline ==================================================================================

def ticks(p, m):
    return p + m - 1


def bubble(p, m):
    return (p - 1) / (p + m - 1)


def m_for_budget(p, b):
    m = 1
    while bubble(p, m) > b + 1e-12:
        m += 1
    return m


def test_ex6_ticks_bubble_and_split():
    assert ticks(4, 8) == 11 and round(bubble(4, 8), 3) == 0.273
    assert m_for_budget(4, 0.10) == 27 and bubble(4, 27) == pytest.approx(0.10)
    assert m_for_budget(2, 0.05) == 19 and bubble(2, 19) == pytest.approx(0.05)
    assert 3 / 8 == 0.375 and math.ceil(3 / 0.10) == 30          # the (p - 1)/m slip
    assert pp_parts(80, 3) == [27, 27, 26]
    assert pp_parts(30, 4) == [7, 8, 8, 7]
    assert pp_parts(28, 8) == [3, 3, 3, 4, 4, 4, 4, 3]
    # interview Q6 and the guide's example
    assert ticks(4, 12) == 15 and bubble(4, 12) == pytest.approx(0.2)
    assert m_for_budget(8, 0.10) == 63


@pytest.mark.upstream
def test_ex6_upstreams_get_pp_indices():
    envs = SimpleNamespace(VLLM_PP_LAYER_PARTITION=None)
    logger = SimpleNamespace(info=lambda *a, **k: None)
    f = _func("vllm/distributed/utils.py", "get_pp_indices", {"envs": envs, "logger": logger})
    for layers, pp, parts in ((80, 3, [27, 27, 26]), (30, 4, [7, 8, 8, 7]),
                              (28, 8, [3, 3, 3, 4, 4, 4, 4, 3])):
        got = [f(layers, r, pp) for r in range(pp)]
        assert [e - s for s, e in got] == parts


# == 7. Custom all-reduce or NCCL ===================================================================

CASES = {  # name: (bytes, world, fully_connected) -> custom?
    "a": ((64 * 8192 * 2), 8, True, True),
    "b": ((4096 * 2), 4, False, False),
    "c": ((512 * 4096 * 2), 2, False, True),
    "d": ((2048 * 4096 * 2), 2, False, False),
    "e": ((1024 * 4096 * 2), 2, False, False),
    "f": ((4096 * 2), 3, True, False),
    "g": ((4100 * 2), 2, True, False),
}


def test_ex7_dispatch():
    assert CASES["a"][0] == MIB and CASES["c"][0] == 4 * MIB
    assert CASES["d"][0] == 16 * MIB and CASES["e"][0] == 8 * MIB and CASES["g"][0] % 16 == 8
    for name, (nbytes, world, fc, want) in CASES.items():
        assert custom_ar(nbytes, world, fc) is want, name
    assert 8 * MIB // (8192 * 2) == 512
    assert custom_ar(511 * 16 * KIB, 8, True) and not custom_ar(512 * 16 * KIB, 8, True)
    # symmetric memory on, compute capability 9.0: max_size = min(table, 8 MiB)
    table = {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4}
    cap = {w: min(v, 8 * MIB) for w, v in table.items()}
    assert cap == {2: 8 * MIB, 4: 8 * MIB, 6: 512 * KIB, 8: 256 * KIB}
    assert not custom_ar(MIB, 8, True, max_size=cap[8])
    assert custom_ar(8 * 8192 * 2, 8, True, max_size=cap[8]) and 8 * 8192 * 2 == 128 * KIB


class _Inp:
    def __init__(self, nbytes):
        self.n = nbytes

    def numel(self):
        return self.n // 2

    def element_size(self):
        return 2


@pytest.mark.upstream
def test_ex7_upstreams_should_custom_ar():
    path = "vllm/distributed/device_communicators/custom_all_reduce.py"
    f = _func(path, "should_custom_ar", {"is_weak_contiguous": lambda t: True})
    for name, (nbytes, world, fc, want) in CASES.items():
        if name in ("b", "f"):        # disabled at construction: should_custom_ar never asked
            continue
        me = SimpleNamespace(disabled=False, world_size=world, fully_connected=fc, max_size=8 * MIB)
        assert f(me, _Inp(nbytes)) is want, name
    me8 = SimpleNamespace(disabled=False, world_size=8, fully_connected=True, max_size=256 * KIB)
    assert f(me8, _Inp(MIB)) is False and f(me8, _Inp(128 * KIB)) is True
    src = _source(path)
    assert "_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]" in src and "max_size=8192 * 1024," in src
    assert "if world_size > 2 and not fully_connected:" in src
    utils = _source("vllm/distributed/device_communicators/all_reduce_utils.py")
    assert "8: MiB // 4,  # 256 KB" in utils


# == 8. Rank groups, world 8 ========================================================================

def test_ex8_rank_groups_and_output_rank():
    g = rank_groups(8, dp=2, pp=2, tp=2)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["dp"] == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert g["ep"] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    local = 2 * 2 - 2 * 1                                    # world of one replica - TP x PCP
    assert local == 2 and [dp * 4 + local for dp in (0, 1)] == [2, 6]
    node = lambda r: r // 4                                   # noqa: E731
    crosses = {k: [len({node(r) for r in grp}) > 1 for grp in v] for k, v in g.items()}
    assert not any(crosses["tp"]) and not any(crosses["pp"])
    assert all(crosses["dp"]) and all(crosses["ep"])
    # the guide's docstring example and interview numbers
    d = rank_groups(8, pp=4, tp=2)
    assert d["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and d["pp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert 32 - 8 == 24 and 16 - 8 == 8


@pytest.mark.upstream
def test_ex8_upstreams_output_rank():
    f = _func("vllm/v1/executor/multiproc_executor.py", "_get_output_rank", {})
    for world, tp, want in ((4, 2, 2), (32, 8, 24), (16, 8, 8), (2, 2, 0)):
        me = SimpleNamespace(world_size=world, parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, prefill_context_parallel_size=1))
        assert f(me) == want


# == 9. The DP balancer =============================================================================

COUNTS = [[3, 1], [0, 6], [1, 2], [0, 5]]


def test_ex9_balancer():
    chosen, after = route(COUNTS, 4)
    assert chosen == [3, 1, 2, 3] and after == [[3, 1], [1, 6], [2, 2], [2, 5]]
    assert route(COUNTS, 4, increment=False)[0] == [3, 3, 3, 3]
    assert [(4 * c) // 2 for c in range(2)] == [0, 2]
    assert route(COUNTS, 4, start=2, client_count=2)[0] == [3, 2, 1, 3]
    # the guide's check-yourself example and interview Q7
    assert route([[2, 3], [0, 5], [1, 1], [0, 2]], 2)[0] == [3, 1]
    burst = route([[0, 0]] * 4, 8)[0]
    assert sorted(burst.count(e) for e in range(4)) == [2, 2, 2, 2]
    assert set(route([[0, 0]] * 4, 8, increment=False)[0]) == {0}


@pytest.mark.upstream
def test_ex9_upstreams_router():
    f = _func("vllm/v1/engine/core_client.py", "get_core_engine_for_request",
              {"sys": sys, "get_late_interaction_engine_index": lambda *a: None},
              cls="DPLBAsyncMPClient")

    def run(start, cc, n):
        me = SimpleNamespace(lb_engines=[list(c) for c in COUNTS], eng_start_index=start,
                             client_count=cc, core_engines=list(range(4)), reqs_in_flight={})
        req = lambda i: SimpleNamespace(data_parallel_rank=None, pooling_params=None,  # noqa: E731
                                        request_id=str(i))
        return [f(me, req(i)) for i in range(n)]

    assert run(0, 1, 4) == [3, 1, 2, 3]
    assert run(2, 2, 4) == [3, 2, 1, 3]


# == 10. DCP ======================================================================================

def test_ex10_dcp_placement_and_lse_merge():
    assert [dcp_rank(t, 4, 1) for t in (10, 37, 100)] == [2, 1, 0]
    assert [dcp_rank(t, 4, 16) for t in (10, 37, 100)] == [0, 2, 2]
    assert dcp_local_lens(50, 4, 1) == [13, 13, 12, 12]
    assert dcp_local_lens(50, 4, 16) == [16, 16, 16, 2]
    for L in range(1, 200):                      # the closed form equals counting tokens
        for interleave in (1, 16):
            counts = [sum(dcp_rank(t, 4, interleave) == r for t in range(L)) for r in range(4)]
            assert dcp_local_lens(L, 4, interleave) == counts
    w = np.array([1.0, 3.0, 2.0, 2.0])
    v = np.array([4.0, 8.0, 1.0, 2.0])
    parts = []
    for r in range(2):
        idx = [t for t in range(4) if dcp_rank(t, 2, 1) == r]
        parts.append(((w[idx] @ v[idx]) / w[idx].sum(), math.log(w[idx].sum())))
    (o0, l0), (o1, l1) = parts
    assert (o0, o1) == (pytest.approx(2.0), pytest.approx(5.6))
    assert (l0, l1) == (pytest.approx(math.log(3)), pytest.approx(math.log(5)))
    lse = math.log(math.exp(l0) + math.exp(l1))
    merged = o0 * math.exp(l0 - lse) + o1 * math.exp(l1 - lse)
    assert lse == pytest.approx(math.log(8)) and merged == pytest.approx(4.25)
    assert (w @ v) / w.sum() == 4.25 and (o0 + o1) / 2 == pytest.approx(3.8)
    # the guide's check-yourself numbers
    assert dcp_rank(10, 4, 1) == 2 and dcp_rank(10, 4, 16) == 0


@pytest.mark.upstream
def test_ex10_upstreams_local_seq_lens():
    f = _func("vllm/v1/attention/backends/utils.py", "get_dcp_local_seq_lens", {"torch": torch})
    got = f(torch.tensor([50, 50]), 4, None, 1).tolist()
    assert got == [[13, 13, 12, 12], [13, 13, 12, 12]]
    assert f(torch.tensor([50]), 4, None, 16).tolist() == [[16, 16, 16, 2]]


# == 11. The bias on rank 0 =========================================================================

def test_ex11_bias_added_on_every_rank():
    rng = np.random.default_rng(1)
    x, W, b, tp = rng.standard_normal((2, 8)), rng.standard_normal((8, 3)), 0.5, 4
    k = 8 // tp
    right = sum(x[:, r * k:(r + 1) * k] @ W[r * k:(r + 1) * k] + (b if r == 0 else 0) for r in range(tp))
    wrong = sum(x[:, r * k:(r + 1) * k] @ W[r * k:(r + 1) * k] + b for r in range(tp))
    assert np.allclose(right, x @ W + b) and np.allclose(wrong - right, 1.5)


# == 12. The gloo program ===========================================================================

def _check(rank, world, x, W):
    import torch.distributed as dist
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    parts = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([float(rank)]))
    k = W.shape[0] // world
    lo, hi = rank * k, (rank + 1) * k
    y = torch.from_numpy(x[:, lo:hi] @ W[lo:hi])
    dist.all_reduce(y)
    return float(t), [float(p) for p in parts], y.numpy()


def test_ex12_gloo_program_in_four_processes():
    from mini_vllm.distributed import run_in_processes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    W = rng.standard_normal((64, 16)).astype(np.float32)
    results = run_in_processes(4, _check, x, W, timeout=60.0)
    assert len(results) == 4
    for s, gathered, y in results:
        assert s == 6.0 and gathered == [0.0, 1.0, 2.0, 3.0]
        assert y.shape == (3, 16) and np.allclose(y, x @ W, rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(results[0][2], r[2]) for r in results)   # every rank the same sum


# == 13. The TP MLP in numpy ========================================================================

def silu(a):
    return a / (1.0 + np.exp(-a))


def shard_mlp(W_gate, W_up, W_down, rank, tp):
    n = W_gate.shape[1] // tp
    cols = slice(rank * n, (rank + 1) * n)
    gate_up = np.concatenate([W_gate[:, cols], W_up[:, cols]], axis=1)
    return gate_up, W_down[cols, :]


def mlp_tp(x, W_gate, W_up, W_down, tp):
    partials = []
    for r in range(tp):
        gate_up, down = shard_mlp(W_gate, W_up, W_down, r, tp)
        g, u = np.split(x @ gate_up, 2, axis=1)
        partials.append((silu(g) * u) @ down)
    return np.sum(partials, axis=0), 1


def test_ex13_tp_mlp_equals_dense_and_the_naive_cut_does_not():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 16))
    Wg, Wu, Wd = rng.standard_normal((16, 32)), rng.standard_normal((16, 32)), rng.standard_normal((32, 16))
    dense = (silu(x @ Wg) * (x @ Wu)) @ Wd
    for tp in (1, 2, 4):
        y, n = mlp_tp(x, Wg, Wu, Wd, tp)
        assert n == 1 and np.allclose(y, dense, rtol=0, atol=1e-12)
    merged = np.concatenate([Wg, Wu], axis=1)
    naive = 0
    for r, block in enumerate(np.split(merged, 2, axis=1)):
        g, u = np.split(x @ block, 2, axis=1)
        naive = naive + (silu(g) * u) @ Wd[r * 16:(r + 1) * 16]
    assert not np.allclose(naive, dense)
    # an all-reduce after the column layer too: the ranks' slices are different columns
    g0 = np.split(x @ shard_mlp(Wg, Wu, Wd, 0, 2)[0], 2, axis=1)[0]
    g1 = np.split(x @ shard_mlp(Wg, Wu, Wd, 1, 2)[0], 2, axis=1)[0]
    assert not np.allclose(g0 + g1, (x @ Wg)[:, :16])


# == 15-16. Design numbers =========================================================================

def test_ex15_tp_vs_pp_across_nodes():
    per_ar = ring_time(16 * KIB, 16, ETH10)
    assert round(per_ar * 1e6, 1) == 1524.6 and round(161 * per_ar * 1e3) == 245
    boundary = 2 * 8192 * 2
    assert boundary == 32 * KIB
    assert round((ETH10[0] + boundary / ETH10[1]) * 1e6) == 76


def test_ex16_dp_vs_tp_for_a_small_model():
    P = n_params(L8)
    assert round(P / 1e9, 2) == 8.03 and round(2 * P / 1e9, 2) == 16.06
    wbytes = 2 * P
    flop_tok = 2 * P
    dp_read = wbytes / HBM
    tp_read = wbytes / 8 / HBM
    assert round(dp_read * 1e3, 2) == 4.79 and round(tp_read * 1e3, 2) == 0.60
    assert round(wbytes / 8 / 1e9, 2) == 2.01
    assert round(flop_tok / FLOPS * 1e3, 3) == 0.016
    low_ar = ring_time(8 * 8192, 8, NVLINK)
    assert round(low_ar * 1e6, 2) == 42.25
    tp_low = tp_read + 65 * low_ar
    assert round(tp_low * 1e3, 2) == 3.35
    dp_high = max(dp_read, 300 * flop_tok / FLOPS)
    assert round(300 * flop_tok / FLOPS * 1e3, 2) == 4.87 and dp_high > dp_read
    high_ar = ring_time(2400 * 8192, 8, NVLINK)
    assert round(2400 * 8192 / 1e6, 1) == 19.7 and round(high_ar * 1e6, 1) == 118.5
    tp_high = max(tp_read, 2400 * flop_tok / 8 / FLOPS) + 65 * high_ar
    assert round(tp_high * 1e3, 2) == 12.57
    assert round(2400 / dp_high / 1e3) == 493 and round(2400 / tp_high / 1e3) == 191
    assert round(tp_high / dp_high, 1) == 2.6
    assert round(dp_read / (flop_tok / FLOPS)) == 295
    budget = MEM_UTIL * GPU_GIB * GIB
    kv_tok = 2 * 32 * 8 * 128 * 2
    assert kv_tok == 128 * KIB and kv_tok // 8 == 16 * KIB
    dp_tokens = 8 * (budget - wbytes) / kv_tok
    tp_tokens = 8 * (budget - wbytes / 8) / kv_tok
    assert round(dp_tokens / 1e6, 2) == 3.84 and round(tp_tokens / 1e6, 2) == 4.70
    assert round(tp_tokens / dp_tokens - 1, 2) == 0.22


# == 17. Sum order in float32 =======================================================================

def test_ex17_sum_order():
    v = np.array([1e8, 1, -1e8, 1], dtype=np.float32)
    dense = np.float32(0)
    for a in v:
        dense = np.float32(dense + a)
    halves = np.float32(np.float32(v[0] + v[1]) + np.float32(v[2] + v[3]))
    assert dense == 1 and halves == 0 and float(v.astype(np.float64).sum()) == 2
    assert np.float32(1e8) + np.float32(1) == np.float32(1e8)
    assert (0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3)


# == Interview numbers not covered above ============================================================

def test_interview_numbers():
    # Q3: 70B on 8 x 80 GiB
    w = n_params(L70) * 2 / GIB
    assert round(w, 1) == 131.4 and round(w / 8, 1) == 16.4
    kv70 = 2 * 80 * 8 * 128 * 2
    assert kv70 == 320 * KIB and kv70 // 8 == 40 * KIB
    assert 161 * ring_bytes(16 * KIB, 8) == 4_616_192
    # Q3, two servers: TP 8 x PP 2 puts 40 layers per stage
    assert pp_parts(80, 2) == [40, 40]
    # Q4: 70B at TP 16 keeps 40 KiB per token per GPU
    assert kv_split(8, 16) == (1, 2) and 2 * 80 * 1 * 128 * 2 == 40 * KIB
    # Q3: what is left for KV at TP = 8, and the smallest replica (TP = 2)
    left = GPU_GIB * MEM_UTIL - w / 8
    assert round(left, 1) == 57.2 and round(left * GIB / (40 * KIB) / 1e6, 1) == 1.5
    assert int(left * GIB / (40 * KIB) // 8192) == 182
    assert round(w / 2, 1) == 65.7 and GPU_GIB * MEM_UTIL - w / 2 < 8
    # Q1: the 8B at TP = 4
    assert (8 * 128 + 2 * 128 + 2 * 128, 8 * 128) == (1536, 1024)
    # Q2: the 8B's prefill chunk
    assert 2048 * 4096 * 2 == 16 * MIB


# == Facts at the pin ===============================================================================

@pytest.mark.upstream
def test_facts_at_the_pin():
    lin = _source("vllm/model_executor/layers/linear.py")
    assert "self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)" in lin
    assert "shard_rank = self.tp_rank // self.num_kv_head_replicas" in lin
    assert "bias_ = None if (self.tp_rank > 0 or self.skip_bias_add) else self.bias" in lin
    assert "if self.reduce_results and self.tp_size > 1:" in lin
    vpe = _source("vllm/model_executor/layers/vocab_parallel_embedding.py")
    assert "DEFAULT_VOCAB_PADDING_SIZE = 64" in vpe
    cc = _source("vllm/v1/engine/core_client.py")
    assert "score = waiting * 4 + running" in cc
    assert "current_counts[eng_index][0] += self.client_count" in cc
    me = _source("vllm/v1/executor/multiproc_executor.py")
    assert "return 2 if pp_size <= 1 and self.scheduler_config.async_scheduling else pp_size" in me
    pc = _source("vllm/config/parallel.py")
    assert "cp_kv_cache_interleave_size: int = 1" in pc
    ps = _source("vllm/distributed/parallel_state.py")
    assert "all_ranks.transpose(2, 4).reshape(-1, pipeline_model_parallel_size)" in ps
    assert "all_ranks.transpose(1, 4).reshape(-1, data_parallel_size)" in ps
    gw = _source("vllm/v1/worker/gpu_worker.py")
    assert gw.count("all_gather_group=get_tp_group()") >= 2
    envs = _source("vllm/envs.py")
    assert "VLLM_ALLREDUCE_USE_SYMM_MEM: bool = True" in envs
    assert "VLLM_USE_NCCL_SYMM_MEM: bool = False" in envs
    co = _source("vllm/v1/engine/coordinator.py")
    assert "min_stats_update_interval_ms: int = 100," in co
    core = _source("vllm/v1/engine/core.py")
    assert "if self.step_counter % 32 != 0:" in core
    cc_ = _source("vllm/distributed/device_communicators/cuda_communicator.py")
    order = ["should_nccl_symm_mem_allreduce(", "qr_comm.should_quick_allreduce(",
             "fi_ar_comm.should_use_fi_ar(", "ca_comm.should_custom_ar(",
             "symm_mem_comm.should_use_symm_mem(", "out = pynccl_comm.all_reduce("]
    pos = [cc_.index(k) for k in order]
    assert pos == sorted(pos)
