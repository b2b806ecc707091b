"""DraftModelProposer: a second (smaller) model drafts k tokens greedily.

Greedy drafts are one-hot for the rejection sampler, as upstream's default
``draft_sample_method="greedy"``. The draft model must share the target's
vocabulary. Stated simplification: upstream's proposer keeps its own paged KV
cache and reserves ``num_lookahead_tokens = k`` slots for it in the
scheduler; this one keeps no state and re-runs the draft model over the whole
context for every proposal (one prefill, then k - 1 decodes), so it needs no
lookahead slots. Correct, and slow for long contexts.

upstream: vllm/v1/spec_decode/draft_model.py:17 DraftModelProposer
upstream: vllm/config/speculative.py:256 draft_sample_method
"""
from __future__ import annotations

from collections.abc import Sequence


class DraftModelProposer:
    def __init__(self, model, k: int, max_model_len: int, block_size: int = 16) -> None:
        self.model, self.k, self.block_size = model, k, block_size
        self.max_model_len = min(max_model_len, model.max_model_len)

    def propose(self, token_ids: Sequence[int], max_drafts: int | None = None) -> list[int]:
        k = min(self.k, self.max_model_len - len(token_ids))
        k = k if max_drafts is None else min(k, max_drafts)
        if k <= 0:
            return []
        from mini_vllm.models.runner import greedy_generate  # numpy models only; imported on use

        return greedy_generate(self.model, [list(token_ids)], k, block_size=self.block_size)[0]
