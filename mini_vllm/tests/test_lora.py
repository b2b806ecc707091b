"""Multi-LoRA in mini_vllm (Phase 11): PEFT parity, isolation of rows and blocks, slots, errors.

The oracle is transformers + peft: a random Llama is saved as a checkpoint,
three adapters are made by ``peft.get_peft_model`` with ``init_lora_weights=False``
(so B is not zero) and saved by PEFT itself, and each request of one mixed
mini_vllm batch must give the greedy tokens, and the logits within 1e-4, that
PEFT's model gives for its adapter (or the bare model for no adapter).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from mini_vllm import LLM, LLMEngine, LoRARequest, SamplingParams
from mini_vllm.lora import write_peft_adapter
from mini_vllm.lora.model_manager import AdapterLRUCache
from mini_vllm.models.config import tiny_random_config

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


# --------------------------------------------------------------------------- PEFT parity
@pytest.fixture(scope="module")
def peft_world(tmp_path_factory):
    """A transformers Llama on disk and three PEFT adapters for it, with their reference outputs."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from mini_vllm.tests.test_models_hf_parity import build_hf_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora")
    kw = dict(vocab_size=101, hidden_size=48, intermediate_size=77, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, rope_theta=500.0)
    hf = build_hf_model("llama", seed=3, **kw)
    hf.save_pretrained(root / "base", safe_serialization=True)
    specs = {  # name: (r, alpha, targets, rslora)
        "attn": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
        "mlp": (4, 8, ["gate_proj", "up_proj", "down_proj"], False),  # rank 4 in rank-8 slots
        "all-rs": (8, 4, list(ALL), True),  # rsLoRA: alpha / sqrt(r)
    }
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 100, n).tolist() for n in (5, 19, 33, 12)]
    refs = {}
    for i, (name, (r, alpha, targets, rs)) in enumerate(specs.items()):
        torch.manual_seed(10 + i)
        cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rs,
                              init_lora_weights=False, lora_dropout=0.0)
        model = peft.get_peft_model(build_hf_model("llama", seed=3, **kw), cfg).eval()
        with torch.no_grad():  # PEFT's random B is tiny; make the adapters change tokens
            for pname, p in model.named_parameters():
                if "lora_B" in pname:
                    p.mul_(40.0)
        model.save_pretrained(root / name)
        refs[name] = model
    refs[None] = hf

    def reference(name, prompt, n=8):
        model = refs[name]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1].numpy()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 do_sample=False, pad_token_id=0, eos_token_id=None)
        return out[0, len(prompt):].tolist(), logits

    return root, specs, prompts, reference


def _requests(root, names):
    ids = {"attn": 1, "mlp": 2, "all-rs": 3}
    return [None if n is None else LoRARequest(n, ids[n], str(root / n)) for n in names]


def test_a_mixed_batch_equals_peft_for_every_adapter_and_the_base_model(peft_world):
    root, _, prompts, reference = peft_world
    names = ["attn", None, "mlp", "all-rs"]
    engine = LLMEngine(str(root / "base"), enable_lora=True, max_loras=3, max_lora_rank=8, block_size=4)
    reqs = [engine.add_request({"prompt_token_ids": p}, SamplingParams(max_tokens=8, temperature=0.0),
                               lora_request=lr)
            for p, lr in zip(prompts, _requests(root, names), strict=True)]
    done = {}
    while engine.has_unfinished_requests():
        for r in engine.step():
            done[r.request_id] = r
    assert engine.stats[0].active_loras == (1, 2, 3)  # one step ran all three adapters and the base
    for rid, prompt, name in zip(reqs, prompts, names, strict=True):
        want, _ = reference(name, prompt)
        assert done[rid].output_token_ids == want, name
    # logits of the first sampled position, all four rows in one batch, against PEFT's
    engine2 = LLMEngine(str(root / "base"), enable_lora=True, max_loras=3, max_lora_rank=8, block_size=4)
    for p, lr in zip(prompts, _requests(root, names), strict=True):
        engine2.add_request({"prompt_token_ids": p}, SamplingParams(max_tokens=1, logprobs=0, temperature=0.0),
                            lora_request=lr)
    captured = []
    execute = engine2.model.execute
    engine2.model.execute = lambda mi: captured.append(execute(mi)) or captured[-1]
    while engine2.has_unfinished_requests():
        engine2.step()
    logits = captured[0]
    for row, (prompt, name) in enumerate(zip(prompts, names, strict=True)):
        np.testing.assert_allclose(logits[row], reference(name, prompt)[1], atol=1e-4, rtol=0, err_msg=str(name))


def test_rank_4_adapter_is_zero_padded_into_rank_8_slots_and_rslora_scales_by_sqrt_r(peft_world):
    root, specs, _, _ = peft_world
    engine = LLMEngine(str(root / "base"), enable_lora=True, max_loras=2, max_lora_rank=8)
    mlp, rs = _requests(root, ["mlp", "all-rs"])
    engine.lora_manager.set_active_adapters([mlp, rs])
    manager = engine.lora_manager
    slot = manager.lora_index_to_id.index(2)
    gate_up = manager.modules["0.gate_up_proj"]
    assert not gate_up.lora_a_stacked[0][slot, 0, 4:].any() and gate_up.lora_a_stacked[0][slot, 0, :4].any()
    assert not manager.modules["0.qkv_proj"].lora_b_stacked[0][slot].any()  # "mlp" leaves q alone
    lora = manager.list_adapters()[3]
    assert lora.loras["model.layers.0.self_attn.q_proj"].scaling == 1.0  # folded into B at load
    r, alpha = specs["all-rs"][0], specs["all-rs"][1]
    from mini_vllm.models.loader import read_safetensors

    raw_b = read_safetensors(root / "all-rs" / "adapter_model.safetensors")[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    np.testing.assert_allclose(lora.loras["model.layers.0.self_attn.q_proj"].lora_b, raw_b * alpha / r ** 0.5,
                               rtol=1e-6)


# --------------------------------------------------------------------------- off / trivially on
@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    cfg = tiny_random_config()
    return {
        "a": write_peft_adapter(root / "a", cfg, r=8, target_modules=ALL, seed=1),
        "b": write_peft_adapter(root / "b", cfg, r=8, target_modules=("q_proj", "v_proj", "down_proj"), seed=2),
        "c": write_peft_adapter(root / "c", cfg, r=16, lora_alpha=48, target_modules=ALL, seed=3),
    }


def _lr(adapters, name):
    return LoRARequest(name, "abc".index(name) + 1, str(adapters[name]))


PROMPTS = ["the quick brown fox jumps over the lazy dog " * 2, "hello", "paged attention, " * 3, "abc" * 9]


def test_lora_enabled_with_no_adapter_is_the_old_path_bit_for_bit():
    def run(**kw):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=64, max_num_batched_tokens=24, **kw)
        captured = []
        execute = engine.model.execute
        engine.model.execute = lambda mi: captured.append(execute(mi)) or captured[-1]
        reqs = engine.generate(PROMPTS, GREEDY)
        return [r.output_token_ids for r in reqs], captured, engine

    tokens_off, logits_off, _ = run()
    tokens_on, logits_on, engine = run(enable_lora=True, max_loras=2, max_lora_rank=8)
    assert tokens_on == tokens_off
    assert len(logits_on) == len(logits_off)
    for a, b in zip(logits_on, logits_off, strict=True):
        np.testing.assert_array_equal(a, b)
    assert all(s.active_loras == () for s in engine.stats)


def test_base_rows_are_untouched_and_adapter_rows_change(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16)
    alone = LLMEngine("tiny-random").generate(PROMPTS[:2], GREEDY)
    mixed = engine.generate(PROMPTS[:2] * 2, GREEDY, lora_request=[None, None, _lr(adapters, "a"),
                                                                   _lr(adapters, "c")])
    assert [r.output_token_ids for r in mixed[:2]] == [r.output_token_ids for r in alone]
    assert mixed[2].output_token_ids != alone[0].output_token_ids
    assert mixed[3].output_token_ids != alone[1].output_token_ids


def _alone(adapters, prompt, name):
    engine = LLMEngine("tiny-random", enable_lora=name is not None, max_loras=1, max_lora_rank=16,
                       enable_caching=False)
    lora = None if name is None else _lr(adapters, name)
    return engine.generate([prompt], GREEDY, lora_request=lora)[0].output_token_ids


def test_chunking_prefix_caching_and_preemption_never_change_lora_outputs(adapters):
    names = ["a", None, "b", "c", "a", "b"]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[0], PROMPTS[2], PROMPTS[3], PROMPTS[1]]
    want = [_alone(adapters, p, n) for p, n in zip(prompts, names, strict=True)]
    # block 4, a 10-token budget (chunks), 30 blocks (preemption), caching on, 2 slots for 3 adapters
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16, block_size=4,
                       num_blocks=30, max_num_batched_tokens=10, enable_caching=True)
    got = engine.generate(prompts, GREEDY, lora_request=[None if n is None else _lr(adapters, n) for n in names])
    assert [r.output_token_ids for r in got] == want
    assert any(s.preempted for s in engine.stats), "the workload must preempt"
    assert any(0 < n < 99 for s in engine.stats for n in s.num_scheduled_tokens.values()), "and chunk"
    assert sum(s.num_cached_tokens for s in engine.stats) > 0, "and hit the prefix cache"
    assert max(len(s.active_loras) for s in engine.stats) <= 2


# --------------------------------------------------------------------------- prefix cache keys
def test_the_prefix_cache_is_shared_within_an_adapter_name_never_across(adapters):
    prompt = {"prompt_token_ids": list(range(40, 80))}  # 40 tokens: 9 full blocks of 4 can be hit
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16, block_size=4)
    sp = SamplingParams(max_tokens=1, temperature=0.0)

    def hits(lora):
        engine.add_request(prompt, sp, lora_request=lora)
        while engine.has_unfinished_requests():
            engine.step()
        return engine.stats[-1].num_cached_tokens

    a, b = _lr(adapters, "a"), _lr(adapters, "b")
    assert hits(a) == 0
    assert hits(a) == 36  # the same adapter: every full block but the one holding the last token
    assert hits(b) == 0  # another adapter: its K/V differ, nothing may be shared
    assert hits(None) == 0  # the base model shares nothing with either
    assert hits(None) == 36
    assert hits(b) == 36


# --------------------------------------------------------------------------- scheduling and slots
def test_max_loras_skips_the_third_adapter_without_blocking_the_queue(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16)
    sp = SamplingParams(max_tokens=3, temperature=0.0)
    order = ["a", "b", "c", None, "a"]
    ids = [engine.add_request("hi there", sp, lora_request=None if n is None else _lr(adapters, n)) for n in order]
    engine.step()
    first = engine.stats[0]
    assert first.active_loras == (1, 2)
    # "c" was skipped, not a barrier: the base request and the second "a" behind it ran
    assert set(first.num_scheduled_tokens) == {ids[0], ids[1], ids[3], ids[4]}
    assert [r.request_id for r in engine.scheduler.waiting] == [ids[2]]
    while engine.has_unfinished_requests():
        engine.step()
    assert all(len(s.active_loras) <= 2 for s in engine.stats)
    assert any(3 in s.active_loras for s in engine.stats)


def test_slots_are_lru_and_a_newcomer_takes_the_first_free_index(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=3)
    m = engine.lora_manager
    a, b, c = (_lr(adapters, n) for n in "abc")
    assert m.set_active_adapters([a, None]).tolist() == [0, -1]
    assert m.set_active_adapters([b]).tolist() == [1]
    assert m.set_active_adapters([a]).tolist() == [0]  # a hit refreshes a: b is now the oldest
    assert m.set_active_adapters([c]).tolist() == [1]  # b evicted; c takes b's slot, index 1
    assert m.lora_index_to_id == [1, 3]
    assert m.set_active_adapters([b, a]).tolist() == [1, 0]  # the batch's a is refreshed first: c goes
    assert m.lora_index_to_id == [1, 2]
    assert sorted(m.list_adapters()) == [1, 2, 3]  # all three stay registered (max_cpu_loras = 3)
    with pytest.raises(RuntimeError, match=r"Number of requested LoRAs \(3\) is greater"):
        m.set_active_adapters([a, b, c])


def test_evicted_from_cpu_an_adapter_is_read_again_with_the_same_outputs(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=1, max_lora_rank=16, max_cpu_loras=1)
    first = [engine.generate(["hello"], GREEDY, lora_request=_lr(adapters, n))[0].output_token_ids for n in "aba"]
    assert first[0] == first[2] and first[0] != first[1]
    assert list(engine.lora_manager.list_adapters()) == [1]


def test_adapter_lru_cache_calls_back_on_every_removal():
    gone = []
    cache = AdapterLRUCache(2, gone.append)
    cache[1], cache[2] = "x", "y"
    cache.touch(1)
    cache[3] = "z"
    assert gone == [2] and list(cache.cache) == [1, 3]
    cache.pop(1)
    assert gone == [2, 1]


def test_ngram_speculation_keeps_lora_greedy_outputs(adapters):
    prompt = "abcabcabcabc abcabc"
    want = _alone(adapters, prompt, "a")
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=1, max_lora_rank=16,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                           "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    assert engine.generate([prompt], GREEDY, lora_request=_lr(adapters, "a"))[0].output_token_ids == want


def test_llm_generate_fans_n_out_under_the_same_adapter(adapters):
    lora = _lr(adapters, "b")
    llm = LLM("tiny-random", enable_lora=True, max_loras=1, max_lora_rank=16)
    out = llm.generate("hello", SamplingParams(n=2, max_tokens=4, temperature=1.0, seed=7), lora_request=lora)
    assert out[0].lora_request == lora
    # child i is the request seeded 7 + i, under the same adapter
    alone = LLM("tiny-random", enable_lora=True, max_loras=1, max_lora_rank=16)
    want = [alone.generate("hello", SamplingParams(max_tokens=4, temperature=1.0, seed=7 + i),
                           lora_request=lora)[0].outputs[0].token_ids for i in range(2)]
    assert [c.token_ids for c in out[0].outputs] == want
    base = LLM("tiny-random").generate("hello", SamplingParams(max_tokens=4, temperature=1.0, seed=7))
    assert base[0].outputs[0].token_ids != want[0]


# --------------------------------------------------------------------------- errors
def test_lora_request_checks_its_fields():
    with pytest.raises(ValueError, match=r"lora_int_id must be an integer >= 1 \(id must be > 0\), got 0"):
        LoRARequest("x", 0, "/tmp/x")
    with pytest.raises(ValueError, match="lora_name must be a non-empty str"):
        LoRARequest("", 1, "/tmp/x")
    with pytest.raises(ValueError, match="lora_path must be a non-empty path"):
        LoRARequest("x", 1, "")
    assert LoRARequest("x", 1, "/a") == LoRARequest("x", 2, "/b")  # upstream: equal by name


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_lora_rank=12), r"max_lora_rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512, got 12"),
    (dict(max_loras=0), r"max_loras must be an integer >= 1, got 0"),
    (dict(max_loras=3, max_cpu_loras=2), r"max_cpu_loras \(2\) must be >= max_loras \(3\)"),
    (dict(enable_lora="yes"), r"enable_lora must be True or False"),
])
def test_engine_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLMEngine("tiny-random", **{"enable_lora": True, **kwargs})


def test_lora_needs_a_dense_numpy_transformer_and_must_be_enabled(adapters):
    with pytest.raises(ValueError, match="enable_lora needs a numpy transformer"):
        LLMEngine("toy", enable_lora=True)
    with pytest.raises(ValueError, match="enable_lora covers dense models"):
        LLMEngine("tiny-moe", enable_lora=True)
    with pytest.raises(ValueError, match=r"needs LLMEngine\(enable_lora=True\): LoRA is not enabled"):
        LLMEngine("tiny-random").add_request("hi", lora_request=_lr(adapters, "a"))
    with pytest.raises(ValueError, match="lora_request must be a LoRARequest or None, got str"):
        LLMEngine("tiny-random", enable_lora=True).add_request("hi", lora_request="a")


def test_an_id_or_a_name_names_one_adapter(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_lora_rank=16)
    engine.add_request("hi", lora_request=_lr(adapters, "a"))
    with pytest.raises(ValueError, match="lora_int_id 1 already names adapter 'a'"):
        engine.add_request("hi", lora_request=LoRARequest("b", 1, str(adapters["b"])))
    with pytest.raises(ValueError, match="lora_name 'a' is already adapter id 1"):
        engine.add_request("hi", lora_request=LoRARequest("a", 7, str(adapters["a"])))


def _bad_adapter(tmp_path, **config_changes):
    path = write_peft_adapter(tmp_path / "bad", tiny_random_config(), r=8, target_modules=("q_proj",))
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(config_changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return LoRARequest("bad", 9, str(path))


@pytest.mark.parametrize("changes, message", [
    (dict(r=32), r"has lora_A \[8, 64\]"),  # the config claims rank 32, the tensors have 8
    (dict(use_dora=True), r"vLLM does not yet support DoRA"),
    (dict(modules_to_save=["lm_head"]), r"vLLM only supports modules_to_save being None"),
    (dict(bias="all"), r"Adapter bias is not supported"),
    (dict(rank_pattern={"q_proj": 4}), r"sets rank_pattern"),
])
def test_an_adapter_vllm_would_refuse_is_refused_when_its_request_is_added(tmp_path, changes, message):
    engine = LLMEngine("tiny-random", enable_lora=True, max_lora_rank=64)
    with pytest.raises(ValueError, match=message):
        engine.add_request("hi", lora_request=_bad_adapter(tmp_path, **changes))
    assert not engine.has_unfinished_requests()


def test_rank_over_max_lora_rank_and_unknown_modules_are_refused(tmp_path, adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_lora_rank=8)
    with pytest.raises(ValueError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        engine.add_request("hi", lora_request=_lr(adapters, "c"))
    path = write_peft_adapter(tmp_path / "emb", tiny_random_config(), r=8, target_modules=("q_proj",))
    from mini_vllm.models.loader import read_safetensors, write_safetensors

    # copies: read_safetensors maps the file, which is about to be rewritten
    tensors = {k: np.array(v) for k, v in read_safetensors(path / "adapter_model.safetensors").items()}
    tensors["base_model.model.lm_head.lora_A.weight"] = np.zeros((8, 64), np.float32)
    tensors["base_model.model.lm_head.lora_B.weight"] = np.zeros((257, 8), np.float32)
    write_safetensors(path / "adapter_model.safetensors", tensors)
    with pytest.raises(ValueError, match=r"expected target modules in .* but received \['lm_head'\]"):
        engine.add_request("hi", lora_request=LoRARequest("emb", 5, str(path)))
    with pytest.raises(ValueError, match="has no adapter_config.json"):
        engine.add_request("hi", lora_request=LoRARequest("none", 6, str(tmp_path)))
    narrow = dataclasses.replace(tiny_random_config(), hidden_size=32)  # an adapter for another model
    other = write_peft_adapter(tmp_path / "other", narrow, r=8, target_modules=("o_proj",))
    with pytest.raises(ValueError, match=r"o_proj has lora_A \[8, 64\] and lora_B \[32, 8\]"):
        engine.add_request("hi", lora_request=LoRARequest("other", 7, str(other)))


def test_another_punica_wrapper_can_be_plugged_in(adapters):
    from mini_vllm.lora.punica import PunicaWrapperNumpy

    class Counting(PunicaWrapperNumpy):
        calls = 0

        def add_lora_linear(self, *args):
            Counting.calls += 1
            super().add_lora_linear(*args)

    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=1, max_lora_rank=16)
    engine.lora_manager.set_punica_wrapper(Counting(1))
    got = engine.generate(["hello"], GREEDY, lora_request=_lr(adapters, "a"))[0].output_token_ids
    assert got == _alone(adapters, "hello", "a")
    assert Counting.calls == 8 * 2 * 4  # 8 steps x 2 layers x 4 wrapped linears
    with pytest.raises(ValueError, match="lacks update_metadata, no_lora, add_lora_linear"):
        engine.lora_manager.set_punica_wrapper(object())
