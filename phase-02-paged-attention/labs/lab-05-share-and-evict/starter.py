"""Lab 02-05 — share and evict: the life of a cached block (your implementation).

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
upstream: vllm/v1/core/sched/scheduler.py:590-595 (the scheduler's cache lookup)
"""
from __future__ import annotations

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request


def prefill(kv: KVCacheManager, request: Request) -> int | None:
    """Admit ``request``'s whole prompt; the number of prompt tokens served from cache.

    Returns None, leaving everything as it was, when the pool cannot hold it.

    Recipe (the scheduler's admission move, in this order):
      1. ValueError naming ``num_computed_tokens`` unless it is 0.
      2. ``hits, num_hit_tokens = kv.get_computed_blocks(request)``.
      3. ``kv.allocate_slots(request, request.num_tokens - num_hit_tokens, hits,
         num_hit_tokens)``. Leave ``request.num_computed_tokens`` at 0 while you
         call it: allocate_slots adds the hits to it itself, so setting it first
         would count the cached tokens twice and ask for blocks you do not need.
      4. None from allocate_slots: return None (nothing was changed).
      5. Otherwise the prompt is now computed: ``request.num_computed_tokens =
         request.num_tokens``; return ``num_hit_tokens``.
    """
    raise NotImplementedError("prefill: not implemented yet")


def ref_counts(kv: KVCacheManager, request: Request) -> list[int]:
    """``ref_cnt`` of each block in the request's block table, in table order.

    Recipe: one line over ``kv.get_blocks(request.request_id)``.
    """
    raise NotImplementedError("ref_counts: not implemented yet")


def eviction_order(kv: KVCacheManager) -> list[int]:
    """Ids of the free blocks, next-to-be-evicted first.

    Recipe: one line over ``kv.block_pool.free_block_queue.get_all_free_blocks()``.
    """
    raise NotImplementedError("eviction_order: not implemented yet")
