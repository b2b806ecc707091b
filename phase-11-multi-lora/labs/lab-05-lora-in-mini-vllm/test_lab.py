"""Lab 11-05 tests: your Punica wrapper and per-row slots serve mini_vllm's adapters.

Two kinds of test. The first kind calls your code directly, on numbers small
enough to check by hand. The second plugs it into ``LLMEngine("tiny-random",
enable_lora=True, max_loras=2)`` with ``plug_into`` and runs three adapters and
the base model through two slots; the oracle for every request is the same
request run alone: on an engine with mini_vllm's own wrapper when it has an
adapter, on an engine without LoRA when it has none. A spy around your wrapper
counts its calls and checks, at every call, that the base rows of ``y`` leave
with the bits they came in with.
"""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mini_vllm import LLMEngine, LoRARequest, SamplingParams  # noqa: E402
from mini_vllm.lora import PunicaWrapperNumpy, write_peft_adapter  # noqa: E402
from mini_vllm.models.config import tiny_random_config  # noqa: E402

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYERS, WRAPPED = 2, 4  # tiny-random: 2 layers, each with qkv_proj, o_proj, gate_up_proj, down_proj wrapped
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


# ---------------------------------------------------------------- helpers


def stacks(max_loras, rank, n_in, slices, rng, ranks):
    """Stacks shaped as mini_vllm allocates them, slot s holding a random adapter of rank ranks[s]."""
    a = tuple(np.zeros((max_loras, 1, rank, n_in), np.float32) for _ in slices)
    b = tuple(np.zeros((max_loras, 1, n, rank), np.float32) for n in slices)
    for s, r in enumerate(ranks):
        for i, n in enumerate(slices):
            a[i][s, 0, :r] = rng.standard_normal((r, n_in))
            b[i][s, 0, :, :r] = rng.standard_normal((n, r))
    return a, b


def loop_reference(y, x, a, b, scale, slices, idx):
    """One row at a time, in float64: what add_lora_linear must compute."""
    out = y.astype(np.float64)
    for t, s in enumerate(idx):
        if s < 0:
            continue
        offset = 0
        for a_i, b_i, n in zip(a, b, slices, strict=True):
            out[t, offset:offset + n] += scale * (b_i[s, 0].astype(np.float64) @ (a_i[s, 0] @ x[t].astype(np.float64)))
            offset += n
    return out


class Spy:
    """Wraps a wrapper instance: counts calls; at every add_lora_linear, compares the base rows' bits."""

    def __init__(self, wrapper):
        self.calls = Counter()
        self.base_rows_seen = 0  # base rows checked, over all calls
        self.base_rows_changed = 0  # ... whose bits changed (must stay 0)
        self.adapter_rows_changed = 0  # adapter rows that received a non-zero delta
        self.indices = None
        update, add = wrapper.update_metadata, wrapper.add_lora_linear

        def spy_update(idx):
            self.calls["update_metadata"] += 1
            self.indices = np.array(idx)
            update(idx)

        def spy_add(y, x, a, b, scale, slices):
            self.calls["add_lora_linear"] += 1
            before = y.copy()
            add(y, x, a, b, scale, slices)
            base = self.indices == -1
            self.base_rows_seen += int(base.sum())
            self.base_rows_changed += int((y[base].view(np.uint32) != before[base].view(np.uint32)).any(axis=1).sum())
            self.adapter_rows_changed += int((y[~base] != before[~base]).any(axis=1).sum())

        wrapper.update_metadata, wrapper.add_lora_linear = spy_update, spy_add


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    """Three adapters for tiny-random, ids 1, 2, 3: ranks 8, 8, 16 (rank 8 sits zero-padded in 16-wide slots)."""
    root = tmp_path_factory.mktemp("lab05")
    cfg = tiny_random_config()
    paths = {
        "a": write_peft_adapter(root / "a", cfg, r=8, target_modules=ALL, seed=1),
        "b": write_peft_adapter(root / "b", cfg, r=8, target_modules=("q_proj", "v_proj", "down_proj"), seed=2),
        "c": write_peft_adapter(root / "c", cfg, r=16, lora_alpha=48, target_modules=ALL, seed=3),
    }
    return {n: LoRARequest(n, i + 1, str(paths[n])) for i, n in enumerate("abc")}


_ALONE: dict = {}


def alone(loras, prompt, name, params=GREEDY):
    """The request on an engine of its own: mini_vllm's wrapper for an adapter, no LoRA at all for the base."""
    key = (prompt, name, params.max_tokens)
    if key not in _ALONE:
        engine = LLMEngine("tiny-random", enable_lora=name is not None, max_loras=1, max_lora_rank=16,
                           enable_caching=False)
        lora = None if name is None else loras[name]
        _ALONE[key] = engine.generate([prompt], params, lora_request=lora)[0].output_token_ids
    return _ALONE[key]


def plugged(**kw):
    """An engine with two 16-wide slots running your wrapper and your token_lora_indices, under a spy."""
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16, **kw)
    wrapper = impl.MyPunicaWrapper(2)
    spy = Spy(wrapper)
    impl.plug_into(engine, wrapper)
    assert engine.lora_manager.punica_wrapper is wrapper
    return engine, spy


# Three adapters and the base model; the base requests run longest, so the last steps have no adapter.
MIXED = [("the quick brown fox", "a"), ("the quick brown fox", None), ("hello", "b"),
         ("paged attention, paged", "c"), ("lora", "a"), ("lora", None)]
LONG = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def mixed(loras):
    engine, spy = plugged()
    params = [LONG if n is None else GREEDY for _, n in MIXED]
    got = engine.generate([p for p, _ in MIXED], params, lora_request=[None if n is None else loras[n]
                                                                        for _, n in MIXED])
    want = [alone(loras, p, n, LONG if n is None else GREEDY) for p, n in MIXED]
    return engine, spy, [r.output_token_ids for r in got], want


# ---------------------------------------------------------------- token_lora_indices, by hand


def test_token_lora_indices_maps_ids_to_slots_and_repeats_them_over_rows():
    # slots hold ids [1, 3]; requests (ids 3, base, 1, 3) own 4, 1, 2 and 1 rows:
    # id 3 -> slot 1, base -> -1, id 1 -> slot 0
    got = impl.token_lora_indices([3, 0, 1, 3], [1, 3], np.array([0, 4, 5, 7, 8]))
    assert got.dtype == np.int64 and got.tolist() == [1, 1, 1, 1, -1, 0, 0, 1]
    # None is the base too, and an empty slot is just a None in the table
    assert impl.token_lora_indices([2, None], [None, 2], [0, 1, 3]).tolist() == [1, -1, -1]
    # a request with no rows this step contributes nothing; id 1 sits in slot 1, not slot 0 or 1 - 1
    assert impl.token_lora_indices([1, 2, 0], [2, 1], [0, 2, 2, 3]).tolist() == [1, 1, -1]
    assert impl.token_lora_indices([], [None, None], [0]).tolist() == []
    with pytest.raises(ValueError, match=r"lora_int_ids holds id 5, which sits in no slot of lora_index_to_id \[1, 3\]"):
        impl.token_lora_indices([5], [1, 3], [0, 1])
    with pytest.raises(ValueError, match=r"lora_int_ids must hold ints >= 0"):
        impl.token_lora_indices([-1], [1, 3], [0, 1])
    with pytest.raises(ValueError, match=r"query_start_loc must be 3 non-decreasing int offsets starting at 0"):
        impl.token_lora_indices([1, 3], [1, 3], [0, 4])
    with pytest.raises(ValueError, match=r"query_start_loc must be 2 .*got \[0, -1\]"):
        impl.token_lora_indices([1], [1, 3], [0, -1])


# ---------------------------------------------------------------- the wrapper, by hand


def hand_example():
    """Two slots of rank 2, in = 2, output_slices (2, 1): slice 0 owns columns 0-1, slice 1 column 2."""
    a0 = np.zeros((2, 1, 2, 2), np.float32)
    b0 = np.zeros((2, 1, 2, 2), np.float32)
    a1 = np.zeros((2, 1, 2, 2), np.float32)
    b1 = np.zeros((2, 1, 1, 2), np.float32)
    a0[0, 0] = [[1, 0], [0, 1]]
    b0[0, 0] = [[1, 0], [0, 2]]
    a1[0, 0] = [[1, 1], [0, 0]]
    b1[0, 0] = [[1, 0]]
    a0[1, 0] = [[0, 1], [0, 0]]
    b0[1, 0] = [[3, 0], [1, 0]]
    a1[1, 0] = [[2, 0], [0, 0]]
    b1[1, 0] = [[2, 0]]
    x = np.array([[2, 4], [1, 1], [6, 2]], np.float32)
    y = np.tile(np.array([10, 20, 30], np.float32), (3, 1))
    return (a0, a1), (b0, b1), x, y


def test_add_lora_linear_hand_numbers():
    a, b, x, y = hand_example()
    w = impl.MyPunicaWrapper(2)
    w.update_metadata(np.array([0, -1, 1]))
    assert not w.no_lora
    w.add_lora_linear(y, x, a, b, 0.5, (2, 1))
    # row 0, slot 0, x = [2, 4]:
    #   slice 0: 0.5 * x @ A.T = 0.5 * [2, 4] = [1, 2];  [1, 2] @ B.T = [1*1, 2*2] = [1, 4]
    #   slice 1: 0.5 * [2 + 4, 0] = [3, 0];              [3, 0] @ [[1, 0]].T = [3]
    # row 1, slot -1: nothing
    # row 2, slot 1, x = [6, 2]:
    #   slice 0: 0.5 * [2, 0] = [1, 0];                  [1, 0] @ [[3, 0], [1, 0]].T = [3, 1]
    #   slice 1: 0.5 * [12, 0] = [6, 0];                 [6, 0] @ [[2, 0]].T = [12]
    # Scale twice gives row 0 [10.5, 22, 31.5]; no scale [12, 28, 36]; every slice at offset 0 puts
    # slice 1's [3] on column 0; -1 read as the last slot gives row 1 slot 1's delta [1.5, 0.5, 2].
    np.testing.assert_array_equal(y, [[11, 24, 33], [10, 20, 30], [13, 21, 42]])


def test_base_rows_keep_their_bits_whatever_the_last_slot_holds():
    rng = np.random.default_rng(0)
    slices = (64, 32, 32)  # q, k, v of tiny-random: 4 query heads, 2 KV heads of 16
    a, b = stacks(2, 16, 64, slices, rng, ranks=(8, 16))  # both slots full: -1 as slot 1 would show
    x = rng.standard_normal((7, 64)).astype(np.float32)
    y = rng.standard_normal((7, 128)).astype(np.float32)
    y[3, 5] = -0.0  # a signed zero: adding even +0.0 to it would flip its bits
    idx = np.array([1, -1, 0, -1, 1, -1, 0])
    before = y.copy()
    w = impl.MyPunicaWrapper(2)
    w.update_metadata(idx)
    w.add_lora_linear(y, x, a, b, 1.0, slices)
    base = idx == -1
    assert np.array_equal(y[base].view(np.uint32), before[base].view(np.uint32))
    assert (y[~base] != before[~base]).any(axis=1).all()  # every adapter row moved


def test_matches_a_per_row_loop_and_mini_vllms_own_wrapper():
    rng = np.random.default_rng(1)
    slices = (64, 32, 32)
    a, b = stacks(3, 16, 64, slices, rng, ranks=(8, 16, 4))
    x = rng.standard_normal((11, 64)).astype(np.float32)
    y = rng.standard_normal((11, 128)).astype(np.float32)
    idx = np.array([2, 2, -1, 0, 1, 1, 1, -1, 0, 2, 1])
    for scale in (0.25, 1.0):
        mine = y.copy()
        w = impl.MyPunicaWrapper(3)
        w.update_metadata(idx)
        w.add_lora_linear(mine, x, a, b, scale, slices)
        np.testing.assert_allclose(mine, loop_reference(y, x, a, b, scale, slices, idx), rtol=1e-5, atol=1e-4)
        theirs = y.copy()
        ref = PunicaWrapperNumpy(3)
        ref.update_metadata(idx)
        ref.add_lora_linear(theirs, x, a, b, scale, slices)
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-5)


def test_update_metadata_forgets_the_previous_step():
    a, b, x, _ = hand_example()
    w = impl.MyPunicaWrapper(2)
    w.update_metadata([0, 0, 1, 1, 1])  # a 5-row step with both slots
    w.update_metadata([1, -1])  # the next step: 2 rows, slot 1 only
    y = np.tile(np.array([10, 20, 30], np.float32), (2, 1))
    w.add_lora_linear(y, x[[2, 1]], a, b, 0.5, (2, 1))
    # row 0 is the hand example's row 2 (slot 1); row 1 is a base row: nothing may touch it
    np.testing.assert_array_equal(y, [[13, 21, 42], [10, 20, 30]])
    w.update_metadata([-1, -1, -1])
    assert w.no_lora  # the earlier steps' adapters are gone


@pytest.mark.parametrize("indices, expected", [
    ([], True), ([-1, -1], True), ([0], False), ([-1, 0, -1], False), ([1, -1], False), ([1, 1], False),
])
def test_no_lora_is_true_only_without_any_adapter_row(indices, expected):
    w = impl.MyPunicaWrapper(2)
    w.update_metadata([0, 1])  # the previous step had adapters
    w.update_metadata(np.array(indices, dtype=np.int64))
    assert w.no_lora == expected


def test_bad_arguments_name_the_parameter():
    a, b, x, y = hand_example()
    w = impl.MyPunicaWrapper(2)
    with pytest.raises(ValueError, match=r"token_lora_indices must be -1 \(no adapter\) or a slot in \[0, 2\), got \[2\]"):
        w.update_metadata([0, 2])
    with pytest.raises(ValueError, match=r"got \[-2\]"):
        w.update_metadata([-2, 0])
    with pytest.raises(ValueError, match=r"token_lora_indices must be 1-D"):
        w.update_metadata([[0]])
    with pytest.raises(ValueError, match=r"token_lora_indices must be integers"):
        w.update_metadata([0.0])
    w.update_metadata([0, 1])
    with pytest.raises(ValueError, match=r"x has 3 rows and y 3, but token_lora_indices has 2"):
        w.add_lora_linear(y, x, a, b, 1.0, (2, 1))
    w.update_metadata([0, 1, -1])
    with pytest.raises(ValueError, match=r"output_slices \(2, 2\) must sum to y's width 3"):
        w.add_lora_linear(y, x, a, b, 1.0, (2, 2))
    with pytest.raises(ValueError, match=r"one entry per slice, got 2, 2 and 1"):
        w.add_lora_linear(y, x, a, b, 1.0, (3,))
    with pytest.raises(ValueError, match=r"y must be a 2-D float numpy array"):
        w.add_lora_linear(y.astype(np.int64), x, a, b, 1.0, (2, 1))
    with pytest.raises(ValueError, match=r"max_loras must be an integer >= 1, got 0"):
        impl.MyPunicaWrapper(0)
    with pytest.raises(ValueError, match=r"engine must be built with enable_lora=True"):
        impl.plug_into(LLMEngine("tiny-random"), w)


# ---------------------------------------------------------------- inside the engine


def test_mixed_batch_each_request_equals_itself_alone(mixed, loras):
    engine, _, got, want = mixed
    assert got == want
    # the oracle has teeth: every adapter's tokens differ from the base model's on the same prompt,
    # so a wrapper that drops adapters (no_lora True too often) fails above
    for prompt, name in MIXED:
        if name is not None:
            assert alone(loras, prompt, name) != alone(loras, prompt, None, GREEDY), (prompt, name)


def test_two_slots_never_run_three_adapters(mixed):
    engine, _, _, _ = mixed
    active = [s.active_loras for s in engine.stats]
    assert active[0] == (1, 2)  # "c" (id 3) waits: seating it would need a third slot
    assert all(len(a) <= 2 for a in active)
    assert any(3 in a for a in active)  # ... and runs once a slot frees up
    assert active[-1] == ()  # the base requests finish alone: steps with no adapter at all


def test_your_wrapper_is_what_the_engine_calls(mixed):
    engine, spy, _, _ = mixed
    # one update_metadata per step; one add_lora_linear per wrapped layer per step with an adapter,
    # none in a step without one (no_lora must be True there)
    steps_with_adapters = sum(1 for s in engine.stats if s.active_loras)
    assert spy.calls["update_metadata"] == len(engine.stats)
    assert spy.calls["add_lora_linear"] == steps_with_adapters * LAYERS * WRAPPED
    assert 0 < steps_with_adapters < len(engine.stats)


def test_base_rows_are_untouched_bit_for_bit_inside_the_engine(mixed):
    _, spy, _, _ = mixed
    assert spy.base_rows_seen > 0 and spy.adapter_rows_changed > 0
    assert spy.base_rows_changed == 0


def test_prefix_cache_is_shared_under_one_adapter_never_across_two(loras):
    engine, spy = plugged(block_size=4)
    prompt = "".join(chr(48 + i % 40) for i in range(40))  # 40 tokens: 10 blocks of 4
    sp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)

    def run(name):
        lora = None if name is None else loras[name]
        out = engine.generate([prompt], sp, lora_request=lora)[0].output_token_ids
        assert out == alone(loras, prompt, name, sp), name
        return engine.stats[-3].num_cached_tokens  # the request's first (prefill) step

    assert run("a") == 0
    assert run("a") == 36  # the same adapter: every full block but the one holding the last prompt token
    assert run("b") == 0  # another adapter's K/V differ: nothing may be shared
    assert run(None) == 0
    assert run("b") == 36
    assert spy.base_rows_changed == 0


def test_chunked_prefill_caching_and_preemption_change_no_token(loras):
    names = ["a", None, "b", "c", "a", "b"]
    prompts = ["the quick brown fox jumps over the lazy dog " * 2, "the quick brown fox jumps over the lazy dog " * 2,
               "the quick brown fox jumps over the lazy dog " * 2, "paged attention, " * 3, "abc" * 9, "hello"]
    want = [alone(loras, p, n) for p, n in zip(prompts, names, strict=True)]
    # blocks of 4, a 10-token budget (prompts arrive in chunks), 30 blocks (requests get preempted)
    engine, spy = plugged(block_size=4, num_blocks=30, max_num_batched_tokens=10, enable_caching=True)
    got = engine.generate(prompts, GREEDY, lora_request=[None if n is None else loras[n] for n in names])
    assert [r.output_token_ids for r in got] == want
    assert any(s.preempted for s in engine.stats), "the workload must preempt"
    multi = Counter(rid for s in engine.stats for rid, n in s.num_scheduled_tokens.items() if n > 1)
    assert max(multi.values()) >= 2, "and split a prompt over steps"
    assert max(len(s.active_loras) for s in engine.stats) <= 2
    assert spy.base_rows_seen > 0 and spy.base_rows_changed == 0
