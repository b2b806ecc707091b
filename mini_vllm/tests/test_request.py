from __future__ import annotations

from mini_vllm.request import Request, RequestMetrics, RequestStatus
from mini_vllm.sampling_params import SamplingParams

EOS = 256


def _req(max_tokens=3, **params):
    return Request("r", [1, 2, 3], SamplingParams(max_tokens=max_tokens, **params), EOS)


def _feed(req, tokens, max_model_len=None):
    for t in tokens:
        req.append_output_token(t)
        if req.maybe_finish(max_model_len):
            break
    return req


def test_status_order_and_is_finished_is_one_comparison():
    order = [s.name for s in RequestStatus]
    assert order == ["WAITING", "RUNNING", "PREEMPTED", "FINISHED_STOPPED",
                     "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED"]
    finished = {s for s in RequestStatus if RequestStatus.is_finished(s)}
    assert finished == {s for s in RequestStatus if s > RequestStatus.PREEMPTED}
    assert finished == {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
                        RequestStatus.FINISHED_ABORTED}


def test_finish_reasons():
    assert RequestStatus.get_finished_reason(RequestStatus.FINISHED_STOPPED) == "stop"
    assert RequestStatus.get_finished_reason(RequestStatus.FINISHED_LENGTH_CAPPED) == "length"
    assert RequestStatus.get_finished_reason(RequestStatus.FINISHED_ABORTED) == "abort"
    assert RequestStatus.get_finished_reason(RequestStatus.RUNNING) is None


def test_new_request_counters():
    r = _req()
    assert (r.status, r.num_prompt_tokens, r.num_tokens, r.num_computed_tokens) == (RequestStatus.WAITING, 3, 3, 0)
    assert r.finish_reason is None and not r.is_finished()
    r.append_output_token(9)
    assert (r.num_tokens, r.num_output_tokens, r.all_token_ids) == (4, 1, [1, 2, 3, 9])


def test_eos_stops_generation():
    r = _feed(_req(max_tokens=10), [10, 20, EOS, 30])
    assert r.output_token_ids == [10, 20, EOS]
    assert r.finish_reason == "stop" and r.stop_reason is None


def test_no_eos_hits_the_length_cap():
    r = _feed(_req(max_tokens=3), [10, 20, 30, 40])
    assert r.output_token_ids == [10, 20, 30] and r.finish_reason == "length"


def test_eos_on_the_boundary_reports_stop():
    r = _feed(_req(max_tokens=3), [10, 20, EOS])
    assert r.status == RequestStatus.FINISHED_STOPPED


def test_ignore_eos_runs_to_the_length_cap():
    r = _feed(_req(max_tokens=3, ignore_eos=True), [EOS, EOS, EOS, EOS])
    assert r.output_token_ids == [EOS, EOS, EOS] and r.finish_reason == "length"


def test_stop_string_split_across_tokens_is_found_and_cut_from_the_text():
    r = _feed(_req(max_tokens=20, stop=["lo w"]), list(b"hello world"))
    assert r.finish_reason == "stop" and r.stop_reason == "lo w"
    assert bytes(r.output_token_ids) == b"hello w"  # the tokens that completed the match stay
    assert r.output_text() == "hel"


def test_stop_string_inside_a_multibyte_character_sequence():
    r = _feed(_req(max_tokens=20, stop=["é!"]), list("café!x".encode()))
    assert r.stop_reason == "é!" and r.output_text() == "caf"


def test_eos_is_checked_before_stop_strings():
    r = Request("r", [1], SamplingParams(max_tokens=5, stop=["a"]), eos_token_id=ord("a"))
    _feed(r, [ord("a")])
    assert r.finish_reason == "stop" and r.stop_reason is None  # EOS, not the stop string


def test_max_model_len_caps_length():
    r = _feed(_req(max_tokens=10), [5, 6, 7], max_model_len=5)
    assert r.num_tokens == 5 and r.finish_reason == "length"


def test_metrics_record_first_token_and_gaps():
    m = RequestMetrics(arrival_step=0)
    for step in (2, 3, 6, 7):
        m.record_token(step)
    assert m.first_token_step == 2 and m.inter_token_steps == [1, 3, 1]
