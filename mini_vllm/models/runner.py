"""Drive a model without the engine: hand-built ModelInputs and a plain greedy loop.

The engine's scheduler and ``model_runner.prepare_inputs`` normally fill
``ModelInput``. To test the data plane alone (and in labs that rebuild
attention), ``make_model_input`` builds one from a few plain facts per
request, and ``greedy_generate`` runs prompts to completion with every
request's blocks taken from a shuffled pool, so a kernel that ignored the
block table would fail.

upstream: vllm/v1/worker/gpu_model_runner.py:1863 GPUModelRunner._prepare_inputs
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mini_vllm.model_input import ModelInput


@dataclass(slots=True)
class Chunk:
    """Request rows in one step: ``token_ids`` placed at positions ``start .. start+len-1``."""

    token_ids: list[int]
    start: int
    block_table: list[int] = field(default_factory=list)


def make_model_input(chunks: list[Chunk], block_size: int) -> ModelInput:
    """Flatten several requests' chunks into one step's arrays (see model_input.py)."""
    if not chunks:
        raise ValueError("chunks must hold at least one Chunk")
    token_ids, positions, slots, qsl, seq_lens, logits_indices = [], [], [], [0], [], []
    width = max(len(c.block_table) for c in chunks)
    tables = np.zeros((len(chunks), width), dtype=np.int64)
    for b, c in enumerate(chunks):
        if not c.token_ids:
            raise ValueError(f"chunk {b}: token_ids must not be empty")
        end = c.start + len(c.token_ids)
        if len(c.block_table) * block_size < end:
            raise ValueError(f"chunk {b}: block_table holds {len(c.block_table)} blocks, "
                             f"too few for {end} tokens at block_size {block_size}")
        tables[b, :len(c.block_table)] = c.block_table
        for pos in range(c.start, end):
            positions.append(pos)
            slots.append(c.block_table[pos // block_size] * block_size + pos % block_size)
        token_ids += c.token_ids
        qsl.append(len(token_ids))
        seq_lens.append(end)
        logits_indices.append(len(token_ids) - 1)

    def arr(x):
        return np.asarray(x, dtype=np.int64)

    return ModelInput(token_ids=arr(token_ids), positions=arr(positions),
                      query_start_loc=arr(qsl), seq_lens=arr(seq_lens), block_tables=tables,
                      slot_mapping=arr(slots), logits_indices=arr(logits_indices),
                      block_size=block_size)


def greedy_generate(model, prompts: list[list[int]], max_new_tokens: int, block_size: int = 4,
                    chunk_size: int | None = None, seed: int = 0,
                    return_logits: bool = False):
    """Greedy-decode every prompt together: one step holds a chunk or a decode of each request.

    ``chunk_size`` caps the prompt tokens a request prefills per step (None:
    the whole prompt at once). No EOS check: exactly ``max_new_tokens`` each.
    Returns the new tokens per prompt, and with ``return_logits`` also the
    logits that produced the first new token of each prompt.
    """
    for name, value, low in (("max_new_tokens", max_new_tokens, 1), ("block_size", block_size, 1),
                             ("chunk_size", 1 if chunk_size is None else chunk_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not prompts or not all(prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    rng = np.random.default_rng(seed)
    need = [-(-(len(p) + max_new_tokens) // block_size) for p in prompts]
    pool = rng.permutation(np.arange(1, sum(need) + 1)).tolist()  # block 0 stays null
    model.init_kv_cache(sum(need) + 1, block_size)
    tables, start = [], 0
    for n in need:
        tables.append(pool[start:start + n])
        start += n
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)  # tokens of seqs[i] whose K/V are in the cache
    out: list[list[int]] = [[] for _ in prompts]
    first_logits: list[np.ndarray | None] = [None] * len(prompts)
    while any(len(o) < max_new_tokens for o in out):
        chunks, who = [], []
        for i, s in enumerate(seqs):
            if len(out[i]) >= max_new_tokens:
                continue
            todo = s[done[i]:]
            if chunk_size is not None:
                todo = todo[:chunk_size]
            chunks.append(Chunk(todo, done[i], tables[i]))
            who.append(i)
        logits = model.execute(make_model_input(chunks, block_size))
        for row, (i, c) in enumerate(zip(who, chunks, strict=True)):
            done[i] += len(c.token_ids)
            if done[i] == len(seqs[i]):  # the chunk reached the end: sample
                if first_logits[i] is None:
                    first_logits[i] = logits[row].copy()
                tok = int(np.argmax(logits[row]))
                out[i].append(tok)
                seqs[i].append(tok)
    return (out, first_logits) if return_logits else out
