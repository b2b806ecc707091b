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
        """Forget the content hash: afterwards ``block_hash is None``.

        Called when the block is evicted from the prefix cache and is about to hold
        other tokens. Touches nothing else.
        """
        raise NotImplementedError("KVCacheBlock.reset_hash: not implemented yet")

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Free blocks, head = next to be evicted, linked through the blocks themselves.

    Representation (given): two sentinels, ``fake_free_list_head`` and
    ``fake_free_list_tail``, with every queued block between them, linked both ways
    by ``prev_free_block`` / ``next_free_block``; ``num_free_blocks`` counts the
    queued blocks. Invariant after every method: a block is in the queue exactly
    when both its links are set, and a block outside the queue has both links None.
    """

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
        """Unlink and return the head block (the next eviction candidate).

        Raises ValueError when the queue is empty.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.popleft: not implemented yet")

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Unlink and return the first ``n`` blocks, head first; ``n == 0`` gives ``[]``.

        The returned blocks carry no links; the queue that is left is well formed.
        Raises ValueError when ``n`` exceeds ``num_free_blocks``.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.popleft_n: not implemented yet")

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it sits in the queue, in O(1).

        Must not walk the list: a prefix-cache hit on a free block calls this for a
        block in the middle. Afterwards both of the block's links are None and
        ``num_free_blocks`` is one lower. Raises RuntimeError for a block that is not
        in the queue.
        """
        raise NotImplementedError("FreeKVCacheBlockQueue.remove: not implemented yet")

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` in at the tail (the last to be evicted); the count grows by one."""
        raise NotImplementedError("FreeKVCacheBlockQueue.append: not implemented yet")

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append every block, keeping the given order (``blocks`` may be a generator)."""
        raise NotImplementedError("FreeKVCacheBlockQueue.append_n: not implemented yet")

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The queued blocks, head to tail, sentinels excluded. O(n), for tests and reading."""
        raise NotImplementedError("FreeKVCacheBlockQueue.get_all_free_blocks: not implemented yet")


def hash_block_tokens(parent_block_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The 32-byte SHA-256 digest that names a whole prefix ending in this block.

    Input to the hash: the parent block's digest (nothing for the first block),
    then ``token_ids`` as little-endian signed 64-bit integers. Deterministic, and
    byte-for-byte equal to ``mini_vllm.block_pool.hash_block_tokens``, because
    ``Request.block_hashes`` (which the pool indexes) are computed with that one.
    Equal tokens after different parents must hash differently.
    """
    raise NotImplementedError("hash_block_tokens: not implemented yet")


class BlockPool:
    """All blocks of the KV cache, the free queue, and the prefix-cache index.

    Given: ``blocks`` (index = block_id), ``free_block_queue`` (all blocks but the
    null block, in id order), ``null_block`` (block 0, never handed out, its
    ``ref_cnt`` not maintained) and ``cached_block_hash_to_block``
    (hash -> {block_id: block}, insertion-ordered). Invariants I1-I4 of the module
    docstring hold after every public method.
    """

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
        """The first block cached under ``block_hash`` that is still indexed, or None.

        Free cached blocks count: they can be hit until an allocation evicts them.
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
        """Give ``blocks[i]`` the hash ``request.block_hashes[i]`` and index it, for each
        ``i`` in ``[num_cached_blocks, num_full_blocks)``.

        Blocks before ``num_cached_blocks`` already carry their hash; a block in the
        range must not have one yet. The null block is skipped (never hashed, never
        indexed). A second block with an already-indexed hash is indexed next to the
        first, never merged with it (I2). Raises ValueError, before changing anything,
        when ``request.block_hashes`` has fewer than ``num_full_blocks`` entries.
        ``block_size`` is part of the upstream signature and not needed here.
        """
        raise NotImplementedError("BlockPool.cache_full_blocks: not implemented yet")

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue, in queue order.

        Each comes back with ``ref_cnt == 1`` and no hash: with caching on, a block
        that still held a cached prefix is evicted from the index on the way out
        (lazy eviction happens here and only here); with caching off, hashes are not
        looked at. Raises ValueError when fewer than ``num_blocks`` blocks are free.
        """
        raise NotImplementedError("BlockPool.get_new_blocks: not implemented yet")

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Forget ``block``'s cached prefix. Returns False if it had no hash, else True.

        Only this block leaves the index; other blocks cached under the same hash
        stay findable, and a hash with no block left disappears from the index.
        """
        raise NotImplementedError("BlockPool._maybe_evict_cached_block: not implemented yet")

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Add one reference to each block (a request starts using a cache hit).

        A block that was free (``ref_cnt == 0``) leaves the free queue, from
        wherever it sits, keeping its hash. The null block is never in the queue.
        """
        raise NotImplementedError("BlockPool.touch: not implemented yet")

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block (``ordered_blocks`` may be a generator).

        Blocks that reach 0 join the tail of the free queue in exactly the order
        given: the caller's order is the eviction order. Hashes are kept (eviction is
        lazy). The null block never joins the queue.
        """
        raise NotImplementedError("BlockPool.free_blocks: not implemented yet")

    def get_num_free_blocks(self) -> int:
        """Blocks a request could be given now, evictable cached ones included."""
        raise NotImplementedError("BlockPool.get_num_free_blocks: not implemented yet")

    def get_usage(self) -> float:
        """Share of the usable blocks (every block but the null block) held by requests:
        0.0 when all are free, 1.0 when none is."""
        raise NotImplementedError("BlockPool.get_usage: not implemented yet")
