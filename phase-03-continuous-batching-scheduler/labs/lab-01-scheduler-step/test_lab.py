from course import load_impl

impl = load_impl(__file__)

from collections import deque  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mini_vllm.kv_cache import KVCacheManager  # noqa: E402
from mini_vllm.request import Request  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402
from mini_vllm.scheduler import Scheduler  # noqa: E402


def roomy_kv():
    return impl.FakeKV(num_blocks=1000, block_size=4)


def test_clamp_applies_threshold_then_budget_and_never_goes_negative():
    assert impl.clamp(100, 2048, 16) == 16  # the threshold binds
    assert impl.clamp(100, 10, 16) == 10  # the budget binds
    assert impl.clamp(5, 2048, 16) == 5  # neither binds
    assert impl.clamp(100, 2048, 0) == 100  # threshold 0 means no cap
    assert impl.clamp(16, 2048, 16) == 16  # a gap equal to the threshold is not cut
    assert impl.clamp(3, 0, 0) == 0


def test_a_4_token_prompt_schedules_4_then_1_then_1():
    r = impl.Req("joke", 4, 3)
    trace = impl.run_workload([(0, r)], roomy_kv(), 2048, 4)
    assert [t.num_scheduled_tokens for t in trace] == [{"joke": 4}, {"joke": 1}, {"joke": 1}]
    assert (r.num_tokens, r.num_computed_tokens, r.num_output_tokens) == (7, 6, 3)


def test_budget_caps_total_tokens_8_plus_2_plus_0():
    waiting = deque(impl.Req(c, 8, 3) for c in "ABC")
    running = []
    out = impl.schedule_step(running, waiting, roomy_kv(), max_num_batched_tokens=10, max_num_seqs=4)
    assert out.num_scheduled_tokens == {"A": 8, "B": 2}
    assert out.total_num_scheduled_tokens == 10
    assert [r.request_id for r in running] == ["A", "B"]
    assert [r.request_id for r in waiting] == ["C"]


def test_worked_example_three_prompts_budget_10_step_by_step():
    reqs = [impl.Req(c, 8, 3) for c in "ABC"]
    trace = impl.run_workload([(0, r) for r in reqs], roomy_kv(), 10, 4)
    assert [t.num_scheduled_tokens for t in trace] == [
        {"A": 8, "B": 2},
        {"A": 1, "B": 6, "C": 3},
        {"A": 1, "B": 1, "C": 5},
        {"B": 1, "C": 1},
        {"C": 1},
    ]
    assert all(r.num_output_tokens == 3 for r in reqs)


def test_max_num_seqs_caps_running_at_4_of_10():
    waiting = deque(impl.Req(f"r{i}", 2, 1) for i in range(10))
    running = []
    out = impl.schedule_step(running, waiting, roomy_kv(), 2048, max_num_seqs=4)
    assert len(out.num_scheduled_tokens) == 4
    assert len(running) == 4 and len(waiting) == 6


def test_long_prefill_threshold_caps_a_100_token_prompt_at_16():
    waiting = deque([impl.Req("long", 100, 1)])
    out = impl.schedule_step([], waiting, roomy_kv(), 2048, 4, long_prefill_token_threshold=16)
    assert out.num_scheduled_tokens == {"long": 16}


def test_running_decode_is_served_before_a_waiting_prompt():
    dec = impl.Req("dec", 4, 10, num_output_tokens=1, num_computed_tokens=4)
    kv = roomy_kv()
    assert kv.allocate(dec, 4)
    running = [dec]
    waiting = deque([impl.Req("new", 20, 1)])
    out = impl.schedule_step(running, waiting, kv, max_num_batched_tokens=8, max_num_seqs=4)
    assert out.num_scheduled_tokens == {"dec": 1, "new": 7}


def test_a_running_request_left_without_budget_is_absent_not_scheduled_for_0():
    kv = roomy_kv()
    a = impl.Req("A", 24, 5, num_computed_tokens=4)  # mid-prefill: 20 prompt tokens to go
    b = impl.Req("B", 4, 5, num_output_tokens=1, num_computed_tokens=4)  # decoding
    assert kv.allocate(a, 0) and kv.allocate(b, 0)
    running, waiting = [a, b], deque([impl.Req("C", 3, 1)])
    out = impl.schedule_step(running, waiting, kv, max_num_batched_tokens=10, max_num_seqs=4)
    # A's chunk eats the whole budget; B keeps its seat but is not in this step at all.
    assert out.num_scheduled_tokens == {"A": 10}
    assert out.preempted_req_ids == [] and running == [a, b] and len(waiting) == 1
    assert impl.finish_step(running, out, kv) == []
    assert (b.num_computed_tokens, b.num_output_tokens) == (4, 1)


def test_admission_stops_at_the_first_request_that_does_not_fit():
    kv = impl.FakeKV(num_blocks=5, block_size=4)  # 4 usable blocks = 16 slots
    a, b, c = impl.Req("A", 12, 4), impl.Req("B", 8, 4), impl.Req("C", 1, 1)
    running, waiting = [], deque([a, b, c])
    out = impl.schedule_step(running, waiting, kv, 2048, 8)
    # A takes 3 blocks and 1 stays free. B needs 2 and cannot fit. C needs 1 and
    # would fit, but it does not jump the queue: head-of-line blocking is the FCFS choice.
    assert out.num_scheduled_tokens == {"A": 12}
    assert [r.request_id for r in waiting] == ["B", "C"]
    assert kv.num_free_blocks == 1 and kv.blocks_needed(c, 1) == 1


def test_preemption_evicts_the_newest_running_request_and_resets_it():
    kv = impl.FakeKV(num_blocks=5, block_size=4)  # 4 usable blocks
    a = impl.Req("A", 8, 10, num_output_tokens=1, num_computed_tokens=8)
    b = impl.Req("B", 8, 10, num_output_tokens=1, num_computed_tokens=8)
    kv.held = {"A": 2, "B": 2}
    kv.num_free_blocks = 0
    late = impl.Req("late", 1, 1)
    running, waiting = [a, b], deque([late])
    out = impl.schedule_step(running, waiting, kv, 2048, 8)
    # A needs a third block: B (the last admitted) is preempted, A gets B's memory.
    assert out.preempted_req_ids == ["B"]
    assert out.num_scheduled_tokens == {"A": 1}
    assert (b.num_computed_tokens, b.num_preemptions, b.num_output_tokens) == (0, 1, 1)
    assert [r.request_id for r in waiting] == ["B", "late"]  # front of the queue
    assert running == [a]
    assert kv.held == {"A": 3} and kv.num_free_blocks == 1


def test_no_admission_in_a_step_that_preempted():
    kv = impl.FakeKV(num_blocks=4, block_size=4)  # 3 usable blocks
    a = impl.Req("A", 4, 10, num_output_tokens=1, num_computed_tokens=4)
    b = impl.Req("B", 8, 10, num_output_tokens=1, num_computed_tokens=8)
    kv.held, kv.num_free_blocks = {"A": 1, "B": 2}, 0
    tiny = impl.Req("tiny", 1, 1)
    running, waiting = [a, b], deque([tiny])
    out = impl.schedule_step(running, waiting, kv, 2048, 8, long_prefill_token_threshold=4)
    # B is evicted to give A its second block, and 1 block is then free. The head
    # of the queue (B again, its 9-token replay cut to a 4-token chunk by the
    # threshold) would fit in it, and so would "tiny" behind it; but a step that
    # preempted admits nobody.
    assert out.preempted_req_ids == ["B"]
    assert out.num_scheduled_tokens == {"A": 1}, (
        "a step that preempted must not run the waiting pass, even for a request that fits"
    )
    assert kv.num_free_blocks == 1
    assert kv.blocks_needed(b, 4) == 1  # B's 4-token chunk would have fitted
    assert running == [a]
    assert [r.request_id for r in waiting] == ["B", "tiny"]


def test_victim_can_be_the_request_itself_which_ends_the_running_pass():
    kv = impl.FakeKV(num_blocks=3, block_size=4)  # 2 usable blocks
    a = impl.Req("A", 4, 10, num_output_tokens=1, num_computed_tokens=4)
    b = impl.Req("B", 4, 10, num_output_tokens=1, num_computed_tokens=4)
    kv.held, kv.num_free_blocks = {"A": 1, "B": 1}, 0
    running, waiting = [a, b], deque()
    out = impl.schedule_step(running, waiting, kv, 2048, 8)
    # A needs a block: B is popped first and A takes its block. (Only A runs.)
    assert out.preempted_req_ids == ["B"]
    assert out.num_scheduled_tokens == {"A": 1}
    # Now A alone, needing a block with none free: it is its own victim.
    kv2 = impl.FakeKV(num_blocks=2, block_size=4)  # 1 usable block
    c = impl.Req("C", 4, 10, num_output_tokens=1, num_computed_tokens=4)
    kv2.held, kv2.num_free_blocks = {"C": 1}, 0
    running2, waiting2 = [c], deque()
    out2 = impl.schedule_step(running2, waiting2, kv2, 2048, 8)
    assert out2.preempted_req_ids == ["C"] and out2.num_scheduled_tokens == {}
    assert running2 == [] and list(waiting2) == [c]


def test_finish_step_emits_only_when_the_counters_meet():
    kv = roomy_kv()
    a = impl.Req("A", 10, 2)
    running, waiting = [], deque([a])
    out = impl.schedule_step(running, waiting, kv, 4, 4)  # a 4-token chunk
    assert impl.finish_step(running, out, kv) == []
    assert (a.num_computed_tokens, a.num_output_tokens) == (4, 0)
    out = impl.schedule_step(running, waiting, kv, 6, 4)  # the last 6 prompt tokens
    impl.finish_step(running, out, kv)
    assert (a.num_computed_tokens, a.num_output_tokens) == (10, 1)
    out = impl.schedule_step(running, waiting, kv, 6, 4)  # one decode token
    assert out.num_scheduled_tokens == {"A": 1}
    assert impl.finish_step(running, out, kv) == [a]
    assert running == [] and kv.held == {}


def test_cramped_pool_preempts_in_the_10th_step_and_replays_in_the_21st():
    a, b = impl.Req("A", 8, 20), impl.Req("B", 8, 20)
    trace = impl.run_workload([(0, a), (0, b)], impl.FakeKV(10, 4), 2048, 4)
    preempt_steps = [i for i, t in enumerate(trace) if t.preempted_req_ids]
    assert preempt_steps == [9] and trace[9].preempted_req_ids == ["B"]
    assert trace[20].num_scheduled_tokens == {"B": 17}  # 8 prompt + 9 outputs recomputed
    assert len(trace) == 31
    assert a.num_output_tokens == b.num_output_tokens == 20
    # the same run, stopped after 9 steps: 4 blocks each, 8 of the 9 usable taken
    kv, running, waiting = impl.FakeKV(10, 4), [], deque([impl.Req("A", 8, 20), impl.Req("B", 8, 20)])
    for _ in range(9):
        impl.finish_step(running, impl.schedule_step(running, waiting, kv, 2048, 4), kv)
    assert kv.held == {"A": 4, "B": 4} and kv.num_free_blocks == 1


# ---- the oracle: mini_vllm's Scheduler on random workloads --------------------


def mini_vllm_trace(spec, num_blocks, block_size, budget, seqs, threshold):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=False)
    sched = Scheduler(kv, max_num_seqs=seqs, max_num_batched_tokens=budget,
                      long_prefill_token_threshold=threshold)
    pending = sorted(spec, key=lambda s: s[0])
    trace = []
    for step in range(10_000):
        while pending and pending[0][0] <= step:
            _, rid, p, m = pending.pop(0)
            sched.add_request(Request(rid, [1] * p, SamplingParams(max_tokens=m, ignore_eos=True), None))
        if not pending and not sched.has_unfinished_requests():
            return trace
        out = sched.schedule()
        sampled = {
            r.request_id: 7
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        sched.update_from_output(out, sampled)
        trace.append((dict(out.num_scheduled_tokens), list(out.preempted_req_ids)))
    raise AssertionError("mini_vllm did not finish")


def assert_same_trace(ours, expected, workload):
    """Step by step, so a failure names the first step where the two schedulers part ways."""
    mine = [(t.num_scheduled_tokens, t.preempted_req_ids) for t in ours]
    for i, (got, want) in enumerate(zip(mine, expected, strict=False)):
        assert got == want, (
            f"step {i + 1} (trace[{i}]) of {workload}: you scheduled {got[0]} and preempted "
            f"{got[1]}; mini_vllm scheduled {want[0]} and preempted {want[1]}"
        )
    assert len(mine) == len(expected), (
        f"{workload}: your run took {len(mine)} steps, mini_vllm's {len(expected)}"
    )


workloads = st.fixed_dictionaries({
    "block_size": st.sampled_from([1, 2, 4, 8]),
    "reqs": st.lists(
        st.tuples(st.integers(0, 8), st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=7
    ),
    "budget": st.integers(1, 64),
    "seqs": st.integers(1, 5),
    "threshold": st.integers(0, 20),
    "spare_blocks": st.integers(0, 8),
})


@settings(max_examples=60, deadline=None, derandomize=True)
@given(workloads)
def test_matches_mini_vllm_scheduler_step_for_step_on_random_workloads(w):
    bs = w["block_size"]
    spec = [(t, f"r{i}", p, m) for i, (t, p, m) in enumerate(w["reqs"])]
    # Tight but feasible: the largest request alone always fits (block 0 is reserved).
    largest = max(-(-(p + m - 1) // bs) for _, _, p, m in spec)
    num_blocks = 1 + largest + w["spare_blocks"]
    expected = mini_vllm_trace(spec, num_blocks, bs, w["budget"], w["seqs"], w["threshold"])

    reqs = [(t, impl.Req(rid, p, m)) for t, rid, p, m in spec]
    ours = impl.run_workload(reqs, impl.FakeKV(num_blocks, bs), w["budget"], w["seqs"], w["threshold"])
    assert_same_trace(ours, expected, (
        f"the workload (arrival step, id, prompt, max_tokens) {spec} with num_blocks={num_blocks}, "
        f"block_size={bs}, budget={w['budget']}, max_num_seqs={w['seqs']}, threshold={w['threshold']}"
    ))
    for t in ours:
        assert t.total_num_scheduled_tokens <= w["budget"]
    assert all(r.num_output_tokens == r.max_tokens for _, r in reqs)


def test_random_comparison_really_exercises_preemption():
    import random

    rng = random.Random(3)
    workloads_with_preemption = 0
    for _ in range(30):
        bs = rng.choice([1, 2, 4])
        spec = [(rng.randint(0, 4), f"r{i}", rng.randint(1, 30), rng.randint(1, 12)) for i in range(5)]
        largest = max(-(-(p + m - 1) // bs) for _, _, p, m in spec)
        num_blocks, budget, seqs, thr = 1 + largest + rng.randint(0, 3), rng.randint(4, 64), 4, rng.randint(0, 8)
        expected = mini_vllm_trace(spec, num_blocks, bs, budget, seqs, thr)
        reqs = [(t, impl.Req(rid, p, m)) for t, rid, p, m in spec]
        ours = impl.run_workload(reqs, impl.FakeKV(num_blocks, bs), budget, seqs, thr)
        assert_same_trace(ours, expected, (
            f"the workload (arrival step, id, prompt, max_tokens) {spec} with num_blocks={num_blocks}, "
            f"block_size={bs}, budget={budget}, max_num_seqs={seqs}, threshold={thr}"
        ))
        workloads_with_preemption += any(t.preempted_req_ids for t in ours)
    assert workloads_with_preemption >= 10
