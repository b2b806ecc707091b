"""Load a Hugging Face Llama / Qwen2 checkpoint into ``Weights``.

A model folder holds ``config.json``, the weights as ``model.safetensors`` or
as shards listed in ``model.safetensors.index.json`` (its ``weight_map`` says
which file holds each tensor), and usually ``tokenizer.json``.

Safetensors is read here directly: 8 bytes of header length (little endian),
a JSON header ``{name: {dtype, shape, data_offsets}}``, then raw bytes. That is
all the format is, and reading it ourselves lets bfloat16 checkpoints load into
numpy (which has no bfloat16): a bf16 number is the top 16 bits of a float32.

Name mapping. ``L{i}`` abbreviates ``model.layers.{i}``; HF stores a linear
layer as ``[out, in]`` and mini_vllm as ``[in, out]``, so every ``*_proj``
weight is transposed on the way in::

    Hugging Face parameter                      mini_vllm Weights
    ------------------------------------------  ------------------------------------
    model.embed_tokens.weight          [V, H]   embed_tokens               [V, H]
    L{i}.input_layernorm.weight        [H]      layers[i].input_norm
    L{i}.self_attn.q_proj.weight       [Q, H]   layers[i].qkv_proj[:, :Q]
    L{i}.self_attn.k_proj.weight       [KV, H]  layers[i].qkv_proj[:, Q:Q+KV]
    L{i}.self_attn.v_proj.weight       [KV, H]  layers[i].qkv_proj[:, Q+KV:]
    L{i}.self_attn.{q,k,v}_proj.bias            layers[i].qkv_bias (same slices; Qwen2,
                                                  or Llama with attention_bias)
    L{i}.self_attn.o_proj.weight       [H, Q]   layers[i].o_proj           [Q, H]
    L{i}.self_attn.o_proj.bias         [H]      layers[i].o_bias (Llama attention_bias)
    L{i}.post_attention_layernorm.weight        layers[i].post_norm
    L{i}.mlp.gate_proj.weight          [F, H]   layers[i].gate_up_proj[:, :F]
    L{i}.mlp.up_proj.weight            [F, H]   layers[i].gate_up_proj[:, F:]
    L{i}.mlp.{gate,up}_proj.bias                layers[i].gate_up_bias (Llama mlp_bias)
    L{i}.mlp.down_proj.weight          [H, F]   layers[i].down_proj        [F, H]
    L{i}.mlp.down_proj.bias            [H]      layers[i].down_bias (Llama mlp_bias)
    model.norm.weight                  [H]      norm
    lm_head.weight                     [V, H]   lm_head [H, V]; embed_tokens.T when
                                                  tie_word_embeddings (may be absent)
    *.rotary_emb.inv_freq (old files)           ignored: recomputed from the config
    Mixtral (architecture "mixtral"), instead of the mlp.* rows:
    L{i}.block_sparse_moe.gate.weight  [E, H]   layers[i].moe.router       [H, E]
    L{i}.block_sparse_moe.experts.{e}.w1/w3.weight  [F, H] each
                                                layers[i].moe.w13[e]       [2F, H] (w1 rows first)
    L{i}.block_sparse_moe.experts.{e}.w2.weight     [H, F]
                                                layers[i].moe.w2[e]        [H, F]
    (or the fused L{i}.mlp.gate.weight, .mlp.experts.gate_up_proj [E, 2F, H] and
    .mlp.experts.down_proj [E, H, F], the layout transformers 5 and vLLM keep in memory)

V = vocab, H = hidden, Q = heads * head_dim, KV = kv_heads * head_dim,
F = intermediate_size. Fusing q/k/v and gate/up is what vLLM's
``stacked_params_mapping`` does in ``load_weights``. Every failure (a missing file, a missing or unexpected
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
from mini_vllm.models.llama import LayerWeights, MoEWeights, Weights


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
                 origin: dict[str, str] | None = None, source: str = "the checkpoint") -> Weights:
    """Map HF-named tensors onto ``Weights`` (table in the module docstring).

    ``origin`` maps a tensor name to its file and ``source`` names the folder,
    both only for error messages.
    """
    origin = origin or {}
    c = config
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise WeightLoadError(f"missing parameter {name} in {source} "
                                  f"(expected shape {list(shape)})")
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
    E = c.num_local_experts

    def experts(p: str) -> MoEWeights:
        """Mixtral's MLP, saved per expert (w1 gate, w3 up, w2 down) or fused (as vLLM holds it)."""
        moe = p + ".block_sparse_moe"
        if moe + ".gate.weight" not in tensors and p + ".mlp.gate.weight" in tensors:
            fused = p + ".mlp"  # transformers 5 keeps the experts fused in memory
            return MoEWeights(router=take(fused + ".gate.weight", (E, H)).T,
                              w13=take(fused + ".experts.gate_up_proj", (E, 2 * F, H)),
                              w2=take(fused + ".experts.down_proj", (E, H, F)))
        w13 = np.stack([np.concatenate([take(f"{moe}.experts.{e}.w1.weight", (F, H)),
                                        take(f"{moe}.experts.{e}.w3.weight", (F, H))])
                        for e in range(E)])
        w2 = np.stack([take(f"{moe}.experts.{e}.w2.weight", (H, F)) for e in range(E)])
        return MoEWeights(router=np.ascontiguousarray(take(moe + ".gate.weight", (E, H)).T),
                          w13=w13, w2=w2)

    layers = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        attn, mlp = p + ".self_attn", p + ".mlp"
        qkv = np.concatenate([linear(attn + ".q_proj", H, Q), linear(attn + ".k_proj", H, KV),
                              linear(attn + ".v_proj", H, KV)], axis=1)
        if c.is_moe:
            moe, gate_up, down = experts(p), None, None
        else:
            moe = None
            gate_up = np.ascontiguousarray(np.concatenate([linear(mlp + ".gate_proj", H, F),
                                                           linear(mlp + ".up_proj", H, F)], axis=1))
            down = np.ascontiguousarray(linear(mlp + ".down_proj", F, H))
        layers.append(LayerWeights(
            input_norm=take(p + ".input_layernorm.weight", (H,)),
            qkv_proj=np.ascontiguousarray(qkv),
            o_proj=np.ascontiguousarray(linear(attn + ".o_proj", Q, H)),
            post_norm=take(p + ".post_attention_layernorm.weight", (H,)),
            gate_up_proj=gate_up,
            down_proj=down,
            qkv_bias=np.concatenate([bias(attn + ".q_proj", Q), bias(attn + ".k_proj", KV),
                                     bias(attn + ".v_proj", KV)]) if c.qkv_bias else None,
            o_bias=bias(attn + ".o_proj", H) if c.o_bias else None,
            gate_up_bias=np.concatenate([bias(mlp + ".gate_proj", F),
                                         bias(mlp + ".up_proj", F)]) if c.mlp_bias else None,
            down_bias=bias(mlp + ".down_proj", H) if c.mlp_bias else None,
            moe=moe,
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


def to_hf_state_dict(config: ModelConfig, weights: Weights) -> dict[str, np.ndarray]:
    """The inverse mapping: ``Weights`` under Hugging Face names, HF layouts ([out, in])."""
    c = config
    Q, KV, F = c.q_size, c.kv_size, c.intermediate_size
    sd = {"model.embed_tokens.weight": weights.embed_tokens, "model.norm.weight": weights.norm}
    if not c.tie_word_embeddings:
        sd["lm_head.weight"] = weights.lm_head.T
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}"
        a, m = p + ".self_attn", p + ".mlp"
        sd[p + ".input_layernorm.weight"] = lw.input_norm
        sd[p + ".post_attention_layernorm.weight"] = lw.post_norm
        for name, lo, hi in (("q_proj", 0, Q), ("k_proj", Q, Q + KV), ("v_proj", Q + KV, Q + 2 * KV)):
            sd[f"{a}.{name}.weight"] = lw.qkv_proj[:, lo:hi].T
            if lw.qkv_bias is not None:
                sd[f"{a}.{name}.bias"] = lw.qkv_bias[lo:hi]
        sd[a + ".o_proj.weight"] = lw.o_proj.T
        if lw.moe is not None:  # Mixtral, saved per expert as transformers saves it
            b = p + ".block_sparse_moe"
            sd[b + ".gate.weight"] = lw.moe.router.T
            for e in range(c.num_local_experts):
                sd[f"{b}.experts.{e}.w1.weight"] = lw.moe.w13[e, :F]
                sd[f"{b}.experts.{e}.w3.weight"] = lw.moe.w13[e, F:]
                sd[f"{b}.experts.{e}.w2.weight"] = lw.moe.w2[e]
        else:
            sd[m + ".gate_proj.weight"] = lw.gate_up_proj[:, :F].T
            sd[m + ".up_proj.weight"] = lw.gate_up_proj[:, F:].T
            sd[m + ".down_proj.weight"] = lw.down_proj.T
        for key, b in ((a + ".o_proj.bias", lw.o_bias), (m + ".down_proj.bias", lw.down_bias)):
            if b is not None:
                sd[key] = b
        if lw.gate_up_bias is not None:
            sd[m + ".gate_proj.bias"] = lw.gate_up_bias[:F]
            sd[m + ".up_proj.bias"] = lw.gate_up_bias[F:]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """Write float32 tensors in the safetensors layout ``read_safetensors`` parses."""
    header, offset = {}, 0
    for name, arr in tensors.items():
        size = 4 * int(np.prod(arr.shape))
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for arr in tensors.values():  # one tensor at a time: no second copy of the model
            f.write(np.ascontiguousarray(arr, dtype="<f4").data)


def save_checkpoint(folder: str | os.PathLike, config: ModelConfig, weights: Weights) -> None:
    """A folder transformers and ``load_model`` both read: config.json + model.safetensors."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    write_safetensors(folder / "model.safetensors", to_hf_state_dict(config, weights))


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


class NoTokenizer:
    """Stands in when a folder has no tokenizer.json: prompts must be token ids."""

    def __init__(self, name: str, vocab_size: int, eos_token_id: int | None):
        self.name, self.vocab_size, self.eos_token_id = name, vocab_size, eos_token_id

    def encode(self, text: str) -> list[int]:
        raise ValueError(f"{self.name} has no tokenizer.json: pass the prompt as "
                         "{'prompt_token_ids': [...]} instead of text")

    def decode(self, ids: list[int]) -> str:
        return ""  # no vocabulary to decode with; the token ids are the output


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
            config.eos_token_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    tensors, origin = read_checkpoint(folder)
    weights = load_weights(config, tensors, origin, source=str(folder))
    if (folder / "tokenizer.json").is_file():
        from mini_vllm.tokenizer import HFTokenizer

        tokenizer = HFTokenizer(str(folder), eos_token_id=config.eos_token_id)
    else:
        tokenizer = NoTokenizer(str(name_or_path), config.vocab_size, config.eos_token_id)
    return LlamaForCausalLM(config, weights, tokenizer=tokenizer, max_model_len=max_model_len,
                            name=str(name_or_path))
