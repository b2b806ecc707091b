"""Request and RequestStatus: one generation's whole state, in one object.

The scheduler never keeps a "phase" for a request. It keeps two counters and
lets them catch up: ``num_tokens`` (prompt plus output so far) and
``num_computed_tokens`` (how many of those already have KV in the cache). A
prefill, a chunk of one, a decode and a recompute after preemption are all the
same move: schedule ``num_tokens - num_computed_tokens`` tokens, or fewer.

``RequestStatus`` keeps upstream's order so that "finished" is a single
comparison. The seed of this course defined ``is_finished`` three ways; this
file uses upstream's, ``status > PREEMPTED``, and defines it once, on the enum.

Deliberate differences from upstream:

* Stop strings are checked here, in the engine, by decoding the whole output
  after each token. Upstream checks them in the front end's detokenizer
  (``check_stop_strings``), incrementally, after the core's ``check_stop``
  has looked at EOS and length, and lets a stop string override a length
  finish. The outcome is the same (EOS, then stop strings, then length); the
  cost here is O(output length) per token, fine at this scale.
* The EOS id is given to the ``Request``; upstream keeps it in the sampling
  params, next to ``stop_token_ids`` (not here) and ``min_tokens`` (in the params).
* Only the statuses mini_vllm can reach: no waiting sub-states (grammar,
  remote KV, streaming input) and no ``FINISHED_IGNORED`` / ``ERROR`` /
  ``REPETITION``.
* ``block_hashes`` is filled by ``KVCacheManager`` (see kv_cache.py), not
  by a hasher the request owns.

upstream: vllm/v1/request.py:59 Request
upstream: vllm/v1/request.py:315 RequestStatus
upstream: vllm/v1/request.py:337 RequestStatus.is_finished
upstream: vllm/v1/core/sched/utils.py:94 check_stop
upstream: vllm/v1/engine/detokenizer.py:309 check_stop_strings
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import ByteTokenizer, HFTokenizer


class RequestStatus(enum.IntEnum):
    """Upstream's order, minus the states mini_vllm never enters; order matters."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is a finished status.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        return _FINISH_REASON.get(status)


_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True)
class RequestMetrics:
    """Timing in engine steps (filled by LLMEngine; steps are numbered from 1)."""

    arrival_step: int = 0  # steps already run when the request was added
    first_token_step: int | None = None
    finished_step: int | None = None
    inter_token_steps: list[int] = field(default_factory=list)
    last_token_step: int | None = None
    num_cached_tokens: int = 0  # prefix-cache hit tokens at first admission

    def record_token(self, step: int) -> None:
        if self.first_token_step is None:
            self.first_token_step = step
        else:
            self.inter_token_steps.append(step - self.last_token_step)
        self.last_token_step = step


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        arrival_time: float = 0.0,
        priority: int = 0,
        tokenizer: ByteTokenizer | HFTokenizer | None = None,
        lora_request=None,
    ) -> None:
        self.request_id = request_id
        self.lora_request = lora_request  # Phase 11: a LoRARequest, or None for the base model
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        # Draft tokens proposed for the next step (speculative decoding); never
        # part of all_token_ids: the scheduler moves them into its output.
        self.spec_token_ids: list[int] = []
        # Chained hashes of the full blocks of all_token_ids; KVCacheManager
        # extends this list as blocks fill (upstream: Request.update_block_hashes).
        self.block_hashes: list[bytes] = []
        self.stop_reason: int | str | None = None
        # Stop strings are matched on text, so they need a decoder.
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.metrics = RequestMetrics()
        # Phase 09: one dict (token id -> Logprob) per output token when
        # sampling_params.logprobs is set, else None (upstream: CompletionOutput.logprobs).
        self.logprobs: list | None = None if sampling_params.logprobs is None else []
        self.cumulative_logprob: float | None = None if sampling_params.logprobs is None else 0.0
        # One entry per prompt token when sampling_params.prompt_logprobs is set (the first is None).
        self.prompt_logprobs: list | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """upstream: vllm/v1/request.py:243 num_tokens_with_spec"""
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def finish_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def append_output_token(self, token_id: int) -> None:
        """Append one sampled token (upstream: Request.append_output_token_ids)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def maybe_finish(self, max_model_len: int | None = None) -> bool:
        """Check the stop conditions after a token was appended; set the status.

        Order, as upstream's ``check_stop``: EOS (unless ``ignore_eos``), then
        stop strings, then length. So an EOS sampled as the ``max_tokens``-th
        token reports ``"stop"``, not ``"length"``. Stop strings are found in
        the decoded output text, so one split across two tokens still matches.

        With ``min_tokens``, as upstream: nothing stops the request before
        ``min_tokens`` outputs, and a stop string counts only if it ends after
        the text of the first ``min_tokens`` tokens.

        upstream: vllm/v1/engine/detokenizer.py:121 min_tokens
        upstream: vllm/v1/core/sched/utils.py:94 check_stop
        """
        params = self.sampling_params
        if self.num_output_tokens < params.min_tokens:
            return False
        last = self.output_token_ids[-1]
        if not params.ignore_eos and last == self.eos_token_id:
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if params.stop:
            text = self.tokenizer.decode(self.output_token_ids)
            for s in params.stop:
                if text.find(s, self._stop_search_start(s)) != -1:
                    self.status = RequestStatus.FINISHED_STOPPED
                    self.stop_reason = s
                    return True
        if self.num_output_tokens >= params.max_tokens or (
            max_model_len is not None and self.num_tokens >= max_model_len
        ):
            self.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    def output_text(self) -> str:
        """Decoded output, cut before the stop string that finished it (upstream default)."""
        text = self.tokenizer.decode(self.output_token_ids)
        if isinstance(self.stop_reason, str):
            text = text[: text.find(self.stop_reason, self._stop_search_start(self.stop_reason))]
        return text

    def _stop_search_start(self, stop: str) -> int:
        # Without min_tokens, 0: the whole text. With it, a match must end
        # after the first min_tokens tokens' text.
        min_tokens = self.sampling_params.min_tokens
        if not min_tokens:
            return 0
        return max(0, len(self.tokenizer.decode(self.output_token_ids[:min_tokens])) - len(stop) + 1)

    def append_logprobs(self, position: dict) -> None:
        """Record one output position's logprobs (the sampled token is the dict's first key)."""
        self.logprobs.append(position)
        self.cumulative_logprob += next(iter(position.values())).logprob

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, computed="
            f"{self.num_computed_tokens}/{self.num_tokens}, out={self.num_output_tokens})"
        )
