"""The contract between the control plane and the data plane.

The scheduler decides *which* tokens run in a step; the model runner turns that
decision into the flat arrays below; every model (the toy model, the numpy
transformer, a torch or Triton backend) consumes exactly these arrays. This is
the same split vLLM makes: ``CommonAttentionMetadata`` carries
``query_start_loc``, ``seq_lens``, ``block_table_tensor`` and ``slot_mapping``
for every attention backend.

upstream: vllm/v1/attention/backend.py:353 CommonAttentionMetadata

A step that schedules request A (a 3-token prefill chunk starting at position 0)
and request B (one decode token at position 7), with block_size 4::

    token_ids       = [a0, a1, a2, b7]
    positions       = [ 0,  1,  2,  7]
    query_start_loc = [0, 3, 4]          # A owns rows 0..2, B owns row 3
    seq_lens        = [3, 8]             # tokens in context *after* this step
    block_tables    = [[5, 0], [2, 9]]   # padded with the null block 0
    slot_mapping    = [20, 21, 22, 39]   # slot = block_id * block_size + offset
    logits_indices  = [2, 3]             # the last row of each request

Row ``i`` of a request's query attends to every key at a position ``<=
positions[i]`` of that request, read through its block table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class ModelInput:
    token_ids: np.ndarray  # [T] int64, the scheduled tokens of every request, concatenated
    positions: np.ndarray  # [T] int64, the position of each token in its own sequence
    query_start_loc: np.ndarray  # [B + 1] int64, request b owns rows [qsl[b], qsl[b+1])
    seq_lens: np.ndarray  # [B] int64, context length of request b after this step
    block_tables: np.ndarray  # [B, max_blocks] int64, padded with 0 (the null block)
    slot_mapping: np.ndarray  # [T] int64, where row i's new K/V is written
    logits_indices: np.ndarray  # [B] int64, the rows whose logits the sampler needs
    block_size: int
    # [T] int64, the LoRA slot of each row, -1 for none; None when LoRA is off (Phase 11)
    token_lora_indices: np.ndarray | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
