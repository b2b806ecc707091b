"""Read a llama.cpp GGUF file into the ordinary Llama model (and a Hugging Face folder).

A ``.gguf`` file is one self-describing blob: a key/value header (the model's
shape, its tokenizer's vocabulary and merges, the chat template) followed by
the tensors, most of them block-quantized (SmolLM2's file: Q4_1 for the linear
layers, Q8_0 for the embedding, float32 for the norms). The ``gguf`` package
parses it and dequantizes each block type back to float32 in numpy.

Three things separate "dequantized" from "right":

- **Names and shapes.** GGUF lists dimensions fastest-first, so ``attn_k`` is
  ``[576, 192]`` in the file and ``[192, 576]`` (``[out, in]``) once read as a
  numpy array: exactly Hugging Face's layout. Only the names change
  (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``).
- **The Q/K row order.** llama.cpp rotates adjacent pairs ``(2i, 2i+1)`` (GPT-J
  style); Hugging Face and this package rotate ``(i, i + head_dim/2)`` (NeoX
  style). The converter that wrote the file permuted the rows of ``attn_q`` and
  ``attn_k`` so that llama.cpp's pairing meets the right numbers; ``unpermute``
  undoes it. Without it the model is fluent nonsense at best (SmolLM2 answers
  ``<|im_end|>`` at once). vLLM solves the same problem the other way round: it
  keeps the file's rows and switches its rotary embedding to GPT-J style.
- **The tied head.** There is no ``output.weight``: the LM head is the token
  embedding (``tie_word_embeddings``).

``convert_gguf`` writes all of it as a Hugging Face folder (config.json,
float32 model.safetensors, tokenizer.json, tokenizer_config.json with the chat
template, generation_config.json), into a temporary folder renamed into place,
so a failure leaves nothing half-written. That folder is what
``loader.load_model`` reads in well under a second, and what transformers and
real vLLM load too. Anything this module cannot represent (another
architecture, a tensor type the ``gguf`` package cannot dequantize, a RoPE
scaling it does not know) is a one-line ``GGUFError`` naming it.

upstream: vllm/model_executor/model_loader/gguf_loader.py:38 GGUFModelLoader
upstream: vllm/model_executor/models/llama.py:241 is_neox_style
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

from mini_vllm.models.config import ModelConfig
from mini_vllm.models.loader import write_safetensors

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama",)
TOKEN_TYPE_CONTROL = 3  # llama.cpp's vocab token types: 1 normal, 3 control, 4 user-defined

# GGUF tensor name (after "blk.N.") -> Hugging Face parameter (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


class GGUFError(ValueError):
    """A GGUF file this package cannot turn into a model (the message names file and reason)."""


def check_magic(path: str | os.PathLike) -> pathlib.Path:
    """The path, if it is a file that starts with GGUF's magic bytes; else a ``GGUFError``."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r})")
    return path


def open_gguf(path: str | os.PathLike):
    """A ``gguf.GGUFReader`` over the file (memory-mapped; parsing takes a few seconds)."""
    from gguf import GGUFReader

    path = check_magic(path)
    try:
        return GGUFReader(path)
    except Exception as exc:  # a truncated or corrupt file fails deep inside the parser
        raise GGUFError(f"{path}: unreadable GGUF file ({type(exc).__name__}: {exc})") from None


def metadata(reader) -> dict:
    """Every key/value field as plain Python (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("GGUF.")}


def config_from_metadata(meta: dict, source: str = "gguf") -> ModelConfig:
    """A ``ModelConfig`` from the ``{arch}.*`` keys (llama.cpp's names for HF's config)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{source}: architecture {arch!r} is not supported "
                        f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def need(key: str):
        full = f"{arch}.{key}"
        if full not in meta:
            raise GGUFError(f"{source}: missing metadata key {full!r}")
        return meta[full]

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    rope_scaling = {"rope_type": "default"}
    if scaling == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif scaling != "none":
        raise GGUFError(f"{source}: rope.scaling.type {scaling!r} is not supported "
                        "(supported: none, linear)")
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise GGUFError(f"{source}: rope.dimension_count {rotary} differs from head_dim "
                        f"{head_dim} (partial rotary embeddings are not supported)")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    if not vocab:
        raise GGUFError(f"{source}: no vocab_size and no tokenizer.ggml.tokens")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    config = ModelConfig(
        architecture="llama",
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(need("context_length")),
        tie_word_embeddings=True,  # decided by the tensors: see hf_tensors
        eos_token_ids=() if eos is None else (int(eos),),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    )
    config.validate(source)
    return config


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: [out, in] rows back to Hugging Face's order.

    Within each head, the converter interleaved the two halves of the rows (row
    ``j`` of the first half and row ``j`` of the second half become rows ``2j``
    and ``2j + 1``); this splits each pair back into the halves.
    """
    out, fan_in = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, fan_in).swapaxes(1, 2).reshape(out, fan_in)


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name for a GGUF tensor name, or None if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight":
        mapped = _LAYER_NAMES.get(parts[2])
        if mapped:
            return f"model.layers.{parts[1]}.{mapped}.weight"
    return None


def hf_tensors(reader, config: ModelConfig, source: str = "gguf") -> dict[str, np.ndarray]:
    """Every tensor dequantized to float32, under its Hugging Face name, Q/K un-permuted.

    Sets ``config.tie_word_embeddings`` from whether the file has an ``output.weight``.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise GGUFError(f"{source}: tensor {t.name} has no place in a llama model")
        try:
            arr = dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            kind = GGMLQuantizationType(t.tensor_type).name
            raise GGUFError(f"{source}: tensor {t.name} has type {kind}, which the gguf "
                            "package cannot dequantize") from None
        # Dimensions are stored fastest-first; numpy wants them slowest-first.
        arr = np.asarray(arr, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        if name.endswith("q_proj.weight"):
            arr = unpermute(arr, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            arr = unpermute(arr, config.num_key_value_heads)
        out[name] = np.ascontiguousarray(arr)
    config.tie_word_embeddings = "lm_head.weight" not in out
    return out


def build_tokenizer(meta: dict, source: str = "gguf"):
    """A ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*`` (GPT-2 byte-level BPE only).

    The pre-tokenizer follows ``tokenizer.ggml.pre``: "smollm" (and other
    digit-splitting vocabularies) splits every digit off first, then applies
    GPT-2's byte-level rules, as the model's own tokenizer.json and llama.cpp do.
    Control tokens (``<|im_start|>``...) become special added tokens, so the
    chat markers in a rendered template encode to one id each.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{source}: tokenizer.ggml.model {kind!r} is not supported "
                        "(supported: gpt2, byte-level BPE)")
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") in ("smollm", "starcoder", "refact", "deepseek-coder"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type", [])
    specials = [tokens[i] for i, kind in enumerate(types) if kind == TOKEN_TYPE_CONTROL]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def tokenizer_config(meta: dict) -> dict:
    """tokenizer_config.json: special tokens by text, the chat template, the BOS rule."""
    tokens = meta["tokenizer.ggml.tokens"]

    def text(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unknown_token_id"),
        "pad_token": text("padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta['general.architecture']}.context_length", 2048)),
    }
    if "tokenizer.chat_template" in meta:
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    return cfg


def convert_gguf(gguf_path: str | os.PathLike, folder: str | os.PathLike) -> pathlib.Path:
    """Write the GGUF as a Hugging Face folder at ``folder``, atomically; return its path.

    Everything goes to a temporary sibling folder that is renamed into place
    only when complete, so an interrupted conversion leaves nothing behind. If
    another process finished the same folder first, its copy is kept.
    """
    gguf_path, folder = pathlib.Path(gguf_path), pathlib.Path(folder)
    source = str(gguf_path)
    reader = open_gguf(gguf_path)
    meta = metadata(reader)
    config = config_from_metadata(meta, source)
    tok = build_tokenizer(meta, source)
    tensors = hf_tensors(reader, config, source)
    hf_config = config.to_hf_dict()
    pad = meta.get("tokenizer.ggml.padding_token_id")
    hf_config["pad_token_id"] = pad
    generation = {k: v for k, v in (("bos_token_id", config.bos_token_id),
                                    ("eos_token_id", config.eos_token_id),
                                    ("pad_token_id", pad)) if v is not None}
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the result should not be
        write_safetensors(tmp / "model.safetensors", tensors)
        del tensors
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(meta), indent=2))
        tok.save(str(tmp / "tokenizer.json"))
        if folder.exists():
            shutil.rmtree(folder)  # stale: older than its GGUF (see hf_folder_for)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def hf_folder_for(gguf_path: str | os.PathLike) -> pathlib.Path:
    """Where the converted folder of a GGUF lives: next to it, ``NAME.gguf`` -> ``NAME.hf/``."""
    gguf_path = pathlib.Path(gguf_path)
    return gguf_path.with_name(gguf_path.stem + ".hf")


def ensure_hf_folder(gguf_path: str | os.PathLike,
                     folder: str | os.PathLike | None = None) -> pathlib.Path:
    """The converted folder of a GGUF, converting first if it is missing or older than the file."""
    gguf_path = check_magic(gguf_path)
    folder = pathlib.Path(folder) if folder is not None else hf_folder_for(gguf_path)
    return folder if is_converted(gguf_path, folder) else convert_gguf(gguf_path, folder)


def is_converted(gguf_path: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds a conversion at least as new as the GGUF file."""
    weights = folder / "model.safetensors"
    return weights.is_file() and weights.stat().st_mtime >= gguf_path.stat().st_mtime
