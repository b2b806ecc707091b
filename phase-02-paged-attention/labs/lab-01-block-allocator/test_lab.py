"""Lab 02-01 tests: the free queue, the chained hash and the block pool.

Three kinds of check:
  * exact numbers (block ids, free counts, eviction order), in the style of
    upstream/tests/v1/core/test_prefix_caching.py;
  * the four invariants I1-I4, each pinned by its own test;
  * agreement with mini_vllm's pool on seeded random operation sequences, with
    your pool plugged under mini_vllm's KVCacheManager (the drop-in proof).
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course import load_impl
from mini_vllm import block_pool as mini
from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams

impl = load_impl(__file__)


def ids(blocks):
    return [b.block_id for b in blocks]


def free_ids(pool):
    return ids(pool.free_block_queue.get_all_free_blocks())


def check_invariants(pool):
    """I1 and I3 over the whole pool, from the outside."""
    free = pool.free_block_queue.get_all_free_blocks()
    counter, reported = pool.free_block_queue.num_free_blocks, pool.get_num_free_blocks()
    assert len(free) == counter == reported, (
        f"the free queue holds {len(free)} blocks but num_free_blocks says {counter} and "
        f"get_num_free_blocks() says {reported}: a method forgot to update the counter"
    )
    free_set = {b.block_id for b in free}
    assert len(free_set) == len(free), f"a block is in the free queue twice: {ids(free)}"
    assert pool.null_block.block_id == 0, "block 0 must be the null block"
    assert 0 not in free_set, f"the null block is back in the free queue: {ids(free)}"
    for block in pool.blocks[1:]:
        assert block.ref_cnt >= 0, f"{block}: ref_cnt went negative (freed once too often)"
        in_queue = block.block_id in free_set
        assert in_queue == (block.ref_cnt == 0), (
            f"I1 broken at {block}: it is {'' if in_queue else 'not '}in the free queue"
        )
        if block.block_hash is not None:
            indexed = pool.cached_block_hash_to_block.get(block.block_hash, {})
            assert indexed.get(block.block_id) is block, (
                f"{block} has a hash but is missing from cached_block_hash_to_block "
                "under it (a hash and its index entry must come and go together)"
            )


def request(hashes):
    """Anything with ``block_hashes`` will do for cache_full_blocks."""
    return SimpleNamespace(block_hashes=list(hashes))


def chain(token_blocks):
    hashes, parent = [], None
    for tokens in token_blocks:
        parent = impl.hash_block_tokens(parent, tokens)
        hashes.append(parent)
    return hashes


# ---------------------------------------------------------------- free queue


def test_free_queue_starts_in_block_id_order():
    blocks = [impl.KVCacheBlock(i) for i in range(5)]
    q = impl.FreeKVCacheBlockQueue(blocks)
    assert q.num_free_blocks == 5
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4]
    assert ids(q.popleft_n(2)) == [0, 1]
    assert q.popleft().block_id == 2
    assert ids(q.get_all_free_blocks()) == [3, 4] and q.num_free_blocks == 2


def test_free_queue_o1_middle_removal_touches_only_neighbours():
    blocks = [impl.KVCacheBlock(i) for i in range(10)]
    q = impl.FreeKVCacheBlockQueue(blocks)
    # Break a link far from block 6: a remove() that walks from the head would
    # trip over it; one that uses the block's own two links never sees it.
    saved = blocks[2].next_free_block
    blocks[2].next_free_block = None
    q.remove(blocks[6])
    blocks[2].next_free_block = saved
    assert blocks[6].prev_free_block is None and blocks[6].next_free_block is None
    assert blocks[5].next_free_block is blocks[7] and blocks[7].prev_free_block is blocks[5]
    assert q.num_free_blocks == 9
    q.remove(blocks[0])
    q.remove(blocks[9])
    assert ids(q.get_all_free_blocks()) == [1, 2, 3, 4, 5, 7, 8]


def test_free_queue_append_goes_to_the_tail_in_order():
    blocks = [impl.KVCacheBlock(i) for i in range(6)]
    q = impl.FreeKVCacheBlockQueue(blocks[:2])
    q.append(blocks[5])
    q.append_n([blocks[3], blocks[2]])
    assert ids(q.get_all_free_blocks()) == [0, 1, 5, 3, 2] and q.num_free_blocks == 5
    assert ids(q.popleft_n(0)) == [] and q.num_free_blocks == 5
    assert ids(q.popleft_n(5)) == [0, 1, 5, 3, 2]
    assert q.get_all_free_blocks() == [] and q.num_free_blocks == 0
    q.append(blocks[4])
    assert ids(q.get_all_free_blocks()) == [4]


def test_popped_blocks_carry_no_stale_links():
    blocks = [impl.KVCacheBlock(i) for i in range(6)]
    q = impl.FreeKVCacheBlockQueue(blocks)
    popped = q.popleft_n(3) + [q.popleft()]
    for b in popped:
        assert b.prev_free_block is None and b.next_free_block is None, (
            f"{b} left the queue but still links to "
            f"{b.prev_free_block} / {b.next_free_block}: clear both links"
        )
    # the new head must point back at the head sentinel, not at a block handed out
    q.remove(blocks[4])
    assert ids(q.get_all_free_blocks()) == [5] and q.num_free_blocks == 1
    q.append(blocks[0])
    assert ids(q.get_all_free_blocks()) == [5, 0]
    assert q.popleft() is blocks[5] and q.popleft() is blocks[0]


def test_free_queue_errors_are_loud():
    q = impl.FreeKVCacheBlockQueue([])
    with pytest.raises(ValueError):
        q.popleft()
    with pytest.raises(ValueError):
        q.popleft_n(1)
    with pytest.raises(RuntimeError):
        q.remove(impl.KVCacheBlock(3))  # never linked in
    # half-linked (one stale link): still not in the queue, and the queue is left intact
    q2 = impl.FreeKVCacheBlockQueue([impl.KVCacheBlock(0)])
    stray = impl.KVCacheBlock(5)
    stray.prev_free_block = q2.fake_free_list_head
    with pytest.raises(RuntimeError):
        q2.remove(stray)
    stray.prev_free_block, stray.next_free_block = None, q2.fake_free_list_tail
    with pytest.raises(RuntimeError):
        q2.remove(stray)
    assert ids(q2.get_all_free_blocks()) == [0] and q2.num_free_blocks == 1


# ---------------------------------------------------------------- hashing


def test_prefix_hash_is_chained():
    a = impl.hash_block_tokens(None, [1, 2, 3, 4])
    assert a == impl.hash_block_tokens(None, [1, 2, 3, 4])  # deterministic
    assert isinstance(a, bytes)
    cd_after_ab = impl.hash_block_tokens(a, [5, 6, 7, 8])
    cd_after_xy = impl.hash_block_tokens(impl.hash_block_tokens(None, [9, 9, 9, 9]), [5, 6, 7, 8])
    assert cd_after_ab != cd_after_xy  # same tokens, different prefix
    assert cd_after_ab != impl.hash_block_tokens(None, [5, 6, 7, 8])
    assert impl.hash_block_tokens(None, [1, 2]) != impl.hash_block_tokens(None, [2, 1])
    assert len({a, cd_after_ab, cd_after_xy}) == 3


@pytest.mark.parametrize("parent_tokens, tokens", [
    (None, [0]),
    (None, [1, 2, 3, 4]),
    ([1, 2, 3, 4], [5, 6, 7, 8]),
    (None, [2**31, 2**40 + 7, 50_257, 0]),  # ids beyond 32 bits must still pack as 64-bit
    ([9] * 16, list(range(16))),
])
def test_hash_is_bit_for_bit_mini_vllms(parent_tokens, tokens):
    """Request.block_hashes come from mini_vllm's function: yours must give the same bytes."""
    parent = None if parent_tokens is None else mini.hash_block_tokens(None, parent_tokens)
    assert impl.hash_block_tokens(parent, tokens) == mini.hash_block_tokens(parent, tokens)


# ---------------------------------------------------------------- block pool


def test_pool_reserves_block_zero_as_the_null_block():
    pool = impl.BlockPool(5)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4 and pool.get_usage() == 0.0
    assert ids(pool.get_new_blocks(4)) == [1, 2, 3, 4]
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="num_blocks"):
        impl.BlockPool(1)


def test_allocate_free_round_trip_keeps_I1():
    pool = impl.BlockPool(11)
    a = pool.get_new_blocks(6)
    b = pool.get_new_blocks(3)
    assert ids(a) == [1, 2, 3, 4, 5, 6] and ids(b) == [7, 8, 9]
    assert pool.get_num_free_blocks() == 1 and all(x.ref_cnt == 1 for x in a + b)
    check_invariants(pool)
    pool.free_blocks(reversed(a))
    pool.free_blocks(reversed(b))
    assert pool.get_num_free_blocks() == 10
    # exactly upstream's test_evict order: the untouched block first, then tails first
    assert free_ids(pool) == [10, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    check_invariants(pool)
    assert pool.get_usage() == 0.0


def test_usage_counts_usable_blocks_only():
    pool = impl.BlockPool(11)  # 10 usable blocks
    pool.get_new_blocks(5)
    assert pool.get_usage() == 0.5


def test_shared_block_is_freed_only_at_ref_cnt_zero():
    pool = impl.BlockPool(4)
    (blk,) = pool.get_new_blocks(1)
    pool.touch([blk])  # a second request shares it
    assert blk.ref_cnt == 2
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1 and blk.block_id not in free_ids(pool)
    pool.free_blocks([blk])
    assert blk.ref_cnt == 0 and free_ids(pool) == [2, 3, 1]
    check_invariants(pool)


def test_identical_content_is_not_deduplicated_I2():
    pool = impl.BlockPool(6)
    hashes = chain([[1, 2, 3, 4]])
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(request(hashes), first, 0, 1, 4)
    pool.cache_full_blocks(request(hashes), second, 0, 1, 4)
    # both keep their ids and their hash; the index holds both copies
    assert (first[0].block_id, second[0].block_id) == (1, 2)
    assert first[0].block_hash == second[0].block_hash == hashes[0]
    assert pool.get_cached_block(hashes[0]) is first[0]
    # evict the first copy: the second still serves hits
    pool.free_blocks(first)
    pool.get_new_blocks(3)  # blocks 3, 4, 5
    assert pool.get_new_blocks(1)[0] is first[0] and first[0].block_hash is None
    assert pool.get_cached_block(hashes[0]) is second[0]
    check_invariants(pool)


def test_null_block_stays_out_of_the_free_queue():
    pool = impl.BlockPool(4)
    null = pool.null_block
    # A block table may point at the null block (a "no block here" entry). Touching
    # and freeing it must never link it into the free queue, or it would be handed out.
    pool.touch([null])
    assert free_ids(pool) == [1, 2, 3], "touch() must not unlink the null block: it is not queued"
    pool.free_blocks([null])
    assert free_ids(pool) == [1, 2, 3], "free_blocks() must not append the null block"
    assert pool.get_num_free_blocks() == 3
    check_invariants(pool)


def test_only_full_blocks_are_cached_I3():
    pool = impl.BlockPool(8)
    hashes = chain([[1, 2, 3, 4], [5, 6, 7, 8]])  # tokens 1..10: 2 full blocks + 2 tokens
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request(hashes), blocks, 0, 2, 4)
    assert [b.block_hash is not None for b in blocks] == [True, True, False]
    assert len(pool.cached_block_hash_to_block) == 2
    # caching is incremental: a later call starts at num_cached_blocks
    hashes += chain([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])[2:]
    pool.cache_full_blocks(request(hashes), blocks, 2, 3, 4)
    assert blocks[2].block_hash == hashes[2] and len(pool.cached_block_hash_to_block) == 3


def test_cache_full_blocks_rejects_too_few_hashes():
    pool = impl.BlockPool(6)
    blocks = pool.get_new_blocks(3)
    with pytest.raises(ValueError, match="block_hashes"):
        pool.cache_full_blocks(request(chain([[1, 2, 3, 4]])), blocks, 0, 2, 4)
    assert all(b.block_hash is None for b in blocks) and pool.cached_block_hash_to_block == {}


def test_cache_full_blocks_never_hashes_the_null_block():
    pool = impl.BlockPool(6)
    hashes = chain([[1, 2, 3, 4], [5, 6, 7, 8]])
    (blk,) = pool.get_new_blocks(1)
    # a block table whose first entry is the null block ("no block here")
    pool.cache_full_blocks(request(hashes), [pool.null_block, blk], 0, 2, 4)
    assert pool.null_block.block_hash is None
    assert blk.block_hash == hashes[1]
    assert pool.cached_block_hash_to_block == {hashes[1]: {blk.block_id: blk}}


def test_touch_revives_a_cached_free_block_from_the_middle_I4():
    pool = impl.BlockPool(6)
    hashes = chain([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request(hashes), blocks, 0, 3, 4)
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [4, 5, 3, 2, 1]  # cached, free, evictable
    hit = pool.get_cached_block(hashes[1])
    assert hit is blocks[1] and hit.ref_cnt == 0
    pool.touch([hit])
    assert hit.ref_cnt == 1 and free_ids(pool) == [4, 5, 3, 1]
    assert hit.block_hash == hashes[1]  # revived with its content, nothing recomputed
    check_invariants(pool)


def test_eviction_is_lazy_and_drops_the_cache_entry():
    pool = impl.BlockPool(3)  # usable: 1, 2
    hashes = chain([[7, 7, 7, 7]])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(request(hashes), [blk], 0, 1, 4)
    pool.free_blocks([blk])
    assert pool.get_cached_block(hashes[0]) is blk  # free but still a hit target
    got = pool.get_new_blocks(2)  # block 2, then block 1 (evicted on the way out)
    assert ids(got) == [2, 1]
    assert blk.block_hash is None and pool.get_cached_block(hashes[0]) is None
    assert pool.cached_block_hash_to_block == {}


def test_maybe_evict_reports_whether_there_was_anything_to_evict():
    pool = impl.BlockPool(4)
    hashes = chain([[3, 3, 3, 3]])
    cached, plain = pool.get_new_blocks(2)
    pool.cache_full_blocks(request(hashes), [cached], 0, 1, 4)
    assert pool._maybe_evict_cached_block(plain) is False
    assert pool._maybe_evict_cached_block(cached) is True
    assert cached.block_hash is None and pool.cached_block_hash_to_block == {}
    assert pool._maybe_evict_cached_block(cached) is False  # nothing left the second time


def test_caching_disabled_pool_never_evicts():
    pool = impl.BlockPool(3, enable_caching=False)
    (blk,) = pool.get_new_blocks(1)
    blk.block_hash = b"stale"  # nothing should look at it
    pool.free_blocks([blk])
    pool.get_new_blocks(2)
    assert blk.block_hash == b"stale" and blk.ref_cnt == 1


# ------------------------------------------- your pool under mini_vllm's manager


def make_request(req_id, tokens):
    return Request(req_id, tokens, SamplingParams(max_tokens=4), eos_token_id=None)


def manager_with(pool_cls, num_blocks, block_size, enable_caching=True):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=enable_caching)
    kv.block_pool = pool_cls(num_blocks, enable_caching)
    return kv


def admit(kv, req):
    hits, num_hit = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return None if new is None else num_hit


def test_upstream_test_evict_numbers_with_your_pool():
    """upstream/tests/v1/core/test_prefix_caching.py::test_evict, block for block."""
    kv = manager_with(impl.BlockPool, 11, 16)
    req0 = make_request("0", list(range(5 * 16 + 7)))
    assert admit(kv, req0) == 0 and kv.get_block_ids("0") == [1, 2, 3, 4, 5, 6]
    req1 = make_request("1", list(range(87, 87 + 3 * 16)))
    assert admit(kv, req1) == 0 and kv.get_block_ids("1") == [7, 8, 9]
    assert kv.block_pool.free_block_queue.num_free_blocks == 1
    kv.free(req0)
    kv.free(req1)
    assert free_ids(kv.block_pool) == [10, 6, 5, 4, 3, 2, 1, 9, 8, 7]
    req2 = make_request("2", list(range(2 * 16 + 3)))
    hits, num_hit = kv.get_computed_blocks(req2)
    assert ids(hits) == [1, 2] and num_hit == 32
    assert ids(kv.allocate_slots(req2, 3, hits, num_hit)) == [10]
    assert kv.block_pool.free_block_queue.num_free_blocks == 7


def test_upstream_computed_blocks_not_evicted_with_your_pool():
    """upstream test_computed_blocks_not_evicted: a hit block is not the one evicted."""
    kv = manager_with(impl.BlockPool, 3, 16)
    r0, r1 = make_request("0", list(range(16))), make_request("1", list(range(16, 32)))
    admit(kv, r0)
    admit(kv, r1)
    assert kv.get_block_ids("0") == [1] and kv.get_block_ids("1") == [2]
    kv.free(r0)
    kv.free(r1)
    r2 = make_request("2", list(range(32)))
    hits, num_hit = kv.get_computed_blocks(r2)
    assert ids(hits) == [1] and num_hit == 16
    assert ids(kv.allocate_slots(r2, 16, hits, num_hit)) == [2]


def snapshot(kv, live):
    pool = kv.block_pool
    return {
        "free queue (head to tail)": free_ids(pool),
        "block tables": {rid: kv.get_block_ids(rid) for rid in live},
        "ref_cnt by block id": [b.ref_cnt for b in pool.blocks],
        "block_hash by block id": [b.block_hash for b in pool.blocks],
        "get_num_free_blocks()": pool.get_num_free_blocks(),
        "get_usage()": round(pool.get_usage(), 12),
    }


def assert_same_state(ref_kv, ref_live, your_kv, your_live, after):
    ref, yours = snapshot(ref_kv, ref_live), snapshot(your_kv, your_live)
    for name in ref:
        if yours[name] != ref[name]:
            show = short_hashes if name.startswith("block_hash") else (lambda x: x)
            pytest.fail(f"after {after}: your {name} is {show(yours[name])}, "
                        f"mini_vllm's is {show(ref[name])}")


def short_hashes(hashes):
    """32-byte digests cut to 8 hex digits, so a failure message stays readable."""
    return [None if h is None else h.hex()[:8] for h in hashes]


def run_ops(seed, num_ops, num_blocks=12, block_size=4, enable_caching=True):
    """Drive mini_vllm's pool and yours through the same random admissions,
    decode steps and frees; compare the complete state after every operation."""
    rng = random.Random(seed)
    kvs = [manager_with(mini.BlockPool, num_blocks, block_size, enable_caching),
           manager_with(impl.BlockPool, num_blocks, block_size, enable_caching)]
    reqs: list[dict[str, Request]] = [{}, {}]
    counter = 0
    prefixes = [[rng.randrange(3) for _ in range(12)] for _ in range(3)]
    for step in range(num_ops):
        op = rng.random()
        if op < 0.45 or not reqs[0]:
            counter += 1
            tokens = rng.choice(prefixes)[: rng.randint(1, 12)] + [rng.randrange(3)
                                                                  for _ in range(rng.randint(0, 6))]
            results = []
            for kv, live in zip(kvs, reqs, strict=True):
                req = make_request(str(counter), tokens)
                got = admit(kv, req)
                if got is not None:
                    live[req.request_id] = req
                results.append(got)
            what = f"operation {step}: admit request {counter} with {len(tokens)} tokens"
            assert results[1] == results[0], (
                f"{what}: mini_vllm's manager got {results[0]} cached tokens "
                f"(None = refused), on your pool {results[1]}"
            )
        elif op < 0.75:
            rid = rng.choice(sorted(reqs[0]))
            token = rng.randrange(3)
            results = []
            for kv, live in zip(kvs, reqs, strict=True):
                req = live[rid]
                req.append_output_token(token)
                new = kv.allocate_slots(req, 1)
                if new is not None:
                    req.num_computed_tokens = req.num_tokens
                results.append(None if new is None else ids(new))
            what = f"operation {step}: one decode token for request {rid}"
            assert results[1] == results[0], (
                f"{what}: mini_vllm's pool gave new blocks {results[0]} (None = refused), "
                f"yours {results[1]}"
            )
        else:
            rid = rng.choice(sorted(reqs[0]))
            for kv, live in zip(kvs, reqs, strict=True):
                kv.free(live.pop(rid))
            what = f"operation {step}: free request {rid}"
        assert_same_state(kvs[0], reqs[0], kvs[1], reqs[1], what)
        check_invariants(kvs[1].block_pool)


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_agree_with_mini_vllm(seed):
    run_ops(seed, num_ops=60)


def test_random_operations_agree_with_caching_disabled():
    run_ops(99, num_ops=60, enable_caching=False)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), num_blocks=st.integers(4, 10))
def test_any_operation_sequence_agrees_with_mini_vllm(seed, num_blocks):
    run_ops(seed, num_ops=25, num_blocks=num_blocks)


def test_mini_vllm_engine_runs_unchanged_on_your_pool():
    """Swap your BlockPool into a whole engine: same tokens, same cache hits, same preemptions."""
    from mini_vllm.engine import LLMEngine

    prompts = ["the same long system prompt, then a question " + q for q in "abcdef"]
    params = SamplingParams(temperature=0, max_tokens=16)
    runs = []
    for pool_cls in (mini.BlockPool, impl.BlockPool):
        engine = LLMEngine(model="toy", num_blocks=22, block_size=4, max_num_seqs=4)
        engine.scheduler.kv_cache_manager.block_pool = pool_cls(22)
        outs = engine.generate(prompts, params)
        stats = [(s.num_scheduled_tokens, s.blocks_used, s.num_cached_tokens, s.preempted)
                 for s in engine.stats]
        runs.append(([r.output_token_ids for r in outs], stats))
    assert runs[0] == runs[1]
    assert any(s[2] for s in runs[1][1])  # prefix hits happened
    assert any(s[3] for s in runs[1][1])  # the small pool forced preemptions


def test_mini_build_example_shares_three_blocks_in_the_first_step():
    """02-mini-build.md step 5: 'hello world,' is 12 byte tokens = 3 blocks of 4."""
    from mini_vllm.engine import LLMEngine

    engine = LLMEngine(model="toy", num_blocks=64, block_size=4)
    engine.scheduler.kv_cache_manager.block_pool = impl.BlockPool(64)
    engine.generate(["hello world, hello world", "hello world, again"],
                    SamplingParams(temperature=0, max_tokens=8))
    first = engine.stats[0]
    assert first.num_scheduled_tokens == {"req-0": 24, "req-1": 6}
    assert first.num_cached_tokens == 12
