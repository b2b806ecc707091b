"""Lab 11-04 — Adapter slots, two LRU levels and the max_loras skip (your implementation).

A LoRA server keeps a fixed number of GPU *slots* (``max_loras``): stacked
weight buffers allocated once at startup, so the batched LoRA kernels and CUDA
graphs always see the same shapes. Behind the slots sits a larger CPU cache of
loaded adapters (``max_cpu_loras``), and behind that the disk. Three pieces of
vLLM decide which adapters sit where and which requests may run:

* the two LRU caches of ``LRUCacheLoRAModelManager`` and the worker's
  ``add_adapter``, which run on every adapter every step: the CPU level is
  touched (or the adapter is loaded from disk, evicting the least recently
  used CPU adapter when full, which also frees its slot if it had one), then
  the GPU level is touched (or the least recently used active adapter is
  evicted and the newcomer copied into the **first free slot index**);
* the scheduler's walk over the waiting queue, which admits a request whose
  adapter is not yet in this step's set only while the set has room; when it
  is full such a request is *skipped* (it stays waiting, in order) and the
  walk goes on, so base requests and requests of adapters already in the set
  still get in behind it;
* the prefix-cache key, which mixes the adapter's *name* into every block
  hash, so the same prompt under two adapters never shares KV blocks.

``AdapterSlotCache`` replays the first piece decision for decision,
``schedule_waiting`` the second, ``block_extra_keys`` the third.

upstream: vllm/lora/model_manager.py:285 activate_adapter
upstream: vllm/lora/model_manager.py:1208 activate_adapter
upstream: vllm/lora/worker_manager.py:273 add_adapter
upstream: vllm/v1/core/sched/scheduler.py:577 scheduled_loras
upstream: vllm/v1/core/kv_cache_utils.py:462 _gen_lora_extra_hash_keys
"""
from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

HIT = "hit"                # already in a slot: nothing copied, recency refreshed
LOAD = "load"              # copied into a slot that was free
EVICT_LOAD = "evict+load"  # another adapter lost its slot so this one could be copied in
EVENTS = (HIT, LOAD, EVICT_LOAD)

# The root of every block-hash chain (upstream draws it at startup: NONE_HASH).
NONE_HASH = hashlib.sha256(b"lab-11-04 root block").digest()


# ---------------------------------------------------------------- given helpers


def _check_int(value, name: str, lo: int) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= lo."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _check_lora_id(value, name: str) -> int | None:
    """Given. None (a base request) or an adapter id, an integer >= 1.

    upstream: vllm/lora/request.py:40 lora_int_id
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: an adapter id must be an integer >= 1 (None for a base "
                         f"request), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class LoRARequest:
    """Given. The three fields of upstream's ``LoRARequest`` that this lab reads.

    ``lora_name`` names the adapter (it is what the prefix cache keys on);
    ``lora_int_id`` is the integer the slot manager and the scheduler key on.
    Upstream refuses ids below 1; so does this class (ValueError naming
    ``lora_int_id``).

    upstream: vllm/lora/request.py:8 LoRARequest
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self):
        _check_lora_id(self.lora_int_id, "lora_int_id")
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")


def skewed_trace(num_requests: int, num_adapters: int = 16, hot_fraction: float = 0.2,
                 hot_share: float = 0.8, seed: int = 0) -> list[int]:
    """Given. A seeded stream of adapter ids with "80/20" popularity.

    The hot set is adapters ``1 .. n_hot`` with ``n_hot = max(1,
    round(hot_fraction * num_adapters))`` (3 of 16 by default). Each request
    picks the hot set with probability ``hot_share`` and then an adapter
    uniformly inside the chosen set.
    """
    num_requests = _check_int(num_requests, "num_requests", 1)
    num_adapters = _check_int(num_adapters, "num_adapters", 2)
    n_hot = max(1, min(num_adapters - 1, round(hot_fraction * num_adapters)))
    rng = np.random.default_rng(seed)
    is_hot = rng.random(num_requests) < hot_share
    hot = rng.integers(1, n_hot + 1, num_requests)
    cold = rng.integers(n_hot + 1, num_adapters + 1, num_requests)
    return [int(x) for x in np.where(is_hot, hot, cold)]


def hash_blocks(token_ids, block_size: int, extra_keys: tuple | None = None) -> list[bytes]:
    """Given. Prefix-cache hashes of the full blocks of ``token_ids``.

    Block ``i`` hashes ``(parent hash, its tokens, extra_keys)``, so a block's
    hash depends on everything before it and on the extra keys; a trailing
    partial block gets no hash. Upstream hashes the same triple (sha256 over
    a serialization of it).

    upstream: vllm/v1/core/kv_cache_utils.py:541 hash_block_tokens
    """
    block_size = _check_int(block_size, "block_size", 1)
    tokens = [int(t) for t in token_ids]
    hashes: list[bytes] = []
    parent = NONE_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tuple(tokens[start:start + block_size])
        parent = hashlib.sha256(pickle.dumps((parent, block, extra_keys), protocol=5)).digest()
        hashes.append(parent)
    return hashes


# ---------------------------------------------------------------- the slot cache


class AdapterSlotCache:
    """GPU slots and the CPU adapter cache, as vLLM's LRU managers keep them.

    ``num_slots`` is ``max_loras`` (slots on the GPU); ``max_cpu_loras`` is
    how many adapters stay loaded in CPU memory (None means ``num_slots``,
    upstream's default; fewer than ``num_slots`` is a ValueError naming
    ``max_cpu_loras``). Both are LRU caches; every slotted adapter is also
    CPU-resident.

    Given (complete): the constructor and the read-only views ``slots``,
    ``active``, ``registered``; ``stats`` counts the events and disk loads.
    Yours: ``activate`` and ``activate_batch``.

    upstream: vllm/lora/model_manager.py:1163 LRUCacheLoRAModelManager
    upstream: vllm/config/lora.py:43 max_cpu_loras
    """

    def __init__(self, num_slots: int, max_cpu_loras: int | None = None):
        self.num_slots = _check_int(num_slots, "num_slots", 1)
        if max_cpu_loras is None:
            max_cpu_loras = self.num_slots
        self.max_cpu_loras = _check_int(max_cpu_loras, "max_cpu_loras", 1)
        if self.max_cpu_loras < self.num_slots:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= "
                             f"num_slots ({self.num_slots})")
        # slot index -> adapter id or None (upstream: lora_index_to_id)
        self._slots: list[int | None] = [None] * self.num_slots
        # the two LRU orders, least recently used first (the values are unused)
        self._active: OrderedDict[int, None] = OrderedDict()
        self._registered: OrderedDict[int, None] = OrderedDict()
        self.stats = {HIT: 0, LOAD: 0, EVICT_LOAD: 0, "disk_load": 0}

    @property
    def slots(self) -> list[int | None]:
        """A copy of the slot table: ``slots[i]`` is the adapter id in slot ``i`` or None."""
        return list(self._slots)

    @property
    def active(self) -> tuple[int, ...]:
        """The slotted adapter ids, least recently used first."""
        return tuple(self._active)

    @property
    def registered(self) -> tuple[int, ...]:
        """The CPU-resident adapter ids, least recently used first."""
        return tuple(self._registered)

    def activate(self, lora_id: int) -> tuple[str, int]:
        """Make adapter ``lora_id`` resident in a slot; return ``(event, slot_index)``.

        The two levels, in upstream's order (the worker's ``add_adapter``,
        then the manager's ``activate_adapter``):

        1. CPU: a registered adapter is touched (moved to most recent). An
           unregistered one is loaded from disk (``stats["disk_load"] += 1``);
           if that would exceed ``max_cpu_loras``, the least recently used
           registered adapter is removed first, and if it held a slot, that
           slot is freed.
        2. GPU: an adapter already in a slot is touched: event ``"hit"``.
           Otherwise, if every slot is taken, the least recently used active
           adapter is removed and its slot freed; the newcomer goes into the
           **lowest free slot index** and becomes most recent.

        ``event`` is ``"hit"`` when the adapter was already slotted,
        ``"evict+load"`` when some other adapter lost its slot during this
        call (at either level), ``"load"`` otherwise. ``stats[event]`` is
        incremented. ``slot_index`` is where the adapter now sits.

        Raises ValueError naming ``lora_id`` unless it is an integer >= 1.

        upstream: vllm/lora/worker_manager.py:273 add_adapter
        upstream: vllm/lora/model_manager.py:1208 activate_adapter
        """
        raise NotImplementedError("activate: CPU level first (touch, or drop the oldest registered, "
                                  "freeing its slot, and load); then GPU level (touch = hit, or "
                                  "evict the oldest active and take slots.index(None))")

    def _deactivate(self, lora_id: int) -> None:
        """Given. Take ``lora_id`` out of its slot (upstream: ``_deactivate_adapter``).

        upstream: vllm/lora/model_manager.py:326 _deactivate_adapter
        """
        del self._active[lora_id]
        self._slots[self._slots.index(lora_id)] = None

    def activate_batch(self, lora_ids) -> dict[int, tuple[str, int]]:
        """One step's adapters: check they fit, then ``activate`` each.

        lora_ids: the adapter id of every request in the batch, None for base
        requests (repeats allowed). The distinct non-None ids, in order of
        first appearance, are activated one by one. Returns ``{lora_id:
        (event, slot_index)}`` in that order.

        Raises RuntimeError, before touching any state, when there are more
        distinct ids than ``num_slots`` (upstream raises the same: the
        scheduler is supposed to make this impossible). Raises ValueError
        naming ``lora_ids`` for an id that is not None or an integer >= 1.

        upstream: vllm/lora/worker_manager.py:258 _apply_adapters
        """
        raise NotImplementedError("activate_batch: distinct non-None ids in order of first "
                                  "appearance; RuntimeError if more than num_slots; then activate each")


def run_trace(trace, num_slots: int, max_cpu_loras: int | None = None) -> AdapterSlotCache:
    """Given. A fresh cache that has activated every id of ``trace`` in order."""
    cache = AdapterSlotCache(num_slots, max_cpu_loras)
    for lora_id in trace:
        cache.activate(lora_id)
    return cache


# ---------------------------------------------------------------- the scheduler rule


def schedule_waiting(waiting, running_lora_ids, max_loras: int, max_new: int | None = None):
    """The waiting-queue walk of one scheduler step, reduced to the LoRA rule.

    waiting: ``(request_id, lora_id)`` pairs in queue order; ``lora_id`` is
    None for a base request. running_lora_ids: the adapter id (or None) of
    every running request scheduled this step. max_loras: the most distinct
    adapters one step may run. max_new: how many more requests the running
    batch can take (``max_num_seqs`` minus the running ones), None for no
    limit.

    The step's adapter set starts as the running requests' distinct ids
    (base requests never count). Then, in queue order:

    * once ``max_new`` requests have been admitted, the walk stops: every
      later request stays waiting (a barrier);
    * a request with an adapter that is not in the set while the set holds
      ``max_loras`` ids is skipped: it stays waiting, and the walk goes on;
    * anything else is admitted, and its adapter (if any) joins the set.

    Returns ``(admitted, still_waiting, scheduled_loras)``: the admitted
    request ids in queue order, the others in queue order, and the final
    adapter set.

    Raises ValueError naming ``max_loras`` (not an integer >= 1), ``max_new``
    (not None or an integer >= 0), ``waiting`` or ``running_lora_ids`` (an id
    that is not None or an integer >= 1), and ``running_lora_ids`` when the
    running requests alone hold more than ``max_loras`` adapters.

    upstream: vllm/v1/core/sched/scheduler.py:535 scheduled_loras
    upstream: vllm/v1/core/sched/scheduler.py:577 scheduled_loras
    """
    raise NotImplementedError("schedule_waiting: the set starts as the running ids (no None); walk "
                              "the queue: stop at max_new, skip a new adapter when the set is "
                              "full, else admit")


# ---------------------------------------------------------------- the prefix-cache key


def block_extra_keys(lora_request) -> tuple | None:
    """What a request's adapter adds to each of its prefix-cache block hashes.

    lora_request: None for a base request, or an object with a
    ``lora_name`` string (a ``LoRARequest``). Returns None for a base
    request (upstream: no extra keys, so ``extra_keys`` is None) and
    ``(lora_name,)`` for an adapter: the **name**, never ``lora_int_id``.

    Raises ValueError naming ``lora_request`` when it is not None and has no
    non-empty string ``lora_name``.

    upstream: vllm/v1/core/kv_cache_utils.py:462 _gen_lora_extra_hash_keys
    upstream: vllm/v1/core/kv_cache_utils.py:503 generate_block_hash_extra_keys
    """
    raise NotImplementedError("block_extra_keys: None for a base request, else a 1-tuple holding "
                              "the adapter's name (not its int id)")


# ---------------------------------------------------------------- demo


def main() -> None:
    trace = skewed_trace(2000)
    print("80/20 traffic: 2,000 requests over 16 adapters (3 hot), max_cpu_loras = 16")
    print(f"{'slots':>5} {'hits':>5} {'hit rate':>8} {'load':>5} {'evict+load':>10} "
          f"{'disk loads':>10}")
    for num_slots in (1, 2, 4, 8):
        c = run_trace(trace, num_slots, max_cpu_loras=16)
        print(f"{num_slots:>5} {c.stats[HIT]:>5} {c.stats[HIT] / len(trace):>8.1%} "
              f"{c.stats[LOAD]:>5} {c.stats[EVICT_LOAD]:>10} {c.stats['disk_load']:>10}")
    cyclic = [1, 2, 3, 4, 5] * 40
    c = run_trace(cyclic, 4)
    print(f"cyclic 1..5 on 4 slots: {c.stats[HIT]} hits in {len(cyclic)} (LRU thrashes)")


if __name__ == "__main__":
    main()
