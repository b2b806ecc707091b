"""Lab 07-06 tests: your fused_experts serves tiny-moe and a transformers Mixtral in mini_vllm."""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mini_vllm.models.moe as stock_moe  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import get_model  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

SILU_1 = 0.7310585786300049  # silu(1) = 1 / (1 + e^-1)
SILU_3 = 2.8577223804673  # silu(3) = 3 / (1 + e^-3)


def expert64(x, w13, w2):
    """Test-side SwiGLU expert in float64, gate rows first: (silu(x G^T) * x U^T) w2^T."""
    x, w13, w2 = (np.asarray(a, np.float64) for a in (x, w13, w2))
    inter = w2.shape[1]
    g, u = x @ w13[:inter].T, x @ w13[inter:].T
    return (g / (1.0 + np.exp(-g)) * u) @ w2.T


def moe64(x, w13, w2, topk_weights, topk_ids):
    """The MoE layer by its definition: token by token, choice by choice, float64."""
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j, e in enumerate(topk_ids[t]):
            out[t] += float(topk_weights[t, j]) * expert64(x[t:t + 1], w13[e], w2[e])[0]
    return out


def random_layer(num_tokens=13, hidden=16, inter=24, num_experts=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_tokens, hidden)).astype(np.float32)
    router = (rng.standard_normal((hidden, num_experts)) / 2).astype(np.float32)
    w13 = (rng.standard_normal((num_experts, 2 * inter, hidden)) / np.sqrt(hidden)).astype(np.float32)
    w2 = (rng.standard_normal((num_experts, hidden, inter)) / np.sqrt(inter)).astype(np.float32)
    return x, router, w13, w2


# ---------------------------------------------------------------- 1. route and align (lab 01's)


def test_route_by_hand():
    # softmax of log([1, 2, 3, 4]) is [0.1, 0.2, 0.3, 0.4]: top-2 is experts 3 then 2.
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    w, ids = impl.route(logits, 2)
    assert ids.tolist() == [[3, 2]] and ids.dtype.kind in "iu" and w.dtype == np.float32
    np.testing.assert_allclose(w, [[4 / 7, 3 / 7]], rtol=1e-6)  # Mixtral renormalizes
    w, ids = impl.route(logits, 2, renormalize=False)
    np.testing.assert_allclose(w, [[0.4, 0.3]], rtol=1e-6)  # the plain probabilities
    # equal logits: the lower ids win, in order; logits of 1000 do not overflow
    assert impl.route(np.zeros((1, 5), np.float32), 3)[1].tolist() == [[0, 1, 2]]
    w, ids = impl.route(np.array([[999.0, 1000.0]], np.float32), 2, renormalize=False)
    assert ids.tolist() == [[1, 0]]
    np.testing.assert_allclose(w, [[0.7310586, 0.2689414]], rtol=1e-6)
    for bad in (0, 5):
        with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 4\]"):
            impl.route(logits, bad)


def test_align_by_hand():
    # The example in the docstring of upstream's moe_align_block_size; its ids run 1..4,
    # so it needs num_experts = 5 (expert 0 gets no block). 12 slots: padding is 12.
    topk_ids = np.array([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]])
    sorted_ids, expert_ids, total = impl.moe_align_block_size(topk_ids, 4, 5)
    pad = 12
    assert sorted_ids.reshape(4, 4).tolist() == [[3, 6, 9, pad],  # expert 1
                                                 [0, 4, 10, pad],  # expert 2
                                                 [1, 7, 11, pad],  # expert 3
                                                 [2, 5, 8, pad]]  # expert 4
    assert expert_ids.tolist() == [1, 2, 3, 4] and total == 16
    # Block 2: expert 0 has slots 0, 2 (one full block, no padding), expert 1 has slot 1
    # (padded with 4 = T * k), expert 2 has slot 3.
    sorted_ids, expert_ids, total = impl.moe_align_block_size(np.array([[0, 1], [0, 2]]), 2, 3)
    assert sorted_ids.tolist() == [0, 2, 1, 4, 3, 4] and expert_ids.tolist() == [0, 1, 2]
    assert total == 6
    with pytest.raises(ValueError, match="^num_experts must be an integer >= 1, got 0"):
        impl.moe_align_block_size(np.array([[0, 1], [0, 2]]), 2, 0)


# ---------------------------------------------------------------- 2. the stacked layout


def test_expert_mlp_reads_gate_rows_then_up_rows():
    # H = 2, I = 1: gate row [1, 0], up row [0, 1], down [[1], [2]]; x = [1, 3].
    # gate = 1, up = 3: silu(1) * 3 * [1, 2] = [2.1931757, 4.3863515].
    # Gate and up swapped would give silu(3) * 1 * [1, 2] = [2.8577224, 5.7154448].
    w13, w2, x = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0], [2.0]]), np.array([[1.0, 3.0]])
    got = impl.expert_mlp(x, w13, w2)
    assert got.dtype == np.float32 and got.shape == (1, 2)
    np.testing.assert_allclose(got, [[3 * SILU_1, 6 * SILU_1]], rtol=1e-6)
    assert abs(got[0, 0] - SILU_3) > 0.5
    # a large negative gate gives 0, a large positive one gives the gate itself: no overflow
    big = impl.expert_mlp([[-200.0, 1.0], [200.0, 1.0]], w13, w2)
    np.testing.assert_allclose(big, [[0.0, 0.0], [200.0, 400.0]], atol=1e-3)
    # random shapes agree with the float64 definition
    x, _, w13, w2 = random_layer(num_tokens=7, hidden=8, inter=12, num_experts=1, seed=3)
    np.testing.assert_allclose(impl.expert_mlp(x, w13[0], w2[0]), expert64(x, w13[0], w2[0]),
                               rtol=1e-5, atol=1e-6)


def test_a_tokens_k_slots_all_count():
    # One token, top-2, two identical experts with weights 0.25 and 0.75: the output is
    # the expert's output exactly (0.25 + 0.75 = 1). out[idx] += y keeps only the last
    # slot (0.75 of it); weighting twice gives 0.625 of it; not at all, twice of it.
    expert = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    w13 = np.stack([expert, expert])
    w2 = np.array([[[1.0], [2.0]]] * 2, np.float32)
    x = np.array([[1.0, 3.0]], np.float32)
    got = impl.fused_experts(x, w13, w2, np.array([[0.25, 0.75]], np.float32),
                             np.array([[0, 1]]), block_size=4)
    np.testing.assert_allclose(got, [[3 * SILU_1, 6 * SILU_1]], rtol=1e-6)
    # The same token twice, each with its own weights: row t only ever gets token t.
    got = impl.fused_experts(np.array([[1.0, 3.0], [2.0, 6.0]], np.float32), w13, w2,
                             np.array([[0.5, 0.5], [0.1, 0.2]], np.float32),
                             np.array([[1, 0], [0, 1]]), block_size=1)
    np.testing.assert_allclose(got[0], [3 * SILU_1, 6 * SILU_1], rtol=1e-6)
    np.testing.assert_allclose(got[1], expert64([[2.0, 6.0]], expert, w2[0])[0] * 0.3, rtol=1e-6)


@pytest.mark.parametrize(("top_k", "block_size", "num_experts"),
                         [(2, 16, 6), (1, 4, 4), (3, 3, 5), (2, 1, 8), (2, 64, 6), (4, 5, 8)])
def test_fused_experts_equals_the_per_token_definition(top_k, block_size, num_experts):
    # 13 tokens; blocks larger and smaller than an expert's share, so there is padding
    # (slot id 13 * top_k, which is no row of x) in almost every block.
    x, router, w13, w2 = random_layer(num_experts=num_experts, seed=top_k + block_size)
    w, ids = impl.route(x @ router, top_k)
    kept = [a.copy() for a in (x, w13, w2, w, ids)]
    got = impl.fused_experts(x, w13, w2, w, ids, block_size)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, moe64(x, w13, w2, w, ids), rtol=1e-5, atol=1e-5)
    for before, after in zip(kept, (x, w13, w2, w, ids), strict=True):
        np.testing.assert_array_equal(before, after)  # nothing modified


def test_fused_experts_runs_the_expert_its_block_names():
    # Expert e scales its input by e + 1 (w13 gate = up = identity-like, w2 = identity):
    # every token goes to one expert, so a wrong expert id shows as a wrong factor.
    hidden, num_experts = 3, 4
    eye = np.eye(hidden, dtype=np.float32)
    w13 = np.stack([np.concatenate([eye * (e + 1), eye]) for e in range(num_experts)])
    w2 = np.stack([eye] * num_experts)
    x = np.full((6, hidden), 2.0, np.float32)
    ids = np.array([[3], [1], [1], [0], [3], [3]])
    got = impl.fused_experts(x, w13, w2, np.ones((6, 1), np.float32), ids, block_size=2)
    # silu(2 (e + 1)) * 2 per entry
    want = [2 * (2 * (e + 1)) / (1 + np.exp(-2.0 * (e + 1))) for e in ids[:, 0]]
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-6)


def test_count_expert_loads_counts_slots():
    # 3 tokens, top-2 of 4: expert 0 three times, 1 twice, 2 once, 3 never; 6 = T * k.
    loads = impl.count_expert_loads(np.array([[0, 1], [0, 2], [1, 0]]), 4)
    assert loads.tolist() == [3, 2, 1, 0] and loads.dtype == np.int64
    # padded rows are not load: block 16 would make it [16, 16, 16, 0]
    assert impl.count_expert_loads(np.array([[2], [2], [2]], np.int32), 3).tolist() == [0, 0, 3]


def test_bad_inputs_name_the_parameter():
    x, router, w13, w2 = random_layer(num_tokens=4, hidden=8, inter=6, num_experts=3)
    w, ids = np.full((4, 2), 0.5, np.float32), np.array([[0, 1], [1, 2], [2, 0], [0, 2]])
    fe = impl.fused_experts
    with pytest.raises(ValueError, match="^x must be a non-empty 2-D"):
        fe(x[0], w13, w2, w, ids)
    with pytest.raises(ValueError, match=r"^w13 must be \[E, 2\*I, H\] with H = 8"):
        fe(x, w13[:, :, :5], w2, w, ids)
    with pytest.raises(ValueError, match=r"^w2 must be \[E, H, I\] = \(3, 8, 6\)"):
        fe(x, w13, w2[:, :, :4], w, ids)
    with pytest.raises(ValueError, match=r"^topk_ids must lie in \[0, 2\]"):
        fe(x, w13, w2, w, ids + 1)
    with pytest.raises(ValueError, match=r"^topk_ids must have one row per token of x \(4\)"):
        fe(x, w13, w2, w[:3], ids[:3])
    with pytest.raises(ValueError, match="^topk_weights must have topk_ids' shape"):
        fe(x, w13, w2, w[:, :1], ids)
    with pytest.raises(ValueError, match="^block_size must be an integer >= 1, got 0"):
        fe(x, w13, w2, w, ids, 0)
    with pytest.raises(ValueError, match=r"^w13 must be \[2\*I, H\]"):
        impl.expert_mlp(x, w13[0, :5], w2[0])
    with pytest.raises(ValueError, match="^num_experts must be an integer >= 1, got 0"):
        impl.count_expert_loads(ids, 0)
    layer = impl.LearnerMoE(router, w13, w2, top_k=2)
    with pytest.raises(ValueError, match=r"^x must be \[T, 8\], got \(4, 7\)"):
        layer(x[:, :7])
    with pytest.raises(ValueError, match="^x must be a non-empty 2-D"):
        layer(x[0])
    with pytest.raises(ValueError, match="^model must be a mini_vllm model with MoE layers"):
        impl.install_moe(get_model("tiny-random"))
    with pytest.raises(ValueError, match="^model must be a mini_vllm model with MoE layers"):
        impl.install_moe(object())


# ---------------------------------------------------------------- 3. the layer and the plug


def test_learner_moe_equals_mini_vllms_fused_moe():
    x, router, w13, w2 = random_layer(num_tokens=11, num_experts=5, seed=9)
    stock = stock_moe.FusedMoE(router, w13, w2, top_k=2, block_size=4)
    mine = impl.LearnerMoE(router, w13, w2, top_k=2, block_size=4)
    np.testing.assert_allclose(mine(x), stock(x), rtol=1e-5, atol=1e-6)
    assert mine.last_expert_loads.tolist() == stock.last_expert_loads.tolist()
    assert mine.last_expert_loads.sum() == 11 * 2
    assert (mine.num_calls, mine.num_tokens) == (1, 11)
    mine(x[:3])  # the loads are this call's, the counters add up
    assert mine.last_expert_loads.sum() == 3 * 2 and (mine.num_calls, mine.num_tokens) == (2, 14)
    # without renormalization the layer's output is the smaller, unnormalized sum
    plain = impl.LearnerMoE(router, w13, w2, top_k=2, renormalize=False, block_size=4)
    want = stock_moe.FusedMoE(router, w13, w2, top_k=2, renormalize=False, block_size=4)(x)
    np.testing.assert_allclose(plain(x), want, rtol=1e-5, atol=1e-6)


def test_install_moe_replaces_every_moe_layer():
    model = get_model("tiny-moe")
    model.linears[1].moe.renormalize, model.linears[1].moe.block_size = False, 4  # not defaults
    old = [lin.moe for lin in model.linears]
    qkv = [lin.qkv_proj for lin in model.linears]
    layers = impl.install_moe(model)
    assert len(layers) == 2 and [lin.moe for lin in model.linears] == layers
    for new, before in zip(layers, old, strict=True):
        assert isinstance(new, impl.LearnerMoE) and not isinstance(new, stock_moe.FusedMoE)
        assert new.w13 is before.w13 and new.w2 is before.w2  # shared, not copied
        np.testing.assert_array_equal(new.router, before.router)
    assert [(m.top_k, m.renormalize, m.block_size) for m in layers] == [(2, True, 16), (2, False, 4)]
    assert [lin.qkv_proj for lin in model.linears] == qkv  # attention untouched


# ---------------------------------------------------------------- 4. the engine


SHARED = list(range(40, 61))  # 21 tokens: five full blocks of 4 shared by three prompts
PROMPTS = [SHARED + [1, 2, 3], [200], SHARED + [9], list(range(100, 137)), SHARED + [5, 6],
           [7, 8], list(range(150, 169)), [33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def serve(install: bool, **kw):
    """Serve PROMPTS greedily on tiny-moe; return tokens, per-step logits, engine, layers."""
    engine = LLMEngine("tiny-moe", block_size=4, **kw)
    layers = impl.install_moe(engine.model) if install else []
    logits, execute = [], engine.model.execute

    def recording(model_input):
        out = execute(model_input)
        logits.append(out.copy())
        return out

    engine.model.execute = recording
    outs = engine.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    return [list(r.output_token_ids) for r in outs], logits, engine, layers


def forbid_stock_moe(monkeypatch):
    """From now on, any use of mini_vllm's own MoE code fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("mini_vllm's MoE code ran: the learner's layer must do the work")

    for name in ("fused_topk", "moe_align_block_size", "expert_mlp", "fused_experts"):
        monkeypatch.setattr(stock_moe, name, refuse)
    monkeypatch.setattr(stock_moe.FusedMoE, "__call__", refuse)


# num_blocks 20 holds 80 tokens for 8 prompts of up to 37 + 8: requests are preempted.
# max_num_batched_tokens 7 splits every longer prompt into chunks.
SCENARIOS = {"one-big-step": dict(num_blocks=128),
             "chunked-cached-preempted": dict(num_blocks=20, max_num_batched_tokens=7)}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_engine_with_your_moe_matches_the_stock_engine(scenario, monkeypatch):
    kw = SCENARIOS[scenario]
    want_tokens, want_logits, stock, _ = serve(False, **kw)
    forbid_stock_moe(monkeypatch)
    tokens, logits, engine, layers = serve(True, **kw)
    assert tokens == want_tokens
    assert len(logits) == len(want_logits)  # the same schedule, step for step
    for got, want in zip(logits, want_logits, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # Your layers did all the MoE work: one call per layer per step, every scheduled token.
    steps = [s for s in engine.stats if s.num_scheduled_tokens]
    scheduled = sum(sum(s.num_scheduled_tokens.values()) for s in steps)
    assert [(m.num_calls, m.num_tokens) for m in layers] == [(len(steps), scheduled)] * 2
    borrowed = [n for n, v in vars(impl).items() if getattr(v, "__module__", "") == stock_moe.__name__]
    assert not borrowed, f"these names come from mini_vllm.models.moe: {borrowed}"
    if scenario == "chunked-cached-preempted":  # the scenario really does all three
        assert max(sum(s.num_scheduled_tokens.values()) for s in steps) <= 7
        assert sum(s.num_cached_tokens for s in engine.stats) >= 2 * 20
        assert any(s.preempted for s in engine.stats)


def test_step_stats_carry_your_expert_loads():
    _, _, stock, _ = serve(False, num_blocks=20, max_num_batched_tokens=7)
    _, _, engine, layers = serve(True, num_blocks=20, max_num_batched_tokens=7)
    assert [s.expert_loads for s in engine.stats] == [s.expert_loads for s in stock.stats]
    total = 0
    for s in engine.stats:
        tokens = sum(s.num_scheduled_tokens.values())
        loads = np.array(s.expert_loads)
        assert loads.shape == (2, 4)  # layers x experts
        assert loads.sum(axis=1).tolist() == [2 * tokens, 2 * tokens]  # top_k slots per token
        assert loads.max() <= tokens  # distinct experts: a token adds at most 1 to each
        total += tokens
    loads = np.array([s.expert_loads for s in engine.stats])
    assert loads.sum() == total * 2 * 2  # tokens x top_k x layers
    assert (loads.sum(axis=0) > 0).all()  # every expert of every layer worked
    assert layers[1].last_expert_loads.tolist() == list(engine.stats[-1].expert_loads[1])


# ---------------------------------------------------------------- 5. a transformers checkpoint


def test_transformers_mixtral_checkpoint_runs_on_your_moe(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import MixtralConfig, MixtralForCausalLM

    from mini_vllm.models.loader import read_checkpoint
    from mini_vllm.models.runner import greedy_generate

    config = MixtralConfig(vocab_size=89, hidden_size=24, intermediate_size=20, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=5,
                           num_experts_per_tok=2, max_position_embeddings=128, eos_token_id=88,
                           attn_implementation="eager")
    torch.manual_seed(1)
    hf = MixtralForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # transformers' init (std 0.02) gives near-flat logits: rescale
        for name, p in hf.named_parameters():
            z = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * z if "norm" in name else z if "embed" in name else z / p.shape[-1] ** 0.5)
    hf.save_pretrained(tmp_path)
    names = read_checkpoint(tmp_path)[0]
    assert "model.layers.1.block_sparse_moe.experts.4.w3.weight" in names  # the classic layout

    model = get_model(str(tmp_path))
    layers = impl.install_moe(model)
    prompts = [[5], list(range(10, 22)), [int(t) for t in np.random.default_rng(2).integers(0, 88, 17)]]
    tokens, first = greedy_generate(model, prompts, 6, block_size=4, chunk_size=5, return_logits=True)
    # prefill: every prompt token once; decode: 5 fed-back tokens per prompt (the 6th is not fed)
    assert [m.num_tokens for m in layers] == [sum(map(len, prompts)) + 5 * len(prompts)] * 2
    assert layers[0].num_calls == layers[1].num_calls > 0
    hf.generation_config.eos_token_id = None
    for prompt, got, logits in zip(prompts, tokens, first, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            np.testing.assert_allclose(logits, hf(ids).logits[0, -1].numpy(), rtol=0, atol=1e-4)
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                               do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        assert got == want
