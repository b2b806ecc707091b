"""Every number in Phase 07's exercises, interview answers and cheatsheet, recomputed.

The pages quote these values; if one changes here, the text is wrong. Numbers that rest on an
assumption (a datasheet bandwidth or FLOP rate, a memory budget) take it from the ASSUMPTIONS
block, and the pages say so in the same words. Model shapes come from each model's published
config.json. numpy only; the tests marked ``upstream`` read the pinned vLLM source, and two of
them run functions cut out of it with ``ast`` (no vllm or torch import).
"""

from __future__ import annotations

import ast
import json
import math

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM
MOE = "vllm/model_executor/layers/fused_moe"

# -- ASSUMPTIONS (stated as such where the pages use them) -----------------------------------
HBM_BYTES_PER_S = 3.35e12      # H100 SXM datasheet peak bandwidth
BF16_FLOPS = 989e12            # H100 SXM dense bf16 datasheet peak
BUDGET_80GB = 0.9 * 80e9       # gpu_memory_utilization=0.9 of an 80 GB card, activations ignored

# -- Published configs (config.json on the Hugging Face Hub) ----------------------------------
MIXTRAL_8X7B = dict(layers=32, hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128,
                    vocab=32000, experts=8, top_k=2, tied=False)
DEEPSEEK_V3 = dict(layers=61, dense_layers=3, hidden=7168, moe_inter=2048, routed=256, top_k=8,
                   shared=1, n_group=8, topk_group=4)


# == Warm-up =====================================================================================

def gemm_min_bytes(M, N, K, b=2):
    """Every operand read once and C written once: the lower bound on traffic."""
    return b * (M * K + K * N + M * N)


def gemm_intensity(M, N, K, b=2):
    return 2 * M * N * K / gemm_min_bytes(M, N, K, b)


def test_item1_gemm_flops_bytes_and_intensity():
    N = K = 4096
    assert 2 * 1 * N * K == 33_554_432
    assert gemm_min_bytes(1, N, K) == 33_570_816
    assert round(gemm_intensity(1, N, K), 4) == 0.9995
    assert 2 * 16 * N * K == 536_870_912 and gemm_min_bytes(16, N, K) == 33_816_576
    assert round(gemm_intensity(16, N, K), 2) == 15.88
    assert 2 * 4096 * N * K == 137_438_953_472 and gemm_min_bytes(4096, N, K) == 100_663_296
    assert round(gemm_intensity(4096, N, K), 1) == 1365.3 and 4096 / 3 == pytest.approx(1365.33, 1e-4)
    ridge = BF16_FLOPS / HBM_BYTES_PER_S
    assert round(ridge, 1) == 295.2
    # the batch at which intensity M*4096 / (2M + 4096) reaches the ridge
    m_ridge = ridge * 4096 / (4096 - 2 * ridge)
    assert round(m_ridge) == 345
    # roofline times, microseconds
    t_mem = lambda M: gemm_min_bytes(M, N, K) / HBM_BYTES_PER_S * 1e6   # noqa: E731
    t_cmp = lambda M: 2 * M * N * K / BF16_FLOPS * 1e6                  # noqa: E731
    assert (round(t_mem(1), 2), round(t_cmp(1), 3)) == (10.02, 0.034)
    assert (round(t_mem(16), 2), round(t_cmp(16), 2)) == (10.09, 0.54)
    assert (round(t_mem(4096), 1), round(t_cmp(4096), 1)) == (30.0, 139.0)
    assert round(t_cmp(4096) / t_mem(4096), 1) == 4.6          # compute-bound by 4.6x
    # 16 tokens cost 0.7% more time than 1 at the memory floor
    assert round((t_mem(16) / t_mem(1) - 1) * 100, 1) == 0.7


def naive_traffic(M, N, K):
    return M * N * 2 * K


def tiled_traffic(M, N, K, tm, tn):
    return M * K * -(-N // tn) + K * N * -(-M // tm)


def test_item2_tiles():
    assert naive_traffic(1024, 1024, 1024) == 2_147_483_648
    assert tiled_traffic(1024, 1024, 1024, 128, 128) == 16_777_216
    assert naive_traffic(1024, 1024, 1024) // tiled_traffic(1024, 1024, 1024, 128, 128) == 128
    assert tiled_traffic(1024, 1024, 1024, 256, 16) == 71_303_168
    assert round(2 / (1 / 256 + 1 / 16), 2) == 30.12 and 2 / (1 / 64 + 1 / 64) == 64
    # decode: M = 1, a 128-wide tile
    r = naive_traffic(1, 4096, 4096) / tiled_traffic(1, 4096, 4096, 128, 128)
    assert round(r, 3) == 1.984 == round(2 * 128 / 129, 3)
    # a 128-row tile on a 16-token batch: 112 of 128 rows are padding
    assert (128 - 16) / 128 == 0.875
    # lab 03's tiled-model intensities (every tile load charged to memory)
    def tiled_ai(M, N, K, tm, tn):
        return 2 * M * N * K / (2 * (tiled_traffic(M, N, K, tm, tn) + M * N))
    assert round(tiled_ai(1, 4096, 4096, 128, 128), 3) == 0.992
    assert round(tiled_ai(4096, 4096, 4096, 128, 128), 2) == 63.02


# -- routing by hand ---------------------------------------------------------------------------

ITEM3_PROBS = np.array([[1, 2, 3, 4], [5, 1, 1, 3], [2, 2, 1, 5], [1, 6, 2, 1]], float) / 10


def route(logits, k, renormalize=True):
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    if renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return w, ids


def test_item3_route_four_tokens_by_hand():
    logits = np.log(ITEM3_PROBS)          # softmax of log(p) is p when the row sums to 1
    assert np.allclose(ITEM3_PROBS.sum(axis=1), 1)
    w, ids = route(logits, 2)
    assert ids.tolist() == [[3, 2], [0, 3], [3, 0], [1, 2]]   # token 2: tie 0.2/0.2 -> id 0
    np.testing.assert_allclose(w, [[4 / 7, 3 / 7], [0.625, 0.375], [5 / 7, 2 / 7], [0.75, 0.25]])
    w_plain, _ = route(logits, 2, renormalize=False)
    np.testing.assert_allclose(w_plain, [[0.4, 0.3], [0.5, 0.3], [0.5, 0.2], [0.6, 0.2]])
    np.testing.assert_allclose(w_plain.sum(axis=1), [0.7, 0.8, 0.7, 0.8])
    # renormalized top-k == softmax over the selected logits
    sel = np.take_along_axis(logits, ids, axis=1)
    np.testing.assert_allclose(np.exp(sel) / np.exp(sel).sum(axis=1, keepdims=True), w)
    loads = np.bincount(ids.ravel(), minlength=4)
    assert loads.tolist() == [2, 1, 2, 3] and loads.sum() == 8
    assert round(loads.max() / loads.mean(), 1) == 1.5


def align(topk_ids, block, num_experts):
    flat = np.asarray(topk_ids).ravel()
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    padded = -(-counts // block) * block
    out = np.full(int(padded.sum()), flat.size)
    expert_ids, start, pos = [], 0, 0
    for e in range(num_experts):
        out[start:start + counts[e]] = order[pos:pos + counts[e]]
        expert_ids += [e] * (padded[e] // block)
        start += padded[e]
        pos += counts[e]
    return out.tolist(), expert_ids, int(padded.sum())


def test_item4_align_by_hand():
    ids = [[3, 2], [0, 3], [3, 0], [1, 2]]
    s, e, n = align(ids, 4, 4)
    assert s == [2, 5, 8, 8, 6, 8, 8, 8, 1, 7, 8, 8, 0, 3, 4, 8]
    assert e == [0, 1, 2, 3] and n == 16
    s, e, n = align(ids, 2, 4)
    assert s == [2, 5, 6, 8, 1, 7, 0, 3, 4, 8] and e == [0, 1, 2, 3, 3] and n == 10
    assert [x // 2 for x in [2, 5]] == [1, 2]        # expert 0's slots are tokens 1 and 2
    # upstream's worst-case buffer: numel + E * (block - 1)
    assert 8 + 4 * (4 - 1) == 20 and 8 + 4 * (2 - 1) == 12
    assert 8 / 16 == 0.5 and 8 / 10 == 0.8


def capacity(cf, T, k, E):
    return math.floor(cf * T * k / E)


def test_item5_capacity_drops():
    loads = np.array([64, 30, 10, 8, 6, 4, 4, 2])
    assert loads.sum() == 128 == 64 * 2
    assert capacity(1.0, 64, 2, 8) == 16 and capacity(2.0, 64, 2, 8) == 32
    assert capacity(1.25, 64, 2, 8) == 20
    drops = lambda c: int(np.maximum(loads - c, 0).sum())   # noqa: E731
    assert drops(16) == 62 and drops(32) == 32 and drops(20) == 54 and drops(64) == 0
    assert capacity(4.0, 64, 2, 8) == 64
    assert 64 - 16 == 48                      # the most expert 0 can ever drop here
    assert round(0.6 * 128) == 77 and 77 > 64  # the older material's "60% of 128" needs 77 > T
    assert 77 - 16 == 61                       # and even then it would drop 61, not 68
    assert loads.max() / loads.mean() == 4.0


# == Trace ======================================================================================

def replicate(weight, num_phy):
    w = np.asarray(weight, float)
    logcnt = np.ones(w.size, int)
    phy2log = list(range(w.size))
    for _ in range(w.size, num_phy):
        e = int(np.argmax(w / logcnt))
        phy2log.append(e)
        logcnt[e] += 1
    return phy2log, logcnt


def pack(items, num_packs):
    per = len(items) // num_packs
    load = np.zeros(num_packs)
    count = np.zeros(num_packs, int)
    where = [None] * len(items)
    for i in np.argsort(-np.asarray(items), kind="stable"):
        open_ = np.where(count < per, load, np.inf)
        p = int(np.argmin(open_))
        where[i] = p
        load[p] += items[i]
        count[p] += 1
    return where, load


def test_item10_eplb_by_hand():
    loads = [64, 30, 10, 8, 6, 4, 4, 2]
    phy2log, cnt = replicate(loads, 12)
    assert phy2log[8:] == [0, 0, 1, 0] and cnt.tolist() == [4, 2, 1, 1, 1, 1, 1, 1]
    assert round(64 / 3, 2) == 21.33
    replica = [loads[e] / cnt[e] for e in phy2log]
    assert sorted(replica, reverse=True) == [16, 16, 16, 16, 15, 15, 10, 8, 6, 4, 4, 2]
    _, gpu = pack(replica, 4)
    assert gpu.tolist() == [35, 33, 30, 30]
    linear = [64 + 30, 10 + 8, 6 + 4, 4 + 2]
    assert linear == [94, 18, 10, 6] and max(linear) / np.mean(linear) == 2.9375
    assert max(gpu) / np.mean(gpu) == 1.09375
    rr = [64 + 6, 30 + 4, 10 + 4, 8 + 2]             # round robin: e % 4
    assert rr == [70, 34, 14, 10]


def default_config_by_rule(M, E, dtype=None):
    """get_default_config's general branch, as the pages state it."""
    block_m = 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128
    return dict(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=64 if M <= 64 else 128,
                BLOCK_SIZE_K=128 if dtype == "fp8_w8a8" or M <= 64 else 64,
                GROUP_SIZE_M=16 if M // max(E, 1) > 128 else 1, SPLIT_K=1,
                num_warps=4 if M <= 128 else 8, num_stages=4 if M <= 32 else 3)


ITEM8 = {8: (16, 64, 128, 1, 4, 4), 40: (32, 64, 128, 1, 4, 3), 200: (64, 128, 64, 1, 8, 3),
         4096: (128, 128, 64, 16, 8, 3)}


def test_item8_default_config_table():
    for M, (bm, bn, bk, g, w, s) in ITEM8.items():
        c = default_config_by_rule(M, 8)
        assert (c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["BLOCK_SIZE_K"], c["GROUP_SIZE_M"],
                c["num_warps"], c["num_stages"]) == (bm, bn, bk, g, w, s), M
    # 4096 tokens over 8 experts: 512 per expert > 128, so the grouped order switches on;
    # over 64 experts it would be 64 per expert and stay off
    assert 4096 // 8 == 512 and default_config_by_rule(4096, 64)["GROUP_SIZE_M"] == 1


def test_item9_naive_block_assignment_condition():
    cond = lambda T, k, E: T * k * 4 <= E        # noqa: E731
    assert cond(1, 8, 256) and 1 * 8 * 4 == 32
    assert cond(8, 8, 256) and not cond(9, 8, 256)
    assert cond(1, 2, 8) and not cond(2, 2, 8)   # Mixtral: one decode token only
    # the aligned path on one DeepSeek-V3 decode token: 8 slots, 8 experts, block 16
    assert 8 * 16 == 128 and 8 / 128 == 0.0625
    # upstream's buffer, capped when numel < E: min(numel * block, numel + E * (block - 1))
    assert min(8 * 16, 8 + 256 * 15) == 128 and 8 + 256 * 15 == 3848


# == Build ======================================================================================

def silu(x):
    return x / (1 + np.exp(-x))


def expert_mlp(x, w1, w2, w3):
    return (silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def moe_grouped(x, experts, ids, w, block=4):
    T, k = ids.shape
    s, e, n = align(ids, block, len(experts))
    s = np.array(s)
    out = np.zeros_like(x)
    for b, ex in enumerate(e):
        blk = s[b * block:(b + 1) * block]
        real = blk < T * k
        rows = np.zeros((block, x.shape[1]), x.dtype)
        rows[real] = x[blk[real] // k]
        y = expert_mlp(rows, *experts[ex])
        np.add.at(out, blk[real] // k, y[real] * w.ravel()[blk[real]][:, None])
    return out


def moe_reference(x, experts, ids, w):
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            out[t] += w[t, j] * expert_mlp(x[t:t + 1], *experts[ids[t, j]])[0]
    return out


def test_item12_shared_expert():
    from mini_vllm.models.moe import FusedMoE
    from mini_vllm.models.moe import expert_mlp as fused_mlp

    class SharedExpertMoE(FusedMoE):  # the answer's class, as printed
        def __init__(self, router, w13, w2, top_k, shared, **kwargs):
            super().__init__(router, w13, w2, top_k, **kwargs)
            self.shared_w13, self.shared_w2 = shared

        def __call__(self, x):
            routed = super().__call__(x)
            return routed + fused_mlp(x, self.shared_w13, self.shared_w2)

    rng = np.random.default_rng(7)
    T, H, inter, E, k = 5, 8, 12, 4, 2

    def mlp(i):
        return (rng.standard_normal((i, H)) * 0.3, rng.standard_normal((H, i)) * 0.3,
                rng.standard_normal((i, H)) * 0.3)
    experts = [mlp(inter) for _ in range(E)]
    shared = mlp(2 * inter)
    x = rng.standard_normal((T, H))
    gate = rng.standard_normal((E, H))
    w, ids = route(x @ gate.T, k)
    routed = moe_grouped(x, experts, ids, w)
    np.testing.assert_allclose(routed, moe_reference(x, experts, ids, w), rtol=1e-10, atol=1e-12)
    ref = moe_reference(x, experts, ids, w) + expert_mlp(x, *shared)
    # the same weights in mini_vllm's layout: w13 = [w1; w3] (gate rows first), w2 as is
    w13 = np.stack([np.concatenate([w1, w3]) for w1, _w2, w3 in experts])
    w2 = np.stack([w2_ for _w1, w2_, _w3 in experts])
    layer = SharedExpertMoE(gate.T.copy(), w13, w2, k,
                            (np.concatenate([shared[0], shared[2]]), shared[1]), block_size=4)
    np.testing.assert_allclose(layer(x), ref, rtol=1e-6, atol=1e-6)  # mini_vllm routes in float32
    # the shared expert is dense: it must not touch the routing or the loads
    assert layer.last_expert_loads.sum() == T * k
    assert np.bincount(ids.ravel(), minlength=E).tolist() == layer.last_expert_loads.tolist()
    # parameters and FLOPs per token added by a shared expert of intermediate 2I
    assert 3 * H * 2 * inter == 576 and 2 * 3 * H * 2 * inter == 1152
    # DeepSeek-V3: one shared expert of moe_intermediate 2048 = the size of one routed expert
    d = DEEPSEEK_V3
    assert 3 * d["hidden"] * d["moe_inter"] == 44_040_192
    assert (d["top_k"] + d["shared"]) == 9
    # item 16: linear placement of item 10's loads, busiest GPU over the mean
    assert round(94 / 32, 2) == 2.94       # expert MLPs each token runs per MoE layer


ITEM13_P = np.array([0.30, 0.05, 0.20, 0.12, 0.19, 0.04, 0.06, 0.04])


def grouped_topk(scores, k, n_group, topk_group, renormalize=True):
    T, E = scores.shape
    g = scores.reshape(T, n_group, E // n_group).max(axis=-1)
    keep = np.argsort(-g, axis=1, kind="stable")[:, :topk_group]
    mask = np.zeros((T, n_group), bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, E // n_group, axis=1), scores, -np.inf)
    ids = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(scores, ids, axis=1)
    if renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return w, ids


def test_item13_grouped_topk_example():
    assert round(ITEM13_P.sum(), 12) == 1.0
    p = ITEM13_P[None, :]
    w, ids = grouped_topk(p, 3, 4, 2)
    assert p.reshape(4, 2).max(axis=1).tolist() == [0.30, 0.20, 0.19, 0.06]
    assert ids.tolist() == [[0, 2, 3]]
    np.testing.assert_allclose(w, [[0.30 / 0.62, 0.20 / 0.62, 0.12 / 0.62]])
    assert [round(v, 4) for v in w[0]] == [0.4839, 0.3226, 0.1935]
    w2, ids2 = route(np.log(p), 3)
    assert ids2.tolist() == [[0, 2, 4]]
    assert [round(v, 4) for v in w2[0]] == [0.4348, 0.2899, 0.2754]
    # one group: the same as plain top-k
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((16, 8))
    wa, ia = route(logits, 3)
    z = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    wb, ib = grouped_topk(z, 3, 1, 1)
    assert (ia == ib).all() and np.allclose(wa, wb)
    # all groups kept: also plain top-k
    wc, ic = grouped_topk(z, 3, 4, 4)
    assert (ia == ic).all()


def padded_rows_balanced(T, k, E, block):
    """Rows the grouped GEMM computes when T*k slots spread evenly over E experts."""
    slots = T * k
    per, rem = divmod(slots, E)
    counts = [per + (1 if e < rem else 0) for e in range(E)]
    return sum(-(-c // block) * block for c in counts), slots


def test_item14_padding_waste():
    assert padded_rows_balanced(16, 8, 64, 16) == (1024, 128)        # 12.5% useful
    assert padded_rows_balanced(16, 8, 64, 64) == (4096, 128)        # 3.1%
    assert padded_rows_balanced(256, 8, 64, 16) == (2048, 2048)      # 100%
    assert padded_rows_balanced(256, 8, 64, 64) == (4096, 2048)      # 50%
    assert padded_rows_balanced(1, 8, 64, 16) == (128, 8)            # 6.25%
    assert padded_rows_balanced(1, 8, 64, 64) == (512, 8) and round(8 / 512 * 100, 1) == 1.6
    assert 128 / 1024 == 0.125 and round(128 / 4096 * 100, 1) == 3.1 and 8 / 128 == 0.0625
    # get_default_config's block for these batches (M = tokens, not slots)
    assert [default_config_by_rule(M, 64)["BLOCK_SIZE_M"] for M in (1, 16, 256)] == [16, 16, 64]
    assert padded_rows_balanced(256, 8, 64, 64)[0] == 4096            # what the default pays
    # the worst case: every expert one slot over a block boundary
    assert padded_rows_balanced(64 + 8, 8, 64, 16)[0] == 64 * 16     # 9 slots each, 16 rows


# == Design =====================================================================================

def mixtral_params(m=MIXTRAL_8X7B):
    h, i, L = m["hidden"], m["inter"], m["layers"]
    expert = 3 * h * i
    attn = 2 * h * m["heads"] * m["head_dim"] + 2 * h * m["kv_heads"] * m["head_dim"]
    emb = m["vocab"] * h * (1 if m["tied"] else 2)
    router = h * m["experts"]
    norms = (2 * L + 1) * h
    total = L * (m["experts"] * expert + attn + router) + emb + norms
    active = L * (m["top_k"] * expert + attn + router) + emb + norms
    return expert, attn, emb, total, active


def test_item15_mixtral_sizes():
    expert, attn, emb, total, active = mixtral_params()
    assert expert == 176_160_768 and attn == 41_943_040 and emb == 262_144_000
    assert round(total / 1e9, 2) == 46.70 and round(active / 1e9, 2) == 12.88
    assert round(total * 2 / 1e9, 1) == 93.4 and total * 2 > 80e9       # bf16: not on one card
    # expected experts touched per layer by B tokens, uniform independent top-2 of 8
    assert 21 / 28 == 0.75
    touched = lambda B: 8 * (1 - 0.75 ** B)                  # noqa: E731
    assert [round(touched(B), 2) for B in (1, 4, 8, 16, 32)] == [2.0, 5.47, 7.2, 7.92, 8.0]
    # weights read per decode step (experts touched + attention + LM head), bf16, TP=2
    m = MIXTRAL_8X7B
    always = m["layers"] * (attn + m["hidden"] * 8) + m["vocab"] * m["hidden"]
    def step_ms(B, bytes_per=2, gpus=2):
        params = m["layers"] * touched(B) * expert + always
        return params * bytes_per / gpus / HBM_BYTES_PER_S * 1e3
    read = lambda B: m["layers"] * touched(B) * expert + always   # noqa: E731
    assert round(read(1) / 1e9, 2) == 12.75 and round(read(16) / 1e9, 1) == 46.1
    assert round(step_ms(1), 2) == 3.81 and round(step_ms(16), 1) == 13.8
    assert round(step_ms(16) / step_ms(1), 1) == 3.6
    assert round(step_ms(1, 1, 1), 2) == 3.81                 # FP8 on one card: same bytes per GPU
    # KV per token and what fits
    kv = m["layers"] * 2 * m["kv_heads"] * m["head_dim"] * 2
    assert kv == 131_072
    assert int((2 * BUDGET_80GB - total * 2) // kv) == 386_004
    assert int((BUDGET_80GB - total) // kv) == 193_002
    assert round((BUDGET_80GB - total) / 1e9, 1) == 25.3
    assert round((2 * BUDGET_80GB - 2 * total) / 1e9, 1) == 50.6
    # tuned-config file names: N is the per-GPU intermediate size
    assert m["inter"] // 2 == 7168


def test_item16_deepseek_v3_ep_vs_tp():
    d = DEEPSEEK_V3
    moe_layers = d["layers"] - d["dense_layers"]
    assert moe_layers == 58
    per_expert = 3 * d["hidden"] * d["moe_inter"]
    assert per_expert == 44_040_192
    assert round(moe_layers * d["routed"] * per_expert / 1e9, 1) == 653.9
    assert d["routed"] // 8 == 32                       # experts per GPU under EP=8
    assert d["moe_inter"] // 8 == 256                   # intermediate per GPU under TP=8
    assert 2 * d["moe_inter"] // 8 == 512               # w13 output columns per GPU under TP
    # tokens per expert at a decode batch of 64, evenly spread
    assert 64 * d["top_k"] / d["routed"] == 2.0
    # bytes each token's hidden state costs to move, bf16
    assert d["hidden"] * 2 == 14_336
    # an all-reduce of the layer output under TP vs dispatch + combine to up to 8 GPUs under EP
    assert 8 * 14_336 * 2 == 229_376


def test_item17_default_group_and_warning_facts():
    # tokens per expert needed before get_default_config turns on GROUP_SIZE_M
    assert 129 * 8 == 1032 and default_config_by_rule(1032, 8)["GROUP_SIZE_M"] == 16
    assert default_config_by_rule(1031, 8)["GROUP_SIZE_M"] == 1


# == upstream facts the answers lean on ===========================================================

def _function_from(path, name):
    src = (UPSTREAM / path).read_text(encoding="utf-8")
    tree = ast.parse(src)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(src, fn)


class _Env:
    VLLM_BATCH_INVARIANT = False


class _Platform:
    @staticmethod
    def is_rocm():
        return False


@pytest.mark.upstream
def test_get_default_config_at_the_pin_matches_the_pages():
    ns = {"envs": _Env, "current_platform": _Platform}
    exec(_function_from(f"{MOE}/fused_moe.py", "get_default_config"), ns)
    get_default_config = ns["get_default_config"]
    for M in (1, 8, 16, 32, 33, 40, 64, 65, 96, 97, 128, 129, 200, 512, 513, 1031, 1032, 4096):
        for E in (8, 64, 256):
            assert get_default_config(M, E, 14336, 4096, 2, None) == default_config_by_rule(M, E)
    fp8 = get_default_config(200, 8, 14336, 4096, 2, "fp8_w8a8")
    assert fp8["BLOCK_SIZE_K"] == 128


@pytest.mark.upstream
def test_tuned_json_lookup_for_mixtral_on_h100():
    cfg = UPSTREAM / MOE / "configs"
    tp2 = cfg / "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert tp2.is_file()
    assert not (cfg / "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json").exists()
    assert (cfg / "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json").is_file()
    assert (cfg / "E=8,N=14336,device_name=NVIDIA_H200.json").is_file()
    table = json.loads(tp2.read_text())
    table.pop("triton_version", None)
    configs = {int(k): v for k, v in table.items()}
    pick = lambda M: configs[min(configs.keys(), key=lambda x: abs(x - M))]   # noqa: E731
    assert min(configs.keys(), key=lambda x: abs(x - 40)) == 32                 # tie: first key
    assert pick(40)["BLOCK_SIZE_M"] == 16 and pick(48)["BLOCK_SIZE_M"] == 32
    assert min(configs.keys(), key=lambda x: abs(x - 200)) == 256
    assert (pick(200)["BLOCK_SIZE_M"], pick(200)["GROUP_SIZE_M"]) == (64, 64)
    assert pick(1)["BLOCK_SIZE_M"] == 16 and pick(5000)["BLOCK_SIZE_M"] == 128
    assert max(configs) == 4096
    # the lookup and the file name, as the pages quote them
    src = (UPSTREAM / MOE / "fused_moe.py").read_text(encoding="utf-8")
    assert "config = configs[min(configs.keys(), key=lambda x: abs(x - M))]" in src
    assert 'if "H200" in device_name.split("_"):' in src
    assert "E, _, N = w2_shape" in src
    assert "tokens_per_expert = M // max(E, 1)" in src
    assert "group_m = 16 if tokens_per_expert > 128 else 1" in src
    assert "user_defined_config_folder = envs.VLLM_TUNED_CONFIG_FOLDER" in src


@pytest.mark.upstream
def test_routing_and_alignment_facts_at_the_pin():
    fm = (UPSTREAM / MOE / "fused_moe.py").read_text(encoding="utf-8")
    assert "and num_tokens * top_k_num * 4 <= global_num_experts" in fm
    assert "topk_ids.numel() * config[\"BLOCK_SIZE_M\"]" in fm
    assert "offs_token[:, None] // top_k * stride_am" in fm
    assert "token_mask = offs_token < num_valid_tokens" in fm
    assert "if off_experts == -1:" in fm
    align_src = (UPSTREAM / MOE / "moe_align_block_size.py").read_text(encoding="utf-8")
    assert "max_num_tokens_padded = topk_ids.numel() + num_experts * (block_size - 1)" in align_src
    assert "topk_ids.numel() * block_size, max_num_tokens_padded" in align_src
    mixtral = (UPSTREAM / "vllm/model_executor/models/mixtral.py").read_text(encoding="utf-8")
    assert "renormalize=True," in mixtral
    ds = (UPSTREAM / "vllm/model_executor/models/deepseek_v2.py").read_text(encoding="utf-8")
    assert "use_grouped_topk=True," in ds
    assert "intermediate_size = config.moe_intermediate_size * config.n_shared_experts" in ds
    gt = (UPSTREAM / MOE / "router/grouped_topk_router.py").read_text(encoding="utf-8")
    assert "scores.view(num_token, num_expert_group, -1).max(dim=-1).values" in gt
    assert "scores.view(num_token, num_expert_group, -1).topk(2, dim=-1)[0].sum(dim=-1)" in gt


@pytest.mark.upstream
def test_fp8_kernel_facts_at_the_pin():
    lin = "vllm/model_executor/kernels/linear"
    marlin = (UPSTREAM / lin / "scaled_mm/marlin.py").read_text(encoding="utf-8")
    assert "compute_capability >= 89" in marlin
    fi = (UPSTREAM / lin / "scaled_mm/flashinfer.py").read_text(encoding="utf-8")
    assert "100" in fi
    init = (UPSTREAM / lin / "__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(init)
    table = next(n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
                 and getattr(n.target, "id", "") == "_POSSIBLE_FP8_KERNELS")
    cuda = next(v for k, v in zip(table.value.keys, table.value.values, strict=True)
                if ast.unparse(k) == "PlatformEnum.CUDA")
    assert [ast.unparse(e) for e in cuda.elts] == [
        "MarlinFP8ScaledMMLinearKernel", "FlashInferFP8ScaledMMLinearKernel",
        "CutlassFP8ScaledMMLinearKernel", "PerTensorTorchFP8ScaledMMLinearKernel",
        "ChannelWiseTorchFP8ScaledMMLinearKernel"]
