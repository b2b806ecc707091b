"""SpecDecodeMetadata: which logits rows a speculative step needs.

A request that scheduled ``1 + d`` tokens (its last real token and ``d``
drafts) needs the logits of all ``d + 1`` rows: row ``i`` checks draft ``i``,
the last row gives the bonus token. A request without drafts needs only its
last row. Worked example (upstream's)::

    cu_num_scheduled_tokens  [4, 104, 107, 207, 209]
    num_draft_tokens         [3,   0,   2,   0,   1]
    logits_indices           [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    target_logits_indices    [0, 1, 2, 5, 6, 9]      (into the gathered logits)
    bonus_logits_indices     [3, 4, 7, 8, 10]

upstream: vllm/v1/spec_decode/metadata.py:10 SpecDecodeMetadata
upstream: vllm/v1/worker/gpu_model_runner.py:2713 _calc_spec_decode_metadata
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class SpecDecodeMetadata:
    draft_token_ids: np.ndarray  # [num_draft_tokens], or empty when input ids were not given
    num_draft_tokens: list[int]  # [batch]
    cu_num_draft_tokens: np.ndarray  # [batch]
    cu_num_sampled_tokens: np.ndarray  # [batch]
    target_logits_indices: np.ndarray  # [num_draft_tokens], rows of the gathered logits
    bonus_logits_indices: np.ndarray  # [batch], rows of the gathered logits
    logits_indices: np.ndarray  # [num_draft_tokens + batch], rows of the model's input

    @property
    def max_spec_len(self) -> int:
        return max(self.num_draft_tokens, default=0)


def _offsets_within(counts: np.ndarray) -> np.ndarray:
    """[3, 1, 2] -> [0, 1, 2, 0, 0, 1]: each element's index inside its group."""
    cu = np.cumsum(counts)
    return np.arange(cu[-1] if len(cu) else 0) - np.repeat(cu - counts, counts)


def calc_spec_decode_metadata(
    num_draft_tokens, cu_num_scheduled_tokens, input_ids: np.ndarray | None = None
) -> SpecDecodeMetadata:
    num_draft = np.asarray(num_draft_tokens, dtype=np.int64)
    cu_sched = np.asarray(cu_num_scheduled_tokens, dtype=np.int64)
    num_sampled = num_draft + 1
    cu_sampled = np.cumsum(num_sampled)
    # The last num_sampled rows of each request, in input-row numbers.
    logits_indices = np.repeat(cu_sched - num_sampled, num_sampled) + _offsets_within(num_sampled)
    # Draft i of a request is checked by gathered row (its first row + i).
    target = np.repeat(cu_sampled - num_sampled, num_draft) + _offsets_within(num_draft)
    drafts = (np.asarray(input_ids)[logits_indices][target + 1] if input_ids is not None
              else np.zeros(0, dtype=np.int64))
    return SpecDecodeMetadata(
        draft_token_ids=drafts,
        num_draft_tokens=num_draft.tolist(),
        cu_num_draft_tokens=np.cumsum(num_draft),
        cu_num_sampled_tokens=cu_sampled,
        target_logits_indices=target,
        bonus_logits_indices=cu_sampled - 1,
        logits_indices=logits_indices,
    )
