"""Adapter slots and their two LRU caches.

An engine with ``enable_lora=True`` keeps adapters at two levels, as vLLM does:

* registered: loaded from disk and held in CPU memory, at most
  ``max_cpu_loras`` of them (``_registered_adapters``);
* active: copied into one of the ``max_loras`` slots of every wrapped layer's
  stacked weights (``lora_index_to_id[slot]`` names the adapter id there).

Both are LRU caches. Activating an adapter that is not active takes the
*first free* slot; when none is free the least recently used active adapter
is deactivated first, which frees its slot. Activating one that is active
only refreshes its recency. Evicting a registered adapter deactivates it too.
The scheduler guarantees a step never needs more than ``max_loras`` distinct
adapters, so ``set_active_adapters`` can always seat a whole batch.

One deliberate difference: ``set_active_adapters`` first refreshes the batch's
adapters that are already active, then activates the others in batch order.
Upstream walks a set, in hash order, so a batch could evict one of its own
adapters and load it again; the slots it ends with can differ, the outputs
cannot.

upstream: vllm/lora/model_manager.py:64 LoRAModelManager
upstream: vllm/lora/model_manager.py:285 activate_adapter
upstream: vllm/lora/model_manager.py:1163 LRUCacheLoRAModelManager
upstream: vllm/lora/model_manager.py:1208 activate_adapter
upstream: vllm/lora/worker_manager.py:258 _apply_adapters
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from mini_vllm.lora.layers import LinearWithLoRA
from mini_vllm.lora.lora_model import PACKED_MODULES, LoRAModel
from mini_vllm.lora.punica import PunicaWrapperNumpy
from mini_vllm.lora.request import LoRARequest

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # upstream: vllm/config/lora.py:26 MaxLoRARanks


class AdapterLRUCache:
    """An ordered dict with a capacity; ``on_remove(key)`` runs for every key that leaves it."""

    def __init__(self, capacity: int, on_remove: Callable[[int], object]) -> None:
        self.capacity = capacity
        self.on_remove = on_remove
        self.cache: OrderedDict[int, object] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.cache

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, key: int):
        return self.cache[key]

    def __setitem__(self, key: int, value) -> None:
        self.cache[key] = value
        self.cache.move_to_end(key)
        while len(self.cache) > self.capacity:
            self.remove_oldest()

    def touch(self, key: int) -> None:
        self.cache.move_to_end(key)

    def remove_oldest(self) -> int:
        key, _ = self.cache.popitem(last=False)
        self.on_remove(key)
        return key

    def pop(self, key: int) -> None:
        if key in self.cache:
            del self.cache[key]
            self.on_remove(key)


class LRUCacheLoRAModelManager:
    """Wraps a numpy transformer's linear layers and manages which adapter sits in which slot."""

    def __init__(self, model, max_loras: int = 1, max_lora_rank: int = 16, max_cpu_loras: int | None = None,
                 loader: Callable[[LoRARequest], LoRAModel] | None = None) -> None:
        self.model = model
        self.lora_slots = max_loras
        self.max_lora_rank = max_lora_rank
        self.capacity = max_loras if max_cpu_loras is None else max_cpu_loras
        self.loader = loader
        self.lora_index_to_id: list[int | None] = [None] * max_loras
        self.punica_wrapper = PunicaWrapperNumpy(max_loras)
        self.modules: dict[str, LinearWithLoRA] = {}
        c = model.config
        slices = {"qkv_proj": (c.q_size, c.kv_size, c.kv_size), "o_proj": (c.hidden_size,),
                  "gate_up_proj": (c.intermediate_size, c.intermediate_size), "down_proj": (c.hidden_size,)}
        for i, lin in enumerate(model.linears):
            for name, out_slices in slices.items():
                wrapped = LinearWithLoRA(getattr(lin, name), out_slices, max_loras, max_lora_rank,
                                         self.punica_wrapper)
                setattr(lin, name, wrapped)
                self.modules[f"{i}.{name}"] = wrapped
        self._registered_adapters = AdapterLRUCache(self.capacity, self.deactivate_adapter)
        self._active_adapters = AdapterLRUCache(self.lora_slots, self._deactivate_adapter)

    def set_punica_wrapper(self, wrapper) -> None:
        """Use another batched-LoRA implementation in every wrapped layer (Phase 11, lab 05).

        ``wrapper`` needs ``update_metadata(token_lora_indices)``, a ``no_lora`` attribute
        (True when no row has an adapter) and ``add_lora_linear(y, x, lora_a_stacked,
        lora_b_stacked, scale, output_slices)`` adding into ``y`` in place.
        """
        missing = [a for a in ("update_metadata", "no_lora", "add_lora_linear") if not hasattr(wrapper, a)]
        if missing:
            raise ValueError(f"wrapper must have update_metadata, no_lora and add_lora_linear; "
                             f"{type(wrapper).__name__} lacks {', '.join(missing)}")
        self.punica_wrapper = wrapper
        for module in self.modules.values():
            module.punica_wrapper = wrapper

    # -- the two caches ------------------------------------------------------
    def list_adapters(self) -> dict[int, LoRAModel]:
        return dict(self._registered_adapters.cache)

    def add_adapter(self, lora: LoRAModel) -> bool:
        """Register an adapter (evicting the least recently used one if full); False if it was there."""
        if lora.id in self._registered_adapters:
            self._registered_adapters.touch(lora.id)
            return False
        self._registered_adapters[lora.id] = lora
        return True

    def activate_adapter(self, lora_id: int) -> bool:
        """Seat a registered adapter in a slot; False when it already had one (its recency is refreshed)."""
        if lora_id not in self._active_adapters and len(self._active_adapters) >= self.lora_slots:
            self._active_adapters.remove_oldest()
        result = self._activate(lora_id)
        self._active_adapters.touch(lora_id)
        return result

    def _activate(self, lora_id: int) -> bool:
        if lora_id in self._active_adapters:
            return False
        index = next((i for i, held in enumerate(self.lora_index_to_id) if held is None), None)
        if index is None:
            raise ValueError("No free lora slots")
        self._active_adapters[lora_id] = None
        lora = self._registered_adapters[lora_id]
        self.lora_index_to_id[index] = lora.id
        for key, module in self.modules.items():
            layer, name = key.split(".")
            pairs = lora.packed(int(layer), name)
            if all(p is None for p in pairs):
                module.reset_lora(index)
                continue
            module.set_lora(index, [p.lora_a if p else None for p in pairs],
                            [p.lora_b if p else None for p in pairs])
        return True

    def _deactivate_adapter(self, lora_id: int) -> None:
        if lora_id in self.lora_index_to_id:
            self.lora_index_to_id[self.lora_index_to_id.index(lora_id)] = None

    def deactivate_adapter(self, lora_id: int) -> bool:
        """Take an adapter out of its slot (it stays registered)."""
        if lora_id not in self._active_adapters:
            return False
        self._active_adapters.pop(lora_id)
        return True

    def remove_adapter(self, lora_id: int) -> bool:
        """Forget an adapter at both levels."""
        self.deactivate_adapter(lora_id)
        if lora_id not in self._registered_adapters:
            return False
        del self._registered_adapters.cache[lora_id]
        return True

    # -- one step ------------------------------------------------------------
    def ensure_registered(self, request: LoRARequest) -> LoRAModel:
        if request.lora_int_id in self._registered_adapters:
            self._registered_adapters.touch(request.lora_int_id)
            return self._registered_adapters[request.lora_int_id]
        lora = self.loader(request)
        self.add_adapter(lora)
        return lora

    def set_active_adapters(self, lora_requests: Sequence[LoRARequest | None]) -> np.ndarray:
        """Seat every adapter of a batch; return each request's slot (-1: none).

        upstream: vllm/lora/worker_manager.py:258 _apply_adapters
        """
        wanted: dict[int, LoRARequest] = {}
        for r in lora_requests:
            if r is not None:
                wanted.setdefault(r.lora_int_id, r)
        if len(wanted) > self.lora_slots:
            raise RuntimeError(f"Number of requested LoRAs ({len(wanted)}) is greater than the number of "
                               f"LoRA slots ({self.lora_slots}).")
        for lora_id in wanted:  # refresh first, so seating a newcomer never evicts one of the batch
            if lora_id in self._registered_adapters:
                self._registered_adapters.touch(lora_id)
            if lora_id in self._active_adapters:
                self._active_adapters.touch(lora_id)
        for request in wanted.values():
            self.ensure_registered(request)
            self.activate_adapter(request.lora_int_id)
        return np.array([-1 if r is None else self.lora_index_to_id.index(r.lora_int_id)
                         for r in lora_requests], dtype=np.int64)

    def lora_bytes(self) -> int:
        """Bytes of every slot of every wrapped layer (what ``max_loras`` x ``max_lora_rank`` reserve)."""
        return sum(m.lora_bytes() for m in self.modules.values())


__all__ = ["AdapterLRUCache", "LRUCacheLoRAModelManager", "MAX_LORA_RANKS", "PACKED_MODULES"]
