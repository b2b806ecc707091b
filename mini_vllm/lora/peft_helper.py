"""PEFTHelper: the fields of ``adapter_config.json`` that decide how an adapter is applied.

The scaling is the one number people get wrong: PEFT multiplies ``B @ A`` by
``lora_alpha / r``, or by ``lora_alpha / sqrt(r)`` when the adapter was trained
with rank-stabilized LoRA (``use_rslora``). vLLM reads the same two fields and
refuses what it cannot serve: DoRA, ``modules_to_save`` and adapter biases.

upstream: vllm/lora/peft_helper.py:20 PEFTHelper
upstream: vllm/lora/peft_helper.py:53 __post_init__
upstream: vllm/lora/peft_helper.py:114 validate_legal
"""
from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass, field, fields


@dataclass
class PEFTHelper:
    r: int
    lora_alpha: float
    target_modules: list[str] | str
    bias: str = "none"
    modules_to_save: list[str] | None = None
    use_rslora: bool = False
    use_dora: bool = False
    vllm_lora_scaling_factor: float = field(default=1.0)

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"adapter_config.json: r must be an integer >= 1, got {self.r!r}")
        if isinstance(self.lora_alpha, bool) or not isinstance(self.lora_alpha, int | float):
            raise ValueError(f"adapter_config.json: lora_alpha must be a number, got {self.lora_alpha!r}")
        root = math.sqrt(self.r) if self.use_rslora else self.r
        self.vllm_lora_scaling_factor = self.lora_alpha / root

    @classmethod
    def from_dict(cls, config: dict) -> PEFTHelper:
        names = {f.name for f in fields(cls)} - {"vllm_lora_scaling_factor"}
        missing = sorted({"r", "lora_alpha", "target_modules"} - set(config))
        if missing:
            raise ValueError(f"adapter_config.json lacks the required field(s) {missing}")
        return cls(**{k: v for k, v in config.items() if k in names})

    @classmethod
    def from_local_dir(cls, lora_path: str | pathlib.Path) -> PEFTHelper:
        path = pathlib.Path(lora_path) / "adapter_config.json"
        if not path.is_file():
            raise ValueError(f"lora_path {str(lora_path)!r} has no adapter_config.json (PEFT's format: "
                             f"adapter_config.json + adapter_model.safetensors)")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def validate_legal(self, max_lora_rank: int) -> None:
        """Refuse, in one message, everything about this adapter vLLM would refuse."""
        errors = []
        if self.modules_to_save:
            errors.append("vLLM only supports modules_to_save being None.")
        if self.use_dora:
            errors.append("vLLM does not yet support DoRA.")
        if self.r > max_lora_rank:
            errors.append(f"LoRA rank {self.r} is greater than max_lora_rank {max_lora_rank}.")
        if self.bias != "none":
            errors.append("Adapter bias is not supported.")
        if errors:
            raise ValueError(" ".join(errors))
