"""LLMEngine and LLM: the loop that turns prompts into completions.

One ``step()`` is vLLM's heartbeat: schedule -> prepare inputs -> run the
model -> sample -> update. Everything interesting (who runs, how many tokens,
which blocks) was decided by the scheduler; the engine only wires the pieces
together and keeps a per-step record (``stats``) so you can watch it work.

``LLM`` is the offline front door with vLLM's output shapes
(``RequestOutput.outputs[0].text``), including ``n > 1`` fan-out.

Where upstream is lenient, this engine refuses rather than cuts: upstream
rejects a prompt that reaches ``max_model_len`` but lets prompt + ``max_tokens``
run past it and stops the request there with ``"length"`` (``check_stop``);
here ``add_request`` rejects any prompt + ``max_tokens`` above
``max_model_len``, or too big for the KV pool, so a request that is accepted
always gets the tokens it asked for (unless EOS or a stop string comes first).

upstream: vllm/v1/engine/llm_engine.py:47 LLMEngine
upstream: vllm/v1/engine/core.py:428 EngineCore.step
upstream: vllm/entrypoints/llm.py:66 LLM
upstream: vllm/outputs.py:85 RequestOutput
upstream: vllm/v1/engine/input_processor.py:396 max_prompt_len
upstream: vllm/v1/core/sched/utils.py:94 check_stop
upstream: vllm/v1/core/sched/scheduler.py:1691 update_draft_token_ids
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.logits_processor import LogitsProcessor, PersistentBatch
from mini_vllm.lora.request import LoRARequest
from mini_vllm.model import ToyModel
from mini_vllm.model_runner import prepare_inputs, spec_decode_metadata
from mini_vllm.request import Request, RequestMetrics, RequestStatus
from mini_vllm.sampler import Sampler, SamplingMetadata, compute_logprobs, gather_logprobs
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.scheduler import Scheduler
from mini_vllm.spec_decode import (
    DraftModelProposer,
    NgramProposer,
    RejectionSampler,
    SpecDecodingStats,
    SpeculativeConfig,
)

Prompt = str | dict


@dataclass(slots=True)
class StepStats:
    """What one engine step did (``LLMEngine.stats`` holds one per step)."""

    step: int
    num_scheduled_tokens: dict[str, int]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    blocks_used: int  # blocks held by requests after scheduling (null block excluded)
    num_cached_tokens: int  # prefix-cache hit tokens of requests admitted this step
    preempted: list[str]
    finished: list[str]
    schedule_time_s: float  # wall time of Scheduler.schedule() alone
    kv_rows_read: int = 0  # K/V rows the attention backend read, all layers (0: no attention)
    padded_tokens: int = 0  # rows added to reach a CUDA-graph capture size (0: not padded)
    cudagraph_mode: str = "NONE"  # the step's runtime mode: NONE or PIECEWISE
    expert_loads: tuple[tuple[int, ...], ...] = ()  # MoE: slots per expert, one row per layer
    spec_decoding: SpecDecodingStats | None = None  # drafts verified this step (None: spec off)
    num_collectives: int = 0  # tensor parallelism: all-reduces + gathers on rank 0 (0 at TP = 1)
    active_loras: tuple[int, ...] = ()  # Phase 11: the distinct adapter ids of the step's batch, sorted


_MODEL_INTERFACE = ("vocab_size", "max_model_len", "eos_token_id", "tokenizer", "init_kv_cache", "execute")


def _positive_int(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class LLMEngine:
    """The engine. ``model`` is ``"toy"``, any name ``mini_vllm.models.get_model``
    knows (``"tiny-random"``, a folder, a hub id), or a model object.

    ``model_backend="torch"`` runs a named transformer in PyTorch on the CPU
    (for a GPU, pass ``get_model(name, backend="torch", device="cuda")``).

    ``attention_backend`` is ``"auto"`` (the model platform's default kernel),
    a name from ``AttentionBackendEnum`` (``"NUMPY_FLASH"``, ...) or an
    ``AttentionBackend`` subclass. It is resolved here, before any request
    runs; an explicit choice that cannot serve the model is an error, never
    replaced by another (upstream: vllm/config/attention.py:17 AttentionConfig).

    ``compilation_config`` (a dict or ``mini_vllm.compilation.CompilationConfig``)
    turns on ``torch.compile`` (``{"mode": "VLLM_COMPILE"}``) and piecewise CUDA
    graphs (``"cudagraph_mode": "PIECEWISE"``) for the torch model; off by default.
    ``enforce_eager=True`` turns both off whatever the config says, as in vLLM
    (upstream: vllm/config/vllm.py:1032 enforce_eager).

    ``quantization`` (``None``, ``"int8"``, ``"int4"``, ``"fp8"`` or a name
    registered with ``mini_vllm.quantization.register_quantization_config``)
    quantizes the linear layers of a named numpy transformer as it is built;
    ``quantization_config`` is the format's options (``{"group_size": 64}``).
    ``kv_cache_dtype="fp8"`` stores K/V as FP8 E4M3; ``"auto"`` keeps the
    model's float32. Both are off by default, and off is the old path exactly.

    ``speculative_config`` (``None``, off by default, or vLLM's dict
    ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min":
    a, "prompt_lookup_max": b}``) drafts up to k tokens per decoding request
    by prompt lookup and verifies them in one pass (``mini_vllm.spec_decode``);
    ``{"method": "draft_model", "model": "tiny-random", ...}`` drafts them
    greedily with a second model of the same vocabulary instead;
    greedy output is unchanged, sampled output keeps its distribution.
    Drafts never run past ``max_tokens``. ``spec_decoding_stats`` sums the
    steps' ``StepStats.spec_decoding``.

    Phase 09's sampling knobs (penalties, ``min_tokens``, ``logit_bias``,
    ``allowed_token_ids``, ``bad_words``, ``logprobs``) go through one batched
    ``Sampler.forward`` per step; token ids must be in the vocabulary and
    ``logprobs`` at most ``max_logprobs`` (20 as upstream; -1: no cap). They
    are refused with ``speculative_config`` (upstream supports all but
    ``min_p`` and ``logit_bias`` there; mini_vllm's verify step does not apply them).

    ``prompt_logprobs=k`` adds ``RequestOutput.prompt_logprobs``: the raw
    logprobs of each prompt token given the ones before it (extra logits rows
    in the prefill steps; such a request never reads the prefix cache).
    ``logits_processors`` (classes, off by default) are upstream's custom
    processors: built once, told each step how the persistent batch changed
    (``mini_vllm.logits_processor``), run on its logits in upstream's place.
    ``LLM.beam_search`` is upstream's offline beam search over this engine.

    ``tensor_parallel_size=N`` (torch backend, a named dense model) runs the
    model on N forked worker processes joined by torch.distributed (gloo on
    the CPU): ``model_executor`` is a ``MultiprocExecutor``, ``model`` a
    ``TensorParallelModel`` with the usual interface. The scheduler and KV
    block manager stay here; each worker holds 1/N of the weights (column-
    and row-parallel linears, vocab-parallel embedding and LM head) and of the
    paged KV cache (its KV heads), and rank 0 returns the gathered logits.
    Greedy output equals N = 1's (logits agree to float32 rounding, not bit
    for bit); ``StepStats.num_collectives`` is 2L + 2 per step. N = 1 is the
    in-process path, unchanged. Compilation and an FP8 KV cache are refused
    with N > 1; ``shutdown()`` stops the workers (also at interpreter exit),
    and a worker's exception or a hung collective becomes ``RuntimeError``.
    (upstream: vllm/v1/executor/multiproc_executor.py:102 MultiprocExecutor)

    ``enable_lora=True`` (numpy transformer, off by default) serves PEFT
    adapters: ``add_request(..., lora_request=LoRARequest(name, id, path))``
    or ``LLM.generate(..., lora_request=...)``. Every linear layer gets
    ``max_loras`` slots of rank ``max_lora_rank`` (one of 1, 8, 16, 32, 64,
    128, 256, 320, 512); adapters load from disk into an LRU of
    ``max_cpu_loras`` (default ``max_loras``) and into slots by LRU, and the
    scheduler never puts more than ``max_loras`` distinct adapters in a step.
    Rows without an adapter get exactly the base model's output; blocks are
    shared in the prefix cache only between requests of the same adapter
    name (``mini_vllm.lora``; upstream: vllm/config/lora.py:31 LoRAConfig).

    Request ids default to ``"req-0"``, ``"req-1"``, ... counted per engine.
    Requests with ``seed=None`` draw from a generator seeded by
    ``(seed, request number)``, so a whole run is reproducible.
    """

    def __init__(
        self,
        model: str | object = "toy",
        block_size: int = 16,
        num_blocks: int = 1024,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
        long_prefill_token_threshold: int = 0,
        enable_caching: bool = True,
        max_model_len: int | None = None,
        seed: int = 0,
        model_backend: str = "numpy",
        attention_backend: str | type = "auto",
        compilation_config: dict | object | None = None,
        enforce_eager: bool = False,
        quantization: str | None = None,
        quantization_config: dict | None = None,
        kv_cache_dtype: str = "auto",
        speculative_config: dict | SpeculativeConfig | None = None,
        max_logprobs: int = 20,
        logits_processors: list[type[LogitsProcessor]] | tuple = (),
        tensor_parallel_size: int = 1,
        enable_lora: bool = False,
        max_loras: int = 1,
        max_lora_rank: int = 16,
        max_cpu_loras: int | None = None,
    ) -> None:
        if model_backend not in ("numpy", "torch"):
            raise ValueError(f"model_backend must be one of numpy, torch, got {model_backend!r}")
        if model_backend != "numpy" and (not isinstance(model, str) or model == "toy"):
            raise ValueError(f"model_backend {model_backend!r} applies to a transformer named by "
                             f"'tiny-random', a folder or a hub id, not to {model!r}")
        _positive_int("block_size", block_size)
        _positive_int("num_blocks", num_blocks, 2)
        _positive_int("seed", seed, 0)
        if max_logprobs != -1 and (isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int)
                                   or max_logprobs < 0):
            raise ValueError(f"max_logprobs must be -1 (no cap) or an integer >= 0, got {max_logprobs!r}")
        self.max_logprobs = max_logprobs
        if max_model_len is not None:
            _positive_int("max_model_len", max_model_len, 2)
        self.speculative_config = SpeculativeConfig.from_any(speculative_config)
        from mini_vllm.quantization import make_quant_config

        quant_config = make_quant_config(quantization, quantization_config)
        if quant_config is not None and (not isinstance(model, str) or model == "toy"
                                         or model_backend != "numpy"):
            raise ValueError(f"quantization applies to a transformer the engine builds by name with "
                             f"model_backend='numpy', not to {model!r} (backend {model_backend!r}); "
                             f"for a model object, build it with get_model(..., quantization=...)")
        self.model_executor = None
        if _positive_int("tensor_parallel_size", tensor_parallel_size) > 1:
            self._check_tensor_parallel(model, model_backend, compilation_config, enforce_eager, kv_cache_dtype)
        if tensor_parallel_size > 1:
            from mini_vllm.distributed.executor import TensorParallelModel

            self.model = TensorParallelModel(model, tensor_parallel_size, seed=seed, max_model_len=max_model_len)
            self.model_executor = self.model.executor
        elif model == "toy":
            self.model = ToyModel(seed=seed, **({"max_model_len": max_model_len} if max_model_len else {}))
        elif isinstance(model, str):
            from mini_vllm.models import get_model

            self.model = get_model(model, seed=seed, max_model_len=max_model_len, backend=model_backend)
            if quant_config is not None:
                self.model = self.model.quantized(quant_config)
        else:
            missing = [a for a in _MODEL_INTERFACE if not hasattr(model, a)]
            if missing:
                raise ValueError(f"model must be a name or an object with {', '.join(_MODEL_INTERFACE)}; "
                                 f"{type(model).__name__} lacks {', '.join(missing)}")
            self.model = model
        if max_model_len is not None and max_model_len > self.model.max_model_len:
            raise ValueError(f"max_model_len must be <= the model's max_model_len "
                             f"({self.model.max_model_len}), got {max_model_len}")
        self.max_model_len = max_model_len or self.model.max_model_len
        self.tokenizer = self.model.tokenizer
        self.lora_manager = self._make_lora_manager(enable_lora, max_loras, max_lora_rank, max_cpu_loras)
        self._lora_requests: dict[int, LoRARequest] = {}  # every adapter id seen, to catch a reused id
        self.kv_cache_manager = KVCacheManager(num_blocks, block_size, enable_caching, self.max_model_len)
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=long_prefill_token_threshold,
            max_model_len=self.max_model_len,
            max_loras=max_loras if enable_lora else None,
        )
        self.kv_cache_dtype = self._init_kv_cache(num_blocks, block_size, kv_cache_dtype)
        self.attention_backend = self._select_attention_backend(attention_backend, block_size)
        self.compilation_config = self._configure_compilation(compilation_config, enforce_eager,
                                                              max_num_seqs, max_num_batched_tokens)
        self.sampler = Sampler()
        self.drafter = self.rejection_sampler = self.spec_decoding_stats = None
        if (spec := self.speculative_config) is not None:
            self.drafter = self._make_drafter(spec, seed, block_size)
            self.rejection_sampler = RejectionSampler(self.sampler)
            self.spec_decoding_stats = SpecDecodingStats.new(spec.num_speculative_tokens)
        self.logits_processors = self._build_logits_processors(logits_processors)
        self.persistent_batch = PersistentBatch() if self.logits_processors else None
        self.seed = seed
        self.stats: list[StepStats] = []
        self.num_steps = 0
        self._num_added = 0
        self._generators: dict[str, np.random.Generator] = {}

    @staticmethod
    def _check_tensor_parallel(model, model_backend, compilation_config, enforce_eager, kv_cache_dtype) -> None:
        """What ``tensor_parallel_size > 1`` cannot combine with, refused before any process starts."""
        from mini_vllm.compilation import CompilationConfig, CompilationMode, CUDAGraphMode

        if model_backend != "torch":
            raise ValueError(f"tensor_parallel_size > 1 needs model_backend='torch' (the workers run the "
                             f"torch model), got model_backend={model_backend!r}")
        config = CompilationConfig.from_any(compilation_config)
        if not enforce_eager and (config.mode != CompilationMode.NONE
                                  or config.cudagraph_mode != CUDAGraphMode.NONE):
            raise ValueError("tensor_parallel_size > 1 runs eagerly: compilation_config must leave mode "
                             "and cudagraph_mode at NONE (or pass enforce_eager=True)")
        if kv_cache_dtype != "auto":
            raise ValueError(f"tensor_parallel_size > 1 keeps a float32 KV cache: kv_cache_dtype must be "
                             f"'auto', got {kv_cache_dtype!r}")

    def _make_lora_manager(self, enable_lora, max_loras, max_lora_rank, max_cpu_loras):
        """The adapter manager when ``enable_lora``; its arguments are checked either way."""
        from mini_vllm.lora.model_manager import MAX_LORA_RANKS

        if not isinstance(enable_lora, bool):
            raise ValueError(f"enable_lora must be True or False, got {enable_lora!r}")
        _positive_int("max_loras", max_loras)
        if max_lora_rank not in MAX_LORA_RANKS or isinstance(max_lora_rank, bool):
            raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, MAX_LORA_RANKS))}, "
                             f"got {max_lora_rank!r}")
        if max_cpu_loras is not None and (_positive_int("max_cpu_loras", max_cpu_loras) < max_loras):
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})")
        if not enable_lora:
            return None
        model = self.model
        if self.model_executor is not None or not hasattr(model, "linears") or not hasattr(model, "config"):
            raise ValueError(f"enable_lora needs a numpy transformer (a named model with model_backend='numpy', "
                             f"tensor_parallel_size=1), not {type(model).__name__}")
        if model.config.is_moe:
            raise ValueError("enable_lora covers dense models: mini_vllm has no LoRA for a mixtral model's experts")
        from mini_vllm.lora.lora_model import LoRAModel
        from mini_vllm.lora.model_manager import LRUCacheLoRAModelManager

        def load(request: LoRARequest) -> LoRAModel:
            return LoRAModel.from_local_checkpoint(request.lora_path, model.config, lora_model_id=request.lora_int_id,
                                                   max_lora_rank=max_lora_rank)

        return LRUCacheLoRAModelManager(model, max_loras, max_lora_rank, max_cpu_loras, loader=load)

    def _check_lora_request(self, lora_request) -> None:
        """Refuse an adapter before its request queues: wrong type, LoRA off, an id reused for
        another adapter, or a folder that does not load (rank, modules, shapes)."""
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest or None, got {type(lora_request).__name__}")
        if self.lora_manager is None:
            raise ValueError(f"lora_request {lora_request.lora_name!r} needs LLMEngine(enable_lora=True): "
                             f"LoRA is not enabled")
        seen = self._lora_requests.get(lora_request.lora_int_id)
        if seen is not None and (seen.lora_name, seen.path) != (lora_request.lora_name, lora_request.path):
            raise ValueError(f"lora_int_id {lora_request.lora_int_id} already names adapter {seen.lora_name!r} "
                             f"at {seen.path!r}; each adapter needs its own id")
        clash = next((r for r in self._lora_requests.values() if r.lora_name == lora_request.lora_name
                      and r.lora_int_id != lora_request.lora_int_id), None)
        if clash is not None:
            raise ValueError(f"lora_name {lora_request.lora_name!r} is already adapter id {clash.lora_int_id}; "
                             f"the prefix cache keys blocks by name, so a name needs one adapter")
        self.lora_manager.ensure_registered(lora_request)  # loads now, so a bad folder fails here
        self._lora_requests[lora_request.lora_int_id] = lora_request

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (idempotent; a no-op at ``tensor_parallel_size=1``).
        Also runs at interpreter exit; after it, ``step()`` raises ``RuntimeError``."""
        if self.model_executor is not None:
            self.model_executor.shutdown()

    def _build_logits_processors(self, classes) -> list[LogitsProcessor]:
        """One instance of each class, built as upstream builds custom processors
        (``cls(vllm_config, device, is_pin_memory)``; here the engine stands in for the config).

        upstream: vllm/v1/sample/logits_processor/__init__.py:184 build_logitsprocs
        """
        if not isinstance(classes, list | tuple) or not all(
            isinstance(c, type) and issubclass(c, LogitsProcessor) for c in classes
        ):
            raise ValueError(f"logits_processors must be a list of LogitsProcessor subclasses "
                             f"(classes, not instances), got {classes!r:.80}")
        if classes and self.speculative_config is not None:
            raise ValueError("logits_processors must be empty with speculative_config "
                             "(mini_vllm's verify step does not run them)")
        self.logits_processor_classes = list(classes)
        return [cls(self, "cpu", False) for cls in classes]

    def _make_drafter(self, spec: SpeculativeConfig, seed: int, block_size: int):
        if spec.method == "ngram":
            return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max,
                                 spec.num_speculative_tokens, self.max_model_len)
        if spec.model == "toy":
            draft = ToyModel(seed=seed)
        else:
            from mini_vllm.models import get_model

            draft = get_model(spec.model, seed=seed)
        if draft.vocab_size != self.model.vocab_size:
            raise ValueError(f"model: the draft model's vocab_size ({draft.vocab_size}) must equal "
                             f"the target's ({self.model.vocab_size})")
        return DraftModelProposer(draft, spec.num_speculative_tokens, self.max_model_len, block_size)

    def _init_kv_cache(self, num_blocks: int, block_size: int, kv_cache_dtype: str) -> str:
        if kv_cache_dtype == "auto":  # the model interface's plain call, as before
            self.model.init_kv_cache(num_blocks, block_size)
            return kv_cache_dtype
        supported = getattr(self.model, "supported_kv_cache_dtypes", ("auto",))
        if kv_cache_dtype not in supported:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(supported)} for "
                             f"{type(self.model).__name__}, got {kv_cache_dtype!r}")
        self.model.init_kv_cache(num_blocks, block_size, kv_cache_dtype=kv_cache_dtype)
        return kv_cache_dtype

    def _select_attention_backend(self, choice: str | type, block_size: int) -> type | None:
        """Resolve ``attention_backend`` for this model; None for a model without attention."""
        if not hasattr(self.model, "set_attn_backend"):
            if choice is None or (isinstance(choice, str) and choice.lower() == "auto"):
                return None
            raise ValueError(f"attention_backend must be 'auto' for a model without attention "
                             f"layers ({type(self.model).__name__}), got {choice!r}")
        from mini_vllm.models.attention_backends import get_attn_backend

        backend_cls = get_attn_backend(self.model.config.head_dim, "float32", block_size,
                                       backend=choice, platform=self.model.attn_platform,
                                       kv_cache_dtype=self.kv_cache_dtype)
        self.model.set_attn_backend(backend_cls)
        return backend_cls

    def _configure_compilation(self, config, enforce_eager: bool, max_num_seqs: int,
                               max_num_batched_tokens: int):
        from mini_vllm.compilation import CompilationConfig, CompilationMode, CUDAGraphMode

        if not isinstance(enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {enforce_eager!r}")
        config = CompilationConfig.from_any(config)
        if enforce_eager:  # a copy: the caller's config object is left as it was
            config = replace(config, mode=CompilationMode.NONE, cudagraph_mode=CUDAGraphMode.NONE)
        if not hasattr(self.model, "configure_compilation"):
            if config.mode != CompilationMode.NONE or config.cudagraph_mode != CUDAGraphMode.NONE:
                raise ValueError(f"compilation_config applies to the torch model "
                                 f"(model_backend='torch'); {type(self.model).__name__} runs eagerly only")
            return config
        self.model.configure_compilation(config, max_num_seqs, max_num_batched_tokens)
        return config

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> str:
        """Queue one request; return its id. Rejects what could never finish.

        ``lora_request`` runs it with that adapter (needs ``enable_lora=True``).

        upstream: vllm/v1/engine/llm_engine.py:209 LLMEngine.add_request
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.n != 1:
            raise ValueError(f"n must be 1 for LLMEngine.add_request (LLM.generate fans out n > 1), got {params.n}")
        token_ids = self._tokenize(prompt)
        self._verify_phase09_params(params)
        for cls in self.logits_processor_classes:
            cls.validate_params(params)
        budget = self.max_model_len
        if len(token_ids) + params.max_tokens > budget:
            raise ValueError(
                f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = "
                f"{len(token_ids) + params.max_tokens} exceeds max_model_len = {budget}"
            )
        bs, usable = self.kv_cache_manager.block_size, self.kv_cache_manager.block_pool.num_blocks - 1
        # The last sampled token is never fed back, so it needs no KV slot.
        needed = -(-(len(token_ids) + params.max_tokens - 1) // bs)
        if needed > usable:
            raise ValueError(
                f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) needs {needed} "
                f"KV blocks of {bs} tokens, but the pool has only {usable} usable blocks "
                f"(num_blocks - 1); raise num_blocks or lower max_tokens"
            )
        request_id = f"req-{self._num_added}" if request_id is None else request_id
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be None or a non-empty str, got {request_id!r}")
        if request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        self._check_lora_request(lora_request)
        request = Request(
            request_id, token_ids, params, self.model.eos_token_id, time.time(), tokenizer=self.tokenizer,
            lora_request=lora_request,
        )
        request.metrics.arrival_step = self.num_steps
        seed = params.seed if params.seed is not None else (self.seed, self._num_added)
        self._generators[request_id] = np.random.default_rng(seed)
        self._num_added += 1
        self.scheduler.add_request(request)
        return request_id

    def _verify_phase09_params(self, params: SamplingParams) -> None:
        """What ``SamplingParams`` cannot check alone: the vocabulary and the engine's limits.

        upstream: vllm/sampling_params.py:665 SamplingParams.verify
        """
        vocab = self.model.vocab_size
        for name, ids in (("logit_bias", list(params.logit_bias or ())),
                          ("allowed_token_ids", params.allowed_token_ids or []),
                          ("bad_words", [t for w in params.bad_words or [] for t in w])):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise ValueError(f"{name} token ids must be in [0, {vocab}), got {bad[:5]}")
        if params.logprobs is not None:
            cap = vocab if self.max_logprobs == -1 else self.max_logprobs
            asked = vocab if params.logprobs == -1 else params.logprobs
            if asked > cap:
                raise ValueError(f"logprobs must be <= max_logprobs ({cap}), got {params.logprobs}")
        if params.prompt_logprobs is not None:
            cap = vocab if self.max_logprobs == -1 else self.max_logprobs
            asked = vocab if params.prompt_logprobs == -1 else params.prompt_logprobs
            if asked > cap:
                raise ValueError(f"prompt_logprobs must be <= max_logprobs ({cap}), got {params.prompt_logprobs}")
        if self.speculative_config is not None and (params.has_logits_processing or params.logprobs is not None
                                                    or params.prompt_logprobs is not None):
            raise ValueError("penalties, min_tokens, logit_bias, allowed_token_ids, bad_words, logprobs and "
                             "prompt_logprobs must be off with speculative_config (mini_vllm's verify step "
                             "ignores them)")

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            token_ids = list(prompt["prompt_token_ids"])
        else:
            raise ValueError(f"prompt must be a str or {{'prompt_token_ids': [...]}}, got {prompt!r:.60}")
        if not token_ids:
            raise ValueError("prompt is empty: a request needs at least one prompt token")
        vocab = self.model.vocab_size
        bad = [t for t in token_ids if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids must be integers in [0, {vocab}), got {bad[:5]}")
        return [int(t) for t in token_ids]

    def step(self) -> list[Request]:
        """One iteration: schedule, run, sample, update. Returns the requests finished now.

        upstream: vllm/v1/engine/core.py:428 EngineCore.step
        """
        self.num_steps += 1
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        schedule_time = time.perf_counter() - t0
        pool = self.kv_cache_manager.block_pool
        blocks_used = pool.num_blocks - 1 - pool.get_num_free_blocks()  # the step's peak
        if out.total_num_scheduled_tokens == 0 and self.scheduler.has_unfinished_requests():
            raise RuntimeError("the scheduler scheduled nothing while requests wait: this is a bug")

        sampled: dict[str, int | list[int]] = {}
        num_decode = kv_rows_read = padded = num_collectives = 0
        spec_stats = None
        graph_mode = "NONE"
        expert_loads = ()
        active_loras: tuple[int, ...] = ()
        backend = getattr(self.model, "attn_backend", None)
        if out.total_num_scheduled_tokens:
            reqs = out.scheduled_requests
            if backend is not None:
                backend.kv_rows_read = 0
            model_input = prepare_inputs(out, self.kv_cache_manager)
            if self.lora_manager is not None:
                active_loras = self._set_lora_indices(reqs, model_input)
            prompt_rows = self._prompt_logprob_rows(out, model_input)
            if prompt_rows:  # extra logits rows, after the usual ones
                model_input.logits_indices = np.concatenate(
                    [model_input.logits_indices, *(rows for _, rows, _ in prompt_rows)])
            logits = self.model.execute(model_input)
            if prompt_rows:
                self._record_prompt_logprobs(prompt_rows, logits[len(logits) - sum(len(r) for _, r, _ in prompt_rows):])
                logits = logits[: len(logits) - sum(len(r) for _, r, _ in prompt_rows)]
            if backend is not None:
                kv_rows_read = backend.kv_rows_read
            padded = getattr(self.model, "last_padded_tokens", 0)
            num_collectives = getattr(self.model, "last_num_collectives", 0)
            loads = getattr(self.model, "last_expert_loads", None)
            if loads is not None:
                expert_loads = tuple(tuple(row) for row in loads.tolist())
            graph_mode = getattr(getattr(self.model, "last_cudagraph_mode", None), "name", "NONE")
            meta = spec_decode_metadata(out)
            if meta is not None:
                spec_stats = SpecDecodingStats.new(self.speculative_config.num_speculative_tokens)
            plain_rows: list[int] = []  # logits rows sampled without drafts, in batch order
            plain_reqs: list[Request] = []
            for row, req in enumerate(reqs):
                n = out.num_scheduled_tokens[req.request_id]
                if req.num_output_tokens and req.num_computed_tokens == req.num_tokens - 1:
                    num_decode += n  # one token, plus its drafts
                if not Scheduler.needs_sample(req, n):
                    continue
                gen = self._generators[req.request_id]
                drafts = out.scheduled_spec_decode_tokens.get(req.request_id)
                if not drafts:
                    plain_rows.append(row if meta is None else meta.bonus_logits_indices[row])
                    plain_reqs.append(req)
                    continue
                bonus = meta.bonus_logits_indices[row]
                tokens = self.rejection_sampler(drafts, logits[bonus - len(drafts): bonus + 1],
                                                req.sampling_params, gen)
                spec_stats.observe_draft(len(drafts), len(tokens) - 1)
                sampled[req.request_id] = tokens
            if self.persistent_batch is not None:
                self._sample_persistent_batch(out, logits, sampled)
            elif plain_reqs:
                self._sample_batch(logits[plain_rows], plain_reqs, sampled)
        finished = self.scheduler.update_from_output(out, sampled)
        if self.drafter is not None:
            self._propose_drafts(out, sampled)
        if spec_stats is not None:
            self.spec_decoding_stats.add(spec_stats)

        for req in out.scheduled_requests:
            if req.request_id in sampled:
                req.metrics.record_token(self.num_steps)
            if req.num_preemptions == 0 and req.request_id in out.num_cached_tokens:
                req.metrics.num_cached_tokens = out.num_cached_tokens[req.request_id]
        for req in finished:
            self._finish(req)
        self.stats.append(StepStats(
            step=self.num_steps,
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            num_prefill_tokens=out.total_num_scheduled_tokens - num_decode,
            num_decode_tokens=num_decode,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            blocks_used=blocks_used,
            num_cached_tokens=sum(out.num_cached_tokens.values()),
            preempted=list(out.preempted_req_ids),
            finished=[r.request_id for r in finished],
            schedule_time_s=schedule_time,
            kv_rows_read=kv_rows_read,
            padded_tokens=padded,
            cudagraph_mode=graph_mode,
            expert_loads=expert_loads,
            spec_decoding=spec_stats,
            num_collectives=num_collectives,
            active_loras=active_loras,
        ))
        return finished

    def _set_lora_indices(self, reqs: list[Request], model_input) -> tuple[int, ...]:
        """Seat the batch's adapters in slots and give every row its slot (-1: base model).

        upstream: vllm/v1/worker/lora_model_runner_mixin.py:48 _set_active_loras
        """
        slots = self.lora_manager.set_active_adapters([r.lora_request for r in reqs])
        counts = np.diff(model_input.query_start_loc)
        model_input.token_lora_indices = np.repeat(slots, counts)
        self.lora_manager.punica_wrapper.update_metadata(model_input.token_lora_indices)
        return tuple(sorted({r.lora_request.lora_int_id for r in reqs if r.lora_request is not None}))

    def _sample_batch(self, logits: np.ndarray, reqs: list[Request], sampled: dict,
                      take: list[bool] | None = None) -> None:
        """One ``Sampler.forward`` over the rows that sample one token each; logprobs
        go onto their requests here (the scheduler appends the tokens).

        upstream: vllm/v1/worker/gpu_input_batch.py:831 _make_sampling_metadata
        """
        metadata = SamplingMetadata(
            params=[r.sampling_params for r in reqs],
            generators=[self._generators[r.request_id] for r in reqs],
            prompt_token_ids=[r.prompt_token_ids for r in reqs],
            output_token_ids=[r.output_token_ids for r in reqs],
            stop_token_ids=[() if r.eos_token_id is None else (r.eos_token_id,) for r in reqs],
            sample_rows=take or [],
            logitsprocs=self.logits_processors,
        )
        result = self.sampler.forward(logits, metadata)
        for req, token, position in zip(reqs, result.sampled, result.logprobs, strict=True):
            if token is None:
                continue
            sampled[req.request_id] = token
            if position is not None and not req.is_finished():
                req.append_logprobs(position)

    def _sample_persistent_batch(self, out, logits: np.ndarray, sampled: dict) -> None:
        """With custom logits processors: update the persistent batch, tell every processor,
        then one ``Sampler.forward`` over all scheduled requests in batch order (the rows of
        unfinished prefill chunks are processed, not drawn).

        upstream: vllm/v1/worker/gpu_model_runner.py:1116 GPUModelRunner._update_states
        upstream: vllm/v1/worker/gpu_input_batch.py:811 InputBatch.refresh_metadata
        """
        reqs = out.scheduled_requests
        update = self.persistent_batch.update(reqs)
        for lp in self.logits_processors:
            lp.update_state(update)
        row_of = {r.request_id: i for i, r in enumerate(reqs)}
        ordered = [reqs[row_of[rid]] for rid in self.persistent_batch.req_ids]
        take = [Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id]) for r in ordered]
        self._sample_batch(logits[[row_of[r.request_id] for r in ordered]], ordered, sampled, take)

    def _prompt_logprob_rows(self, out, model_input) -> list[tuple[Request, np.ndarray, int]]:
        """For each scheduled request that wants prompt logprobs, the rows of this step's
        chunk whose logits predict a prompt token, and the first such position."""
        found = []
        qsl = model_input.query_start_loc
        for b, req in enumerate(out.scheduled_requests):
            if req.sampling_params.prompt_logprobs is None:
                continue
            start = req.num_computed_tokens  # the chunk's first position
            stop = min(start + out.num_scheduled_tokens[req.request_id], req.num_prompt_tokens - 1)
            if stop > start:  # position p predicts prompt token p + 1
                found.append((req, np.arange(qsl[b], qsl[b] + stop - start, dtype=np.int64), start))
        return found

    def _record_prompt_logprobs(self, prompt_rows, logits: np.ndarray) -> None:
        """Raw logprobs of each prompt token given the ones before it (upstream's
        ``prompt_logprobs``: the first prompt token has none).

        upstream: vllm/v1/worker/gpu_model_runner.py:5338 _get_prompt_logprobs_dict
        """
        at = 0
        vocab = logits.shape[1]
        for req, rows, start in prompt_rows:
            logprobs = compute_logprobs(logits[at: at + len(rows)])
            at += len(rows)
            k = req.sampling_params.prompt_logprobs
            if req.prompt_logprobs is None or start == 0:
                req.prompt_logprobs = [None]  # a preempted request recomputes from the start
            del req.prompt_logprobs[start + 1:]
            for j in range(len(rows)):
                token = req.prompt_token_ids[start + j + 1]
                req.prompt_logprobs.append(gather_logprobs(logprobs[j], vocab if k == -1 else k, token))

    def _propose_drafts(self, out, sampled: dict) -> None:
        """Draft the next step's tokens for every request that just sampled, capped so
        that drafts plus the bonus token never pass ``max_tokens``.

        upstream: vllm/v1/spec_decode/ngram_proposer.py:131 propose
        """
        for req in out.scheduled_requests:
            room = req.max_tokens - req.num_output_tokens - 1
            if req.request_id in sampled and not req.is_finished() and room > 0:
                req.spec_token_ids = self.drafter.propose(req.all_token_ids, room)

    def _finish(self, request: Request) -> None:
        request.metrics.finished_step = self.num_steps
        self._generators.pop(request.request_id, None)

    def abort_request(self, request_id: str) -> None:
        """Finish a waiting or running request now and free its blocks; unknown ids are ignored.

        upstream: vllm/v1/engine/llm_engine.py:203 LLMEngine.abort_request
        """
        request = self.scheduler.requests.get(request_id)
        if request is not None:
            self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
            self._finish(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def _add_all(self, prompts: list[Prompt], params: list[SamplingParams],
                 lora_requests: list | None = None) -> list[str]:
        """``add_request`` for each pair, all or nothing: if one is rejected, the
        ones already added are withdrawn, so the engine is left as it was.

        upstream: vllm/entrypoints/offline_utils.py:523 _render_and_add_requests
        """
        ids: list[str] = []
        loras = [None] * len(prompts) if lora_requests is None else lora_requests
        try:
            for prompt, sp, lora in zip(prompts, params, loras, strict=True):
                ids.append(self.add_request(prompt, sp, lora_request=lora))
        except Exception:
            for rid in ids:
                self.abort_request(rid)
            raise
        return ids

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[Request]:
        """Add every prompt, step until they all finish, return them in prompt order."""
        prompts = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"params: got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = self._add_all(prompts, params_list, _lora_list(lora_request, len(prompts)))
        done: dict[str, Request] = {}
        while len(done) < len(ids):
            for req in self.step():
                done[req.request_id] = req
        return [done[i] for i in ids]


@dataclass(slots=True)
class CompletionOutput:
    """upstream: vllm/outputs.py:22 CompletionOutput"""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    metrics: RequestMetrics | None = None
    # Phase 09: set when SamplingParams.logprobs is (upstream's fields of the same names).
    cumulative_logprob: float | None = None
    logprobs: list | None = None


@dataclass(slots=True)
class RequestOutput:
    """upstream: vllm/outputs.py:85 RequestOutput. ``metrics`` are those of ``outputs[0]``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    prompt_logprobs: list | None = None  # Phase 09: set when SamplingParams.prompt_logprobs is
    lora_request: LoRARequest | None = None  # Phase 11: the adapter it ran with


def _lora_list(lora_request, num_prompts: int) -> list:
    """One LoRARequest (or None) per prompt, from one for all or a list (upstream's two forms)."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if not isinstance(lora_request, list | tuple) or len(lora_request) != num_prompts:
        raise ValueError(f"lora_request must be a LoRARequest, None, or a list of {num_prompts} "
                         f"(one per prompt, None for the base model), got {lora_request!r:.80}")
    return list(lora_request)


class LLM:
    """The offline front door: ``LLM(model, **engine_kwargs).generate(prompts, params)``.

    ``n > 1`` becomes n child requests; with a seed, child i uses ``seed + i``
    (upstream: vllm/v1/engine/parallel_sampling.py:80 child_sampling_params.seed).
    """

    def __init__(self, model: str | object = "toy", **engine_kwargs) -> None:
        self.llm_engine = LLMEngine(model, **engine_kwargs)

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        prompts = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        loras = _lora_list(lora_request, len(prompts))
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if not isinstance(sampling_params, list) or len(sampling_params) != len(prompts) or not all(
            isinstance(sp, SamplingParams) for sp in sampling_params
        ):
            raise ValueError(f"sampling_params must be a SamplingParams or a list of {len(prompts)}, "
                             f"one per prompt, got {sampling_params!r:.80}")
        # Child i of a prompt with n > 1 is a request of its own (seed + i).
        flat = [(prompt, replace(sp, n=1, seed=None if sp.seed is None else sp.seed + i), lora)
                for prompt, sp, lora in zip(prompts, sampling_params, loras, strict=True) for i in range(sp.n)]
        new_ids = iter(engine._add_all([p for p, _, _ in flat], [sp for _, sp, _ in flat],
                                       [lora for _, _, lora in flat]))
        children = [[next(new_ids) for _ in range(sp.n)] for sp in sampling_params]
        done: dict[str, Request] = {}
        total = sum(map(len, children))
        while len(done) < total:
            for req in engine.step():
                done[req.request_id] = req
        results = []
        for prompt, ids, lora in zip(prompts, children, loras, strict=True):
            reqs = [done[i] for i in ids]
            outputs = [
                CompletionOutput(i, r.output_text(), list(r.output_token_ids), r.finish_reason,
                                 r.stop_reason, r.metrics, r.cumulative_logprob, r.logprobs)
                for i, r in enumerate(reqs)
            ]
            results.append(RequestOutput(
                request_id=ids[0],
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=list(reqs[0].prompt_token_ids),
                outputs=outputs,
                metrics=reqs[0].metrics,
                num_cached_tokens=reqs[0].metrics.num_cached_tokens,
                num_preemptions=sum(r.num_preemptions for r in reqs),
                prompt_logprobs=reqs[0].prompt_logprobs,
                lora_request=lora,
            ))
        return results

    def beam_search(self, prompts: Prompt | list[Prompt], params) -> list:
        """Beam search, upstream's offline loop over this engine (``mini_vllm.beam_search``).

        upstream: vllm/entrypoints/generate/beam_search/offline.py:27 beam_search
        """
        from mini_vllm.beam_search import beam_search

        prompts = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        return beam_search(self.llm_engine, prompts, params)
