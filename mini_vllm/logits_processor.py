"""Custom logits processors: vLLM v1's interface, and the persistent batch that feeds it.

A logits processor sees the whole batch's logits ``[B, V]`` at once, so it
cannot look a request up by id: it keeps per-row state, and the engine tells
it, before every step, how the rows changed. That change is a ``BatchUpdate``:
rows removed, requests added at an index (with their params, prompt, and a
*live* reference to their output token list), and rows moved. A processor
applies it in that order: removed, then added, then moved.

Where the rows go is decided by ``PersistentBatch``, which reproduces what
upstream's ``InputBatch`` does to its row indices each step:

1. every request not scheduled this step (finished, preempted, or just not
   picked) is removed, freeing its index;
2. each new request takes the lowest freed index, or the next index at the end;
3. ``condense`` slides the highest live rows down into the remaining holes,
   one ``UNIDIRECTIONAL`` move each, so rows ``0..B-1`` are live again.

(Upstream also swaps rows with ``SWAP`` moves when an attention backend wants
decodes before prefills; mini_vllm never reorders, so it emits no swaps, but
a processor must still handle them.)

The engine calls ``update_state`` on every processor every step (with
``None`` when nothing changed), then ``apply`` on the logits of the scheduled
requests in persistent-batch order. Non-argmax-invariant processors run before
the penalties, argmax-invariant ones after temperature and only matter for
non-greedy rows (``mini_vllm.sampler.Sampler.forward``).

Differences from upstream: ``apply`` takes and returns numpy arrays;
``__init__`` receives the ``LLMEngine`` where upstream passes its
``VllmConfig`` (and ``"cpu"``, ``False`` for device and pinned memory).

upstream: vllm/v1/sample/logits_processor/interface.py:17 MoveDirectionality
upstream: vllm/v1/sample/logits_processor/interface.py:37 BatchUpdate
upstream: vllm/v1/sample/logits_processor/interface.py:60 LogitsProcessor
upstream: vllm/v1/sample/logits_processor/state.py:18 BatchUpdateBuilder
upstream: vllm/v1/worker/gpu_input_batch.py:309 InputBatch._register_add_request
upstream: vllm/v1/worker/gpu_input_batch.py:683 InputBatch.condense
upstream: vllm/v1/worker/gpu_model_runner.py:1116 GPUModelRunner._update_states
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto

import numpy as np

from mini_vllm.sampling_params import SamplingParams


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()  # the request at i1 moves to i2; i1 is left empty
    SWAP = auto()  # the requests at i1 and i2 trade places


RemovedRequest = int
AddedRequest = tuple[int, SamplingParams, list[int], list[int]]  # (index, params, prompt, live output)
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(frozen=True)
class BatchUpdate:
    """How the persistent batch changed since the last step. Apply removed, then added, then moved;
    an added or moved request may land on an index that still holds another one (it replaces it)."""

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """Subclass this and pass the class in ``LLMEngine(logits_processors=[...])``."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ``ValueError`` for params this processor cannot serve (called by ``add_request``)."""
        return None

    @abstractmethod
    def __init__(self, vllm_config, device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Process the batch's logits [B, V] (rows in persistent-batch order); may modify in place."""
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if ``apply`` can never change a row's argmax (then greedy rows skip it)."""
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Called before every step; ``None`` when the batch did not change."""
        raise NotImplementedError


class PersistentBatch:
    """Row indices of the scheduled requests, kept from step to step as upstream's ``InputBatch`` does."""

    def __init__(self) -> None:
        self.req_ids: list[str] = []  # req_ids[i] is the request in row i

    def update(self, scheduled: Sequence) -> BatchUpdate | None:
        """Make the batch hold exactly ``scheduled`` (``Request`` objects); return the change.

        Afterwards ``req_ids`` lists the rows in order; ``None`` means nothing changed.
        """
        wanted = {r.request_id for r in scheduled}
        if len(wanted) != len(scheduled):
            raise ValueError("scheduled must not list a request twice")
        rows: list[str | None] = list(self.req_ids)
        removed = [i for i, rid in enumerate(rows) if rid not in wanted]
        for i in removed:
            rows[i] = None
        free = sorted(removed)  # the lowest freed index is refilled first
        present = set(self.req_ids)
        added: list[AddedRequest] = []
        for req in scheduled:
            if req.request_id in present:
                continue
            index = free.pop(0) if free else len(rows)
            if index == len(rows):
                rows.append(None)
            rows[index] = req.request_id
            added.append((index, req.sampling_params, req.prompt_token_ids, req.output_token_ids))
        moved: list[MovedRequest] = []
        holes = sorted(free)  # freed and not refilled: condense them away
        last = len(rows) - 1
        while holes:
            while last >= 0 and rows[last] is None:
                last -= 1
            if holes[0] >= last:
                break
            hole = holes.pop(0)
            rows[hole], rows[last] = rows[last], None
            moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
            last -= 1
        self.req_ids = [rid for rid in rows if rid is not None]
        if not (free or holes or added or moved or removed):
            return None
        # Upstream reports the freed indices that no add or move refilled, highest first.
        still_empty = sorted(set(removed) - {a[0] for a in added} - {m[1] for m in moved}, reverse=True)
        return BatchUpdate(len(self.req_ids), still_empty, added, moved)
