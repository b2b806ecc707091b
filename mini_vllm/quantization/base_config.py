"""The three objects every quantization format plugs into: layer, method, config.

vLLM keeps "how a linear layer stores and multiplies its weight" out of the
model code. The model builds each linear layer and asks the checkpoint's
``QuantizationConfig`` for a ``QuantizeMethodBase`` for it; from then on the
method owns the layer's weight. Its life has three calls, in this order::

    method.create_weights(layer, input_size, output_size)  # declare the storage
    <the loader puts the checkpoint's weight in layer.weight>
    method.process_weights_after_loading(layer)            # quantize, pack, transpose
    y = method.apply(layer, x, bias)                       # every forward

mini_vllm only quantizes *online*: it reads a float32 checkpoint and turns
each weight into the method's format in ``process_weights_after_loading``, as
vLLM does for ``quantization="fp8"`` on a bf16 model. So ``create_weights``
always declares a float32 ``weight`` of shape ``[output_size, input_size]``
(torch's ``F.linear`` layout, upstream's too); the loader binds the
checkpoint's array to it (a view, no copy) after checking the shape. The
embedding and the LM head are never quantized here.

upstream: vllm/model_executor/layers/quantization/base_config.py:19 QuantizeMethodBase
upstream: vllm/model_executor/layers/quantization/base_config.py:70 QuantizationConfig
upstream: vllm/model_executor/layers/linear.py:182 UnquantizedLinearMethod
upstream: vllm/model_executor/layers/linear.py:231 LinearBase
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class LinearLayer:
    """One linear layer: sizes, a name, a bias, and whatever its method stores.

    ``layer(x)`` is ``layer.quant_method.apply(layer, x, layer.bias)`` with x
    ``[T, input_size]`` float32 and the result ``[T, output_size]`` float32.
    Plays the part of upstream's ``LinearBase`` without the parallelism.
    """

    def __init__(self, input_size: int, output_size: int, prefix: str = "",
                 bias: np.ndarray | None = None) -> None:
        for name, value in (("input_size", input_size), ("output_size", output_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if bias is not None and np.shape(bias) != (output_size,):
            raise ValueError(f"bias must have shape ({output_size},) (output_size), "
                             f"got {np.shape(bias)}")
        self.input_size = input_size
        self.output_size = output_size
        self.prefix = prefix
        self.bias = bias
        self.quant_method: QuantizeMethodBase | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.quant_method.apply(self, x, self.bias)

    def weight_bytes(self) -> int:
        """Bytes of every array the method keeps on the layer (the bias is not counted)."""
        return sum(v.nbytes for k, v in vars(self).items()
                   if isinstance(v, np.ndarray) and k != "bias")

    def __repr__(self) -> str:
        method = type(self.quant_method).__name__ if self.quant_method else None
        return (f"LinearLayer({self.prefix!r}, in={self.input_size}, out={self.output_size}, "
                f"method={method})")


class QuantizeMethodBase(ABC):
    """How a layer stores its weight and multiplies by it."""

    @abstractmethod
    def create_weights(self, layer: LinearLayer, input_size: int, output_size: int) -> None:
        """Declare the layer's storage; at least ``layer.weight``: float32 [output_size, input_size]."""

    @abstractmethod
    def apply(self, layer: LinearLayer, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """x [T, input_size] float32 -> [T, output_size] float32, bias added when given."""

    def process_weights_after_loading(self, layer: LinearLayer) -> None:  # noqa: B027
        """Turn the loaded float32 ``layer.weight`` into this method's format (default: keep it)."""


class LinearMethodBase(QuantizeMethodBase):
    """Base class for the methods of linear layers (upstream keeps the same split).

    Every method here quantizes online, so each starts from the same float32
    placeholder; a method overrides ``create_weights`` only to check more.
    """

    def create_weights(self, layer: LinearLayer, input_size: int, output_size: int) -> None:
        layer.weight = np.empty((output_size, input_size), dtype=np.float32)


class UnquantizedLinearMethod(LinearMethodBase):
    """The float32 weight as loaded: ``x @ W.T``.

    ``layer.weight`` is the transposed *view* of the model's ``[in, out]``
    array, so ``layer.weight.T`` is that array again, strides and all: this
    path computes exactly what the model computed before quantization existed.
    """

    def apply(self, layer: LinearLayer, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        out = x @ layer.weight.T
        if bias is not None:
            out += bias
        return out


class QuantizationConfig(ABC):
    """A quantization format: its name, its options, and the method for each layer."""

    @abstractmethod
    def get_name(self) -> str:
        """The name it is registered under (what ``quantization=`` takes)."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict) -> QuantizationConfig:
        """Build from the options dict (``quantization_config=``); unknown keys are an error."""

    @abstractmethod
    def get_quant_method(self, layer: LinearLayer, prefix: str) -> QuantizeMethodBase:
        """The method for the layer named ``prefix`` (e.g. ``model.layers.3.mlp.down_proj``).

        Return ``UnquantizedLinearMethod()`` to leave a layer in float32; as in
        upstream's ``LinearBase``, returning None for a linear layer is an error.
        """


def check_options(name: str, config: dict, allowed: tuple[str, ...]) -> None:
    """Refuse a ``quantization_config`` that is not a dict or has keys the format does not know."""
    if not isinstance(config, dict):
        raise ValueError(f"quantization_config must be a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"quantization_config for {name!r} has unknown keys {unknown}; "
                         f"allowed: {list(allowed) or 'none'}")
