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
upstream: vllm/v1/core/sched/scheduler.py:590-595 get_computed_blocks (the scheduler's cache lookup)
"""
from __future__ import annotations

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request


def prefill(kv: KVCacheManager, request: Request) -> int | None:
    """Admit a new request's whole prompt, sharing every cached prefix block it may use.

    Returns the number of prompt tokens served from the cache (whole blocks, never
    the last prompt token). Afterwards ``request.num_computed_tokens ==
    request.num_tokens`` and the request's block table covers the prompt, hit blocks
    first, each with one more reference. When the pool cannot hold the prompt:
    returns None and changes nothing (no reference count, block table, free queue or
    ``num_computed_tokens`` moves). Raises ValueError naming ``num_computed_tokens``
    when the request has already started (it is not 0).
    """
    raise NotImplementedError("prefill: not implemented yet")


def ref_counts(kv: KVCacheManager, request: Request) -> list[int]:
    """``ref_cnt`` of each block in the request's block table, in table order
    (logical block 0 first), which need not be block-id order. Reads only."""
    raise NotImplementedError("ref_counts: not implemented yet")


def eviction_order(kv: KVCacheManager) -> list[int]:
    """Ids of the free blocks (cached ones included), next-to-be-evicted first. Reads only."""
    raise NotImplementedError("eviction_order: not implemented yet")
