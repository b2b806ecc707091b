"""Lab 09-05 — A stateful logits processor on a persistent batch (reference solution).

vLLM keeps the requests of a running batch in numbered rows that survive
from step to step (the persistent batch). Between two steps, requests
finish, new ones arrive, and the model runner packs the rows again. A
logits processor that remembers something per request (a bias table, a
token budget, the n-grams it has seen) keys that memory by row, so it must
replay every change of the rows, in the right order, or it ends up
applying one request's rules to another request's logits.

The runner describes each step's changes as one ``BatchUpdate``:

* ``removed``: rows whose request left and were not refilled;
* ``added``: ``(row, params, prompt_tok_ids, output_tok_ids)`` for each new
  request; ``output_tok_ids`` is the request's own running list, which the
  engine appends to after every step (keep the reference, never a copy);
* ``moved``: ``(i1, i2, direction)``; ``UNIDIRECTIONAL`` moves the request at
  ``i1`` to ``i2`` and leaves ``i1`` empty, ``SWAP`` exchanges the two.

and the contract says: process the removals, then the additions, then the
moves in list order. An addition or a move may land on a row that still holds
state; that state belongs to a request that is gone and must be discarded.

This file has two parts. ``apply_batch_update`` replays a ``BatchUpdate`` on
a dict ``row -> state`` (vLLM's sparse processors keep exactly such a dict).
``NoRepeatNGramLogitsProcessor`` uses it: a request that sets
``SamplingParams(extra_args={"no_repeat_ngram_size": n})`` never produces an
n-gram that already occurs in its prompt plus output. The processor indexes
each request's n-grams incrementally, reading new tokens through the live
output list, and bans them in one vectorised write per step.

upstream: vllm/v1/sample/logits_processor/interface.py:37 BatchUpdate
upstream: vllm/v1/sample/logits_processor/interface.py:60 LogitsProcessor
upstream: vllm/v1/sample/logits_processor/builtin.py:294 process_dict_updates
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from mini_vllm.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

T = TypeVar("T")

EXTRA_ARG = "no_repeat_ngram_size"  # the key a request sets in SamplingParams.extra_args


# ---------------------------------------------------------------- given helpers


def ngram_size(params) -> int | None:
    """Given. The request's n from ``params.extra_args``, or None when it does not ask.

    Reads ``params.extra_args[EXTRA_ARG]``; ``extra_args`` None or without the
    key means "off". Does not validate (``validate_params`` does that once,
    when the request arrives).
    """
    extra = getattr(params, "extra_args", None)
    if not extra:
        return None
    return extra.get(EXTRA_ARG)


# ---------------------------------------------------------------- part 1: the batch update


def apply_batch_update(states: dict[int, T], batch_update: BatchUpdate | None,
                       new_state: Callable[[Any, Sequence[int] | None, list[int]], T | None]) -> bool:
    """Replay one step's ``BatchUpdate`` on ``states`` (row -> state), in place.

    Order (the interface's contract):

    1. every row in ``batch_update.removed`` loses its state;
    2. for every ``(row, params, prompt_tok_ids, output_tok_ids)`` in ``added``,
       ``new_state(params, prompt_tok_ids, output_tok_ids)`` is called once;
       a non-None result is stored at ``row`` (replacing what was there), a
       None result deletes whatever was at ``row`` (the row now holds a
       request this processor ignores);
    3. every ``(i1, i2, direction)`` in ``moved``, in list order:
       ``UNIDIRECTIONAL``: the state of ``i1`` (if any) goes to ``i2``, ``i1``
       ends with none and ``i2`` ends with exactly ``i1``'s old state (none if
       ``i1`` had none); ``SWAP``: the two rows exchange states (a missing
       state is exchanged as "none").

    ``batch_update`` None means the batch did not change: nothing happens.
    Returns True when at least one entry of ``states`` was stored, deleted or
    moved, False otherwise. States are stored as given (never copied).

    upstream: vllm/v1/sample/logits_processor/builtin.py:294 process_dict_updates
    """
    if batch_update is None:
        return False
    changed = False
    # 1. Removed rows: their requests are gone.
    for index in batch_update.removed:
        if states.pop(index, None) is not None:
            changed = True
    # 2. Added rows, at the index they were added at (before any move).
    for index, params, prompt_tok_ids, output_tok_ids in batch_update.added:
        state = new_state(params, prompt_tok_ids, output_tok_ids)
        if state is not None:
            states[index] = state
            changed = True
        elif states.pop(index, None) is not None:
            # Replaced a request that had state by one that has none.
            changed = True
    # 3. Moves, one after another: a later move sees the rows an earlier one left.
    for i1, i2, direction in batch_update.moved:
        first = states.pop(i1, None)
        second = states.pop(i2, None)
        if first is not None:
            states[i2] = first
            changed = True
        if second is not None:
            changed = True
            if direction == MoveDirectionality.SWAP:
                states[i1] = second
            # UNIDIRECTIONAL: i2's old request was overwritten; its state is dropped.
    return changed


# ---------------------------------------------------------------- part 2: one request's n-grams


@dataclass(eq=False)
class NGramRow:
    """One request's n-gram index (the processor's per-row state).

    ``n``: the n-gram size (>= 1). ``prompt``: the prompt's token ids (may be
    empty). ``output``: the request's LIVE output list, the very object from
    the ``BatchUpdate`` (the engine appends to it after each step).
    ``history``: the tokens indexed so far, prompt first, then output.
    ``seen``: maps each (n-1)-token prefix that occurred to the set of tokens
    that followed it; for n = 1 the only key is ``()``.
    """

    n: int
    prompt: Sequence[int]
    output: list[int]
    history: list[int] = field(default_factory=list)
    seen: dict[tuple[int, ...], set[int]] = field(default_factory=dict)

    def sync(self) -> list[int]:
        """Index every token that arrived since the last call; return the banned tokens.

        Appends to ``history`` the prompt (on the first call) and the output
        tokens it has not seen yet, read from ``self.output``; every n-gram
        window that now ends inside ``history`` is recorded in ``seen`` once
        (a window is indexed when its last token arrives, never twice). Returns
        the sorted list of tokens ``t`` such that ``history[-(n-1):] + [t]``
        is a recorded n-gram: the tokens that would repeat one. A history
        shorter than ``n - 1`` tokens bans nothing. Cost: proportional to the
        number of new tokens, not to the length of the history.
        """
        n = self.n
        start = len(self.history)  # tokens indexed before this call
        if start == 0 and self.prompt:
            self.history.extend(self.prompt)
        done_output = len(self.history) - len(self.prompt)
        self.history.extend(self.output[done_output:])
        h = self.history
        # A window [s, s + n) is new when its last token, s + n - 1, is >= start.
        for s in range(max(0, start - n + 1), len(h) - n + 1):
            self.seen.setdefault(tuple(h[s:s + n - 1]), set()).add(h[s + n - 1])
        # With fewer than n tokens there is no window yet: `seen` is empty and the
        # look-up below finds nothing, so short histories need no special case.
        key = tuple(h[len(h) - (n - 1):])
        return sorted(self.seen.get(key, ()))


def make_row_state(params, prompt_tok_ids: Sequence[int] | None,
                   output_tok_ids: list[int]) -> NGramRow | None:
    """The ``new_state`` callback for ``apply_batch_update``.

    Returns None when the request does not ask for the processor
    (``ngram_size(params)`` is None); otherwise an ``NGramRow`` with that n,
    the prompt (``[]`` for None) and ``output_tok_ids`` itself, the same list
    object, so that tokens the engine appends later are seen.
    """
    n = ngram_size(params)
    if n is None:
        return None
    # Keep the reference: a copy would freeze the output at its length today.
    return NGramRow(n=n, prompt=list(prompt_tok_ids or ()), output=output_tok_ids)


# ---------------------------------------------------------------- part 3: the processor


class NoRepeatNGramLogitsProcessor(LogitsProcessor):
    """Ban every token that would repeat an n-gram of the request's prompt + output.

    Per request, opt-in: ``SamplingParams(extra_args={"no_repeat_ngram_size": n})``.
    Rows of requests without the key are never touched. ``self.states`` maps a
    row of the persistent batch to its ``NGramRow``; it holds exactly the rows
    whose request asked for the processor.

    upstream: vllm/v1/sample/logits_processor/interface.py:60 LogitsProcessor
    """

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Refuse a bad ``no_repeat_ngram_size`` before the request enters the batch.

        Absent (``extra_args`` None or without the key) is valid: the processor
        is off for that request. Otherwise the value must be an int >= 1
        (``bool`` is not accepted). Raises ValueError naming
        ``no_repeat_ngram_size`` and the allowed range.

        upstream: vllm/v1/sample/logits_processor/interface.py:62 validate_params
        """
        n = ngram_size(sampling_params)
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{EXTRA_ARG} must be an integer >= 1, got {n!r}")

    def __init__(self, vllm_config, device, is_pin_memory: bool) -> None:
        """Start with no rows: ``self.states == {}`` and nothing to ban.

        ``vllm_config``, ``device`` and ``is_pin_memory`` are accepted for the
        interface (mini_vllm passes its engine, ``"cpu"`` and False) and not used.
        """
        self.states: dict[int, NGramRow] = {}
        self._rows = np.zeros(0, dtype=np.int64)  # (row, token) pairs to set to -inf
        self._tokens = np.zeros(0, dtype=np.int64)

    def is_argmax_invariant(self) -> bool:
        """False: a ban can remove the top token, so greedy rows need it too."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch, then bring every tracked row up to date.

        Replays ``batch_update`` on ``self.states`` with ``apply_batch_update``
        and ``make_row_state``; then calls ``sync()`` on every tracked row
        (called every step, also with None: the output lists have grown) and
        stores the (row, token) pairs that ``apply`` must ban.
        """
        apply_batch_update(self.states, batch_update, make_row_state)
        rows: list[int] = []
        tokens: list[int] = []
        for row, state in self.states.items():
            banned = state.sync()
            rows.extend([row] * len(banned))
            tokens.extend(banned)
        self._rows = np.asarray(rows, dtype=np.int64)
        self._tokens = np.asarray(tokens, dtype=np.int64)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Set the banned (row, token) entries of ``logits [B, V]`` to -inf.

        One fancy-indexed write for the whole batch (no loop over rows);
        ``logits`` may be modified in place and is returned. Every other
        entry, and every row without state, is left bit for bit as it was.
        """
        if self._rows.size:
            logits[self._rows, self._tokens] = -np.inf
        return logits
