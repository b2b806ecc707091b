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

    Input: a mini_vllm ``RequestStatus``, or the name of any member of upstream's
    ``RequestStatus`` (vllm/v1/request.py), including those mini_vllm lacks.
    Output: the string upstream's status -> reason map gives that status
    (vllm/v1/request.py:349 _FINISHED_REASON_MAP, with the strings of
    vllm/v1/engine/__init__.py:30 FINISH_REASON_STRINGS), or None for a status
    that map does not contain.
    Errors: ValueError naming ``status`` for a name that is not an upstream
    status at all (for example "FINISHED_LENGTH").
    """
    raise NotImplementedError("finish_reason: upstream's status -> reason map, by name")


def find_stop_string(output_text: str, new_char_count: int, stop: list[str]) -> tuple[str, int] | None:
    """(stop string, index to cut the text at) if a stop string ends in the new text, else None.

    Only the tail can hold a new match: the new characters plus len(stop) - 1
    characters before them, for a stop string that began in older text.

    Inputs: the whole output text so far; how many characters at its end are new
    since the last check (int >= 0); the stop strings, in the caller's order.
    Output: ``(s, i)`` for the first stop string ``s`` in ``stop`` that has an
    occurrence ending inside the new characters, ``i`` being where that
    occurrence starts (the text is cut there); None when there is none. A match
    that lies entirely in older text is never reported again.
    Errors: ValueError naming ``new_char_count`` when it is negative.
    (upstream: vllm/v1/engine/detokenizer.py:309 check_stop_strings)
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

    Input: a request whose newest output token was just appended; the model's
    length limit in tokens, or None for no limit.
    Output: True when the request is finished, with ``request.status`` set to
    FINISHED_STOPPED (its own ``eos_token_id``, or a stop string found in the
    decoded *output* text, whose value then goes into ``request.stop_reason``)
    or FINISHED_LENGTH_CAPPED (``max_tokens`` output tokens, or prompt + output
    reaching ``max_model_len``). When several conditions hold at once, the first
    in the order above decides. False otherwise, with nothing changed.
    ``ignore_eos`` switches off the EOS check and nothing else.
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

    Output: a ``Request`` (ID "scripted", the given EOS ID) holding the stream's
    tokens up to and including the one that finished it, with the status and
    stop reason ``check_stop`` set; no token after that one is consumed.
    Errors: ValueError naming ``num_prompt_tokens`` unless it is an int >= 1
    (bools are rejected).
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
