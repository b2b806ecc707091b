"""Lab 04-05 tests: the learner's backend inside mini_vllm changes nothing but the traffic."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib
import runpy

import numpy as np
import pytest

from course import load_impl

impl = load_impl(__file__)

from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.model_input import ModelInput  # noqa: E402
from mini_vllm.models import LlamaForCausalLM, random_weights, tiny_random_config  # noqa: E402
from mini_vllm.models.attention import paged_attention, write_kv  # noqa: E402
from mini_vllm.models.attention_backends import (  # noqa: E402
    AttentionBackend,
    AttentionBackendEnum,
    NumpyFlashBackend,
)
from mini_vllm.models.runner import Chunk, make_model_input  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402
from mini_vllm.tokenizer import ByteTokenizer  # noqa: E402

Backend = impl.OnlineSoftmaxBackend
BLOCK, HEADS, KV_HEADS, DIM = 4, 4, 2, 8
SCALE = 0.37  # not DIM ** -0.5: the scale argument must be the one used


# ------------------------------------------------------------------ the declarations
def test_class_declares_the_contract():
    # the inherited validate_configuration turns the declarations into upstream's strings
    assert Backend.validate_configuration(16, "float32", 4) == []
    assert Backend.validate_configuration(64, "float64", 16) == []
    assert Backend.validate_configuration(16, "float16", 4) == ["dtype not supported"]
    assert Backend.validate_configuration(16, "float32", 4, "torch") == ["platform torch not supported"]
    assert issubclass(Backend, AttentionBackend)
    assert not issubclass(Backend, NumpyFlashBackend)  # the kernel is yours, not the engine's
    assert Backend.name == "NUMPY_FLASH_LAB"
    assert Backend.name not in AttentionBackendEnum.__members__  # reachable only as a class
    assert Backend.platforms == ("numpy",)
    assert set(Backend.supported_dtypes) == {"float32", "float64"}
    assert Backend().kv_rows_read == 0


@pytest.mark.parametrize(("head_size", "ok"), [
    (8, True), (16, True), (64, True), (128, True), (256, True),  # multiples of 8 up to 256
    (0, False), (-8, False), (4, False), (12, False), (20, False), (84, False),
    (255, False), (264, False), (512, False),  # 512 is FA4-only upstream; not here
])
def test_head_sizes_follow_flash_attention(head_size, ok):
    assert Backend.supports_head_size(head_size) is ok
    reasons = Backend.validate_configuration(head_size, "float32", 4)
    assert reasons == ([] if ok else ["head_size not supported"])


@pytest.mark.parametrize(("block_size", "ok"), [(1, True), (3, True), (4, True), (16, True),
                                                (0, False), (-4, False)])
def test_any_positive_block_size_is_supported(block_size, ok):
    assert Backend.supports_block_size(block_size) is ok


def model_with_head_dim(head_dim):
    """tiny-random's shape with another head size (4 heads over 2 KV heads)."""
    config = dataclasses.replace(tiny_random_config(), head_dim=head_dim)
    return LlamaForCausalLM(config, random_weights(config, 0), tokenizer=ByteTokenizer(),
                            name=f"tiny-head-{head_dim}")


def test_the_engine_refuses_a_head_size_the_backend_rejects():
    # head_dim 12 is not a multiple of 8: an explicit choice is validated and refused, with
    # upstream's sentence and reason string, before any request runs.
    with pytest.raises(ValueError, match=r"^Selected backend NUMPY_FLASH_LAB is not valid for this "
                                         r"configuration \(head_size=12, .*\)\. "
                                         r"Reason: \['head_size not supported'\]$"):
        LLMEngine(model_with_head_dim(12), block_size=4, num_blocks=8, attention_backend=Backend)
    # the same model under "auto" gets the default kernel, which declares every head size
    assert LLMEngine(model_with_head_dim(12), block_size=4, num_blocks=8).attention_backend.name \
        == "NUMPY_GATHER"
    # and a head size of 8 is accepted, the instance wired into the model
    engine = LLMEngine(model_with_head_dim(8), block_size=4, num_blocks=8, attention_backend=Backend)
    assert engine.attention_backend is Backend
    assert type(engine.model.attn_backend) is Backend


# ------------------------------------------------------------------ the kernel, by hand
# One step of five requests, block size 4, every slot nobody wrote poisoned (rows of q):
#   0..6    a chunk at positions 6..12 of 13 (table [9, 3, 11, 2]), its first 6 keys cached
#   7..13   a whole 7-token prompt ([5, 12]), its last block half full
#   14      a decode at position 9 ([1, 10, 8])
#   15      a one-token prompt: a single key ([4])
#   16      a decode at position 7 that fills its last block ([6, 7])
CHUNKS = [Chunk(list(range(7)), 6, [9, 3, 11, 2]), Chunk(list(range(7)), 0, [5, 12]),
          Chunk([1], 9, [1, 10, 8]), Chunk([2], 0, [4]), Chunk([3], 7, [6, 7])]
# seq_lens 13, 7, 10, 1, 8 -> 4, 2, 3, 1, 2 blocks of 4 -> 16 + 8 + 12 + 4 + 8 = 48 rows per call
ROWS_PER_CALL = 48


def mixed_batch(poison, dtype=np.float32, seed=0, chunks=CHUNKS):
    rng = np.random.default_rng(seed)
    mi = make_model_input(chunks, BLOCK)
    shape = (13, BLOCK, KV_HEADS, DIM)
    k_cache, v_cache = np.full(shape, poison, dtype), np.full(shape, poison, dtype)
    for c in chunks:  # the cached context before each chunk
        slots = np.array([c.block_table[p // BLOCK] * BLOCK + p % BLOCK for p in range(c.start)],
                         dtype=np.int64)
        kv = rng.standard_normal((2, len(slots), KV_HEADS, DIM)).astype(dtype)
        write_kv(k_cache, v_cache, kv[0], kv[1], slots)
    kv = rng.standard_normal((2, mi.num_tokens, KV_HEADS, DIM)).astype(dtype)
    write_kv(k_cache, v_cache, kv[0], kv[1], mi.slot_mapping)  # this step's own rows
    q = rng.standard_normal((mi.num_tokens, HEADS, DIM)).astype(dtype)
    return q, k_cache, v_cache, mi


def dense_oracle(q, k_cache, v_cache, mi, scale):
    """float64, written here: each request's keys read slot by slot, bottom-right causal mask."""
    out = np.zeros(q.shape)
    group = q.shape[1] // k_cache.shape[2]
    for b in range(mi.num_reqs):
        r0, r1, n = mi.query_start_loc[b], mi.query_start_loc[b + 1], int(mi.seq_lens[b])
        if r1 == r0:
            continue
        blocks = mi.block_tables[b, np.arange(n) // BLOCK]
        k = k_cache[blocks, np.arange(n) % BLOCK].astype(np.float64)
        v = v_cache[blocks, np.arange(n) % BLOCK].astype(np.float64)
        for r in range(r0, r1):
            pos = mi.positions[r]
            for h in range(q.shape[1]):
                s = k[:pos + 1, h // group] @ q[r, h].astype(np.float64) * scale
                p = np.exp(s - s.max())
                out[r, h] = p @ v[:pos + 1, h // group] / p.sum()
    return out


@pytest.mark.parametrize("poison", [np.nan, 1e30])
def test_mixed_batch_equals_mini_vllm_paged_attention(poison):
    q, k_cache, v_cache, mi = mixed_batch(poison)
    assert mi.seq_lens.tolist() == [13, 7, 10, 1, 8]
    got = Backend().forward(q, k_cache, v_cache, mi, SCALE)
    assert got.dtype == np.float32 and got.shape == q.shape
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, paged_attention(q, k_cache, v_cache, mi, SCALE), rtol=0, atol=2e-6)


def test_float64_is_exact_against_a_dense_oracle():
    q, k_cache, v_cache, mi = mixed_batch(np.nan, dtype=np.float64, seed=1)
    got = Backend().forward(q, k_cache, v_cache, mi, SCALE)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, dense_oracle(q, k_cache, v_cache, mi, SCALE), rtol=0, atol=1e-12)


def test_a_chunk_sees_its_cached_prefix_and_not_its_future():
    # Request 0's chunk holds positions 6..12: row 0 (position 6) must see keys 0..6, so
    # loud values at positions 7..12 change rows 1..6 but never row 0 (a top-left mask would
    # let row 0 see key 0 only, and the cached prefix, positions 0..5, shapes every row).
    q, k_cache, v_cache, mi = mixed_batch(np.nan, dtype=np.float64, seed=2)
    before = Backend().forward(q, k_cache, v_cache, mi, SCALE)
    loud_v = v_cache.copy()
    for pos in range(7, 13):
        loud_v[CHUNKS[0].block_table[pos // BLOCK], pos % BLOCK] += 1e3
    after = Backend().forward(q, k_cache, loud_v, mi, SCALE)
    np.testing.assert_array_equal(after[0], before[0])
    assert np.abs(after[1:7] - before[1:7]).min() > 1.0
    np.testing.assert_array_equal(after[7:], before[7:])  # other requests untouched


@pytest.mark.parametrize("loud", [800.0, -800.0])
def test_scores_near_800_do_not_overflow_or_vanish(loud):
    # every key of every request equal to one direction u, q = +-c u: all scores ~ +-800,
    # exp(800) is inf and exp(-800) is 0 in float64, so only a max-shifted recurrence that
    # starts at -inf survives; all keys score the same, so each output is the mean of v.
    q, k_cache, v_cache, mi = mixed_batch(np.nan, dtype=np.float64, seed=3)
    u = np.ones(DIM) / np.sqrt(DIM)
    written = ~np.isnan(k_cache[..., 0])
    k_cache[written] = u
    q[:] = loud / SCALE * u
    got = Backend().forward(q, k_cache, v_cache, mi, SCALE)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, dense_oracle(q, k_cache, v_cache, mi, SCALE), rtol=0, atol=1e-12)


def test_the_cache_is_only_read_and_inputs_are_kept():
    q, k_cache, v_cache, mi = mixed_batch(np.nan)
    saved = [a.copy() for a in (q, k_cache, v_cache, mi.block_tables, mi.seq_lens)]
    Backend().forward(q, k_cache, v_cache, mi, SCALE)
    for a, b in zip(saved, (q, k_cache, v_cache, mi.block_tables, mi.seq_lens), strict=True):
        np.testing.assert_array_equal(a, b)  # NaN == NaN here: the poison stays where it was


def test_rows_read_are_whole_blocks_added_per_call():
    q, k_cache, v_cache, mi = mixed_batch(np.nan)
    backend = Backend()
    backend.forward(q, k_cache, v_cache, mi, SCALE)
    # 13, 7, 10, 1, 8 keys -> (4 + 2 + 3 + 1 + 2) blocks x 4 rows; per token it would be 39,
    # padded per group like the gather kernel 68 (2 x 16 for the two 7-row requests,
    # 3 x 12 for the three single rows)
    assert backend.kv_rows_read == ROWS_PER_CALL == 48
    backend.forward(q, k_cache, v_cache, mi, SCALE)  # a second layer of the same step
    assert backend.kv_rows_read == 96
    backend.kv_rows_read = 5  # the engine owns the reset; forward only adds
    backend.forward(q, k_cache, v_cache, mi, SCALE)
    assert backend.kv_rows_read == 53


def test_a_padding_request_owns_no_rows_and_reads_nothing():
    # vLLM pads batches with requests whose query is empty; insert one (seq_len 6, blocks
    # [10, 5]) between requests 1 and 2: the output is unchanged and it costs no rows.
    q, k_cache, v_cache, mi = mixed_batch(np.nan)
    qsl = mi.query_start_loc
    table = np.insert(mi.block_tables, 2, [10, 5, 0, 0], axis=0)
    padded = ModelInput(mi.token_ids, mi.positions, np.insert(qsl, 2, qsl[2]),
                        np.insert(mi.seq_lens, 2, 6), table, mi.slot_mapping,
                        mi.logits_indices, BLOCK)
    backend = Backend()
    got = backend.forward(q, k_cache, v_cache, padded, SCALE)
    np.testing.assert_array_equal(got, Backend().forward(q, k_cache, v_cache, mi, SCALE))
    assert backend.kv_rows_read == ROWS_PER_CALL


def test_bad_inputs_raise_value_error_naming_the_parameter():
    q, k_cache, v_cache, mi = mixed_batch(0.0)
    backend = Backend()
    with pytest.raises(ValueError, match="q must be"):
        backend.forward(q[:-1], k_cache, v_cache, mi, SCALE)
    with pytest.raises(ValueError, match="v_cache must have k_cache's shape"):
        backend.forward(q, k_cache, v_cache[:-1], mi, SCALE)
    with pytest.raises(ValueError, match="num_kv_heads"):
        backend.forward(q[:, :3], k_cache, v_cache, mi, SCALE)
    with pytest.raises(ValueError, match="block_size"):
        backend.forward(q, k_cache, v_cache, dataclasses.replace(mi, block_size=8), SCALE)
    assert backend.kv_rows_read == 0  # nothing was counted for a refused call


# ------------------------------------------------------------------ in the engine
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SYSTEM = list(range(60, 77))  # 17 shared tokens: 4 full blocks of 4 that the prefix cache shares
PROMPTS = [{"prompt_token_ids": SYSTEM + [3, 1, 4]}, {"prompt_token_ids": [88]},
           {"prompt_token_ids": list(range(120, 150))}, {"prompt_token_ids": SYSTEM + [5]},
           {"prompt_token_ids": [9, 8, 7, 6, 5, 4]}, {"prompt_token_ids": SYSTEM},
           {"prompt_token_ids": list(range(200, 211))}, {"prompt_token_ids": SYSTEM + [2, 7, 1, 8]}]


def engine_run(backend, waves=1, **kw):
    """Run PROMPTS ``waves`` times on one engine whose whole KV cache starts as NaN.

    Returns the tokens of each wave, the engine, and per executed step the logits and the
    ModelInput's (query_start_loc, seq_lens).
    """
    engine = LLMEngine("tiny-random", block_size=BLOCK, attention_backend=backend, **kw)
    engine.model.kv_cache[:] = np.nan  # no slot is readable before the step that writes it
    steps, execute = [], engine.model.execute

    def recording_execute(mi):
        logits = execute(mi)
        steps.append((logits, mi.query_start_loc.copy(), mi.seq_lens.copy()))
        return logits

    engine.model.execute = recording_execute
    tokens = [[list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
              for _ in range(waves)]
    return tokens, engine, steps


def block_rows(qsl, seq_lens, layers):
    """The test's own arithmetic: every request with rows reads ceil(seq_len / 4) blocks of 4."""
    has_rows = np.diff(qsl) > 0
    return layers * int(sum(-(-int(n) // BLOCK) * BLOCK for n in seq_lens[has_rows]))


@pytest.fixture(scope="module")
def chunked():
    """Both backends, chunks of at most 7 tokens, two waves (the second hits the prefix cache)."""
    kw = dict(num_blocks=96, max_num_batched_tokens=7, waves=2)
    return {"lab": engine_run(Backend, **kw), "gather": engine_run("NUMPY_GATHER", **kw)}


def test_greedy_tokens_equal_the_default_backend_under_chunked_prefill_and_prefix_hits(chunked):
    (lab, engine, _), (gather, _, _) = chunked["lab"], chunked["gather"]
    assert engine.attention_backend is Backend and type(engine.model.attn_backend) is Backend
    assert lab == gather
    assert lab[0] == lab[1]  # the second wave, served from cached blocks, decodes the same
    # the waves really differ in how they ran: chunks of 7 (a 30-token prompt needs 5 steps),
    # and in the second wave every prompt's full blocks come from the cache
    assert max(sum(s.num_scheduled_tokens.values()) for s in engine.stats) == 7
    assert sum(s.num_cached_tokens for s in engine.stats) >= 4 * 17


def test_step_logits_agree_with_the_default_backend_to_1e_5(chunked):
    lab, gather = chunked["lab"][2], chunked["gather"][2]
    assert len(lab) == len(gather) > 20
    for (a, qsl_a, lens_a), (b, qsl_b, lens_b) in zip(lab, gather, strict=True):
        np.testing.assert_array_equal(qsl_a, qsl_b)  # the same schedule, step for step
        np.testing.assert_array_equal(lens_a, lens_b)
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_each_steps_rows_read_are_block_arithmetic_over_every_layer(chunked):
    _, engine, steps = chunked["lab"]
    layers = engine.model.config.num_hidden_layers
    assert layers == 2
    executed = [s for s in engine.stats if s.num_scheduled_tokens]
    assert len(executed) == len(steps)
    for stat, (_, qsl, seq_lens) in zip(executed, steps, strict=True):
        assert stat.kv_rows_read == block_rows(qsl, seq_lens, layers)
    # the first step by hand: 7 tokens of the first 20-token prompt, so seq_len 7 = 2 blocks
    # of 4 = 8 rows, in each of 2 layers (per token it would be 14)
    _, qsl, seq_lens = steps[0]
    assert seq_lens.tolist() == [7] and executed[0].kv_rows_read == 2 * 8


def test_rows_read_never_exceed_the_gather_backends(chunked):
    lab = [s.kv_rows_read for s in chunked["lab"][1].stats]
    gather = [s.kv_rows_read for s in chunked["gather"][1].stats]
    assert len(lab) == len(gather)
    assert all(a <= b for a, b in zip(lab, gather, strict=True))
    # the gather pads each group of decodes to its longest request; streaming does not
    assert sum(lab) < sum(gather)


def test_preemption_in_a_tiny_pool_keeps_the_tokens(chunked):
    # 12 usable blocks of 4 cannot hold eight requests growing to 38 tokens: requests are
    # preempted (their blocks freed, the cache refilled with other requests' K/V) and
    # recomputed later. The stale rows they leave behind must never be read.
    tokens, engine, steps = engine_run(Backend, num_blocks=13)
    assert sum(len(s.preempted) for s in engine.stats) >= 1
    assert tokens[0] == chunked["gather"][0][0]
    executed = [s for s in engine.stats if s.num_scheduled_tokens]
    assert [s.kv_rows_read for s in executed] == [block_rows(qsl, lens, 2) for _, qsl, lens in steps]


def test_script_example_runs():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(pathlib.Path(impl.__file__)), run_name="__main__")
    assert out.getvalue().splitlines() == [
        "NUMPY_GATHER     kv_rows_read per step: [16, 40, 64, 64]",
        "NUMPY_FLASH_LAB  kv_rows_read per step: [16, 40, 40, 48]",
        "same greedy tokens: True",
    ]
