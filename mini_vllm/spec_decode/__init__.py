"""Speculative decoding: draft cheaply, verify all drafts in one target pass.

Off by default (``LLMEngine(speculative_config=None)``). With
``{"method": "ngram", "num_speculative_tokens": k, ...}`` the engine drafts up
to ``k`` tokens per decoding request after every step (``NgramProposer``,
or ``DraftModelProposer`` with ``{"method": "draft_model", "model": name}``),
the scheduler schedules them with the request's last token, the model returns
logits at every draft row plus the bonus row (``calc_spec_decode_metadata``),
and ``RejectionSampler`` keeps the accepted prefix plus one more token. The
scheduler then rolls ``num_computed_tokens`` back by the rejected count; the
rejected slots' KV is simply overwritten by the next step.

upstream: vllm/config/speculative.py:69 RejectionSampleMethod
upstream: vllm/v1/core/sched/scheduler.py:386 num_tokens_with_spec
"""
from mini_vllm.spec_decode.config import SpeculativeConfig
from mini_vllm.spec_decode.draft_model import DraftModelProposer
from mini_vllm.spec_decode.metadata import SpecDecodeMetadata, calc_spec_decode_metadata
from mini_vllm.spec_decode.metrics import SpecDecodingStats
from mini_vllm.spec_decode.ngram_proposer import (
    NgramProposer,
    find_longest_matched_ngram_and_propose_tokens,
)
from mini_vllm.spec_decode.rejection_sampler import RejectionSampler, rejection_sample

__all__ = [
    "DraftModelProposer", "NgramProposer", "RejectionSampler", "SpecDecodeMetadata",
    "SpecDecodingStats", "SpeculativeConfig", "calc_spec_decode_metadata", "find_longest_matched_ngram_and_propose_tokens", "rejection_sample",
]
