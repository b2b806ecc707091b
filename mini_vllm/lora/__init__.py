"""Multi-LoRA serving for mini_vllm (Phase 11): many adapters over one base model, in one batch.

``LoRARequest`` is imported eagerly (the engine needs it); the rest loads on first use.
"""
from importlib import import_module

from mini_vllm.lora.request import LoRARequest

_LAZY = {
    "LRUCacheLoRAModelManager": "mini_vllm.lora.model_manager",
    "LoRALayerWeights": "mini_vllm.lora.lora_model",
    "LoRAModel": "mini_vllm.lora.lora_model",
    "write_peft_adapter": "mini_vllm.lora.lora_model",
    "PEFTHelper": "mini_vllm.lora.peft_helper",
    "PunicaWrapperNumpy": "mini_vllm.lora.punica",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mini_vllm.lora' has no attribute {name!r}")


__all__ = ["LoRARequest", *_LAZY]
