"""Every worked number in Phase 10's guide, recomputed.

The guide quotes these values; if one changes here, the text is wrong. Each test names the
section of ``00-guide.md`` it backs. The rules are restated here in a few lines of numpy and
plain Python with upstream's conventions (``pad_vocab_size`` rounding to 64, KV-head replicas
``tp // num_kv_heads``, ``get_pp_indices``' remainder placement, ``initialize_model_parallel``'s
reshape and transposes, ``should_custom_ar``, the DP balancer's score), independent of the labs'
code. Numbers measured by a lab (gloo timings, mini_vllm's collective counts) are asserted by
that lab's tests; the ones repeated here are pure arithmetic. Link figures in section 7 are the
guide's stated assumptions, not measurements. Pure Python and numpy, well under a second. The
test that reads ``upstream/`` skips when it is absent.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM
KIB, MIB, GIB = 1024, 1024**2, 1024**3

# Llama-3.1 configurations (the ones Phase 00's lab 02 uses)
L70 = dict(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, inter=28672, vocab=128256)
L8 = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256)


def n_params(c):
    h, hd = c["hidden"], c["head_dim"]
    attn = h * c["heads"] * hd + 2 * h * c["kv_heads"] * hd + c["heads"] * hd * h
    mlp = 3 * h * c["inter"]
    per_layer = attn + mlp + 2 * h                       # two RMSNorm weights
    return c["layers"] * per_layer + 2 * c["vocab"] * h + h   # embed + untied LM head + final norm


def kv_bytes_per_token(c, dtype_bytes=2):
    return 2 * c["layers"] * c["kv_heads"] * c["head_dim"] * dtype_bytes


def kv_heads_per_rank(num_kv_heads, tp):
    """(KV heads per rank, replicas), as QKVParallelLinear computes them."""
    if tp >= num_kv_heads:
        assert tp % num_kv_heads == 0
        return 1, tp // num_kv_heads
    assert num_kv_heads % tp == 0
    return num_kv_heads // tp, 1


def pad_vocab_size(v, pad_to=64):
    return ((v + pad_to - 1) // pad_to) * pad_to


def ring_bytes_per_rank(payload, n):
    return 2 * (n - 1) / n * payload


def allreduce_time(payload, n, alpha, beta):
    return 2 * (n - 1) * alpha + ring_bytes_per_rank(payload, n) / beta


def pp_indices(num_layers, pp_size):
    """Layers per stage, with get_pp_indices' remainder placement."""
    parts = [num_layers // pp_size] * pp_size
    rem = num_layers % pp_size
    for i in range(2, rem + 2):
        parts[-i] += 1
    return parts


def groups(world, dp=1, pp=1, pcp=1, tp=1):
    a = np.arange(world).reshape(-1, dp, pp, pcp, tp)
    return {
        "tp": a.reshape(-1, tp).tolist(),
        "pp": np.swapaxes(a, 2, 4).reshape(-1, pp).tolist(),
        "dp": np.swapaxes(a, 1, 4).reshape(-1, dp).tolist(),
        "ep": np.swapaxes(a, 1, 2).reshape(-1, dp * pcp * tp).tolist(),
    }


def should_custom_ar(nbytes, world, fully_connected, contiguous=True, max_size=8 * MIB):
    if world not in (2, 4, 6, 8):
        return False                                # the communicator is never created
    if world > 2 and not fully_connected:
        return False                                # disabled at construction
    if nbytes % 16 != 0 or not contiguous:
        return False
    return nbytes < max_size


def route(counts, n_requests, start=0, client_count=1, local_increment=True):
    counts = [list(c) for c in counts]
    chosen = []
    for _ in range(n_requests):
        best, idx = None, 0
        for i in range(len(counts)):
            j = (start + i) % len(counts)
            score = counts[j][0] * 4 + counts[j][1]
            if best is None or score < best:
                best, idx = score, j
        if local_increment:
            counts[idx][0] += client_count
        chosen.append(idx)
    return chosen


# -- guide, section 1: why one GPU is not enough --------------------------------------------------

def test_guide_s1_weights_and_kv_of_70b():
    p = n_params(L70)
    assert p == 70_553_706_496
    assert round(p * 2 / 1e9, 1) == 141.1 and round(p * 2 / GIB, 1) == 131.4
    assert kv_bytes_per_token(L70) == 327_680 == 320 * KIB
    assert kv_bytes_per_token(L70) * 8192 / GIB == 2.5
    assert p * 2 / GIB > 80                                   # does not fit one 80 GiB card


def test_guide_s1_per_gpu_table_and_capacity():
    w = n_params(L70) * 2 / GIB
    assert [round(w / tp, 1) for tp in (1, 2, 4, 8)] == [131.4, 65.7, 32.9, 16.4]
    kv = kv_bytes_per_token(L70)
    per_rank = [kv * kv_heads_per_rank(8, tp)[0] / 8 for tp in (1, 2, 4, 8)]
    assert per_rank == [320 * KIB, 160 * KIB, 80 * KIB, 40 * KIB] and per_rank[-1] == 40_960
    left = 80 * 0.92 - w / 8
    assert round(left, 1) == 57.2
    tokens = left * GIB / 40_960
    assert round(tokens / 1e6, 1) == 1.5
    assert int(tokens // 8192) == 182


# -- guide, section 3: column then row ------------------------------------------------------------

def test_guide_s3_llama8b_mlp_shapes_at_tp4():
    tp = 4
    assert L8["inter"] // tp == 3584
    assert (L8["hidden"], 2 * L8["inter"] // tp) == (4096, 7168)
    assert (L8["inter"] // tp, L8["hidden"]) == (3584, 4096)
    merged = 2 * L8["inter"]
    assert merged == 28672
    naive_rank0 = np.array_split(np.arange(merged), tp)[0]
    assert (naive_rank0[0], naive_rank0[-1]) == (0, 7167) and naive_rank0[-1] < L8["inter"]  # gate only
    up_rank0 = L8["inter"] + np.arange(3584)
    assert (up_rank0[0], up_rank0[-1]) == (14336, 17919)


def test_guide_s3_column_then_row_equals_dense_with_one_reduction():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8))
    w1, w2 = rng.standard_normal((8, 12)), rng.standard_normal((12, 8))
    dense = np.maximum(x @ w1, 0) @ w2
    n = 4
    partials = [np.maximum(x @ c, 0) @ r for c, r in zip(np.split(w1, n, axis=1), np.split(w2, n, axis=0))]
    assert np.allclose(sum(partials), dense)                  # one sum (all-reduce) at the end
    bias = rng.standard_normal(8)
    assert not np.allclose(sum(p + bias for p in partials), dense + bias)   # bias on every rank: N times
    assert np.allclose(sum(partials) + bias, dense + bias)                  # rank 0 only


# -- guide, section 4: attention under TP --------------------------------------------------------

def test_guide_s4_qkv_split_llama8b_tp4():
    heads, kvh = L8["heads"] // 4, kv_heads_per_rank(L8["kv_heads"], 4)[0]
    assert (heads, kvh) == (8, 2)
    assert heads * 128 + kvh * 128 + kvh * 128 == 1536
    assert heads * 128 == 1024


def test_guide_s4_kv_replication_70b_tp16():
    assert kv_heads_per_rank(8, 16) == (1, 2)
    assert [r // 2 for r in range(4)] == [0, 0, 1, 1]              # shard_rank = rank // replicas
    assert 64 // 16 == 4
    per_rank_tp8 = kv_bytes_per_token(L70) // 8
    per_rank_tp16 = kv_bytes_per_token(L70) // 8 * kv_heads_per_rank(8, 16)[0]
    assert per_rank_tp8 == per_rank_tp16 == 40_960
    assert 64 % 12 != 0 and 12 % 8 != 0                            # TP = 12 does not divide


# -- guide, section 5: vocabulary ---------------------------------------------------------------

def test_guide_s5_padding():
    assert L70["vocab"] * L70["hidden"] == 1_050_673_152            # 1.05 billion
    assert pad_vocab_size(128_256) == 128_256 == 2004 * 64
    assert 128_256 // 8 == 16_032
    assert pad_vocab_size(257) == 320 and 320 // 2 == 160
    assert 320 - 257 == 63


def test_guide_s5_masked_embedding_example():
    rng = np.random.default_rng(1)
    table = rng.standard_normal((320, 4))
    ids = np.array([5, 200, 17])
    out = np.zeros((3, 4))
    locals_, masks = [], []
    for rank in range(2):
        lo, hi = rank * 160, rank * 160 + 160
        inside = (ids >= lo) & (ids < hi)
        local = np.where(inside, ids - lo, 0)
        locals_.append(local.tolist()); masks.append((~inside).tolist())
        rows = table[lo:hi][local]
        rows[~inside] = 0.0
        out += rows
    assert locals_ == [[5, 0, 17], [0, 40, 0]]
    assert masks == [[False, True, False], [True, False, True]]
    assert np.array_equal(out, table[ids])


# -- guide, section 6: collectives per step ------------------------------------------------------

def test_guide_s6_counts_and_bytes():
    assert 2 * L8["layers"] + 1 == 65 and 2 * L70["layers"] + 1 == 161
    assert 2 * 2 + 1 == 5                                           # tiny-random, 2 layers
    payload = L70["hidden"] * 2
    assert payload == 16 * KIB
    assert ring_bytes_per_rank(payload, 8) == 28_672
    assert 161 * 28_672 == 4_616_192
    assert 7 / 8 * L70["vocab"] * 2 == 224_448


# -- guide, section 7: ring and alpha-beta ------------------------------------------------------

def test_guide_s7_ring_factor():
    assert [2 * (n - 1) / n for n in (2, 4, 8)] == [1.0, 1.5, 1.75]
    assert 2 * (10**6 - 1) / 10**6 < 2


def test_guide_s7_link_comparison():
    s = L8["hidden"] * 2
    assert s == 8 * KIB
    assert 2048 * 4096 * 2 == 16 * MIB
    compute = 8e-3
    nv = 64 * allreduce_time(s, 2, 3e-6, 450e9)
    assert round(nv * 1e3, 3) == 0.385 and nv < 1e-3
    assert round(8192 / 450e9 * 1e6, 2) == 0.02
    assert round(nv / (compute + nv) * 100, 1) == 4.6
    eth = 64 * allreduce_time(s, 2, 50e-6, 1.25e9)
    assert round(8192 / 1.25e9 * 1e6, 2) == 6.55
    assert round(eth * 1e3, 2) == 6.82 and round(eth / (compute + eth) * 100) == 46
    lat = 64 * 2 * 50e-6
    assert round(lat * 1e3, 1) == 6.4
    assert round(lat / (compute + lat) * 100) == 44 and round(lat / compute * 100) == 80
    assert 900 / 2 == 450


# -- guide, section 8: custom all-reduce or NCCL --------------------------------------------------

def test_guide_s8_dispatch():
    assert 8192 * 1024 == 8 * MIB
    assert should_custom_ar(8 * KIB, 2, fully_connected=False)          # decode, two PCIe GPUs
    assert not should_custom_ar(16 * MIB, 2, fully_connected=True)      # prefill chunk
    assert not should_custom_ar(8 * MIB, 2, fully_connected=True)       # strictly under
    assert should_custom_ar(256 * KIB - 16, 8, True, max_size=min(MIB // 4, 8 * MIB))
    assert MIB // 4 == 256 * KIB
    assert not should_custom_ar(8 * KIB + 2, 2, True)                   # not a multiple of 16
    # check yourself 4
    assert [should_custom_ar(4 * MIB, 4, True), should_custom_ar(4 * MIB, 4, False),
            should_custom_ar(12 * MIB, 2, True)] == [True, False, False]


# -- guide, section 9: sum order ----------------------------------------------------------------

def test_guide_s9_addition_is_not_associative():
    assert (0.1 + 0.2) + 0.3 == 0.6000000000000001
    assert 0.1 + (0.2 + 0.3) == 0.6
    assert 2.0**-7 == 0.0078125


# -- guide, section 10: pipeline --------------------------------------------------------------

def bubble(p, m):
    return (p - 1) / (p + m - 1)


def min_microbatches(p, budget):
    return math.ceil((p - 1) * (1 - budget) / budget - 1e-9)


def test_guide_s10_layers_and_bytes():
    assert pp_indices(80, 3) == [27, 27, 26]
    assert pp_indices(80, 4) == [20] * 4
    assert 2 * L70["hidden"] * 2 == 32 * KIB


def test_guide_s10_bubble_grid():
    p, m = 4, 4
    busy = np.zeros((p, p + m - 1), dtype=int)
    for s in range(p):
        busy[s, s:s + m] = 1
    assert busy.shape[1] == 7 and busy.sum() == 16 and busy.size == 28
    assert math.isclose(1 - busy.sum() / busy.size, bubble(4, 4)) and round(bubble(4, 4) * 100) == 43
    assert min_microbatches(8, 0.10) == 63 and math.isclose(bubble(8, 63), 7 / 70)
    assert bubble(8, 62) > 0.10


def test_guide_s10_concurrency_and_output_rank():
    def max_concurrent_batches(pp, async_sched):
        return 2 if pp <= 1 and async_sched else pp
    assert max_concurrent_batches(1, True) == 2 and max_concurrent_batches(4, True) == 4
    assert 32 - 8 * 1 == 24                                   # TP 8, PP 4
    assert groups(32, pp=4, tp=8)["pp"][0] == [0, 8, 16, 24]


# -- guide, section 11: rank groups ---------------------------------------------------------------

def test_guide_s11_docstring_example():
    g = groups(8, pp=4, tp=2)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["pp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_guide_s11_dp2_tp2_moe():
    g = groups(4, dp=2, tp=2)
    assert g["tp"] == [[0, 1], [2, 3]]
    assert g["dp"] == [[0, 2], [1, 3]]
    assert g["ep"] == [[0, 1, 2, 3]]


# -- guide, section 13: DP load balancer ------------------------------------------------------

def test_guide_s13_burst():
    assert route([[0, 0]] * 4, 8, local_increment=False) == [0] * 8
    chosen = route([[0, 0]] * 4, 8)
    assert [chosen.count(i) for i in range(4)] == [2, 2, 2, 2]
    assert [4 * 1 // 2, 4 * 0 // 2] == [2, 0]                  # eng_start_index for 2 clients


def test_guide_s13_check_yourself_7():
    counts = [[2, 3], [0, 5], [1, 1], [0, 2]]
    assert [w * 4 + r for w, r in counts] == [11, 5, 5, 2]
    assert route(counts, 2) == [3, 1]


# -- guide, section 14: decode context parallelism -----------------------------------------------

def owner(t, world, interleave=1):
    return (t // interleave) % world


def test_guide_s14_interleave():
    assert [t for t in range(40) if owner(t, 8) == 0] == [0, 8, 16, 24, 32]
    assert owner(10, 4) == 2 and owner(10, 4, 16) == 0 and owner(16, 4, 16) == 1


def test_guide_s14_lse_merge_equals_full_attention_and_average_does_not():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal(4), rng.standard_normal((10, 4)), rng.standard_normal((10, 3))
    s = k @ q
    full = np.exp(s - s.max()) @ v / np.exp(s - s.max()).sum()
    outs, lses = [], []
    for r in range(4):
        idx = [t for t in range(10) if owner(t, 4) == r]
        sr = s[idx]
        lses.append(np.log(np.exp(sr).sum()))
        outs.append(np.exp(sr) @ v[idx] / np.exp(sr).sum())
    lse = np.log(np.exp(lses).sum())
    merged = sum(np.exp(l - lse) * o for l, o in zip(lses, outs))
    assert np.allclose(merged, full)
    assert not np.allclose(sum(outs) / 4, full)


# -- guide, section 16: the capacity mistake -------------------------------------------------------

def test_guide_s16_opt13b_blocks():
    per_token = 24 * 2 * 2048 * 2
    assert per_token == 196_608 and per_token // 2 == 98_304 == 96 * KIB
    block = per_token // 2 * 16
    assert block == 1_572_864 == int(1.5 * MIB)
    assert round(28_500 * block / GIB) == 42
    assert 28_500 * block > 24e9


# -- guide, section 17: check yourself ------------------------------------------------------------

def test_guide_s17_answers():
    assert kv_heads_per_rank(4, 8) == (1, 2) and 5 // 2 == 2 and kv_heads_per_rank(4, 4) == (1, 1)
    assert 4 + 12 - 1 == 15 and bubble(4, 12) == 0.2
    assert min_microbatches(4, 0.05) == 57 and math.isclose(bubble(4, 57), 0.05)
    g = groups(16, pp=2, tp=8)
    assert g["pp"] == [[i, i + 8] for i in range(8)] and 16 - 8 == 8


# -- the pin: the lines the guide leans on --------------------------------------------------------

def _read(rel):
    return (UPSTREAM / rel).read_text()


@pytest.mark.skipif(not (UPSTREAM / "vllm").exists(), reason="upstream/ not unpacked")
def test_pin_rules_the_guide_states():
    lin = _read("vllm/model_executor/layers/linear.py")
    assert "self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)" in lin
    assert "shard_rank = self.tp_rank // self.num_kv_head_replicas" in lin
    assert "bias_ = None if (self.tp_rank > 0 or self.skip_bias_add) else self.bias" in lin
    vpe = _read("vllm/model_executor/layers/vocab_parallel_embedding.py")
    assert "DEFAULT_VOCAB_PADDING_SIZE = 64" in vpe
    car = _read("vllm/distributed/device_communicators/custom_all_reduce.py")
    assert "_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]" in car and "max_size=8192 * 1024," in car
    assert "return inp_size < self.max_size" in car
    ex = _read("vllm/v1/executor/multiproc_executor.py")
    assert "return 2 if pp_size <= 1 and self.scheduler_config.async_scheduling else pp_size" in ex
    client = _read("vllm/v1/engine/core_client.py")
    assert "score = waiting * 4 + running" in client
    assert "current_counts[eng_index][0] += self.client_count" in client
    assert "if self.step_counter % 32 != 0:" in _read("vllm/v1/engine/core.py")
    assert "min_stats_update_interval_ms: int = 100," in _read("vllm/v1/engine/coordinator.py")
    assert "for i in range(2, remaining_layers + 2):" in _read("vllm/distributed/utils.py")
    assert "cp_kv_cache_interleave_size: int = 1" in _read("vllm/config/parallel.py")
    assert '"9.0": {' in _read("vllm/distributed/device_communicators/all_reduce_utils.py")
    assert "8: MiB // 4," in _read("vllm/distributed/device_communicators/all_reduce_utils.py")
    interface = _read("vllm/platforms/interface.py")
    assert "def use_all_gather(cls) -> bool:" in interface
