"""Lab 11-02 tests: read PEFT adapters as vLLM does, and check a mixed batch against merged models.

Three oracles, none of them the lab's code:

* PEFT itself writes two of the adapters (``peft.get_peft_model`` on a tiny
  random transformers Llama, ``init_lora_weights=False`` so B is not zero,
  ``save_pretrained``) and merges them (``merge_and_unload``), so the layout,
  the names and the scaling are PEFT's, not a copy of our assumptions;
* mini_vllm's own loader, ``LoRAModel.from_local_checkpoint``, which must give
  the same arrays bit for bit, and must refuse the same folders;
* mini_vllm's engine with ``enable_lora=True``: one batch holding a base
  request and two adapters, whose rows must equal plain engines running the
  learner's merged weights.

torch, transformers and peft are imported once, in the module fixture.
"""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from course import load_impl

impl = load_impl(__file__)

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# A GQA Llama: Q = 4 heads x 16 = 64 columns, K = V = 2 heads x 16 = 32, F = 77 (odd on purpose).
HF_SHAPE = dict(vocab_size=101, hidden_size=48, intermediate_size=77, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, rope_theta=500.0)
# name: (r, lora_alpha, targets, use_rslora). "attn": 16 / 8 = 2.0. "rs": 6 / sqrt(4) = 3.0,
# where the plain rule would give 6 / 4 = 1.5 and integer division 6 // 4 = 1.
PEFT_SPECS = {"attn": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
              "rs": (4, 6, list(ALL), True)}
SCALING = {"attn": 2.0, "rs": 3.0, "w": 16 / 8}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A transformers Llama on disk, two adapters written by PEFT, one by mini_vllm's writer."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from mini_vllm.lora import write_peft_adapter
    from mini_vllm.models.config import ModelConfig
    from mini_vllm.tests.test_models_hf_parity import build_hf_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lab02")
    build_hf_model("llama", seed=3, **HF_SHAPE).save_pretrained(root / "base", safe_serialization=True)
    peft_merged = {}
    for i, (name, (r, alpha, targets, rs)) in enumerate(PEFT_SPECS.items()):
        torch.manual_seed(20 + i)
        cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rs,
                              init_lora_weights=False, lora_dropout=0.0)
        model = peft.get_peft_model(build_hf_model("llama", seed=3, **HF_SHAPE), cfg).eval()
        with torch.no_grad():  # PEFT's random B is small; scale it up so the adapters change tokens
            for pname, p in model.named_parameters():
                if "lora_B" in pname:
                    p.mul_(40.0)
        model.save_pretrained(root / name)
        merged = model.merge_and_unload()
        peft_merged[name] = {k: v.detach().numpy().copy() for k, v in merged.state_dict().items()
                             if k.endswith("_proj.weight")}
    config = ModelConfig.from_hf(root / "base")
    # mini_vllm's writer: k (slice 1 of qkv), up (slice 1 of gate_up), o and down; r 8, alpha 16.
    write_peft_adapter(root / "w", config, r=8, lora_alpha=16,
                       target_modules=("k_proj", "up_proj", "o_proj", "down_proj"), seed=5)
    return root, config, peft_merged


def _load(world, name, max_lora_rank=8):
    root, config, _ = world
    return impl.load_adapter(root / name, config, max_lora_rank)


def _variant(world, tmp_path, source="w", config_changes=None, tensors=None):
    """A copy of adapter ``source`` with fields of adapter_config.json changed or tensors replaced."""
    from mini_vllm.models.loader import read_safetensors, write_safetensors

    root = world[0]
    folder = tmp_path / "variant"
    shutil.copytree(root / source, folder)
    if config_changes:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg.update(config_changes)
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        # copies: the file is memory-mapped, and rewriting it under a live map is a bus error
        current = {k: np.array(v) for k, v in read_safetensors(folder / "adapter_model.safetensors").items()}
        write_safetensors(folder / "adapter_model.safetensors", tensors(current))
    return folder


def _mini_vllm_refuses(world, folder, max_lora_rank=8):
    from mini_vllm.lora import LoRAModel

    with pytest.raises(ValueError):
        LoRAModel.from_local_checkpoint(folder, world[1], lora_model_id=1, max_lora_rank=max_lora_rank)


# ---------------------------------------------------------------- the small functions by hand


def test_scaling_by_hand():
    assert impl.lora_scaling(8, 16) == 2.0
    assert impl.lora_scaling(4, 6) == 1.5           # not 6 // 4 = 1
    assert impl.lora_scaling(4, 6, use_rslora=True) == 3.0   # 6 / sqrt(4)
    assert impl.lora_scaling(16, 32, use_rslora=True) == 8.0  # 32 / 4, where alpha / r is 2
    assert impl.lora_scaling(8, 16, use_rslora=True) == 16 / math.sqrt(8)  # 5.657, not 16 // 2.83 = 5.0
    assert impl.lora_scaling(1, 0.5) == 0.5
    with pytest.raises(ValueError, match=r"r must be an integer >= 1"):
        impl.lora_scaling(0, 16)


def test_packed_location_maps_the_seven_modules():
    want = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
            "o_proj": ("o_proj", 0), "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
            "down_proj": ("down_proj", 0)}
    assert {m: impl.packed_location(m) for m in ALL} == want
    for bad in ("lm_head", "qkv_proj", "embed_tokens"):
        with pytest.raises(ValueError, match=r"hf_module must be one of \['q_proj'.*got '" + bad):
            impl.packed_location(bad)


GOOD = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none", "use_dora": False,
        "modules_to_save": None, "use_rslora": False}


def test_validate_accepts_a_plain_config_and_rank_equal_to_max():
    impl.validate_adapter_config(GOOD, 8)                      # r == max_lora_rank is allowed
    impl.validate_adapter_config({**GOOD, "modules_to_save": []}, 8)  # empty list: nothing to save
    impl.validate_adapter_config({"r": 1, "lora_alpha": 1, "target_modules": "all-linear"}, 1)


@pytest.mark.parametrize("change, pattern", [
    ({"use_dora": True}, r"use_dora.*does not yet support DoRA"),
    ({"modules_to_save": ["lm_head"]}, r"modules_to_save.*'lm_head'.*being None"),
    ({"bias": "lora_only"}, r"bias = 'lora_only'.*bias is not supported"),
    ({"r": 16}, r"r = 16.*LoRA rank 16 is greater than max_lora_rank 8"),
])
def test_validate_refuses_each_field_by_name(change, pattern):
    with pytest.raises(ValueError, match=pattern):
        impl.validate_adapter_config({**GOOD, **change}, 8)


def test_validate_reports_every_problem_in_one_message_in_upstreams_order():
    bad = {**GOOD, "r": 64, "use_dora": True, "bias": "all", "modules_to_save": ["score"]}
    with pytest.raises(ValueError) as info:
        impl.validate_adapter_config(bad, 16)
    msg = str(info.value)
    keys = ["modules_to_save", "DoRA", "LoRA rank 64 is greater than max_lora_rank 16", "bias"]
    positions = [msg.find(k) for k in keys]
    assert -1 not in positions and positions == sorted(positions), msg


def test_validate_bad_fields_and_arguments_name_them():
    with pytest.raises(ValueError, match=r"required field.*'lora_alpha'.*'target_modules'"):
        impl.validate_adapter_config({"r": 8}, 8)
    with pytest.raises(ValueError, match=r"r must be an integer >= 1, got True"):
        impl.validate_adapter_config({**GOOD, "r": True}, 8)
    with pytest.raises(ValueError, match=r"r must be an integer >= 1, got 0"):
        impl.validate_adapter_config({**GOOD, "r": 0}, 8)
    with pytest.raises(ValueError, match=r"max_lora_rank must be an integer >= 1, got 0"):
        impl.validate_adapter_config(GOOD, 0)


# ---------------------------------------------------------------- loading, against mini_vllm


@pytest.mark.parametrize("name", ["attn", "rs", "w"])
def test_load_agrees_bit_for_bit_with_mini_vllms_loader(world, name):
    from mini_vllm.lora import LoRAModel

    root, config, _ = world
    ref = LoRAModel.from_local_checkpoint(root / name, config, lora_model_id=1, max_lora_rank=8)
    got = _load(world, name)
    assert got.rank == ref.rank and got.scaling == SCALING[name]
    want_keys = set()
    for layer in range(config.num_hidden_layers):
        for packed in impl.PACKED_MODULES:
            ref_slots = ref.packed(layer, packed)
            if all(s is None for s in ref_slots):
                continue
            want_keys.add((layer, packed))
            slots = got.modules[(layer, packed)]
            assert len(slots) == len(ref_slots), (layer, packed)
            for i, (mine, theirs) in enumerate(zip(slots, ref_slots, strict=True)):
                if theirs is None:
                    assert mine is None, (layer, packed, i)
                    continue
                a, b = mine
                assert a.dtype == np.float32 and b.dtype == np.float32
                np.testing.assert_array_equal(a, theirs.lora_a, err_msg=f"{layer} {packed} {i} A")
                np.testing.assert_array_equal(b, theirs.lora_b, err_msg=f"{layer} {packed} {i} B")
    assert set(got.modules) == want_keys


def test_scaling_is_folded_into_b_once_and_a_is_untouched(world):
    from mini_vllm.models.loader import read_safetensors

    root = world[0]
    for name, module in (("attn", "self_attn.v_proj"), ("rs", "mlp.gate_proj")):
        raw = read_safetensors(root / name / "adapter_model.safetensors")
        prefix = f"base_model.model.model.layers.1.{module}"
        a, b = _load(world, name).pair(1, module.split(".")[1])
        # 2.0 and 3.0 are exact in float32, so B is exactly raw * scaling (not * scaling**2, not raw).
        np.testing.assert_array_equal(b, raw[prefix + ".lora_B.weight"] * np.float32(SCALING[name]))
        np.testing.assert_array_equal(a, raw[prefix + ".lora_A.weight"])


def test_a_config_without_use_rslora_means_plain_lora(world, tmp_path):
    folder = _variant(world, tmp_path, source="rs")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    del cfg["use_rslora"]  # older PEFT versions did not write the field: the default is False
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    assert _load(world, folder).scaling == 1.5  # 6 / 4


def test_the_loaded_arrays_are_copies_not_views_of_the_file(world):
    a, b = _load(world, "attn").pair(0, "q_proj")
    for arr in (a, b):
        assert arr.flags.owndata or (arr.base is not None and not isinstance(arr.base, np.memmap)), arr
        assert not isinstance(arr, np.memmap) and not isinstance(arr.base, np.memmap)


def test_each_module_lands_in_its_slice(world):
    adapter = _load(world, "w")  # k, up, o, down trained; q, v, gate not
    for layer in (0, 1):
        qkv = adapter.modules[(layer, "qkv_proj")]
        assert qkv[0] is None and qkv[2] is None and qkv[1][1].shape == (32, 8)   # k: 32 rows
        gate_up = adapter.modules[(layer, "gate_up_proj")]
        assert gate_up[0] is None and gate_up[1][0].shape == (8, 48)               # up's A
        assert adapter.modules[(layer, "o_proj")][0][0].shape == (8, 64)         # o's A: in = Q
        assert adapter.modules[(layer, "down_proj")][0][0].shape == (8, 77)      # down's A: in = F
    attn = _load(world, "attn")
    assert {p for _, p in attn.modules} == {"qkv_proj", "o_proj"}                # no MLP keys at all


# ---------------------------------------------------------------- refusals, agreeing with mini_vllm


def test_dora_is_refused_before_any_tensor_is_read(world, tmp_path):
    folder = _variant(world, tmp_path, config_changes={"use_dora": True})
    (folder / "adapter_model.safetensors").unlink()  # a loader that reads tensors first fails differently
    with pytest.raises(ValueError, match=r"use_dora.*DoRA"):
        _load(world, folder)
    _mini_vllm_refuses(world, folder)


@pytest.mark.parametrize("changes, pattern", [
    ({"modules_to_save": ["lm_head"]}, r"modules_to_save"),
    ({"bias": "all"}, r"bias = 'all'"),
    ({"r": 16}, r"LoRA rank 16 is greater than max_lora_rank 8"),
])
def test_config_refusals_from_the_folder(world, tmp_path, changes, pattern):
    folder = _variant(world, tmp_path, config_changes=changes)
    with pytest.raises(ValueError, match=pattern):
        _load(world, folder)
    _mini_vllm_refuses(world, folder)


def test_a_rank_8_adapter_loads_with_max_lora_rank_8_but_not_4(world):
    assert _load(world, "w", max_lora_rank=8).rank == 8
    with pytest.raises(ValueError, match=r"LoRA rank 8 is greater than max_lora_rank 4"):
        _load(world, "w", max_lora_rank=4)


def _add_lm_head(t):
    t["base_model.model.lm_head.lora_A.weight"] = np.zeros((8, 48), np.float32)
    t["base_model.model.lm_head.lora_B.weight"] = np.zeros((101, 8), np.float32)
    t["base_model.model.model.embed_tokens.lora_A.weight"] = np.zeros((8, 101), np.float32)
    t["base_model.model.model.embed_tokens.lora_B.weight"] = np.zeros((48, 8), np.float32)
    return t


def _transpose(key):
    def change(t):
        t[key] = np.ascontiguousarray(t[key].T)
        return t
    return change


def _rename(old, new):
    def change(t):
        t[new] = t.pop(old)
        return t
    return change


def _drop(key):
    def change(t):
        del t[key]
        return t
    return change


L1 = "base_model.model.model.layers.1"


@pytest.mark.parametrize("tensors, pattern", [
    (_add_lm_head, r"expected target modules in \['q_proj'.*but received \['lm_head', 'model.embed_tokens'\]"),
    (_transpose(f"{L1}.self_attn.k_proj.lora_A.weight"),
     r"model.layers.1.k_proj: lora_A has shape \[48, 8\], expected \[r, in\] = \[8, 48\]"),
    (_transpose(f"{L1}.mlp.down_proj.lora_B.weight"),
     r"model.layers.1.down_proj: lora_B has shape \[8, 48\], expected \[out, r\] = \[48, 8\]"),
    (_rename(f"{L1}.mlp.up_proj.lora_A.weight", "base_model.model.model.layers.2.mlp.up_proj.lora_A.weight"),
     r"'model.layers.2.mlp.up_proj' is not in the base model \(layers 0 to 1\)"),
    (_drop(f"{L1}.self_attn.o_proj.lora_B.weight"), r"model.layers.1.o_proj has no lora_B"),
])
def test_tensor_refusals_name_the_module_and_the_tensor(world, tmp_path, tensors, pattern):
    folder = _variant(world, tmp_path, tensors=tensors)
    with pytest.raises(ValueError, match=pattern):
        _load(world, folder)
    _mini_vllm_refuses(world, folder)


def test_bad_arguments_name_them(world, tmp_path):
    with pytest.raises(ValueError, match=r"path '.*nowhere' has no adapter_config.json"):
        _load(world, tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"max_lora_rank must be an integer >= 1, got '8'"):
        _load(world, "w", max_lora_rank="8")
    with pytest.raises(ValueError, match=r"max_lora_rank must be an integer >= 1, got 0"):
        _load(world, tmp_path / "nowhere", max_lora_rank=0)  # the argument is checked before the folder
    folder = _variant(world, tmp_path)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"has no adapter_model.safetensors"):
        _load(world, folder)


# ---------------------------------------------------------------- merged weights


def _base_model(world):
    from mini_vllm.models.loader import load_model

    return load_model(str(world[0] / "base"))


def test_merged_weights_equal_peft_merge_and_unload(world):
    _, config, peft_merged = world
    base = _base_model(world)
    Q, KV, F = config.q_size, config.kv_size, config.intermediate_size
    cols = {"q_proj": ("qkv_proj", 0, Q), "k_proj": ("qkv_proj", Q, Q + KV), "v_proj": ("qkv_proj", Q + KV, Q + 2 * KV),
            "o_proj": ("o_proj", 0, None), "gate_proj": ("gate_up_proj", 0, F), "up_proj": ("gate_up_proj", F, 2 * F),
            "down_proj": ("down_proj", 0, None)}
    for name in PEFT_SPECS:
        merged = impl.merged_weights(base.weights, _load(world, name), config)
        for layer in range(config.num_hidden_layers):
            for module, (packed, lo, hi) in cols.items():
                parent = "self_attn" if module in ALL[:4] else "mlp"
                want = peft_merged[name][f"model.layers.{layer}.{parent}.{module}.weight"]  # [out, in]
                got = getattr(merged.layers[layer], packed)[:, lo:hi].T
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-6, err_msg=f"{name} {layer} {module}")


def test_merged_weights_touch_only_trained_slices_and_leave_the_base_alone(world):
    _, config, _ = world
    base = _base_model(world)
    before = {(i, p): getattr(lw, p).copy() for i, lw in enumerate(base.weights.layers) for p in impl.PACKED_MODULES}
    merged = impl.merged_weights(base.weights, _load(world, "w"), config)  # k, up, o, down
    Q, KV, F = config.q_size, config.kv_size, config.intermediate_size
    for i, lw in enumerate(base.weights.layers):
        for p in impl.PACKED_MODULES:
            np.testing.assert_array_equal(getattr(lw, p), before[(i, p)])  # the base is unchanged
        qkv, gate_up = merged.layers[i].qkv_proj, merged.layers[i].gate_up_proj
        np.testing.assert_array_equal(qkv[:, :Q], lw.qkv_proj[:, :Q])                # q untouched
        np.testing.assert_array_equal(qkv[:, Q + KV:], lw.qkv_proj[:, Q + KV:])      # v untouched
        assert (qkv[:, Q:Q + KV] != lw.qkv_proj[:, Q:Q + KV]).mean() > 0.9           # k moved
        np.testing.assert_array_equal(gate_up[:, :F], lw.gate_up_proj[:, :F])        # gate untouched
        assert (gate_up[:, F:] != lw.gate_up_proj[:, F:]).mean() > 0.9               # up moved
        np.testing.assert_array_equal(merged.layers[i].input_norm, lw.input_norm)
    np.testing.assert_array_equal(merged.embed_tokens, base.weights.embed_tokens)


def test_merged_weights_refuse_an_adapter_for_a_deeper_model(world):
    _, config, _ = world
    base = _base_model(world)
    adapter = _load(world, "w")
    deeper = impl.Adapter(adapter.rank, adapter.scaling, {**adapter.modules, (2, "o_proj"): adapter.modules[(0, "o_proj")]})
    with pytest.raises(ValueError, match=r"adapter has module \(2, 'o_proj'\)"):
        impl.merged_weights(base.weights, deeper, config)


# ---------------------------------------------------------------- one mixed batch in the engine


def _run(engine, prompts, loras=None):
    """Greedy tokens of every request, and the logits of the first step (one row per request)."""
    from mini_vllm import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    loras = loras or [None] * len(prompts)
    ids = [engine.add_request({"prompt_token_ids": p}, params, lora_request=lr)
           for p, lr in zip(prompts, loras, strict=True)]
    captured = []
    execute = engine.model.execute
    engine.model.execute = lambda mi: captured.append(execute(mi)) or captured[-1]
    done = {}
    while engine.has_unfinished_requests():
        for r in engine.step():
            done[r.request_id] = r.output_token_ids
    return [done[i] for i in ids], captured[0]


def test_a_mixed_batch_equals_one_merged_model_per_row(world):
    from mini_vllm import LLMEngine, LoRARequest

    root, _, _ = world
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 100, n).tolist() for n in (9, 14, 21)]
    names = [None, "attn", "rs"]
    engine = LLMEngine(str(root / "base"), enable_lora=True, max_loras=2, max_lora_rank=8, block_size=4)
    loras = [None, LoRARequest("attn", 1, str(root / "attn")), LoRARequest("rs", 2, str(root / "rs"))]
    tokens, logits = _run(engine, prompts, loras)
    assert engine.stats[0].active_loras == (1, 2)  # one step ran the base and both adapters
    base = _base_model(world)
    for row, (prompt, name) in enumerate(zip(prompts, names, strict=True)):
        model = base if name is None else impl.merged_model(_base_model(world), _load(world, name))
        want_tokens, want_logits = _run(LLMEngine(model, block_size=4), [prompt])
        assert tokens[row] == want_tokens[0], name
        np.testing.assert_allclose(logits[row], want_logits[0], atol=1e-4, rtol=0, err_msg=str(name))
    # the adapters matter: each adapted row differs from the base model's answer to its prompt
    for row in (1, 2):
        assert tokens[row] != _run(LLMEngine(_base_model(world), block_size=4), [prompts[row]])[0][0]


def test_rslora_scaling_matters_in_the_engine(world, tmp_path):
    """The "rs" adapter read with alpha / r (1.5) instead of alpha / sqrt(r) (3.0) gives other logits."""
    from mini_vllm import LLMEngine, LoRARequest

    root, config, _ = world
    prompt = [[5, 17, 3, 88, 41, 9]]
    engine = LLMEngine(str(root / "base"), enable_lora=True, max_loras=1, max_lora_rank=8)
    _, lora_logits = _run(engine, prompt, [LoRARequest("rs", 2, str(root / "rs"))])
    right = impl.merged_model(_base_model(world), _load(world, "rs"))
    plain = _variant(world, tmp_path, source="rs", config_changes={"use_rslora": False})
    wrong = impl.merged_model(_base_model(world), impl.load_adapter(plain, config, 8))
    np.testing.assert_allclose(lora_logits[0], _run(LLMEngine(right), prompt)[1][0], atol=1e-4, rtol=0)
    assert np.abs(lora_logits[0] - _run(LLMEngine(wrong), prompt)[1][0]).max() > 1e-2
