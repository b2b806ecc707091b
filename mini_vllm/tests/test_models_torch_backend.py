"""The torch backend is the numpy model again, only in torch: same logits, same tokens.

numpy (``llama.py``) is the reference. On a mixed batch (prefill chunks that
start mid-sequence, decodes, shuffled block tables, shuffled batch order) the
torch model's logits and KV cache match numpy's within TOL; through the
engine, with chunked prefill and prefix caching on, greedy output is identical
token for token. Unwritten slots full of NaN or 1e30 never reach the output,
and a NaN in a slot that *is* read does, so the comparison has teeth.
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mini_vllm.__main__ import main  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import (  # noqa: E402
    LlamaForCausalLM,
    get_model,
    random_weights,
    tiny_random_config,
)
from mini_vllm.models.runner import Chunk, make_model_input  # noqa: E402
from mini_vllm.models.torch_backend import TorchLlamaForCausalLM  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

TOL = 1e-4  # float32 both sides; measured max |diff| here: 1.8e-6 tiny-random, 1.5e-5 biased
#            (whose tied-embedding logits reach 58, so that is 3e-7 relative)
CUDA_TOL = 1e-3  # cuBLAS may sum in another order; not measured here (no GPU)
BLOCK, NUM_BLOCKS = 4, 32
# Tokens each request schedules per step (one column per request): step 1 is
# prefill chunks (two of the same length, so they share one attention group),
# step 2 finishes request 0's prompt while the others decode, step 3 all decode.
PLAN = [[5, 5, 9, 1], [8, 1, 1, 1], [1, 1, 1, 1]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SHARED = list(range(40, 61))  # a 21-token prefix: 5 full blocks to hit in the cache
PROMPTS = [{"prompt_token_ids": SHARED + [1, 2, 3]}, {"prompt_token_ids": [200]},
           {"prompt_token_ids": list(range(100, 131))}, {"prompt_token_ids": SHARED}]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _biased_model() -> LlamaForCausalLM:
    """Every optional path: q/k/v, o and MLP biases, tied embeddings, 4 heads per kv head."""
    config = dataclasses.replace(tiny_random_config(), num_key_value_heads=1, qkv_bias=True,
                                 o_bias=True, mlp_bias=True, tie_word_embeddings=True)
    return LlamaForCausalLM(config, random_weights(config, seed=1), name="biased")


def mixed_batch_steps(seed: int = 0):
    """ModelInputs for PLAN: random tokens, shuffled block tables and batch order."""
    rng = np.random.default_rng(seed)
    free = rng.permutation(np.arange(1, NUM_BLOCKS)).tolist()  # block 0 stays null
    totals = [sum(col) for col in zip(*PLAN, strict=True)]
    seqs = [rng.integers(0, 256, n).tolist() for n in totals]
    tables = [[free.pop() for _ in range(-(-n // BLOCK))] for n in totals]
    done = [0] * len(seqs)
    for step in PLAN:
        chunks = []
        for i, n in enumerate(step):
            chunks.append(Chunk(seqs[i][done[i]:done[i] + n], done[i], tables[i]))
            done[i] += n
        yield make_model_input([chunks[j] for j in rng.permutation(len(chunks))], BLOCK)


def run_both(reference: LlamaForCausalLM, device: str = "cpu", poison: float | None = None):
    """Logits of every step from numpy and from torch; torch's cache prefilled with ``poison``."""
    twin = TorchLlamaForCausalLM.from_numpy(reference, device)
    reference.init_kv_cache(NUM_BLOCKS, BLOCK)
    twin.init_kv_cache(NUM_BLOCKS, BLOCK)
    if poison is not None:
        twin.kv_cache.fill_(poison)
    pairs = [(reference.execute(mi), twin.execute(mi)) for mi in mixed_batch_steps()]
    return pairs, twin


def greedy_tokens(model, **engine_kw) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine(model, block_size=BLOCK, num_blocks=128, max_num_batched_tokens=5,
                       enable_caching=True, **engine_kw)
    first = engine.generate(PROMPTS, GREEDY)
    second = engine.generate(PROMPTS, GREEDY)  # the same prompts again: prefix-cache hits
    return [list(r.output_token_ids) for r in first + second], engine


@pytest.mark.parametrize("make", [lambda: get_model("tiny-random"), _biased_model],
                         ids=["tiny-random", "biased-tied-gqa4"])
def test_mixed_batch_logits_and_kv_cache_match_numpy(make):
    reference = make()
    pairs, twin = run_both(reference)
    for want, got in pairs:
        assert got.dtype == np.float32 and got.shape == want.shape == (4, 257)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    np.testing.assert_allclose(twin.kv_cache.numpy(), reference.kv_cache, rtol=0, atol=TOL)
    assert twin.kv_cache.device.type == "cpu" and twin.kv_cache_bytes == reference.kv_cache.nbytes


def test_greedy_engine_output_is_token_for_token_numpys():
    want, _ = greedy_tokens("tiny-random")
    got, engine = greedy_tokens("tiny-random", model_backend="torch")
    assert isinstance(engine.model, TorchLlamaForCausalLM)
    assert got == want
    assert max(sum(s.num_scheduled_tokens.values()) for s in engine.stats) <= 5  # chunked
    assert sum(s.num_cached_tokens for s in engine.stats) >= 2 * 20  # cache hits happened


@pytest.mark.parametrize("poison", [np.nan, 1e30])
def test_poisoned_unused_slots_never_reach_the_output(poison):
    clean, _ = run_both(get_model("tiny-random"))
    dirty, twin = run_both(get_model("tiny-random"), poison=poison)
    for (_, want), (_, got) in zip(clean, dirty, strict=True):
        np.testing.assert_array_equal(got, want)
    # Teeth: poison a slot a request really reads, and the logits do change.
    mi = next(mixed_batch_steps())
    twin.kv_cache[:, :, mi.block_tables[0, 0]] = float("nan")
    mi.slot_mapping[:] = 0  # write this step's K/V to the null block, not over the poison
    assert np.isnan(twin.execute(mi)).any()


def test_bad_backend_and_device_are_value_errors_naming_them(monkeypatch):
    with pytest.raises(ValueError, match=r"^backend must be one of numpy, torch, got 'jax'"):
        get_model("tiny-random", backend="jax")
    with pytest.raises(ValueError, match=r"^device must be one of cpu, cuda, got 'tpu'"):
        get_model("tiny-random", backend="torch", device="tpu")
    with pytest.raises(ValueError, match=r"^device must be 'cpu' for backend 'numpy'"):
        get_model("tiny-random", device="cuda")
    with pytest.raises(ValueError, match=r"^device must be one of cpu, cuda"):
        TorchLlamaForCausalLM.from_numpy(get_model("tiny-random"), device="gpu")
    with pytest.raises(ValueError, match="'toy' model exists only in numpy"):
        get_model("toy", backend="torch")
    with pytest.raises(ValueError, match=r"^model_backend must be one of numpy, torch"):
        LLMEngine("tiny-random", model_backend="cuda")
    with pytest.raises(ValueError, match=r"^model_backend 'torch' applies to a transformer"):
        LLMEngine("toy", model_backend="torch")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            get_model("tiny-random", backend="torch", device="cuda")
    twin = get_model("tiny-random", backend="torch")
    with pytest.raises(RuntimeError, match="init_kv_cache"):
        twin.execute(make_model_input([Chunk([1], 0, [1])], BLOCK))
    with pytest.raises(ValueError, match=r"^num_blocks must be an integer >= 1"):
        twin.init_kv_cache(0, BLOCK)
    twin.init_kv_cache(4, 8)
    with pytest.raises(ValueError, match="block_size"):
        twin.execute(make_model_input([Chunk([1], 0, [1])], BLOCK))
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(ImportError, match=r"^backend 'torch' needs PyTorch.*\(pip install torch\)$"):
        get_model("tiny-random", backend="torch")


def test_cli_backend_flag_gives_numpys_completion(capsys):
    args = ["generate", "hello", "--max-tokens", "4", "--block-size", "4", "--quiet"]
    assert main(args) == 0
    want = capsys.readouterr().out
    assert main([*args, "--backend", "torch"]) == 0
    assert capsys.readouterr().out == want and "completion (4 tokens" in want
    with pytest.raises(SystemExit) as exc:
        main([*args, "--backend", "jax"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--backend" in err and len(err.strip().splitlines()) == 1


@pytest.mark.gpu
def test_cuda_logits_and_greedy_output_match_numpy():
    reference = get_model("tiny-random")
    pairs, twin = run_both(reference, device="cuda")
    assert twin.kv_cache.device.type == "cuda"
    for want, got in pairs:
        np.testing.assert_allclose(got, want, rtol=0, atol=CUDA_TOL)
    want, _ = greedy_tokens("tiny-random")
    got, _ = greedy_tokens(get_model("tiny-random", backend="torch", device="cuda"))
    assert got == want
