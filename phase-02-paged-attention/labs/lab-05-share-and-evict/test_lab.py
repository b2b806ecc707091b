"""Lab 02-05 tests: sharing, eviction order, revival, the last-token cap.

block_size 4 and a 32-token prompt (8 full blocks) throughout.
"""
from __future__ import annotations

import itertools

import pytest

from course import load_impl
from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams

impl = load_impl(__file__)

BLOCK = 4
PROMPT = list(range(100, 132))  # 32 tokens = 8 full blocks
_ids = itertools.count()


def req(tokens):
    return Request(f"r{next(_ids)}", tokens, SamplingParams(max_tokens=4), eos_token_id=None)


def test_first_request_populates_a_cold_cache():
    kv = KVCacheManager(64, BLOCK)
    a = req(PROMPT)
    assert impl.prefill(kv, a) == 0
    assert kv.get_block_ids(a.request_id) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert impl.ref_counts(kv, a) == [1] * 8
    assert a.num_computed_tokens == 32
    assert len(kv.block_pool.cached_block_hash_to_block) == 8


def test_identical_prompt_shares_all_but_the_tail_block():
    kv = KVCacheManager(64, BLOCK)
    a, b = req(PROMPT), req(PROMPT)
    impl.prefill(kv, a)
    assert impl.prefill(kv, b) == 28  # (32 - 1) // 4 = 7 blocks, not 8
    assert kv.get_block_ids(b.request_id) == [1, 2, 3, 4, 5, 6, 7, 9]
    assert impl.ref_counts(kv, b) == [2, 2, 2, 2, 2, 2, 2, 1]
    assert impl.ref_counts(kv, a) == [2, 2, 2, 2, 2, 2, 2, 1]
    # B's prompt cost the pool one block, not eight
    assert kv.block_pool.get_num_free_blocks() == 63 - 9


def test_ref_counts_follow_the_block_table_not_block_ids():
    """A hit on high block ids followed by a fresh low id: the table is [4, 5, 3]."""
    kv = KVCacheManager(10, BLOCK)
    filler, keep = req(list(range(300, 312))), req(list(range(400, 409)))
    impl.prefill(kv, filler)                       # blocks 1, 2, 3
    assert impl.prefill(kv, keep) == 0             # blocks 4, 5, 6
    impl.prefill(kv, req(list(range(500, 512))))   # blocks 7, 8, 9
    kv.free(filler)                                # free queue: 3, 2, 1
    b = req(list(range(400, 408)) + [1])
    assert impl.prefill(kv, b) == 8
    assert kv.get_block_ids(b.request_id) == [4, 5, 3]
    assert impl.ref_counts(kv, b) == [2, 2, 1]
    assert impl.ref_counts(kv, keep) == [2, 2, 1]
    assert impl.eviction_order(kv) == [2, 1]


def test_diverging_prompt_shares_only_the_common_prefix():
    kv = KVCacheManager(64, BLOCK)
    impl.prefill(kv, req(PROMPT))
    c = req(PROMPT[:16] + [7] * 16)
    assert impl.prefill(kv, c) == 16
    assert kv.get_block_ids(c.request_id) == [1, 2, 3, 4, 9, 10, 11, 12]
    # same tokens in blocks 5-8 would not help: a hash names the whole prefix
    d = req([7] * 16 + PROMPT[16:])
    assert impl.prefill(kv, d) == 0


def test_last_token_is_always_recomputed():
    kv = KVCacheManager(64, BLOCK)
    impl.prefill(kv, req(PROMPT))
    assert impl.prefill(kv, req(PROMPT)) == 28  # all 8 blocks cached, 7 usable
    assert impl.prefill(kv, req(PROMPT + [5])) == 32  # 33 tokens: 8 blocks usable
    one_block = PROMPT[:4]
    impl.prefill(kv, req(one_block))
    assert impl.prefill(kv, req(one_block)) == 0  # exactly one block: 3 usable tokens


def test_a_fully_cached_48_token_prompt_at_block_size_16_hits_32():
    """EXERCISES 3: the cap is 47 tokens, which is 2 whole blocks of 16."""
    kv = KVCacheManager(16, 16)
    prompt = list(range(500, 548))
    assert impl.prefill(kv, req(prompt)) == 0
    second = req(prompt)
    assert impl.prefill(kv, second) == 32
    assert impl.ref_counts(kv, second) == [2, 2, 1]  # the last 16 tokens go to a new block


def test_three_sharers_finishing_b_c_a_leave_the_prefix_for_last():
    """EXERCISES 12: a 2-block shared prefix, one private block each, freed B, C, A."""
    kv = KVCacheManager(10, BLOCK)
    shared = list(range(200, 208))
    a, b, c = (req(shared + [t] * 4) for t in (1, 2, 3))
    assert [impl.prefill(kv, r) for r in (a, b, c)] == [0, 8, 8]
    assert [kv.get_block_ids(r.request_id) for r in (a, b, c)] == [[1, 2, 3], [1, 2, 4], [1, 2, 5]]
    for r in (b, c, a):
        kv.free(r)
    assert impl.eviction_order(kv) == [6, 7, 8, 9, 4, 5, 3, 2, 1]


def test_prompt_shorter_than_a_block_never_hits():
    kv = KVCacheManager(64, BLOCK)
    cached = [impl.prefill(kv, req([1, 2, 3])) for _ in range(8)]
    assert cached == [0] * 8  # a 0% hit rate, whatever the traffic
    kv2 = KVCacheManager(64, BLOCK)
    cached = [impl.prefill(kv2, req(PROMPT)) for _ in range(8)]
    assert cached == [0] + [28] * 7
    assert sum(cached) / (8 * 32) == 0.765625  # 7 * 28 / 256


def test_free_order_evicts_tails_before_shared_prefix():
    kv = KVCacheManager(10, BLOCK)  # null + A's 8 + B's private tail: exactly full
    a, b = req(PROMPT), req(PROMPT)
    assert impl.prefill(kv, a) == 0 and impl.prefill(kv, b) == 28
    assert kv.block_pool.get_num_free_blocks() == 0
    kv.free(a)
    assert impl.eviction_order(kv) == [8]  # only A's tail dropped to ref_cnt 0
    kv.free(b)
    assert impl.eviction_order(kv) == [8, 9, 7, 6, 5, 4, 3, 2, 1]
    assert len(kv.block_pool.cached_block_hash_to_block) == 8  # all still cached
    # demand two blocks: the two private tails go, the shared prefix stays
    c = req([9] * 8)
    assert impl.prefill(kv, c) == 0
    assert kv.get_block_ids(c.request_id) == [8, 9]
    assert impl.eviction_order(kv) == [7, 6, 5, 4, 3, 2, 1]
    d = req(PROMPT)
    assert impl.prefill(kv, d) is None  # 7 hits but no block left for the 8th
    kv.free(c)
    assert impl.prefill(kv, d) == 28
    assert kv.get_block_ids(d.request_id)[:7] == [1, 2, 3, 4, 5, 6, 7]


def test_cached_free_blocks_are_revived_from_the_middle_of_the_queue():
    kv = KVCacheManager(20, BLOCK)
    a, e = req(PROMPT), req([5] * 8)
    impl.prefill(kv, a)
    impl.prefill(kv, e)  # blocks 9, 10
    kv.free(a)
    kv.free(e)
    before = impl.eviction_order(kv)
    assert before == [11, 12, 13, 14, 15, 16, 17, 18, 19, 8, 7, 6, 5, 4, 3, 2, 1, 10, 9]
    d = req(PROMPT)
    assert impl.prefill(kv, d) == 28
    assert kv.get_block_ids(d.request_id) == [1, 2, 3, 4, 5, 6, 7, 11]
    assert impl.ref_counts(kv, d) == [1] * 8
    # A's 7 head blocks left from between 8 and 10; block 11 came off the head
    assert impl.eviction_order(kv) == [12, 13, 14, 15, 16, 17, 18, 19, 8, 10, 9]


def test_an_exactly_sized_pool_counts_every_block():
    kv = KVCacheManager(10, BLOCK)
    a, b, f = req(PROMPT), req(PROMPT), req(PROMPT)
    impl.prefill(kv, a)
    # 7 hits + 1 new block fit exactly; counting the hits twice would not
    assert impl.prefill(kv, b) == 28
    assert kv.block_pool.get_num_free_blocks() == 0
    refs_before = [blk.ref_cnt for blk in kv.block_pool.blocks]
    assert impl.prefill(kv, f) is None
    assert [blk.ref_cnt for blk in kv.block_pool.blocks] == refs_before
    assert f.num_computed_tokens == 0 and kv.get_block_ids(f.request_id) == []
    kv.free(b)
    assert impl.prefill(kv, f) == 28 and kv.get_block_ids(f.request_id)[-1] == 9


def test_caching_disabled_means_no_sharing():
    kv = KVCacheManager(64, BLOCK, enable_caching=False)
    a, b = req(PROMPT), req(PROMPT)
    assert impl.prefill(kv, a) == 0 and impl.prefill(kv, b) == 0
    assert impl.ref_counts(kv, b) == [1] * 8
    assert set(kv.get_block_ids(a.request_id)).isdisjoint(kv.get_block_ids(b.request_id))
    assert kv.block_pool.cached_block_hash_to_block == {}


def test_prefill_rejects_a_request_that_already_started():
    kv = KVCacheManager(64, BLOCK)
    r = req(PROMPT)
    r.num_computed_tokens = 4
    with pytest.raises(ValueError, match="num_computed_tokens"):
        impl.prefill(kv, r)
