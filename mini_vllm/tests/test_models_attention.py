"""Paged attention and the numpy transformer, driven by hand-built ModelInputs.

The claims: a mixed batch (prefill chunks that start mid-sequence, decodes)
read through shuffled block tables equals dense causal attention per request;
slots no block table reaches are never read; the model's logits do not depend
on how a sequence is chunked or what else shares the batch.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.model_input import ModelInput
from mini_vllm.models import LlamaForCausalLM, get_model, random_weights, tiny_random_config
from mini_vllm.models.attention import (
    GROUP_SIZE,
    dense_causal_attention,
    gather_kv,
    paged_attention,
    write_kv,
)
from mini_vllm.models.llama import apply_rope, rms_norm, silu
from mini_vllm.models.runner import Chunk, greedy_generate, make_model_input

BLOCK = 4


def _setup(seq_lens, chunk_lens, num_heads=4, kv_heads=2, head_dim=8, num_blocks=32, seed=0,
           poison=np.nan):
    """Random K/V for whole sequences; the last chunk_lens[b] tokens are 'this step'.

    Returns the cache (cached prefixes already written, everything else poisoned),
    the step's ModelInput, the step's q/k/v rows, and the full per-request q/k/v.
    """
    rng = np.random.default_rng(seed)
    k_cache = np.full((num_blocks, BLOCK, kv_heads, head_dim), poison, dtype=np.float32)
    v_cache = k_cache.copy()
    free = rng.permutation(np.arange(1, num_blocks)).tolist()
    chunks, full, step_q, step_k, step_v = [], [], [], [], []
    for seq_len, m in zip(seq_lens, chunk_lens, strict=True):
        table = [free.pop() for _ in range(-(-seq_len // BLOCK))]
        q = rng.standard_normal((seq_len, num_heads, head_dim)).astype(np.float32)
        k = rng.standard_normal((seq_len, kv_heads, head_dim)).astype(np.float32)
        v = rng.standard_normal((seq_len, kv_heads, head_dim)).astype(np.float32)
        full.append((q, k, v))
        start = seq_len - m
        if start:  # the cached prefix, written by earlier steps
            prefix = make_model_input([Chunk([0] * start, 0, table)], BLOCK)
            write_kv(k_cache, v_cache, k[:start], v[:start], prefix.slot_mapping)
        chunks.append(Chunk([0] * m, start, table))
        step_q.append(q[start:])
        step_k.append(k[start:])
        step_v.append(v[start:])
    mi = make_model_input(chunks, BLOCK)
    return (k_cache, v_cache, mi, np.concatenate(step_q), np.concatenate(step_k),
            np.concatenate(step_v), full)


def test_slot_mapping_is_block_id_times_block_size_plus_offset():
    mi = make_model_input([Chunk([1, 2, 3], 0, [5, 0]), Chunk([9], 7, [2, 9])], BLOCK)
    # The worked example in model_input.py's docstring.
    assert mi.slot_mapping.tolist() == [20, 21, 22, 39]
    assert mi.positions.tolist() == [0, 1, 2, 7]
    assert mi.query_start_loc.tolist() == [0, 3, 4]
    assert mi.seq_lens.tolist() == [3, 8]
    assert mi.logits_indices.tolist() == [2, 3]


def test_write_then_gather_round_trips_through_a_shuffled_block_table():
    rng = np.random.default_rng(1)
    cache_k = np.zeros((16, BLOCK, 2, 8), dtype=np.float32)
    cache_v = np.zeros_like(cache_k)
    table = [11, 3, 7]
    k = rng.standard_normal((10, 2, 8)).astype(np.float32)
    mi = make_model_input([Chunk([0] * 10, 0, table)], BLOCK)
    write_kv(cache_k, cache_v, k, -k, mi.slot_mapping)
    np.testing.assert_array_equal(gather_kv(cache_k, np.array([table]), np.array([10]))[0], k)
    np.testing.assert_array_equal(gather_kv(cache_v, np.array([table]), np.array([10]))[0], -k)
    # Two requests at once: the shorter one is zero-padded, not filled from its tail block.
    both = gather_kv(cache_k, np.array([table, [3, 0, 0]]), np.array([10, 2]))
    assert both.shape == (2, 10, 2, 8)
    np.testing.assert_array_equal(both[1, :2], cache_k[3, :2])
    assert not both[1, 2:].any()
    np.testing.assert_array_equal(cache_k[3, 1], k[5])  # token 5 -> block 3, offset 1


@pytest.mark.parametrize("num_heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_paged_mixed_batch_equals_dense_attention_per_request(num_heads, kv_heads):
    # A: whole 7-token prefill; B: a 4-token chunk after 9 cached tokens;
    # C and D: decodes at positions 12 and 0; E: a chunk that ends on a block edge.
    seq_lens, chunk_lens = [7, 13, 13, 1, 8], [7, 4, 1, 1, 3]
    k_cache, v_cache, mi, q, k, v, full = _setup(seq_lens, chunk_lens, num_heads, kv_heads)
    write_kv(k_cache, v_cache, k, v, mi.slot_mapping)
    out = paged_attention(q, k_cache, v_cache, mi, scale=8 ** -0.5)
    assert np.isfinite(out).all(), "a poisoned (never written) slot was read"
    for b, (fq, fk, fv) in enumerate(full):
        want = dense_causal_attention(fq, fk, fv, scale=8 ** -0.5)[seq_lens[b] - chunk_lens[b]:]
        got = out[mi.query_start_loc[b]:mi.query_start_loc[b + 1]]
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_many_requests_grouped_by_length_still_match_dense_attention():
    # 37 decodes of scattered lengths (more than GROUP_SIZE, so several calls)
    # plus three 3-row chunks: grouping and sorting must not mix up rows.
    rng = np.random.default_rng(7)
    seq_lens = rng.integers(1, 30, 37).tolist() + [9, 25, 3]
    chunk_lens = [1] * 37 + [3, 3, 3]
    k_cache, v_cache, mi, q, k, v, full = _setup(seq_lens, chunk_lens, num_blocks=400)
    assert len(seq_lens) > 2 * GROUP_SIZE
    write_kv(k_cache, v_cache, k, v, mi.slot_mapping)
    out = paged_attention(q, k_cache, v_cache, mi, scale=0.35)
    for b, (fq, fk, fv) in enumerate(full):
        want = dense_causal_attention(fq, fk, fv, scale=0.35)[seq_lens[b] - chunk_lens[b]:]
        got = out[mi.query_start_loc[b]:mi.query_start_loc[b + 1]]
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_unwritten_slots_never_reach_the_output():
    # Poison every slot that was not written (free blocks, block tails, the null
    # block 0) with a huge value, then with NaN: the answer must not move.
    outs = []
    for poison in (0.0, 1e30, np.nan):
        k_cache, v_cache, mi, q, k, v, _ = _setup([6, 9], [2, 1], poison=poison)
        write_kv(k_cache, v_cache, k, v, mi.slot_mapping)
        outs.append(paged_attention(q, k_cache, v_cache, mi, scale=0.5))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_two_physical_layouts_give_the_same_attention():
    a = _setup([11, 5], [3, 1], seed=3)
    outs = []
    for perm_seed in (0, 1):
        k_cache, v_cache, mi, q, k, v, _ = a
        # Move every block to another physical place and rewrite the tables.
        perm = np.random.default_rng(perm_seed).permutation(k_cache.shape[0])
        inv = np.argsort(perm)
        mi2 = ModelInput(mi.token_ids, mi.positions, mi.query_start_loc, mi.seq_lens,
                         inv[mi.block_tables], inv[mi.slot_mapping // BLOCK] * BLOCK
                         + mi.slot_mapping % BLOCK, mi.logits_indices, BLOCK)
        kc, vc = k_cache[perm].copy(), v_cache[perm].copy()
        write_kv(kc, vc, k, v, mi2.slot_mapping)
        outs.append(paged_attention(q, kc, vc, mi2, scale=0.3))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_rms_norm_silu_and_rope_match_their_formulas():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal(8).astype(np.float32)
    want = w * x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(rms_norm(x, w, 1e-6), want, rtol=1e-5)
    big = np.array([-1000.0, -20.0, 0.0, 3.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise"):  # the model's silu never overflows...
        got = silu(big)
    with np.errstate(over="ignore"):  # ...unlike the textbook formula
        want = big / (1 + np.exp(-big.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    # RoPE rotates the pair (x[i], x[i + d/2]) by angle pos * inv_freq[i]: norms are kept,
    # position 0 is the identity, and q.k depends only on the distance between positions.
    v = rng.standard_normal((1, 1, 8)).astype(np.float32)
    u = rng.standard_normal((1, 1, 8)).astype(np.float32)
    inv = 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)

    def rot(t, pos):
        ang = np.array([[pos]]) * inv
        return apply_rope(t, np.cos(ang), np.sin(ang))

    np.testing.assert_allclose(rot(v, 0), v)
    np.testing.assert_allclose(np.linalg.norm(rot(v, 37)), np.linalg.norm(v), rtol=1e-5)
    d1 = (rot(v, 10) * rot(u, 3)).sum()
    d2 = (rot(v, 107) * rot(u, 100)).sum()
    np.testing.assert_allclose(d1, d2, rtol=1e-4)


def test_model_logits_do_not_depend_on_chunking_or_batch_neighbours():
    model = get_model("tiny-random")
    prompt = [int(t) for t in np.random.default_rng(2).integers(0, 256, 23)]
    other = [7, 8, 9, 10, 11]
    results = []
    for chunk_size in (None, 1, 5, 8):
        for with_neighbour in (False, True):
            prompts = [other, prompt] if with_neighbour else [prompt]
            toks, logits = greedy_generate(model, prompts, 6, chunk_size=chunk_size,
                                           seed=chunk_size or 0, return_logits=True)
            results.append((toks[-1], logits[-1]))
    for toks, logits in results[1:]:
        assert toks == results[0][0]
        np.testing.assert_allclose(logits, results[0][1], atol=1e-4, rtol=0)


def test_decode_step_reads_the_cache_the_prefill_wrote():
    # Prefill 9 tokens, then decode one: equals a 10-token prefill's last logits.
    model = get_model("tiny-random")
    toks = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    model.init_kv_cache(8, BLOCK)
    table = [6, 2, 5]
    model.execute(make_model_input([Chunk(toks[:9], 0, table)], BLOCK))
    step = model.execute(make_model_input([Chunk(toks[9:], 9, table)], BLOCK))
    model.init_kv_cache(8, BLOCK)
    whole = model.execute(make_model_input([Chunk(toks, 0, [1, 4, 7])], BLOCK))
    np.testing.assert_allclose(step, whole, atol=1e-4, rtol=0)
    # Corrupting one cached K row changes the answer: the cache really is read.
    model.init_kv_cache(8, BLOCK)
    model.execute(make_model_input([Chunk(toks[:9], 0, table)], BLOCK))
    model.kv_cache[0, 0, 2, 1] += 5.0  # layer 0, K, block 2 (tokens 4..7), offset 1
    bad = model.execute(make_model_input([Chunk(toks[9:], 9, table)], BLOCK))
    assert np.abs(bad - whole).max() > 1e-2


def test_tiny_random_is_seeded_and_shaped_for_the_byte_tokenizer():
    a, b, c = get_model("tiny-random"), get_model("tiny-random"), get_model("tiny-random", seed=1)
    assert (a.vocab_size, a.eos_token_id, a.tokenizer.vocab_size) == (257, 256, 257)
    assert a.max_model_len == 4096
    np.testing.assert_array_equal(a.weights.embed_tokens, b.weights.embed_tokens)
    assert not np.array_equal(a.weights.embed_tokens, c.weights.embed_tokens)
    a.init_kv_cache(10, 16)
    assert a.kv_cache.shape == (2, 2, 10, 16, 2, 16)  # layers, K/V, blocks, slots, heads, dim
    assert a.kv_cache_bytes == 10 * 16 * tiny_random_config().kv_bytes_per_token()
    logits = a.execute(make_model_input([Chunk([1, 2], 0, [3]), Chunk([5], 0, [4])], 16))
    assert logits.shape == (2, 257) and logits.dtype == np.float32


def test_tied_embeddings_share_the_input_matrix():
    cfg = tiny_random_config()
    cfg.tie_word_embeddings = True
    w = random_weights(cfg, seed=0)
    assert np.shares_memory(w.lm_head, w.embed_tokens)
    model = LlamaForCausalLM(cfg, w)
    model.init_kv_cache(4, 4)
    assert model.execute(make_model_input([Chunk([1, 2, 3], 0, [1])], 4)).shape == (1, 257)


def test_bad_arguments_are_rejected_with_the_parameter_name():
    model = get_model("tiny-random")
    with pytest.raises(RuntimeError, match="init_kv_cache"):
        model.execute(make_model_input([Chunk([1], 0, [1])], 4))
    with pytest.raises(ValueError, match="num_blocks"):
        model.init_kv_cache(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        model.init_kv_cache(4, 0)
    model.init_kv_cache(4, 8)
    with pytest.raises(ValueError, match="block_size"):
        model.execute(make_model_input([Chunk([1], 0, [1])], 4))
    with pytest.raises(ValueError, match="model must be"):
        get_model("")
    # 0 used to fall back to 4096 and 2.5 to be cut to 2, silently
    for bad in (4097, 0, 2.5, True):
        with pytest.raises(ValueError, match=r"^max_model_len must be an integer in \[1, 4096\]"):
            get_model("tiny-random", max_model_len=bad)
    for bad in (-1, 1.0):
        with pytest.raises(ValueError, match=r"^seed must be an integer >= 0"):
            get_model("tiny-random", seed=bad)
    with pytest.raises(ValueError, match=r"^num_blocks must be an integer >= 1"):
        model.init_kv_cache(2.5, 4)
    assert get_model("tiny-random", max_model_len=100).max_model_len == 100


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"vocab_size": 256}, "vocab_size"), ({"max_model_len": 1}, "max_model_len"),
    ({"seed": -1}, "seed"), ({"seed": "0"}, "seed"),
    ({"eos_bias": float("nan")}, "eos_bias"), ({"eos_bias": "low"}, "eos_bias"),
])
def test_toy_model_rejects_bad_values_naming_the_parameter(kwargs, name):
    from mini_vllm.model import ToyModel

    with pytest.raises(ValueError, match=rf"^{name} must be"):
        ToyModel(**kwargs)


def test_get_model_toy_is_the_control_plane_model():
    toy = get_model("toy", seed=3)
    assert type(toy).__name__ == "ToyModel" and toy.vocab_size == 257
    toy.init_kv_cache(4, 4)
    assert toy.execute(make_model_input([Chunk([1, 2], 0, [1])], 4)).shape == (1, 257)


def test_runner_helpers_reject_bad_arguments_naming_them():
    model = get_model("tiny-random")
    for kwargs, name in [({"max_new_tokens": 0}, "max_new_tokens"), ({"block_size": 0}, "block_size"),
                         ({"chunk_size": 0}, "chunk_size"), ({"max_new_tokens": 2.0}, "max_new_tokens")]:
        args = {"max_new_tokens": 2, **kwargs}
        with pytest.raises(ValueError, match=rf"^{name} must be an integer >= 1"):
            greedy_generate(model, [[1, 2]], **args)
    for prompts in ([], [[1], []]):
        with pytest.raises(ValueError, match="^prompts must be"):
            greedy_generate(model, prompts, 2)
    with pytest.raises(ValueError, match="^chunks must"):
        make_model_input([], 4)
    with pytest.raises(ValueError, match="^eos_bias: only the 'toy' model takes extra arguments"):
        get_model("tiny-random", eos_bias=1.0)
