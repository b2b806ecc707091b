"""KVCacheManager: per-request block tables on top of the shared BlockPool.

The scheduler talks to KV memory only through this class, with three calls:

* ``get_computed_blocks(request)`` -- how much of a new request's prefix is
  already in the cache (the prefix-cache head start);
* ``allocate_slots(request, n, ...)`` -- make room for ``n`` more tokens, or
  say ``None`` (the scheduler then preempts or stops admitting);
* ``free(request)`` -- give the blocks back, tail first.

Blocks are cached the moment their tokens are *known* (at allocation), not
after the forward pass that writes them. So two requests with the same prompt
admitted in the same step share blocks: the second finds the first's blocks
in the cache, and the model writes them earlier in the same step than the
second request reads them (a model must write each layer's new K/V for the
whole batch before it runs attention for that layer -- vLLM does the same).

Deliberate differences from upstream:

* One KV cache group of full attention. Upstream puts a coordinator and one
  ``SingleTypeKVCacheManager`` per group (sliding window, Mamba, ...) between
  this class and the pool; here their full-attention logic is inlined, and
  blocks travel as plain lists, not ``KVCacheBlocks`` (one tuple per group).
* The block hashes of a request are computed here, lazily, when blocks are
  looked up or cached (``update_block_hashes``). Upstream's ``Request`` hashes
  each block as soon as it fills, through a ``block_hasher`` it is given; this
  class is the only one here that knows the block size.
* ``allocate_slots`` takes ``(request, num_new_tokens, new_computed_blocks,
  num_new_computed_tokens)``: the last two are in the opposite order to
  upstream's, so pass them by keyword to write code that reads the same in
  both. It has no lookahead (speculative), external (connector) or encoder
  tokens and no ``full_sequence_must_fit`` (see scheduler.py).
* Upstream clamps the slots it allocates to ``max_model_len`` because
  lookahead tokens may run past it; with none, asking for more than
  ``max_model_len`` tokens can only be a caller's mistake, so it is a
  ``ValueError`` here rather than a silent cut.

upstream: vllm/v1/core/kv_cache_manager.py:110 KVCacheManager
upstream: vllm/v1/core/single_type_kv_cache_manager.py:31 SingleTypeKVCacheManager
"""
from __future__ import annotations

from mini_vllm.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from mini_vllm.request import Request


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if max_model_len is not None and (
            isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1
        ):
            raise ValueError(f"max_model_len must be None or an integer >= 1, got {max_model_len!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are already in the cache.
        self.num_cached_block: dict[str, int] = {}

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def update_block_hashes(self, request: Request) -> None:
        """Hash every newly full block of ``request.all_token_ids`` (chained).

        upstream: vllm/v1/request.py:229 Request.update_block_hashes
        """
        hashes, bs = request.block_hashes, self.block_size
        lora = getattr(request, "lora_request", None)
        extra_keys = (lora.lora_name,) if lora is not None else None  # Phase 11: per adapter
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, request.all_token_ids[i * bs : (i + 1) * bs], extra_keys))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of ``request`` in whole blocks, and its token count.

        At most ``(num_tokens - 1) // block_size`` blocks: the last token is
        always computed again, because its logits are needed to sample the next
        token. A prompt that is entirely cached therefore still schedules at
        least one token (and, when its length is a multiple of the block size,
        recomputes a whole block).

        A request with ``prompt_logprobs`` reads nothing from the cache (it
        needs logits at every prompt position) but its blocks are still cached
        for others.

        upstream: vllm/v1/core/kv_cache_manager.py:194 KVCacheManager.get_computed_blocks
        upstream: vllm/v1/core/kv_cache_manager.py:210 skip_reading_prefix_cache
        upstream: vllm/v1/core/single_type_kv_cache_manager.py:483 FullAttentionManager.find_longest_cache_hit
        """
        if not self.enable_caching or getattr(request.sampling_params, "skip_reading_prefix_cache", False):
            return [], 0
        self.update_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Reserve slots for ``num_new_tokens`` more tokens; the new blocks, or None.

        Layout of the request after the call::

            | computed | new_computed (cache hits) | new (to compute this step) |
            |<- held ->|<- touched now ----------->|<- fresh blocks as needed ->|

        Returns None, changing nothing, when the free queue cannot cover the
        fresh blocks plus the hit blocks that sit in it (touching one takes it
        out of the queue). On success the full blocks among all the tokens
        known so far are cached at once. ``num_new_computed_tokens`` may be
        left 0: it is always ``len(new_computed_blocks) * block_size``.

        upstream: vllm/v1/core/kv_cache_manager.py:236 KVCacheManager.allocate_slots
        upstream: vllm/v1/core/single_type_kv_cache_manager.py:89 SingleTypeKVCacheManager.get_num_blocks_to_allocate
        """
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be an integer >= 1, got {num_new_tokens!r}")
        hits = new_computed_blocks or []
        num_hit_tokens = len(hits) * self.block_size
        if num_new_computed_tokens not in (0, num_hit_tokens):
            raise ValueError(
                f"num_new_computed_tokens must be len(new_computed_blocks) * block_size "
                f"= {num_hit_tokens}, got {num_new_computed_tokens}"
            )
        num_computed = request.num_computed_tokens + num_hit_tokens
        num_tokens = num_computed + num_new_tokens
        if self.max_model_len is not None and num_tokens > self.max_model_len:
            raise ValueError(
                f"num_new_tokens must be <= max_model_len - computed tokens = "
                f"{self.max_model_len} - {num_computed}, got {num_new_tokens}"
            )
        if hits and self.req_to_blocks.get(request.request_id):
            raise ValueError("new_computed_blocks: only a request that holds no blocks can take cache hits")
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_new_blocks = max(-(-num_tokens // self.block_size) - len(req_blocks) - len(hits), 0)
        num_evictable_hits = sum(1 for b in hits if b.ref_cnt == 0)
        if num_new_blocks + num_evictable_hits > self.block_pool.get_num_free_blocks():
            if not req_blocks:
                del self.req_to_blocks[request.request_id]
            return None

        if hits:
            self.block_pool.touch(hits)
            req_blocks.extend(hits)
            self.num_cached_block[request.request_id] = len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self.enable_caching:
            self.cache_blocks(request, min(num_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that ``num_tokens`` tokens fill completely.

        upstream: vllm/v1/core/single_type_kv_cache_manager.py:278 SingleTypeKVCacheManager.cache_blocks
        """
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        self.update_block_hashes(request)
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request.request_id], num_cached, num_full, self.block_size
        )
        self.num_cached_block[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks in reverse, so its tail is evicted first.

        upstream: vllm/v1/core/kv_cache_manager.py:429 KVCacheManager.free
        upstream: vllm/v1/core/single_type_kv_cache_manager.py:338 SingleTypeKVCacheManager.free
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, [])

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Leading blocks of ``request_id`` that *every* request holding KV shares.

        A block is shared by all when its ``ref_cnt`` equals the number of
        requests with blocks; counting stops at the first that is not. A request
        that holds blocks but is not scheduled this step counts too, so the
        answer can be 0 although every scheduled request shares a prefix (the
        same caveat upstream documents). Cascade attention reads this many
        blocks once for the whole batch.

        upstream: vllm/v1/core/single_type_kv_cache_manager.py:531 FullAttentionManager.get_num_common_prefix_blocks
        upstream: vllm/v1/core/kv_cache_manager.py:476 KVCacheManager.get_num_common_prefix_blocks
        """
        if request_id not in self.req_to_blocks:
            raise ValueError(f"request_id {request_id!r} holds no KV blocks (it must be running)")
        holders = len(self.req_to_blocks)
        count = 0
        for block in self.req_to_blocks[request_id]:
            if block.ref_cnt != holders:
                break
            count += 1
        return count
