"""mini_vllm's data plane: a real Llama / Qwen2 transformer on a paged KV cache.

``get_model(name_or_path)`` is the one entry point the engine uses:

- ``"toy"``: ``mini_vllm.model.ToyModel`` (pseudo-logits, ignores the KV cache);
- ``"tiny-random"``: a seeded random Llama-style model (2 layers, hidden 64,
  4 query heads sharing 2 KV heads, vocab 257 = ByteTokenizer), no files;
- a local folder with ``config.json`` and ``*.safetensors`` (Llama or Qwen2);
- a hub id (``"org/name"``), downloaded with huggingface_hub when online.

Files: ``config.py`` (ModelConfig), ``attention.py`` (paged write and read),
``llama.py`` (the forward pass), ``loader.py`` (safetensors and name mapping).

upstream: vllm/model_executor/model_loader/default_loader.py:43 DefaultModelLoader
"""
from __future__ import annotations

from mini_vllm.models.config import ModelConfig, ModelConfigError, tiny_random_config
from mini_vllm.models.llama import LlamaForCausalLM, Weights, random_weights
from mini_vllm.models.loader import WeightLoadError, load_model, load_weights

__all__ = [
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelConfigError",
    "WeightLoadError",
    "Weights",
    "get_model",
    "load_model",
    "load_weights",
    "random_weights",
    "tiny_random",
    "tiny_random_config",
]


def tiny_random(seed: int = 0, max_model_len: int | None = None) -> LlamaForCausalLM:
    """The default real model: seeded random weights, ByteTokenizer, no files."""
    from mini_vllm.tokenizer import ByteTokenizer

    config = tiny_random_config()
    return LlamaForCausalLM(config, random_weights(config, seed), tokenizer=ByteTokenizer(),
                            max_model_len=max_model_len, name="tiny-random")


def get_model(name_or_path: str, seed: int = 0, max_model_len: int | None = None, **kw):
    """Build the model the engine runs (see the module docstring for the choices).

    ``seed`` seeds tiny-random's (and the toy model's) weights; ``max_model_len``
    caps the context length (default: the config's ``max_position_embeddings``).
    Extra keyword arguments are passed to ``ToyModel``.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ValueError(f"model must be 'toy', 'tiny-random', a folder or a hub id, "
                         f"got {name_or_path!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
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
    return load_model(name_or_path, max_model_len=max_model_len)
