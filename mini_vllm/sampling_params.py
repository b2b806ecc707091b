"""SamplingParams: how one request turns logits into tokens, checked up front.

Every field is validated when the object is built, so a bad value fails at the
call that introduced it (``SamplingParams(top_p=0)``) with a message naming
the parameter and its allowed range, instead of deep inside a step.
Conventions follow vLLM: ``temperature == 0`` is greedy, ``top_k`` 0 or -1
disables top-k, ``top_p == 1`` and ``min_p == 0`` disable theirs, and a
greedy request cannot ask for ``n > 1`` (the completions would be identical).

Deliberate differences from upstream, which is more forgiving:

* A temperature in ``(0, 0.01)`` is an error. Upstream logs a warning and
  raises it to 0.01 (dividing by a tinier one overflows the softmax), which
  is a silent change of the caller's request as far as the output shows.
* ``max_tokens`` must be given (upstream's ``None`` means "up to
  ``max_model_len``"), ``seed`` must be ``None`` or ``>= 0`` (upstream also
  reads ``-1`` as ``None``), and a wrongly typed value is a ``ValueError``,
  never a ``TypeError``.
* Only these nine fields: no penalties, logprobs, ``min_tokens``,
  ``stop_token_ids``, logit bias or structured output.

upstream: vllm/sampling_params.py:398-407 _MAX_TEMP
upstream: vllm/sampling_params.py:452 SamplingParams._verify_args
upstream: vllm/sampling_params.py:552 SamplingParams._verify_greedy_sampling
"""
from __future__ import annotations

from dataclasses import dataclass

# Upstream's _MAX_TEMP: below it, logits / temperature can overflow float32.
MIN_TEMPERATURE = 0.01


def _check_number(name: str, value: object, kind: type, allowed: str) -> None:
    # bool is an int subclass; True is never a sensible temperature or count.
    ok_types = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok_types):
        raise ValueError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, float, "0 (greedy) or a number >= 0.01")
        # `not x >= MIN` also rejects NaN.
        if self.temperature != 0 and not (MIN_TEMPERATURE <= self.temperature < float("inf")):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
                             f"got {self.temperature}")
        _check_number("top_k", self.top_k, int, "an integer: -1 or 0 (disabled) or >= 1")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or >= 1, got {self.top_k}")
        _check_number("top_p", self.top_p, float, "a number in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_number("min_p", self.min_p, float, "a number in [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        _check_number("max_tokens", self.max_tokens, int, "an integer >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        _check_number("n", self.n, int, "an integer >= 1")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"n must be 1 when temperature is 0 (greedy), got {self.n}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None:
            _check_number("seed", self.seed, int, "None or an integer >= 0")
            if self.seed < 0:
                raise ValueError(f"seed must be None or an integer >= 0, got {self.seed}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not isinstance(self.stop, list | tuple) or not all(
                isinstance(s, str) and s for s in self.stop
            ):
                raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
            self.stop = list(self.stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
