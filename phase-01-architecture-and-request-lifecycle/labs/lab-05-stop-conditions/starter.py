"""Lab 01-05 — stop conditions and finish reasons.

Three ways a request ends: the model emits EOS (or a stop string appears in
its text): "stop"; it reaches max_tokens or the model's length limit:
"length"; someone cancels it: "abort". The order of the checks decides the
answer when two are true at once, and stop strings have to be found in text
that may have been split across tokens.

upstream: vllm/v1/core/sched/utils.py:94 check_stop
upstream: vllm/v1/engine/detokenizer.py:309 check_stop_strings
upstream: vllm/v1/request.py:349 _FINISHED_REASON_MAP
"""
from __future__ import annotations

from collections.abc import Iterable

from mini_vllm.request import Request, RequestStatus
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import ByteTokenizer


def finish_reason(status: RequestStatus | str) -> str | None:
    """The API's finish_reason for a status (a RequestStatus or an upstream status name).

    Recipe: read ``_FINISHED_REASON_MAP`` in upstream/vllm/v1/request.py (line 349)
    and the strings of ``FinishReason`` in upstream/vllm/v1/engine/__init__.py.
    Work by name (``status.name`` for a RequestStatus), so the upstream statuses
    mini_vllm lacks (FINISHED_IGNORED, FINISHED_ERROR, ...) are covered too.
      - a status in that map -> its string ("stop", "length", "abort", ...);
      - any other upstream status (WAITING, RUNNING, PREEMPTED and the other
        WAITING_FOR_* states) -> None: not finished, no reason yet;
      - anything else -> ValueError whose message names ``status``.
    """
    raise NotImplementedError("finish_reason: upstream's status -> reason map, by name")


def find_stop_string(output_text: str, new_char_count: int, stop: list[str]) -> tuple[str, int] | None:
    """(stop string, index to cut the text at) if a stop string ends in the new text, else None.

    Only the tail can hold a new match: the new characters plus len(stop) - 1
    characters before them, for a stop string that began in older text.

    Recipe (upstream: vllm/v1/engine/detokenizer.py:309 check_stop_strings):
      - ValueError naming ``new_char_count`` if it is negative.
      - None if new_char_count is 0 or ``stop`` is empty.
      - For each stop string s, in order: search ``output_text`` for s starting at
        index len(output_text) - new_char_count - len(s) + 1 (not below 0);
        the first hit returns (s, index of the match).
    """
    raise NotImplementedError("find_stop_string: search only the new tail")


def _new_char_count(before: str, after: str) -> int:
    """Characters of ``after`` that are new or changed: a byte that completes a
    multi-byte character turns an earlier U+FFFD into the real character."""
    common = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        common += 1
    return len(after) - common


def check_stop(request: Request, max_model_len: int | None = None) -> bool:
    """After one token was appended: has the request finished? Sets status and stop_reason.

    Order: EOS (unless ignore_eos), then stop strings, then length (max_tokens,
    or max_model_len for prompt + output).

    Recipe:
      1. If not ``params.ignore_eos`` and the last output token is
         ``request.eos_token_id``: status FINISHED_STOPPED, return True.
      2. If ``params.stop``: decode the output without and with the last token
         (``request.tokenizer.decode``), count the new characters with
         ``_new_char_count``, and call ``find_stop_string``. On a hit: status
         FINISHED_STOPPED, ``stop_reason`` = the stop string, return True.
      3. If num_output_tokens >= max_tokens, or max_model_len is given and
         num_tokens >= max_model_len: status FINISHED_LENGTH_CAPPED, return True.
      4. Otherwise return False and leave the status alone.
    """
    raise NotImplementedError("check_stop: EOS, then stop strings, then length")


def run_until_stop(
    token_stream: Iterable[int],
    sampling_params: SamplingParams,
    eos_token_id: int = ByteTokenizer.eos_token_id,
    num_prompt_tokens: int = 1,
    max_model_len: int | None = None,
) -> Request:
    """Replay the update stage with scripted tokens: append one, check, stop when it fires.

    The prompt is ``num_prompt_tokens`` copies of byte 65 ("A"). If the stream
    runs out first, the request is returned still RUNNING.

    Recipe: ValueError naming ``num_prompt_tokens`` unless it is an int >= 1.
    Build ``Request("scripted", [65] * num_prompt_tokens, sampling_params,
    eos_token_id)``, set its status to RUNNING (it is being generated), then for
    each token: ``request.append_output_token(token)``; stop as soon as
    ``check_stop(request, max_model_len)`` is True. Return the request.
    """
    raise NotImplementedError("run_until_stop: append, check, break")


if __name__ == "__main__":
    eos = ByteTokenizer.eos_token_id
    cases = {
        "EOS mid-stream": ([10, 20, eos, 30], SamplingParams(temperature=0, max_tokens=8)),
        "ignore_eos": ([10, 20, eos, 30], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)),
        "EOS on the boundary": ([10, 20, eos], SamplingParams(temperature=0, max_tokens=3)),
        "stop string split": (list(b"hi\n\nthere"), SamplingParams(temperature=0, max_tokens=20, stop="\n\n")),
    }
    for name, (stream, params) in cases.items():
        r = run_until_stop(stream, params)
        print(f"{name:20} tokens={r.output_token_ids} status={r.status.name} "
              f"finish_reason={finish_reason(r.status)!r} stop_reason={r.stop_reason!r}")
