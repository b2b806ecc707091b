"""Lab 01-05 tests: how requests end, and what the API says about it."""
import course
from course import load_impl

impl = load_impl(__file__)

import ast  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm.engine import LLM  # noqa: E402
from mini_vllm.model import ToyModel  # noqa: E402
from mini_vllm.request import Request, RequestStatus  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

EOS = 256
UPSTREAM = course.UPSTREAM


def params(**kw):
    return SamplingParams(temperature=0.0, **kw)


def test_eos_stops_generation():
    r = impl.run_until_stop([10, 20, EOS, 30, 40], params(max_tokens=10))
    assert r.output_token_ids == [10, 20, EOS]  # the EOS counts as an output token
    assert r.status == RequestStatus.FINISHED_STOPPED
    assert impl.finish_reason(r.status) == "stop"
    assert r.stop_reason is None


def test_ignore_eos_runs_to_the_length_cap():
    r = impl.run_until_stop([10, 20, EOS, 30, 40, 50], params(max_tokens=5, ignore_eos=True))
    assert r.output_token_ids == [10, 20, EOS, 30, 40]
    assert impl.finish_reason(r.status) == "length"


def test_no_eos_hits_the_cap_exactly():
    r = impl.run_until_stop(range(60, 70), params(max_tokens=3))
    assert r.output_token_ids == [60, 61, 62]
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_eos_on_the_boundary_reports_stop():
    r = impl.run_until_stop([10, 20, EOS], params(max_tokens=3))
    assert r.num_output_tokens == 3  # max_tokens reached AND EOS: the EOS check runs first
    assert impl.finish_reason(r.status) == "stop"


def test_stop_string_on_the_boundary_also_reports_stop():
    r = impl.run_until_stop(list(b"xab"), params(max_tokens=3, stop="ab"))
    assert (r.status, r.stop_reason) == (RequestStatus.FINISHED_STOPPED, "ab")
    assert r.output_text() == "x"


def test_ignore_eos_leaves_stop_strings_on():
    r = impl.run_until_stop(list(b"xy\n\nz"), params(max_tokens=10, ignore_eos=True, stop="\n\n"))
    assert (r.status, r.stop_reason, r.output_text()) == (RequestStatus.FINISHED_STOPPED, "\n\n", "xy")


def test_the_requests_own_eos_id_is_the_one_that_stops_it():
    r = impl.run_until_stop([10, 7, 20], params(max_tokens=5), eos_token_id=7)
    assert (r.output_token_ids, r.status) == ([10, 7], RequestStatus.FINISHED_STOPPED)
    r = impl.run_until_stop([EOS, 30], params(max_tokens=2), eos_token_id=7)  # 256 is not its EOS
    assert (r.output_token_ids, r.status) == ([EOS, 30], RequestStatus.FINISHED_LENGTH_CAPPED)


def test_stop_strings_are_matched_in_the_output_only():
    # The prompt is "A"; "Ab" would match across the prompt and the first output byte.
    r = impl.run_until_stop(list(b"bAbc"), params(max_tokens=10, stop="Ab"))
    assert r.output_token_ids == list(b"bAb")
    assert (r.stop_reason, r.output_text()) == ("Ab", "b")


def test_the_first_stop_string_in_the_list_wins_when_two_match_at_once():
    # Both end at the new character; upstream returns the first one in the caller's order.
    assert impl.find_stop_string("xab", 1, ["b", "ab"]) == ("b", 2)
    assert impl.find_stop_string("xab", 1, ["ab", "b"]) == ("ab", 1)
    r = impl.run_until_stop(list(b"xab"), params(max_tokens=10, stop=["b", "ab"]))
    assert (r.stop_reason, r.output_text()) == ("b", "xa")


def test_check_stop_returns_false_and_leaves_a_running_request_alone():
    r = Request("direct", [65, 65], params(max_tokens=4, stop="zz"), EOS)
    r.status = RequestStatus.RUNNING
    r.append_output_token(ord("z"))
    assert impl.check_stop(r, max_model_len=10) is False
    assert (r.status, r.stop_reason) == (RequestStatus.RUNNING, None)
    r.append_output_token(ord("z"))
    assert impl.check_stop(r, max_model_len=10) is True
    assert (r.status, r.stop_reason) == (RequestStatus.FINISHED_STOPPED, "zz")


def test_the_scripted_prompt_is_made_of_the_letter_a():
    r = impl.run_until_stop([], params(max_tokens=2), num_prompt_tokens=3)
    assert (r.prompt_token_ids, r.request_id, r.status) == ([65, 65, 65], "scripted", RequestStatus.RUNNING)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_scripted_request_needs_a_prompt(bad):
    with pytest.raises(ValueError, match="num_prompt_tokens"):
        impl.run_until_stop([1], params(max_tokens=1), num_prompt_tokens=bad)


def test_max_model_len_caps_prompt_plus_output():
    r = impl.run_until_stop(range(70, 90), params(max_tokens=10), num_prompt_tokens=5, max_model_len=7)
    assert r.num_output_tokens == 2 and r.num_tokens == 7
    assert impl.finish_reason(r.status) == "length"


def test_stop_string_split_across_tokens_is_found():
    r = impl.run_until_stop(list(b"hi\n\nthere"), params(max_tokens=20, stop="\n\n"))
    assert r.output_token_ids == list(b"hi\n\n")  # stopped on the token that completed it
    assert r.stop_reason == "\n\n" and r.output_text() == "hi"


def test_a_stop_string_completed_by_the_first_token_stops_at_once():
    r = impl.run_until_stop(list(b"\nab"), params(max_tokens=5, stop="\n"))
    assert (r.output_token_ids, r.stop_reason, r.output_text()) == ([10], "\n", "")


def test_stop_string_split_inside_a_utf8_character_is_found():
    # "é" is two bytes; with one byte per token, the stop string completes mid-character.
    r = impl.run_until_stop(list("un café noir".encode()), params(max_tokens=30, stop=["noir", "café"]))
    assert r.output_token_ids == list("un café".encode())
    assert r.stop_reason == "café" and r.output_text() == "un "


def test_find_stop_string_searches_only_the_new_tail():
    assert impl.find_stop_string("xxab", 1, ["ab"]) == ("ab", 2)   # began before the new char
    assert impl.find_stop_string("xxabyy", 2, ["ab"]) is None       # completed earlier: not new
    assert impl.find_stop_string("xxab", 0, ["ab"]) is None         # nothing new
    assert impl.find_stop_string("ab", 2, ["zz", "b"]) == ("b", 1)  # first stop string that matches
    assert impl.find_stop_string("xaya", 3, ["a"]) == ("a", 1)      # its earliest new occurrence
    assert impl.find_stop_string("ab", 2, ["ab"]) == ("ab", 0)      # the whole text is the match
    with pytest.raises(ValueError, match="new_char_count"):
        impl.find_stop_string("ab", -1, ["b"])


def test_unfinished_request_has_no_reason():
    for status in (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED):
        assert impl.finish_reason(status) is None
    r = impl.run_until_stop([1, 2], params(max_tokens=5))  # the stream ends first
    assert r.status == RequestStatus.RUNNING and impl.finish_reason(r.status) is None


def test_finish_reason_covers_upstream_names_and_rejects_others():
    assert impl.finish_reason(RequestStatus.FINISHED_ABORTED) == "abort"
    assert impl.finish_reason("FINISHED_IGNORED") == "length"
    assert impl.finish_reason("FINISHED_ERROR") == "error"
    assert impl.finish_reason("WAITING_FOR_REMOTE_KVS") is None
    assert impl.finish_reason("FINISHED_REPETITION") == "repetition"
    # A streaming-input session paused between chunks: upstream's map says "stop".
    assert impl.finish_reason("WAITING_FOR_STREAMING_REQ") == "stop"
    with pytest.raises(ValueError, match="status"):
        impl.finish_reason("FINISHED_LENGTH")  # not a status in vLLM or mini_vllm


def _oracle(stream, sp, num_prompt_tokens, max_model_len, eos):
    """mini_vllm's own Request.maybe_finish, driven the same way."""
    r = Request("oracle", [65] * num_prompt_tokens, sp, eos)
    r.status = RequestStatus.RUNNING
    for t in stream:
        r.append_output_token(t)
        if r.maybe_finish(max_model_len):
            break
    return r.output_token_ids, r.status, r.stop_reason


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    stream=st.lists(st.sampled_from([65, 97, 98, 10, EOS, 0xC3, 0xA9]), max_size=14),
    max_tokens=st.integers(1, 12),
    ignore_eos=st.booleans(),
    stop=st.one_of(st.none(), st.lists(st.sampled_from(["ab", "b\n", "\n\n", "é", "aé", "bb", "Ab"]),
                                       min_size=1, max_size=2)),
    num_prompt_tokens=st.integers(1, 4),
    max_model_len=st.one_of(st.none(), st.integers(5, 16)),
    eos=st.sampled_from([EOS, 98]),
)
def test_agrees_with_mini_vllm_on_random_streams(stream, max_tokens, ignore_eos, stop,
                                                  num_prompt_tokens, max_model_len, eos):
    sp = params(max_tokens=max_tokens, ignore_eos=ignore_eos, stop=stop)
    r = impl.run_until_stop(stream, sp, eos_token_id=eos, num_prompt_tokens=num_prompt_tokens,
                            max_model_len=max_model_len)
    assert (r.output_token_ids, r.status, r.stop_reason) == _oracle(
        stream, sp, num_prompt_tokens, max_model_len, eos)


def test_engine_reports_the_same_reasons_end_to_end():
    llm = LLM(model=ToyModel(eos_bias=100.0))  # EOS always has the largest logit
    stopped, capped = llm.generate(["hi", "hi"], [params(max_tokens=5),
                                                  params(max_tokens=5, ignore_eos=True)])
    assert stopped.outputs[0].token_ids == [EOS] and stopped.outputs[0].finish_reason == "stop"
    assert capped.outputs[0].token_ids == [EOS] * 5 and capped.outputs[0].finish_reason == "length"
    assert stopped.outputs[0].text == capped.outputs[0].text == ""  # EOS carries no text
    assert impl.finish_reason(RequestStatus.FINISHED_STOPPED) == stopped.outputs[0].finish_reason
    assert impl.finish_reason(RequestStatus.FINISHED_LENGTH_CAPPED) == capped.outputs[0].finish_reason


@pytest.mark.upstream
def test_finish_reason_matches_upstream_finished_reason_map():
    tree = ast.parse((UPSTREAM / "vllm/v1/request.py").read_text())
    mapping = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", None) == "_FINISHED_REASON_MAP")
    enum_tree = ast.parse((UPSTREAM / "vllm/v1/engine/__init__.py").read_text())
    strings = next(n.value for n in enum_tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", None) == "FINISH_REASON_STRINGS")
    reason_cls = next(n for n in enum_tree.body if isinstance(n, ast.ClassDef)
                      and n.name == "FinishReason")
    values = {s.targets[0].id: s.value.value for s in reason_cls.body
              if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)}
    expected = {k.attr: strings.elts[values[v.attr]].value
                for k, v in zip(mapping.keys, mapping.values, strict=True)}
    assert expected["FINISHED_STOPPED"] == "stop"  # the map was read, not invented
    for name, reason in expected.items():
        assert impl.finish_reason(name) == reason, name
    status_cls = next(n for n in ast.parse((UPSTREAM / "vllm/v1/request.py").read_text()).body
                      if isinstance(n, ast.ClassDef) and n.name == "RequestStatus")
    names = [s.targets[0].id for s in status_cls.body if isinstance(s, ast.Assign)]
    for name in names:
        if name not in expected:
            assert impl.finish_reason(name) is None, name
