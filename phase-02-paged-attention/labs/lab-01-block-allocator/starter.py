"""Lab 02-01 — the paged block allocator (your implementation).

Same public API as ``mini_vllm/block_pool.py``, so a finished copy of this file
is a drop-in replacement for it (the tests plug it under mini_vllm's
``KVCacheManager`` to prove that).

* ``KVCacheBlock`` — metadata of one physical block: id, reference count, hash
  (only while full and cached), and two free-list links it never touches itself.
* ``FreeKVCacheBlockQueue`` — every block nobody holds, in eviction order, as a
  doubly linked list threaded through the blocks, between two sentinels.
  ``remove`` from the middle is O(1): that is what a prefix-cache hit on a free
  block needs, and what ``collections.deque`` cannot do.
* ``hash_block_tokens`` — SHA-256 over (parent hash, tokens): a hash names a
  whole prefix, not one block's tokens.
* ``BlockPool`` — owns the blocks, the queue and the hash -> blocks index.
  Block 0 is the null block and is never handed out.

Invariants the tests pin:
  I1  a block is in the free queue  <=>  ref_cnt == 0 and it is not the null block
  I2  block ids never change under a request: equal content is not merged
  I3  only full blocks carry a hash and sit in the index
  I4  a cached block with ref_cnt 0 can still be hit; ``touch`` revives it

upstream: vllm/v1/core/kv_cache_utils.py:116 KVCacheBlock
upstream: vllm/v1/core/kv_cache_utils.py:164 FreeKVCacheBlockQueue
upstream: vllm/v1/core/kv_cache_utils.py:541 hash_block_tokens
upstream: vllm/v1/core/block_pool.py:130 BlockPool
"""
from __future__ import annotations

import hashlib  # noqa: F401  (hash_block_tokens needs it)
import struct  # noqa: F401  (hash_block_tokens needs it)
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

BlockHash = bytes


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One block's metadata (the K/V numbers live in a tensor indexed by block_id)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    is_null: bool = False
    # Free-list links: owned by FreeKVCacheBlockQueue, nobody else writes them.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None

    def reset_hash(self) -> None:
        """Forget the content hash (the block is about to hold other tokens).

        Recipe: one line. Called when the block is evicted from the prefix cache.
        """
        raise NotImplementedError("KVCacheBlock.reset_hash: not implemented yet")

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Free blocks, head = next to be evicted, linked through the blocks themselves."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev
        self.num_free_blocks = len(blocks)

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the head block. ValueError when the queue is empty.

        Recipe: the head is ``self.fake_free_list_head.next_free_block``; if that is
        the tail sentinel the queue is empty: raise ValueError. Otherwise
        ``self.remove(first)`` and return it.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.popleft: not implemented yet")

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """The first ``n`` blocks, in order, relinking the head once.

        Recipe: ValueError if ``n > self.num_free_blocks``. Walk ``n`` blocks from the
        head, collecting them and clearing both links of each; then point the head
        sentinel at the block after the last one taken (and that block back at the
        head). Subtract ``n`` from ``num_free_blocks``. ``n == 0`` returns ``[]``.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.popleft_n: not implemented yet")

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it sits, touching only its two neighbours.

        Recipe (the reason this class exists; O(1), no walking):
          1. ``before, after = block.prev_free_block, block.next_free_block``; if either
             is None the block is not in the queue: raise RuntimeError.
          2. Link ``before`` and ``after`` to each other; set both of the block's links
             to None; ``num_free_blocks -= 1``.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.remove: not implemented yet")

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` in just before the tail sentinel.

        Recipe: the current last block is ``self.fake_free_list_tail.prev_free_block``
        (the head sentinel when empty: no special case needed). Link the block
        between it and the tail sentinel; ``num_free_blocks += 1``.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.append: not implemented yet")

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append each block in order.

        Recipe: ``append`` each block, in the order given (it may be a generator).
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.append_n: not implemented yet")

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail. O(n): for tests and for reading the eviction order.

        Recipe: start at the head sentinel's next block and follow ``next_free_block``
        until you reach the tail sentinel.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.get_all_free_blocks: not implemented yet")


def hash_block_tokens(parent_block_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """SHA-256 of the parent's hash (empty for the first block) and the token ids.

    Recipe:
      1. ``digest = hashlib.sha256(parent_block_hash or b"")``.
      2. Feed it the token ids as bytes: ``struct.pack(f"<{len(token_ids)}q", *token_ids)``.
      3. Return ``digest.digest()`` (32 bytes). Why the parent: the same four
         tokens after a different prefix have different K/V, so they must not hit.
    """
    raise NotImplementedError("hash_block_tokens: not implemented yet")


class BlockPool:
    """All blocks of the KV cache, the free queue, and the prefix-cache index."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(
                f"num_blocks must be an integer >= 2 (block 0 is the null block), got {num_blocks!r}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # hash -> {block_id: block}: usually one entry, more when equal content
        # was computed twice (I2 forbids merging the copies).
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """Any block holding this prefix (the first one cached), or None.

        Recipe: look the hash up in ``self.cached_block_hash_to_block``; missing or
        empty -> None; else the first block of the inner dict (insertion order).
        """
        raise NotImplementedError("BlockPool.get_cached_block: not implemented yet")

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
    ) -> None:
        """Hash ``blocks[num_cached_blocks:num_full_blocks]`` from ``request.block_hashes``.

        Recipe:
          1. ValueError if ``len(request.block_hashes) < num_full_blocks``.
          2. For ``i`` in ``range(num_cached_blocks, num_full_blocks)``: skip the null
             block; the block must have no hash yet (assert it: I3 and I2 say a hash is
             set once, when the block fills); set ``block.block_hash =
             request.block_hashes[i]`` and add it to the index:
             ``self.cached_block_hash_to_block.setdefault(h, {})[block.block_id] = block``.
        """
        raise NotImplementedError("BlockPool.cache_full_blocks: not implemented yet")

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` from the head of the free queue, each with ref_cnt 1.

        Recipe:
          1. ValueError if ``num_blocks > self.get_num_free_blocks()``.
          2. ``self.free_block_queue.popleft_n(num_blocks)``.
          3. For each block: with caching on, ``self._maybe_evict_cached_block(block)``
             (lazy eviction happens here, and only here); assert ``ref_cnt == 0``
             (I1); set ``ref_cnt = 1``. Return the list.
        """
        raise NotImplementedError("BlockPool.get_new_blocks: not implemented yet")

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block`` from the index and clear its hash; False if it had none.

        Recipe: no hash -> return False. Otherwise remove ``block.block_id`` from the
        inner dict of its hash (delete the hash's entry when the dict empties),
        ``block.reset_hash()`` and return True.
        """
        raise NotImplementedError("BlockPool._maybe_evict_cached_block: not implemented yet")

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """One more reference each; a block at ref_cnt 0 first leaves the free queue.

        Recipe: for each block, if ``ref_cnt == 0`` and it is not the null block it is
        sitting in the free queue as an eviction candidate: ``remove`` it (O(1),
        from the middle). Then ``ref_cnt += 1``.
        """
        raise NotImplementedError("BlockPool.touch: not implemented yet")

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """One reference fewer each; blocks that reach 0 join the queue tail in the given order.

        Recipe: materialise the iterable (``list(...)``), decrement every ``ref_cnt``,
        then ``append_n`` the blocks that reached 0 (not the null block), keeping the
        given order: the caller's order IS the eviction order.
        """
        raise NotImplementedError("BlockPool.free_blocks: not implemented yet")

    def get_num_free_blocks(self) -> int:
        """Blocks a request could be given now, evictable cached ones included.

        Recipe: the queue already counts them.
        """
        raise NotImplementedError("BlockPool.get_num_free_blocks: not implemented yet")

    def get_usage(self) -> float:
        """Share of the usable blocks (all but the null block) held by requests.

        Recipe: ``1 - free / (num_blocks - 1)``: the null block is never usable.
        """
        raise NotImplementedError("BlockPool.get_usage: not implemented yet")
