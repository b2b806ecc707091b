"""Attention backends: the selector's rules, kernel equality, exact read counts, engine invariance.

Every backend must give what ``NUMPY_GATHER`` (the Phase 02 kernel, still the
default) gives: the same attention output to float32 rounding on hand-built
mixed batches full of poisoned stale slots, and the same greedy tokens through
the engine under chunked prefill, prefix caching and preemption. The read
counters are compared exactly with block arithmetic done here by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.engine import LLMEngine
from mini_vllm.models.attention import paged_attention, write_kv
from mini_vllm.models.attention_backends import (
    PRIORITIES,
    AttentionBackend,
    AttentionBackendEnum,
    NumpyFlashBackend,
    NumpyGatherBackend,
    NumpySplitKVBackend,
    attend_partial,
    get_attn_backend,
    merge_attn_states,
)
from mini_vllm.models.runner import Chunk, make_model_input
from mini_vllm.sampling_params import SamplingParams

NUMPY_BACKENDS = ["NUMPY_GATHER", "NUMPY_FLASH", "NUMPY_SPLIT_KV"]


# ------------------------------------------------------------------ the selector
def test_auto_keeps_each_platforms_old_kernel():
    assert get_attn_backend(16, "float32", 4) is NumpyGatherBackend
    assert get_attn_backend(64, "float32", 16, "auto") is NumpyGatherBackend
    assert get_attn_backend(64, "float32", 16, "AUTO", platform="torch").name == "TORCH_GATHER"
    assert [m.name for m in PRIORITIES["numpy"]] == NUMPY_BACKENDS


def test_explicit_names_are_case_insensitive_and_classes_are_accepted():
    assert get_attn_backend(16, "float32", 4, "numpy_flash") is NumpyFlashBackend
    assert get_attn_backend(16, "float32", 4, NumpySplitKVBackend) is NumpySplitKVBackend
    assert AttentionBackendEnum.from_name("Numpy_Split_KV").get_class() is NumpySplitKVBackend


def test_an_unknown_name_lists_every_valid_one():
    with pytest.raises(ValueError, match="Unknown attention backend: 'FLASH_ATTN'") as err:
        get_attn_backend(16, "float32", 4, "FLASH_ATTN")
    for name in ["auto", *AttentionBackendEnum.__members__]:
        assert name in str(err.value)


class Only64(AttentionBackend):
    name = "ONLY_64"

    @classmethod
    def supports_head_size(cls, head_size):
        return head_size == 64

    @classmethod
    def supports_block_size(cls, block_size):
        return block_size % 16 == 0


def test_an_invalid_explicit_choice_raises_with_every_reason_and_never_falls_back():
    with pytest.raises(ValueError) as err:
        get_attn_backend(16, "float16", 4, Only64)
    msg = str(err.value)
    assert msg.startswith("Selected backend ONLY_64 is not valid for this configuration")
    # upstream's strings, in upstream's order (vllm/v1/attention/backend.py:289-295)
    assert "Reason: ['head_size not supported', 'dtype not supported', 'block_size not supported']" in msg
    with pytest.raises(ValueError, match=r"Reason: \['platform numpy not supported'\]"):
        get_attn_backend(16, "float32", 4, "TORCH_SDPA")
    assert get_attn_backend(64, "float32", 32, Only64) is Only64


def test_auto_with_no_valid_backend_reports_each_candidates_reasons(monkeypatch):
    monkeypatch.setitem(PRIORITIES, "numpy", (AttentionBackendEnum.NUMPY_FLASH,))
    monkeypatch.setattr(NumpyFlashBackend, "supported_dtypes", ("float64",))
    with pytest.raises(ValueError, match=r"No valid attention backend found .*"
                                         r"NUMPY_FLASH: \['dtype not supported'\]"):
        get_attn_backend(16, "float32", 4)


def test_auto_takes_the_first_valid_backend_in_priority_order(monkeypatch):
    monkeypatch.setattr(NumpyGatherBackend, "supported_dtypes", ("float64",))
    assert get_attn_backend(16, "float32", 4) is NumpyFlashBackend


@pytest.mark.parametrize("bad, match", [(42, "attention_backend must be"), (int, "attention_backend must be"),
                                        ("", "Unknown attention backend")])
def test_bad_backend_arguments_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        get_attn_backend(16, "float32", 4, bad)
    with pytest.raises(ValueError, match="platform must be one of numpy, torch, cuda"):
        get_attn_backend(16, "float32", 4, platform="tpu")


# ------------------------------------------------------------------ the kernels
def poisoned_batch(rng, block_size=4, heads=4, kv_heads=2, dim=8, poison=np.nan):
    """A prefill chunk mid-sequence, a whole prompt and two decodes; every unwritten slot poisoned."""
    chunks = [Chunk(list(range(6)), 5, [7, 2, 9]),           # positions 5..10 of 11
              Chunk(list(range(9)), 0, [4, 11, 1]),          # a 9-token prompt, partial last block
              Chunk([1], 12, [3, 8, 5, 12]),                 # a decode at position 12
              Chunk([1], 3, [6])]                            # a decode filling its only block
    mi = make_model_input(chunks, block_size)
    shape = (13, block_size, kv_heads, dim)
    k_cache, v_cache = np.full(shape, poison, np.float32), np.full(shape, poison, np.float32)
    for c in chunks:  # the context before each chunk, then the chunk's own rows (as the model does)
        slots = [c.block_table[p // block_size] * block_size + p % block_size for p in range(c.start)]
        kv = rng.standard_normal((2, len(slots), kv_heads, dim)).astype(np.float32)
        write_kv(k_cache, v_cache, kv[0], kv[1], np.asarray(slots, dtype=np.int64))
    kv = rng.standard_normal((2, mi.num_tokens, kv_heads, dim)).astype(np.float32)
    write_kv(k_cache, v_cache, kv[0], kv[1], mi.slot_mapping)
    q = rng.standard_normal((mi.num_tokens, heads, dim)).astype(np.float32)
    return q, k_cache, v_cache, mi


@pytest.mark.parametrize("poison", [np.nan, 1e30])
@pytest.mark.parametrize("name", NUMPY_BACKENDS[1:])
def test_every_numpy_backend_equals_the_gather_kernel(name, poison):
    q, k_cache, v_cache, mi = poisoned_batch(np.random.default_rng(0), poison=poison)
    expected = paged_attention(q, k_cache, v_cache, mi, 0.4)
    got = AttentionBackendEnum[name].get_class()().forward(q, k_cache, v_cache, mi, 0.4)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("partition_blocks", [1, 2, 3, 5])
def test_split_kv_is_exact_for_any_partition_size(monkeypatch, partition_blocks):
    monkeypatch.setattr(NumpySplitKVBackend, "partition_blocks", partition_blocks)
    q, k_cache, v_cache, mi = poisoned_batch(np.random.default_rng(1))
    expected = paged_attention(q, k_cache, v_cache, mi, 0.4)
    got = NumpySplitKVBackend().forward(q, k_cache, v_cache, mi, 0.4)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)


def test_the_merge_keeps_empty_rows_finite_and_equals_one_softmax():
    rng = np.random.default_rng(2)
    scores = rng.standard_normal((1, 1, 3, 10)).astype(np.float32) * 30
    scores[0, 0, 0, :6] = -np.inf  # row 0 sees nothing in the first part
    v = rng.standard_normal((1, 1, 10, 4)).astype(np.float32)
    a_out, a_lse = attend_partial(scores[..., :6], v[:, :, :6])
    b_out, b_lse = attend_partial(scores[..., 6:], v[:, :, 6:])
    assert a_lse[0, 0, 0] == -np.inf and not a_out[0, 0, 0].any()
    out, lse = merge_attn_states(a_out, a_lse, b_out, b_lse)
    whole, whole_lse = attend_partial(scores, v)
    np.testing.assert_allclose(out, whole, atol=1e-5)
    np.testing.assert_allclose(lse, whole_lse, rtol=1e-6)
    empty = np.full_like(a_lse, -np.inf)
    out, lse = merge_attn_states(np.zeros_like(a_out), empty, np.zeros_like(a_out), empty)
    assert np.isneginf(lse).all() and not out.any() and not np.isnan(out).any()


def test_rows_read_are_counted_exactly():
    q, k_cache, v_cache, mi = poisoned_batch(np.random.default_rng(3))
    # seq_lens 11, 9, 13, 4 at block_size 4 -> 3, 3, 4, 1 whole blocks
    assert mi.seq_lens.tolist() == [11, 9, 13, 4]
    for cls in (NumpyFlashBackend, NumpySplitKVBackend):
        backend = cls()
        backend.forward(q, k_cache, v_cache, mi, 0.4)
        assert backend.kv_rows_read == (3 + 3 + 4 + 1) * 4 == 44
    gather = NumpyGatherBackend()
    gather.forward(q, k_cache, v_cache, mi, 0.4)
    # groups by query count: {6 rows: 11}, {9 rows: 9}, {1 row: 13 and 4, padded to 13 -> 4 blocks}
    assert gather.kv_rows_read == 12 + 12 + 2 * 16 == 56
    gather.forward(q, k_cache, v_cache, mi, 0.4)
    assert gather.kv_rows_read == 112  # a counter: the engine resets it per step


# ------------------------------------------------------------------ in the engine
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SHARED = list(range(40, 61))
PROMPTS = [{"prompt_token_ids": SHARED + [1, 2, 3]}, {"prompt_token_ids": [200]},
           {"prompt_token_ids": SHARED + [9]}, {"prompt_token_ids": list(range(100, 137))},
           {"prompt_token_ids": SHARED}, {"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11, 12]},
           {"prompt_token_ids": list(range(70, 83))}, {"prompt_token_ids": SHARED + [250, 251]}]


def run(backend="auto", prompts=PROMPTS, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 128)
    engine = LLMEngine("tiny-random", attention_backend=backend, **kw)
    return [list(r.output_token_ids) for r in engine.generate(prompts, GREEDY)], engine


@pytest.fixture(scope="module")
def reference():
    """The default kernel, every prompt alone, whole prompts, no caching."""
    return [run("NUMPY_GATHER", [p], enable_caching=False)[0][0] for p in PROMPTS]


@pytest.mark.parametrize("name", NUMPY_BACKENDS)
def test_chunked_prefill_prefix_caching_and_preemption_never_change_any_backends_tokens(reference, name):
    tokens, engine = run(name, max_num_batched_tokens=7)  # chunks of at most 7 tokens
    assert tokens == reference
    assert engine.attention_backend.name == name
    assert engine.model.attn_backend.name == name
    # a second wave of the same prompts hits the prefix cache
    second = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    assert second == reference and sum(s.num_cached_tokens for s in engine.stats) >= 80
    tokens, engine = run(name, num_blocks=13)  # 12 usable blocks: preemption by recompute
    assert tokens == reference and sum(len(s.preempted) for s in engine.stats) >= 1


def _step_logits(backend):
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, attention_backend=backend,
                       max_num_batched_tokens=9)
    logits, execute = [], engine.model.execute
    engine.model.execute = lambda mi: logits.append(execute(mi)) or logits[-1]
    engine.generate(PROMPTS[:5], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    return logits, engine


def test_step_logits_agree_between_backends_to_1e_5():
    base, _ = _step_logits("NUMPY_GATHER")
    for name in NUMPY_BACKENDS[1:]:
        logits, _ = _step_logits(name)
        assert len(logits) == len(base)
        for a, b in zip(logits, base, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_step_stats_report_each_steps_reads_exactly():
    """Every step's counter, recomputed by hand from the step's own seq_lens (chunked prefills too)."""
    reads, steps = {}, {}
    for name in ("NUMPY_FLASH", "NUMPY_GATHER"):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, attention_backend=name,
                           max_num_batched_tokens=9)
        inputs, execute = [], engine.model.execute
        engine.model.execute = lambda mi, inputs=inputs, execute=execute: inputs.append(mi) or execute(mi)
        engine.generate(PROMPTS[:5], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        assert len(inputs) == len(engine.stats)
        reads[name], steps[name] = [s.kv_rows_read for s in engine.stats], inputs
    layers = 2  # tiny-random
    # block-at-a-time: ceil(seq_len / 4) whole blocks of 4 per request, in each layer
    assert reads["NUMPY_FLASH"] == [layers * sum(-(-int(n) // 4) * 4 for n in mi.seq_lens)
                                    for mi in steps["NUMPY_FLASH"]]
    # the gather pads each group to its longest request, so it never reads fewer rows
    assert all(f <= g for f, g in zip(reads["NUMPY_FLASH"], reads["NUMPY_GATHER"], strict=True))
    assert sum(reads["NUMPY_FLASH"]) < sum(reads["NUMPY_GATHER"])


def test_a_decode_steps_reads_are_block_granular():
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=64, attention_backend="NUMPY_FLASH")
    engine.generate([{"prompt_token_ids": list(range(1, 11))}, {"prompt_token_ids": [3, 4, 5]}],
                    SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    decode = engine.stats[1]  # seq_lens 11 and 4 -> 3 + 1 blocks of 4, in each of 2 layers
    assert decode.num_prefill_tokens == 0
    assert decode.kv_rows_read == (3 + 1) * 4 * 2


def test_models_without_attention_take_only_auto():
    engine = LLMEngine("toy")
    assert engine.attention_backend is None
    engine.generate("hi", SamplingParams(max_tokens=2))
    assert all(s.kv_rows_read == 0 for s in engine.stats)
    with pytest.raises(ValueError, match="attention_backend must be 'auto' for a model without"):
        LLMEngine("toy", attention_backend="NUMPY_FLASH")


def test_the_engine_refuses_an_explicit_backend_that_cannot_serve_the_model():
    # tiny-random's head size is 16
    with pytest.raises(ValueError, match=r"Selected backend ONLY_64 .* Reason: \['head_size not supported', "
                                         r"'block_size not supported'\]"):
        LLMEngine("tiny-random", block_size=4, attention_backend=Only64)
    with pytest.raises(ValueError, match="Unknown attention backend: 'SDPA'"):
        LLMEngine("tiny-random", attention_backend="SDPA")


def test_torch_sdpa_equals_the_torch_gather_kernel(one_torch_thread):
    pytest.importorskip("torch")
    logits = {}
    for name in ("TORCH_GATHER", "TORCH_SDPA"):
        engine = LLMEngine("tiny-random", model_backend="torch", block_size=4, num_blocks=64,
                           max_num_batched_tokens=7, attention_backend=name)
        out, execute = [], engine.model.execute
        engine.model.execute = lambda mi, out=out, execute=execute: out.append(execute(mi)) or out[-1]
        reqs = engine.generate(PROMPTS[:4], GREEDY)
        logits[name] = (out, [list(r.output_token_ids) for r in reqs], engine)
    (a, tok_a, eng_a), (b, tok_b, eng_b) = logits["TORCH_GATHER"], logits["TORCH_SDPA"]
    assert tok_a == tok_b
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)
    assert [s.kv_rows_read for s in eng_a.stats] == [s.kv_rows_read for s in eng_b.stats]
    # prefix-cache hits (a second wave) and preemption (a 13-block pool) under SDPA
    again = [list(r.output_token_ids) for r in eng_b.generate(PROMPTS[:4], GREEDY)]
    assert again == tok_a and sum(s.num_cached_tokens for s in eng_b.stats) >= 40
    small = LLMEngine("tiny-random", model_backend="torch", block_size=4, num_blocks=13,
                      attention_backend="TORCH_SDPA")
    assert [list(r.output_token_ids) for r in small.generate(PROMPTS[:4], GREEDY)] == tok_a
    assert sum(len(s.preempted) for s in small.stats) >= 1
    with pytest.raises(ValueError, match=r"platform torch not supported"):
        LLMEngine("tiny-random", model_backend="torch", attention_backend="NUMPY_FLASH")


def test_the_cli_names_the_valid_backends(capsys):
    from mini_vllm.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hi", "--model", "tiny-random", "--attention-backend", "NO_SUCH"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Unknown attention backend: 'NO_SUCH'" in err and "NUMPY_SPLIT_KV" in err
    assert main(["generate", "hi", "--model", "tiny-random", "--attention-backend", "numpy_flash",
                 "--max-tokens", "2", "--quiet"]) == 0


# ------------------------------------------------------------------ on the real model
@pytest.mark.model
@pytest.mark.parametrize("name", ["NUMPY_FLASH", "NUMPY_SPLIT_KV", "TORCH_SDPA"])
def test_smollm2_golden_tokens_under_every_backend(name):
    """The golden greedy tokens (transformers), through chunks, a shared prefix block and a preemption."""
    import json
    import pathlib

    threadpoolctl = pytest.importorskip("threadpoolctl")
    golden = json.loads((pathlib.Path(__file__).parent / "golden" / "smollm2.json").read_text())
    n = 6
    torch_path = name.startswith("TORCH")
    if torch_path:
        torch = pytest.importorskip("torch")
        threads, _ = torch.get_num_threads(), torch.set_num_threads(1)
    with threadpoolctl.threadpool_limits(1, "blas"):
        engine = LLMEngine("smollm2", block_size=16, num_blocks=7, max_num_batched_tokens=24,
                           attention_backend=name, model_backend="torch" if torch_path else "numpy")
        reqs = engine.generate([{"prompt_token_ids": c["prompt_ids"]} for c in golden["chat"]],
                               SamplingParams(temperature=0, max_tokens=n))
    if torch_path:
        torch.set_num_threads(threads)
    assert [list(r.output_token_ids) for r in reqs] == [c["greedy_ids"][:n] for c in golden["chat"]]
    assert sum(len(s.preempted) for s in engine.stats) >= 1
    assert sum(s.num_cached_tokens for s in engine.stats) >= 16


# ------------------------------------------------------------------ common prefix blocks
def test_common_prefix_blocks_count_what_every_holder_shares():
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=64)
    shared = list(range(1, 14))  # 13 tokens: 3 full blocks, shareable through the prefix cache
    engine.add_request({"prompt_token_ids": shared + [20]}, GREEDY)
    engine.step()  # the first request's full blocks are cached now
    for tail in ([21, 22], [23]):
        engine.add_request({"prompt_token_ids": shared + tail}, GREEDY)
    engine.step()
    kv = engine.kv_cache_manager
    assert [kv.get_num_common_prefix_blocks(r) for r in ("req-0", "req-1", "req-2")] == [3, 3, 3]
    # a fourth holder that shares nothing: no block is common to all any more
    engine.add_request({"prompt_token_ids": [99, 98, 97]}, GREEDY)
    engine.step()
    assert kv.get_num_common_prefix_blocks("req-1") == 0
    engine.abort_request("req-3")
    assert kv.get_num_common_prefix_blocks("req-1") == 3
    with pytest.raises(ValueError, match="request_id 'nope' holds no KV blocks"):
        kv.get_num_common_prefix_blocks("nope")


# ------------------------------------------------------------------ Triton decode (torch path)
def test_triton_decode_declares_its_limits_and_its_import():
    from mini_vllm.models import triton_attention

    cls = AttentionBackendEnum.TRITON_DECODE.get_class()
    assert cls is triton_attention.TritonDecodeBackend and cls.platforms == ("cuda",)
    if triton_attention.triton is None:
        # upstream's reason when a backend's module cannot be imported
        assert cls.validate_configuration(64, "float32", 16, "cuda") == ["ImportError"]
        with pytest.raises(ValueError, match=r"Selected backend TRITON_DECODE .* Reason: \['ImportError'\]"):
            get_attn_backend(64, "float32", 16, "TRITON_DECODE", platform="cuda")
    else:
        assert cls.validate_configuration(64, "float32", 16, "cuda") == []
        assert cls.validate_configuration(48, "float32", 12, "torch") == [
            "head_size not supported", "block_size not supported", "platform torch not supported"]
    assert get_attn_backend(64, "float32", 16, platform="torch").name == "TORCH_GATHER"
    assert get_attn_backend(64, "float32", 16, platform="cuda").name == "TORCH_GATHER"


@pytest.mark.gpu
def test_triton_decode_equals_the_gather_kernel_on_a_gpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from mini_vllm.models import get_model

    results = {}
    for name in ("TORCH_GATHER", "TORCH_SDPA", "TRITON_DECODE"):
        model = get_model("tiny-random", backend="torch", device="cuda")
        engine = LLMEngine(model, block_size=4, num_blocks=128, max_num_batched_tokens=7,
                           attention_backend=name)
        logits, execute = [], engine.model.execute
        engine.model.execute = lambda mi, out=logits, execute=execute: out.append(execute(mi)) or out[-1]
        reqs = engine.generate(PROMPTS, GREEDY)
        results[name] = ([list(r.output_token_ids) for r in reqs], logits, engine)
    base_tokens, base_logits, _ = results["TORCH_GATHER"]
    for name in ("TORCH_SDPA", "TRITON_DECODE"):
        tokens, logits, engine = results[name]
        assert tokens == base_tokens, name
        for a, b in zip(logits, base_logits, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    # decode steps read whole blocks only: never more than the padded gather
    gather_stats, triton_stats = results["TORCH_GATHER"][2].stats, results["TRITON_DECODE"][2].stats
    assert sum(s.kv_rows_read for s in triton_stats) <= sum(s.kv_rows_read for s in gather_stats)
