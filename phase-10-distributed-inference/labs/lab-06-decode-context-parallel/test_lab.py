"""Lab 10-06 tests: decode context parallelism on real gloo equals attention over the whole context.

The distributed checks share one forked world of four ranks (``world`` fixture),
because every world start costs 0.2-3 s on a loaded 2-core machine: inside it,
groups of 4, 3, 2 and 1 ranks each run the learner's ``dcp_decode_attention``
on their own data, and the results come back to be compared here, in the
parent, with a dense oracle that never sees the shards.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import io
import math

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UTILS = course.UPSTREAM / "vllm/v1/attention/backends/utils.py"
COMMON = course.UPSTREAM / "vllm/v1/attention/ops/common.py"
SCALE = 0.35  # not 1/sqrt(8): the scale argument must be the one used
HEADS, KV_HEADS, DIM = 4, 2, 8


# ---------------------------------------------------------------- test-side oracles


def dense(q, k, v, scale=SCALE):
    """Attention of every query row over all keys, one (row, head) at a time, float64.

    Returns (out [T, H, D], lse [T, H]); query head h reads KV head h // (H // Hkv).
    """
    num_tokens, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    out = np.zeros(q.shape)
    lse = np.zeros((num_tokens, num_heads))
    for t in range(num_tokens):
        for h in range(num_heads):
            s = k[:, h // group] @ q[t, h] * scale
            m = s.max()
            p = np.exp(s - m)
            out[t, h] = p @ v[:, h // group] / p.sum()
            lse[t, h] = m + math.log(p.sum())
    return out, lse


def owned_positions(seq_len, world, rank, interleave):
    """The positions rank ``rank`` stores, in order, by counting runs (no formula shared with impl)."""
    return [p for p in range(seq_len) if (p // interleave) % world == rank]


def oracle_slots(seq_len, table, block_size, world, rank, interleave):
    """{position: slot} for one rank: its j-th own position goes to slot j of its blocks, in order."""
    own = owned_positions(seq_len, world, rank, interleave)
    return {p: table[j // block_size] * block_size + j % block_size for j, p in enumerate(own)}


def fill_cache(k, v, table, num_blocks, block_size, world, rank, interleave):
    """This rank's paged cache, written test-side. Unwritten slots hold NaN, so reading one
    (too many local tokens, or the wrong blocks) poisons the result instead of passing."""
    shape = (num_blocks, block_size) + k.shape[1:]
    kc, vc = np.full(shape, np.nan), np.full(shape, np.nan)
    flat_k, flat_v = kc.reshape(-1, *k.shape[1:]), vc.reshape(-1, *k.shape[1:])
    for p, slot in oracle_slots(len(k), table, block_size, world, rank, interleave).items():
        flat_k[slot], flat_v[slot] = k[p], v[p]
    return kc, vc


def make_case(name, ranks, seed, seq_len, interleave, block_size, table, num_blocks, tokens=3,
              spread=1.0):
    rng = np.random.default_rng(seed)
    return {
        "name": name, "ranks": tuple(ranks), "seq_len": seq_len, "interleave": interleave,
        "block_size": block_size, "table": list(table), "num_blocks": num_blocks,
        "q": rng.standard_normal((tokens, HEADS, DIM)) * spread,
        "k": rng.standard_normal((seq_len, KV_HEADS, DIM)),
        "v": rng.standard_normal((seq_len, KV_HEADS, DIM)),
    }


# 37 tokens on 4 ranks, block size 4: one table entry covers 16 positions, so 3 entries.
# Interleave 1 gives the ranks 10, 9, 9, 9 tokens; interleave 4 gives 12, 9, 8, 8.
CASES = [
    make_case("world_i1", range(4), 1, 37, 1, 4, [5, 0, 2], 6),
    make_case("world_i4", range(4), 1, 37, 4, 4, [5, 0, 2], 6),
    # two DCP groups of 2 (upstream's consecutive ranks [[0, 1], [2, 3]]), different data
    make_case("pair01", (0, 1), 2, 21, 2, 4, [1, 4, 2], 5),
    make_case("pair23", (2, 3), 3, 19, 1, 4, [3, 0, 1], 4),
    # 2 tokens on 3 ranks: rank 2 stores nothing and must still join both collectives
    make_case("first3", (0, 1, 2), 4, 2, 1, 2, [0], 1),
    # scores near +-1000 (q spread 500): exp(score) overflows float64 past 709
    make_case("world_loud", range(4), 5, 13, 2, 4, [1, 0], 2, spread=500.0),
    # a group of one rank: no collective at all
    # (8 tokens fill both entries of its table exactly: the largest seq_len the table allows)
    make_case("solo3", (3,), 6, 8, 1, 4, [0, 1], 2),
]
COLLECTIVES = ("all_gather", "all_reduce", "all_gather_into_tensor", "broadcast", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "send", "recv", "barrier", "all_gather_object")


def _world_body(rank, world_size, cases):
    """Runs in each of the four forked ranks; returns plain numpy/Python values only."""
    import torch.distributed as dist

    handles = {}
    for ranks in ((0, 1), (2, 3), (0, 1, 2), (3,)):
        handles[ranks] = dist.new_group(list(ranks))  # every rank calls it, member or not
    handles[(0, 1, 2, 3)] = None  # the default group
    results = {}
    for case in cases:
        ranks = case["ranks"]
        if rank not in ranks:
            continue
        r, n = ranks.index(rank), len(ranks)
        kc, vc = fill_cache(case["k"], case["v"], case["table"], case["num_blocks"],
                            case["block_size"], n, r, case["interleave"])
        out, lse = impl.dcp_decode_attention(case["q"], kc, vc, case["table"], case["seq_len"],
                                             SCALE, case["interleave"], group=handles[ranks])
        results[case["name"]] = (np.asarray(out), np.asarray(lse))

    # Count every collective of one combine by wrapping torch.distributed's functions
    # (they still run: this counts, it does not mock).
    calls = []
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def counting(name):
        def wrapper(*args, **kwargs):
            tensor = next((a for a in (*args, *kwargs.values()) if hasattr(a, "numel")), None)
            calls.append((name, None if tensor is None else int(tensor.numel())))
            return originals[name](*args, **kwargs)
        return wrapper

    rng = np.random.default_rng(100 + rank)
    out, lse = rng.standard_normal((3, HEADS, DIM)), rng.standard_normal((3, HEADS))
    try:
        for name in originals:
            setattr(dist, name, counting(name))
        plain = impl.cp_lse_ag_out_ar(out, lse)  # return_lse=False: the output alone
        results["count_world"] = list(calls)
        results["plain"] = (type(plain).__name__, np.asarray(plain))
        calls.clear()
        if rank == 3:
            solo = impl.cp_lse_ag_out_ar(out, lse, handles[(3,)], return_lse=True)
            results["count_solo"] = list(calls)
            results["solo_passthrough"] = (np.asarray(solo[0]), np.asarray(solo[1]), out, lse)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    if rank == 3:  # bad calls, refused before any collective (group of one: nobody waits)
        case = case_named("solo3")
        kc, vc = fill_cache(case["k"], case["v"], case["table"], case["num_blocks"], 4, 1, 0, 1)
        bad_calls = {
            "seq_len": (kc, vc, 9, 1), "seq_len ": (kc, vc, -1, 1),
            "key_cache": (kc[0], vc[0], 3, 1), "value_cache": (kc, vc[:1], 3, 1),
            "interleave_size": (kc, vc, 3, 3), "interleave_size ": (kc, vc, 3, 0),
        }
        errors = {}
        for name, (k_c, v_c, length, size) in bad_calls.items():
            try:
                impl.dcp_decode_attention(case["q"], k_c, v_c, case["table"], length, SCALE, size,
                                          group=handles[(3,)])
                errors[name] = "no error"
            except ValueError as exc:
                errors[name] = str(exc)
        results["decode_errors"] = errors
        # an empty context (seq_len 0) is allowed: no keys, output 0, LSE -inf
        results["empty_context"] = impl.dcp_decode_attention(
            case["q"], kc, vc, case["table"], 0, SCALE, 1, group=handles[(3,)])
    if rank == 3:  # not a member of [0, 1, 2]: refused before any collective
        try:
            impl.cp_lse_ag_out_ar(out, lse, handles[(0, 1, 2)])
            results["non_member"] = "no error"
        except ValueError as exc:
            results["non_member"] = str(exc)
    results["lse_in"] = lse
    results["out_in"] = out
    return results


@pytest.fixture(scope="module")
def world():
    from mini_vllm.distributed import run_in_processes

    return run_in_processes(4, _world_body, CASES, timeout=60.0)


def case_named(name):
    return next(c for c in CASES if c["name"] == name)


def assert_matches_dense(world, name, atol=1e-12):
    case = case_named(name)
    want_out, want_lse = dense(case["q"], case["k"], case["v"])
    for rank in case["ranks"]:
        out, lse = world[rank][name]
        assert out.shape == want_out.shape and lse.shape == want_lse.shape, (name, rank)
        np.testing.assert_allclose(out, want_out, rtol=0, atol=atol, err_msg=f"{name} rank {rank}")
        np.testing.assert_allclose(lse, want_lse, rtol=0, atol=atol, err_msg=f"{name} rank {rank}")


# ---------------------------------------------------------------- KV copies


def test_kv_copies_of_the_deployment_guide_cases():
    # DeepSeek-R1 (MLA: one latent KV per token) at TP 8: every rank holds the whole cache
    assert impl.kv_copies(8, 1, use_mla=True) == 8
    assert impl.kv_copies(8, 1, 8, use_mla=True) == 1
    assert impl.kv_copies(8, 128, 8, use_mla=True) == 1  # MLA ignores num_kv_heads
    # Kimi-K2 at TP 16: 16 copies; DCP 8 leaves 2, DCP 16 one
    assert impl.kv_copies(16, 1, use_mla=True) == 16
    assert impl.kv_copies(16, 1, 8, use_mla=True) == 2
    assert impl.kv_copies(16, 1, 16, use_mla=True) == 1
    # Qwen3-235B-A22B: 4 KV heads at TP 8 -> each head on 2 ranks; DCP 2 removes the copy
    assert impl.kv_copies(8, 4) == 2 and impl.kv_copies(8, 4, 2) == 1
    # fewer ranks than heads: each rank owns 8 / 4 = 2 heads, one copy of everything
    assert impl.kv_copies(4, 8) == 1 and impl.kv_copies(8, 8) == 1
    # tiny-random (2 KV heads) at TP 4: 2 copies, DCP 2 -> 1
    assert impl.kv_copies(4, 2) == 2 and impl.kv_copies(4, 2, 2) == 1
    assert isinstance(impl.kv_copies(8, 4, 2), int)
    # one rank holds everything once; MLA at TP 2 with DCP 2: once
    assert impl.kv_copies(1, 8) == 1 and impl.kv_copies(1, 1, use_mla=True) == 1
    assert impl.kv_copies(2, 1, 2, use_mla=True) == 1


def test_kv_copies_refuses_what_cannot_split():
    with pytest.raises(ValueError, match="dcp_size"):
        impl.kv_copies(6, 1, 4, use_mla=True)  # 6 % 4: tp must be a multiple of dcp
    with pytest.raises(ValueError, match="dcp_size"):
        impl.kv_copies(8, 8, 2)  # TP 8 = 8 heads: nothing replicated, nothing to split
    with pytest.raises(ValueError, match="dcp_size"):
        impl.kv_copies(4, 8, 2)
    with pytest.raises(ValueError, match="dcp_size"):
        impl.kv_copies(4, 2, 4)  # only 2 replicas of each head
    with pytest.raises(ValueError, match="num_kv_heads"):
        impl.kv_copies(8, 3)  # 3 heads cannot be spread over 8 ranks
    with pytest.raises(ValueError, match="num_kv_heads"):
        impl.kv_copies(4, 6)  # nor 6 heads over 4
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="tp_size"):
            impl.kv_copies(bad, 2)
        with pytest.raises(ValueError, match="num_kv_heads"):
            impl.kv_copies(4, bad)
        with pytest.raises(ValueError, match="dcp_size"):
            impl.kv_copies(4, 2, bad)


# ---------------------------------------------------------------- who stores which token


def test_interleave_1_deals_tokens_round_robin():
    owners = impl.dcp_rank_of(np.arange(10), 4)
    assert owners.dtype == np.int64
    assert owners.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert impl.dcp_rank_of(np.arange(8), 3, 2).tolist() == [0, 0, 1, 1, 2, 2, 0, 0]
    assert impl.dcp_rank_of(np.array([[5, 6], [7, 8]]), 2).tolist() == [[1, 0], [1, 0]]
    assert impl.dcp_rank_of(np.arange(5), 1, 3).tolist() == [0] * 5


def test_interleave_16_keeps_runs_of_16_on_one_rank():
    owners = impl.dcp_rank_of(np.arange(80), 2, 16)
    assert owners.tolist() == [0] * 16 + [1] * 16 + [0] * 16 + [1] * 16 + [0] * 16


def test_local_seq_lens_by_hand():
    # 37 tokens, 4 ranks, I = 1: 9 full rounds of 4, then token 36 on rank 0
    assert impl.local_seq_lens([37], 4, None, 1).tolist() == [[10, 9, 9, 9]]
    # I = 4: 2 full rounds of 16 (8 each), then 32..35 on rank 0 and 36 on rank 1
    lens = impl.local_seq_lens([37], 4, None, 4)
    assert lens.dtype == np.int64 and lens.tolist() == [[12, 9, 8, 8]]
    one = impl.local_seq_lens([37, 3, 0, 16], 4, 1, 4)
    assert one.shape == (4,) and one.tolist() == [9, 0, 0, 4]
    # I = 3 on 2 ranks, 10 tokens: 0-2 r0, 3-5 r1, 6-8 r0, 9 r1
    assert impl.local_seq_lens([10], 2, None, 3).tolist() == [[6, 4]]


def test_local_seq_lens_count_what_dcp_rank_of_assigns():
    rng = np.random.default_rng(7)
    for _ in range(30):
        n, size = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        seq_lens = rng.integers(0, 120, size=5)
        lens = impl.local_seq_lens(seq_lens, n, None, size)
        assert lens.shape == (5, n)
        for row, length in zip(lens, seq_lens, strict=True):
            counts = np.bincount(impl.dcp_rank_of(np.arange(length), n, size), minlength=n)
            assert row.tolist() == counts.tolist()
        for r in range(n):
            np.testing.assert_array_equal(impl.local_seq_lens(seq_lens, n, r, size), lens[:, r])


@functools.lru_cache(maxsize=1)
def _upstream_local_seq_lens():
    """``get_dcp_local_seq_lens`` read from upstream/ with ``ast``: plain torch, no vllm import."""
    import torch

    tree = ast.parse(UTILS.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_dcp_local_seq_lens")
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(UTILS), "exec"), namespace)
    return namespace[fn.name]


@pytest.mark.upstream
def test_local_seq_lens_match_upstream():
    import torch

    upstream = _upstream_local_seq_lens()
    rng = np.random.default_rng(8)
    for _ in range(40):
        n, size = int(rng.integers(2, 9)), int(rng.choice([1, 2, 4, 16]))
        seq_lens = rng.integers(0, 300, size=6)
        want = upstream(torch.tensor(seq_lens), n, None, size).numpy()  # [B, N]
        np.testing.assert_array_equal(impl.local_seq_lens(seq_lens, n, None, size), want)
        r = int(rng.integers(0, n))
        want_r = upstream(torch.tensor(seq_lens), n, r, size).numpy()
        np.testing.assert_array_equal(impl.local_seq_lens(seq_lens, n, r, size), want_r)


# ---------------------------------------------------------------- slot mapping


def test_slot_mapping_by_hand():
    # block size 4, 2 ranks: table entry b covers positions 8b .. 8b + 7. Rank 0 owns the even
    # positions; its 4 of the first 8 go to slots 7*4 + 0..3, of the next 8 to 3*4 + 0..3.
    slots = impl.slot_mapping(np.arange(10), [7, 3], 4, 2, 0)
    assert slots.dtype == np.int64
    assert slots.tolist() == [28, -1, 29, -1, 30, -1, 31, -1, 12, -1]
    assert impl.slot_mapping(np.arange(10), [7, 3], 4, 2, 1).tolist() == \
        [-1, 28, -1, 29, -1, 30, -1, 31, -1, 12]
    # a decode step writes one position: 13 is odd -> rank 1, 13 % 8 = 5 -> offset 2 of block 3
    assert impl.slot_mapping([13], [7, 3], 4, 2, 1).tolist() == [14]
    assert impl.slot_mapping([13], [7, 3], 4, 2, 0).tolist() == [impl.PAD_SLOT_ID] == [-1]


def test_slot_mapping_interleave_equal_to_block_size_fills_whole_blocks():
    # block size 16, I = 16, 2 ranks: positions 0-15 fill rank 0's block 9, 16-31 rank 1's
    # block 9, 32-47 rank 0's block 4: each rank's blocks hold 16 consecutive tokens
    table = [9, 4]
    r0 = impl.slot_mapping(np.arange(64), table, 16, 2, 0, 16)
    r1 = impl.slot_mapping(np.arange(64), table, 16, 2, 1, 16)
    assert r0.tolist() == list(range(144, 160)) + [-1] * 16 + list(range(64, 80)) + [-1] * 16
    assert r1.tolist() == [-1] * 16 + list(range(144, 160)) + [-1] * 16 + list(range(64, 80))
    # I = 2, block 4, 2 ranks: runs of 2 -> rank 0 gets 0,1,4,5 in block 9 at offsets 0..3
    assert impl.slot_mapping(np.arange(8), [9], 4, 2, 0, 2).tolist() == [36, 37, -1, -1, 38, 39, -1, -1]


def test_slot_mapping_compacts_each_ranks_tokens_in_order():
    rng = np.random.default_rng(9)
    for _ in range(25):
        n, bs = int(rng.integers(1, 5)), int(rng.choice([2, 4, 8]))
        size = int(rng.choice([s for s in (1, 2, 4, 8) if bs % s == 0]))
        seq_len = int(rng.integers(1, 70))
        entries = -(-seq_len // (bs * n))
        table = rng.permutation(entries + 3)[:entries]
        seen = np.zeros(seq_len, dtype=int)
        for r in range(n):
            slots = impl.slot_mapping(np.arange(seq_len), table, bs, n, r, size)
            want = oracle_slots(seq_len, table.tolist(), bs, n, r, size)
            mine = np.flatnonzero(slots >= 0)
            assert mine.tolist() == sorted(want), (n, bs, size, seq_len, r)
            assert slots[mine].tolist() == [want[p] for p in mine]
            seen[mine] += 1
        assert (seen == 1).all()  # every position stored by exactly one rank


# ---------------------------------------------------------------- the correction


def test_correct_attn_out_by_hand():
    # rank 0's keys sum to exp-mass 1 (lse 0), rank 1's to 3 (lse ln 3): shares 1/4 and 3/4
    lses = np.array([0.0, math.log(3.0)]).reshape(2, 1, 1)
    out0, lse = impl.correct_attn_out(np.full((1, 1, 2), 10.0), lses, 0)
    out1, lse1 = impl.correct_attn_out(np.full((1, 1, 2), 30.0), lses, 1)
    assert lse.shape == (1, 1) and out0.shape == (1, 1, 2)
    np.testing.assert_allclose(lse, [[math.log(4.0)]], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(lse, lse1)
    np.testing.assert_allclose(out0, 2.5, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out1, 22.5, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out0 + out1, 25.0, rtol=0, atol=1e-14)  # not the average, 20
    # three ranks and two heads: each head is combined on its own
    lses = np.array([[[1.0, -2.0]], [[1.0, 0.0]], [[1.0, -1.0]]])  # [N=3, B=1, H=2]
    out, lse = impl.correct_attn_out(np.ones((1, 2, 1)), lses, 1)
    np.testing.assert_allclose(lse[0, 0], 1.0 + math.log(3.0), rtol=0, atol=1e-15)
    total = math.exp(-2.0) + 1.0 + math.exp(-1.0)
    np.testing.assert_allclose(out[0, :, 0], [1 / 3, 1.0 / total], rtol=0, atol=1e-15)
    np.testing.assert_allclose(lse[0, 1], math.log(total), rtol=0, atol=1e-15)
    # array-likes are accepted: nested lists give the same float64 answer
    out_l, lse_l = impl.correct_attn_out([[[1.0], [1.0]]], lses.tolist(), 1)
    assert out_l.dtype == np.float64 and lse_l.dtype == np.float64
    np.testing.assert_array_equal(out_l, out)
    np.testing.assert_array_equal(lse_l, lse)


def test_correct_attn_out_gives_empty_ranks_weight_zero():
    # rank 1 stored no token (-inf); FlashAttention may also say +inf or NaN for that
    for empty in (-np.inf, np.inf, np.nan):
        lses = np.array([0.5, empty, -0.5]).reshape(3, 1, 1)
        total = math.log(math.exp(0.5) + math.exp(-0.5))
        out0, lse = impl.correct_attn_out(np.ones((1, 1, 1)), lses, 0)
        out1, _ = impl.correct_attn_out(np.zeros((1, 1, 1)), lses, 1)
        np.testing.assert_allclose(lse, [[total]], rtol=0, atol=1e-15)
        np.testing.assert_allclose(out0, math.exp(0.5 - total), rtol=0, atol=1e-15)
        assert out1.tolist() == [[[0.0]]]  # exp(-inf) = 0 times a zero output, no NaN
    # no rank stored anything (a context of 0 tokens): lse -inf, outputs 0, never NaN
    lses = np.array([-np.inf, np.inf, np.nan, -np.inf]).reshape(4, 1, 1)
    for r in range(4):
        out, lse = impl.correct_attn_out(np.zeros((1, 1, 3)), lses, r)
        assert lse.tolist() == [[-np.inf]] and out.tolist() == [[[0.0, 0.0, 0.0]]]


def test_correct_attn_out_does_not_overflow():
    # lse 800 and 801: exp(800) is inf in float64, so the max shift is not optional
    lses = np.array([800.0, 801.0]).reshape(2, 1, 1)
    out, lse = impl.correct_attn_out(np.full((1, 1, 1), 2.0), lses, 0)
    want_lse = 801.0 + math.log1p(math.exp(-1.0))
    np.testing.assert_allclose(lse, [[want_lse]], rtol=1e-15)
    np.testing.assert_allclose(out, 2.0 / (1.0 + math.e), rtol=1e-12)  # lse ~801: 801 * eps in the exponent


@pytest.mark.upstream
@pytest.mark.triton
def test_correct_attn_out_matches_upstream_kernel():
    """Upstream's Triton kernel read from upstream/ with ``ast``, run by Triton's interpreter."""
    import torch
    import triton
    import triton.language as tl

    tree = ast.parse(COMMON.read_text())
    wanted = {"_correct_attn_cp_out_kernel", "CPTritonContext", "correct_attn_out"}
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in wanted]
    assert len(defs) == 3
    namespace = {"torch": torch, "triton": triton, "tl": tl}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(COMMON), "exec"), namespace)
    rng = np.random.default_rng(10)
    out = rng.standard_normal((3, 2, 8))
    lses = rng.standard_normal((4, 3, 2)) * 3  # N = 4 ranks (the kernel needs a power of 2)
    lses[1, 0, 0] = -np.inf  # an empty rank
    lses[2, 1, 1] = np.inf  # FA2's empty
    lses[:, 2, 0] = -np.inf  # a row no rank has keys for
    for rank in (0, 1, 2, 3):
        with np.errstate(all="ignore"):
            want_out, want_lse = namespace["correct_attn_out"](
                torch.tensor(out), torch.tensor(lses), rank, None)
        got_out, got_lse = impl.correct_attn_out(out, lses, rank)
        np.testing.assert_allclose(got_out, want_out.numpy(), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(got_lse, want_lse.numpy(), rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------- on real gloo


def test_dcp_on_4_ranks_equals_dense_attention(world):
    # 37 tokens dealt one at a time: rank 0 reads 10, the others 9, and the merge is exact
    assert_matches_dense(world, "world_i1")


def test_dcp_with_block_aligned_interleave_equals_dense(world):
    # interleave 4 = block size: shards of whole blocks (12, 9, 8, 8 tokens), same answer
    assert_matches_dense(world, "world_i4")


def test_every_rank_holds_the_same_answer(world):
    for name in ("world_i1", "world_i4", "world_loud"):
        out0, lse0 = world[0][name]
        for rank in (1, 2, 3):
            np.testing.assert_array_equal(world[rank][name][0], out0)
            np.testing.assert_array_equal(world[rank][name][1], lse0)


def test_two_dcp_groups_combine_only_inside_their_group(world):
    # ranks 0, 1 and ranks 2, 3 attend different contexts at the same time; ranks 2 and 3
    # are ranks 0 and 1 of their group (global rank 2 would index past a 2-row LSE gather)
    assert_matches_dense(world, "pair01")
    assert_matches_dense(world, "pair23")


def test_a_rank_without_tokens_joins_and_adds_nothing(world):
    # 2 tokens on 3 ranks: rank 2's shard is empty (lse -inf, out 0), the result is exact
    assert_matches_dense(world, "first3")
    assert np.isfinite(world[2]["first3"][0]).all()


def test_loud_scores_do_not_overflow(world):
    case = case_named("world_loud")
    _, want_lse = dense(case["q"], case["k"], case["v"])
    assert np.abs(want_lse).max() > 800  # exp of these is inf: only shifted sums survive
    assert_matches_dense(world, "world_loud", atol=1e-9)


def test_a_group_of_one_rank_returns_its_partial(world):
    assert_matches_dense(world, "solo3")
    got_out, got_lse, out, lse = world[3]["solo_passthrough"]
    np.testing.assert_array_equal(got_out, out)
    np.testing.assert_array_equal(got_lse, lse)
    assert world[3]["count_solo"] == []  # no collective for a group of one


def test_one_all_gather_of_lses_then_one_all_reduce(world):
    # B = 3 rows, H = 4 heads, D = 8: the gather moves 12 numbers per rank, the reduce 96;
    # gathering the outputs instead (96 per rank) or reducing twice is a different protocol
    for rank in range(4):
        assert world[rank]["count_world"] == [("all_gather", 12), ("all_reduce", 96)]


def test_return_lse_false_returns_the_output_alone(world):
    lses = np.stack([world[r]["lse_in"] for r in range(4)])
    want = sum(impl.correct_attn_out(world[r]["out_in"], lses, r)[0] for r in range(4))
    for rank in range(4):
        kind, plain = world[rank]["plain"]
        assert kind == "ndarray" and plain.shape == (3, HEADS, DIM)
        np.testing.assert_allclose(plain, want, rtol=0, atol=1e-12)


def test_decode_attention_refuses_bad_caches_and_lengths(world):
    # table [0, 1] with block size 4 on one rank covers positions 0..7: 8 is allowed (the
    # solo3 case above), 9 is not; -1 is not a length; a 3-D cache and a value cache of
    # another shape are refused, and so is an interleave size of 3 for blocks of 4
    for name, message in world[3]["decode_errors"].items():
        assert name.strip() in message, (name, message)
    out, lse = world[3]["empty_context"]
    assert out.tolist() == np.zeros((3, HEADS, DIM)).tolist()
    assert lse.shape == (3, HEADS) and (lse == -np.inf).all()


def test_a_rank_outside_the_group_is_refused(world):
    assert "group" in world[3]["non_member"]


# ---------------------------------------------------------------- errors and the script


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="positions"):
        impl.dcp_rank_of([-1, 2], 2)
    with pytest.raises(ValueError, match="positions"):
        impl.dcp_rank_of([0.5], 2)
    with pytest.raises(ValueError, match="dcp_size"):
        impl.dcp_rank_of([1], 0)
    with pytest.raises(ValueError, match="interleave_size"):
        impl.dcp_rank_of([1], 2, 0)
    with pytest.raises(ValueError, match="seq_lens"):
        impl.local_seq_lens([[3]], 2)
    with pytest.raises(ValueError, match="seq_lens"):
        impl.local_seq_lens([-3], 2)
    with pytest.raises(ValueError, match="dcp_size"):
        impl.local_seq_lens([3], 0)
    with pytest.raises(ValueError, match="interleave_size"):
        impl.local_seq_lens([3], 2, None, 0)
    for bad in (2, -1, 1.0):
        with pytest.raises(ValueError, match="dcp_rank"):
            impl.local_seq_lens([3], 2, bad)
        with pytest.raises(ValueError, match="dcp_rank"):
            impl.slot_mapping([0], [0], 4, 2, bad)
    with pytest.raises(ValueError, match="interleave_size"):
        impl.slot_mapping([0], [0], 4, 2, 0, 3)  # does not divide block size 4
    with pytest.raises(ValueError, match="interleave_size"):
        impl.slot_mapping([0], [0], 4, 2, 0, 8)  # larger than the block
    with pytest.raises(ValueError, match="interleave_size"):
        impl.slot_mapping([0], [0], 4, 2, 0, 0)
    with pytest.raises(ValueError, match="positions"):
        impl.slot_mapping([[0, 1]], [0], 4, 2, 0)  # one request's positions: 1-D
    with pytest.raises(ValueError, match="positions"):
        impl.slot_mapping([16], [0, 1], 4, 2, 0)  # 2 entries cover positions 0..15 only
    with pytest.raises(ValueError, match="block_table"):
        impl.slot_mapping([0], [[0]], 4, 2, 0)
    with pytest.raises(ValueError, match="block_size"):
        impl.slot_mapping([0], [0], 0, 2, 0)
    with pytest.raises(ValueError, match="out"):
        impl.correct_attn_out(np.zeros((2, 3)), np.zeros((1, 2, 3)), 0)
    with pytest.raises(ValueError, match="lses"):
        impl.correct_attn_out(np.zeros((2, 3, 4)), np.zeros((1, 3, 2)), 0)
    for bad in (2, -1):
        with pytest.raises(ValueError, match="cp_rank"):
            impl.correct_attn_out(np.zeros((2, 3, 4)), np.zeros((2, 2, 3)), bad)
    with pytest.raises(ValueError, match="cp_attn_out"):
        impl.cp_lse_ag_out_ar(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="cp_attn_lse"):
        impl.cp_lse_ag_out_ar(np.zeros((2, 3, 4)), np.zeros((3, 2)))  # [H, T], not [T, H]


README_LINES = """\
interleave 1: owners 0101010101  local lengths [5, 5]
interleave 4: owners 0000111100  local lengths [6, 4]
rank 0 slots (block table [7, 3], block size 4): [28, -1, 29, -1, 30, -1, 31, -1, 12, -1]
partials 10 and 30, lse 0 and ln 3: total lse ln 4.0000, combined 25.0000
KV copies, 4 KV heads at TP 8: 2; with DCP 2: 1
"""


def test_script_example_prints_the_readme_lines():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        impl._example()
    assert buf.getvalue() == README_LINES
