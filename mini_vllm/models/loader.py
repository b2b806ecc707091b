"""Load a Hugging Face Llama / Qwen2 checkpoint into ``Weights``.

A model folder holds ``config.json``, the weights as ``model.safetensors`` or
as shards listed in ``model.safetensors.index.json`` (its ``weight_map`` says
which file holds each tensor), and usually ``tokenizer.json``.

Safetensors is read here directly: 8 bytes of header length (little endian),
a JSON header ``{name: {dtype, shape, data_offsets}}``, then raw bytes. That is
all the format is, and reading it ourselves lets bfloat16 checkpoints load into
numpy (which has no bfloat16): a bf16 number is the top 16 bits of a float32.

Name mapping (HF name -> mini_vllm ``Weights``; ``{i}`` is the layer index;
HF stores a linear layer as ``[out, in]``, mini_vllm as ``[in, out]``, hence
the transposes):

==============================================  =====================================
Hugging Face parameter                          mini_vllm
==============================================  =====================================
``model.embed_tokens.weight``  [V, H]           ``embed_tokens``  [V, H]
``model.layers.{i}.input_layernorm.weight``     ``layers[i].input_norm``
``model.layers.{i}.self_attn.q_proj.weight``    ``layers[i].qkv_proj[:, :Q]``  (transposed)
``model.layers.{i}.self_attn.k_proj.weight``    ``layers[i].qkv_proj[:, Q:Q+KV]``
``model.layers.{i}.self_attn.v_proj.weight``    ``layers[i].qkv_proj[:, Q+KV:]``
``model.layers.{i}.self_attn.{q,k,v}_proj.bias``  ``layers[i].qkv_bias`` (same slices)
``model.layers.{i}.self_attn.o_proj.weight``    ``layers[i].o_proj``  (transposed)
``model.layers.{i}.self_attn.o_proj.bias``      ``layers[i].o_bias`` (Llama attention_bias)
``model.layers.{i}.post_attention_layernorm.weight``  ``layers[i].post_norm``
``model.layers.{i}.mlp.gate_proj.weight``       ``layers[i].gate_up_proj[:, :F]``  (transposed)
``model.layers.{i}.mlp.up_proj.weight``         ``layers[i].gate_up_proj[:, F:]``
``model.layers.{i}.mlp.{gate,up}_proj.bias``    ``layers[i].gate_up_bias`` (Llama mlp_bias)
``model.layers.{i}.mlp.down_proj.weight``       ``layers[i].down_proj``  (transposed)
``model.layers.{i}.mlp.down_proj.bias``         ``layers[i].down_bias`` (Llama mlp_bias)
``model.norm.weight``                           ``norm``
``lm_head.weight``  [V, H]                      ``lm_head``  [H, V]; ``embed_tokens.T`` when
                                                ``tie_word_embeddings`` (then it may be absent)
``*.rotary_emb.inv_freq`` (old checkpoints)     ignored: recomputed from the config
==============================================  =====================================

Q = heads * head_dim, KV = kv_heads * head_dim, F = intermediate_size. Fusing
q/k/v and gate/up is what vLLM's ``stacked_params_mapping`` does in
``load_weights``. Every failure (a missing file, a missing or unexpected
tensor, a wrong shape) is a one-line error naming the file or the parameter.

upstream: vllm/model_executor/models/llama.py:436 LlamaModel.load_weights
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import struct

import numpy as np

from mini_vllm.models.config import ModelConfig
from mini_vllm.models.llama import LayerWeights, Weights


class WeightLoadError(ValueError):
    """A checkpoint that does not fit its config (the message names file and parameter)."""


_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of one .safetensors file as float32 numpy arrays."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weight file not found")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if raw.size < 8:
        raise WeightLoadError(f"{path}: not a safetensors file (shorter than its header)")
    (header_len,) = struct.unpack("<Q", bytes(raw[:8]))
    try:
        header = json.loads(bytes(raw[8:8 + header_len]))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WeightLoadError(f"{path}: not a safetensors file (bad header)") from None
    header.pop("__metadata__", None)
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise WeightLoadError(f"{path}: tensor {name} has dtype {info['dtype']}; "
                                  f"supported: {', '.join(_DTYPES)}")
        begin, end = info["data_offsets"]
        arr = raw[base + begin:base + end].view(dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = np.asarray(arr, dtype=np.float32)
    return out


def read_checkpoint(folder: pathlib.Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors of a folder, and for each the file it came from (for error messages)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights "
                                "(model.safetensors or an index with shards)")
    tensors, origin = {}, {}
    for fname in files:
        for name, arr in read_safetensors(folder / fname).items():
            tensors[name] = arr
            origin[name] = fname
    return tensors, origin


_LAYER_PARAM = re.compile(r"model\.layers\.(\d+)\.(.+)")


def load_weights(config: ModelConfig, tensors: dict[str, np.ndarray],
                 origin: dict[str, str] | None = None) -> Weights:
    """Map HF-named tensors onto ``Weights`` (table in the module docstring)."""
    origin = origin or {}
    c = config
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise WeightLoadError(f"missing parameter {name} (expected shape {list(shape)})")
        arr = tensors[name]
        if tuple(arr.shape) != shape:
            where = f" in {origin[name]}" if name in origin else ""
            raise WeightLoadError(f"parameter {name}{where} has shape {list(arr.shape)}, "
                                  f"expected {list(shape)} from the config")
        used.add(name)
        return arr

    def linear(prefix: str, fan_in: int, fan_out: int) -> np.ndarray:
        return take(prefix + ".weight", (fan_out, fan_in)).T

    def bias(prefix: str, n: int) -> np.ndarray:
        return take(prefix + ".bias", (n,))

    H, V, Q, KV, F = c.hidden_size, c.vocab_size, c.q_size, c.kv_size, c.intermediate_size
    layers = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        attn, mlp = p + ".self_attn", p + ".mlp"
        qkv = np.concatenate([linear(attn + ".q_proj", H, Q), linear(attn + ".k_proj", H, KV),
                              linear(attn + ".v_proj", H, KV)], axis=1)
        gate_up = np.concatenate([linear(mlp + ".gate_proj", H, F),
                                  linear(mlp + ".up_proj", H, F)], axis=1)
        layers.append(LayerWeights(
            input_norm=take(p + ".input_layernorm.weight", (H,)),
            qkv_proj=np.ascontiguousarray(qkv),
            o_proj=np.ascontiguousarray(linear(attn + ".o_proj", Q, H)),
            post_norm=take(p + ".post_attention_layernorm.weight", (H,)),
            gate_up_proj=np.ascontiguousarray(gate_up),
            down_proj=np.ascontiguousarray(linear(mlp + ".down_proj", F, H)),
            qkv_bias=np.concatenate([bias(attn + ".q_proj", Q), bias(attn + ".k_proj", KV),
                                     bias(attn + ".v_proj", KV)]) if c.qkv_bias else None,
            o_bias=bias(attn + ".o_proj", H) if c.o_bias else None,
            gate_up_bias=np.concatenate([bias(mlp + ".gate_proj", F),
                                         bias(mlp + ".up_proj", F)]) if c.mlp_bias else None,
            down_bias=bias(mlp + ".down_proj", H) if c.mlp_bias else None,
        ))
    embed = take("model.embed_tokens.weight", (V, H))
    if c.tie_word_embeddings:
        used.add("lm_head.weight")  # a tied checkpoint may still carry a copy
        lm_head = embed.T
    else:
        lm_head = np.ascontiguousarray(take("lm_head.weight", (V, H)).T)
    weights = Weights(embed_tokens=embed, layers=layers, norm=take("model.norm.weight", (H,)),
                      lm_head=lm_head)

    for name in sorted(tensors):
        if name in used or name.endswith("rotary_emb.inv_freq"):
            continue
        where = f" in {origin[name]}" if name in origin else ""
        m = _LAYER_PARAM.fullmatch(name)
        if m and int(m.group(1)) >= c.num_hidden_layers:
            raise WeightLoadError(f"unexpected parameter {name}{where}: the config has "
                                  f"{c.num_hidden_layers} layers")
        raise WeightLoadError(f"unexpected parameter {name}{where} "
                              f"(not part of a {c.architecture} model with this config)")
    return weights


def resolve_model_path(name_or_path: str) -> pathlib.Path:
    """A local folder as is; otherwise a hub id, downloaded with huggingface_hub."""
    path = pathlib.Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: a model must be a folder with config.json")
        return path
    if name_or_path.count("/") != 1 or name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{name_or_path}: no such model folder (and not a hub id "
                                "like 'org/name')")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError(f"{name_or_path}: not a local folder, and downloading it needs "
                          "huggingface_hub (pip install huggingface_hub)") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        local = snapshot_download(name_or_path, local_files_only=offline,
                                  allow_patterns=["*.json", "*.safetensors"])
    except Exception as exc:  # network errors, missing repo, gated repo, offline mode
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OSError(f"could not download {name_or_path!r} from the Hugging Face Hub "
                      f"(offline, or no such repo?): {type(exc).__name__}: {reason}") from None
    return pathlib.Path(local)


def load_model(name_or_path: str, max_model_len: int | None = None):
    """A ``LlamaForCausalLM`` from a local folder or a hub id, tokenizer.json included."""
    from mini_vllm.models.llama import LlamaForCausalLM

    folder = resolve_model_path(name_or_path)
    config = ModelConfig.from_hf(folder)
    # generation_config.json may name more end-of-sequence ids than config.json.
    gen = folder / "generation_config.json"
    if not config.eos_token_ids and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            config.eos_token_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
    tensors, origin = read_checkpoint(folder)
    weights = load_weights(config, tensors, origin)
    tokenizer = None
    if (folder / "tokenizer.json").is_file():
        from mini_vllm.tokenizer import HFTokenizer

        tokenizer = HFTokenizer(str(folder), eos_token_id=config.eos_token_id)
    return LlamaForCausalLM(config, weights, tokenizer=tokenizer, max_model_len=max_model_len,
                            name=str(name_or_path))
