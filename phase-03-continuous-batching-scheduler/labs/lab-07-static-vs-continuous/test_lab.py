from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402

WORKLOAD = impl.poisson_workload()  # 32 requests, 0.25 arrivals/step, seed 0


_RUNS = {}


def get_runs():
    # Computed once, inside the tests (not in a fixture), so that on the starter
    # every test fails with the learner's NotImplementedError.
    if not _RUNS:
        _RUNS.update({m: impl.simulate(WORKLOAD, m, max_batch=8) for m in ("static", "continuous")})
    return _RUNS


def test_continuous_beats_static_on_throughput_and_mean_ttft():
    runs = get_runs()
    s, c = impl.summarize(runs["static"]), impl.summarize(runs["continuous"])
    assert (runs["static"].makespan, runs["continuous"].makespan) == (594, 302)
    assert c["throughput"] > s["throughput"]
    assert c["ttft_mean"] < s["ttft_mean"]
    assert round(s["throughput"], 2) == 2.69 and round(c["throughput"], 2) == 5.28
    assert (s["ttft_mean"], c["ttft_mean"]) == (146.21875, 8.8125)
    assert (s["ttft_p50"], s["ttft_p99"]) == (162, 384)
    assert (c["ttft_p50"], c["ttft_p99"]) == (1, 37)


def test_the_workload_is_seeded_and_mixed():
    assert len(WORKLOAD) == 32 and WORKLOAD == impl.poisson_workload()
    assert WORKLOAD == impl.poisson_workload(num_requests=32, rate=0.25, seed=0)
    assert {a.prompt_len for a in WORKLOAD} <= {16, 32, 64, 128}
    assert {a.max_tokens for a in WORKLOAD} <= {4, 8, 16, 32, 64, 128}
    assert len({a.max_tokens for a in WORKLOAD}) >= 5  # high variance in output length
    steps = [a.arrival_step for a in WORKLOAD]
    assert steps == sorted(steps)
    runs = get_runs()  # and both servers accept it
    assert all(len(r.timelines) == 32 for r in runs.values())


def test_every_request_gets_all_its_tokens_and_the_same_tokens_in_both_modes():
    runs = get_runs()
    want = {a.request_id: a.max_tokens for a in WORKLOAD}
    assert sum(want.values()) == 1596 and 1596 / 32 == 49.875  # about 50 tokens of service each
    assert round(8 / (sum(want.values()) / len(want)), 2) == 0.16  # EXERCISES 17: <= 0.16 req/step
    for res in runs.values():
        assert {t.request_id: len(t.token_steps) for t in res.timelines} == want
    # Batching decides *when* tokens are computed, never *which* tokens come out.
    ids = {m: {t.request_id: t.token_ids for t in r.timelines} for m, r in runs.items()}
    assert ids["static"] == ids["continuous"]


def test_no_tick_runs_more_than_max_batch_requests():
    runs = get_runs()
    for res in runs.values():
        for tick in range(res.makespan):
            live = sum(t.admitted_step <= tick <= t.finish_step for t in res.timelines)
            assert live <= 8


def test_static_batching_admits_only_into_an_empty_engine():
    runs = get_runs()
    tl = runs["static"].timelines
    for t in tl:
        others = [o for o in tl if o.admitted_step != t.admitted_step]
        # no request of another batch is still running when this batch starts
        assert all(not (o.admitted_step < t.admitted_step <= o.finish_step) for o in others)
    # ...so a seat freed by a short request stays empty: in continuous mode it does not.
    assert len({t.admitted_step for t in tl}) < len({t.admitted_step for t in runs["continuous"].timelines})


def test_itl_is_one_step_in_both_but_continuous_steps_carry_more_work():
    runs = get_runs()
    s, c = impl.summarize(runs["static"]), impl.summarize(runs["continuous"])
    assert (s["itl_p50"], s["itl_p99"], c["itl_p50"], c["itl_p99"]) == (1, 1, 1, 1)
    # The price of mixing prefills into decode steps (lab-05): bigger steps.
    assert (s["itl_work_p99"], c["itl_work_p99"]) == (8, 135)


def test_littles_law_holds_exactly_over_the_run():
    runs = get_runs()
    for res in runs.values():
        m = impl.summarize(res)
        assert m["mean_in_system"] == pytest.approx(m["arrival_rate"] * m["mean_time_in_system"], rel=1e-12)
        # L measured independently, tick by tick
        per_tick = [sum(t.arrival_step <= k <= t.finish_step for t in res.timelines)
                    for k in range(res.makespan)]
        assert sum(per_tick) / res.makespan == pytest.approx(m["mean_in_system"], rel=1e-12)
    c = impl.summarize(runs["continuous"])
    assert round(c["mean_in_system"], 2) == 6.11 and c["mean_time_in_system"] == 57.6875


def test_saturation_throughput_flattens_below_the_seat_cap_while_ttft_climbs():
    rows = impl.load_sweep()
    assert [r["rate"] for r in rows] == [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5]
    thr = [r["throughput"] for r in rows]
    ttft = [r["ttft_mean"] for r in rows]
    assert thr == sorted(thr) and all(t < 8 for t in thr)
    assert ttft == sorted(ttft) and ttft[:3] == [1.0, 1.0, 1.0] and ttft[-1] > 20
    # below the knee every request starts at once; above it, queueing dominates
    assert [round(t, 2) for t in thr] == [0.83, 1.9, 3.29, 4.29, 4.88, 5.5, 5.89]


def test_admission_order_fcfs_vs_priority():
    a = impl.Arrival("r01", 5, 8, 4, priority=1)
    b = impl.Arrival("r02", 3, 8, 4, priority=1)
    c = impl.Arrival("r03", 9, 8, 4, priority=0)
    assert [x.request_id for x in impl.admission_order([a, b, c], "fcfs")] == ["r02", "r01", "r03"]
    assert [x.request_id for x in impl.admission_order([a, b, c], "priority")] == ["r03", "r02", "r01"]
    with pytest.raises(ValueError, match="policy"):
        impl.admission_order([a], "sjf")


def test_admission_order_breaks_ties_by_id_and_leaves_the_queue_alone():
    queue = [impl.Arrival("r07", 2, 8, 4, priority=1), impl.Arrival("r03", 2, 8, 4, priority=1),
             impl.Arrival("r09", 1, 8, 4, priority=1), impl.Arrival("r05", 2, 8, 4, priority=0),
             impl.Arrival("r01", 2, 8, 4, priority=0)]
    before = list(queue)
    assert [x.request_id for x in impl.admission_order(queue, "fcfs")] == ["r09", "r01", "r03", "r05", "r07"]
    assert [x.request_id for x in impl.admission_order(queue, "priority")] == ["r01", "r05", "r09", "r03", "r07"]
    assert queue == before  # a new list: the caller's queue keeps its order
    assert impl.admission_order([], "fcfs") == []


def test_a_small_token_budget_reaches_the_engine_and_keeps_seats_honest():
    # 16 tokens per step: prompts are chunked and some admitted requests wait inside
    # the engine; they still hold their seat, so no tick has more than 3 live
    res = impl.simulate(WORKLOAD[:10], "continuous", max_batch=3, max_num_batched_tokens=16)
    assert max(res.step_tokens) == 16
    assert sum(len(t.token_steps) for t in res.timelines) == sum(a.max_tokens for a in WORKLOAD[:10])
    for tick in range(res.makespan):
        assert sum(t.admitted_step <= tick <= t.finish_step for t in res.timelines) <= 3
    admitted = sorted(res.timelines, key=lambda t: t.admitted_step)
    assert [t.request_id for t in admitted] == [a.request_id for a in WORKLOAD[:10]]
    # a request handed to the engine holds its seat even while it waits there for
    # budget; otherwise the engine's own FCFS queue would overrule the priority policy
    wl = impl.poisson_workload(12, 0.5, high_priority_fraction=0.3)
    assert [a.request_id for a in wl if a.priority == 0] == ["r08"]
    res = impl.simulate(wl, "continuous", max_batch=2, policy="priority", max_num_batched_tokens=16)
    urgent = next(t for t in res.timelines if t.priority == 0)
    assert urgent.first_token_step + 1 - urgent.arrival_step == 5


def test_priority_policy_cuts_high_priority_ttft_at_the_others_expense():
    wl = impl.poisson_workload(high_priority_fraction=0.25)
    assert [a.request_id for a in wl if a.priority == 0] == ["r00", "r03", "r22", "r26", "r30"]
    ttft = {}
    for policy in impl.POLICIES:
        res = impl.simulate(wl, "continuous", policy=policy)
        hi = [t.first_token_step + 1 - t.arrival_step for t in res.timelines if t.priority == 0]
        lo = [t.first_token_step + 1 - t.arrival_step for t in res.timelines if t.priority == 1]
        ttft[policy] = (sum(hi), sum(lo))
    assert ttft["fcfs"] == (77, 205) and ttft["priority"] == (36, 267)


def test_bad_arguments_are_rejected_with_the_parameter_named():
    with pytest.raises(ValueError, match="mode"):
        impl.simulate(WORKLOAD[:2], "dynamic")
    with pytest.raises(ValueError, match="max_batch"):
        impl.simulate(WORKLOAD[:2], "static", max_batch=0)
    with pytest.raises(ValueError, match="policy"):
        impl.simulate(WORKLOAD[:2], "continuous", policy="sjf")
    with pytest.raises(ValueError, match="policy"):
        impl.admission_order([], "lifo")


def test_max_batch_1_serves_one_request_at_a_time_and_max_ticks_is_exact():
    res = impl.simulate(WORKLOAD[:4], "continuous", max_batch=1)
    spans = sorted((t.admitted_step, t.finish_step) for t in res.timelines)
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))  # never two at once
    assert impl.simulate(WORKLOAD[:4], "continuous", max_batch=1, max_ticks=res.makespan).makespan == res.makespan
    with pytest.raises(RuntimeError, match="max_ticks"):
        impl.simulate(WORKLOAD[:4], "continuous", max_batch=1, max_ticks=res.makespan - 1)


def test_idle_ticks_record_zero_tokens_and_the_work_adds_up():
    runs = get_runs()
    work = sum(a.prompt_len + a.max_tokens - 1 for a in WORKLOAD)  # distinct prompts: no cache hits
    for res in runs.values():
        assert len(res.step_tokens) == res.makespan
        assert sum(res.step_tokens) == work == 3420
        assert res.step_tokens[:2] == [0, 0] and res.step_tokens.count(0) == 2  # nothing arrives before tick 2


def test_outputs_are_the_engines_greedy_tokens_even_on_a_model_that_loves_eos(monkeypatch):
    from mini_vllm.engine import LLMEngine
    from mini_vllm.model import ToyModel
    from mini_vllm.sampling_params import SamplingParams

    few = WORKLOAD[:3]
    res = impl.simulate(few, "continuous")
    for a, t in zip(few, res.timelines, strict=True):
        [want] = LLMEngine("toy").generate(
            [impl._prompt(a)], SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True))
        assert t.token_ids == list(want.output_token_ids)
    monkeypatch.setattr(impl, "LLMEngine", lambda model, *a, **kw: LLMEngine(ToyModel(eos_bias=10.0), *a, **kw))
    res = impl.simulate(few, "static")
    assert [t.token_ids for t in res.timelines] == [[256] * a.max_tokens for a in few]


def _hand_made_result():
    # 100 requests, all arriving at tick 0; request i samples at ticks i and 2i + 1, and
    # tick k carries k tokens. TTFT = ITL = i + 1 (1..100), ITL work = 2i + 1 (1..199).
    tl = [impl.Timeline(f"r{i:03d}", 0, 0, [i, 2 * i + 1], [7, 7]) for i in range(100)]
    return impl.RunResult("continuous", tl, 200, list(range(200)))


def test_summarize_on_a_hand_made_run_uses_nearest_rank_percentiles():
    m = impl.summarize(_hand_made_result())
    assert m == {
        "throughput": 1.0, "ttft_mean": 50.5, "ttft_p50": 50, "ttft_p99": 99,
        "itl_p50": 50, "itl_p99": 99, "itl_work_p99": 197,
        "mean_in_system": 50.5, "mean_time_in_system": 101.0, "arrival_rate": 0.5,
    }


def test_summarize_reports_zero_itl_when_every_request_has_one_token():
    one = impl.RunResult("static", [impl.Timeline("r00", 1, 1, [3], [9])], 4, [0, 0, 0, 5])
    m = impl.summarize(one)
    assert (m["itl_p50"], m["itl_p99"], m["itl_work_p99"]) == (0.0, 0.0, 0.0)
    assert (m["ttft_mean"], m["throughput"], m["mean_in_system"]) == (3.0, 0.25, 0.75)


def test_timeline_png_is_written(tmp_path):
    runs = get_runs()
    pytest.importorskip("matplotlib")
    path = impl.plot_timelines(runs["static"], runs["continuous"], str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 10_000 and path.endswith("t.png")
