"""Lab 11-03 — LoRA economics: adapter size, shrink ratio and vLLM's slots (your implementation).

A LoRA adapter replaces the update of one linear layer, ``out x in`` numbers,
by two thin factors: ``A`` of shape ``(r, in)`` and ``B`` of shape
``(out, r)``, so ``r * (in + out)`` numbers. Everything a multi-LoRA
deployment is sold on follows from that count: an adapter is hundreds of times
smaller than its base model, many adapters share one copy of the base, and the
extra arithmetic per token is about one percent. This lab turns those claims
into functions with exact answers, for real model shapes (Llama-2-7B, and
Llama-3-8B whose grouped-query attention makes ``k_proj``/``v_proj`` four
times narrower than ``q_proj``):

* ``lora_params_per_layer``, ``linear_shapes``, ``adapter_params`` and
  ``adapter_bytes``: the size of a PEFT adapter, for an explicit set of PEFT
  module names (``q_proj`` ... ``down_proj``);
* ``shrink_ratio``: the one definition of "how much smaller", base parameters
  over adapter parameters (417x for a nominal 7e9, 402x for Llama-2-7B's real
  6,738,415,616);
* ``gpus_saved``: dedicated merged copies against shared engines, defined
  precisely;
* ``flops_per_token`` and ``serving_plan``: the extra arithmetic of an
  unmerged adapter against the merged-weights alternative;
* ``slot_elements`` and ``slot_reservation_bytes``: the memory vLLM allocates
  at start-up for ``max_loras`` slots of rank ``max_lora_rank`` in every
  wrapped layer, whether or not an adapter is ever loaded.

upstream: vllm/lora/layers/base_linear.py:99 create_lora_weights
upstream: vllm/lora/layers/column_parallel_linear.py:205 create_lora_weights
upstream: vllm/lora/model_manager.py:375 _create_lora_modules
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import NamedTuple

MiB = 1024 * 1024
GiB = 1024 * MiB

# PEFT's names for the seven linear layers of a Llama decoder layer.
PEFT_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")

# vLLM's runtime names. It fuses q/k/v into qkv_proj and gate/up into gate_up_proj
# (LlamaForCausalLM.packed_modules_mapping) and also wraps the two embedding modules
# (LlamaForCausalLM.embedding_modules).
VLLM_PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
VLLM_LORA_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "embed_tokens", "lm_head")
VLLM_PER_LAYER_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")

# LoRAConfig.max_lora_rank accepts only these values (config/lora.py MaxLoRARanks).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# ---------------------------------------------------------------- given helpers


def _check_int(value, name: str, low: int) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_positive(value, name: str) -> float:
    """Given. ``value`` as a float; ValueError naming ``name`` unless it is a finite real > 0."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Given. The shape of a Llama-style decoder, with Hugging Face's config field names.

    ``head_dim`` defaults to ``hidden_size // num_attention_heads``. The query
    projection is ``num_attention_heads * head_dim`` wide, the key and value
    projections ``num_key_value_heads * head_dim`` (narrower under GQA).
    Input and output embeddings are untied. Raises ValueError naming the field
    when a field is not an integer >= 1, or when ``num_attention_heads`` is not
    a multiple of ``num_key_value_heads``.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "head_dim" and value is None:
                if self.hidden_size % self.num_attention_heads:
                    raise ValueError("head_dim must be given when hidden_size is not a "
                                     "multiple of num_attention_heads")
                object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
                continue
            _check_int(value, field.name, 1)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads, got "
                             f"{self.num_key_value_heads} and {self.num_attention_heads}")

    @classmethod
    def from_hf(cls, config) -> ModelShape:
        """Read the fields from a transformers ``LlamaConfig`` (or any object with them)."""
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                   config.num_attention_heads, config.num_key_value_heads, config.vocab_size,
                   getattr(config, "head_dim", None))


# Hugging Face configs of meta-llama/Llama-2-7b-hf and meta-llama/Meta-Llama-3-8B.
LLAMA_2_7B = ModelShape(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
LLAMA_3_8B = ModelShape(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)


def base_model_params(shape: ModelShape) -> int:
    """Given. Parameters of the whole base model: embedding, decoder layers, final norm, lm_head.

    Per layer: the seven projections (no biases) and two RMSNorm weight vectors.
    6,738,415,616 for Llama-2-7B, 8,030,261,248 for Llama-3-8B.
    """
    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return 2 * shape.vocab_size * h + shape.num_hidden_layers * per_layer + h


def _check_targets(target_modules, allowed, name: str = "target_modules") -> frozenset:
    """Given. The set of names in ``target_modules``; ValueError naming ``name`` when it is a
    bare string, empty, or holds a name outside ``allowed``. Duplicates collapse."""
    if isinstance(target_modules, str) or not hasattr(target_modules, "__iter__"):
        raise ValueError(f"{name} must be a collection of module names such as "
                         f"('q_proj', 'v_proj'), got {target_modules!r}")
    names = frozenset(target_modules)
    unknown = sorted(str(n) for n in names - frozenset(allowed))
    if not names or unknown:
        raise ValueError(f"{name} must be a non-empty subset of {list(allowed)}, "
                         f"got unknown {unknown}" if unknown else f"{name} must not be empty")
    return names


# ---------------------------------------------------------------- adapter size


def lora_params_per_layer(in_features: int, out_features: int, r: int) -> int:
    """Parameters of one LoRA pair on a linear layer of ``in_features -> out_features``.

    ``A`` is ``(r, in_features)``, ``B`` is ``(out_features, r)``: the count is
    ``r * (in_features + out_features)``. 131,072 for a 4096 x 4096 projection
    at r = 16 (the layer itself has 16,777,216 weights: 128 times more).

    All three arguments are integers >= 1. Raises ValueError naming
    ``in_features``, ``out_features`` or ``r``.
    """
    raise NotImplementedError("lora_params_per_layer: "
                              "validate the three ints, then r times (in + out)")


def linear_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each of the seven projections of one decoder layer.

    Keys are ``PEFT_LINEAR_MODULES``. With ``d = head_dim``:
    ``q_proj`` hidden -> heads*d, ``k_proj`` and ``v_proj`` hidden -> kv_heads*d,
    ``o_proj`` heads*d -> hidden, ``gate_proj`` and ``up_proj`` hidden ->
    intermediate, ``down_proj`` intermediate -> hidden. For Llama-3-8B,
    ``k_proj`` is ``(4096, 1024)``, not ``(4096, 4096)``.
    """
    raise NotImplementedError("linear_shapes: "
                              "q is heads*head_dim wide, k and v kv_heads*head_dim")


def adapter_params(shape: ModelShape, r: int, target_modules) -> int:
    """Parameters of a PEFT LoRA adapter of rank ``r`` on ``target_modules`` in every layer.

    ``target_modules``: a collection (not a bare string) of names from
    ``PEFT_LINEAR_MODULES``, as in ``peft.LoraConfig(target_modules=[...])``;
    a name given twice counts once. Sums ``lora_params_per_layer`` over the
    targeted modules of one layer, times ``num_hidden_layers``.
    Llama-2-7B, r = 16, the four attention projections: 16,777,216.

    Raises ValueError naming ``r`` (integer >= 1) or ``target_modules``
    (empty, a string, or an unknown name).
    """
    raise NotImplementedError("adapter_params: "
                              "sum lora_params_per_layer over the targets, times layers")


def adapter_bytes(shape: ModelShape, r: int, target_modules, dtype_bytes: int = 2) -> int:
    """Bytes of the adapter's weights: ``adapter_params * dtype_bytes`` (2 for bf16/fp16).

    Llama-2-7B, r = 16, attention projections, bf16: 33,554,432 B = 32 MiB.
    Raises ValueError naming ``r``, ``target_modules`` or ``dtype_bytes``
    (integer >= 1).
    """
    raise NotImplementedError("adapter_bytes: adapter_params times dtype_bytes")


def shrink_ratio(base_params: float, adapter_params: float) -> float:
    """How many times smaller the adapter is: ``base_params / adapter_params``.

    The one definition of the phase: a ratio of parameter counts (the same as
    a ratio of bytes when both are stored in one dtype). 7e9 / 16,777,216 =
    417.2 (a nominal "7B"); 6,738,415,616 / 16,777,216 = 401.6 (Llama-2-7B's
    real count). Both arguments are finite reals > 0; raises ValueError naming
    ``base_params`` or ``adapter_params``.
    """
    raise NotImplementedError("shrink_ratio: base parameters over adapter parameters")


def gpus_saved(num_adapters: int, max_loras: int, gpus_per_model: int = 1) -> int:
    """GPUs saved by serving ``num_adapters`` fine-tunes from shared engines.

    Dedicated: one merged model copy per adapter, ``num_adapters *
    gpus_per_model`` GPUs. Shared: each engine holds the base once and keeps
    ``max_loras`` adapters resident in its slots, so every adapter can be
    served without a swap by ``ceil(num_adapters / max_loras)`` engines of
    ``gpus_per_model`` GPUs each. Returns dedicated minus shared. (A floor on
    memory only: it says nothing about whether that many engines carry the
    traffic.) ``gpus_saved(100, 8) == 100 - 13 == 87``.

    num_adapters: integer >= 0; max_loras, gpus_per_model: integers >= 1.
    Raises ValueError naming the parameter.
    """
    raise NotImplementedError("gpus_saved: "
                              "dedicated copies minus ceil(N / max_loras) engines")


# ---------------------------------------------------------------- compute


def flops_per_token(in_features: int, out_features: int, r: int) -> tuple[int, int]:
    """``(base, lora)`` FLOPs one token costs in one linear layer.

    The base matmul is ``2 * in * out`` (a multiply and an add per weight);
    the unmerged adapter adds a shrink ``x @ A.T`` (``2 * r * in``) and an
    expand ``@ B.T`` (``2 * r * out``): ``2 * r * (in + out)``. For 4096 x
    4096 at r = 16: (33,554,432, 262,144), a 1/128 overhead. Raises
    ValueError naming ``in_features``, ``out_features`` or ``r``.
    """
    raise NotImplementedError("flops_per_token: (2 * in * out, 2 * r * (in + out))")


class ServingPlan(NamedTuple):
    """What keeping ``num_adapters`` fine-tunes ready costs (see ``serving_plan``)."""

    weight_bytes: int
    projection_flops_per_token: int


def serving_plan(shape: ModelShape, r: int, target_modules, num_adapters: int, merged: bool,
                 dtype_bytes: int = 2) -> ServingPlan:
    """Weights held and projection FLOPs per token, unmerged adapters against merged copies.

    Unmerged (``merged=False``): one base plus ``num_adapters`` adapters,
    ``base_model_params * dtype_bytes + num_adapters * adapter_bytes``; a token
    of an adapted request pays the base projections plus the LoRA FLOPs of
    every targeted module. Merged (``merged=True``): each fine-tune is its own
    model with ``W + scaling * B @ A`` baked in, ``num_adapters *
    base_model_params * dtype_bytes`` bytes, and a token pays the base
    projections only: zero extra FLOPs.

    Projection FLOPs: the seven linear layers of every decoder layer (not the
    attention scores, not ``lm_head``), ``sum of flops_per_token`` over them.
    num_adapters: integer >= 1; merged: a bool. Raises ValueError naming
    ``r``, ``target_modules``, ``num_adapters``, ``merged`` or ``dtype_bytes``.
    """
    raise NotImplementedError("serving_plan: "
                              "merged: N bases, no extra FLOPs; else one base + N adapters")


# ---------------------------------------------------------------- vLLM's slots


def slot_elements(shape: ModelShape, max_lora_rank: int, target_modules=None) -> dict[str, int]:
    """Elements ONE slot of vLLM's stacked LoRA buffers holds, per wrapped module.

    vLLM allocates, for each wrapped module, ``lora_a_stacked`` and
    ``lora_b_stacked`` with ``max_loras`` as the leading dimension and
    ``max_lora_rank`` in place of the adapter's rank (TP = 1, the default
    ``fully_sharded_loras=False``):

    * ``qkv_proj`` (three slices q, k, v): A ``3 x (R, hidden)``, B ``(q, R)``,
      ``(kv, R)``, ``(kv, R)``;
    * ``gate_up_proj`` (two slices): A ``2 x (R, hidden)``, B ``2 x (intermediate, R)``;
    * ``o_proj``: A ``(R, heads*d)``, B ``(hidden, R)``; ``down_proj``: A
      ``(R, intermediate)``, B ``(hidden, R)``;
    * ``embed_tokens``: A ``(vocab, R)``, B ``(hidden, R)``; ``lm_head``: A
      ``(R, hidden)``, B ``(vocab, R)``.

    Returns a dict from the wrapped names to elements per slot: per decoder
    layer for the four projections, for the whole model for the two
    embeddings. ``target_modules=None`` (vLLM's default) wraps all six of
    ``VLLM_LORA_MODULES``; otherwise a collection of runtime names or PEFT
    child names, filtered as ``LoRAConfig.target_modules`` is: a child name
    (``"q_proj"``) wraps its whole packed parent (``qkv_proj``, all three
    slices). Llama-2-7B, R = 16, per layer: qkv 393,216, o 131,072, gate_up
    483,328, down 241,664.

    max_lora_rank: one of ``MAX_LORA_RANKS``. Raises ValueError naming
    ``max_lora_rank`` or ``target_modules``.
    """
    raise NotImplementedError("slot_elements: "
                              "A and B per slice at max_lora_rank; qkv has three A's, gate_up two")


def slot_reservation_bytes(shape: ModelShape, max_loras: int, max_lora_rank: int,
                           dtype_bytes: int = 2, target_modules=None) -> int:
    """Bytes vLLM preallocates for the LoRA stacks of every wrapped module.

    ``max_loras * dtype_bytes * (num_hidden_layers * per-layer elements +
    embedding elements)``, the elements from ``slot_elements``. ``dtype_bytes``
    is the LoRA dtype's size (``lora_dtype="auto"`` is the model's dtype: 2
    for bf16). Llama-2-7B, R = 16, the four projections only: 79,953,920 B
    (76.25 MiB) per slot, 639,631,360 B (610 MiB) at ``max_loras = 8``; with
    vLLM's default target set the embeddings add 2,310,144 B per slot.

    max_loras, dtype_bytes: integers >= 1. Raises ValueError naming
    ``max_loras``, ``max_lora_rank``, ``dtype_bytes`` or ``target_modules``.
    """
    raise NotImplementedError("slot_reservation_bytes: "
                              "max_loras x dtype_bytes x (layers x per-layer + embeddings)")


if __name__ == "__main__":
    attn, rank = ATTENTION_MODULES, 16
    p = adapter_params(LLAMA_2_7B, rank, attn)
    print(f"Llama-2-7B r=16 attention adapter: {p:,} params, "
          f"{adapter_bytes(LLAMA_2_7B, rank, attn):,} B = "
          f"{adapter_bytes(LLAMA_2_7B, rank, attn) / MiB:g} MiB")
    real = base_model_params(LLAMA_2_7B)
    print(f"shrink ratio: nominal 7e9 {shrink_ratio(7e9, p):.1f}x, "
          f"real {real:,} {shrink_ratio(real, p):.1f}x")
    print(f"gpus_saved(100, 8) = {gpus_saved(100, 8)}")
    for name, shape in (("Llama-2-7B", LLAMA_2_7B), ("Llama-3-8B", LLAMA_3_8B)):
        linear = slot_elements(shape, 16, VLLM_PER_LAYER_MODULES)
        per_slot = slot_reservation_bytes(shape, 1, 16, target_modules=VLLM_PER_LAYER_MODULES)
        default = slot_reservation_bytes(shape, 8, 16)
        print(f"{name}: per layer per slot {sum(linear.values()):,} elements; linear per slot "
              f"{per_slot / MiB:g} MiB, x8 {8 * per_slot / MiB:g} MiB; default targets x8 "
              f"{default / MiB:g} MiB")
