"""LoRARequest: which adapter a request runs with.

Three fields, as in vLLM: a name, an integer id, and the folder that holds the
adapter in PEFT's format. The id is what the scheduler and the adapter slots
count by; the name is what the prefix cache mixes into block hashes, so two
requests with the same prompt under different adapters never share KV. Ids
start at 1: "no adapter" is not an id but the absence of a LoRARequest (and,
inside a batch, the slot index -1).

Like upstream, two requests are equal when their names are equal.

upstream: vllm/lora/request.py:8 LoRARequest
upstream: vllm/lora/request.py:40 __post_init__
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty str, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1 (id must be > 0), got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str | os.PathLike) or not str(self.lora_path):
            raise ValueError(f"lora_path must be a non-empty path to the adapter's folder, got {self.lora_path!r}")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return str(self.lora_path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
