"""The scheduler in exact numbers: tokens per request per step, preemption, chunking."""
from __future__ import annotations

import pytest

from mini_vllm.request import RequestStatus
from mini_vllm.scheduler import Scheduler


def _ids(reqs):
    return [r.request_id for r in reqs]


def test_budget_caps_total_tokens(make_scheduler, make_request):
    s = make_scheduler(max_num_batched_tokens=10)
    for i in range(3):
        s.add_request(make_request(range(8), request_id=f"r{i}"))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r0": 8, "r1": 2}  # 8 + 2 + 0 = 10
    assert out.total_num_scheduled_tokens == 10
    assert _ids(s.running) == ["r0", "r1"] and _ids(s.waiting) == ["r2"]


def test_max_num_seqs_caps_running(make_scheduler, make_request):
    s = make_scheduler(max_num_seqs=4)
    for i in range(10):
        s.add_request(make_request([i]))
    out = s.schedule()
    assert len(out.num_scheduled_tokens) == 4 and len(s.running) == 4 and len(s.waiting) == 6


def test_long_prefill_threshold_chunks_a_prompt(make_scheduler, make_request, run_step):
    s = make_scheduler(num_blocks=64, long_prefill_token_threshold=16)
    r = make_request(range(100), max_tokens=1)
    s.add_request(r)
    chunks = []
    while s.has_unfinished_requests():
        out, _ = run_step(s)
        chunks.append(out.num_scheduled_tokens[r.request_id])
    assert chunks == [16] * 6 + [4]
    assert r.output_token_ids == [7]  # sampled once, after the last chunk


def test_mid_prefill_chunk_samples_nothing(make_scheduler, make_request):
    s = make_scheduler(max_num_batched_tokens=5)
    r = make_request(range(8))
    s.add_request(r)
    out = s.schedule()
    assert not Scheduler.needs_sample(r, out.num_scheduled_tokens["r0"])
    with pytest.raises(ValueError, match="mid-prefill"):
        s.update_from_output(out, {"r0": 3})


def test_running_are_scheduled_before_waiting_and_prefill_mixes_with_decode(
    make_scheduler, make_request, run_step
):
    # Phase 01's trace: A = 11 tokens, B = 7 tokens, budget 8, max_tokens 4
    s = make_scheduler(num_blocks=64, max_num_batched_tokens=8)
    a = make_request(b"hello world", request_id="A")
    b = make_request(b"goodbye", request_id="B")
    s.add_request(a)
    s.add_request(b)
    trace = []
    while s.has_unfinished_requests():
        out, _ = run_step(s)
        trace.append(dict(out.num_scheduled_tokens))
    assert trace == [
        {"A": 8},
        {"A": 3, "B": 5},
        {"A": 1, "B": 2},  # A decodes while B finishes its prefill
        {"A": 1, "B": 1},
        {"A": 1, "B": 1},
        {"B": 1},
    ]
    assert sum(t.get("A", 0) for t in trace) == 11 + 4 - 1


def test_counters_after_each_step(make_scheduler, make_request, run_step):
    s = make_scheduler()
    r = make_request(b"hello", max_tokens=4)
    s.add_request(r)
    events = []
    while s.has_unfinished_requests():
        run_step(s)
        events.append((r.status.name, r.num_computed_tokens, r.num_tokens))
    assert events == [("RUNNING", 5, 6), ("RUNNING", 6, 7), ("RUNNING", 7, 8),
                      ("FINISHED_LENGTH_CAPPED", 8, 9)]
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 63


def test_prefix_cache_gives_a_head_start(make_scheduler, make_request, run_step):
    s = make_scheduler()
    s.add_request(make_request(range(20), request_id="a"))
    run_step(s)
    s.add_request(make_request(list(range(16)) + [99, 98], request_id="b"))
    out, _ = run_step(s)
    assert out.num_cached_tokens == {"b": 16}
    assert out.num_scheduled_tokens == {"a": 1, "b": 2}


def test_identical_prompts_admitted_in_one_step_share_full_blocks(make_scheduler, make_request):
    s = make_scheduler()
    for rid in "abc":
        s.add_request(make_request(range(10), request_id=rid))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 10, "b": 2, "c": 2}
    assert out.num_cached_tokens == {"a": 0, "b": 8, "c": 8}
    kv = s.kv_cache_manager
    assert kv.get_block_ids("a") == [1, 2, 3]
    assert kv.get_block_ids("b") == [1, 2, 4] and kv.get_block_ids("c") == [1, 2, 5]
    kv.block_pool.check_invariants()


def test_prompt_fully_in_cache_still_computes_its_last_token(make_scheduler, make_request, run_step):
    s = make_scheduler()
    s.add_request(make_request(range(8), request_id="a"))
    run_step(s)
    b = make_request(range(8), request_id="b")
    s.add_request(b)
    out, _ = run_step(s)
    # 8 tokens = 2 full cached blocks, but only (8-1)//4 = 1 may be used
    assert out.num_cached_tokens == {"b": 4} and out.num_scheduled_tokens["b"] == 4
    assert b.num_output_tokens == 1


def _two_decoders(make_scheduler, make_request, run_step):
    """Two 8-token requests in a pool of 5 blocks x 4 slots (4 usable)."""
    s = make_scheduler(num_blocks=5, block_size=4)
    a = make_request(range(8), max_tokens=4, request_id="a")
    b = make_request(range(50, 58), max_tokens=4, request_id="b")
    s.add_request(a)
    s.add_request(b)
    run_step(s)  # both prefill: 2 blocks each, pool now full
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    return s, a, b


def test_preemption_takes_the_last_running_request(make_scheduler, make_request, run_step):
    s, a, b = _two_decoders(make_scheduler, make_request, run_step)
    s.add_request(make_request([1, 2], request_id="late"))
    out, _ = run_step(s)  # a needs a 3rd block: b (last) is preempted
    assert out.preempted_req_ids == ["b"]
    assert out.num_scheduled_tokens == {"a": 1}  # no admission in a step that preempted
    assert _ids(s.waiting) == ["b", "late"]  # front of the queue
    assert b.status == RequestStatus.PREEMPTED and b.num_preemptions == 1
    assert b.num_computed_tokens == 0 and b.output_token_ids == [7]  # keeps its token
    assert s.kv_cache_manager.get_block_ids("b") == []
    s.kv_cache_manager.block_pool.check_invariants()


def test_preempted_request_recomputes_prompt_and_output(make_scheduler, make_request, run_step):
    s, a, b = _two_decoders(make_scheduler, make_request, run_step)
    run_step(s)  # b preempted
    while a.status == RequestStatus.RUNNING:
        out, _ = run_step(s)
        assert "b" not in out.num_scheduled_tokens or a.is_finished()
    out, _ = run_step(s)
    # b is back: prompt (8) + 1 output token, minus what its cached prompt block gives
    assert out.num_scheduled_tokens == {"b": 9 - out.num_cached_tokens["b"]}
    assert b.num_output_tokens == 2


def test_request_that_cannot_fit_preempts_itself(make_scheduler, make_request, run_step):
    s = make_scheduler(num_blocks=3, block_size=2)  # 2 usable blocks
    a = make_request(range(4), max_tokens=2, request_id="a")
    s.add_request(a)
    run_step(s)
    b = make_request([9], max_tokens=1, request_id="b")
    s.add_request(b)
    out = s.schedule()
    # a needs a 3rd block for its 5th token; it is the only running request
    assert out.preempted_req_ids == ["a"] and out.num_scheduled_tokens == {}
    assert _ids(s.waiting) == ["a", "b"]


def test_abort_while_waiting_and_while_running(make_scheduler, make_request, run_step):
    s = make_scheduler(max_num_seqs=1)
    a, b = make_request(range(6), request_id="a"), make_request(range(6), request_id="b")
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    s.finish_requests("b", RequestStatus.FINISHED_ABORTED)  # waiting
    assert b.finish_reason == "abort" and _ids(s.waiting) == []
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)  # running
    assert a.finish_reason == "abort" and s.running == []
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 63
    assert s.schedule().finished_req_ids == {"a", "b"}
    assert not s.has_unfinished_requests()
    with pytest.raises(ValueError, match="finished status"):
        s.finish_requests("a", RequestStatus.RUNNING)


def test_constructor_rejects_bad_knobs(make_scheduler):
    for kwargs, name in [({"max_num_seqs": 0}, "max_num_seqs"),
                         ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
                         ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold")]:
        with pytest.raises(ValueError, match=name):
            make_scheduler(**kwargs)


def test_duplicate_request_id_is_rejected(make_scheduler, make_request):
    s = make_scheduler()
    s.add_request(make_request([1], request_id="x"))
    with pytest.raises(ValueError, match="already"):
        s.add_request(make_request([2], request_id="x"))


def test_constructor_rejects_a_bad_max_model_len(make_scheduler):
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match=r"^max_model_len must be None or an integer >= 2"):
            make_scheduler(max_model_len=bad)


def test_update_from_output_refuses_a_lost_or_stray_token_and_changes_nothing(
    make_scheduler, make_request
):
    s = make_scheduler()
    a, b = make_request(range(6), request_id="a"), make_request(range(3), request_id="b")
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()  # both prefill completely: both must sample
    before = [(r.num_computed_tokens, r.num_tokens) for r in (a, b)]
    with pytest.raises(ValueError, match="'b' computed its last token and needs a token"):
        s.update_from_output(out, {"a": 7})
    with pytest.raises(ValueError, match=r"requests \['zz'\] were not scheduled"):
        s.update_from_output(out, {"a": 7, "b": 7, "zz": 7})
    assert [(r.num_computed_tokens, r.num_tokens) for r in (a, b)] == before == [(0, 6), (0, 3)]
    assert s.update_from_output(out, {"a": 7, "b": 8}) == []
    assert (a.output_token_ids, b.output_token_ids) == ([7], [8])


def test_a_token_for_a_request_aborted_mid_step_is_dropped(make_scheduler, make_request):
    s = make_scheduler()
    a, b = make_request(range(6), request_id="a"), make_request(range(3), request_id="b")
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)  # between schedule and update
    assert s.update_from_output(out, {"a": 7, "b": 8}) == []
    assert a.output_token_ids == [] and b.output_token_ids == [8]
    assert s.kv_cache_manager.get_block_ids("a") == []


def test_aborting_many_keeps_the_others_in_order(make_scheduler, make_request, run_step):
    s = make_scheduler(max_num_seqs=3)
    for i in range(6):
        s.add_request(make_request(range(4), request_id=f"r{i}"))
    run_step(s)  # r0..r2 running, r3..r5 waiting
    s.finish_requests(["r1", "r4", "nope", "r1"], RequestStatus.FINISHED_ABORTED)
    assert _ids(s.running) == ["r0", "r2"] and _ids(s.waiting) == ["r3", "r5"]
    assert sorted(s.requests) == ["r0", "r2", "r3", "r5"]
    out, _ = run_step(s)
    assert out.finished_req_ids == {"r1", "r4"} and list(out.num_scheduled_tokens) == ["r0", "r2", "r3"]


def test_a_waiting_request_that_does_not_fit_blocks_those_behind_it(make_scheduler, make_request, run_step):
    # FCFS, as upstream: admission stops at the first request that cannot get its
    # blocks, even if a smaller one behind it would fit.
    s = make_scheduler(num_blocks=5, block_size=4)  # 4 usable blocks
    s.add_request(make_request(range(8), max_tokens=4, request_id="a"))
    run_step(s)  # a holds 2 blocks; next step its 9th token takes a 3rd, leaving 1 free
    s.add_request(make_request(range(50, 62), request_id="big"))  # needs 3 blocks
    s.add_request(make_request([1], request_id="small"))  # would fit in the free one
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1}
    assert _ids(s.waiting) == ["big", "small"] and s.kv_cache_manager.block_pool.get_num_free_blocks() == 1
