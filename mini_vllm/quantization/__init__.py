"""Quantized linear layers: a registry of formats, each a config that hands out methods.

``LLMEngine(model, quantization="int8")`` looks the name up here, builds the
config (``from_config(quantization_config or {})``) and passes it to the model,
which asks it for a method for each linear layer (``get_quant_method``).
Built in:

================  =====================================================  ======================
name              weights / activations                                  bits per weight stored
================  =====================================================  ======================
``"int8"``        int8, one float32 scale per output channel / float32   8 + 32 / in_features
``"int4"``        int4, one float16 scale per group of inputs / float32  4 + 16 / group_size
``"fp8"``         FP8 E4M3, one scale per tensor / FP8 per token         8 + 32 / (in * out)
================  =====================================================  ======================

A format of your own is a ``QuantizationConfig`` subclass registered with
``@register_quantization_config("name")``, exactly as in vLLM; registering a
name again replaces the earlier class (upstream warns and does the same).

upstream: vllm/model_executor/layers/quantization/__init__.py:59 register_quantization_config
upstream: vllm/model_executor/layers/quantization/__init__.py:109 get_quantization_config
"""
from __future__ import annotations

from mini_vllm.quantization.base_config import (
    LinearLayer,
    LinearMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
    UnquantizedLinearMethod,
)
from mini_vllm.quantization.fp8 import Fp8Config, Fp8LinearMethod
from mini_vllm.quantization.int4 import Int4GroupConfig, Int4GroupLinearMethod
from mini_vllm.quantization.int8 import Int8Config, Int8LinearMethod

__all__ = [
    "QUANTIZATION_METHODS",
    "Fp8Config",
    "Fp8LinearMethod",
    "Int4GroupConfig",
    "Int4GroupLinearMethod",
    "Int8Config",
    "Int8LinearMethod",
    "LinearLayer",
    "LinearMethodBase",
    "QuantizationConfig",
    "QuantizeMethodBase",
    "UnquantizedLinearMethod",
    "get_quantization_config",
    "make_quant_config",
    "register_quantization_config",
]

_REGISTRY: dict[str, type[QuantizationConfig]] = {
    "int8": Int8Config,
    "int4": Int4GroupConfig,
    "fp8": Fp8Config,
}
QUANTIZATION_METHODS: list[str] = list(_REGISTRY)


def register_quantization_config(quantization: str):
    """Class decorator: make ``quantization=<name>`` build this config class."""
    if not isinstance(quantization, str) or not quantization:
        raise ValueError(f"quantization must be a non-empty string, got {quantization!r}")

    def wrapper(config_cls: type) -> type:
        if not (isinstance(config_cls, type) and issubclass(config_cls, QuantizationConfig)):
            raise ValueError(f"the quantization config must be a subclass of QuantizationConfig, "
                             f"got {config_cls!r}")
        if quantization not in _REGISTRY:
            QUANTIZATION_METHODS.append(quantization)
        _REGISTRY[quantization] = config_cls
        return config_cls

    return wrapper


def get_quantization_config(quantization: str) -> type[QuantizationConfig]:
    """The config class registered under ``quantization``."""
    if quantization not in _REGISTRY:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} "
                         f"(or a name registered with register_quantization_config), "
                         f"got {quantization!r}")
    return _REGISTRY[quantization]


def make_quant_config(quantization: str | None,
                      quantization_config: dict | None = None) -> QuantizationConfig | None:
    """``quantization`` and its options as a config object; None when both are None."""
    if quantization is None:
        if quantization_config is not None:
            raise ValueError("quantization_config needs quantization= (the format it configures), "
                             f"got quantization=None with {quantization_config!r}")
        return None
    config = get_quantization_config(quantization).from_config(
        {} if quantization_config is None else quantization_config)
    if not isinstance(config, QuantizationConfig):
        raise ValueError(f"{quantization!r}.from_config must return a QuantizationConfig, "
                         f"got {type(config).__name__}")
    return config
