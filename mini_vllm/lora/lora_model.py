"""An adapter in memory: one (A, B) pair per adapted module, read from PEFT's files.

PEFT saves an adapter as a folder with ``adapter_config.json`` (rank, alpha,
target modules, ...) and ``adapter_model.safetensors``, whose tensors are named
after the Hugging Face module they adapt::

    base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight   [out, r]

so that module ``W`` (``y = x @ W.T`` in torch's layout) becomes
``y = x @ W.T + scaling * (x @ A.T) @ B.T``. mini_vllm, like vLLM, runs q/k/v
as one packed ``qkv_proj`` and gate/up as one ``gate_up_proj``; an adapter's
``q_proj`` pair therefore lands on the first output slice of ``qkv_proj``
(``packed_modules``), and a slice the adapter does not train stays zero.

At load the scaling is folded into B (``LoRALayerWeights.optimize``), so the
batched kernels multiply by 1.0, as vLLM's do.

upstream: vllm/lora/lora_weights.py:13 LoRALayerWeights
upstream: vllm/lora/lora_weights.py:36 optimize
upstream: vllm/lora/lora_model.py:167 from_local_checkpoint
"""
from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass

import numpy as np

from mini_vllm.lora.peft_helper import PEFTHelper
from mini_vllm.models.config import ModelConfig
from mini_vllm.models.loader import read_safetensors, write_safetensors

# mini_vllm's packed module -> the Hugging Face modules stacked in its output, in order.
PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
SUPPORTED_LORA_MODULES = frozenset(m for parts in PACKED_MODULES.values() for m in parts)
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_NAME_RE = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every module an adapter may target."""
    h, f = config.hidden_size, config.intermediate_size
    return {"q_proj": (h, config.q_size), "k_proj": (h, config.kv_size), "v_proj": (h, config.kv_size),
            "o_proj": (config.q_size, h), "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


@dataclass
class LoRALayerWeights:
    """One adapted module: ``lora_a`` [r, in], ``lora_b`` [out, r] (float32), and its scaling."""

    module_name: str
    rank: int
    lora_a: np.ndarray
    lora_b: np.ndarray
    scaling: float = 1.0

    def optimize(self) -> LoRALayerWeights:
        """Fold the scaling into B, so applying the adapter needs no multiplication by it."""
        if self.scaling != 1:
            self.lora_b = (self.lora_b * np.float32(self.scaling)).astype(np.float32)
            self.scaling = 1.0
        return self

    def delta(self) -> np.ndarray:
        """The dense update this pair adds to the weight, ``scaling * B @ A`` [out, in]."""
        return np.float32(self.scaling) * (self.lora_b @ self.lora_a)


@dataclass
class LoRAModel:
    """An adapter: its id, its rank, and its (A, B) pairs keyed by Hugging Face module name."""

    id: int
    rank: int
    loras: dict[str, LoRALayerWeights]

    def get_lora(self, module_name: str) -> LoRALayerWeights | None:
        return self.loras.get(module_name)

    def packed(self, layer: int, packed_name: str) -> list[LoRALayerWeights | None]:
        """The pairs of mini_vllm's packed module, one per output slice (None: not adapted)."""
        return [self.loras.get(f"model.layers.{layer}.{_PARENT[m]}.{m}") for m in PACKED_MODULES[packed_name]]

    @classmethod
    def from_local_checkpoint(cls, lora_dir: str | pathlib.Path, config: ModelConfig, *, lora_model_id: int,
                              max_lora_rank: int) -> LoRAModel:
        """Read a PEFT folder and check it against the base model's ``config``.

        Raises ``ValueError`` for what cannot be served: a rank over
        ``max_lora_rank``, DoRA, ``modules_to_save``, biases, a target module
        that is not one of the seven projections (upstream's message), a layer
        the model lacks, a tensor of the wrong shape, a missing A or B, or
        per-module rank/alpha patterns.
        """
        lora_dir = pathlib.Path(lora_dir)
        if not lora_dir.is_dir():
            raise ValueError(f"lora_path {str(lora_dir)!r} is not a folder")
        peft = PEFTHelper.from_local_dir(lora_dir)
        peft.validate_legal(max_lora_rank)
        raw = json.loads((lora_dir / "adapter_config.json").read_text(encoding="utf-8"))
        for key in ("rank_pattern", "alpha_pattern"):
            if raw.get(key):
                raise ValueError(f"{lora_dir}: adapter_config.json sets {key}; mini_vllm applies one rank and "
                                 f"one alpha to every module")
        tensor_path = lora_dir / "adapter_model.safetensors"
        if not tensor_path.is_file():
            raise ValueError(f"{lora_dir} doesn't contain tensors (expected adapter_model.safetensors)")
        tensors = read_safetensors(tensor_path)

        pairs: dict[str, dict[str, np.ndarray]] = {}
        unexpected = []
        for name, array in tensors.items():
            match = _NAME_RE.match(name)
            module = match["module"] if match else name
            if match is None or module.rsplit(".", 1)[-1] not in SUPPORTED_LORA_MODULES:
                unexpected.append(module)
                continue
            pairs.setdefault(module, {})[match["ab"]] = array
        if unexpected:
            raise ValueError(f"While loading {lora_dir}, expected target modules in "
                             f"{sorted(SUPPORTED_LORA_MODULES)} but received {sorted(set(unexpected))}. "
                             f"Please verify that the loaded LoRA module is correct")
        shapes = module_shapes(config)
        loras: dict[str, LoRALayerWeights] = {}
        for module, ab in sorted(pairs.items()):
            short = module.rsplit(".", 1)[-1]
            layer = re.fullmatch(rf"model\.layers\.(\d+)\.{_PARENT[short]}\.{short}", module)
            if layer is None or int(layer[1]) >= config.num_hidden_layers:
                raise ValueError(f"{lora_dir}: module {module!r} is not in the base model "
                                 f"(model.layers.0-{config.num_hidden_layers - 1}.{_PARENT[short]}.{short})")
            if set(ab) != {"A", "B"}:
                raise ValueError(f"{lora_dir}: module {module!r} has lora_{''.join(ab)} but not both A and B")
            in_f, out_f = shapes[short]
            a, b = ab["A"].astype(np.float32), ab["B"].astype(np.float32)  # copies, not views of the mapped file
            if a.shape != (peft.r, in_f) or b.shape != (out_f, peft.r):
                raise ValueError(f"{lora_dir}: {module} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; "
                                 f"the base model and r = {peft.r} need {[peft.r, in_f]} and {[out_f, peft.r]}")
            loras[module] = LoRALayerWeights(module, peft.r, a, b, peft.vllm_lora_scaling_factor).optimize()
        return cls(lora_model_id, peft.r, loras)


def write_peft_adapter(path: str | pathlib.Path, config: ModelConfig, *, r: int = 8, lora_alpha: float = 16,
                       target_modules: tuple[str, ...] = tuple(PACKED_MODULES["qkv_proj"]),
                       seed: int = 0, std: float = 0.5, use_rslora: bool = False,
                       extra_config: dict | None = None) -> pathlib.Path:
    """Write a random adapter for ``config`` in PEFT's on-disk format, every layer adapted.

    A and B are both non-zero (PEFT initialises B to zero, which would make
    the adapter a no-op), N(0, std^2 / fan_in), seeded. PEFT's
    ``PeftModel.from_pretrained`` reads the folder; so does
    ``LoRAModel.from_local_checkpoint``.
    """
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = module_shapes(config)
    tensors = {}
    for i in range(config.num_hidden_layers):
        for m in target_modules:
            in_f, out_f = shapes[m]
            prefix = f"base_model.model.model.layers.{i}.{_PARENT[m]}.{m}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((r, in_f)) * std / np.sqrt(in_f)
                                                  ).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out_f, r)) * std / np.sqrt(r)
                                                  ).astype(np.float32)
    adapter_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": lora_alpha,
                      "target_modules": list(target_modules), "lora_dropout": 0.0, "bias": "none",
                      "use_rslora": use_rslora, "use_dora": False, "modules_to_save": None,
                      "fan_in_fan_out": False, "inference_mode": True, **(extra_config or {})}
    (path / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1), encoding="utf-8")
    write_safetensors(path / "adapter_model.safetensors", tensors)
    return path
