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
* ``bad_words`` is a list of token-id sequences (upstream takes strings
  and tokenizes each one twice, with and without a leading space, into
  ``_bad_words_token_ids``); ``logprobs`` must be ``None``, ``-1`` or an
  integer ``>= 0`` (upstream also reads ``True`` as 1); ``repetition_penalty``
  must be finite as well as ``> 0``; ``logit_bias`` values must be finite
  numbers (upstream clamps them to [-100, 100] only on the OpenAI path).
* Token ids in ``logit_bias``, ``allowed_token_ids`` and ``bad_words`` and
  ``logprobs`` against ``max_logprobs`` are checked by ``LLMEngine.add_request``,
  which knows the vocabulary, as upstream's ``SamplingParams.verify`` does.
* No ``stop_token_ids`` or structured output.

Phase 09's fields (penalties, ``min_tokens``, ``logit_bias``,
``allowed_token_ids``, ``bad_words``, ``logprobs``, ``prompt_logprobs``,
``extra_args``) all default to "off",
and a request that leaves them off samples exactly as before they existed.

upstream: vllm/sampling_params.py:398-407 _MAX_TEMP
upstream: vllm/sampling_params.py:452 SamplingParams._verify_args
upstream: vllm/sampling_params.py:552 SamplingParams._verify_greedy_sampling
upstream: vllm/sampling_params.py:193 presence_penalty
upstream: vllm/sampling_params.py:201 repetition_penalty
upstream: vllm/sampling_params.py:287 logit_bias
upstream: vllm/sampling_params.py:727 SamplingParams._validate_logit_bias
upstream: vllm/sampling_params.py:754 SamplingParams._validate_allowed_token_ids
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


def _is_token_id(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


def _is_finite_number(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and abs(value) < float("inf"))


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
    # Phase 09: all off by default (off is the old sampling path exactly).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[list[int]] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Per-request arguments for custom logits processors (upstream's name);
    # mini_vllm only checks it is a dict, the processors read their own keys.
    extra_args: dict | None = None

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
        self._verify_phase09_args()

    def _verify_phase09_args(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value, float, "a number in [-2, 2]")
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty, float, "a finite number > 0")
        if not 0.0 < self.repetition_penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        _check_number("min_tokens", self.min_tokens, int, "an integer in [0, max_tokens]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                _is_token_id(t) and _is_finite_number(b) for t, b in self.logit_bias.items()
            ):
                raise ValueError(f"logit_bias must be None or a dict of token id (int >= 0) -> "
                                 f"finite number, got {self.logit_bias!r:.80}")
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, list | tuple) or not self.allowed_token_ids or not all(
                _is_token_id(t) for t in self.allowed_token_ids
            ):
                raise ValueError(f"allowed_token_ids must be None or a non-empty list of token ids "
                                 f"(ints >= 0), got {self.allowed_token_ids!r:.80}")
            self.allowed_token_ids = [int(t) for t in self.allowed_token_ids]
        if self.bad_words is not None:
            if not isinstance(self.bad_words, list | tuple) or not all(
                isinstance(w, list | tuple) and w and all(_is_token_id(t) for t in w) for w in self.bad_words
            ):
                raise ValueError(f"bad_words must be None or a list of non-empty token-id lists "
                                 f"(ints >= 0), got {self.bad_words!r:.80}")
            self.bad_words = [[int(t) for t in w] for w in self.bad_words]
        if self.logprobs is not None:
            _check_number("logprobs", self.logprobs, int, "None, -1 (the whole vocabulary) or an integer >= 0")
            if self.logprobs < -1:
                raise ValueError(f"logprobs must be None, -1 (the whole vocabulary) or an integer >= 0, "
                                 f"got {self.logprobs}")
        if self.prompt_logprobs is not None:
            _check_number("prompt_logprobs", self.prompt_logprobs, int,
                          "None, -1 (the whole vocabulary) or an integer >= 0")
            if self.prompt_logprobs < -1:
                raise ValueError(f"prompt_logprobs must be None, -1 (the whole vocabulary) or an integer >= 0, "
                                 f"got {self.prompt_logprobs}")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be None or a dict, got {type(self.extra_args).__name__}")

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """A request that wants prompt logprobs computes its whole prompt: a cached
        block has no logits to give.

        upstream: vllm/sampling_params.py:446 skip_reading_prefix_cache
        """
        return self.prompt_logprobs is not None

    @property
    def has_logits_processing(self) -> bool:
        """True when a Phase 09 knob changes the logits before sampling."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.min_tokens or self.logit_bias or self.allowed_token_ids is not None
                    or self.bad_words)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
