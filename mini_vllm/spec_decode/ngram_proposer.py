"""NgramProposer: prompt-lookup drafting, with upstream's matching rule.

The drafter looks for the longest n-gram, ``min_n <= n <= max_n``, that ends
the sequence and also occurred earlier; of its occurrences it takes the
**earliest**, and proposes the (at most ``k``) tokens that followed it. No
match, or a sequence shorter than ``min_n``, proposes nothing. ``k`` is also
capped by ``max_model_len - len(tokens)`` and by how many tokens follow the
match. Upstream finds the match with KMP over the reversed tokens (numba);
here a window comparison per n, longest first, gives the same answer.

upstream: vllm/v1/spec_decode/ngram_proposer.py:12 NgramProposer
upstream: vllm/v1/spec_decode/ngram_proposer.py:199 _find_longest_matched_ngram_and_propose_tokens
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def find_longest_matched_ngram_and_propose_tokens(
    tokens: Sequence[int], min_ngram: int, max_ngram: int, max_model_len: int, k: int
) -> list[int]:
    """The draft after the earliest occurrence of the longest matched suffix n-gram."""
    arr = np.asarray(tokens, dtype=np.int64)
    total = len(arr)
    k = min(k, max_model_len - total)
    if total < min_ngram or k <= 0:
        return []
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        # Windows that end before the last token; [0] is the earliest occurrence.
        hits = np.flatnonzero((sliding_window_view(arr[:-1], n) == arr[total - n:]).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n
            return arr[start: start + k].tolist()
    return []


class NgramProposer:
    """Drafts ``k`` tokens per request from its own context (no model)."""

    def __init__(self, min_n: int, max_n: int, k: int, max_model_len: int) -> None:
        self.min_n, self.max_n, self.k, self.max_model_len = min_n, max_n, k, max_model_len

    def propose(self, token_ids: Sequence[int], max_drafts: int | None = None) -> list[int]:
        """Draft for one request; ``max_drafts`` caps k further (the engine's max_tokens room)."""
        k = self.k if max_drafts is None else min(self.k, max_drafts)
        return find_longest_matched_ngram_and_propose_tokens(
            token_ids, self.min_n, self.max_n, self.max_model_len, k)
