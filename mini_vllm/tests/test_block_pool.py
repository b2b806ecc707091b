"""Exact-number tests of the block pool, in the style of upstream/tests/v1/core/."""
from __future__ import annotations

import pytest

from mini_vllm.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock, hash_block_tokens
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams


def _ids(blocks):
    return [b.block_id for b in blocks]


def _cached_request(pool, token_ids, block_size, blocks):
    """Cache ``blocks`` as the full blocks of a request holding ``token_ids``."""
    req = Request("x", token_ids, SamplingParams(), 256)
    parent = None
    for i in range(len(token_ids) // block_size):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        req.block_hashes.append(parent)
    pool.cache_full_blocks(req, blocks, 0, len(token_ids) // block_size, block_size)
    return req


# ---- the free queue -------------------------------------------------------

def test_free_queue_starts_in_block_id_order():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    assert q.num_free_blocks == 5
    assert _ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4]
    assert q.fake_free_list_head.next_free_block is blocks[0]
    assert q.fake_free_list_tail.prev_free_block is blocks[4]


def test_free_queue_o1_middle_removal():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[2])
    assert _ids(q.get_all_free_blocks()) == [0, 1, 3, 4] and q.num_free_blocks == 4
    # only the neighbours' links changed: nothing was scanned or shifted
    assert blocks[1].next_free_block is blocks[3] and blocks[3].prev_free_block is blocks[1]
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    q.remove(blocks[0])
    q.remove(blocks[4])
    assert _ids(q.get_all_free_blocks()) == [1, 3]


def test_free_queue_popleft_append_and_batches():
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks)
    assert q.popleft() is blocks[0]
    assert _ids(q.popleft_n(2)) == [1, 2]
    q.append(blocks[0])
    q.append_n([blocks[2], blocks[1]])
    assert _ids(q.get_all_free_blocks()) == [3, 4, 5, 0, 2, 1] and q.num_free_blocks == 6
    assert q.popleft_n(0) == []


def test_free_queue_errors_are_loud():
    blocks = [KVCacheBlock(0)]
    q = FreeKVCacheBlockQueue(blocks)
    q.popleft()
    with pytest.raises(ValueError, match="no free blocks"):
        q.popleft()
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(blocks[0])
    with pytest.raises(ValueError, match="cannot pop 1"):
        q.popleft_n(1)


# ---- hashing --------------------------------------------------------------

def test_prefix_hash_is_chained():
    a = hash_block_tokens(None, [1, 2, 3, 4])
    assert a == hash_block_tokens(None, [1, 2, 3, 4])
    assert a != hash_block_tokens(None, [1, 2, 3, 5])
    # the same tokens after a different prefix hash differently
    assert hash_block_tokens(a, [9, 9, 9, 9]) != hash_block_tokens(hash_block_tokens(None, [0, 2, 3, 4]), [9, 9, 9, 9])
    assert len(a) == 32  # SHA-256


# ---- the pool -------------------------------------------------------------

def test_pool_reserves_block_zero_as_the_null_block():
    pool = BlockPool(11)
    assert pool.get_num_free_blocks() == 10
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    got = pool.get_new_blocks(10)
    assert _ids(got) == list(range(1, 11))  # never block 0
    assert all(b.ref_cnt == 1 for b in got)
    assert pool.get_num_free_blocks() == 0 and pool.get_usage() == 1.0
    with pytest.raises(ValueError, match="asked for 1 blocks but only 0 are free"):
        pool.get_new_blocks(1)
    pool.check_invariants()


def test_allocate_free_round_trip_keeps_I1():
    pool = BlockPool(11)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    assert _ids(a) == [1, 2, 3] and _ids(b) == [4, 5]
    assert pool.get_num_free_blocks() == 5 and pool.get_usage() == 0.5
    pool.free_blocks(reversed(a))
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [6, 7, 8, 9, 10, 3, 2, 1]
    pool.check_invariants()
    # the next allocation takes the head: never-used blocks first, then a's tail
    assert _ids(pool.get_new_blocks(6)) == [6, 7, 8, 9, 10, 3]


def test_shared_block_is_freed_only_at_ref_cnt_zero():
    pool = BlockPool(5)
    (blk,) = pool.get_new_blocks(1)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1 and pool.get_num_free_blocks() == 3
    pool.free_blocks([blk])
    assert blk.ref_cnt == 0 and pool.get_num_free_blocks() == 4
    pool.check_invariants()


def test_only_full_blocks_are_cached_I3():
    pool = BlockPool(10)
    blocks = pool.get_new_blocks(3)
    tokens = list(range(10))  # block_size 4: two full blocks and a partial one
    _cached_request(pool, tokens, 4, blocks)
    assert blocks[0].block_hash is not None and blocks[1].block_hash is not None
    assert blocks[2].block_hash is None
    assert len(pool.cached_block_hash_to_block) == 2
    assert pool.get_cached_block(blocks[1].block_hash) is blocks[1]
    pool.check_invariants()


def test_identical_content_is_not_deduplicated_I2():
    pool = BlockPool(10)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    _cached_request(pool, [1, 2, 3, 4], 4, a)
    _cached_request(pool, [1, 2, 3, 4], 4, b)
    h = a[0].block_hash
    assert h == b[0].block_hash
    assert sorted(pool.cached_block_hash_to_block[h]) == [1, 2]  # both kept, ids unchanged
    assert pool.get_cached_block(h) is a[0]  # the first one cached wins lookups
    pool.check_invariants()


def test_touch_revives_a_cached_free_block_from_the_middle_I4():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3
    _cached_request(pool, list(range(12)), 4, blocks)
    pool.free_blocks(reversed(blocks))
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [4, 5, 3, 2, 1]
    hit = pool.get_cached_block(blocks[1].block_hash)
    assert hit is blocks[1] and hit.ref_cnt == 0
    pool.touch([hit])
    assert hit.ref_cnt == 1 and hit.block_hash is not None  # still cached, now in use
    assert _ids(pool.free_block_queue.get_all_free_blocks()) == [4, 5, 3, 1]
    pool.check_invariants()


def test_eviction_is_lazy_and_drops_the_cache_entry():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)  # 1, 2
    _cached_request(pool, list(range(8)), 4, blocks)
    pool.free_blocks(reversed(blocks))  # queue: 3, 2, 1
    assert len(pool.cached_block_hash_to_block) == 2  # free but still cached
    h2 = blocks[1].block_hash
    got = pool.get_new_blocks(2)  # block 3 (never cached), then block 2: evicted
    assert _ids(got) == [3, 2]
    assert blocks[1].block_hash is None and pool.get_cached_block(h2) is None
    assert len(pool.cached_block_hash_to_block) == 1  # block 1 still cached
    pool.check_invariants()


def test_caching_disabled_pool_never_touches_the_cache():
    pool = BlockPool(4, enable_caching=False)
    assert _ids(pool.get_new_blocks(3)) == [1, 2, 3]
    assert pool.cached_block_hash_to_block == {}


def test_pool_rejects_a_pool_without_usable_blocks():
    for bad in (1, 0, True, 4.0, "8"):
        with pytest.raises(ValueError, match=r"^num_blocks must be an integer >= 2"):
            BlockPool(bad)
    with pytest.raises(ValueError, match=r"^enable_caching must be True or False"):
        BlockPool(4, enable_caching=1)
