"""The MoE primitives (mini_vllm/models/moe.py): routing, alignment, grouped experts.

Checked three ways: exact small cases worked by hand (upstream's docstring example
among them), a per-token dense reference on random problems, and transformers'
own ``MixtralSparseMoeBlock`` on random weights.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.models.moe import (
    FusedMoE,
    expert_mlp,
    fused_experts,
    fused_topk,
    moe_align_block_size,
)


def reference_moe(x, w13, w2, topk_weights, topk_ids):
    """Token by token, choice by choice, in float64."""
    out = np.zeros(x.shape, dtype=np.float64)
    for t in range(x.shape[0]):
        for j, e in enumerate(topk_ids[t]):
            y = expert_mlp(x[t:t + 1].astype(np.float64), w13[e].astype(np.float64),
                           w2[e].astype(np.float64))
            out[t] += topk_weights[t, j] * y[0]
    return out


def random_problem(num_tokens=13, hidden=16, inter=24, num_experts=6, top_k=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_tokens, hidden)).astype(np.float32)
    router = (rng.standard_normal((hidden, num_experts)) / 4).astype(np.float32)
    w13 = (rng.standard_normal((num_experts, 2 * inter, hidden)) / 4).astype(np.float32)
    w2 = (rng.standard_normal((num_experts, hidden, inter)) / 5).astype(np.float32)
    return x, router, w13, w2


def test_align_reproduces_upstreams_docstring_example():
    # upstream's example: 4 tokens, top-3, block 4. Expert ids run 1..4, so it needs
    # num_experts=5 (expert 0 has no slot and gets no block).
    topk_ids = np.array([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]])
    sorted_ids, expert_ids, padded = moe_align_block_size(topk_ids, 4, 5)
    pad = 12  # topk_ids.size: a slot id that does not exist
    assert sorted_ids.reshape(4, 4).tolist() == [[3, 6, 9, pad], [0, 4, 10, pad],
                                                 [1, 7, 11, pad], [2, 5, 8, pad]]
    assert expert_ids.tolist() == [1, 2, 3, 4] and padded == 16


def test_align_pads_each_expert_to_whole_blocks():
    topk_ids = np.array([[0, 1], [0, 2], [0, 1], [0, 3], [0, 1]])
    sorted_ids, expert_ids, padded = moe_align_block_size(topk_ids, 2, 5)
    # expert 0: slots 0, 2, 4, 6, 8 (3 blocks); 1: 1, 5, 9 (2); 2: 3 (1); 3: 7 (1); 4: none
    assert expert_ids.tolist() == [0, 0, 0, 1, 1, 2, 3]
    assert sorted_ids.tolist() == [0, 2, 4, 6, 8, 10, 1, 5, 9, 10, 3, 10, 7, 10]
    assert padded == 14
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 3\) \(num_experts\), got \[0, 3\]"):
        moe_align_block_size(topk_ids, 2, 3)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        moe_align_block_size(topk_ids, 0, 5)


def test_topk_renormalizes_and_breaks_ties_to_the_lower_id():
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]], np.float32))
    w, ids = fused_topk(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 3], [0, 1]]
    np.testing.assert_allclose(w, [[4 / 7, 3 / 7], [0.5, 0.5]], rtol=1e-6)
    w, ids = fused_topk(logits, 2, renormalize=False)
    np.testing.assert_allclose(w, [[0.4, 0.3], [0.25, 0.25]], rtol=1e-6)
    with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 4\], got 5"):
        fused_topk(logits, 5)


@pytest.mark.parametrize("top_k,block_size,num_experts", [(1, 4, 4), (2, 16, 6), (3, 3, 5), (2, 1, 8)])
def test_grouped_experts_equal_the_per_token_reference(top_k, block_size, num_experts):
    x, router, w13, w2 = random_problem(num_experts=num_experts, top_k=top_k, seed=top_k)
    topk_weights, topk_ids = fused_topk(x @ router, top_k)
    assert (np.sort(topk_ids, axis=1)[:, 1:] != np.sort(topk_ids, axis=1)[:, :-1]).all()  # distinct
    got = fused_experts(x, w13, w2, topk_weights, topk_ids, block_size)
    np.testing.assert_allclose(got, reference_moe(x, w13, w2, topk_weights, topk_ids),
                               rtol=1e-5, atol=1e-5)


def test_layer_reports_its_expert_loads():
    x, router, w13, w2 = random_problem(num_tokens=9, num_experts=6, top_k=2, seed=5)
    moe = FusedMoE(router, w13, w2, top_k=2)
    moe(x)
    assert moe.last_expert_loads.sum() == 9 * 2 and moe.last_expert_loads.max() <= 9
    with pytest.raises(ValueError, match=r"expected router \[H, E\]"):
        FusedMoE(router.T, w13, w2, top_k=2)


def test_matches_transformers_mixtral_block():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    hidden, inter, num_experts, top_k, num_tokens = 16, 24, 4, 2, 11
    config = MixtralConfig(hidden_size=hidden, intermediate_size=inter,
                           num_local_experts=num_experts, num_experts_per_tok=top_k)
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        h = torch.randn(1, num_tokens, hidden)
        want = block(h).reshape(num_tokens, hidden).numpy()
    # transformers keeps Mixtral's experts fused as vLLM does: gate_up_proj [E, 2I, H]
    # (gate rows first) and down_proj [E, H, I]; the router is a linear [E, H].
    moe = FusedMoE(block.gate.weight.detach().numpy().T.copy(),
                   block.experts.gate_up_proj.detach().numpy(),
                   block.experts.down_proj.detach().numpy(), top_k=top_k, block_size=4)
    got = moe(h.reshape(num_tokens, hidden).numpy())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the Mixtral model in the engine

from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SHARED = list(range(40, 61))
PROMPTS = [{"prompt_token_ids": SHARED + [1, 2, 3]}, {"prompt_token_ids": [200]},
           {"prompt_token_ids": SHARED + [9]}, {"prompt_token_ids": list(range(100, 137))}]


def run_moe(prompts=PROMPTS, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 128)
    engine = LLMEngine("tiny-moe", **kw)
    return [list(r.output_token_ids) for r in engine.generate(prompts, GREEDY)], engine


def test_tiny_moe_scheduling_never_changes_output_and_counts_expert_loads():
    alone = [run_moe([p], enable_caching=False)[0][0] for p in PROMPTS]
    chunked, engine = run_moe(max_num_batched_tokens=5)
    assert chunked == alone
    for s in engine.stats:  # every scheduled token makes top_k = 2 slots in each of 2 layers
        assert [sum(row) for row in s.expert_loads] == [2 * sum(s.num_scheduled_tokens.values())] * 2
    engine = LLMEngine("tiny-moe", block_size=4, num_blocks=128)
    first = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    second = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    assert first == alone and second == alone
    assert sum(s.num_cached_tokens for s in engine.stats) >= 2 * 20
    preempted, engine = run_moe(num_blocks=13)
    assert preempted == alone and any(s.preempted for s in engine.stats)
    # the router really spreads tokens: every expert of every layer gets work
    loads = np.array([s.expert_loads for s in engine.stats]).sum(axis=0)
    assert (loads > 0).all()


def test_moe_models_refuse_what_they_cannot_do():
    from mini_vllm.models.config import ModelConfigError, tiny_moe_config

    with pytest.raises(ValueError, match="quantization covers dense models only"):
        get_model("tiny-moe", quantization="int8")
    with pytest.raises(ValueError, match="backend 'torch' runs dense models only"):
        get_model("tiny-moe", backend="torch")
    config = tiny_moe_config()
    config.num_experts_per_tok = 5
    with pytest.raises(ModelConfigError, match=r"num_experts_per_tok must be in \[1, 4\]"):
        config.validate()
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=32)
    engine.generate(PROMPTS[:1], GREEDY)
    assert engine.model.last_expert_loads is None
    assert all(s.expert_loads == () for s in engine.stats)  # a dense model reports no loads


@pytest.mark.parametrize(
    "num_experts,top_k,hidden,inter,heads,kv_heads",
    [(4, 2, 32, 40, 4, 2),  # Mixtral's shape in small: top-2
     (3, 1, 24, 37, 2, 1),  # top-1 (Switch-style), an odd expert count and intermediate size
     (8, 3, 48, 20, 4, 4)],  # eight experts, top-3, intermediate narrower than hidden
    ids=["E4-top2", "E3-top1-odd", "E8-top3"],
)
def test_mixtral_checkpoint_matches_transformers(tmp_path, num_experts, top_k, hidden, inter,
                                                 heads, kv_heads):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from mini_vllm.models.config import ModelConfig
    from mini_vllm.models.loader import load_weights
    from mini_vllm.models.runner import greedy_generate

    cfg = transformers.MixtralConfig(
        vocab_size=97, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_local_experts=num_experts,
        num_experts_per_tok=top_k, max_position_embeddings=256, eos_token_id=96,
        attn_implementation="eager", experts_implementation="eager")  # a plain loop over experts:
    # torch's grouped GEMM path wants 16-byte strides, which an odd intermediate size breaks
    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # unit-scale weights: spread-out logits, no near-ties
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else
                    noise if "embed_tokens" in name else noise / p.shape[-1] ** 0.5)
    hf.save_pretrained(tmp_path, safe_serialization=True)  # per-expert w1/w2/w3 names
    ours = get_model(str(tmp_path))
    assert ours.config.architecture == "mixtral" and ours.config.num_experts_per_tok == top_k
    assert ours.config.num_local_experts == num_experts
    # the fused in-memory names (mlp.experts.gate_up_proj ...) load to the same weights
    fused = load_weights(ModelConfig.from_hf(tmp_path),
                         {k: v.detach().numpy() for k, v in hf.state_dict().items()})
    np.testing.assert_array_equal(fused.layers[1].moe.w13, ours.weights.layers[1].moe.w13)

    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 96, n).tolist() for n in (1, 9, 23)]
    tokens, first_logits = greedy_generate(ours, prompts, 8, block_size=4, return_logits=True)
    hf.generation_config.eos_token_id = None
    for prompt, got, logits in zip(prompts, tokens, first_logits, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want_logits = hf(ids).logits[0, -1].numpy()
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                               do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        assert got == want
        np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)


def test_tiny_moe_saves_and_loads_back_unchanged(tmp_path):
    from mini_vllm.models.loader import save_checkpoint
    from mini_vllm.models.runner import greedy_generate

    model = get_model("tiny-moe")
    save_checkpoint(tmp_path, model.config, model.weights)
    back = get_model(str(tmp_path))
    assert back.config.num_local_experts == 4 and back.config.num_experts_per_tok == 2
    np.testing.assert_array_equal(back.weights.layers[0].moe.w2, model.weights.layers[0].moe.w2)
    prompts = [[5, 6, 7], list(range(30, 50))]
    assert greedy_generate(back, prompts, 6) == greedy_generate(model, prompts, 6)
