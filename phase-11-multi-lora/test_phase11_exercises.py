"""Every number in Phase 11's exercises, interview answers and cheatsheet, recomputed.

The pages quote these values; if one changes here, the text is wrong. The arithmetic
(adapter and slot sizes from a model's shapes, the scaling, FLOPs and bytes, the LRU trace,
the scheduler's walk, the CUDA-graph cases) is restated in a few lines of Python with the
derivation beside each number. The code answers run as printed: items 12 and 13 on
mini_vllm's engine (tiny-random, a few hundredths of a second each), items 14 and 15 in
torch and numpy. Tests marked ``upstream`` read the pinned vLLM source: the CPU torch ops are
loaded whole (the file imports only torch), and ``compute_meta``, ``convert_mapping``,
``get_captured_lora_counts``, the block-hash extra-key functions and ``PEFTHelper`` are cut
out of it with ``ast`` and run on the worked examples, with stand-ins for what they import.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import itertools
import json
import math
import os
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import pytest
import torch

import course
from mini_vllm import LLMEngine, LoRARequest, SamplingParams
from mini_vllm.lora import write_peft_adapter
from mini_vllm.models.config import tiny_random_config

UPSTREAM = course.UPSTREAM
KIB, MIB, GIB = 1024, 1024**2, 1024**3

# Model shapes (Hugging Face configs of the two models the pages use)
L2_7B = dict(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, inter=11008, vocab=32000)
L3_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256)
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL = ATTN + ("gate_proj", "up_proj", "down_proj")


def shapes(c):
    """(in, out) of the seven projections, from the head counts, not from hidden alone."""
    h, q, kv, i = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["inter"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def adapter_params(c, r, targets):
    return c["layers"] * sum(r * (a + b) for m, (a, b) in shapes(c).items() if m in targets)


def projection_params(c):
    return c["layers"] * sum(a * b for a, b in shapes(c).values())


def n_params(c):
    """Embedding + layers (projections, two norms) + final norm + untied lm_head."""
    return projection_params(c) + c["layers"] * 2 * c["hidden"] + c["hidden"] + 2 * c["vocab"] * c["hidden"]


def slot_bytes(c, rank, embeddings=True, dtype_bytes=2):
    """One slot of vLLM's stacks: per layer one A and B per slice, plus embed_tokens and lm_head."""
    per_layer = adapter_params(c, rank, ALL)          # one A per slice, as PEFT keeps one per module
    emb = 2 * (c["vocab"] + c["hidden"]) * rank if embeddings else 0
    return (per_layer + emb) * dtype_bytes


def kv_bytes_per_token(c, dtype_bytes=2):
    return 2 * c["layers"] * c["kv_heads"] * c["head_dim"] * dtype_bytes


def scaling(alpha, r, use_rslora=False):
    return alpha / math.sqrt(r) if use_rslora else alpha / r


def captured_counts(max_loras, specialize):
    """get_captured_lora_counts, restated."""
    if not specialize:
        return [max_loras + 1]
    return [n for n in range(1, max_loras + 2) if n & (n - 1) == 0 or n == max_loras + 1]


def lora_cases(max_loras, specialize_active=False, cudagraph_specialize_lora=True, enabled=True):
    """_get_lora_cases, restated."""
    if not enabled:
        return [0]
    if cudagraph_specialize_lora:
        return [0] + captured_counts(max_loras, specialize_active)
    return [max_loras + 1]


def walk(waiting, running, max_loras):
    """The scheduler's LoRA rule over one waiting queue: (admitted, skipped) request names."""
    scheduled = {lora for lora in running if lora is not None}
    admitted, skipped = [], []
    for name, lora in waiting:
        if lora is not None and len(scheduled) == max_loras and lora not in scheduled:
            skipped.append(name)
            continue
        admitted.append(name)
        if lora is not None:
            scheduled.add(lora)
    return admitted, skipped


# -- ast helpers -----------------------------------------------------------------------------

def _source(rel):
    return (UPSTREAM / rel).read_text(encoding="utf-8")


def _cut(rel, names, ns, strip_annotations=True):
    """Define the named top-level functions or classes of an upstream file in ``ns``."""
    tree = ast.parse(_source(rel))
    nodes = [n for n in tree.body if getattr(n, "name", None) in names]
    assert sorted(n.name for n in nodes) == sorted(names)
    for node in nodes:
        if strip_annotations and isinstance(node, ast.FunctionDef):
            node.returns = None
            for a in node.args.args + node.args.kwonlyargs:
                a.annotation = None
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(UPSTREAM / rel), "exec"), ns)  # noqa: S102
    return ns


@pytest.fixture(scope="module")
def torch_ops():
    spec = importlib.util.spec_from_file_location("_p11x_lora_ops", UPSTREAM / "vllm/lora/ops/torch_ops/lora_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the file imports torch and nothing else
    return mod


# == 1. Adapter bytes for a GQA model =========================================================

def test_ex1_gqa_adapter_bytes():
    s = shapes(L3_8B)
    assert s["k_proj"] == (4096, 1024) and s["q_proj"] == (4096, 4096)
    # per layer, rank 16: q 16 x 8,192; k, v 16 x 5,120; o 16 x 8,192
    assert [16 * sum(s[m]) for m in ATTN] == [131_072, 81_920, 81_920, 131_072]
    attn = adapter_params(L3_8B, 16, ATTN)
    assert attn == 32 * 425_984 == 13_631_488 and attn * 2 == 26 * MIB
    # gate, up, down: 16 x (4,096 + 14,336) = 294,912 each
    assert 16 * (4096 + 14336) == 294_912
    full = adapter_params(L3_8B, 16, ALL)
    assert full == 32 * 1_310_720 == 41_943_040 and full * 2 == 80 * MIB
    # k and v taken as hidden x hidden: Llama-2-7B's 32 MiB, 23% too large
    assert adapter_params(L2_7B, 16, ATTN) * 2 == 32 * MIB
    assert round(32 / 26 - 1, 2) == 0.23
    # PEFT saves fp32: the files
    assert attn * 4 == 52 * MIB and full * 4 == 160 * MIB
    # rank 64 is four times rank 16
    assert adapter_params(L3_8B, 64, ATTN) * 2 == 104 * MIB
    # the one ratio against Llama-3-8B's real parameter count
    base = n_params(L3_8B)
    assert base == 8_030_261_248
    assert round(base / attn) == 589 and round(base / full) == 191


# == 2. The slot reservation, and what it costs in KV =========================================

def test_ex2_slot_reservation_and_kv_tokens():
    per_slot = slot_bytes(L3_8B, 16)
    assert per_slot / MIB == 88.078125                       # lab 03's 88.08 MiB
    assert slot_bytes(L3_8B, 16, embeddings=False) == 80 * MIB
    emb = per_slot - 80 * MIB
    assert emb == 2 * (128_256 + 4_096) * 16 * 2 == 8_470_528 and round(emb / MIB, 3) == 8.078
    assert 8 * per_slot / MIB == 704.625
    # max_loras = 4 at max_lora_rank = 64: 4 x 4 = 16 rank-16 slots' worth
    big = 4 * slot_bytes(L3_8B, 64)
    assert big == 16 * per_slot and big / MIB == 1409.25
    assert 4 * slot_bytes(L3_8B, 64, embeddings=False) / MIB == 1280
    assert (big - 4 * slot_bytes(L3_8B, 64, embeddings=False)) / MIB == 129.25
    # in KV cache: Llama-3-8B stores 2 x 32 x 8 x 128 x 2 B = 128 KiB per token
    kv = kv_bytes_per_token(L3_8B)
    assert kv == 131_072 == 128 * KIB
    assert big // kv == 11_274 and big // (16 * kv) == 704          # tokens, 16-token blocks
    assert 8 * per_slot // kv == 5_637
    # Llama-2-7B (no GQA, 512 KiB per token): lab 03's 627.625 MiB at max_loras = 8
    assert 8 * slot_bytes(L2_7B, 16) / MIB == 627.625 and kv_bytes_per_token(L2_7B) == 512 * KIB


# == 3. Scaling ================================================================================

def test_ex3_scaling():
    assert scaling(16, 8) == 2.0
    assert round(scaling(16, 8, True), 3) == 5.657
    assert scaling(128, 64) == 2.0 and scaling(128, 64, True) == 16.0
    assert scaling(128, 64, True) / scaling(128, 64) == math.sqrt(64) == 8
    assert scaling(16, 16, True) == 4.0 and scaling(16, 16) == 1.0
    # a rank-4 adapter in rank-16 slots: its own r decides, not max_lora_rank
    assert scaling(8, 4) == 2.0 and scaling(8, 16) == 0.5
    # the scale applied twice: s^2 instead of s
    assert scaling(16, 8) ** 2 == 4.0


# == 4. FLOPs and bytes of shrink and expand ===================================================

def test_ex4_flops_and_bytes():
    h, out = 4096, 4096 + 1024 + 1024
    assert out == 6144
    base = 2 * h * out
    shrink = 3 * 2 * 16 * h                 # three A's, one per slice
    expand = 2 * 16 * out
    assert (base, shrink, expand) == (50_331_648, 393_216, 196_608)
    assert round((shrink + expand) / base * 100, 2) == 1.17
    assert 2 * 16 * h + expand == 327_680    # if q, k, v shared one A
    # whole model, all-linear rank 16: 2 x adapter params against 2 x projection params
    proj = projection_params(L3_8B)
    assert proj == 32 * 218_103_808 == 6_979_321_856
    assert round(adapter_params(L3_8B, 16, ALL) / proj * 100, 2) == 0.60
    assert round(adapter_params(L3_8B, 16, ATTN) / proj * 100, 2) == 0.20
    # decode, 64 rows over 4 adapters: bytes read for qkv_proj (bf16)
    w_bytes = h * out * 2
    per_adapter = (3 * 16 * h + out * 16) * 2
    assert (w_bytes, per_adapter) == (50_331_648, 589_824)
    assert round(4 * per_adapter / w_bytes * 100, 2) == 4.69
    assert round(16 * per_adapter / w_bytes * 100, 2) == 18.75   # 16 adapters, 4 rows each


# == 5. The LRU hit rate of lab 04's trace =====================================================

def skewed_trace(n, num_adapters=16, n_hot=3, hot_share=0.8, seed=0):
    """Lab 04's generator: hot set 1..3 with probability 0.8, else one of 4..16, uniform."""
    rng = np.random.default_rng(seed)
    is_hot = rng.random(n) < hot_share
    hot = rng.integers(1, n_hot + 1, n)
    cold = rng.integers(n_hot + 1, num_adapters + 1, n)
    return [int(x) for x in np.where(is_hot, hot, cold)]


def lru_hits(trace, slots, pinned=()):
    """Hits of an LRU over ``slots`` places; pinned ids hold a place and are never evicted."""
    order, hits, free = [], 0, slots - len(pinned)
    loaded = set()
    for x in trace:
        if x in pinned:
            hits += x in loaded
            loaded.add(x)
            continue
        if x in order:
            hits += 1
            order.remove(x)
        elif len(order) == free:
            order.pop(0)
        order.append(x)
    return hits


def king(p_hot, n_hot, p_cold, n_cold, k):
    """Exact long-run LRU hit rate for independent requests (King, 1971); two classes."""
    total = 0.0
    for seq in itertools.product((0, 1), repeat=k):
        a, b = seq.count(0), seq.count(1)
        if a > n_hot or b > n_cold:
            continue
        prob, prefix = 1.0, 0.0
        for c in seq:
            p = p_hot if c == 0 else p_cold
            prob *= p / (1.0 - prefix)
            prefix += p
        total += math.perm(n_hot, a) * math.perm(n_cold, b) * prob * prefix
    return total


def test_ex5_lru_hit_rate():
    trace = skewed_trace(2000)
    assert trace[:8] == [2, 3, 2, 1, 16, 6, 2, 1]            # lab 04's pinned prefix
    assert sum(x <= 3 for x in trace) == 1588                # 79.4% hot
    hits = {k: lru_hits(trace, k) for k in (1, 2, 3, 4, 5, 8)}
    assert hits == {1: 393, 2: 780, 3: 1153, 4: 1411, 5: 1558, 8: 1746}
    assert hits[4] / 2000 == 0.7055
    expect = {k: king(0.8 / 3, 3, 0.2 / 13, 13, k) for k in (4, 5)}
    assert round(expect[4], 3) == 0.717 and round(expect[5], 3) == 0.788
    assert expect[4] < 0.75 < expect[5]
    # pinning the hot three: 0.8 + 0.2 / 13 in the long run; this trace
    assert round(0.8 + 0.2 / 13, 3) == 0.815
    assert 3 / 0.8 == 3.75                                   # requests between visits of one hot adapter
    pinned = lru_hits(trace, 4, pinned=(1, 2, 3))
    assert pinned == 1612 and pinned / 2000 == 0.806
    assert pinned - 1585 == 27                               # cold repeats in the one free slot
    # five adapters cycling over four slots
    assert lru_hits([1, 2, 3, 4, 5] * 40, 4) == 0


# == 6. Ids, slots, segments ===================================================================

ITEM6_TABLE = [4, None, 9, 2]
ITEM6_IDS = [9, 9, 9, 0, 2, 2, 9, 0]             # r0: adapter 9 x3, r1 base, r2: 2 x2, r3: 9, r4 base


def test_ex6_ids_to_slots_by_hand():
    slots = [ITEM6_TABLE.index(i) if i > 0 else -1 for i in ITEM6_IDS]
    assert slots == [2, 2, 2, -1, 3, 3, 2, -1]
    emb = [ITEM6_TABLE.index(i) if i > 0 else 0 for i in ITEM6_IDS]
    assert emb == [2, 2, 2, 0, 3, 3, 2, 0]
    with pytest.raises(ValueError):
        ITEM6_TABLE.index(5)


@pytest.mark.upstream
def test_ex6_upstreams_convert_mapping_and_compute_meta():
    ns = {"torch": torch,
          "async_tensor_h2d": lambda data, dtype, device, **_: torch.tensor(data, dtype=dtype, device=device)}
    _cut("vllm/lora/punica_wrapper/utils.py", ["convert_mapping", "compute_meta"], ns)
    mapping = SimpleNamespace(index_mapping=tuple(ITEM6_IDS), prompt_mapping=(9, 0, 2, 9, 0))
    base, sampler, _, emb, _ = ns["convert_mapping"](mapping, ITEM6_TABLE, 5, 100, 0, "cpu")
    assert base.tolist() == [2, 2, 2, -1, 3, 3, 2, -1]
    assert sampler.tolist() == [2, -1, 3, 2, -1]
    assert emb[1].tolist() == [200, 200, 200, 0, 300, 300, 200, 0]   # slot x (vocab + extra)
    starts, lens, idx, batch, max_len, tokens, no_lora = ns["compute_meta"](base)
    assert (idx.tolist(), lens.tolist(), starts.tolist()) == ([2, -1, 3, 2, -1], [3, 1, 2, 1, 1], [0, 3, 4, 6, 7])
    assert (batch, max_len, tokens, no_lora) == (5, 3, 8, False)
    assert ns["compute_meta"](torch.tensor([-1, -1, -1]))[-1] is True
    with pytest.raises(ValueError):
        ns["convert_mapping"](SimpleNamespace(index_mapping=(5,), prompt_mapping=(5,)), ITEM6_TABLE, 5, 100, 0, "cpu")


# == 7. The scheduler's skip ===================================================================

def test_ex7_walk():
    waiting = [("A", 7), ("B", None), ("C", 8), ("D", 7), ("E", 5), ("F", 9)]
    assert walk(waiting, [2, 5, None], 3) == (["A", "B", "D", "E"], ["C", "F"])
    # max_loras = 2: the running set is full before the walk starts
    assert walk(waiting, [2, 5, None], 2) == (["B", "E"], ["A", "C", "D", "F"])
    # nothing running, max_loras = 2
    assert walk(waiting, [], 2) == (["A", "B", "C", "D"], ["E", "F"])
    # "sql" as id 1 and as id 2 takes two places
    assert walk([("x", 1), ("y", 2), ("z", 3)], [], 2) == (["x", "y"], ["z"])


@pytest.mark.upstream
def test_ex7_scheduler_lines_at_the_pin():
    src = _source("vllm/v1/core/sched/scheduler.py")
    assert "if req.lora_request and req.lora_request.lora_int_id > 0" in src
    assert "if not preempted_reqs and self._pause_state == PauseState.UNPAUSED:" in src
    cond = ("len(scheduled_loras) == self.lora_config.max_loras\n"
            "                        and request.lora_request.lora_int_id not in scheduled_loras")
    assert cond in src
    assert src.index("# Scheduling would exceed max_loras, skip.") < src.index("scheduled_loras.add(")
    assert "self.skipped_waiting.prepend_requests(step_skipped_waiting)" in src


# == 8 and 14. The -1 row on the CPU, and the fix ==============================================

def item8_tensors():
    x = torch.tensor([[1.0, 2.0]] * 3)
    a = torch.tensor([[[[1.0, 1.0]]], [[[2.0, 1.0]]]])           # [2 slots, 1, rank 1, in 2]
    b = torch.tensor([[[[1.0], [1.0]]], [[[0.0], [10.0]]]])      # [2 slots, 1, out 2, rank 1]
    y = torch.full((3, 2), 5.0)
    return x, a, b, y, torch.tensor([0, 1, -1])


@pytest.mark.upstream
def test_ex8_upstream_ops_give_the_base_row_the_last_slot(torch_ops):
    x, a, b, y, idx = item8_tensors()
    h = torch.zeros(3, 1)
    torch_ops.bgmv_shrink(x, a, h, idx, 1.0)
    assert h.flatten().tolist() == [3.0, 4.0, 4.0]
    torch_ops.bgmv_expand_slice(h, b, y, idx, 0, 2, add_inputs=True)
    assert y.tolist() == [[8.0, 8.0], [5.0, 45.0], [5.0, 45.0]]   # the right answer for row 2: [5, 5]
    # with one slot (max_loras = 1) the only slot is the last
    h1 = torch.zeros(2, 1)
    torch_ops.bgmv_shrink(x[:2], a[1:], h1, torch.tensor([0, -1]), 1.0)
    assert h1.flatten().tolist() == [4.0, 4.0]


def bgmv_shrink_fixed(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    """Item 14's answer, as printed."""
    valid = lora_indices_tensor >= 0
    selected = lora_a_weights[lora_indices_tensor.clamp(min=0)].to(dtype=output_tensor.dtype)
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    out = torch.einsum("bi, boi -> bo", inputs.to(dtype=output_tensor.dtype), selected)
    out = out.masked_fill(~valid[:, None], 0.0)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand_slice_fixed(inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                            slice_offset, slice_size, add_inputs=True):
    """Item 14's answer, as printed."""
    valid = lora_indices_tensor >= 0
    selected = lora_b_weights[lora_indices_tensor.clamp(min=0)].to(dtype=output_tensor.dtype)
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    out = torch.einsum("bi, boi -> bo", inputs.to(dtype=output_tensor.dtype), selected)
    out = out.masked_fill(~valid[:, None], 0.0)
    cols = slice(slice_offset, slice_offset + slice_size)
    if add_inputs:
        output_tensor[:, cols] += out
    else:
        output_tensor[:, cols] = out


@pytest.mark.upstream
def test_ex14_fixed_ops_leave_minus_one_rows_alone_and_agree_elsewhere(torch_ops):
    x, a, b, y, idx = item8_tensors()
    h = torch.zeros(3, 1)
    bgmv_shrink_fixed(x, a, h, idx, 1.0)
    assert h.flatten().tolist() == [3.0, 4.0, 0.0]
    bgmv_expand_slice_fixed(h, b, y, idx, 0, 2)
    assert y.tolist() == [[8.0, 8.0], [5.0, 45.0], [5.0, 5.0]]
    # bit for bit on the -1 rows, with a loud adapter in every slot, and equal to upstream elsewhere
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(16, 32, generator=g)
    A = torch.randn(4, 1, 8, 32, generator=g) * 10
    B = torch.randn(4, 1, 24, 8, generator=g) * 10
    slots = torch.tensor([3, -1, 0, 1, -1, 2, 3, 3, -1, 0, 1, 2, -1, -1, 2, 0])
    base = torch.randn(16, 48, generator=g)
    mine, theirs = base.clone(), base.clone()
    for impl, yy in ((None, mine), (torch_ops, theirs)):
        hh = torch.zeros(16, 8)
        (bgmv_shrink_fixed if impl is None else impl.bgmv_shrink)(xs, A, hh, slots, 0.5)
        (bgmv_expand_slice_fixed if impl is None else impl.bgmv_expand_slice)(hh, B, yy, slots, 16, 24, True)
    keep = slots == -1
    assert torch.equal(mine[keep].view(torch.int32), base[keep].view(torch.int32))
    assert not torch.equal(theirs[keep], base[keep])                  # upstream at the pin
    assert torch.allclose(mine[~keep], theirs[~keep], rtol=1e-6, atol=1e-5)
    # add_inputs=False writes zeros into -1 rows (the fix's contract, not the GPU kernels')
    z = torch.ones(3, 2)
    bgmv_expand_slice_fixed(torch.ones(3, 1), b, z, idx, 0, 2, add_inputs=False)
    assert z[2].tolist() == [0.0, 0.0]
    # adding the masked +0.0 keeps every bit except a -0.0's
    neg = torch.tensor([-0.0, 1.5])
    assert torch.equal((neg + 0.0)[1:].view(torch.int32), neg[1:].view(torch.int32))
    assert not torch.equal((neg + 0.0)[:1].view(torch.int32), neg[:1].view(torch.int32))


@pytest.mark.upstream
def test_ex8_kernel_tests_never_draw_minus_one():
    src = _source("tests/lora/utils.py")
    assert "0, lora_nums - 1 if lora_nums > 1 else 1, (batches,)" in src


# == 9. The block-hash extra keys ==============================================================

@pytest.fixture(scope="module")
def extra_keys():
    import hashlib
    ns = {"Any": Any, "hashlib": hashlib, "tensor_data": lambda t: bytes(t)}
    _cut("vllm/v1/core/kv_cache_utils.py",
         ["_gen_mm_extra_hash_keys", "_gen_lora_extra_hash_keys", "_gen_prompt_embeds_extra_hash_keys",
          "generate_block_hash_extra_keys"], ns)

    def keys(lora=None, salt=None, block=0, block_size=16):
        req = SimpleNamespace(lora_request=lora, mm_features=[], cache_salt=salt, prompt_embeds=None)
        start = block * block_size
        return ns["generate_block_hash_extra_keys"](req, start, start + block_size, 0)[0]
    return keys


ITEM9 = {
    "R1": dict(),
    "R2": dict(lora=LoRARequest("sql", 1, "/a/sql")),
    "R3": dict(lora=LoRARequest("sql", 9, "/a/sql")),
    "R4": dict(lora=LoRARequest("chat", 1, "/a/chat")),
    "R5": dict(lora=LoRARequest("sql", 1, "/a/sql"), salt="tenant-7"),
    "R6": dict(salt="tenant-7"),
}


@pytest.mark.upstream
def test_ex9_extra_keys_per_block(extra_keys):
    block0 = {k: extra_keys(**v) for k, v in ITEM9.items()}
    assert block0 == {"R1": None, "R2": ("sql",), "R3": ("sql",), "R4": ("chat",),
                      "R5": ("sql", "tenant-7"), "R6": ("tenant-7",)}
    block1 = {k: extra_keys(block=1, **v) for k, v in ITEM9.items()}
    assert block1 == {"R1": None, "R2": ("sql",), "R3": ("sql",), "R4": ("chat",),
                      "R5": ("sql",), "R6": None}
    # chains: the hash of block i covers its parent, so equal keys from block 0 on are needed
    chain = {k: tuple((block0[k], block1[k])) for k in ITEM9}
    groups = {}
    for k, v in chain.items():
        groups.setdefault(v, []).append(k)
    assert sorted(groups.values()) == [["R1"], ["R2", "R3"], ["R4"], ["R5"], ["R6"]]
    assert ITEM9["R2"]["lora"] == ITEM9["R3"]["lora"]          # equal by name, ids 1 and 9


# == 10. PEFTHelper on five configs ============================================================

@pytest.fixture(scope="module")
def peft_helper():
    logger = SimpleNamespace(info_once=lambda *a, **k: None, info=lambda *a, **k: None)
    ns = {"dataclass": dataclasses.dataclass, "field": dataclasses.field, "fields": dataclasses.fields,
          "MISSING": dataclasses.MISSING, "math": math, "os": os, "json": json, "Literal": Literal,
          "LoRAConfig": Any, "TensorizerConfig": None, "logger": logger}
    _cut("vllm/lora/peft_helper.py", ["PEFTHelper"], ns)
    return ns["PEFTHelper"]


ITEM10 = {
    "a": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "b": dict(r=64, lora_alpha=128, target_modules="all-linear", use_rslora=True),
    "c": dict(r=16, lora_alpha=32, target_modules=["q_proj"], use_dora=True, bias="lora_only"),
    "d": dict(r=16, lora_alpha=16, target_modules=["q_proj"], modules_to_save=["lm_head"],
              rank_pattern={"q_proj": 4}),
    "e": dict(r=12, lora_alpha=24, target_modules=["o_proj"]),
}


@pytest.mark.upstream
def test_ex10_upstreams_peft_helper(peft_helper):
    cfg16 = SimpleNamespace(max_lora_rank=16)
    out = {}
    for name, d in ITEM10.items():
        h = peft_helper.from_dict(d)
        try:
            h.validate_legal(cfg16)
            out[name] = h.vllm_lora_scaling_factor
        except ValueError as e:
            out[name] = str(e)
    assert out == {
        "a": 2.0,
        "b": "LoRA rank 64 is greater than max_lora_rank 16.",
        "c": "vLLM does not yet support DoRA. Adapter bias is not supported.",
        "d": "vLLM only supports modules_to_save being None.",
        "e": 2.0,
    }
    b = peft_helper.from_dict(ITEM10["b"])
    b.validate_legal(SimpleNamespace(max_lora_rank=64))
    assert b.vllm_lora_scaling_factor == 16.0
    assert not hasattr(peft_helper.from_dict(dict(ITEM10["d"], modules_to_save=None)), "rank_pattern")
    with pytest.raises(ValueError, match="Missing required configuration fields"):
        peft_helper.from_dict({"r": 8, "target_modules": ["q_proj"]})


# == 11. CUDA-graph cases ======================================================================

def test_ex11_lora_cases():
    assert lora_cases(4, enabled=False) == [0]
    assert lora_cases(1) == [0, 2] and lora_cases(1, True) == [0, 1, 2]
    assert lora_cases(4) == [0, 5] and lora_cases(4, True) == [0, 1, 2, 4, 5]
    assert lora_cases(6) == [0, 7] and lora_cases(6, True) == [0, 1, 2, 4, 7]
    assert lora_cases(7, True) == [0, 1, 2, 4, 8]
    assert lora_cases(16, True) == [0, 1, 2, 4, 8, 16, 17]
    assert lora_cases(6, cudagraph_specialize_lora=False) == [7]
    # graphs for 10 capture sizes: 10 without LoRA, 20 by default, 50 specialised at max_loras 6
    assert [10 * len(c) for c in ([0], lora_cases(6), lora_cases(6, True))] == [10, 20, 50]


@pytest.mark.upstream
def test_ex11_upstreams_captured_counts():
    ns = _cut("vllm/lora/utils.py", ["get_captured_lora_counts"], {})
    for m in (1, 2, 4, 6, 7, 8, 16, 32):
        for spec in (False, True):
            assert ns["get_captured_lora_counts"](m, spec) == captured_counts(m, spec)
    src = _source("vllm/v1/cudagraph_dispatcher.py")
    assert "return [0] + captured_counts" in src and "return [lora_config.max_loras + 1]" in src


# == 12. Log each adapter's slot per step in mini_vllm =========================================

@pytest.fixture(scope="module")
def abc_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("p11x")
    cfg = tiny_random_config()
    return {n: LoRARequest(n, i + 1, str(write_peft_adapter(root / n, cfg, r=8, target_modules=ALL, seed=i + 1)))
            for i, n in enumerate("abc")}


def test_ex12_slot_log(abc_adapters):
    lr = abc_adapters
    # -- item 12's answer, as printed --
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=3)
    manager, log = engine.lora_manager, []
    seat = manager.set_active_adapters

    def logged(requests):
        slots = seat(requests)
        log.append(({r.lora_name: int(s) for r, s in zip(requests, slots) if r is not None},
                    list(manager.lora_index_to_id)))
        return slots

    manager.set_active_adapters = logged
    for name, n in [("a", 2), ("b", 5), ("c", 3), (None, 4), ("a", 2)]:
        engine.add_request("hello world", SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                           lora_request=None if name is None else lr[name])
    while engine.has_unfinished_requests():
        engine.step()
    # -- end --
    rows = [(s.step, s.active_loras, dict(sorted(slots.items())), table, len(s.num_scheduled_tokens))
            for s, (slots, table) in zip(engine.stats, log, strict=True)]
    assert rows == [
        (1, (1, 2), {"a": 0, "b": 1}, [1, 2], 4),
        (2, (1, 2), {"a": 0, "b": 1}, [1, 2], 4),
        (3, (2, 3), {"b": 1, "c": 0}, [3, 2], 3),
        (4, (2, 3), {"b": 1, "c": 0}, [3, 2], 3),
        (5, (2, 3), {"b": 1, "c": 0}, [3, 2], 2),
    ]
    assert sorted(manager.list_adapters()) == [1, 2, 3]        # a left its slot, not the CPU cache


# == 13. A base row next to an adapter row is bit-identical to a base-only engine ==============

def test_ex13_base_row_bit_identical(abc_adapters):
    lr = abc_adapters
    # -- item 13's answer, as printed --
    prompts = ["the quick brown fox", "paged attention"]
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)

    def logits_per_step(loras, **engine_kwargs):
        engine = LLMEngine("tiny-random", **engine_kwargs)
        captured, execute = [], engine.model.execute
        engine.model.execute = lambda mi: captured.append(execute(mi).copy()) or captured[-1]
        out = engine.generate(prompts, greedy, lora_request=loras)
        return captured, [r.output_token_ids for r in out]

    mixed, mixed_tokens = logits_per_step([None, lr["a"]], enable_lora=True, max_loras=1, max_lora_rank=8)
    plain, plain_tokens = logits_per_step(None)
    assert len(mixed) == len(plain) == 5
    for m, p in zip(mixed, plain, strict=True):
        assert m.shape == p.shape == (2, 257)
        assert np.array_equal(m[0].view(np.uint32), p[0].view(np.uint32))   # the base row: same bits
        assert not np.array_equal(m[1], p[1])                               # the adapter row moved
    assert mixed_tokens[0] == plain_tokens[0] and mixed_tokens[1] != plain_tokens[1]
    # -- end --
    assert plain_tokens[0] == [87, 99, 86, 177, 44]
    # the same request alone is a different batch: its logits differ in the last bits
    engine = LLMEngine("tiny-random")
    captured, execute = [], engine.model.execute
    engine.model.execute = lambda mi: captured.append(execute(mi).copy()) or captured[-1]
    engine.generate(prompts[:1], greedy)
    diffs = [float(np.abs(a[0] - b[0]).max()) for a, b in zip(captured, plain, strict=True)]
    assert all(0 < d < 2e-6 for d in diffs)


# == 15. LoRA under tensor parallelism, in numpy ===============================================

def lora_tp(x, W, A, B, tp, layer, fully_sharded):
    """Item 15's answer, as printed: each rank's share, then the collectives, summed by hand."""
    out_dim, in_dim = W.shape
    r = A.shape[0]
    if layer == "row":                                   # W split by input columns
        n = in_dim // tp
        parts, shrinks = [], [x[:, k * n:(k + 1) * n] @ A[:, k * n:(k + 1) * n].T for k in range(tp)]
        if fully_sharded:
            h = sum(shrinks)                             # all-reduce of the [T, r] buffer
            m = out_dim // tp
            for k in range(tp):
                y = x[:, k * n:(k + 1) * n] @ W[:, k * n:(k + 1) * n].T
                y[:, k * m:(k + 1) * m] += h @ B[k * m:(k + 1) * m].T   # its own output columns
                parts.append(y)
        else:
            for k in range(tp):
                parts.append(x[:, k * n:(k + 1) * n] @ W[:, k * n:(k + 1) * n].T + shrinks[k] @ B.T)
        return sum(parts)                                # the base layer's all-reduce
    m = out_dim // tp                                    # column: W split by output rows
    if fully_sharded:
        q = r // tp
        h = np.concatenate([x @ A[k * q:(k + 1) * q].T for k in range(tp)], axis=1)   # all-gather
    else:
        h = x @ A.T                                      # every rank shrinks with the whole A
    return np.concatenate([x @ W[k * m:(k + 1) * m].T + h @ B[k * m:(k + 1) * m].T for k in range(tp)], axis=1)


def test_ex15_tp_lora_equals_dense():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8))
    W, A, B = rng.standard_normal((12, 8)), rng.standard_normal((4, 8)), rng.standard_normal((12, 4))
    dense = x @ (W + B @ A).T
    for layer, tp, fs in itertools.product(("row", "column"), (1, 2, 4), (False, True)):
        np.testing.assert_allclose(lora_tp(x, W, A, B, tp, layer, fs), dense, rtol=1e-12, atol=1e-12)
    # per-rank slot elements, Llama-2-7B, rank 16, TP = 2 (guide section 13)
    assert 3 * 16 * 4096 + 3 * 2048 * 16 == 294_912 and 3 * 8 * 4096 + 3 * 2048 * 16 == 196_608
    assert 16 * 2048 + 4096 * 16 == 98_304 and 16 * 2048 + 2048 * 16 == 65_536
    assert 2 * 2 * 32 == 128 and 16 * 4 == 64                    # extra collectives; bytes per row


# == 16 and 17. Merging, and what max_loras costs ==============================================

def test_ex16_merge_in_bf16_rounds():
    one = torch.tensor(1.0, dtype=torch.bfloat16)
    assert (one + torch.tensor(0.001, dtype=torch.bfloat16)).item() == 1.0
    assert (one + torch.tensor(0.003, dtype=torch.bfloat16)).item() == 1.0
    assert 2**-8 == 0.00390625                               # half the spacing above 1.0
    assert (one + torch.tensor(0.005, dtype=torch.bfloat16)).item() == 1.0078125 == 1 + 2**-7
    # extra FLOPs of an unmerged rank-16 all-linear adapter on Llama-3-8B
    assert round(adapter_params(L3_8B, 16, ALL) / projection_params(L3_8B) * 100, 1) == 0.6
    assert round(n_params(L3_8B) * 2 / 1e9, 2) == 16.06           # a redeploy, against a 160 MiB file
    assert adapter_params(L3_8B, 16, ALL) * 4 == 160 * MIB


def test_ex17_what_max_loras_costs():
    per_slot = slot_bytes(L3_8B, 16)
    kv = kv_bytes_per_token(L3_8B)
    table = {m: (m * per_slot / MIB, m * per_slot // kv, len(lora_cases(m)), len(lora_cases(m, True)), m + 1)
             for m in (1, 4, 8, 16, 32)}
    assert table == {
        1: (88.078125, 704, 2, 3, 2),
        4: (352.3125, 2818, 2, 5, 5),
        8: (704.625, 5637, 2, 6, 9),
        16: (1409.25, 11274, 2, 7, 17),
        32: (2818.5, 22548, 2, 8, 33),
    }
    # in conversations of 8,192 tokens
    assert round(32 * per_slot / kv / 8192, 2) == 2.75
    # 5,000 tenants at max_loras = 32: engines for a slot each
    assert -(-5000 // 32) == 157 and -(-5000 // 8) == 625


# == Interview and cheatsheet numbers not covered above ========================================

def test_interview_numbers():
    # Q1 / cheatsheet: one 4,096 x 4,096 layer at rank 16
    assert 16 * (4096 + 4096) == 131_072 and 4096 * 4096 // 131_072 == 128
    assert round(262_144 / 33_554_432 * 100, 2) == 0.78
    # Q5: Llama-2-7B slot memory and the ratio
    l2 = n_params(L2_7B)
    assert l2 == 6_738_415_616
    assert round(7e9 / adapter_params(L2_7B, 16, ATTN)) == 417
    assert round(l2 / adapter_params(L2_7B, 16, ATTN)) == 402
    assert 8 * slot_bytes(L2_7B, 16, embeddings=False) / MIB == 610
    assert round(l2 * 2 / GIB, 2) == 12.55
    # Q2: one all-linear rank-16 Llama-2-7B adapter, copied at an assumed 64 GB/s
    assert adapter_params(L2_7B, 16, ALL) * 2 == 79_953_920
    assert round(79_953_920 / 64e9 * 1e3, 2) == 1.25
    # Q5: FLOPs of an unmerged rank-16 adapter on Llama-2-7B's projections
    assert round(adapter_params(L2_7B, 16, ATTN) / projection_params(L2_7B) * 100, 2) == 0.26
    assert round(adapter_params(L2_7B, 16, ALL) / projection_params(L2_7B) * 100, 2) == 0.62
    # Q8: fleet for 100 tenants, max_loras = 8; and the weights
    assert 100 - -(-100 // 8) == 87 and 2 * 100 - 2 * -(-100 // 8) == 174
    assert round(100 * l2 * 2 / 1e12, 2) == 1.35
    assert round((l2 * 2 + 100 * 32 * MIB) / 1e9, 1) == 16.8
    # Q3: the worked walk, max_loras = 2
    q3 = [("r1", 3), ("r2", None), ("r3", 1), ("r4", 4), ("r5", None), ("r6", 2)]
    assert walk(q3, [1, 2, None], 2) == (["r2", "r3", "r5", "r6"], ["r1", "r4"])


def test_cheatsheet_numbers():
    assert adapter_params(L2_7B, 16, ALL) * 2 / MIB == 76.25
    assert 8 * slot_bytes(L3_8B, 16, embeddings=False) / MIB == 640
    assert adapter_params(L3_8B, 16, ATTN) * 2 == 26 * MIB and adapter_params(L3_8B, 16, ALL) * 2 == 80 * MIB
    assert round(adapter_params(L2_7B, 16, ATTN) / projection_params(L2_7B) * 100, 2) == 0.26
    assert 2**-7 == 0.0078125


# == Facts at the pin ==========================================================================

@pytest.mark.upstream
def test_facts_at_the_pin():
    cfg = _source("vllm/config/lora.py")
    assert "MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]" in cfg
    assert "max_lora_rank: MaxLoRARanks = 16" in cfg
    assert "max_loras: int = Field(default=1, ge=1)" in cfg
    assert "max_cpu_loras: int | None = None" in cfg
    assert "self.max_cpu_loras = self.max_loras" in cfg
    assert "fully_sharded_loras: bool = False" in cfg and "specialize_active_lora: bool = False" in cfg
    comp = _source("vllm/config/compilation.py")
    assert "cudagraph_specialize_lora: bool = True" in comp
    req = _source("vllm/lora/request.py")
    assert "if self.lora_int_id < 1:" in req
    lw = _source("vllm/lora/lora_weights.py")
    assert "self.lora_b *= self.scaling" in lw
    bl = _source("vllm/lora/layers/base_linear.py")
    assert "output, x, self.lora_a_stacked, self.lora_b_stacked, 1.0, self.output_slices" in bl
    mm = _source("vllm/lora/model_manager.py")
    assert "if lora_id is None" in mm
    wm = _source("vllm/lora/worker_manager.py")
    assert "than the number of GPU LoRA slots" in wm
    shrink = _source("vllm/lora/ops/triton_ops/lora_shrink_op.py")
    assert "if lora_id == -1:" in shrink
    mixin = _source("vllm/v1/worker/lora_model_runner_mixin.py")
    assert "is_prefill=True" in mixin
    llama = _source("vllm/model_executor/models/llama.py")
    assert '"embed_tokens": "input_embeddings",' in llama and '"lm_head": "output_embeddings",' in llama
