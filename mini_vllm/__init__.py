"""mini_vllm: a small, readable reimplementation of vLLM v1's core.

See mini_vllm/README.md for the map and the public API.
"""
from mini_vllm.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock, hash_block_tokens
from mini_vllm.engine import LLM, CompletionOutput, LLMEngine, RequestOutput, StepStats
from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.lora.request import LoRARequest
from mini_vllm.model import ToyModel
from mini_vllm.model_input import ModelInput
from mini_vllm.model_runner import prepare_inputs
from mini_vllm.request import Request, RequestMetrics, RequestStatus
from mini_vllm.sampler import Sampler
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.scheduler import Scheduler, SchedulerOutput
from mini_vllm.tokenizer import ByteTokenizer, HFTokenizer

__all__ = [
    "LLM",
    "BlockPool",
    "ByteTokenizer",
    "CompletionOutput",
    "FreeKVCacheBlockQueue",
    "HFTokenizer",
    "KVCacheBlock",
    "KVCacheManager",
    "LLMEngine",
    "LoRARequest",
    "ModelInput",
    "Request",
    "RequestMetrics",
    "RequestOutput",
    "RequestStatus",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerOutput",
    "StepStats",
    "ToyModel",
    "hash_block_tokens",
    "prepare_inputs",
]
