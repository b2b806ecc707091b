"""Every worked number in Phase 11's guide, recomputed.

The guide quotes these values; if one changes here, the text is wrong. Each test names the
section of ``00-guide.md`` it backs. The rules are restated in a few lines of numpy and plain
Python with upstream's conventions (PEFT's ``lora_alpha / r`` and rsLoRA's ``lora_alpha /
sqrt(r)``, the stacked slot shapes of ``create_lora_weights``, ``get_captured_lora_counts``, the
scheduler's ``max_loras`` skip, the name in the block hash), independent of the labs' code.
Numbers measured by a lab (lab 04's LRU hit rates) are asserted by that lab's tests, and the
CPU timings of section 15 are measurements, not asserted; what is repeated here is arithmetic.
Pure Python and numpy, well under a second. The test that reads ``upstream/`` skips when it is
absent.
"""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest

import course

UPSTREAM = course.UPSTREAM
KIB, MIB, GIB = 1024, 1024**2, 1024**3

# Llama-2-7B (meta-llama/Llama-2-7b-hf config.json): no GQA, untied lm_head
L2 = dict(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, inter=11008, vocab=32000)
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL7 = ATTN + ("gate_proj", "up_proj", "down_proj")


def n_params(c):
    h, hd = c["hidden"], c["head_dim"]
    attn = h * c["heads"] * hd + 2 * h * c["kv_heads"] * hd + c["heads"] * hd * h
    mlp = 3 * h * c["inter"]
    per_layer = attn + mlp + 2 * h                          # two RMSNorm weights
    return c["layers"] * per_layer + 2 * c["vocab"] * h + h  # embed + untied lm_head + final norm


def shapes(c):
    """(in, out) of the seven projections, by PEFT name."""
    h, q, kv, f = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["inter"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


def lora_params(n_in, n_out, r):
    return r * (n_in + n_out)                                # A [r, in] + B [out, r]


def adapter_params(c, r, targets):
    s = shapes(c)
    return c["layers"] * sum(lora_params(*s[t], r) for t in set(targets))


def projection_params(c):
    return c["layers"] * sum(i * o for i, o in shapes(c).values())


def scaling(alpha, r, use_rslora=False):
    return alpha / (math.sqrt(r) if use_rslora else r)      # PEFTHelper.__post_init__


def slot_elements_per_layer(c, rank):
    """One slot of vLLM's stacks for Llama's four wrapped projections, TP = 1."""
    h, q, kv, f = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["inter"]
    qkv = 3 * rank * h + (q + 2 * kv) * rank                 # one A per slice, B per slice
    o = rank * q + h * rank
    gate_up = 2 * rank * h + 2 * f * rank
    down = rank * f + h * rank
    return qkv + o + gate_up + down


def embedding_slot_elements(c, rank):
    """embed_tokens and lm_head wrappers: (vocab x R) + (hidden x R) each."""
    return 2 * (c["vocab"] * rank + c["hidden"] * rank)


def gpus_saved(n, max_loras, gpus_per_model=1):
    return n * gpus_per_model - -(-n // max_loras) * gpus_per_model


def captured_lora_counts(max_loras, specialize):
    """get_captured_lora_counts (vllm/lora/utils.py) restated."""
    if not specialize:
        return [max_loras + 1]
    return [n for n in range(1, max_loras + 2) if (n & (n - 1)) == 0 or n == max_loras + 1]


def lora_cases(max_loras, cudagraph_specialize_lora=True, specialize_active_lora=False):
    """CudagraphDispatcher._get_lora_cases restated."""
    if cudagraph_specialize_lora:
        return [0] + captured_lora_counts(max_loras, specialize_active_lora)
    return [max_loras + 1]


def schedule_waiting(waiting, running_ids, max_loras):
    """The max_loras walk: (admitted, skipped). waiting = [(name, lora_id or None)]."""
    scheduled = {i for i in running_ids if i is not None}
    admitted, skipped = [], []
    for name, lid in waiting:
        if lid is not None and len(scheduled) == max_loras and lid not in scheduled:
            skipped.append(name)
            continue
        admitted.append(name)
        if lid is not None:
            scheduled.add(lid)
    return admitted, skipped


# -- guide, section 2: LoRA in one equation --------------------------------------------------------

def test_guide_s2_shapes_and_zero_b():
    rng = np.random.default_rng(0)
    n_in, n_out, r = 12, 10, 3
    W = rng.standard_normal((n_out, n_in))
    A = rng.standard_normal((r, n_in))
    B = np.zeros((n_out, r))                               # PEFT's initialisation
    x = rng.standard_normal((5, n_in))
    assert np.array_equal(x @ W.T + (x @ A.T) @ B.T, x @ W.T)  # a fresh adapter is a no-op
    B = rng.standard_normal((n_out, r))
    s = scaling(16, 8)
    unmerged = x @ W.T + s * (x @ A.T) @ B.T
    merged = x @ (W + s * B @ A).T
    np.testing.assert_allclose(unmerged, merged, rtol=1e-12, atol=1e-12)
    assert np.linalg.matrix_rank(B @ A) == r


def test_guide_s2_scaling_and_rslora():
    assert scaling(16, 8) == 2.0 and scaling(16, 16) == 1.0 and scaling(16, 64) == 0.25
    assert scaling(16, 16, True) == 4.0 and scaling(16, 64, True) == 2.0
    assert scaling(16, 256) == 0.0625 and scaling(16, 256, True) == 1.0
    assert round(scaling(16, 8, True), 2) == 5.66
    # the classic scaling on an rsLoRA adapter of rank 64 is sqrt(64) = 8 times too small
    assert scaling(16, 64, True) / scaling(16, 64) == 8.0
    # quadrupling r divides alpha / r by 4 but alpha / sqrt(r) only by 2
    assert scaling(16, 16) / scaling(16, 64) == 4.0
    assert scaling(16, 16, True) / scaling(16, 64, True) == 2.0


# -- guide, section 3: counting ---------------------------------------------------------------------

def test_guide_s3_one_layer():
    assert 4096 * 4096 == 16_777_216
    assert lora_params(4096, 4096, 16) == 131_072
    assert 16_777_216 // 131_072 == 128
    assert 2 * 4096 * 4096 == 33_554_432 and 2 * 16 * (4096 + 4096) == 262_144
    assert 262_144 / 33_554_432 == 1 / 128 and round(100 / 128, 2) == 0.78


def test_guide_s3_llama2_adapter_sizes_and_the_one_ratio():
    p = n_params(L2)
    assert p == 6_738_415_616 and round(p * 2 / GIB, 2) == 12.55
    att = adapter_params(L2, 16, ATTN)
    assert att == 16_777_216 and att * 2 == 33_554_432 == 32 * MIB
    assert att * 4 == 64 * MIB                               # PEFT saves fp32 by default
    assert round(7e9 / att) == 417 and round(p / att) == 402
    assert round(p * 2 / (att * 2)) == 402                   # the same ratio in bytes
    allp = adapter_params(L2, 16, ALL7)
    assert allp == 39_976_960 and allp * 2 / MIB == 76.25
    assert adapter_params(L2, 64, ATTN) == 4 * att           # rank is linear
    assert adapter_params(L2, 64, ATTN) * 2 == 128 * MIB
    assert 4096 + 11008 == 15_104 and 16 * (4096 + 4096) == 131_072


def test_guide_s3_flops_fraction_of_the_projections():
    proj = projection_params(L2)
    assert proj == 6_476_005_376
    # LoRA FLOPs per token = 2 x adapter params; base projection FLOPs = 2 x projection params
    assert round(100 * adapter_params(L2, 16, ATTN) / proj, 2) == 0.26
    assert round(100 * adapter_params(L2, 16, ALL7) / proj, 2) == 0.62


# -- guide, section 4: merge or keep apart ----------------------------------------------------------

def test_guide_s4_merged_fleet_vs_shared_base():
    p, att = n_params(L2), adapter_params(L2, 16, ATTN)
    merged = 100 * p * 2
    shared = p * 2 + 100 * att * 2
    assert merged == 1_347_683_123_200 and round(merged / 1e12, 2) == 1.35
    assert shared == 16_832_274_432 and round(shared / 1e9, 1) == 16.8


def test_guide_s4_bf16_merge_is_not_bitwise():
    # A small delta added to a bf16-like weight loses its low bits: merged != unmerged bitwise.
    w, d = np.float32(1.0), np.float32(0.001)
    # bf16 keeps 8 significant bits: spacing near 1 is 2**-7 = 0.0078125
    spacing = 2.0**-7
    merged = round(float(w + d) / spacing) * spacing
    assert merged == 1.0 and float(w) + float(d) != merged


# -- guide, section 5: one batch, many adapters -----------------------------------------------------

def test_guide_s5_per_token_gather_with_minus_one():
    rng = np.random.default_rng(1)
    S, r, n_in, n_out = 2, 2, 6, 4
    A = rng.standard_normal((S, 1, r, n_in))
    B = rng.standard_normal((S, 1, n_out, r))
    x = rng.standard_normal((4, n_in))
    slots = np.array([1, -1, 0, 1])
    y = np.zeros((4, n_out))
    act = slots != -1
    h = np.einsum("ti,tri->tr", x[act], A[slots[act], 0])
    y[act] += np.einsum("tr,tor->to", h, B[slots[act], 0])
    assert np.array_equal(y[1], np.zeros(n_out))
    # a naive gather reads -1 as the last slot
    wrong = np.einsum("tr,tor->to", np.einsum("ti,tri->tr", x, A[slots, 0]), B[slots, 0])
    np.testing.assert_allclose(wrong[1], (x[1] @ A[1, 0].T) @ B[1, 0].T)


def test_guide_s5_ids_to_slots():
    lora_index_to_id = [7, None, 3]
    ids = [3, 0, 7, 3, 0]
    slots = [lora_index_to_id.index(i) if i > 0 else -1 for i in ids]  # convert_mapping's rule
    assert slots == [2, -1, 0, 2, -1]


def test_guide_s5_segments_explode():
    assert np.repeat([1, -1, 0], [3, 1, 2]).tolist() == [1, 1, 1, -1, 0, 0]


def test_guide_s5_padding_to_max_rank_is_exact():
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((4, 8)), rng.standard_normal((5, 4))
    Ap, Bp = np.zeros((16, 8)), np.zeros((5, 16))
    Ap[:4], Bp[:, :4] = A, B
    assert np.array_equal(Bp @ Ap, B @ A)


# -- guide, section 6: the CPU bug at the pin -------------------------------------------------------

def test_guide_s6_minus_one_is_the_last_slot():
    stack = np.array([[1.0, 0.0], [0.0, 5.0]])             # slot 0, slot 1
    x = np.ones(2)
    rows = [float(stack[s] @ x) for s in (0, 1, -1)]
    assert rows == [1.0, 5.0, 5.0]                           # what upstream's bgmv_shrink returns
    one_slot = np.array([[3.0, 3.0]])                        # max_loras = 1: the only slot is the last
    assert float(one_slot[-1] @ x) == float(one_slot[0] @ x) == 6.0


# -- guide, section 9: the scheduler's rule ---------------------------------------------------------

def test_guide_s9_skip_not_barrier():
    waiting = [("r1", 3), ("r2", None), ("r3", 1), ("r4", 4), ("r5", None), ("r6", 2)]
    admitted, skipped = schedule_waiting(waiting, running_ids=[1, 2, None], max_loras=2)
    assert admitted == ["r2", "r3", "r5", "r6"] and skipped == ["r1", "r4"]
    # a barrier would have admitted nothing: r1 is first
    # with no running adapters, r1 (3) and r3 (1) fill the two places; r4 and r6 wait
    admitted, skipped = schedule_waiting(waiting, running_ids=[], max_loras=2)
    assert admitted == ["r1", "r2", "r3", "r5"] and skipped == ["r4", "r6"]


# -- guide, section 11: what vLLM reserves ----------------------------------------------------------

def test_guide_s11_slot_reservation_llama2_rank16():
    per_layer = slot_elements_per_layer(L2, 16)
    assert per_layer == 1_249_280
    linear_slot = per_layer * L2["layers"] * 2
    assert linear_slot == 79_953_920 and linear_slot / MIB == 76.25
    assert linear_slot == adapter_params(L2, 16, ALL7) * 2   # one slot = one all-linear adapter
    assert 8 * linear_slot == 639_631_360 and 8 * linear_slot / MIB == 610
    emb = embedding_slot_elements(L2, 16)
    assert emb == 2 * 577_536
    default_slot = linear_slot + emb * 2
    assert default_slot == 82_264_064 and default_slot / MIB == 78.453125
    assert 8 * default_slot == 658_112_512 and 8 * default_slot / MIB == 627.625
    assert 8 * emb * 2 / MIB == 17.625
    assert slot_elements_per_layer(L2, 64) == 4 * per_layer
    # copying one all-linear slot at an assumed 64 GB/s (PCIe Gen5 x16, one way)
    assert round(linear_slot / 64e9 * 1e3, 2) == 1.25


# -- guide, section 12: CUDA graphs -----------------------------------------------------------------

def test_guide_s12_lora_capture_cases():
    assert lora_cases(4) == [0, 5] and lora_cases(8) == [0, 9]
    assert lora_cases(4, specialize_active_lora=True) == [0, 1, 2, 4, 5]
    assert lora_cases(8, specialize_active_lora=True) == [0, 1, 2, 4, 8, 9]
    assert lora_cases(8, cudagraph_specialize_lora=False) == [9]
    assert len(lora_cases(8, specialize_active_lora=True)) == 6 and len(lora_cases(8)) == 2
    # a step with 3 active adapters runs the graph captured for the next count up
    counts = captured_lora_counts(8, True)
    assert min(c for c in counts if c >= 3) == 4


# -- guide, section 13: tensor parallelism ----------------------------------------------------------

def test_guide_s13_per_rank_slot_shapes_at_tp2():
    h, r, tp = 4096, 16, 2
    # qkv_proj (column-parallel): A full [r, h] x 3 slices, B [h/tp, r] x 3
    qkv = 3 * r * h + 3 * (h // tp) * r
    qkv_fs = 3 * (r // tp) * h + 3 * (h // tp) * r          # fully sharded: A split by rank too
    assert (qkv, qkv_fs, 3 * r * h + 3 * h * r) == (294_912, 196_608, 393_216)
    # o_proj (row-parallel): A [r, h/tp], B full [h, r]; fully sharded: B [h/tp, r]
    o = r * (h // tp) + h * r
    o_fs = r * (h // tp) + (h // tp) * r
    assert (o, o_fs, 2 * r * h) == (98_304, 65_536, 131_072)
    assert qkv_fs * 2 == 393_216 and o_fs * 2 == 131_072    # exactly half each
    # extra collectives per step with fully_sharded_loras: 2 gathers + 2 all-reduces per layer
    assert 4 * L2["layers"] == 128 and 2 * L2["layers"] + 1 == 65
    assert r * 4 == 64                                       # fp32 shrink buffer per token, bytes


# -- guide, section 14: economics -------------------------------------------------------------------

def test_guide_s14_gpus_saved():
    assert gpus_saved(100, 8) == 87 and -(-100 // 8) == 13
    assert gpus_saved(100, 8, gpus_per_model=2) == 174
    assert gpus_saved(9, 8) == 7


# -- guide, section 15: the CPU micro-measurement's arithmetic -------------------------------------

def test_guide_s15_micro_arithmetic():
    T, K, N, r, S = 64, 4096, 4096, 16, 4
    base = 2 * T * K * N
    lora = 2 * T * r * (K + N)
    assert base == 2_147_483_648 and lora == 16_777_216 and lora / base == 1 / 128
    assert K * N * 4 == 64 * MIB and S * r * (K + N) * 4 == 2 * MIB   # fp32 bytes read


# -- guide, section 17: check yourself --------------------------------------------------------------

def test_guide_s17_answers():
    # 1: Llama-2-7B all seven projections, rank 8, bf16
    assert 8 * (4 * 8192 + 3 * 15_104) == 624_640
    assert adapter_params(L2, 8, ALL7) == 19_988_480
    assert adapter_params(L2, 8, ALL7) * 2 / MIB == 38.125
    assert slot_elements_per_layer(L2, 8) == 624_640        # the rank-8 slot holds the same
    # 2: 40 tenants, max_loras 8
    assert gpus_saved(40, 8) == 35
    # 3: rsLoRA alpha 32 r 64
    assert scaling(32, 64, True) == 4.0 and scaling(32, 64) == 0.5
    # 4: max_loras 2, running {5, 9}; waiting 7, base, 9, 7
    assert schedule_waiting([("a", 7), ("b", None), ("c", 9), ("d", 7)], [5, 9], 2) == (
        ["b", "c"], ["a", "d"])
    # 5: slots [0, 1, -1] and max_loras 3, only slots 0 and 1 filled: the last slot (2) is empty
    stack = np.array([[1.0], [5.0], [0.0]])
    assert float(stack[-1][0]) == 0.0
    # 6: max_loras 16 with specialize_active_lora
    assert lora_cases(16, specialize_active_lora=True) == [0, 1, 2, 4, 8, 16, 17]


# -- the pin: the lines the guide leans on --------------------------------------------------------

def _read(rel):
    return (UPSTREAM / rel).read_text()


def _function(rel, name):
    tree = ast.parse(_read(rel))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    ns: dict = {}
    exec(compile(ast.Module([node], []), rel, "exec"), ns)  # noqa: S102 - upstream's own helper
    return ns[name]


@pytest.mark.skipif(not (UPSTREAM / "vllm").exists(), reason="upstream/ not unpacked")
def test_pin_rules_the_guide_states():
    req = _read("vllm/lora/request.py")
    assert 'raise ValueError(f"id must be > 0, got {self.lora_int_id}")' in req
    assert "return isinstance(value, self.__class__) and self.lora_name == value.lora_name" in req
    peft = _read("vllm/lora/peft_helper.py")
    assert "self.vllm_lora_scaling_factor = self.lora_alpha / math.sqrt(self.r)" in peft
    assert "self.vllm_lora_scaling_factor = self.lora_alpha / self.r" in peft
    assert "vLLM does not yet support DoRA." in peft and "Adapter bias is not supported." in peft
    assert "self.lora_b *= self.scaling" in _read("vllm/lora/lora_weights.py")
    cfg = _read("vllm/config/lora.py")
    assert "MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]" in cfg
    assert "max_loras: int = Field(default=1, ge=1)" in cfg
    assert "max_lora_rank: MaxLoRARanks = 16" in cfg
    ops = _read("vllm/lora/ops/torch_ops/lora_ops.py")
    assert "selected_loras = lora_b_weights[lora_indices_tensor]" in ops
    sched = _read("vllm/v1/core/sched/scheduler.py")
    assert "len(scheduled_loras) == self.lora_config.max_loras" in sched
    assert "return self.skipped_waiting or self.waiting or None" in sched
    assert "return [request.lora_request.lora_name]" in _read("vllm/v1/core/kv_cache_utils.py")
    disp = _read("vllm/v1/cudagraph_dispatcher.py")
    assert "return [0] + captured_counts" in disp and "return [lora_config.max_loras + 1]" in disp
    assert "cudagraph_specialize_lora: bool = True" in _read("vllm/config/compilation.py")
    assert "specialize_active_lora: bool = False" in cfg
    counts = _function("vllm/lora/utils.py", "get_captured_lora_counts")
    for m in (1, 2, 3, 4, 8, 16):
        for spec in (False, True):
            assert counts(m, spec) == captured_lora_counts(m, spec)
    mixin = _read("vllm/v1/worker/lora_model_runner_mixin.py")
    assert "is_prefill=True," in mixin
    base = _read("vllm/lora/layers/base_linear.py")
    assert "else divide(lora_config.max_lora_rank, self.tp_size)" in base
