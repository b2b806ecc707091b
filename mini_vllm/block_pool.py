"""The KV block pool: fixed-size pages of KV memory, shared and reused by hash.

KV memory is cut into ``num_blocks`` blocks of ``block_size`` token slots. A
request holds a list of block ids (its block table); a block can be held by
several requests at once (``ref_cnt``) when their prompts share a prefix.

Three structures do all the work:

* ``KVCacheBlock`` -- the metadata of one block (never the KV numbers).
* ``FreeKVCacheBlockQueue`` -- every block with ``ref_cnt == 0``, in eviction
  order. A free block may still hold a valid cached prefix; it is only wiped
  when it is handed out again (lazy eviction). So a cache hit on a free block
  must pull it out of the *middle* of the queue, which is why this is a
  hand-made doubly linked list with O(1) ``remove`` and not a ``deque``.
* ``cached_block_hash_to_block`` -- block hash -> blocks holding that content.

Invariants (checked by ``BlockPool.check_invariants`` in the tests):
  I1  a block is in the free queue  <=>  ref_cnt == 0 and it is not the null block
  I2  block ids never move: a cached duplicate is not merged into an older copy,
      so block tables only ever grow (hence several blocks may share one hash)
  I3  only full blocks get a hash and enter the cache
  I4  a cached block with ref_cnt 0 is still reusable: ``touch`` revives it

Deliberate differences from upstream:

* The hash is SHA-256 over the parent's 32 bytes and the tokens as 8-byte
  integers, then the extra keys (a LoRA adapter's name) as UTF-8 strings.
  Upstream hashes a pickled ``(parent, tokens, extra_keys)`` tuple (SHA-256 by
  default) and starts the chain from a random ``NONE_HASH`` unless
  ``PYTHONHASHSEED`` is set; mini_vllm's hashes are reproducible. Of
  upstream's extra keys mini_vllm has the LoRA name only (no multimodal,
  prompt-embedding or ``cache_salt`` keys).
* One KV cache group, so a hash is the cache key as is (upstream appends a
  group id) and ``get_cached_block`` returns a block, not one per group.
* ``cached_block_hash_to_block`` is always ``{hash: {block_id: block}}``;
  upstream's ``BlockHashToBlockMap`` stores a lone block without the inner
  dict to spare the garbage collector. Same lookups, same eviction.
* ``KVCacheBlock.block_hash`` is a plain field (``cache_full_blocks`` asserts
  it was unset, where upstream's property setter does), and
  ``popleft_n`` / ``append_n`` reuse ``popleft`` / ``append`` where upstream
  relinks the chain in one pass: the same queue either way.
* No KV-cache events, residency metrics, ``evict_blocks`` or
  ``reset_prefix_cache``; and ``num_blocks`` must be at least 2 (upstream
  accepts a pool holding only the null block).

upstream: vllm/v1/core/kv_cache_utils.py:116 KVCacheBlock
upstream: vllm/v1/core/kv_cache_utils.py:164 FreeKVCacheBlockQueue
upstream: vllm/v1/core/block_pool.py:34 BlockHashToBlockMap
upstream: vllm/v1/core/block_pool.py:130 BlockPool
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_vllm.request import Request

BlockHash = bytes


def hash_block_tokens(parent_block_hash: BlockHash | None, token_ids: Sequence[int],
                      extra_keys: tuple[str, ...] | None = None) -> BlockHash:
    """SHA-256 of (parent hash, this block's tokens, extra keys).

    Chaining the parent in makes a hash name a whole *prefix*: two blocks with
    the same tokens after different prefixes get different hashes, because
    their K/V differ (attention saw different context). SHA-256, like
    upstream's default, makes an accidental collision (which would silently
    serve another prompt's KV) practically impossible.

    ``extra_keys`` is what else decides the block's K/V besides its tokens:
    the name of the LoRA adapter the request runs with, since an adapter on
    q/k/v changes every cached K and V. None or () leaves the hash as it was.

    upstream: vllm/v1/core/kv_cache_utils.py:541 hash_block_tokens
    upstream: vllm/v1/core/kv_cache_utils.py:462 _gen_lora_extra_hash_keys
    """
    h = hashlib.sha256(parent_block_hash or b"")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    for key in extra_keys or ():
        encoded = key.encode("utf-8")
        h.update(struct.pack("<q", len(encoded)) + encoded)  # length first: keys cannot run together
    return h.digest()


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One block's metadata. Equality is identity (blocks are unique objects)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set only while the block is full and cached
    is_null: bool = False
    # Links of the free list; only FreeKVCacheBlockQueue touches them.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None

    def reset_hash(self) -> None:
        self.block_hash = None

    def __repr__(self) -> str:  # ids only: printing the links would recurse
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hashed={self.block_hash is not None})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: the head is evicted first.

    Doubly linked through the blocks' own ``prev_free_block`` /
    ``next_free_block`` fields, between two sentinel blocks, so that no
    operation allocates and ``remove`` from the middle is O(1). The order starts
    as block-id order; freed blocks go to the tail. ``KVCacheManager.free``
    hands a request's blocks over tail-first, so a chain's last blocks (least
    likely to be shared) are evicted before its shared prefix.

    upstream: vllm/v1/core/kv_cache_utils.py:164 FreeKVCacheBlockQueue
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = 0
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        """upstream: vllm/v1/core/kv_cache_utils.py:216 FreeKVCacheBlockQueue.popleft"""
        block = self.fake_free_list_head.next_free_block
        if block is self.fake_free_list_tail:
            raise ValueError("no free blocks available")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """upstream: vllm/v1/core/kv_cache_utils.py:253 FreeKVCacheBlockQueue.popleft_n"""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks, only {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` wherever it is: O(1).

        upstream: vllm/v1/core/kv_cache_utils.py:286 FreeKVCacheBlockQueue.remove
        """
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() of a block that is not in the free queue: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """upstream: vllm/v1/core/kv_cache_utils.py:306 FreeKVCacheBlockQueue.append"""
        last = self.fake_free_list_tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """upstream: vllm/v1/core/kv_cache_utils.py:329 FreeKVCacheBlockQueue.append_n"""
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail (eviction order). O(n): for tests and teaching only."""
        out = []
        block = self.fake_free_list_head.next_free_block
        while block is not self.fake_free_list_tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockPool:
    """Allocates, frees and caches blocks. Block 0 is the null block.

    The null block is a placeholder id that is never handed out and never
    freed (vLLM pads block tables with it); so a pool of ``num_blocks`` blocks
    has ``num_blocks - 1`` usable ones.

    ``cached_block_hash_to_block`` maps a hash to ``{block_id: block}``: usually
    one block, more when two requests filled identical blocks independently
    (I2: those are not merged).

    upstream: vllm/v1/core/block_pool.py:130 BlockPool
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_blocks must be an integer >= 2 (block 0 is the null block), got {num_blocks!r}")
        if not isinstance(enable_caching, bool):
            raise ValueError(f"enable_caching must be True or False, got {enable_caching!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """upstream: vllm/v1/core/block_pool.py:184 BlockPool.get_cached_block"""
        blocks = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
    ) -> None:
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes and cache them.

        The hashes come from ``request.block_hashes`` (one per full block of the
        request's tokens). ``block_size`` is kept for upstream's signature.

        upstream: vllm/v1/core/block_pool.py:211 BlockPool.cache_full_blocks
        """
        assert len(request.block_hashes) >= num_full_blocks, "block hashes not computed"
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            assert block.block_hash is None, f"{block} is already cached"
            block.block_hash = request.block_hashes[i]
            self.cached_block_hash_to_block.setdefault(block.block_hash, {})[block.block_id] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cached hashes.

        upstream: vllm/v1/core/block_pool.py:333 BlockPool.get_new_blocks
        """
        free = self.free_block_queue.num_free_blocks
        if num_blocks > free:
            raise ValueError(f"asked for {num_blocks} blocks but only {free} are free")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """upstream: vllm/v1/core/block_pool.py:365 BlockPool._maybe_evict_cached_block"""
        if block.block_hash is None:
            return False
        same_hash = self.cached_block_hash_to_block[block.block_hash]
        del same_hash[block.block_id]
        if not same_hash:
            del self.cached_block_hash_to_block[block.block_hash]
        block.reset_hash()
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take one more reference; a free (ref_cnt 0) block leaves the free queue.

        upstream: vllm/v1/core/block_pool.py:402 BlockPool.touch
        """
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 go to the free queue's tail.

        ``ordered_blocks`` is in eviction order: the first is evicted first.
        upstream: vllm/v1/core/block_pool.py:419 BlockPool.free_blocks
        """
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        self.free_block_queue.append_n(b for b in blocks if b.ref_cnt == 0 and not b.is_null)

    def get_num_free_blocks(self) -> int:
        """Free blocks, counting cached ones nobody holds (they are evictable).

        upstream: vllm/v1/core/block_pool.py:489 BlockPool.get_num_free_blocks
        """
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks held by requests (the null block excluded).

        upstream: vllm/v1/core/block_pool.py:497 BlockPool.get_usage
        """
        return 1.0 - self.get_num_free_blocks() / (self.num_blocks - 1)

    def check_invariants(self) -> None:
        """Assert I1-I3 over the whole pool. O(num_blocks): for tests."""
        free = self.free_block_queue.get_all_free_blocks()
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free) == self.free_block_queue.num_free_blocks
        assert self.null_block.block_id not in free_ids and self.null_block.block_hash is None
        for block in self.blocks[1:]:
            assert block.ref_cnt >= 0, block
            assert (block.block_id in free_ids) == (block.ref_cnt == 0), f"I1 broken: {block}"
            if block.block_hash is not None:
                assert self.cached_block_hash_to_block[block.block_hash][block.block_id] is block
        for block_hash, same in self.cached_block_hash_to_block.items():
            assert same, "empty hash entry left behind"
            for block in same.values():
                assert block.block_hash == block_hash
