"""Lab 02-05 — share and evict: the life of a cached block (reference solution).

Drives mini_vllm's ``KVCacheManager`` by hand, the way the scheduler admits a
waiting request, so every reference count and every eviction is yours to
predict:

* ``prefill`` — the admission move: look up the cached prefix, allocate the
  rest (hit blocks included), then mark the prompt computed.
* ``ref_counts`` — the reference count of each block in a request's table.
* ``eviction_order`` — the free queue head to tail: the order blocks would be
  evicted in if memory were needed now.

upstream: vllm/v1/core/kv_cache_manager.py:194 KVCacheManager.get_computed_blocks
upstream: vllm/v1/core/kv_cache_manager.py:236 KVCacheManager.allocate_slots
upstream: vllm/v1/core/sched/scheduler.py:590-595 get_computed_blocks (the scheduler's cache lookup)
"""
from __future__ import annotations

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request


def prefill(kv: KVCacheManager, request: Request) -> int | None:
    """Admit ``request``'s whole prompt; the number of prompt tokens served from cache.

    Returns None, leaving everything as it was, when the pool cannot hold it.
    """
    if request.num_computed_tokens != 0:
        raise ValueError(
            f"request.num_computed_tokens must be 0 for a new request, got {request.num_computed_tokens}"
        )
    hits, num_hit_tokens = kv.get_computed_blocks(request)
    new_blocks = kv.allocate_slots(request, request.num_tokens - num_hit_tokens, hits, num_hit_tokens)
    if new_blocks is None:
        return None
    request.num_computed_tokens = request.num_tokens
    return num_hit_tokens


def ref_counts(kv: KVCacheManager, request: Request) -> list[int]:
    """``ref_cnt`` of each block in the request's block table, in table order."""
    return [block.ref_cnt for block in kv.get_blocks(request.request_id)]


def eviction_order(kv: KVCacheManager) -> list[int]:
    """Ids of the free blocks, next-to-be-evicted first."""
    return [block.block_id for block in kv.block_pool.free_block_queue.get_all_free_blocks()]
