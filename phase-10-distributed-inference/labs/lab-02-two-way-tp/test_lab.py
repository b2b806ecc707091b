"""Lab 10-02 tests: a whole model's shards, run by mini_vllm's TP workers, then KV arithmetic.

Order: the sharding checks (milliseconds: numpy only), the calculators, then the
engine checks. Every engine with ``tensor_parallel_size > 1`` forks its workers
(0.2-2 s on this machine), so one module fixture builds the TP = 1, 2 and 4 engines
once, runs one workload on each, and the engine tests read those runs.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from course import load_impl
from mini_vllm.distributed import sharding as reference
from mini_vllm.models import get_model
from mini_vllm.models.config import tiny_random_config
from mini_vllm.models.llama import random_weights
from mini_vllm.sampling_params import SamplingParams

impl = load_impl(__file__)

CONFIG = tiny_random_config()  # 2 layers, hidden 64, 4 heads over 2 KV heads, head_dim 16, MLP 128
WEIGHTS = get_model("tiny-random").weights  # the seeded weights every tiny-random engine loads
# The same shape with every bias Llama and Qwen2 can have: column biases are cut, row biases
# go to rank 0 only. tiny-random itself has no bias at all.
BIASED = replace(CONFIG, qkv_bias=True, o_bias=True, mlp_bias=True)
BIASED_WEIGHTS = random_weights(BIASED, seed=3)
LAYER_FIELDS = ("input_norm", "post_norm", "qkv_proj", "qkv_bias", "o_proj", "o_bias",
                "gate_up_proj", "gate_up_bias", "down_proj", "down_bias")

GIB = 2 ** 30


def assert_same_shards(got, want, where: str) -> None:
    """Every array of two ``Weights`` equal, bit for bit; ``None`` exactly where ``None``."""
    pairs = [("embed_tokens", got.embed_tokens, want.embed_tokens), ("norm", got.norm, want.norm),
             ("lm_head", got.lm_head, want.lm_head)]
    assert len(got.layers) == len(want.layers), where
    for i, (g, w) in enumerate(zip(got.layers, want.layers, strict=True)):
        pairs += [(f"layers[{i}].{f}", getattr(g, f), getattr(w, f)) for f in LAYER_FIELDS]
    for name, g, w in pairs:
        if w is None:
            assert g is None, f"{where}: {name} must be None"
            continue
        assert g is not None, f"{where}: {name} is None"
        assert g.shape == w.shape and g.dtype == w.dtype, f"{where}: {name} {g.shape} vs {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{where}: {name}")


# ---------------------------------------------------------------- qkv columns by hand


def test_qkv_columns_at_tp2_one_kv_head_per_rank():
    # Q columns 0..63 (4 heads x 16), K 64..95, V 96..127 (2 KV heads x 16 each).
    # Rank 1 of 2: query heads 2 and 3 -> 32..63; KV head 1 -> K 80..95 and V 112..127.
    cols = impl.qkv_columns(CONFIG, 1, 2)
    assert cols.tolist() == list(range(32, 64)) + list(range(80, 96)) + list(range(112, 128))
    assert np.asarray(cols).dtype.kind == "i"
    # Rank 0: heads 0, 1 and KV head 0 -> 0..31, 64..79, 96..111
    assert impl.qkv_columns(CONFIG, 0, 2).tolist() == (list(range(0, 32)) + list(range(64, 80))
                                                       + list(range(96, 112)))
    # TP = 1 keeps everything, in order
    assert impl.qkv_columns(CONFIG, 0, 1).tolist() == list(range(128))


def test_qkv_columns_at_tp4_replicate_each_kv_head_on_two_neighbours():
    # 4 ranks, 2 KV heads: one KV head per rank (not 2 // 4 = 0), 2 replicas each, and the
    # replicas are NEIGHBOURS: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1 (rank // 2),
    # never rank % 2 (which would pair query head 1 with KV head 1 — the wrong group).
    k_heads = []
    for rank in range(4):
        cols = impl.qkv_columns(CONFIG, rank, 4).tolist()
        assert len(cols) == 48  # 1 query head + 1 K head + 1 V head, 16 columns each
        assert cols[:16] == list(range(16 * rank, 16 * rank + 16))
        k_heads.append((cols[16] - 64) // 16)
        assert cols[16:32] == list(range(cols[16], cols[16] + 16))
        assert cols[32:] == [c + 32 for c in cols[16:32]]  # V: the same head, 32 columns later
    assert k_heads == [0, 0, 1, 1]


def test_qkv_columns_with_several_kv_heads_per_rank():
    # 8 query heads over 4 KV heads of 8: q_size 64, kv_size 32. At TP = 2 rank 1 keeps
    # query heads 4..7 (32..63) and KV heads 2, 3: K 64 + 16..31 = 80..95, V 96 + 16..31 = 112..127
    gqa = replace(CONFIG, num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    assert impl.qkv_columns(gqa, 1, 2).tolist() == (list(range(32, 64)) + list(range(80, 96))
                                                    + list(range(112, 128)))
    weights = random_weights(gqa, seed=5)
    for tp_size in (2, 4, 8):  # 2 and 1 KV heads per rank, then 2 replicas of each
        for rank in range(tp_size):
            assert_same_shards(impl.shard_weights(weights, gqa, rank, tp_size),
                               reference.shard_weights(weights, gqa, rank, tp_size),
                               f"8 heads / 4 KV heads, rank {rank} of {tp_size}")


@pytest.mark.parametrize("rank, tp_size, match", [
    (0, 3, r"tp_size must divide num_attention_heads \(4\)"),   # 4 heads do not split 3 ways
    (0, 8, r"tp_size must divide num_attention_heads \(4\)"),   # more ranks than query heads
    (0, 0, r"tp_size must be an integer >= 1"),
    (0, True, r"tp_size must be an integer >= 1"),
    (2, 2, r"rank must be an integer in \[0, tp_size\) = \[0, 2\)"),
    (-1, 2, r"rank must be an integer in \[0, tp_size\)"),
])
def test_bad_rank_or_tp_size(rank, tp_size, match):
    with pytest.raises(ValueError, match=match):
        impl.qkv_columns(CONFIG, rank, tp_size)
    with pytest.raises(ValueError, match=match):
        impl.shard_weights(WEIGHTS, CONFIG, rank, tp_size)


def test_tp_size_must_divide_the_mlp():
    odd = replace(CONFIG, intermediate_size=130)  # 130 = 2 x 65: splits 2 ways, not 4
    impl.shard_weights(random_weights(odd), odd, 1, 2)
    with pytest.raises(ValueError, match=r"tp_size must divide intermediate_size \(130\)"):
        impl.shard_weights(random_weights(odd), odd, 0, 4)


# ---------------------------------------------------------------- shards vs mini_vllm's own


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_shards_equal_mini_vllm_on_tiny_random(tp_size):
    for rank in range(tp_size):
        got = impl.shard_weights(WEIGHTS, CONFIG, rank, tp_size)
        assert_same_shards(got, reference.shard_weights(WEIGHTS, CONFIG, rank, tp_size),
                           f"tiny-random rank {rank} of {tp_size}")


@pytest.mark.parametrize("tp_size", [2, 4])
def test_biases_column_cut_row_on_rank_0_only(tp_size):
    for rank in range(tp_size):
        got = impl.shard_weights(BIASED_WEIGHTS, BIASED, rank, tp_size)
        assert_same_shards(got, reference.shard_weights(BIASED_WEIGHTS, BIASED, rank, tp_size),
                           f"biased rank {rank} of {tp_size}")
        lw, full = got.layers[1], BIASED_WEIGHTS.layers[1]
        np.testing.assert_array_equal(lw.qkv_bias, full.qkv_bias[impl.qkv_columns(BIASED, rank, tp_size)])
        if rank == 0:  # added once, after the sum: the full vector, on rank 0
            np.testing.assert_array_equal(lw.o_bias, full.o_bias)
            np.testing.assert_array_equal(lw.down_bias, full.down_bias)
        else:
            assert lw.o_bias is None and lw.down_bias is None


def test_shard_bytes_per_rank():
    # float32 elements of tiny-random (no biases):
    #   whole:  embed 257x64 + lm_head 64x257 + norm 64 = 32,960; a layer: norms 128 + qkv 64x128
    #           + o 64x64 + gate_up 64x256 + down 128x64 = 36,992; 2 layers: 73,984 -> 106,944 x 4 B
    #   TP = 2: embed 160x64 + lm_head 64x160 + 64 = 20,544; a layer: 128 + 64x64 + 32x64 + 64x128
    #           + 64x64 = 18,560; -> 57,664 x 4 B = 230,656 B (more than half: the padded vocab
    #           and the replicated norms)
    #   TP = 4: 80x64 x 2 + 64 = 10,304; a layer: 128 + 64x48 + 16x64 + 64x64 + 32x64 = 10,368
    #           -> 31,040 x 4 B = 124,160 B (qkv keeps 48 columns: its KV head is replicated)
    assert impl.weights_nbytes(WEIGHTS) == 427_776
    for tp_size, expected in ((2, 230_656), (4, 124_160)):
        for rank in range(tp_size):
            assert impl.weights_nbytes(impl.shard_weights(WEIGHTS, CONFIG, rank, tp_size)) == expected


def test_padding_rows_are_zero_and_shards_are_copies():
    # Rank 1 of 2 holds vocabulary rows 160..319; 257..319 are padding: local rows 97..159.
    s = impl.shard_weights(WEIGHTS, CONFIG, 1, 2)
    np.testing.assert_array_equal(s.embed_tokens[:97], WEIGHTS.embed_tokens[160:257])
    assert not s.embed_tokens[97:].any() and not s.lm_head[:, 97:].any()
    np.testing.assert_array_equal(s.lm_head[:, :97], WEIGHTS.lm_head[:, 160:257])
    for a in (s.embed_tokens, s.lm_head, s.layers[0].qkv_proj, s.layers[0].o_proj,
              s.layers[0].gate_up_proj, s.layers[0].down_proj):
        assert a.flags.c_contiguous and a.dtype == np.float32
        assert not any(np.shares_memory(a, w) for w in (WEIGHTS.embed_tokens, WEIGHTS.lm_head,
                                                         WEIGHTS.layers[0].qkv_proj, WEIGHTS.layers[0].o_proj,
                                                         WEIGHTS.layers[0].gate_up_proj,
                                                         WEIGHTS.layers[0].down_proj))


@pytest.mark.parametrize("tp_size", [2, 4])
def test_shards_reassemble_the_dense_layers(tp_size):
    """The Megatron identities, in float64 numpy on the biased model's layer 0: column shards
    concatenate, row shards' partial products add up, vocab shards cover every id once."""
    rng = np.random.default_rng(7)
    w = BIASED_WEIGHTS.layers[0]
    shards = [impl.shard_weights(BIASED_WEIGHTS, BIASED, r, tp_size) for r in range(tp_size)]
    x = rng.standard_normal((5, 64))
    # o_proj: rank r's attention output is its heads' columns; the partial sums add to dense
    attn = rng.standard_normal((5, 64))
    heads = 64 // tp_size
    partial = [attn[:, r * heads:(r + 1) * heads] @ s.layers[0].o_proj.astype(np.float64)
               + (0 if s.layers[0].o_bias is None else s.layers[0].o_bias) for r, s in enumerate(shards)]
    np.testing.assert_allclose(sum(partial), attn @ w.o_proj + w.o_bias, rtol=1e-12, atol=1e-12)
    # the MLP: gate and up cut alike, so silu(gate) * up stays elementwise on each rank
    def mlp(gu, gub, down, db):
        h = x @ gu.astype(np.float64) + gub
        gate, up = np.split(h, 2, axis=-1)
        return (gate / (1 + np.exp(-gate)) * up) @ down + (0 if db is None else db)
    dense = mlp(w.gate_up_proj, w.gate_up_bias, w.down_proj, w.down_bias)
    got = sum(mlp(s.layers[0].gate_up_proj, s.layers[0].gate_up_bias, s.layers[0].down_proj,
                  s.layers[0].down_bias) for s in shards)
    np.testing.assert_allclose(got, dense, rtol=1e-10, atol=1e-10)
    # the embedding: each id found on exactly one rank; the LM head's slices concatenate
    ids = np.array([0, 1, 159, 160, 256, 80, 81, 240])
    per = 320 // tp_size
    rows = sum(np.where(((ids >= r * per) & (ids < (r + 1) * per))[:, None],
                        s.embed_tokens[np.clip(ids - r * per, 0, per - 1)], 0.0)
               for r, s in enumerate(shards))
    np.testing.assert_array_equal(rows, BIASED_WEIGHTS.embed_tokens[ids])
    logits = np.concatenate([x @ s.lm_head.astype(np.float64) for s in shards], axis=-1)
    np.testing.assert_allclose(logits[:, :257], x @ BIASED_WEIGHTS.lm_head.astype(np.float64), rtol=1e-12)


# ---------------------------------------------------------------- collectives and KV arithmetic


def test_expected_collectives_per_step():
    assert impl.expected_collectives_per_step(2) == (5, 1)  # tiny-random: 2 x 2 + 1 all-reduces
    assert impl.expected_collectives_per_step(1) == (3, 1)
    # 32 layers (Llama-2-7B): 65 all-reduces and 1 gather, not "64"
    assert impl.expected_collectives_per_step(32) == (65, 1)
    assert impl.expected_collectives_per_step(24) == (49, 1)  # opt-1.3b
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_layers must be an integer >= 1"):
            impl.expected_collectives_per_step(bad)


def test_kv_bytes_per_token_opt_1_3b_and_tiny_random():
    # opt-1.3b in fp16: 24 layers, 32 KV heads (multi-head attention) x 64 = 2,048 wide:
    # 24 x 2 x 2,048 x 2 B = 196,608 B per token; half per rank at TP = 2 (96 KiB)
    assert impl.kv_bytes_per_token(24, 32, 64, 2) == 196_608
    assert impl.kv_bytes_per_token(24, 32, 64, 2, tp_size=2) == 98_304 == 96 * 1024
    assert impl.kv_bytes_per_token(24, 32, 64, 2, tp_size=8) == 24_576
    # tiny-random in float32: 2 layers x 2 (K, V) x 2 heads x 16 x 4 B = 512; TP = 2 -> 256;
    # TP = 4 has more ranks than KV heads: 1 head each (replicated), still 256, not 128
    assert impl.kv_bytes_per_token(2, 2, 16, 4) == 512 == CONFIG.kv_bytes_per_token(4)
    assert impl.kv_bytes_per_token(2, 2, 16, 4, tp_size=2) == 256
    assert impl.kv_bytes_per_token(2, 2, 16, 4, tp_size=4) == 256
    # SmolLM2-135M: 30 layers, 3 KV heads x 64, float32; TP = 3 -> one head per rank
    assert impl.kv_bytes_per_token(30, 3, 64, 4, tp_size=3) == 15_360


@pytest.mark.parametrize("args, match", [
    ((0, 32, 64, 2), "num_layers must be an integer >= 1"),
    ((24, 0, 64, 2), "num_kv_heads must be an integer >= 1"),
    ((24, 32, 0, 2), "head_dim must be an integer >= 1"),
    ((24, 32, 64, 0), "dtype_bytes must be an integer >= 1"),
    ((24, 32, 64, 2, 0), "tp_size must be an integer >= 1"),
    ((24, 32, 64, 2, 3), r"tp_size must divide or be a multiple of num_kv_heads \(32\)"),
    ((2, 2, 16, 4, 3), r"tp_size must divide or be a multiple of num_kv_heads \(2\)"),
])
def test_kv_bytes_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        impl.kv_bytes_per_token(*args)


def test_max_kv_blocks_per_rank_and_the_impossible_28500():
    block = 16 * impl.kv_bytes_per_token(24, 32, 64, 2, tp_size=2)
    assert block == 1_572_864 == 3 * 2 ** 19  # 1.5 MiB per 16-token block, all 24 layers
    # Even a whole 24 GB L4 holding nothing but KV: 24e9 / 1,572,864 = 15,258.8 -> 15,258 blocks.
    ceiling = impl.max_kv_blocks_per_rank(24 * 10 ** 9, block)
    assert ceiling == 15_258 < 28_500
    # What vLLM would budget: 0.8 of the card, minus ~1.2 GiB of weights (half of opt-1.3b's
    # 2.45 GiB in fp16) and a 2 GiB activation reserve: 19.2e9 - 3.2 GiB = 15,764,026,163 B
    # -> 10,022 blocks (derived, not measured: run.py prints vLLM's own figure on a GPU)
    got = impl.max_kv_blocks_per_rank(24 * 10 ** 9, block, gpu_memory_utilization=0.8,
                                      weight_bytes=int(1.2 * GIB), activation_bytes=2 * GIB)
    assert got == 10_022
    # TP = 1 on the same card: twice the bytes per block and all 2.4 GiB of weights:
    # (19.2e9 - 4.4 GiB) / 3 MiB = 14,475,535,974 / 3,145,728 = 4,601.7 -> 4,601, under a third
    assert impl.max_kv_blocks_per_rank(24 * 10 ** 9, 2 * block, 0.8, int(2.4 * GIB), 2 * GIB) == 4_601
    assert impl.max_kv_blocks_per_rank(10, 5) == 2 and impl.max_kv_blocks_per_rank(10, 3) == 3
    assert impl.max_kv_blocks_per_rank(100, 10, 0.5, 20, 10) == 2  # 50 - 30 = 20 B -> 2 blocks
    # a positive budget smaller than one block is 0 blocks, not the "no memory" error
    # (upstream, too, starts the check with available_memory <= 0)
    assert impl.max_kv_blocks_per_rank(10, 5, 0.5, 4) == 0


@pytest.mark.parametrize("args, kwargs, match", [
    ((0, 10), {}, "gpu_memory_bytes must be an integer >= 1"),
    ((100, 0), {}, "kv_bytes_per_block must be an integer >= 1"),
    ((100, 10), {"gpu_memory_utilization": 0}, r"gpu_memory_utilization must be a number in \(0, 1\]"),
    ((100, 10), {"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be a number in \(0, 1\]"),
    ((100, 10), {"weight_bytes": -1}, "weight_bytes must be an integer >= 0"),
    ((100, 10), {"activation_bytes": -1}, "activation_bytes must be an integer >= 0"),
    ((100, 10), {"gpu_memory_utilization": 0.5, "weight_bytes": 50}, "gpu_memory_utilization .*leaves no memory"),
])
def test_max_kv_blocks_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        impl.max_kv_blocks_per_rank(*args, **kwargs)


# ---------------------------------------------------------------- the engine, on your shards

NUM_LAYERS = CONFIG.num_hidden_layers
BLOCK_SIZE, NUM_BLOCKS = 4, 48
# 8 prompts, 3 to 23 tokens, two sharing a 12-token prefix; 16 tokens a step at most, so the
# long prompts are prefilled in chunks next to other requests' decodes.
PREFIX = list(range(40, 52))
PROMPTS = [PREFIX + [7, 8, 9], list(range(100, 123)), [200, 3, 200, 3, 9], PREFIX + [1, 2],
           [5, 6, 7], list(range(250, 230, -1)), [17] * 9, [0, 255, 128, 64, 32, 16]]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def run_workload(tp: int) -> dict:
    engine = impl.tp_engine(tp, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, max_num_batched_tokens=16)
    try:
        model, logits = engine.model, []
        execute = model.execute
        model.execute = lambda mi: logits.append(execute(mi)) or logits[-1]
        start = time.perf_counter()
        reqs = engine.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
        step_s = (time.perf_counter() - start) / engine.num_steps
        kv = model.kv_cache_bytes_per_rank() if tp > 1 else [model.kv_cache_bytes]
    finally:
        engine.shutdown()
    return dict(tokens=[list(r.output_token_ids) for r in reqs], stats=engine.stats, logits=logits,
                kv=kv, step_s=step_s)


@pytest.fixture(scope="module")
def runs():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker: one thread per rank, so the timings compare
    try:
        out = {tp: run_workload(tp) for tp in (1, 2, 4)}
    finally:
        torch.set_num_threads(before)
    print(f"\ntiny-random, gloo on this CPU: TP=1 {out[1]['step_s'] * 1e3:.1f} ms/step, "
          f"TP=2 {out[2]['step_s'] * 1e3:.1f} ms/step, TP=4 {out[4]['step_s'] * 1e3:.1f} ms/step")
    return out


def test_workload_chunks_prefills(runs):
    # with the 16-token budget, some step mixes a prefill chunk with decodes of others
    stats = runs[1]["stats"]
    assert max(sum(s.num_scheduled_tokens.values()) for s in stats) == 16
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in stats)


@pytest.mark.parametrize("tp", [2, 4])
def test_greedy_tokens_of_tp_equal_tp1(runs, tp):
    assert runs[tp]["tokens"] == runs[1]["tokens"]
    assert all(len(t) == 6 for t in runs[1]["tokens"])


@pytest.mark.parametrize("tp", [2, 4])
def test_logits_of_tp_match_tp1_within_1e_5(runs, tp):
    ref, got = runs[1]["logits"], runs[tp]["logits"]
    assert len(got) == len(ref)
    for a, b in zip(ref, got, strict=True):
        assert b.shape == a.shape and a.shape[1] == 257  # padding columns cut after the gather
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_each_rank_holds_half_the_kv_bytes(runs):
    tokens = NUM_BLOCKS * BLOCK_SIZE  # the pool's slots, the same block count on every rank
    full = runs[1]["kv"]
    assert full == [tokens * impl.kv_bytes_per_token(NUM_LAYERS, 2, 16, 4)] == [98_304]
    assert runs[2]["kv"] == [full[0] // 2] * 2 == [tokens * impl.kv_bytes_per_token(NUM_LAYERS, 2, 16, 4, 2)] * 2
    # TP = 4: one replicated KV head per rank, so still half, not a quarter
    assert runs[4]["kv"] == [full[0] // 2] * 4 == [tokens * impl.kv_bytes_per_token(NUM_LAYERS, 2, 16, 4, 4)] * 4


def test_collectives_per_step_match_the_count(runs):
    all_reduces, gathers = impl.expected_collectives_per_step(NUM_LAYERS)
    assert {s.num_collectives for s in runs[1]["stats"]} == {0}  # TP = 1: none at all
    for tp in (2, 4):  # every step, prefill or decode, whatever its batch: 5 + 1
        assert {s.num_collectives for s in runs[tp]["stats"]} == {all_reduces + gathers}
