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

# Upstream's map, by status name, including the statuses mini_vllm does not have.
_REASONS = {
    "FINISHED_STOPPED": "stop",
    "FINISHED_LENGTH_CAPPED": "length",
    "FINISHED_ABORTED": "abort",
    "FINISHED_IGNORED": "length",  # prompt longer than the model allows: OpenAI says "length"
    "FINISHED_ERROR": "error",
    "FINISHED_REPETITION": "repetition",
    "WAITING_FOR_STREAMING_REQ": "stop",  # a streaming-input session paused between chunks
}
_UNFINISHED = {
    "WAITING",
    "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR",
    "WAITING_FOR_REMOTE_KVS",
    "RUNNING",
    "PREEMPTED",
}


def finish_reason(status: RequestStatus | str) -> str | None:
    """The API's finish_reason for a status (a RequestStatus or an upstream status name)."""
    name = status.name if isinstance(status, RequestStatus) else status
    if name in _REASONS:
        return _REASONS[name]
    if name in _UNFINISHED:
        return None
    raise ValueError(f"status must be a RequestStatus or an upstream status name, got {status!r}")


def find_stop_string(output_text: str, new_char_count: int, stop: list[str]) -> tuple[str, int] | None:
    """(stop string, index to cut the text at) if a stop string ends in the new text, else None.

    Only the tail can hold a new match: the new characters plus len(stop) - 1
    characters before them, for a stop string that began in older text.
    """
    if new_char_count < 0:
        raise ValueError(f"new_char_count must be >= 0, got {new_char_count}")
    if not new_char_count or not stop:
        return None
    for s in stop:
        start = max(0, len(output_text) - new_char_count - len(s) + 1)
        index = output_text.find(s, start)
        if index != -1:
            return s, index
    return None


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
    """
    params = request.sampling_params
    last = request.output_token_ids[-1]
    if not params.ignore_eos and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if params.stop:
        decode = request.tokenizer.decode
        before = decode(request.output_token_ids[:-1])
        after = decode(request.output_token_ids)
        hit = find_stop_string(after, _new_char_count(before, after), params.stop)
        if hit is not None:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = hit[0]
            return True
    if request.num_output_tokens >= params.max_tokens or (
        max_model_len is not None and request.num_tokens >= max_model_len
    ):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


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
    """
    if isinstance(num_prompt_tokens, bool) or not isinstance(num_prompt_tokens, int) or num_prompt_tokens < 1:
        raise ValueError(f"num_prompt_tokens must be an integer >= 1, got {num_prompt_tokens!r}")
    request = Request("scripted", [65] * num_prompt_tokens, sampling_params, eos_token_id)
    request.status = RequestStatus.RUNNING
    for token in token_stream:
        request.append_output_token(token)
        if check_stop(request, max_model_len):
            break
    return request


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
