"""Numbers the phase documents state that no lab computes: each one is recomputed here.

A guide's number is either cited, asserted by a lab's test, or asserted in this file
(/work/shared/STYLE.md, "Prose"). Each test names the document and the passage it guards.
"""

from __future__ import annotations

import math

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

# Llama-3.1-8B, from Phase 00 lab 02 (its test asserts both numbers).
LLAMA_8B_PARAMS = 8_030_261_248
LLAMA_8B_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V x layers x KV heads x head_dim x bf16
BLOCK = 16


def test_p02_exercise_14_shared_system_prompt_fits_only_just():
    """phase-02 EXERCISES 14: 100 requests of 4,096 shared + 50 private tokens."""
    assert LLAMA_8B_KV_PER_TOKEN == 128 * KiB
    weights = LLAMA_8B_PARAMS * 2
    kv = 100 * 4_146 * LLAMA_8B_KV_PER_TOKEN
    assert round(kv / GiB, 1) == 50.6
    blocks_per_request = math.ceil(4_146 / BLOCK)
    assert blocks_per_request == 260
    assert round(100 * blocks_per_request * BLOCK * LLAMA_8B_KV_PER_TOKEN / GiB, 1) == 50.8
    assert round(weights / GiB, 2) == 14.96
    assert round((kv + weights) / GiB, 1) == 65.6
    budget_gib = round(0.92 * 80, 1), round(0.92 * 80e9 / GiB, 1)
    assert budget_gib == (73.6, 68.5)
    # it fits under both readings of "80 GB", with 3 to 8 GiB to spare
    assert all(b * GiB > kv + weights for b in budget_gib)
    assert (math.floor(68.5 - 65.6), math.floor(73.6 - 65.6)) == (2, 8)
    assert round(100 * 500 * LLAMA_8B_KV_PER_TOKEN / GiB, 1) == 6.1
    # headroom: requests that fit in what 73.6 GiB leaves after the weights
    left = 0.92 * 80 * GiB - weights
    assert round(left / GiB, 1) == 58.6
    block_bytes = BLOCK * LLAMA_8B_KV_PER_TOKEN
    assert block_bytes == 2 * MiB
    assert left // (blocks_per_request * block_bytes) == 115
    private_blocks = math.ceil(50 / BLOCK)
    assert private_blocks == 4
    with_sharing = (left - 256 * block_bytes) // (private_blocks * block_bytes)
    assert 7_400 <= with_sharing < 7_450


def test_p03_exercise_15_summary_prefill_shares_the_budget_with_decodes():
    """phase-03 EXERCISES 15: a 16,384-token prompt under a 2,048-token budget."""
    prompt, budget, chats = 16_384, 2_048, 100
    assert math.ceil(prompt / budget) == 8
    assert budget - chats == 1_948
    assert math.ceil(prompt / (budget - chats)) == 9
    assert math.ceil(prompt / 512) == 32 and 512 + chats <= budget


def test_p02_decode_kv_reads_match_weight_reads_near_122k_tokens():
    """phase-02 guide section 4 and INTERVIEW: the weights-vs-KV crossover for Llama-3.1-8B."""
    weights = LLAMA_8B_PARAMS * 2
    assert round(weights / 1e9, 2) == 16.06
    crossover = weights / LLAMA_8B_KV_PER_TOKEN
    assert 122_500 <= crossover < 122_550
    assert round(crossover / 32, -2) == 3_800
    assert round(crossover / 64, -2) == 1_900
    assert crossover < 128 * 1024  # one request near the 128K context limit reaches it
    # below the crossover the weights dominate: 8 requests of 4,096 tokens read 4 GiB of KV
    assert 8 * 4_096 * LLAMA_8B_KV_PER_TOKEN == 4 * GiB < weights


def test_p00_memory_hierarchy_aside_and_number_formats():
    """phase-00 guide: the SRAM total, the SRAM/HBM ratio and fp16's largest value."""
    import numpy as np

    sram_per_sm_kb, sms = 192, 108  # A100, as the FlashAttention paper (section 2.1) gives them
    assert round(sram_per_sm_kb * sms / 1024) == 20  # KiB to MiB: "about 20 MB in all"
    assert 9 <= 19 / 2.0 <= 10  # 19 TB/s against about 2 TB/s: "roughly ten times"
    assert float(np.finfo(np.float16).max) == 65_504
    assert np.dtype(np.float16).itemsize == 2 and np.dtype(np.float32).itemsize == 4


def test_glossary_kv_cache_size_line_recovers_the_block_count():
    """GLOSSARY "GPU KV cache size line": 8,788 blocks of 16 at max_model_len 2,048."""
    blocks, block_size, max_model_len = 8_788, 16, 2_048
    concurrency = blocks / math.ceil(max_model_len / block_size)
    assert f"{concurrency:.2f}x" == "68.66x"
    assert int(concurrency * max_model_len) == blocks * block_size == 140_608


def test_errata_phase_11_rows():
    """ERRATA, Phase 11 rows: the shrink ratio, the capture line's size, the slot reservations."""
    # a rank-16 adapter on q, k, v, o of Llama-2-7B (hidden 4,096, 32 layers, MHA): r * (in + out) each
    adapter_params = 32 * 4 * 16 * (4_096 + 4_096)
    assert adapter_params == 16_777_216 and adapter_params * 2 == 32 * MiB  # bf16
    assert round(7e9 / adapter_params, 1) == 417.2  # a nominal 7B
    assert round(6_738_415_616 / adapter_params, 1) == 401.6  # Llama-2-7B's real count
    assert 32 * MiB / GiB == 0.03125  # the seed's "0.03 GiB", computed, not logged
    # vLLM's preallocated stacks, rank 16, bf16, per slot: every linear layer of the 32 layers
    # (one A of r x in and one B of out x r per packed slice), then the embedding and LM-head wrappers
    h, f, v, r = 4_096, 11_008, 32_000, 16
    qkv, o, gate_up, down = 3 * r * h + 3 * h * r, r * h + h * r, 2 * r * h + 2 * f * r, r * f + h * r
    per_layer = qkv + o + gate_up + down
    assert per_layer == 1_249_280
    linear_slot = 32 * per_layer * 2
    assert linear_slot / MiB == 76.25 and 8 * linear_slot / MiB == 610
    embed_slot = 2 * (v * r + h * r) * 2
    assert (8 * (linear_slot + embed_slot)) / MiB == 627.625
    # lab 11-04's 80/20 trace: 1,411 of 2,000 hits at 4 slots (the lab's test replays it)
    assert 1_411 / 2_000 == 0.7055
