"""Lab 02-01 — the paged block allocator (reference solution).

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
        """Forget the content hash (the block is about to hold other tokens)."""
        self.block_hash = None

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
        """Unlink and return the head block. ValueError when the queue is empty."""
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail:
            raise ValueError("no free blocks available")
        self.remove(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """The first ``n`` blocks, in order, relinking the head once."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        out = []
        block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self.fake_free_list_head.next_free_block = block
        block.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it sits, touching only its two neighbours."""
        before, after = block.prev_free_block, block.next_free_block
        if before is None or after is None:
            raise RuntimeError(f"remove() of a block that is not in the free queue: {block}")
        before.next_free_block = after
        after.prev_free_block = before
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` in just before the tail sentinel."""
        last = self.fake_free_list_tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append each block in order."""
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail. O(n): for tests and for reading the eviction order."""
        out = []
        block = self.fake_free_list_head.next_free_block
        while block is not self.fake_free_list_tail:
            out.append(block)
            block = block.next_free_block
        return out


def hash_block_tokens(parent_block_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """SHA-256 of the parent's hash (empty for the first block) and the token ids."""
    digest = hashlib.sha256(parent_block_hash or b"")
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return digest.digest()


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
        """Any block holding this prefix (the first one cached), or None."""
        same = self.cached_block_hash_to_block.get(block_hash)
        if not same:
            return None
        return next(iter(same.values()))

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
    ) -> None:
        """Hash ``blocks[num_cached_blocks:num_full_blocks]`` from ``request.block_hashes``."""
        if len(request.block_hashes) < num_full_blocks:
            raise ValueError(
                f"request.block_hashes has {len(request.block_hashes)} entries, "
                f"num_full_blocks={num_full_blocks} needs that many"
            )
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:
                continue
            assert block.block_hash is None, f"{block} already has a hash"
            block.block_hash = request.block_hashes[i]
            self.cached_block_hash_to_block.setdefault(block.block_hash, {})[block.block_id] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` from the head of the free queue, each with ref_cnt 1."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"cannot get {num_blocks} free blocks: only {self.get_num_free_blocks()} are free"
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, f"{block} was free with references"
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block`` from the index and clear its hash; False if it had none."""
        if block.block_hash is None:
            return False
        same = self.cached_block_hash_to_block.get(block.block_hash)
        if same is not None and same.pop(block.block_id, None) is not None and not same:
            del self.cached_block_hash_to_block[block.block_hash]
        block.reset_hash()
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """One more reference each; a block at ref_cnt 0 first leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """One reference fewer each; blocks that reach 0 join the queue tail in the given order."""
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        self.free_block_queue.append_n(b for b in blocks if b.ref_cnt == 0 and not b.is_null)

    def get_num_free_blocks(self) -> int:
        """Blocks a request could be given now, evictable cached ones included."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Share of the usable blocks (all but the null block) held by requests."""
        return 1.0 - self.get_num_free_blocks() / (self.num_blocks - 1)
