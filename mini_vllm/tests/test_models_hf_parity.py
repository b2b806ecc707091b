"""mini_vllm's numpy transformer against Hugging Face transformers, token for token.

Each case builds a random Llama or Qwen2 with transformers (GQA at several
head ratios, tied and untied embeddings, biases, odd sizes, an explicit
head_dim, Llama 3 RoPE scaling), saves it as safetensors, loads it with
mini_vllm's loader, and checks:

- greedy tokens: prompts of different lengths run *batched together* through
  the paged model equal ``model.generate(do_sample=False)`` run on each prompt
  alone (no padding, so the reference is exact);
- last-position logits agree within ATOL = 1e-4, absolute (float32 both sides;
  the largest gap measured on these cases was 7.6e-6, on logits up to 24 in size).

Weights are re-drawn with unit-scale statistics (norm weights near 1, biases
non-zero) so logits are spread out: transformers' default init (std 0.02)
gives near-ties that a 1e-7 rounding difference could flip.
"""
from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.models.runner import greedy_generate  # noqa: E402

ATOL, RTOL = 1e-4, 0.0
NEW_TOKENS = 10
PROMPT_LENS = (1, 6, 17, 33)

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}

CASES = {
    # GQA 4:2, head_dim 16 although hidden/heads = 12, untied, a small rope_theta.
    "llama-gqa2-headdim": ("llama", dict(vocab_size=101, hidden_size=48, intermediate_size=77,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=16, rope_theta=500.0)),
    # MHA 4:4, biases everywhere Llama allows them, tied embeddings.
    "llama-mha-bias-tied": ("llama", dict(vocab_size=97, hidden_size=32, intermediate_size=64,
                                          num_attention_heads=4, num_key_value_heads=4,
                                          attention_bias=True, mlp_bias=True,
                                          tie_word_embeddings=True)),
    # MQA 8:1 with Llama 3.1's frequency-dependent RoPE scaling.
    "llama-mqa-llama3rope": ("llama", dict(vocab_size=113, hidden_size=64,
                                           intermediate_size=96, num_attention_heads=8,
                                           num_key_value_heads=1,
                                           rope_parameters=LLAMA3_ROPE)),
    # Qwen2: q/k/v bias, GQA 6:1, tied, odd sizes (head_dim 6).
    "qwen2-gqa6-tied-odd": ("qwen2", dict(vocab_size=131, hidden_size=36, intermediate_size=50,
                                          num_attention_heads=6, num_key_value_heads=1,
                                          tie_word_embeddings=True)),
    # Qwen2 untied, GQA 4:2, Qwen's large rope_theta.
    "qwen2-gqa2-untied": ("qwen2", dict(vocab_size=151, hidden_size=64, intermediate_size=128,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        rope_theta=1e6)),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build_hf_model(family: str, seed: int = 0, **kw):
    """A random-init transformers model, float32, eager attention, unit-scale weights."""
    cls, cfg_cls = {
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
        "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
    }[family]
    kw.setdefault("num_hidden_layers", 2)
    kw.setdefault("eos_token_id", kw["vocab_size"] - 1)
    cfg = cfg_cls(attn_implementation="eager", **kw)
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1 + 0.1 * noise)
            elif p.ndim == 1:  # biases
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
    return model


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens, EOS allowed but never stopping (like ignore_eos=True).

    min_new_tokens would be wrong here: it forbids EOS, changing the argmax.
    """
    model.generation_config.eos_token_id = None
    ids = torch.tensor([prompt])
    with torch.no_grad():
        last_logits = model(ids).logits[0, -1].numpy()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist(), last_logits


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_and_logits_match_transformers(case, tmp_path):
    family, kw = CASES[case]
    hf = build_hf_model(family, **kw)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = get_model(str(tmp_path))
    assert ours.config.architecture == family
    assert ours.eos_token_id == kw["vocab_size"] - 1

    rng = np.random.default_rng(len(case))
    prompts = [rng.integers(0, kw["vocab_size"] - 1, n).tolist() for n in PROMPT_LENS]
    tokens, first_logits = greedy_generate(ours, prompts, NEW_TOKENS, block_size=4,
                                           return_logits=True)
    for prompt, got, logits in zip(prompts, tokens, first_logits, strict=True):
        want, want_logits = hf_greedy(hf, prompt, NEW_TOKENS)
        np.testing.assert_allclose(logits, want_logits, atol=ATOL, rtol=RTOL,
                                   err_msg=f"{case}: prompt of {len(prompt)} tokens")
        assert got == want, f"{case}: prompt of {len(prompt)} tokens"


def test_parity_holds_with_chunked_prefill_and_block_size_1(tmp_path):
    family, kw = CASES["qwen2-gqa2-untied"]
    hf = build_hf_model(family, seed=1, **kw)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = get_model(str(tmp_path))
    prompts = [[5, 6, 7, 8, 9, 10, 11], [100, 3, 3, 3]]
    got = greedy_generate(ours, prompts, 6, block_size=1, chunk_size=3, seed=5)
    assert got == [hf_greedy(hf, p, 6)[0] for p in prompts]


def test_sharded_checkpoint_loads_the_same_model(tmp_path):
    family, kw = CASES["llama-gqa2-headdim"]
    hf = build_hf_model(family, **kw)
    hf.save_pretrained(tmp_path / "one", safe_serialization=True)
    hf.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="20KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a, b = get_model(str(tmp_path / "one")), get_model(str(tmp_path / "sharded"))
    np.testing.assert_array_equal(a.weights.layers[1].qkv_proj, b.weights.layers[1].qkv_proj)
    np.testing.assert_array_equal(a.weights.lm_head, b.weights.lm_head)


def test_bfloat16_checkpoint_loads_as_its_float32_values(tmp_path):
    family, kw = CASES["qwen2-gqa6-tied-odd"]
    hf = build_hf_model(family, **kw).to(torch.bfloat16)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = get_model(str(tmp_path))
    want = hf.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T
    np.testing.assert_array_equal(ours.weights.layers[0].qkv_proj[:, :want.shape[1]], want)


def test_llm_engine_on_a_checkpoint_folder_matches_transformers(tmp_path):
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    family, kw = CASES["llama-gqa2-headdim"]
    hf = build_hf_model(family, seed=2, **kw)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    engine = LLMEngine(model=str(tmp_path), block_size=4, num_blocks=64,
                       max_num_batched_tokens=5)
    assert engine.model.eos_token_id == kw["vocab_size"] - 1
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [50], [60, 61, 62, 63]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    reqs = engine.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [list(r.output_token_ids) for r in reqs] == [hf_greedy(hf, p, 8)[0] for p in prompts]


def test_llm_engine_stops_at_eos_exactly_where_transformers_does(tmp_path):
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    family, kw = CASES["qwen2-gqa2-untied"]
    hf = build_hf_model(family, seed=3, **kw)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    free_run, _ = hf_greedy(hf, prompt, 12)
    eos = free_run[4]  # make a token the model really emits the EOS
    stop_at = free_run.index(eos)
    hf.config.eos_token_id = hf.generation_config.eos_token_id = eos
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                           do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    assert want == free_run[:stop_at + 1]  # transformers keeps the EOS token and stops
    engine = LLMEngine(model=str(tmp_path), block_size=4, num_blocks=32)
    (req,) = engine.generate([{"prompt_token_ids": prompt}],
                             SamplingParams(temperature=0.0, max_tokens=12))
    assert list(req.output_token_ids) == want and req.finish_reason == "stop"
