"""Lab 11-04 tests: GPU slots and the CPU adapter cache, the max_loras skip, the LoRA block-hash key."""
from __future__ import annotations

import ast
import collections
import collections.abc
import functools
import itertools
import math
from types import SimpleNamespace
from typing import TypeVar

import pytest

import course
from course import load_impl

impl = load_impl(__file__)

UPSTREAM = course.UPSTREAM
FUTURE_ANNOTATIONS = annotations.compiler_flag  # the future import binds the feature object


def run(trace, num_slots, max_cpu_loras=None):
    """Every (event, slot) of a fresh cache over ``trace``, and the cache."""
    cache = impl.AdapterSlotCache(num_slots, max_cpu_loras)
    return [cache.activate(x) for x in trace], cache


# ---------------------------------------------------------------- one level: fill, hit, evict

# Each of these runs twice. With max_cpu_loras == num_slots (None, upstream's
# default) the CPU cache is full whenever the slots are, so it drops the victim
# first and frees its slot; with a large CPU cache (16) the GPU level's own LRU
# picks it. Both must pick the same adapter.
CPU_SIZES = pytest.mark.parametrize("cpu", [None, 16])


@CPU_SIZES
def test_fill_then_hit(cpu):
    events, cache = run([1, 2, 3, 2, 1], 3, cpu)
    # three free slots fill in index order; the repeats are hits where they sit
    assert events == [("load", 0), ("load", 1), ("load", 2), ("hit", 1), ("hit", 0)]
    assert cache.slots == [1, 2, 3]
    assert cache.active == (3, 2, 1)  # least recently used first: the hits moved 2, then 1
    assert cache.stats == {"hit": 2, "load": 3, "evict+load": 0, "disk_load": 3}


@CPU_SIZES
def test_lru_evicts_the_least_recently_used(cpu):
    # 1, 2, then 1 again: 2 is now the oldest, so 3 takes 2's slot (index 1).
    # A hit that does not refresh recency (FIFO) evicts 1 from slot 0 instead;
    # evicting the most recent also hits 1 (slot 0).
    events, cache = run([1, 2, 1, 3], 2, cpu)
    assert events == [("load", 0), ("load", 1), ("hit", 0), ("evict+load", 1)]
    assert cache.slots == [1, 3] and cache.active == (1, 3)
    # and once more: 1 is now the oldest
    assert cache.activate(4) == ("evict+load", 0)
    assert cache.slots == [4, 3] and cache.active == (3, 4)


@CPU_SIZES
def test_newcomer_takes_the_first_free_slot_index(cpu):
    # upstream scans lora_index_to_id for the first None. After 1, 2, 3 and a hit
    # on 1, adapter 2 (slot 1) is the oldest: 4 lands in slot 1, in the middle of
    # the table. "slot = len(active)" would write slot 2 and overwrite adapter 3.
    events, cache = run([1, 2, 3, 1, 4], 3, cpu)
    assert events[-1] == ("evict+load", 1)
    assert cache.slots == [1, 4, 3]
    # now 3 (slot 2) is the oldest, then 1 (slot 0)
    assert cache.activate(5) == ("evict+load", 2)
    assert cache.activate(6) == ("evict+load", 0)
    assert cache.slots == [6, 4, 5] and cache.active == (4, 5, 6)
    # the table never holds an adapter twice, and every active adapter has a slot
    assert sorted(x for x in cache.slots if x is not None) == sorted(cache.active)


@CPU_SIZES
def test_cyclic_traffic_thrashes_lru(cpu):
    # 5 adapters in a cycle over 4 slots: each request evicts exactly the adapter
    # that comes back soonest, so LRU never hits (evicting the most recent would
    # keep 3 of the 5 and hit often). 4 adapters fit: every request after the
    # first four is a hit.
    events, cache = run([1, 2, 3, 4, 5] * 8, 4, cpu)
    assert cache.stats["hit"] == 0 and cache.stats["evict+load"] == 36
    # the slot each newcomer takes cycles through 0, 1, 2, 3
    assert [s for _, s in events[4:12]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert cache.stats["disk_load"] == (40 if cpu is None else 5)
    _, cache = run([1, 2, 3, 4] * 8, 4, cpu)
    assert cache.stats == {"hit": 28, "load": 4, "evict+load": 0, "disk_load": 4}


# ---------------------------------------------------------------- two levels: the CPU cache


def test_cpu_cache_is_a_second_lru_touched_on_every_activation():
    # num_slots 2, max_cpu_loras 4. "registered" is the CPU cache, oldest first.
    cache = impl.AdapterSlotCache(2, max_cpu_loras=4)
    steps = [  # adapter, (event, slot), slots after, registered after, disk loads so far
        (1, ("load", 0), [1, None], (1,), 1),
        (2, ("load", 1), [1, 2], (1, 2), 2),
        (3, ("evict+load", 0), [3, 2], (1, 2, 3), 3),        # 1 leaves its slot, stays on CPU
        (1, ("evict+load", 1), [3, 1], (2, 3, 1), 3),        # CPU hit: no disk load, 1 touched
        (4, ("evict+load", 0), [4, 1], (2, 3, 1, 4), 4),
        (5, ("evict+load", 1), [4, 5], (3, 1, 4, 5), 5),     # CPU full: 2 (oldest) dropped
        (2, ("evict+load", 0), [2, 5], (1, 4, 5, 2), 6),     # 2 comes back from disk
        (1, ("evict+load", 1), [2, 1], (4, 5, 2, 1), 6),     # 1 survived on CPU: no disk load
    ]
    for lora_id, result, slots, registered, disk in steps:
        assert cache.activate(lora_id) == result, lora_id
        assert cache.slots == slots and cache.registered == registered, lora_id
        assert cache.stats["disk_load"] == disk
    # every slotted adapter is CPU-resident too
    assert set(cache.active) <= set(cache.registered)


def test_cpu_eviction_frees_the_slot_of_the_adapter_it_drops():
    # max_cpu_loras == num_slots (upstream's default): a newcomer must first make
    # room on the CPU, and the CPU cache's oldest adapter is slotted, so dropping
    # it frees its slot (upstream: the removal hook calls deactivate_adapter).
    cache = impl.AdapterSlotCache(3)
    assert cache.max_cpu_loras == 3
    for x in (1, 2, 3, 2, 1):
        cache.activate(x)
    assert cache.registered == (3, 2, 1) and cache.active == (3, 2, 1)
    assert cache.activate(4) == ("evict+load", 2)  # 3 was in slot 2
    assert cache.slots == [1, 2, 4] and cache.registered == (2, 1, 4)
    assert cache.stats["disk_load"] == 4


def test_slot_events_do_not_depend_on_max_cpu_loras():
    # Both caches are touched together, so the slotted adapters are always the
    # num_slots most recently used: the CPU cache's size only changes how many
    # activations have to go to disk.
    trace = impl.skewed_trace(2000, seed=0)
    base, c4 = run(trace, 4)
    for cpu, disk in ((6, 355), (16, 16)):
        events, c = run(trace, 4, max_cpu_loras=cpu)
        assert events == base
        assert c.stats["disk_load"] == disk
    # with max_cpu_loras == 4 every slot load is also a disk load
    assert c4.stats["disk_load"] == c4.stats["load"] + c4.stats["evict+load"] == 589


# ---------------------------------------------------------------- the 80/20 experiment


def lru_hit_rate(p_hot, n_hot, p_cold, n_cold, k):
    """Test-side: the exact long-run LRU hit rate for independent requests (King, 1971).

    The stationary probability that the k most recent distinct adapters are
    (i1, ..., ik), most recent first, is prod_j p_ij / (1 - p_i1 - ... - p_i(j-1)),
    and a request hits when it asks for one of them. The adapters come in two
    classes of equal probability, so the sum runs over class sequences, each
    counted (n_hot)_a * (n_cold)_b times (falling factorials).
    """
    total = 0.0
    for seq in itertools.product((0, 1), repeat=k):
        a, b = seq.count(0), seq.count(1)
        if a > n_hot or b > n_cold:
            continue
        prob, prefix = 1.0, 0.0
        for c in seq:
            p = p_hot if c == 0 else p_cold
            prob *= p / (1.0 - prefix)
            prefix += p
        total += math.perm(n_hot, a) * math.perm(n_cold, b) * prob * prefix
    return total


def test_skewed_traffic_hit_count_and_table():
    trace = impl.skewed_trace(2000, seed=0)
    assert trace[:8] == [2, 3, 2, 1, 16, 6, 2, 1]  # the given generator, pinned
    hot = sum(x <= 3 for x in trace)
    assert hot == 1588  # 79.4% of the requests go to adapters 1..3
    rows = []
    for k in (1, 2, 3, 4, 5, 8):
        _, c = run(trace, k, max_cpu_loras=16)
        rows.append((k, c.stats["hit"], c.stats["hit"] / len(trace),
                     lru_hit_rate(0.8 / 3, 3, 0.2 / 13, 13, k)))
    print("\nslots  hits  measured  LRU expectation (King)")
    for k, hits, rate, expect in rows:
        print(f"{k:>5} {hits:>5}  {rate:>7.1%}  {expect:>7.1%}")
    measured = {k: hits for k, hits, _, _ in rows}
    # exact, from this seeded trace: 4 slots hit 1,411 times in 2,000 (70.55%)
    assert measured[4] == 1411
    assert measured == {1: 393, 2: 780, 3: 1153, 4: 1411, 5: 1558, 8: 1746}
    # and it is what LRU should give: within 3 points of the exact expectation
    # (4 slots: 71.7%; one standard deviation of a 2,000-request estimate is ~1 point)
    for k, _, rate, expect in rows:
        assert abs(rate - expect) < 0.03, k
    # The seed's "> 75% with 4 slots" does not hold for LRU: its expectation is
    # 71.7%. 75% needs 5 slots (78.8%), or a policy that keeps the 3 hot adapters
    # resident (pinning them: 0.8 + 0.2 / 13 = 81.5%).
    assert lru_hit_rate(0.8 / 3, 3, 0.2 / 13, 13, 4) < 0.75 < lru_hit_rate(0.8 / 3, 3, 0.2 / 13, 13, 5)


# ---------------------------------------------------------------- a batch and the slot count


def test_activate_batch_refuses_more_adapters_than_slots():
    cache = impl.AdapterSlotCache(2)
    # base requests (None) need no slot; repeats count once; order of first appearance
    out = cache.activate_batch([None, 7, 7, None, 3, 7])
    assert out == {7: ("load", 0), 3: ("load", 1)}
    assert list(out) == [7, 3]
    with pytest.raises(RuntimeError, match=r"\(3\) is greater than the number of GPU LoRA slots \(2\)"):
        cache.activate_batch([1, 2, 3, None])
    # refused before any state changed
    assert cache.slots == [7, 3] and cache.stats["disk_load"] == 2


# ---------------------------------------------------------------- the scheduler's max_loras rule


def test_running_adapters_count_first():
    # two running adapters fill max_loras = 2: a third adapter waits, theirs get in
    admitted, waiting, loras = impl.schedule_waiting([("a", 3), ("b", 1), ("c", 2)], [1, 2, 2], 2)
    assert admitted == ["b", "c"] and waiting == ["a"] and loras == {1, 2}


def test_base_requests_never_count():
    # max_loras = 1 and one adapter running; base requests, running or waiting,
    # take no place in the set
    admitted, waiting, loras = impl.schedule_waiting(
        [("a", None), ("b", 2), ("c", None), ("d", 1)], [None, None, 1, None], 1)
    assert admitted == ["a", "c", "d"] and waiting == ["b"] and loras == {1}
    # with nothing running, a base request first does not use up the one place
    admitted, waiting, loras = impl.schedule_waiting([("a", None), ("b", 5), ("c", 6)], [], 1)
    assert admitted == ["a", "b"] and waiting == ["c"] and loras == {5}


def test_the_cap_skips_and_does_not_stop():
    # running {1}, max_loras 2: a brings 2 and fills the set; b (3) is skipped,
    # the walk goes on; e (4) is skipped too; c, d and f get in behind them
    queue = [("a", 2), ("b", 3), ("c", None), ("d", 2), ("e", 4), ("f", 1)]
    admitted, waiting, loras = impl.schedule_waiting(queue, [1], 2)
    assert admitted == ["a", "c", "d", "f"]
    assert waiting == ["b", "e"]  # skipped ones keep their order
    assert loras == {1, 2}
    # the cap is reached only when the set is full: with max_loras 4 everyone gets in
    admitted, waiting, loras = impl.schedule_waiting(queue, [1], 4)
    assert admitted == list("abcdef") and waiting == [] and loras == {1, 2, 3, 4}


def test_max_new_is_a_barrier_unlike_the_lora_skip():
    queue = [("a", 2), ("b", 3), ("c", None), ("d", 2), ("e", None)]
    # the batch takes 2 more: a and c; b was skipped by the LoRA rule before c
    admitted, waiting, _ = impl.schedule_waiting(queue, [1], 2, max_new=2)
    assert admitted == ["a", "c"] and waiting == ["b", "d", "e"]
    admitted, waiting, loras = impl.schedule_waiting(queue, [1], 2, max_new=0)
    assert admitted == [] and waiting == list("abcde") and loras == {1}


def test_deferred_requests_run_when_their_adapter_fits():
    # two steps by hand: max_loras 1. Step 1: adapter 1 runs, 2's request waits.
    admitted, waiting, _ = impl.schedule_waiting([("x", 1), ("y", 2), ("z", 1)], [], 1)
    assert admitted == ["x", "z"] and waiting == ["y"]
    # step 2: x and z finished, nothing runs: y goes first
    admitted, waiting, loras = impl.schedule_waiting([("y", 2), ("w", 1)], [], 1)
    assert admitted == ["y"] and waiting == ["w"] and loras == {2}


def test_scheduled_batches_always_fit_the_slots():
    # the two components agree: whatever the scheduler admits, the worker can slot
    import numpy as np

    rng = np.random.default_rng(11)
    cache = impl.AdapterSlotCache(3, max_cpu_loras=5)
    running: list = []  # lora ids of running requests
    waiting: list = []
    next_id = 0
    for _step in range(60):
        for _ in range(int(rng.integers(0, 4))):
            lid = None if rng.random() < 0.25 else int(rng.integers(1, 9))
            waiting.append((next_id, lid))
            next_id += 1
        lora_of = dict(waiting)
        admitted, still, loras = impl.schedule_waiting(waiting, running, 3, max_new=6 - len(running))
        running = running + [lora_of[r] for r in admitted]
        waiting = [(r, lora_of[r]) for r in still]
        assert len({x for x in running if x is not None}) <= 3
        assert loras == {x for x in running if x is not None}
        out = cache.activate_batch(running)  # never raises
        assert {cache.slots[s] for _, s in out.values()} == loras
        running = [x for x in running if rng.random() < 0.6]  # some finish


# ---------------------------------------------------------------- the prefix-cache key


def test_block_extra_keys_are_the_adapter_name():
    assert impl.block_extra_keys(impl.LoRARequest("sql", 1, "/a/sql")) == ("sql",)
    assert impl.block_extra_keys(None) is None


def test_same_prompt_under_two_adapters_shares_no_block():
    prompt = list(range(100, 148))  # three full blocks of 16
    sql = impl.LoRARequest("sql", 1, "/a/sql")
    chat = impl.LoRARequest("chat", 2, "/a/chat")
    h_sql = impl.hash_blocks(prompt, 16, impl.block_extra_keys(sql))
    h_chat = impl.hash_blocks(prompt, 16, impl.block_extra_keys(chat))
    h_base = impl.hash_blocks(prompt, 16, impl.block_extra_keys(None))
    assert len(h_sql) == 3
    assert not set(h_sql) & set(h_chat) and not set(h_sql) & set(h_base)
    assert not set(h_chat) & set(h_base)
    # the same adapter in another request shares every block
    again = impl.LoRARequest("sql", 1, "/a/sql")
    assert impl.hash_blocks(prompt + [7, 8], 16, impl.block_extra_keys(again)) == h_sql


def test_the_key_is_the_name_not_the_int_id():
    prompt = list(range(32))
    # the same adapter registered under another int id still shares blocks ...
    a1 = impl.hash_blocks(prompt, 16, impl.block_extra_keys(impl.LoRARequest("sql", 1)))
    a9 = impl.hash_blocks(prompt, 16, impl.block_extra_keys(impl.LoRARequest("sql", 9)))
    assert a1 == a9
    # ... and two adapters that happen to share an int id never do
    b1 = impl.hash_blocks(prompt, 16, impl.block_extra_keys(impl.LoRARequest("chat", 1)))
    assert not set(a1) & set(b1)


# ---------------------------------------------------------------- bad input


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match=r"num_slots must be an integer >= 1"):
        impl.AdapterSlotCache(0)
    with pytest.raises(ValueError, match=r"max_cpu_loras \(2\) must be >= num_slots \(4\)"):
        impl.AdapterSlotCache(4, max_cpu_loras=2)
    cache = impl.AdapterSlotCache(2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"lora_id"):
            cache.activate(bad)
    with pytest.raises(ValueError, match=r"lora_id"):
        cache.activate(None)
    with pytest.raises(ValueError, match=r"lora_ids"):
        cache.activate_batch([1, 0])
    assert cache.slots == [None, None]
    with pytest.raises(ValueError, match=r"max_loras must be an integer >= 1"):
        impl.schedule_waiting([], [], 0)
    with pytest.raises(ValueError, match=r"max_new must be an integer >= 0"):
        impl.schedule_waiting([], [], 1, max_new=-1)
    with pytest.raises(ValueError, match=r"waiting"):
        impl.schedule_waiting([("a", 0)], [], 1)
    with pytest.raises(ValueError, match=r"running_lora_ids"):
        impl.schedule_waiting([], [1, -2], 2)
    with pytest.raises(ValueError, match=r"running_lora_ids hold 3 adapters, more than max_loras \(2\)"):
        impl.schedule_waiting([], [1, 2, 3, None], 2)
    for bad in (SimpleNamespace(lora_int_id=1), SimpleNamespace(lora_name=7),
                SimpleNamespace(lora_name="")):
        with pytest.raises(ValueError, match=r"lora_request"):
            impl.block_extra_keys(bad)
    with pytest.raises(ValueError, match=r"lora_int_id"):
        impl.LoRARequest("x", 0)


# ---------------------------------------------------------------- against upstream's code


def _exec_classes(path, keep: dict, ns: dict) -> dict:
    """Exec the classes named in ``keep`` from an upstream file, each reduced to the listed methods."""
    tree = ast.parse(path.read_text())
    body = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in keep:
            node.body = [n for n in node.body
                         if isinstance(n, ast.FunctionDef) and n.name in keep[node.name]] or [ast.Pass()]
            body.append(node)
    assert [n.name for n in body] == [name for name in keep if name in {n.name for n in body}]
    assert len(body) == len(keep)
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec",
                   flags=FUTURE_ANNOTATIONS, dont_inherit=True)
    exec(code, ns)
    return ns


@functools.cache
def _upstream_lora_managers() -> dict:
    """vLLM's LRUCache, the two LoRA model managers and the LRU worker manager, minus torch."""
    cache_path = UPSTREAM / "vllm/utils/cache.py"
    cache_ns: dict = {"__name__": "upstream_vllm_utils_cache"}
    pytest.importorskip("cachetools")  # vLLM's LRUCache subclasses cachetools.LRUCache
    exec(compile(cache_path.read_text(), str(cache_path), "exec", dont_inherit=True), cache_ns)
    quiet = SimpleNamespace(debug=lambda *a, **k: None, info_once=lambda *a, **k: None)
    ns = {"LRUCache": cache_ns["LRUCache"], "T": TypeVar("T"), "LoRAModel": object, "logger": quiet}
    _exec_classes(UPSTREAM / "vllm/lora/model_manager.py", {
        "AdapterLRUCache": {"__init__", "_on_remove"},
        "LoRAModelManager": {"__len__", "capacity", "lora_slots", "activate_adapter",
                             "_deactivate_adapter", "_add_adapter", "deactivate_adapter",
                             "add_adapter", "remove_adapter", "list_adapters", "get_adapter"},
        "LoRALRUCache": {"__init__"},
        "LRUCacheLoRAModelManager": {"list_adapters", "add_adapter", "activate_adapter",
                                     "remove_oldest_adapter"},
    }, ns)
    _exec_classes(UPSTREAM / "vllm/lora/worker_manager.py", {
        "WorkerLoRAManager": {"list_adapters"},
        "LRUCacheWorkerLoRAManager": {"_apply_adapters", "add_adapter"},
    }, ns)
    return ns


def _upstream_worker(num_slots, max_cpu_loras):
    """A worker manager over an LRU model manager, set up as LRUCacheLoRAModelManager.__init__ does."""
    ns = _upstream_lora_managers()
    m = object.__new__(ns["LRUCacheLoRAModelManager"])
    m.lora_config = SimpleNamespace(max_loras=num_slots, max_cpu_loras=max_cpu_loras)
    m.modules = {}  # no layers: activate_adapter's weight copy loop is empty
    m.lora_index_to_id = [None] * m.lora_slots
    m._create_merged_loras_inplace = lambda lora: None
    m._registered_adapters = ns["LoRALRUCache"](m.capacity, m.deactivate_adapter)
    m._active_adapters = ns["LoRALRUCache"](m.lora_slots, m._deactivate_adapter)
    w = object.__new__(ns["LRUCacheWorkerLoRAManager"])
    w._adapter_manager = m
    w._load_adapter = lambda req: SimpleNamespace(id=req.lora_int_id)  # "from disk"
    return w, m


def _upstream_events(trace, num_slots, max_cpu_loras):
    w, m = _upstream_worker(num_slots, max_cpu_loras)
    out = []
    for x in trace:
        before = list(m.lora_index_to_id)
        w.add_adapter(SimpleNamespace(lora_int_id=x, load_inplace=False))
        after = m.lora_index_to_id
        if x in before:
            event = "hit"
        elif any(y is not None and y not in after for y in before):
            event = "evict+load"
        else:
            event = "load"
        out.append((event, after.index(x)))
    return out, m


@pytest.mark.upstream
def test_same_slots_as_upstreams_lru_managers():
    import numpy as np

    trace = impl.skewed_trace(1000, seed=0)
    for cpu in (4, 6, 16):
        theirs, m = _upstream_events(trace, 4, cpu)
        mine, cache = run(trace, 4, cpu)
        assert mine == theirs, cpu
        assert cache.slots == m.lora_index_to_id
        assert cache.active == tuple(m._active_adapters.order)
        assert cache.registered == tuple(m._registered_adapters.order)
    rng = np.random.default_rng(5)
    for _ in range(20):
        k = int(rng.integers(1, 6))
        cpu = k + int(rng.integers(0, 4))
        trace = [int(x) for x in rng.integers(1, k + 5, size=60)]
        theirs, m = _upstream_events(trace, k, cpu)
        mine, cache = run(trace, k, cpu)
        assert mine == theirs and cache.registered == tuple(m._registered_adapters.order)


@pytest.mark.upstream
def test_upstream_worker_refuses_the_same_batches():
    def message(fn):
        try:
            fn()
        except NotImplementedError:  # a RuntimeError too: let it through as itself
            raise
        except RuntimeError as err:
            return str(err)
        return None

    w, m = _upstream_worker(2, 2)
    reqs = [SimpleNamespace(lora_int_id=i, load_inplace=False) for i in (1, 2, 3)]
    mine = message(lambda: impl.AdapterSlotCache(2).activate_batch([1, 2, 3]))
    theirs = message(lambda: w._apply_adapters(reqs))
    assert theirs == "Number of requested LoRAs (3) is greater than the number of GPU LoRA slots (2)."
    assert mine == theirs


@functools.cache
def _upstream_scheduler_rule():
    """The skip test and the running set from ``Scheduler.schedule``, and the FCFS queue class."""
    sched = UPSTREAM / "vllm/v1/core/sched/scheduler.py"
    tree = ast.parse(sched.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "schedule")
    skip = [n.test for n in ast.walk(fn) if isinstance(n, ast.If)
            and "len(scheduled_loras) == self.lora_config.max_loras" in ast.unparse(n.test)]
    start = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
             and ast.unparse(n.targets[0]) == "scheduled_loras"]
    assert len(skip) == 1 and len(start) == 1
    skip_expr = compile(ast.Expression(skip[0]), str(sched), "eval")
    start_expr = compile(ast.Expression(start[0]), str(sched), "eval")
    ns = {"deque": collections.deque, "RequestQueue": object, "Request": object}
    _exec_classes(UPSTREAM / "vllm/v1/core/sched/request_queue.py", {
        "FCFSRequestQueue": {"add_request", "pop_request", "peek_request",
                             "prepend_request", "prepend_requests"},
    }, ns)
    return skip_expr, start_expr, ns["FCFSRequestQueue"]


@pytest.mark.upstream
def test_same_admissions_as_upstreams_scheduler_walk():
    import numpy as np

    skip_expr, start_expr, Queue = _upstream_scheduler_rule()

    def req(rid, lid):
        lora = None if lid is None else SimpleNamespace(lora_int_id=lid)
        return SimpleNamespace(request_id=rid, lora_request=lora)

    rng = np.random.default_rng(3)
    for trial in range(20):
        max_loras = int(rng.integers(1, 4))
        max_running = int(rng.integers(2, 7))
        me = SimpleNamespace(lora_config=SimpleNamespace(max_loras=max_loras),
                             waiting=Queue(), skipped_waiting=Queue(), running=[])
        my_waiting: list = []
        next_id = 0
        for step in range(25):
            for _ in range(int(rng.integers(0, 4))):
                lid = None if rng.random() < 0.3 else int(rng.integers(1, 6))
                me.waiting.add_request(req(next_id, lid))
                my_waiting.append((next_id, lid))
                next_id += 1
            # upstream's walk (the FCFS part of Scheduler.schedule; every running request scheduled)
            scheduled_loras = eval(start_expr, {"scheduled_running_reqs": me.running})
            step_skipped = Queue()
            admitted = []
            while me.waiting or me.skipped_waiting:
                if len(me.running) == max_running:
                    break
                queue = me.skipped_waiting or me.waiting
                r = queue.peek_request()
                if eval(skip_expr, {"self": me, "request": r, "scheduled_loras": scheduled_loras}):
                    queue.pop_request()
                    step_skipped.prepend_request(r)
                    continue
                queue.pop_request()
                me.running.append(r)
                admitted.append(r.request_id)
                if r.lora_request:
                    scheduled_loras.add(r.lora_request.lora_int_id)
            if step_skipped:
                me.skipped_waiting.prepend_requests(step_skipped)
            # the learner's, from the same state
            running_ids = [r.lora_request.lora_int_id if r.lora_request else None
                           for r in me.running if r.request_id not in admitted]
            mine, still, loras = impl.schedule_waiting(my_waiting, running_ids, max_loras,
                                                       max_new=max_running - len(running_ids))
            assert mine == admitted, (trial, step)
            assert loras == scheduled_loras
            lora_of = dict(my_waiting)
            my_waiting = [(r, lora_of[r]) for r in still]
            assert still == [r.request_id for r in list(me.skipped_waiting) + list(me.waiting)]
            me.running = [r for r in me.running if rng.random() < 0.5]


@pytest.mark.upstream
def test_upstream_block_hash_extra_keys_agree():
    path = UPSTREAM / "vllm/v1/core/kv_cache_utils.py"
    tree = ast.parse(path.read_text())
    names = {"_gen_mm_extra_hash_keys", "_gen_lora_extra_hash_keys",
             "_gen_prompt_embeds_extra_hash_keys", "generate_block_hash_extra_keys"}
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert len(fns) == 4
    ns: dict = {}
    exec(compile(ast.Module(body=fns, type_ignores=[]), str(path), "exec",
                 flags=FUTURE_ANNOTATIONS, dont_inherit=True), ns)
    for lora in (None, impl.LoRARequest("sql", 1), impl.LoRARequest("sql", 9),
                 impl.LoRARequest("chat", 1)):
        request = SimpleNamespace(lora_request=lora, mm_features=[], cache_salt=None,
                                  prompt_embeds=None)
        theirs, _ = ns["generate_block_hash_extra_keys"](request, 0, 16, 0)
        assert impl.block_extra_keys(lora) == theirs
        assert ns["_gen_lora_extra_hash_keys"](request) == list(theirs or [])
