"""Loading checkpoints: round trips, bfloat16, and one-line errors that name the culprit.

Checkpoints here are written with mini_vllm's own ``save_checkpoint`` (no
transformers needed); test_models_hf_parity.py covers folders that
transformers wrote, sharded ones included.
"""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from mini_vllm.models import (
    ModelConfigError,
    WeightLoadError,
    get_model,
    random_weights,
    tiny_random_config,
)
from mini_vllm.models.loader import (
    read_safetensors,
    save_checkpoint,
    to_hf_state_dict,
    write_safetensors,
)
from mini_vllm.models.runner import greedy_generate


def one_line_error(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg and msg, f"not a one-line message: {msg!r}"
    return msg


@pytest.fixture
def ckpt(tmp_path):
    """A saved tiny-random model: (folder, config, state dict)."""
    cfg = tiny_random_config()
    weights = get_model("tiny-random").weights
    save_checkpoint(tmp_path, cfg, weights)
    return tmp_path, cfg, to_hf_state_dict(cfg, weights)


def test_saved_checkpoint_loads_back_to_the_same_model(ckpt):
    folder, _, _ = ckpt
    a, b = get_model("tiny-random"), get_model(str(folder))
    prompts = [[1, 2, 3], list(range(50, 70))]
    assert greedy_generate(a, prompts, 5) == greedy_generate(b, prompts, 5)
    assert b.eos_token_id == 256 and b.vocab_size == 257
    for name, arr in to_hf_state_dict(b.config, b.weights).items():
        np.testing.assert_array_equal(arr, ckpt[2][name], err_msg=name)


@pytest.mark.parametrize("family,tied", [("llama", True), ("qwen2", False)])
def test_biases_and_tying_survive_a_round_trip(tmp_path, family, tied):
    cfg = tiny_random_config()
    cfg.architecture, cfg.tie_word_embeddings = family, tied
    cfg.qkv_bias = True
    cfg.o_bias = cfg.mlp_bias = family == "llama"
    w = random_weights(cfg, seed=3)
    save_checkpoint(tmp_path, cfg, w)
    names = set(read_safetensors(tmp_path / "model.safetensors"))
    assert ("lm_head.weight" in names) != tied
    assert ("model.layers.1.mlp.down_proj.bias" in names) == (family == "llama")
    m = get_model(str(tmp_path))
    assert m.config.architecture == family
    np.testing.assert_array_equal(m.weights.layers[1].qkv_bias, w.layers[1].qkv_bias)
    np.testing.assert_array_equal(m.weights.lm_head, w.lm_head)


def _write_raw(path, name, dtype, shape, raw: bytes):
    head = json.dumps({name: {"dtype": dtype, "shape": shape,
                              "data_offsets": [0, len(raw)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + raw)


def test_bfloat16_and_float16_tensors_read_as_float32(tmp_path):
    x = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
    bf16 = (x.view(np.uint32) >> 16).astype("<u2")  # keep the top 16 bits
    _write_raw(tmp_path / "a.safetensors", "t", "BF16", [2, 2], bf16.tobytes())
    got = read_safetensors(tmp_path / "a.safetensors")["t"]
    assert got.dtype == np.float32 and got.shape == (2, 2)
    np.testing.assert_array_equal(got.ravel(), (bf16.astype(np.uint32) << 16).view(np.float32))
    assert got.ravel()[:3].tolist() == [1.0, -2.5, 3.140625]  # exactly representable in bf16
    _write_raw(tmp_path / "b.safetensors", "t", "F16", [4], x.astype("<f2").tobytes())
    np.testing.assert_allclose(read_safetensors(tmp_path / "b.safetensors")["t"], x, rtol=1e-3)


def test_write_safetensors_is_readable_by_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    t = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(5, np.float32)}
    write_safetensors(tmp_path / "x.safetensors", t)
    back = st.load_file(str(tmp_path / "x.safetensors"))
    for k in t:
        np.testing.assert_array_equal(back[k], t[k])


def test_generation_config_eos_list_is_used_when_config_has_none(ckpt):
    folder, _, _ = ckpt
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eos_token_id"] = None
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    m = get_model(str(folder))
    assert m.eos_token_id == 7 and m.config.eos_token_ids == (7, 9)


def test_a_folder_without_tokenizer_takes_token_ids_and_refuses_text(ckpt):
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    engine = LLMEngine(model=str(ckpt[0]), block_size=4, num_blocks=32)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    (req,) = engine.generate([{"prompt_token_ids": [1, 2, 3]}], params)
    assert len(req.output_token_ids) == 3
    with pytest.raises(ValueError, match="prompt_token_ids") as e:
        engine.add_request("some text", params)
    one_line_error(e)


def test_tokenizer_json_is_used_when_present(ckpt):
    tokenizers = pytest.importorskip("tokenizers")
    folder = ckpt[0]
    vocab = {"[UNK]": 0, "hello": 5, "paged": 6, "world": 7}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    m = get_model(str(folder))
    assert m.tokenizer.encode("hello paged world") == [5, 6, 7]
    assert m.tokenizer.eos_token_id == 256


# ---- errors: each one line, naming the file or the parameter ----------------------------


def test_missing_config_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        get_model(str(tmp_path))
    assert "config.json" in one_line_error(e)


def test_missing_weights_name_the_folder(ckpt):
    folder = ckpt[0]
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError) as e:
        get_model(str(folder))
    assert str(folder) in one_line_error(e) and "safetensors" in str(e.value)


def test_missing_shard_names_the_shard(ckpt):
    folder, _, sd = ckpt
    names = sorted(sd)
    write_safetensors(folder / "model-00001-of-00002.safetensors", {n: sd[n] for n in names[:5]})
    index = {"weight_map": {n: ("model-00001-of-00002.safetensors" if i < 5 else
                                "model-00002-of-00002.safetensors")
                            for i, n in enumerate(names)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError) as e:
        get_model(str(folder))
    assert "model-00002-of-00002.safetensors" in one_line_error(e)


@pytest.mark.parametrize("arch,model_type", [
    (["GPT2LMHeadModel"], "gpt2"),
    (["Qwen2MoeForCausalLM"], "llama"),  # a known model_type does not rescue it
    (None, "mistral"),  # no "architectures" key: model_type decides
])
def test_unsupported_architecture_is_named(ckpt, arch, model_type):
    folder = ckpt[0]
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = model_type
    if arch is None:
        del cfg["architectures"]
    else:
        cfg["architectures"] = arch
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError) as e:
        get_model(str(folder))
    msg = one_line_error(e)
    assert (arch[0] if arch else model_type) in msg
    assert "config.json" in msg and "LlamaForCausalLM" in msg


@pytest.mark.parametrize("key,value,expect", [
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "yarn"),
    ("hidden_act", "gelu", "hidden_act"),
    ("num_key_value_heads", 3, "num_key_value_heads"),
])
def test_unsupported_config_values_are_named(ckpt, key, value, expect):
    folder = ckpt[0]
    cfg = json.loads((folder / "config.json").read_text())
    cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError) as e:
        get_model(str(folder))
    assert expect in one_line_error(e) and "config.json" in str(e.value)


def test_mismatched_shape_names_parameter_file_and_shapes(ckpt):
    folder, _, sd = ckpt
    sd["model.layers.1.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)
    write_safetensors(folder / "model.safetensors", sd)
    with pytest.raises(WeightLoadError) as e:
        get_model(str(folder))
    msg = one_line_error(e)
    assert "model.layers.1.self_attn.k_proj.weight" in msg and "model.safetensors" in msg
    assert "[16, 64]" in msg and "[32, 64]" in msg


def test_missing_parameter_is_named(ckpt):
    folder, _, sd = ckpt
    del sd["model.layers.0.mlp.up_proj.weight"]
    write_safetensors(folder / "model.safetensors", sd)
    with pytest.raises(WeightLoadError) as e:
        get_model(str(folder))
    msg = one_line_error(e)
    assert "model.layers.0.mlp.up_proj.weight" in msg and str(folder) in msg


def test_unexpected_parameter_is_named(ckpt):
    folder, _, sd = ckpt
    sd["model.layers.2.input_layernorm.weight"] = np.ones(64, np.float32)
    write_safetensors(folder / "model.safetensors", sd)
    with pytest.raises(WeightLoadError) as e:
        get_model(str(folder))
    msg = one_line_error(e)
    assert "model.layers.2.input_layernorm.weight" in msg and "2 layers" in msg


def test_a_corrupt_weight_file_is_named(ckpt):
    folder = ckpt[0]
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(WeightLoadError) as e:
        get_model(str(folder))
    assert "model.safetensors" in one_line_error(e)


def test_a_path_that_is_neither_folder_nor_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        get_model(str(tmp_path / "nope" / "deeper"))
    assert "nope" in one_line_error(e)


def test_a_hub_id_while_offline_is_a_clear_one_line_error(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # so "someorg/tiny-model" is not a local folder
    with pytest.raises(OSError) as e:
        get_model("someorg/tiny-model")
    msg = one_line_error(e)
    assert "someorg/tiny-model" in msg and "Hugging Face Hub" in msg
