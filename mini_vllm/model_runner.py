"""prepare_inputs: the scheduler's decision -> the flat arrays a model consumes.

The scheduler says "request r runs n tokens"; the model needs, for every one
of those tokens, its id, its position, and the KV slot its K/V goes to, plus
each request's block table to read context through. This is the small piece
of vLLM's GPU model runner that does not touch a GPU.

upstream: vllm/v1/worker/gpu_model_runner.py:1863 GPUModelRunner._prepare_inputs
upstream: vllm/v1/attention/backend.py:353 CommonAttentionMetadata
upstream: vllm/v1/worker/gpu_model_runner.py:2713 _calc_spec_decode_metadata
"""
from __future__ import annotations

import numpy as np

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.model_input import ModelInput
from mini_vllm.scheduler import SchedulerOutput
from mini_vllm.spec_decode.metadata import SpecDecodeMetadata, calc_spec_decode_metadata


def spec_decode_metadata(scheduler_output: SchedulerOutput) -> SpecDecodeMetadata | None:
    """The logits rows of a step with scheduled drafts; None when it has none."""
    spec = scheduler_output.scheduled_spec_decode_tokens
    if not spec:
        return None
    reqs = scheduler_output.scheduled_requests
    counts = [scheduler_output.num_scheduled_tokens[r.request_id] for r in reqs]
    return calc_spec_decode_metadata([len(spec.get(r.request_id, ())) for r in reqs], np.cumsum(counts))


def prepare_inputs(scheduler_output: SchedulerOutput, kv_cache_manager: KVCacheManager) -> ModelInput:
    """Build the ModelInput of one step; rows follow ``scheduled_requests`` order.

    Must run before ``update_from_output``: a request's scheduled chunk starts
    at its current ``num_computed_tokens``. ``logits_indices`` holds the last
    row of *every* request; the engine samples only the rows whose request
    finished its prefill (``Scheduler.needs_sample``) and drops the rest.
    A request with scheduled drafts runs them after its last token and gets a
    logits row for each of them too (``spec_decode_metadata``).
    """
    bs = kv_cache_manager.block_size
    reqs = scheduler_output.scheduled_requests
    counts = np.array(
        [scheduler_output.num_scheduled_tokens[r.request_id] for r in reqs], dtype=np.int64
    )
    starts = np.array([r.num_computed_tokens for r in reqs], dtype=np.int64)
    spec = scheduler_output.scheduled_spec_decode_tokens  # drafts follow the request's last token
    token_ids = np.fromiter(
        (t for r, s, n in zip(reqs, starts, counts, strict=True)
         for t in r.all_token_ids[s : s + n] + spec.get(r.request_id, [])),
        dtype=np.int64,
        count=int(counts.sum()),
    )
    query_start_loc = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start_loc[1:])
    row_req = np.repeat(np.arange(len(reqs)), counts)  # which request owns each row
    positions = starts[row_req] + np.arange(len(token_ids)) - query_start_loc[row_req]
    tables = [kv_cache_manager.get_block_ids(r.request_id) for r in reqs]
    block_tables = np.zeros((len(reqs), max(map(len, tables), default=0)), dtype=np.int64)
    for i, ids in enumerate(tables):
        block_tables[i, : len(ids)] = ids
    slot_mapping = block_tables[row_req, positions // bs] * bs + positions % bs
    return ModelInput(
        token_ids=token_ids,
        positions=positions,
        query_start_loc=query_start_loc,
        seq_lens=starts + counts,
        block_tables=block_tables,
        slot_mapping=slot_mapping,
        logits_indices=(spec_decode_metadata(scheduler_output).logits_indices if spec
                        else query_start_loc[1:] - 1),
        block_size=bs,
    )
