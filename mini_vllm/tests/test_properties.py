"""Property-based tests: random workloads x random knobs.

After every step the pool invariants hold and every block is accounted for;
at the end no request is lost or duplicated, each has exactly max_tokens
tokens, and the output is identical to a reference run with no chunking, no
prefix caching, no preemption and no sequence cap.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm import LLMEngine, SamplingParams
from mini_vllm.request import RequestStatus

SETTINGS = settings(max_examples=35, deadline=None, derandomize=True, database=None)

# Prompts drawn from three shared prefixes plus random tails, so prefix hits happen.
_PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 50, 51], [70, 71, 72, 73, 74, 75, 76, 77]]
requests_st = st.lists(
    st.tuples(
        st.sampled_from(range(len(_PREFIXES) + 1)),
        st.lists(st.integers(0, 255), min_size=0, max_size=7),
        st.integers(1, 8),  # max_tokens
        st.booleans(),  # greedy or seeded sampling
    ),
    min_size=1,
    max_size=7,
)
knobs_st = st.fixed_dictionaries({
    "block_size": st.sampled_from([1, 2, 4, 8]),
    "extra_blocks": st.integers(0, 12),
    "max_num_batched_tokens": st.integers(1, 40),
    "max_num_seqs": st.integers(1, 8),
    "long_prefill_token_threshold": st.integers(0, 6),
    "enable_caching": st.booleans(),
})


def _workload(reqs):
    out = []
    for i, (prefix, tail, max_tokens, greedy) in enumerate(reqs):
        tokens = (_PREFIXES[prefix] if prefix < len(_PREFIXES) else []) + tail
        tokens = tokens or [42]
        params = SamplingParams(
            temperature=0.0 if greedy else 1.0, top_k=0 if greedy else 50,
            max_tokens=max_tokens, ignore_eos=True, seed=None if greedy else 1000 + i,
        )
        out.append(({"prompt_token_ids": tokens}, params))
    return out


def _check_step(engine, all_ids):
    sched, kv = engine.scheduler, engine.kv_cache_manager
    pool = kv.block_pool
    pool.check_invariants()
    running = [r.request_id for r in sched.running]
    waiting = [r.request_id for r in sched.waiting]
    assert len(set(running)) == len(running) and len(set(waiting)) == len(waiting)
    assert not set(running) & set(waiting)
    assert set(running) | set(waiting) == set(sched.requests) <= all_ids
    assert len(running) <= sched.max_num_seqs
    holders = Counter()
    for req in sched.running:
        blocks = kv.get_blocks(req.request_id)
        # exactly the blocks its computed tokens need: no leak, no over-allocation
        assert len(blocks) == -(-req.num_computed_tokens // kv.block_size)
        for i, block in enumerate(blocks):
            assert not block.is_null  # the null block is never handed out
            holders[block.block_id] += 1
            if block.block_hash is not None:  # a cached block holds this request's tokens
                assert block.block_hash == req.block_hashes[i]
    for req in sched.waiting:
        assert kv.get_blocks(req.request_id) == [] and req.num_computed_tokens == 0
    for block in pool.blocks[1:]:
        assert block.ref_cnt == holders[block.block_id]
    stats = engine.stats[-1]
    assert sum(stats.num_scheduled_tokens.values()) <= sched.max_num_batched_tokens


def _run(engine, work, check=False):
    ids = [engine.add_request(p, sp) for p, sp in work]
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
        if check:
            _check_step(engine, set(ids))
    assert sorted(r.request_id for r in finished) == sorted(ids)  # none lost, none twice
    by_id = {r.request_id: r for r in finished}
    return [by_id[i] for i in ids]


@SETTINGS
@given(requests_st, knobs_st)
def test_invariants_hold_and_output_never_depends_on_the_knobs(reqs, knobs):
    work = _workload(reqs)
    bs = knobs["block_size"]
    need = max(-(-(len(p["prompt_token_ids"]) + sp.max_tokens - 1) // bs) for p, sp in work)
    engine = LLMEngine(
        block_size=bs, num_blocks=need + 1 + knobs["extra_blocks"],
        max_num_batched_tokens=knobs["max_num_batched_tokens"], max_num_seqs=knobs["max_num_seqs"],
        long_prefill_token_threshold=knobs["long_prefill_token_threshold"],
        enable_caching=knobs["enable_caching"],
    )
    got = _run(engine, work, check=True)
    ref = _run(LLMEngine(block_size=16, num_blocks=512, enable_caching=False), work)
    for g, r, (_, sp) in zip(got, ref, work, strict=True):
        assert g.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert g.num_output_tokens == sp.max_tokens
        assert g.output_token_ids == r.output_token_ids
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1  # everything returned


@SETTINGS
@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.data())
def test_free_queue_matches_a_reference_list_under_random_operations(ops, data):
    from mini_vllm.block_pool import FreeKVCacheBlockQueue, KVCacheBlock

    blocks = [KVCacheBlock(i) for i in range(41)]
    queue = FreeKVCacheBlockQueue(blocks[:20])
    model = list(range(20))
    for op in ops:
        if op in model and data.draw(st.booleans()):
            queue.remove(blocks[op])
            model.remove(op)
        elif op not in model:
            queue.append(blocks[op])
            model.append(op)
        elif model:
            assert queue.popleft().block_id == model.pop(0)
        assert [b.block_id for b in queue.get_all_free_blocks()] == model
        assert queue.num_free_blocks == len(model)


@SETTINGS
@given(requests_st, knobs_st, st.lists(st.tuples(st.integers(1, 12), st.integers(0, 6)), max_size=3))
def test_eos_stops_and_aborts_keep_the_books_straight(reqs, knobs, aborts):
    from mini_vllm import ToyModel

    work = [(p, SamplingParams(temperature=sp.temperature, top_k=sp.top_k, seed=sp.seed,
                               max_tokens=sp.max_tokens)) for p, sp in _workload(reqs)]
    bs = knobs["block_size"]
    need = max(-(-(len(p["prompt_token_ids"]) + sp.max_tokens - 1) // bs) for p, sp in work)

    def engine(**kw):
        return LLMEngine(ToyModel(eos_bias=4.4), **kw)  # EOS wins ~10% of greedy picks

    eng = engine(
        block_size=bs, num_blocks=need + 1 + knobs["extra_blocks"],
        max_num_batched_tokens=knobs["max_num_batched_tokens"], max_num_seqs=knobs["max_num_seqs"],
        long_prefill_token_threshold=knobs["long_prefill_token_threshold"],
        enable_caching=knobs["enable_caching"],
    )
    ids = [eng.add_request(p, sp) for p, sp in work]
    aborted = {ids[i % len(ids)] for step, i in aborts}
    abort_at = {step: ids[i % len(ids)] for step, i in aborts}
    finished = []
    while eng.has_unfinished_requests():
        if eng.num_steps in abort_at:
            eng.abort_request(abort_at[eng.num_steps])
        finished += eng.step()
        _check_step(eng, set(ids))
    returned = {r.request_id for r in finished}
    assert len(returned) == len(finished) and returned <= set(ids)
    assert set(ids) - returned <= aborted  # only an aborted request may be missing
    pool = eng.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    ref = {r.request_id: r for r in engine(block_size=16, num_blocks=512).generate(
        [p for p, _ in work], [sp for _, sp in work])}
    for req in finished:  # a request that was not aborted ran exactly as in the reference
        other = ref[req.request_id]
        assert (req.output_token_ids, req.finish_reason) == (other.output_token_ids, other.finish_reason)
        if req.finish_reason == "stop":
            assert req.output_token_ids[-1] == 256
        else:
            assert req.num_output_tokens == req.max_tokens
