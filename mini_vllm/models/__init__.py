"""mini_vllm's data plane: a real Llama / Qwen2 transformer on a paged KV cache.

``get_model(name_or_path)`` is the one entry point the engine uses:

- ``"toy"``: ``mini_vllm.model.ToyModel`` (pseudo-logits, ignores the KV cache);
- ``"tiny-random"``: a seeded random Llama-style model (2 layers, hidden 64,
  4 query heads sharing 2 KV heads, vocab 257 = ByteTokenizer), no files;
- ``"tiny-moe"``: the same with Mixtral's MLP (4 experts, top-2; ``models/moe.py``);
- a named real model from ``hub.MODELS`` (``"smollm2"``: SmolLM2-135M-Instruct),
  fetched once with ``python -m mini_vllm download smollm2``;
- a ``.gguf`` file (Llama architecture), converted once to a folder beside it;
- a local folder with ``config.json`` and ``*.safetensors`` (Llama or Qwen2);
- a hub id (``"org/name"``), downloaded with huggingface_hub when online.

Files: ``config.py`` (ModelConfig), ``attention.py`` (paged write and read),
``llama.py`` (the forward pass), ``loader.py`` (safetensors and name mapping),
``torch_backend.py`` (the same model in torch, on CPU or CUDA: ``backend="torch"``),
``gguf.py`` (GGUF -> Hugging Face folder), ``hub.py`` (named models: download, cache).

upstream: vllm/model_executor/model_loader/default_loader.py:43 DefaultModelLoader
"""
from __future__ import annotations

import importlib.util

from mini_vllm.models.config import (
    ModelConfig,
    ModelConfigError,
    tiny_moe_config,
    tiny_random_config,
)
from mini_vllm.models.llama import LlamaForCausalLM, Weights, random_weights
from mini_vllm.models.loader import WeightLoadError, load_model, load_weights

BACKENDS = ("numpy", "torch")
DEVICES = ("cpu", "cuda")

__all__ = [
    "BACKENDS",
    "DEVICES",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelConfigError",
    "WeightLoadError",
    "Weights",
    "get_model",
    "load_model",
    "load_weights",
    "random_weights",
    "tiny_moe",
    "tiny_moe_config",
    "tiny_random",
    "tiny_random_config",
]


def tiny_moe(seed: int = 0, max_model_len: int | None = None) -> LlamaForCausalLM:
    """tiny-random with Mixtral's MLP: 4 experts, top-2, seeded, ByteTokenizer, no files."""
    from mini_vllm.tokenizer import ByteTokenizer

    config = tiny_moe_config()
    return LlamaForCausalLM(config, random_weights(config, seed), tokenizer=ByteTokenizer(),
                            max_model_len=max_model_len, name="tiny-moe")


def tiny_random(seed: int = 0, max_model_len: int | None = None) -> LlamaForCausalLM:
    """The default real model: seeded random weights, ByteTokenizer, no files."""
    from mini_vllm.tokenizer import ByteTokenizer

    config = tiny_random_config()
    return LlamaForCausalLM(config, random_weights(config, seed), tokenizer=ByteTokenizer(),
                            max_model_len=max_model_len, name="tiny-random")


def get_model(name_or_path: str, seed: int = 0, max_model_len: int | None = None,
              backend: str = "numpy", device: str = "cpu", quantization: str | None = None,
              quantization_config: dict | None = None, **kw):
    """Build the model the engine runs (see the module docstring for the choices).

    ``seed`` seeds tiny-random's (and the toy model's) weights; ``max_model_len``
    caps the context length (default: the config's ``max_position_embeddings``).
    ``backend="torch"`` runs the same transformer, same weights, in PyTorch on
    ``device`` ("cpu" or "cuda"); numpy (the default) is the reference and runs
    on the CPU only. ``quantization`` (with its options in ``quantization_config``)
    quantizes a numpy transformer's linear layers (``mini_vllm.quantization``).
    Extra keyword arguments are passed to ``ToyModel``.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"model must be 'toy', 'tiny-random', 'smollm2', a .gguf file, a folder or a hub id, "
                         f"got {name_or_path!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if backend == "numpy" and device != "cpu":
        raise ValueError(f"device must be 'cpu' for backend 'numpy' (use backend='torch' "
                         f"for {device!r}), got {device!r}")
    if quantization is not None or quantization_config is not None:
        from mini_vllm.quantization import make_quant_config

        quant_config = make_quant_config(quantization, quantization_config)
        if backend != "numpy" or name_or_path == "toy":
            raise ValueError(f"quantization applies to a numpy transformer (backend='numpy', not the "
                             f"toy model), got backend {backend!r} and model {name_or_path!r}")
        return get_model(name_or_path, seed, max_model_len, **kw).quantized(quant_config)
    if backend == "torch":
        if name_or_path == "toy":
            raise ValueError("backend 'torch' runs the transformer; the 'toy' model exists "
                             "only in numpy (use backend='numpy')")
        if importlib.util.find_spec("torch") is None:
            raise ImportError("backend 'torch' needs PyTorch, which is not installed "
                              "(pip install torch)")
        from mini_vllm.models.torch_backend import TorchLlamaForCausalLM

        reference = get_model(name_or_path, seed, max_model_len, **kw)
        if reference.config.is_moe:
            raise ValueError(f"backend 'torch' runs dense models only; {name_or_path!r} is a "
                             f"mixture-of-experts model (use backend='numpy')")
        return TorchLlamaForCausalLM.from_numpy(reference, device)
    if name_or_path == "toy":
        from mini_vllm.model import ToyModel

        if max_model_len is not None:
            kw["max_model_len"] = max_model_len
        return ToyModel(seed=seed, **kw)
    if kw:
        raise ValueError(f"{', '.join(kw)}: only the 'toy' model takes extra arguments, "
                         f"not {name_or_path!r}")
    if name_or_path == "tiny-random":
        return tiny_random(seed=seed, max_model_len=max_model_len)
    if name_or_path == "tiny-moe":
        return tiny_moe(seed=seed, max_model_len=max_model_len)
    from mini_vllm.models import hub

    if name_or_path in hub.MODELS:
        return hub.load(name_or_path, max_model_len=max_model_len)
    if name_or_path.endswith(".gguf"):
        from mini_vllm.models.gguf import ensure_hf_folder

        return load_model(str(ensure_hf_folder(name_or_path)), max_model_len=max_model_len)
    return load_model(name_or_path, max_model_len=max_model_len)
