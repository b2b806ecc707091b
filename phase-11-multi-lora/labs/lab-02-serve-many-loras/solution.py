"""Lab 11-02 — Many adapters, one batch: read a PEFT adapter as vLLM does (reference solution).

A LoRA adapter arrives as a folder written by PEFT's ``save_pretrained``:
``adapter_config.json`` (rank ``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``, ``use_dora``, ``bias``, ``modules_to_save``, ...) and
``adapter_model.safetensors``, one pair of tensors per adapted module, named
after the Hugging Face module::

    base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight   [out, r]

Before a server can batch it with other adapters it must do four things, and
each has a classic bug:

1. refuse what it cannot serve (DoRA, ``modules_to_save``, adapter biases, a
   rank above ``max_lora_rank``), all in one message, before reading tensors;
2. compute the scaling PEFT trained with, ``lora_alpha / r``, or
   ``lora_alpha / sqrt(r)`` for rank-stabilized LoRA (``use_rslora``), and
   multiply it into B once, so the batched kernels run with scale 1.0;
3. map Hugging Face module names onto the engine's fused modules: vLLM and
   mini_vllm run q/k/v as one ``qkv_proj`` and gate/up as one
   ``gate_up_proj``, so ``k_proj``'s pair belongs to slice 1 of ``qkv_proj``;
4. check every tensor against the base model (a known module, a layer that
   exists, ``[r, in]`` and ``[out, r]``).

``load_adapter`` does all four and returns an ``Adapter``. ``merged_weights``
then builds the dense model the adapter stands for, ``W + B @ A`` on each
slice (in mini_vllm's ``[in, out]`` layout: ``W + (B @ A).T``), which is the
oracle a LoRA row of a mixed batch must equal.

upstream: vllm/lora/worker_manager.py:99 _load_adapter
upstream: vllm/lora/peft_helper.py:53 __post_init__
upstream: vllm/lora/peft_helper.py:114 validate_legal
upstream: vllm/lora/lora_model.py:167 from_local_checkpoint
upstream: vllm/lora/lora_weights.py:36 optimize
upstream: vllm/model_executor/models/llama.py:504 packed_modules_mapping
"""
from __future__ import annotations

import json
import math
import pathlib
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from mini_vllm.models.config import ModelConfig
from mini_vllm.models.llama import LlamaForCausalLM, Weights
from mini_vllm.models.loader import read_safetensors

# ---------------------------------------------------------------- given helpers

# The engine's fused module -> the Hugging Face modules stacked in its output columns, in order.
PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
SUPPORTED_MODULES: tuple[str, ...] = tuple(m for parts in PACKED_MODULES.values() for m in parts)

_TENSOR = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
_LAYER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\.(?P<short>[A-Za-z0-9_]+)$")


class PeftName(NamedTuple):
    """One tensor name of ``adapter_model.safetensors``, split."""

    module: str        # e.g. "model.layers.3.self_attn.q_proj" or "lm_head"
    layer: int | None  # 3; None for a module outside the decoder layers (lm_head, embed_tokens)
    short: str         # the last part: "q_proj", "lm_head", ...
    which: str         # "A" or "B"


def split_peft_name(name: str) -> PeftName:
    """Given. Split a PEFT tensor name; ValueError naming the tensor if it is not a LoRA weight."""
    m = _TENSOR.match(name)
    if m is None:
        raise ValueError(f"tensor {name!r} is not a PEFT LoRA weight "
                         f"(base_model.model.<module>.lora_A.weight or .lora_B.weight)")
    module = m["module"]
    layer = _LAYER.match(module)
    if layer is None:
        return PeftName(module, None, module.rsplit(".", 1)[-1], m["which"])
    return PeftName(module, int(layer["layer"]), layer["short"], m["which"])


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Given. ``(in_features, out_features)`` of each of the seven modules an adapter may target."""
    h, f = config.hidden_size, config.intermediate_size
    return {"q_proj": (h, config.q_size), "k_proj": (h, config.kv_size), "v_proj": (h, config.kv_size),
            "o_proj": (config.q_size, h), "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


def packed_slices(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Given. The output width of each slice of each fused module (q, k, v differ under GQA)."""
    out = {m: o for m, (_, o) in module_shapes(config).items()}
    return {packed: tuple(out[m] for m in parts) for packed, parts in PACKED_MODULES.items()}


def check_positive_int(value, name: str) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


Pair = tuple[np.ndarray, np.ndarray]  # (A [r, in], B [out_slice, r] with the scaling folded in)


@dataclass
class Adapter:
    """A loaded adapter, keyed the engine's way.

    ``modules[(layer, packed_name)]`` is a list with one entry per slice of
    the fused module (``PACKED_MODULES[packed_name]`` order): an ``(A, B)``
    pair of float32 arrays, or ``None`` for a slice the adapter does not
    train. Only (layer, module) keys with at least one trained slice exist.
    ``scaling`` is the factor already multiplied into every B.
    """

    rank: int
    scaling: float
    modules: dict[tuple[int, str], list[Pair | None]]

    def pair(self, layer: int, hf_module: str) -> Pair | None:
        """The (A, B) of one Hugging Face module (``"k_proj"``) of one layer, or None."""
        for packed, parts in PACKED_MODULES.items():
            if hf_module in parts:
                slots = self.modules.get((layer, packed))
                return None if slots is None else slots[parts.index(hf_module)]
        raise ValueError(f"hf_module must be one of {list(SUPPORTED_MODULES)}, got {hf_module!r}")


def merged_model(model: LlamaForCausalLM, adapter: Adapter) -> LlamaForCausalLM:
    """Given. A plain mini_vllm model whose weights are ``merged_weights(model.weights, adapter)``."""
    return LlamaForCausalLM(model.config, merged_weights(model.weights, adapter, model.config),
                            tokenizer=model.tokenizer, max_model_len=model.max_model_len,
                            name=f"{model.name}+merged")


# ---------------------------------------------------------------- your code


def lora_scaling(r: int, lora_alpha: float, use_rslora: bool = False) -> float:
    """The factor PEFT multiplies ``B @ A`` by: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)``.

    ``r`` is an integer >= 1 (ValueError naming ``r`` otherwise). Returns a
    Python float, computed in one division (``math.sqrt`` for rsLoRA).
    """
    check_positive_int(r, "r")
    # rsLoRA (Kalajdzievski 2023) divides by sqrt(r), so raising the rank no longer shrinks the update.
    return lora_alpha / math.sqrt(r) if use_rslora else lora_alpha / r


def validate_adapter_config(adapter_config: dict, max_lora_rank: int) -> None:
    """Refuse an adapter_config.json vLLM would refuse, naming every offending field in one message.

    ``r``, ``lora_alpha`` and ``target_modules`` are required (ValueError
    naming the missing ones); ``r`` must be an integer >= 1. Then, collected
    into ONE ``ValueError`` joined by spaces, as upstream does:

    * ``modules_to_save`` set (not None / empty): names ``modules_to_save``;
    * ``use_dora`` true: names ``use_dora`` and says DoRA;
    * ``r > max_lora_rank``: names ``r`` and ``max_lora_rank`` with both values;
    * ``bias`` other than ``"none"``: names ``bias``.

    ``max_lora_rank`` must be an integer >= 1 (ValueError naming it).
    """
    check_positive_int(max_lora_rank, "max_lora_rank")
    missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in adapter_config]
    if missing:
        raise ValueError(f"adapter_config.json lacks the required field(s) {missing}")
    r = check_positive_int(adapter_config["r"], "r")
    errors = []
    if adapter_config.get("modules_to_save"):
        errors.append(f"modules_to_save = {adapter_config['modules_to_save']!r}: "
                      f"vLLM only supports modules_to_save being None.")
    if adapter_config.get("use_dora"):
        errors.append("use_dora = true: vLLM does not yet support DoRA.")
    if r > max_lora_rank:
        errors.append(f"r = {r}: LoRA rank {r} is greater than max_lora_rank {max_lora_rank}.")
    if adapter_config.get("bias", "none") != "none":
        errors.append(f"bias = {adapter_config['bias']!r}: Adapter bias is not supported.")
    if errors:
        raise ValueError(" ".join(errors))


def packed_location(hf_module: str) -> tuple[str, int]:
    """Where a Hugging Face module lives in the engine: ``(packed_name, slice_index)``.

    ``"q_proj" -> ("qkv_proj", 0)``, ``"v_proj" -> ("qkv_proj", 2)``,
    ``"up_proj" -> ("gate_up_proj", 1)``, ``"o_proj" -> ("o_proj", 0)``.
    Anything else: ValueError naming ``hf_module`` and the seven allowed names.
    """
    for packed, parts in PACKED_MODULES.items():
        if hf_module in parts:
            return packed, parts.index(hf_module)
    raise ValueError(f"hf_module must be one of {list(SUPPORTED_MODULES)}, got {hf_module!r}")


def load_adapter(path, config: ModelConfig, max_lora_rank: int) -> Adapter:
    """Read PEFT's folder at ``path`` into an ``Adapter`` for a base model with ``config``.

    Order of work and errors (every one a ``ValueError``):

    1. ``max_lora_rank`` an integer >= 1; ``path`` a folder holding
       ``adapter_config.json`` (message names ``path``);
    2. ``validate_adapter_config`` on the JSON, before any tensor is read;
    3. ``adapter_model.safetensors`` present (message names the file), read
       with ``read_safetensors``; every name split with ``split_peft_name``;
    4. any module whose short name is not one of the seven: ONE error
       listing them all, with upstream's words "expected target modules in
       ... but received ...";
    5. per module: a decoder layer in ``[0, num_hidden_layers)`` (message
       names the module), both ``lora_A`` and ``lora_B`` present, shapes
       ``[r, in]`` and ``[out, r]`` from ``module_shapes`` (message names
       ``lora_A`` or ``lora_B``, the module and both shapes).

    The result: ``rank = r``; ``scaling = lora_scaling(r, lora_alpha,
    use_rslora)``; for each module, A as float32 and ``B * np.float32(scaling)``
    as float32 (one multiplication, as ``LoRALayerWeights.optimize`` does),
    placed at ``packed_location`` of its module. The arrays are copies: the
    file's memory map is not kept.
    """
    check_positive_int(max_lora_rank, "max_lora_rank")
    folder = pathlib.Path(path)
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"path {str(folder)!r} has no adapter_config.json (PEFT's adapter folder)")
    adapter_config = json.loads(config_file.read_text(encoding="utf-8"))
    validate_adapter_config(adapter_config, max_lora_rank)  # refuse before reading any tensor
    r = adapter_config["r"]
    scaling = lora_scaling(r, adapter_config["lora_alpha"], bool(adapter_config.get("use_rslora", False)))

    tensor_file = folder / "adapter_model.safetensors"
    if not tensor_file.is_file():
        raise ValueError(f"{folder} has no adapter_model.safetensors")
    tensors = read_safetensors(tensor_file)
    names = {name: split_peft_name(name) for name in tensors}
    unknown = sorted({p.module for p in names.values() if p.short not in SUPPORTED_MODULES})
    if unknown:
        raise ValueError(f"While loading {folder}, expected target modules in {list(SUPPORTED_MODULES)} "
                         f"but received {unknown}. Please verify that the loaded LoRA module is correct")

    found: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for name, p in names.items():
        if p.layer is None or p.layer >= config.num_hidden_layers:
            raise ValueError(f"module {p.module!r} is not in the base model "
                             f"(layers 0 to {config.num_hidden_layers - 1})")
        found.setdefault((p.layer, p.short), {})[p.which] = tensors[name]

    shapes = module_shapes(config)
    modules: dict[tuple[int, str], list[Pair | None]] = {}
    for (layer, short), ab in sorted(found.items()):
        where = f"model.layers.{layer}.{short}"
        for which in "AB":
            if which not in ab:
                raise ValueError(f"{where} has no lora_{which} (an adapter module needs both lora_A and lora_B)")
        in_f, out_f = shapes[short]
        a, b = ab["A"], ab["B"]
        if a.shape != (r, in_f):
            raise ValueError(f"{where}: lora_A has shape {list(a.shape)}, expected [r, in] = {[r, in_f]}")
        if b.shape != (out_f, r):
            raise ValueError(f"{where}: lora_B has shape {list(b.shape)}, expected [out, r] = {[out_f, r]}")
        packed, index = packed_location(short)
        slots = modules.setdefault((layer, packed), [None] * len(PACKED_MODULES[packed]))
        # Fold the scaling into B once, here; the batched kernels then run with scale 1.0.
        slots[index] = (np.array(a, dtype=np.float32), (b * np.float32(scaling)).astype(np.float32))
    return Adapter(rank=r, scaling=scaling, modules=modules)


def merged_weights(base_weights: Weights, adapter: Adapter, config: ModelConfig) -> Weights:
    """The dense weights the adapter stands for: each trained slice becomes ``W + (B @ A).T``.

    mini_vllm stores a linear layer ``[in, out]`` (``y = x @ W``), so slice i
    of a fused module is the column range ``offset_i .. offset_i + size_i``
    with ``size_i = packed_slices(config)[packed][i]`` and ``offset_i`` the sum
    of the sizes before it. ``base_weights`` is not modified: the result is a
    new ``Weights`` whose untouched arrays may be shared with it. A key of
    ``adapter.modules`` whose layer the weights lack: ValueError naming
    ``adapter``.
    """
    sizes = packed_slices(config)
    for layer, packed in adapter.modules:
        if not 0 <= layer < len(base_weights.layers) or packed not in PACKED_MODULES:
            raise ValueError(f"adapter has module ({layer}, {packed!r}), which base_weights lacks")
    layers = []
    for i, lw in enumerate(base_weights.layers):
        changed = {}
        for packed in PACKED_MODULES:
            slots = adapter.modules.get((i, packed))
            if slots is None:
                continue
            w = np.array(getattr(lw, packed), dtype=np.float32)  # a copy: the base stays as it was
            offset = 0
            for pair, size in zip(slots, sizes[packed], strict=True):
                if pair is not None:
                    a, b = pair
                    w[:, offset:offset + size] += (b @ a).T  # [out_i, in] -> mini_vllm's [in, out_i]
                offset += size
            changed[packed] = w
        layers.append(replace(lw, **changed))
    return replace(base_weights, layers=layers)
