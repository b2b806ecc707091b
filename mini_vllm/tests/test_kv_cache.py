"""KVCacheManager: the prefix-cache head start, allocation and freeing, in exact numbers.

block_size 4 and a 32-token prompt (8 full blocks) throughout, as in Phase 02's lab.
"""
from __future__ import annotations

import pytest

from mini_vllm.kv_cache import KVCacheManager

PROMPT = list(range(100, 132))  # 32 tokens = 8 blocks of 4


def _prefill(kv, req):
    """The scheduler's admission move: cache hit -> head start -> allocate the rest."""
    hits, num_hit = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return num_hit


def _refs(kv, req):
    return [b.ref_cnt for b in kv.get_blocks(req.request_id)]


def test_first_request_populates_a_cold_cache(make_request):
    kv = KVCacheManager(64, 4)
    a = make_request(PROMPT)
    assert _prefill(kv, a) == 0
    assert kv.get_block_ids(a.request_id) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert _refs(kv, a) == [1] * 8
    assert len(kv.block_pool.cached_block_hash_to_block) == 8  # cached at allocation
    assert len(a.block_hashes) == 8


def test_identical_prompt_shares_all_but_the_tail_block(make_request):
    kv = KVCacheManager(64, 4)
    a, b = make_request(PROMPT), make_request(PROMPT)
    _prefill(kv, a)
    assert _prefill(kv, b) == 28  # cap: (32 - 1) // 4 = 7 blocks
    assert kv.get_block_ids(b.request_id) == [1, 2, 3, 4, 5, 6, 7, 9]
    assert _refs(kv, b) == [2, 2, 2, 2, 2, 2, 2, 1]
    kv.block_pool.check_invariants()


def test_diverging_prompt_shares_only_the_common_prefix(make_request):
    kv = KVCacheManager(64, 4)
    _prefill(kv, make_request(PROMPT))
    c = make_request(PROMPT[:16] + [7] * 16)
    assert _prefill(kv, c) == 16
    assert kv.get_block_ids(c.request_id)[:4] == [1, 2, 3, 4]


def test_full_cache_hit_still_leaves_the_last_token_to_compute(make_request):
    kv = KVCacheManager(64, 4)
    _prefill(kv, make_request(PROMPT))
    # 33 tokens: all 8 full blocks can be hit, 1 token left to compute
    hits, n = kv.get_computed_blocks(make_request(PROMPT + [5]))
    assert (len(hits), n) == (8, 32)
    # 32 tokens, a multiple of the block size: the whole last block is recomputed
    hits, n = kv.get_computed_blocks(make_request(PROMPT))
    assert (len(hits), n) == (7, 28)
    # a 1-token prompt can never hit
    assert kv.get_computed_blocks(make_request([100])) == ([], 0)


def test_free_order_evicts_tails_before_the_shared_prefix(make_request):
    kv = KVCacheManager(10, 4)  # null + A's 8 + B's tail: exactly full
    a, b = make_request(PROMPT), make_request(PROMPT)
    _prefill(kv, a)
    _prefill(kv, b)
    assert kv.block_pool.get_num_free_blocks() == 0
    kv.free(a)
    kv.free(b)
    assert [blk.block_id for blk in kv.block_pool.free_block_queue.get_all_free_blocks()] == [
        8, 9, 7, 6, 5, 4, 3, 2, 1
    ]
    evicted = kv.block_pool.get_new_blocks(2)
    assert [blk.block_id for blk in evicted] == [8, 9]  # both private tails
    d = make_request(PROMPT)
    assert kv.get_computed_blocks(d)[1] == 28  # the shared prefix survived


def test_cached_free_blocks_are_revived_not_recomputed(make_request):
    kv = KVCacheManager(64, 4)
    a = make_request(PROMPT)
    _prefill(kv, a)
    kv.free(a)
    assert kv.block_pool.get_num_free_blocks() == 63
    d = make_request(PROMPT)
    assert _prefill(kv, d) == 28
    assert kv.get_block_ids(d.request_id)[:7] == [1, 2, 3, 4, 5, 6, 7]
    assert _refs(kv, d) == [1] * 8
    assert kv.block_pool.get_num_free_blocks() == 55
    kv.block_pool.check_invariants()


def test_caching_disabled_means_no_sharing(make_request):
    kv = KVCacheManager(64, 4, enable_caching=False)
    a, b = make_request(PROMPT), make_request(PROMPT)
    _prefill(kv, a)
    assert _prefill(kv, b) == 0
    assert kv.get_block_ids(b.request_id) == [9, 10, 11, 12, 13, 14, 15, 16]
    assert kv.block_pool.cached_block_hash_to_block == {}


def test_allocate_slots_grows_block_by_block(make_request):
    kv = KVCacheManager(64, 4)
    r = make_request(list(range(6)))
    assert [b.block_id for b in kv.allocate_slots(r, 6)] == [1, 2]
    r.num_computed_tokens = 6
    r.append_output_token(50)  # 7 tokens: still fits in 2 blocks
    assert kv.allocate_slots(r, 1) == []
    r.num_computed_tokens = 7
    r.append_output_token(51)  # the 8th token fills block 2 ...
    assert kv.allocate_slots(r, 1) == []
    assert kv.block_pool.blocks[2].block_hash is not None  # ... which is cached now
    r.num_computed_tokens = 8
    r.append_output_token(52)
    assert [b.block_id for b in kv.allocate_slots(r, 1)] == [3]


def test_allocate_slots_returns_none_and_changes_nothing_when_full(make_request):
    kv = KVCacheManager(4, 4)  # 3 usable blocks
    a = make_request(list(range(8)))
    kv.allocate_slots(a, 8)
    b = make_request(list(range(50, 58)))
    assert kv.allocate_slots(b, 8) is None
    assert kv.block_pool.get_num_free_blocks() == 1
    assert kv.get_block_ids(b.request_id) == [] and b.request_id not in kv.req_to_blocks


def test_evictable_cache_hits_count_against_free_space(make_request):
    kv = KVCacheManager(4, 4)  # 3 usable blocks
    a = make_request(list(range(9)))
    kv.allocate_slots(a, 9)  # blocks 1, 2 cached (full), 3 partial
    kv.free(a)
    b = make_request(list(range(9)) + [77] * 4)  # 13 tokens: hits 2 blocks, needs 2 more
    hits, n = kv.get_computed_blocks(b)
    assert (len(hits), n) == (2, 8)
    # 2 fresh blocks + 2 evictable hits = 4 > 3 free: refuse rather than over-commit
    assert kv.allocate_slots(b, 5, hits, n) is None
    assert all(h.ref_cnt == 0 for h in hits) and kv.block_pool.get_num_free_blocks() == 3
    kv.block_pool.check_invariants()


def test_allocate_slots_rejects_inconsistent_arguments(make_request):
    kv = KVCacheManager(8, 4)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="num_new_tokens must be an integer >= 1"):
            kv.allocate_slots(make_request([1]), bad)
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        kv.allocate_slots(make_request([1]), 1, [], 4)
    # cache hits are only for a request that holds no blocks yet
    a = make_request(range(8))
    _prefill(kv, a)
    b = make_request(range(9))
    kv.allocate_slots(b, 1)
    hits, n = kv.get_computed_blocks(b)
    with pytest.raises(ValueError, match="new_computed_blocks"):
        kv.allocate_slots(b, 1, hits, n)
    kv.block_pool.check_invariants()


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"block_size": 0}, "block_size"), ({"block_size": True}, "block_size"),
    ({"block_size": 2.0}, "block_size"), ({"num_blocks": 1}, "num_blocks"),
    ({"max_model_len": 0}, "max_model_len"), ({"max_model_len": 8.5}, "max_model_len"),
    ({"enable_caching": "yes"}, "enable_caching"),
])
def test_constructor_rejects_bad_values_naming_the_parameter(kwargs, name):
    args = {"num_blocks": 8, "block_size": 4, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        KVCacheManager(**args)


def test_allocate_slots_never_silently_cuts_at_max_model_len(make_request):
    # Upstream clamps the slots to max_model_len (for speculative lookahead);
    # with no lookahead a request past it is a caller's bug: refuse, allocate nothing.
    kv = KVCacheManager(16, 4, max_model_len=10)
    r = make_request(range(8))
    assert [b.block_id for b in kv.allocate_slots(r, 8)] == [1, 2]
    r.num_computed_tokens = 8
    with pytest.raises(ValueError, match=r"num_new_tokens must be <= max_model_len - computed tokens = 10 - 8, got 3"):
        kv.allocate_slots(r, 3)
    assert kv.get_block_ids(r.request_id) == [1, 2] and kv.block_pool.get_num_free_blocks() == 13
    assert [b.block_id for b in kv.allocate_slots(r, 2)] == [3]  # exactly max_model_len is fine


def test_same_block_after_a_different_prefix_is_not_a_hit(make_request):
    # Chained hashing end to end: block 1 of b has a's tokens, but after a
    # different block 0, so its K/V differ and it must not be served.
    kv = KVCacheManager(64, 4)
    a = make_request([1, 2, 3, 4, 5, 6, 7, 8, 9])
    _prefill(kv, a)
    b = make_request([0, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks(b) == ([], 0)
    assert a.block_hashes[1] != b.block_hashes[1]
    c = make_request([1, 2, 3, 4, 5, 6, 7, 8, 0])  # same first two blocks: both hit
    hits, n = kv.get_computed_blocks(c)
    assert [blk.block_id for blk in hits] == [1, 2] and n == 8
