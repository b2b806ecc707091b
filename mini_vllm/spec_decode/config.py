"""SpeculativeConfig: the checked form of ``LLMEngine(speculative_config={...})``.

Keys and defaults are vLLM's: ``method`` (``"ngram"`` or ``"draft_model"``),
``num_speculative_tokens`` (required, >= 1); for ngram ``prompt_lookup_min``
and ``prompt_lookup_max`` (both 5 when neither is given; one given copies it
to the other; min <= max); for draft_model ``model``, a name
``mini_vllm.models.get_model`` knows (or ``"toy"``). Every bad value is a
``ValueError`` naming the key.

upstream: vllm/config/speculative.py:80 num_speculative_tokens
upstream: vllm/config/speculative.py:589 prompt_lookup_min
"""
from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None  # ngram only
    prompt_lookup_max: int | None = None
    model: str | None = None  # draft_model only

    @classmethod
    def from_any(cls, config: dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        if config is None or isinstance(config, SpeculativeConfig):
            return config
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be None or a dict, got {type(config).__name__}")
        unknown = sorted(set(config) - set(KEYS))
        if unknown:
            raise ValueError(f"speculative_config: unknown key {unknown[0]!r}; "
                             f"allowed keys are {', '.join(KEYS)}")
        method = config.get("method")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        k = _int_at_least("num_speculative_tokens", config.get("num_speculative_tokens"))
        model = config.get("model")
        if method == "draft_model":
            extra = sorted(set(config) & {"prompt_lookup_min", "prompt_lookup_max"})
            if extra:
                raise ValueError(f"{extra[0]} applies to method 'ngram' only, not 'draft_model'")
            if not isinstance(model, str) or not model:
                raise ValueError(f"model must be a mini_vllm model name (such as 'tiny-random') "
                                 f"for method 'draft_model', got {model!r}")
            return cls(method, k, model=model)
        if model is not None:
            raise ValueError(f"model applies to method 'draft_model' only, not 'ngram', got {model!r}")
        lo, hi = (config.get(key) for key in ("prompt_lookup_min", "prompt_lookup_max"))
        lo = None if lo is None else _int_at_least("prompt_lookup_min", lo)
        hi = None if hi is None else _int_at_least("prompt_lookup_max", hi)
        if lo is None and hi is None:  # upstream's ngram default: 5 and 5
            lo = hi = 5
        lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)  # one given: copy it
        if lo > hi:
            raise ValueError(f"prompt_lookup_min must be <= prompt_lookup_max, got {lo} > {hi}")
        return cls(method, k, lo, hi)


def _int_at_least(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value
