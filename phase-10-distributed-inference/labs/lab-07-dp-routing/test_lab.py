"""Lab 10-07 tests: vLLM's DP load balancer, a front end over real engines, and DP ranks on gloo."""
from __future__ import annotations

import ast
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

from mini_vllm import LLMEngine, SamplingParams  # noqa: E402
from mini_vllm.distributed import run_in_processes  # noqa: E402

UPSTREAM = course.UPSTREAM
CORE_CLIENT = UPSTREAM / "vllm/v1/engine/core_client.py"
PARALLEL = UPSTREAM / "vllm/config/parallel.py"
CORE = UPSTREAM / "vllm/v1/engine/core.py"
COORDINATOR = UPSTREAM / "vllm/v1/engine/coordinator.py"
HAVE_UPSTREAM = (UPSTREAM / "vllm").is_dir()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def naive_route(counts, start_index=0):
    """Test-side: the same scan with no local increment (what a stale table does to a burst)."""
    scores = [w * 4 + r for w, r in counts]
    order = [(start_index + i) % len(counts) for i in range(len(counts))]
    return min(order, key=lambda i: scores[i])  # min keeps the first of equal keys


# ---------------------------------------------------------------- the start index and the score


def test_start_index_spreads_clients_over_engines():
    # (num_engines * client_index) // client_count
    assert impl.engine_start_index(4, 0, 1) == 0
    assert impl.engine_start_index(4, 1, 2) == 2  # 4 // 2; client_index % num_engines gives 1
    assert impl.engine_start_index(4, 2, 3) == 2  # 8 // 3
    assert impl.engine_start_index(8, 2, 3) == 5  # 16 // 3; client_index * (8 // 3) gives 4
    assert impl.engine_start_index(2, 3, 4) == 1  # 6 // 4: more clients than engines share starts
    assert [impl.engine_start_index(4, c, 4) for c in range(4)] == [0, 1, 2, 3]


def test_score_weighs_a_waiting_request_four_times():
    assert impl.lb_score(0, 0) == 0
    assert impl.lb_score(1, 0) == 4
    assert impl.lb_score(2, 3) == 11  # 2 * 4 + 3
    assert impl.lb_score(0, 7) == 7
    # one waiting request (4) outweighs three running ones (3)...
    assert impl.choose_engine([[1, 0], [0, 3]]) == 1
    # ...ties with four (the first scanned stays: engine 0)...
    assert impl.choose_engine([[1, 0], [0, 4]]) == 0
    # ...and loses to five. waiting + running would pick engine 0 in the first case;
    # running * 4 + waiting would pick engine 0 in all three.
    assert impl.choose_engine([[1, 0], [0, 5]]) == 0
    assert impl.choose_engine([[0, 5], [1, 0]]) == 1


def test_choose_engine_on_crafted_counts():
    counts = [[1, 0], [0, 3], [0, 4], [1, 1]]  # scores 4, 3, 4, 5
    assert impl.choose_engine(counts) == 1
    # the choice is booked in place, as one more WAITING request (running untouched)
    assert counts == [[1, 0], [1, 3], [0, 4], [1, 1]]  # scores 4, 7, 4, 5
    assert impl.choose_engine(counts) == 0  # 0 and 2 tie at 4: 0 is scanned first
    assert counts == [[2, 0], [1, 3], [0, 4], [1, 1]]  # scores 8, 7, 4, 5
    assert impl.choose_engine(counts) == 2
    assert impl.choose_engine(counts) == 3  # scores 8, 7, 8, 5
    assert counts == [[2, 0], [1, 3], [1, 4], [2, 1]]  # scores 8, 7, 8, 9
    assert impl.choose_engine(counts) == 1


def test_ties_go_to_the_first_engine_scanned_from_the_start_index():
    assert impl.choose_engine([[0, 0]] * 1 + [[0, 0] for _ in range(3)], start_index=2) == 2
    assert impl.choose_engine([[0, 0] for _ in range(4)], start_index=3) == 3
    # scores 1, 5, 1, 5: from 1 the scan is 1, 2, 3, 0 -> engine 2 (a <= comparison keeps 0,
    # the last tie scanned; a scan from 0 would also say 0)
    assert impl.choose_engine([[0, 1], [1, 1], [0, 1], [1, 1]], start_index=1) == 2
    assert impl.choose_engine([[0, 1], [1, 1], [0, 1], [1, 1]], start_index=3) == 0
    assert impl.choose_engine([[0, 1], [1, 1], [0, 1], [1, 1]], start_index=2) == 2


def test_local_increment_books_client_count():
    # 2 front ends: each booking stands for one request from the other front end too.
    # Published: engines 2 and 3 each have one waiting (score 4), 0 and 1 are empty.
    counts = [[0, 0], [0, 0], [1, 0], [1, 0]]
    choices = [impl.choose_engine(counts, 0, client_count=2) for _ in range(4)]
    # +2 per booking: 0 -> 8, 1 -> 8, then 2 (4) and 3 (4). Adding 1 instead makes 0 and 1
    # score 4 and the scan returns to them first: [0, 1, 0, 1]
    assert choices == [0, 1, 2, 3]
    assert counts == [[2, 0], [2, 0], [3, 0], [3, 0]]


def test_a_burst_between_publications_does_not_herd():
    # 8 requests, 4 engines, one stale table of zeros (no publication in between)
    stale = [[0, 0] for _ in range(4)]
    herd = [naive_route(stale) for _ in range(8)]
    assert herd == [0] * 8  # without the local increment every request sees the same table
    counts = [[0, 0] for _ in range(4)]
    choices = [impl.choose_engine(counts) for _ in range(8)]
    assert choices == [0, 1, 2, 3, 0, 1, 2, 3]
    assert np.bincount(choices, minlength=4).tolist() == [2, 2, 2, 2]
    # two front ends, each with its own copy of the table, 4 requests each: client 1
    # starts at engine 2, so together they still put 2 on every engine
    both = []
    for client in range(2):
        table = [[0, 0] for _ in range(4)]
        start = impl.engine_start_index(4, client, 2)
        both += [impl.choose_engine(table, start, client_count=2) for _ in range(4)]
    assert both == [0, 1, 2, 3, 2, 3, 0, 1]


def test_an_explicit_dp_rank_is_obeyed_and_not_booked():
    counts = [[0, 0], [5, 5], [0, 0], [0, 0]]
    assert impl.choose_engine(counts, dp_rank=1) == 1  # the busiest engine, because asked
    assert counts == [[0, 0], [5, 5], [0, 0], [0, 0]]
    assert impl.choose_engine(counts, dp_rank=0, client_count=3) == 0
    assert counts == [[0, 0], [5, 5], [0, 0], [0, 0]]


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match=r"num_engines must be >= 1"):
        impl.engine_start_index(0, 0, 1)
    with pytest.raises(ValueError, match=r"client_count must be >= 1"):
        impl.engine_start_index(4, 0, 0)
    with pytest.raises(ValueError, match=r"client_index must be in \[0, 2\)"):
        impl.engine_start_index(4, 2, 2)
    with pytest.raises(ValueError, match=r"waiting must be >= 0"):
        impl.lb_score(-1, 0)
    with pytest.raises(ValueError, match=r"running must be an integer"):
        impl.lb_score(0, 1.5)
    with pytest.raises(ValueError, match=r"counts must be a non-empty list"):
        impl.choose_engine([])
    with pytest.raises(ValueError, match=r"counts must be a non-empty list"):
        impl.choose_engine([(0, 0), (1, 1)])  # tuples cannot take the booking
    with pytest.raises(ValueError, match=r"counts must be >= 0"):
        impl.choose_engine([[0, 0], [0, -1]])
    with pytest.raises(ValueError, match=r"counts must be an integer"):
        impl.choose_engine([[0, 0.5], [0, 0]])
    with pytest.raises(ValueError, match=r"start_index must be in \[0, 2\)"):
        impl.choose_engine([[0, 0], [0, 0]], start_index=2)
    with pytest.raises(ValueError, match=r"client_count must be >= 1"):
        impl.choose_engine([[0, 0], [0, 0]], client_count=0)
    with pytest.raises(ValueError, match=r"dp_rank must be in \[0, 2\)"):
        impl.choose_engine([[0, 0], [0, 0]], dp_rank=2)
    engines = [LLMEngine("tiny-random", seed=0)]
    with pytest.raises(ValueError, match=r"policy must be one of score, round_robin"):
        impl.serve_dp(engines, [], policy="random")
    with pytest.raises(ValueError, match=r"publish_every must be >= 1"):
        impl.serve_dp(engines, [], publish_every=0)
    with pytest.raises(ValueError, match=r"engines must be a non-empty list"):
        impl.serve_dp([], [])
    with pytest.raises(ValueError, match=r"arrivals must be a list of \(tick, prompt, params\)"):
        impl.serve_dp(engines, [(0, "hi")])
    with pytest.raises(ValueError, match=r"arrivals must be >= 0"):
        impl.serve_dp(engines, [(-1, "hi", greedy(1))])
    with pytest.raises(ValueError, match=r"sync_every must be >= 1"):
        impl.dp_wave_loop(engines[0], sync_every=0)
    with pytest.raises(ValueError, match=r"num_tokens must be >= 0"):
        impl.num_tokens_across_dp(-1)
    with pytest.raises(ValueError, match=r"local_unfinished must be a bool"):
        impl.has_unfinished_dp(1)


# ---------------------------------------------------------------- real engines in one process


def test_engine_counts_are_waiting_then_running():
    engine = LLMEngine("tiny-random", seed=0, max_num_seqs=2)
    assert impl.engine_counts(engine) == [0, 0]
    for p in ("one", "two", "three"):
        engine.add_request(p, greedy(3))
    assert impl.engine_counts(engine) == [3, 0]
    engine.step()  # max_num_seqs = 2: two run, one waits
    assert impl.engine_counts(engine) == [1, 2]  # upstream's scheduler says (2, 1): the swap
    first = impl.engine_counts(engine)
    first[0] = 99
    assert impl.engine_counts(engine) == [1, 2]  # a fresh list each call


def burst(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(0, {"prompt_token_ids": rng.integers(0, 256, size=int(rng.integers(3, 12))).tolist()},
             greedy(int(rng.integers(2, 7)))) for _ in range(n)]


def test_burst_on_four_real_engines_stays_within_one():
    arrivals = burst(10)
    engines = [LLMEngine("tiny-random", seed=0, enable_caching=False) for _ in range(4)]
    run = impl.serve_dp(engines, arrivals, publish_every=100)
    assert run.engine_of == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert len(run.queue_sizes) == 10
    for sizes in run.queue_sizes:  # what the engines hold, after every single decision
        assert max(sizes) - min(sizes) <= 1, sizes
    assert run.queue_sizes[-1] == [3, 3, 2, 2]
    # everyone arrived at tick 0 and was prefilled in tick 0 (a 2,048-token budget)
    assert run.first_token_tick == [0] * 10
    assert [len(t) for t in run.token_ids] == [p.max_tokens for _, _, p in arrivals]
    assert run.ticks == max(p.max_tokens for _, _, p in arrivals)  # 6: the longest request
    # data parallelism moves requests, not tokens: one engine serving all ten agrees
    ref = LLMEngine("tiny-random", seed=0, enable_caching=False).generate(
        [a[1] for a in arrivals], [a[2] for a in arrivals])
    assert run.token_ids == [r.output_token_ids for r in ref]


def test_the_table_is_only_as_fresh_as_the_last_publication():
    # tick 0: four requests, one per engine; engine 2's wants 1 token and is done in tick 0.
    # tick 1: one more request. A fresh table says engine 2 is empty; the table
    # published at tick 0 (plus the four bookings) says all four score 4 -> engine 0.
    def arrivals():
        return [(0, "a", greedy(5)), (0, "b", greedy(5)), (0, "c", greedy(1)), (0, "d", greedy(5)),
                (1, "e", greedy(2))]
    fresh = impl.serve_dp([LLMEngine("tiny-random", seed=0) for _ in range(4)], arrivals(),
                          publish_every=1)
    stale = impl.serve_dp([LLMEngine("tiny-random", seed=0) for _ in range(4)], arrivals(),
                          publish_every=2)
    assert fresh.engine_of == [0, 1, 2, 3, 2]
    assert stale.engine_of == [0, 1, 2, 3, 0]
    # engine 0 still runs "a" (running 1), so the stale choice queues behind it in a batch
    assert stale.queue_sizes[-1] == [2, 1, 0, 1]
    assert fresh.queue_sizes[-1] == [1, 1, 1, 1]
    assert fresh.first_token_tick == stale.first_token_tick == [0, 0, 0, 0, 1]
    assert fresh.ticks == stale.ticks == 5


def test_round_robin_and_the_second_client_start():
    arrivals = [(t // 2, {"prompt_token_ids": [t + 1, 7, 9]}, greedy(2)) for t in range(6)]
    engines = [LLMEngine("tiny-random", seed=0) for _ in range(4)]
    rr = impl.serve_dp(engines, arrivals, policy="round_robin", client_index=1, client_count=2)
    assert rr.engine_of == [2, 3, 0, 1, 2, 3]  # starts at engine_start_index(4, 1, 2) = 2
    assert rr.arrival_tick == [0, 0, 1, 1, 2, 2]
    assert rr.first_token_tick == [0, 0, 1, 1, 2, 2]
    assert rr.ticks == 4  # the tick-2 pair needs ticks 2 and 3
    score = impl.serve_dp([LLMEngine("tiny-random", seed=0) for _ in range(4)], arrivals,
                          client_index=1, client_count=2)
    # client 1 of 2 books 2 per request: 2, 3; tick 1 (fresh table: 2 and 3 running) -> 0, 1;
    # tick 2: all four score 1 again (running) -> the scan from 2 -> 2, then 3 (2 scores 1 + 8)
    assert score.engine_of == [2, 3, 0, 1, 2, 3]
    # arrivals need not be listed in tick order: they are routed by tick, list order within one
    shuffled = [arrivals[i] for i in (4, 2, 0, 5, 3, 1)]
    late = impl.serve_dp([LLMEngine("tiny-random", seed=0) for _ in range(4)], shuffled,
                         policy="round_robin")
    assert late.arrival_tick == [2, 1, 0, 2, 1, 0]
    assert late.engine_of == [0, 2, 0, 1, 3, 1]  # routed in the order 2, 5, 1, 4, 0, 3 (list indices)
    assert late.first_token_tick == late.arrival_tick


def test_skewed_workload_score_vs_round_robin_printed(capsys):
    arrivals = impl.skewed_workload(seed=0)
    runs = {p: impl.serve_dp(impl.make_engines(), arrivals, policy=p, publish_every=2)
            for p in impl.POLICIES}
    with capsys.disabled():
        print()
        for p, run in runs.items():
            ttft = run.ttft_ticks()
            print(f"    {p:11s}: per engine {np.bincount(run.engine_of, minlength=4).tolist()}, "
                  f"TTFT ticks mean {ttft.mean():.2f} max {ttft.max()}, {run.ticks} ticks")
    # printed, not asserted: which policy wins depends on the mix. Asserted: both are complete
    # and correct, and the round robin really is one.
    assert runs["round_robin"].engine_of == [i % 4 for i in range(24)]
    for run in runs.values():
        assert (run.ttft_ticks() >= 0).all()
        assert [len(t) for t in run.token_ids] == [a[2].max_tokens for a in arrivals]
    assert runs["score"].token_ids == runs["round_robin"].token_ids


# ---------------------------------------------------------------- DP ranks on real gloo

# max_tokens of each rank's requests: rank 0 is busy for 9 steps, rank 3 has nothing
SPECS = [[6, 9, 4], [5], [3, 7], []]
BUSY = [9, 5, 7, 0]
FLAG_PATTERNS = [(False, False, True, False), (False, False, False, False), (True, True, True, True)]


def rank_prompts(rank):
    return [[(rank * 7 + j * 3 + k) % 256 for k in range(4 + j)] for j in range(len(SPECS[rank]))]


def expected_tokens(rank, iteration):
    """Test-side: the tokens rank ``rank`` runs in wave iteration ``iteration`` (1-based).

    Step 1 prefills every prompt (4, 5, 6 tokens ...) and samples each first token;
    step k > 1 decodes one token for each request with max_tokens >= k; an idle
    rank runs a 1-token dummy batch.
    """
    spec = SPECS[rank]
    if iteration > BUSY[rank]:
        return 1
    if iteration == 1:
        return sum(len(p) for p in rank_prompts(rank))
    return sum(m >= iteration for m in spec)


def _upstream_dp_sync():
    """``has_unfinished_dp`` and ``sync_dp_state`` from upstream's ParallelConfig (ast, no vllm import)."""
    import torch
    import torch.distributed as dist

    tree = ast.parse(PARALLEL.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ParallelConfig")
    fns = [n for n in cls.body if isinstance(n, ast.FunctionDef)
           and n.name in ("has_unfinished_dp", "sync_dp_state")]
    assert len(fns) == 2
    for fn in fns:
        fn.decorator_list = []
    ns = {"torch": torch, "ReduceOp": dist.ReduceOp, "ProcessGroup": object}
    exec(compile(ast.Module(body=fns, type_ignores=[]), str(PARALLEL), "exec", dont_inherit=True), ns)
    return ns["has_unfinished_dp"], ns["sync_dp_state"]


def _rank_main(rank, world_size, upstream_fns):
    import torch.distributed as dist

    out = {"flags": [impl.has_unfinished_dp(p[rank]) for p in FLAG_PATTERNS],
           "across": impl.num_tokens_across_dp(10 * rank + 3)}
    if upstream_fns is not None:
        up_has, up_sync = upstream_fns
        out["up_has"] = [up_has(dist.group.WORLD, p[rank]) for p in FLAG_PATTERNS]
        out["up_sync"] = [up_sync(dist.group.WORLD, p[rank], False)[0] for p in FLAG_PATTERNS]
    engine = LLMEngine("tiny-random", seed=0, enable_caching=False)
    for sync_every in (1, 4, impl.DP_SYNC_INTERVAL):
        for j, prompt in enumerate(rank_prompts(rank)):
            engine.add_request({"prompt_token_ids": prompt}, greedy(SPECS[rank][j]))
        wave = impl.dp_wave_loop(engine, sync_every=sync_every)
        wave["unfinished_after"] = engine.has_unfinished_requests()
        out[sync_every] = wave
    return out


@pytest.fixture(scope="module")
def world():
    import torch.distributed  # noqa: F401 - imported once here, shared by the forked ranks

    upstream_fns = _upstream_dp_sync() if HAVE_UPSTREAM else None
    return run_in_processes(4, _rank_main, upstream_fns, timeout=30.0)


def test_has_unfinished_is_an_or_across_ranks(world):
    for r in range(4):
        assert world[r]["flags"] == [True, False, True]  # one busy rank keeps everyone going


def test_num_tokens_across_dp_is_the_same_list_on_every_rank(world):
    for r in range(4):
        assert world[r]["across"] == [3, 13, 23, 33]


@pytest.mark.parametrize("sync_every, iterations", [(1, 9), (4, 12), (32, 32)])
def test_wave_keeps_every_rank_in_lockstep(world, sync_every, iterations):
    # the wave lasts until a sync finds every rank idle: the busiest rank's 9 steps,
    # rounded up to the next multiple of sync_every (upstream: 32, so 23 extra dummy
    # steps on the busiest rank here)
    for r in range(4):
        wave = world[r][sync_every]
        assert wave["iterations"] == iterations
        assert wave["busy_steps"] == BUSY[r]
        assert wave["dummy_steps"] == iterations - BUSY[r]  # rank 3: a whole wave of dummies
        assert wave["syncs"] == iterations // sync_every
        assert not wave["unfinished_after"]
        # every collective matched: the i-th call returned the same list on every rank,
        # and column q of it is what rank q ran in iteration i
        assert wave["tokens_across_dp"] == world[0][sync_every]["tokens_across_dp"]
    expected = [[expected_tokens(q, i) for q in range(4)] for i in range(1, iterations + 1)]
    assert world[0][sync_every]["tokens_across_dp"] == expected
    assert expected[0] == [15, 4, 9, 1]  # prompts 4+5+6, 4, 4+5; rank 3's dummy token


@pytest.mark.upstream
def test_upstream_dp_state_sync_agrees(world):
    for r in range(4):
        assert world[r]["up_has"] == world[r]["flags"]
        assert world[r]["up_sync"] == world[r]["flags"]


# ---------------------------------------------------------------- against upstream's router


def _upstream_router():
    """``get_core_engine_for_request`` and the start-index expression from upstream (ast)."""
    tree = ast.parse(CORE_CLIENT.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DPLBAsyncMPClient")
    meth = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
                and n.name == "get_core_engine_for_request")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    start = next(n.value for n in ast.walk(init) if isinstance(n, ast.Assign)
                 and ast.unparse(n.targets[0]) == "self.eng_start_index")
    ns = {"sys": sys, "get_late_interaction_engine_index": lambda pooling, n: None,
          "EngineCoreRequest": object, "EngineIdentity": object}
    exec(compile(ast.Module(body=[meth], type_ignores=[]), str(CORE_CLIENT), "exec", dont_inherit=True), ns)
    start_expr = compile(ast.Expression(start), str(CORE_CLIENT), "eval")
    return ns["get_core_engine_for_request"], start_expr


@pytest.mark.upstream
def test_same_choices_as_upstreams_router():
    route, start_expr = _upstream_router()
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(2, 9))
        client_count = int(rng.integers(1, 5))
        client_index = int(rng.integers(0, client_count))
        client = SimpleNamespace(core_engines=list(range(n)), client_index=client_index,
                                 client_count=client_count, reqs_in_flight={})
        client.eng_start_index = eval(start_expr, {"self": client, "client_count": client_count})
        assert impl.engine_start_index(n, client_index, client_count) == client.eng_start_index
        table = rng.integers(0, 4, size=(n, 2)).tolist()
        client.lb_engines = [list(row) for row in table]
        mine = [list(row) for row in table]
        for k in range(int(rng.integers(1, 12))):
            pinned = int(rng.integers(0, n)) if rng.random() < 0.1 else None
            req = SimpleNamespace(request_id=f"r{trial}-{k}", data_parallel_rank=pinned, pooling_params=None)
            theirs = route(client, req)
            assert impl.choose_engine(mine, client.eng_start_index, client_count, dp_rank=pinned) == theirs
            assert mine == client.lb_engines


@pytest.mark.upstream
def test_constants_match_upstream():
    src = CORE_CLIENT.read_text()
    weight = int(re.search(r"score = waiting \* (\d+) \+ running", src).group(1))
    assert weight == impl.WAITING_WEIGHT == impl.lb_score(1, 0) and impl.lb_score(0, 1) == 1
    assert re.search(r"current_counts\[eng_index\]\[0\] \+= self\.client_count", src)
    core = CORE.read_text()
    assert int(re.search(r"self\.step_counter % (\d+) != 0", core).group(1)) == impl.DP_SYNC_INTERVAL
    # the coordinator publishes the counts at most every 100 ms
    assert "min_stats_update_interval_ms: int = 100" in COORDINATOR.read_text()
