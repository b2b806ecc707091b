"""Every worked number in Phase 07's guide and deep-dive, recomputed.

The pages quote these values; if one of them changes here, the text is wrong. Numbers that rest
on an assumption (a bandwidth, a peak rate, an SM count) take it from the ASSUMPTIONS block
below, which the guide states in the same words. Model shapes are the published ``config.json``
values. Numbers measured or computed by a lab (lab 03's traffic table, lab 04's EPLB placement,
lab 05's kernel table) are asserted by that lab's tests; the ones repeated here are the pure
arithmetic. Pure Python and numpy; well under a second. The tests that read ``upstream/`` skip
when it is absent.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM
FUSED_MOE = "vllm/model_executor/layers/fused_moe"

# -- ASSUMPTIONS (labelled as such in the guide, sections 3 and 4) ---------------------------
HBM_BYTES_PER_S = 3.35e12       # H100 SXM datasheet peak
BF16_FLOPS = 989e12             # H100 SXM dense bf16 datasheet peak
H100_SMS = 132                  # H100 SXM datasheet

# Published configs (config.json on the Hugging Face Hub).
LLAMA_8B = dict(layers=32, hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128)
MIXTRAL = dict(layers=32, hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128,
               vocab=32000, experts=8, top_k=2)


def intensity(m, n, k, elem=2):
    """FLOPs per byte of a GEMM that reads A and B once and writes C once."""
    return 2 * m * n * k / (elem * (m * k + k * n + m * n))


def naive_loads(m, n, k):
    return m * n * 2 * k


def tiled_loads(m, n, k, tm, tn):
    return m * k * math.ceil(n / tn) + k * n * math.ceil(m / tm)


def align(topk_ids, block, num_experts):
    """Stable-order moe_align_block_size (the golden of upstream's test)."""
    flat = np.asarray(topk_ids).reshape(-1)
    pad = flat.size
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        slots = [int(s) for s in np.flatnonzero(flat == e)]
        if not slots:
            continue
        n_blocks = math.ceil(len(slots) / block)
        sorted_ids += slots + [pad] * (n_blocks * block - len(slots))
        expert_ids += [e] * n_blocks
    return sorted_ids, expert_ids, len(sorted_ids)


# -- guide, section 1: where the time goes ----------------------------------------------------

def test_guide_s1_projection_vs_attention_work():
    m = LLAMA_8B
    q_o = 2 * m["hidden"] * m["heads"] * m["head_dim"]
    k_v = 2 * m["hidden"] * m["kv_heads"] * m["head_dim"]
    mlp = 3 * m["hidden"] * m["inter"]
    per_layer = q_o + k_v + mlp
    assert per_layer == 218_103_808                      # "218 million weights"
    assert 2 * per_layer == 436_207_616                  # "436 million" FLOPs per token
    attn = m["heads"] * 1000 * m["head_dim"] * 2 * 2     # QK and PV, 2 FLOPs per multiply-add
    assert attn == 16_384_000                            # "16 million"
    assert attn / (2 * per_layer) < 0.1                  # "under a tenth"


# -- guide, section 2: tiling ------------------------------------------------------------------

def test_guide_s2_tiled_traffic():
    assert naive_loads(1024, 1024, 1024) == 2_147_483_648
    assert naive_loads(1024, 1024, 1024) * 2 == 4 * 2**30          # 4 GiB of bf16
    assert tiled_loads(1024, 1024, 1024, 128, 128) == 16_777_216
    assert tiled_loads(1024, 1024, 1024, 128, 128) * 2 == 32 * 2**20  # 32 MiB
    assert naive_loads(1024, 1024, 1024) // tiled_loads(1024, 1024, 1024, 128, 128) == 128
    assert 1024 * 1024 * 2 == 2 * 2**20                             # each matrix 2 MiB
    assert round(2 / (1 / 256 + 1 / 16), 1) == 30.1                 # 256 x 16 tile
    assert 256 * 16 == 64 * 64
    assert 128 * 128 * 4 == 64 * 2**10                              # fp32 accumulator, 64 KiB


# -- guide, section 3: intensity and the ridge -------------------------------------------------

def test_guide_s3_intensity_table():
    n = k = 4096
    got = [round(intensity(m, n, k), 1) for m in (1, 16, 64, 256, 345, 4096)]
    assert got == [1.0, 15.9, 62.1, 227.6, 295.3, 1365.3]
    ridge = BF16_FLOPS / HBM_BYTES_PER_S
    assert round(ridge) == 295
    # crossing: m * 4096 / (2m + 4096) = 295  ->  m = 295 * 4096 / (4096 - 590)
    crossing = 295 * 4096 / (4096 - 2 * 295)
    assert round(crossing) == 345
    assert intensity(344, n, k) < 295 < intensity(346, n, k)


# -- guide, section 4: waves and the grouped order ---------------------------------------------

def test_guide_s4_waves_and_group_order():
    tiles = (4096 // 128) * (4096 // 128)
    assert tiles == 1024
    assert round(tiles / H100_SMS, 2) == 7.76
    assert tiles - 7 * H100_SMS == 100                 # the last wave
    # lab 03: a wave of 9 programs on a 9 x 9 tile grid with 9 K steps
    assert (1 + 9) * 9 == 90 and (3 + 3) * 9 == 54


# -- guide, section 6: Mixtral's parameter count -----------------------------------------------

def mixtral_parts():
    m = MIXTRAL
    expert = 3 * m["hidden"] * m["inter"]
    attn = m["layers"] * (2 * m["hidden"] * m["heads"] * m["head_dim"]
                          + 2 * m["hidden"] * m["kv_heads"] * m["head_dim"])
    emb_head = 2 * m["vocab"] * m["hidden"]
    routers = m["layers"] * m["hidden"] * m["experts"]
    return expert, attn, emb_head, routers


def test_guide_s6_mixtral_total_and_active():
    expert, attn, emb_head, routers = mixtral_parts()
    assert expert == 176_160_768
    all_experts = expert * 8 * 32
    assert round(all_experts / 1e9, 2) == 45.10
    assert round(attn / 1e9, 2) == 1.34
    assert round((emb_head + routers) / 1e9, 2) == 0.26
    total = all_experts + attn + emb_head + routers
    active = expert * 2 * 32 + attn + emb_head + routers
    assert round(total / 1e9, 2) == 46.70 and round(active / 1e9, 2) == 12.88
    assert round(total * 2 / 1e9, 1) == 93.4 and total * 2 > 80e9   # does not fit one H100


# -- guide, section 7: routing and alignment ---------------------------------------------------

def test_guide_s7_renormalize_is_softmax_over_selected():
    logits = np.array([1.3, -0.2, 0.7, 2.1, 0.0, -1.0, 0.4, 0.9])
    p = np.exp(logits) / np.exp(logits).sum()
    ids = np.argsort(-p)[:2]
    renorm = p[ids] / p[ids].sum()
    sel = np.exp(logits[ids]) / np.exp(logits[ids]).sum()
    assert np.allclose(renorm, sel)
    assert p[ids].sum() < 1                             # without renormalize


def test_guide_s7_docstring_example():
    ids = [[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]]
    sorted_ids, expert_ids, total = align(ids, 4, num_experts=5)
    pad = 12                                            # T * k
    assert sorted_ids == [3, 6, 9, pad] + [0, 4, 10, pad] + [1, 7, 11, pad] + [2, 5, 8, pad]
    assert expert_ids == [1, 2, 3, 4] and total == 16
    # with num_experts = 4 (what the docstring says), expert 4's slots have nowhere to go
    assert align(ids, 4, num_experts=4)[2] == 12


def test_guide_s7_padding_bound():
    rng = np.random.default_rng(0)
    for _ in range(50):
        t, k, e, block = 37, 2, 8, 16
        ids = np.stack([rng.choice(e, size=k, replace=False) for _ in range(t)])
        assert align(ids, block, e)[2] <= t * k + e * (block - 1)


# -- guide, section 8: what decode reads -------------------------------------------------------

def test_guide_s8_experts_touched():
    miss = math.comb(7, 2) / math.comb(8, 2)
    assert miss == 0.75
    touched = [8 * (1 - miss**b) for b in (1, 4, 16, 64)]
    assert [round(x, 2) for x in touched] == [2.00, 5.47, 7.92, 8.00]
    assert miss**64 < 1.1e-8
    expert_bytes = 176_160_768 * 2
    assert [round(x * expert_bytes / 1e9, 2) for x in touched] == [0.70, 1.93, 2.79, 2.82]
    assert 64 * 2 / 8 == 16                              # rows per expert at batch 64


def test_guide_s8_batch16_floor_and_naive_assignment():
    expert, attn, emb_head, _ = mixtral_parts()
    touched = 8 * (1 - 0.75**16)
    weights = 32 * touched * expert + attn + emb_head // 2 + 32 * 4096 * 8   # head, no embedding
    assert round(weights * 2 / 1e9) == 92
    assert round(weights * 2 / HBM_BYTES_PER_S * 1e3, 1) == 27.5
    # DeepSeek-V3: 256 experts, k = 8: naive block assignment when T * k * 4 <= E
    assert max(t for t in range(1, 100) if t * 8 * 4 <= 256) == 8


# -- guide, section 10: group-limited routing --------------------------------------------------

def test_guide_s10_grouped_topk_example():
    s = np.array([.30, .05, .10, .12, .20, .02, .15, .06])
    groups = s.reshape(4, 2).max(axis=1)
    assert groups.tolist() == [.30, .12, .20, .15]
    kept = np.argsort(-groups)[:2]
    assert sorted(kept.tolist()) == [0, 2]
    mask = np.repeat(np.isin(np.arange(4), kept), 2)
    masked = np.where(mask, s, -np.inf)
    ids = np.argsort(-masked, kind="stable")[:3]
    assert ids.tolist() == [0, 4, 1]
    w = s[ids] / s[ids].sum()
    assert [round(x, 3) for x in w] == [0.545, 0.364, 0.091]
    assert np.argsort(-s, kind="stable")[:3].tolist() == [0, 4, 6]   # plain top-3


# -- guide, section 11: imbalance, drops, EPLB -------------------------------------------------

def test_guide_s11_imbalance_and_drops():
    loads = [64, 30, 10, 8, 6, 4, 4, 2]
    assert sum(loads) == 64 * 2
    assert max(loads) / np.mean(loads) == 4.0
    gpus = [sum(loads[i:i + 2]) for i in range(0, 8, 2)]
    assert gpus == [94, 18, 10, 6] and 128 / 4 == 32
    assert round(94 / 32, 1) == 2.9 and 94 / 32 == 2.9375
    capacity = math.floor(1.0 * 64 * 2 / 8)
    assert capacity == 16
    assert sum(max(0, x - capacity) for x in loads) == 62
    assert round(0.6 * 128) == 77 > 64                   # older course material's impossible batch
    assert 35 / 32 == 1.09375                           # EPLB's [35, 33, 30, 30]
    assert sum([35, 33, 30, 30]) == 128


# -- guide, section 15: check-yourself answers -------------------------------------------------

def test_guide_s15_answers():
    assert round(intensity(32, 8192, 8192), 1) == 31.8
    assert naive_loads(512, 512, 512) == 268_435_456
    assert tiled_loads(512, 512, 512, 64, 64) == 4_194_304
    p = np.array([0.5, 0.3])
    assert np.allclose(p / p.sum(), [0.625, 0.375])
    assert align([[0, 1], [1, 2], [1, 0]], 2, 3) == ([0, 5, 1, 2, 4, 6, 3, 6], [0, 1, 1, 2], 8)
    assert round(0.75**32, 4) == 0.0001
    loads = [40, 5, 5, 5, 30, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]
    linear = [sum(loads[i:i + 4]) for i in range(0, 16, 4)]
    assert linear == [55, 45, 20, 20] and sum(loads) / 4 == 35
    assert round(55 / 35, 2) == 1.57
    assert sum(loads[0::4]) == 80                       # round-robin GPU 0


# -- pin checks ------------------------------------------------------------------------------

@pytest.mark.upstream
def test_guide_s9_tuned_configs_at_the_pin():
    configs = UPSTREAM / FUSED_MOE / "configs"
    assert len(list(configs.glob("*.json"))) == 316
    table = json.loads((configs / "E=8,N=14336,device_name=NVIDIA_H200.json").read_text())
    rows = {m: [table[m][key] for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",
                                           "GROUP_SIZE_M", "num_warps", "num_stages")]
            for m in ("1", "16", "64", "256", "4096")}
    assert rows == {"1": [16, 128, 128, 16, 4, 5], "16": [16, 64, 256, 16, 4, 3],
                    "64": [32, 128, 128, 64, 4, 3], "256": [128, 256, 64, 1, 8, 4],
                    "4096": [128, 256, 64, 16, 8, 4]}
    # nearest batch size, ties to the first key in file order
    keys = [int(k) for k in table]
    assert min(keys, key=lambda x: abs(x - 100)) == 96
    assert min(keys, key=lambda x: abs(x - 80)) == 64


@pytest.mark.upstream
def test_kernel_facts_at_the_pin():
    fm = (UPSTREAM / FUSED_MOE / "fused_moe.py").read_text()
    assert "num_tokens * top_k_num * 4 <= global_num_experts" in fm
    assert "if M <= 32:\n            block_m = 16" in fm
    assert "elif M <= 96:\n            block_m = 32" in fm
    assert "elif M <= 512:\n            block_m = 64" in fm
    align_src = (UPSTREAM / FUSED_MOE / "moe_align_block_size.py").read_text()
    assert "topk_ids.numel() + num_experts * (block_size - 1)" in align_src
    assert "block_size = 4, and num_experts = 4" in align_src
    cmake = (UPSTREAM / "CMakeLists.txt").read_text()
    assert 'set(CUTLASS_REVISION "v4.4.2")' in cmake
    par = (UPSTREAM / "vllm/config/parallel.py").read_text()
    assert "window_size: int = Field(default=1000" in par
    assert "step_interval: int = Field(default=3000" in par
    lin = (UPSTREAM / "vllm/model_executor/kernels/linear/__init__.py").read_text()
    table = lin[lin.index("_POSSIBLE_FP8_KERNELS:"):lin.index("PlatformEnum.ROCM", lin.index("_POSSIBLE_FP8_KERNELS:"))]
    assert re.findall(r"(\w+ScaledMMLinearKernel),", table) == [
        "MarlinFP8ScaledMMLinearKernel", "FlashInferFP8ScaledMMLinearKernel",
        "CutlassFP8ScaledMMLinearKernel", "PerTensorTorchFP8ScaledMMLinearKernel",
        "ChannelWiseTorchFP8ScaledMMLinearKernel"]


# -- deep-dive ---------------------------------------------------------------------------------

def test_deep_dive_sizes_and_checklist():
    # section 11: the tuned files' N is the expert width per TP rank
    assert 14336 // 2 == 7168 and 14336 // 4 == 3584
    # section 9: GEMM 1's N is 2I; the shared buffer holds M * k * max(2I, H) elements
    i, h = 14336, 4096
    assert max(2 * i, h) == 28672
    # section 2 / checklist: Mixtral with 2 redundant experts
    assert 8 + 2 == 10
    # section 8 / checklist: worst-case sorted_ids for T = 64, k = 2, E = 8, block 16
    assert 64 * 2 + 8 * (16 - 1) == 248
    # section 13 / checklist: 10 experts on 4 ranks, as the code splits them
    base, rem = divmod(10, 4)
    assert [base + 1 if r < rem else base for r in range(4)] == [3, 3, 2, 2]


def test_deep_dive_s11_default_config_rule():
    def block_m(m):
        return 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    assert [block_m(m) for m in (1, 32, 33, 96, 97, 512, 513)] == [16, 16, 32, 32, 64, 64, 128]
