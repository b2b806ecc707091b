"""Lab 04-05 — a streaming attention backend inside mini_vllm (your work).

Labs 01 and 03 built two halves of one kernel: the online-softmax recurrence
that folds a paged cache in block by block, and the varlen view of a step in
which prefill chunks and decodes are packed back to back, each with its causal
diagonal in the bottom-right corner. Here they become a *backend*: a class
the engine can choose by its declarations and then call once per layer per
step, exactly as vLLM calls ``FlashAttentionImpl.forward``.

A backend is two things, and you write both:

* **Declarations** (class attributes and class methods) that the selector reads
  before any request runs: ``name``, ``platforms``, ``supported_dtypes``,
  ``supports_head_size``, ``supports_block_size``. The inherited
  ``validate_configuration`` turns them into upstream's reason strings, and an
  explicit choice that fails is an error at engine construction, never a
  silent fallback.
* **A kernel**, ``forward(q, k_cache, v_cache, model_input, scale)``: every
  query row of the step, read straight from the block tables, one block at a
  time, never gathered into a padded array, never written. It also keeps a
  traffic counter, ``kv_rows_read``: whole blocks, because a block is what a
  paged kernel loads.

* ``attend_request`` — one request's query rows against its own blocks.
* ``OnlineSoftmaxBackend`` — the declarations and ``forward``.
* ``check_forward_inputs`` (given) — the shape checks, with errors that name
  the parameter.

How the engine uses it::

    engine = LLMEngine("tiny-random", attention_backend=OnlineSoftmaxBackend)
    engine.model.attn_backend          # the one instance every layer calls
    engine.stats[i].kv_rows_read       # its counter after step i (reset per step)

upstream: vllm/v1/attention/backend.py:55 AttentionBackend
upstream: vllm/v1/attention/backends/flash_attn.py:173 supports_head_size
upstream: vllm/v1/attention/backends/flash_attn.py:667 FlashAttentionImpl.forward
upstream: vllm/v1/attention/ops/triton_unified_attention.py:179 kernel_unified_attention
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from mini_vllm.model_input import ModelInput
from mini_vllm.models.attention_backends import AttentionBackend

# FlashAttention's head-size rule at the pin: a multiple of 8, at most 256
# (512 only with FA4). This backend declares the same range; see
# OnlineSoftmaxBackend.supports_head_size for why.
HEAD_SIZE_MULTIPLE = 8
MAX_HEAD_SIZE = 256


def check_forward_inputs(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                         model_input: ModelInput) -> None:
    """Given. Refuse inputs ``forward`` cannot serve, naming the parameter.

    Raises ValueError naming ``q`` (not ``[T, num_heads, head_dim]``, a row
    count other than ``model_input.num_tokens``, or a dtype other than the
    caches'), ``k_cache``/``v_cache`` (not 4-D, or shapes that differ),
    ``head_dim`` (q's and the cache's differ), ``num_kv_heads`` (does not divide
    ``num_heads``) and ``block_size`` (the cache's and ``model_input``'s differ).
    """
    if k_cache.ndim != 4:
        raise ValueError("k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {k_cache.shape}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {k_cache.shape}, got {v_cache.shape}")
    if q.ndim != 3 or q.shape[0] != model_input.num_tokens:
        raise ValueError(f"q must be [num_tokens={model_input.num_tokens}, num_heads, head_dim], "
                         f"got shape {q.shape}")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, "
                         f"{k_cache.dtype} and {v_cache.dtype}")
    num_heads, head_dim = q.shape[1:]
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if head_dim != cache_head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) must equal the cache's ({cache_head_dim})")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
    if block_size != model_input.block_size:
        raise ValueError(f"block_size of the cache ({block_size}) must equal "
                         f"model_input.block_size ({model_input.block_size})")


def attend_request(q_rows: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                   block_table_row: np.ndarray, seq_len: int, scale: float) -> np.ndarray:
    """One request's query rows against its own keys, streamed block by block.

    q_rows: ``[q_len, num_heads, head_dim]`` with ``1 <= q_len <= seq_len``: the
    request's last ``q_len`` positions, so row ``i`` sits at position
    ``seq_len - q_len + i`` and sees keys ``0 ..`` that position (the
    bottom-right diagonal). Caches ``[num_blocks, block_size, num_kv_heads,
    head_dim]``; key ``j`` is row ``j % block_size`` of physical block
    ``block_table_row[j // block_size]``. Query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)``; scores are ``q . k * scale``.

    Reads blocks ``block_table_row[0 .. ceil(seq_len / block_size) - 1]`` in
    order, each once, and from the last one only its first
    ``seq_len - (ceil(seq_len / block_size) - 1) * block_size`` rows: no slot
    at or past ``seq_len`` ever becomes a score, whatever it holds (NaN
    included). Keeps lab 01's state (running max ``m``, denominator ``l``,
    unnormalized ``acc``) per head and query row, rescaling ``l`` and ``acc``
    by ``exp(m - m_new)`` whenever a block raises the max; divides once, at
    the end. Computes in ``q_rows.dtype`` and returns
    ``[q_len, num_heads, head_dim]`` in that dtype. Writes nothing.

    upstream: vllm/v1/attention/ops/triton_unified_attention.py:401-403 physical_block_idx
    upstream: vllm/v1/attention/ops/triton_attention_helpers.py:361 softmax_step
    """
    raise NotImplementedError("attend_request: lab 01's state over lab 03's rows, one block per step")


class OnlineSoftmaxBackend(AttentionBackend):
    """Streaming paged attention for a mixed batch, as a mini_vllm backend.

    Declarations (read by ``get_attn_backend`` through the inherited
    ``validate_configuration``):

    * ``name = "NUMPY_FLASH_LAB"``: not a registry name, so the engine can
      only get it as a class (``attention_backend=OnlineSoftmaxBackend``);
    * ``platforms = ("numpy",)``: it serves the numpy transformer;
    * ``supported_dtypes = ("float32", "float64")``: the two it is tested in;
      it computes in the dtype of ``q``.

    The instance carries one counter, ``kv_rows_read`` (0 when made): the
    engine makes one instance per model, every layer calls the same
    ``forward``, and the engine zeroes the counter before each step and
    reads it after, so a step reports all of its layers.

    upstream: vllm/v1/attention/backend.py:55 AttentionBackend
    """

    # Set name and supported_dtypes as the class docstring says; these placeholders are wrong.
    name: ClassVar[str] = ""
    platforms: ClassVar[tuple[str, ...]] = ("numpy",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        """True iff ``head_size`` is a positive multiple of 8, at most 256.

        The numpy kernel would run any size. The declaration copies
        FlashAttention's (``head_size % 8 == 0`` and ``<= 256`` at the pin), so
        a model whose head size the GPU kernel would refuse is refused here
        too, at engine construction: tiny-random's 16 and SmolLM2's 64 pass,
        12 or 80+4 do not.

        upstream: vllm/v1/attention/backends/flash_attn.py:173 supports_head_size
        """
        raise NotImplementedError("supports_head_size: FlashAttention's rule, with the constants above")

    @classmethod
    def supports_block_size(cls, block_size: int) -> bool:
        """True iff ``block_size >= 1``: the kernel walks whole blocks of any size.

        upstream: vllm/v1/attention/backend.py:175 supports_block_size
        """
        raise NotImplementedError("supports_block_size: which block sizes can a block walk serve?")

    def forward(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                model_input: ModelInput, scale: float) -> np.ndarray:
        """Attention for every query row of one step, one layer; the cache is only read.

        q: ``[T, num_heads, head_dim]``, request ``b`` owning rows
        ``model_input.query_start_loc[b] : query_start_loc[b + 1]``; caches one
        layer's ``[num_blocks, block_size, num_kv_heads, head_dim]``, already
        holding this step's K/V; ``model_input.seq_lens[b]`` keys per request
        and ``model_input.block_tables[b]`` its physical blocks. Each request is
        served by ``attend_request``; a request that owns no rows (a padding
        entry) is skipped and reads nothing. Returns ``[T, num_heads,
        head_dim]`` in ``q``'s dtype.

        Adds to ``self.kv_rows_read`` (never resets it) exactly
        ``ceil(seq_len / block_size) * block_size`` per request with rows: the
        whole blocks this call loads, in this one layer.

        Raises the ValueErrors of ``check_forward_inputs``.
        """
        raise NotImplementedError("forward: check, then attend_request per request with rows; count whole blocks")


if __name__ == "__main__":
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    prompts = [{"prompt_token_ids": list(range(30, 43))}, {"prompt_token_ids": [7, 8, 9]}]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    tokens = {}
    for backend in ("auto", OnlineSoftmaxBackend):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=32, attention_backend=backend,
                           max_num_batched_tokens=8)
        tokens[engine.attention_backend.name] = [r.output_token_ids for r in engine.generate(prompts, params)]
        rows = [s.kv_rows_read for s in engine.stats]
        print(f"{engine.attention_backend.name:<16} kv_rows_read per step: {rows}")
    print("same greedy tokens:", tokens["NUMPY_GATHER"] == tokens["NUMPY_FLASH_LAB"])
