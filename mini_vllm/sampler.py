"""Sampler: logits -> token ids, one row (``sample``) or a batch (``forward``).

Order, the same as vLLM v1's ``Sampler.sample`` (its class docstring lists
it as steps 7a-7e, cited first below): greedy when
``temperature == 0``; otherwise divide by the temperature, then min-p, then
top-k, then top-p, then softmax and one draw from what is left.

- Min-p looks at the softmax of the temperature-scaled logits (the full
  distribution, before any other filter) and sets to -inf every logit whose
  probability is below ``min_p`` x the largest probability. It can never remove
  the most likely token, so it cannot change a greedy pick: upstream calls it
  an argmax-invariant logits processor and runs it before top-k/top-p.
- Top-k keeps every token tied with the k-th largest logit.
- Top-p keeps the smallest set of most likely tokens whose mass reaches
  ``top_p`` (always at least one). It measures mass after min-p has removed
  the tail, so min-p then top-p can keep fewer tokens than top-p then min-p.

Each request draws from its own ``np.random.Generator`` (seeded from
``SamplingParams.seed``), so its tokens never depend on its batch neighbours.

Differences from upstream: one row at a time in float64 (upstream samples
the whole batch in float32 on the GPU); the draw is ``Generator.choice`` where
upstream takes ``argmax(probs / q)`` with ``q`` exponential noise, which picks
from the same distribution but consumes a different random stream, so a seed
gives different tokens in the two engines; among logits tied at the top-p
boundary, which one survives may differ (upstream's sort is not stable).

Phase 09: ``Sampler.forward(logits [B, V], SamplingMetadata)`` runs the
steps upstream's ``Sampler.forward`` runs before the draw, in its order:

1. raw logprobs (log-softmax of the model's logits, before anything below)
   when ``logprobs`` is asked for (upstream's default ``raw_logprobs``);
2. allowed token ids (every other token -> -inf);
3. bad words (the last token of a sequence whose prefix ends the OUTPUT ->
   -inf; a one-token sequence is always banned);
4. min_tokens (EOS -> -inf while fewer than ``min_tokens`` outputs), then
   logit bias (added);
5. penalties: repetition over prompt AND output tokens (positive logits
   divided by it, the others multiplied), then frequency x count and
   presence x [count > 0] over OUTPUT tokens only (OpenAI's definition);
6. ``sample`` on each processed row: greedy, or temperature, min-p, top-k,
   top-p and a draw, as above;
7. the top ``logprobs`` raw logprobs plus the sampled token's, with ranks.

Custom logits processors (``SamplingMetadata.logitsprocs``, from
``LLMEngine(logits_processors=...)``) run on the whole batch: the
non-argmax-invariant ones between steps 4 and 5, the argmax-invariant ones
on the temperature-scaled logits of the non-greedy rows, before min-p.

Steps 2-5 work on the rows that use a knob as one [b, V] float64 array;
a row that uses none goes to ``sample`` untouched, so with every knob at its
default ``forward`` is ``sample`` row by row, bit for bit. Upstream runs
2-5 in float32 and keeps the sampled token's logprob first in its tensors;
here float64, and the output is already vLLM's per-position dict.

upstream: vllm/v1/sample/sampler.py:20 Sampler
upstream: vllm/v1/sample/sampler.py:67 Sampler.forward
upstream: vllm/v1/sample/sampler.py:366 Sampler.apply_logits_processors
upstream: vllm/model_executor/layers/utils.py:51 apply_penalties
upstream: vllm/_custom_ops.py:360 apply_repetition_penalties_torch
upstream: vllm/v1/sample/ops/bad_words.py:9 _apply_bad_words_single_batch
upstream: vllm/v1/sample/logits_processor/builtin.py:118 LogitBiasLogitsProcessor
upstream: vllm/v1/sample/logits_processor/builtin.py:167 MinTokensLogitsProcessor
upstream: vllm/v1/sample/sampler.py:304 Sampler.gather_logprobs
upstream: vllm/v1/sample/ops/logprobs.py:11 batched_count_greater_than
upstream: vllm/logprobs.py:175 append_logprobs_for_next_position
upstream: vllm/v1/sample/sampler.py:41-48 min_p
upstream: vllm/v1/sample/sampler.py:238 Sampler.sample
upstream: vllm/v1/sample/sampler.py:223 Sampler.apply_temperature
upstream: vllm/v1/sample/sampler.py:277-278 argmax_invariant
upstream: vllm/v1/sample/logits_processor/builtin.py:101 MinPLogitsProcessor.apply
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:328 apply_top_k_top_p_pytorch
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:395 random_sample
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from mini_vllm.sampling_params import SamplingParams


@dataclass(slots=True)
class Logprob:
    """One token's log probability and its rank in the vocabulary (1 = most likely).

    upstream: vllm/logprobs.py:13 Logprob
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(slots=True)
class SamplingMetadata:
    """Everything ``Sampler.forward`` needs about the B rows of one step.

    One entry per row in every list. ``stop_token_ids[i]`` are the ids that
    ``min_tokens`` holds back (mini_vllm: the model's EOS, even with
    ``ignore_eos``, as upstream adds EOS to ``_all_stop_token_ids``).

    upstream: vllm/v1/sample/metadata.py:15 SamplingMetadata
    """

    params: list[SamplingParams]
    generators: list[np.random.Generator | None]
    prompt_token_ids: list[list[int]] = field(default_factory=list)
    output_token_ids: list[list[int]] = field(default_factory=list)
    stop_token_ids: list[tuple[int, ...]] = field(default_factory=list)
    sample_rows: list[bool] = field(default_factory=list)  # empty: every row draws a token
    logitsprocs: Sequence = ()  # custom LogitsProcessor instances (mini_vllm.logits_processor)

    def __post_init__(self) -> None:
        b = len(self.params)
        if not self.sample_rows:
            self.sample_rows = [True] * b
        if len(self.sample_rows) != b:
            raise ValueError(f"sample_rows must have one entry per row ({b}), got {len(self.sample_rows)}")
        for name in ("prompt_token_ids", "output_token_ids", "stop_token_ids"):
            if not getattr(self, name):
                setattr(self, name, [[] if name != "stop_token_ids" else () for _ in range(b)])
        for name in ("generators", "prompt_token_ids", "output_token_ids", "stop_token_ids"):
            if len(getattr(self, name)) != b:
                raise ValueError(f"{name} must have one entry per row ({b}), got {len(getattr(self, name))}")


@dataclass(slots=True)
class SamplerOutput:
    """``sampled[i]``: row i's token. ``logprobs[i]``: ``None`` (not asked for)
    or vLLM's dict for the position, token id -> ``Logprob``: the sampled
    token first, then the top ``logprobs`` (one entry fewer when the sampled
    token is among them)."""

    sampled: list[int]
    logprobs: list[dict[int, Logprob] | None]


class Sampler:
    def forward(self, logits: np.ndarray, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token for each of the B rows of ``logits`` [B, V] (see the module doc).

        Rows whose ``metadata.sample_rows`` entry is False (a prefill chunk that
        does not finish its prompt) are processed but not drawn: their
        ``sampled`` entry is None and their generator is not touched.
        """
        logits = np.asarray(logits)
        if logits.ndim != 2 or logits.shape[0] != len(metadata.params):
            raise ValueError(f"logits must be [B, vocab] with B = {len(metadata.params)} rows "
                             f"(one per SamplingParams), got shape {logits.shape}")
        params, take = metadata.params, metadata.sample_rows
        want_lp = [i for i, p in enumerate(params) if p.logprobs is not None and take[i]]
        raw = compute_logprobs(logits[want_lp]) if want_lp else None
        procs = metadata.logitsprocs
        invariant = [lp for lp in procs if lp.is_argmax_invariant()]
        if procs:  # custom processors see the whole batch, so every row is processed
            rows = list(range(len(params)))
            processed = self.apply_logits_processors(logits, metadata, rows,
                                                     [lp for lp in procs if not lp.is_argmax_invariant()])
        else:
            rows = [i for i, p in enumerate(params) if p.has_logits_processing]
            processed = self.apply_logits_processors(logits[rows], metadata, rows) if rows else None
        row_logits = dict(zip(rows, processed, strict=True)) if rows else {}
        if invariant:  # after temperature; a greedy row was decided before them
            row_params = {i: p for i, p in enumerate(params) if not p.greedy}
            scaled = np.stack([row_logits[i] / params[i].temperature if i in row_params else row_logits[i]
                               for i in range(len(params))])
            for lp in invariant:
                scaled = lp.apply(scaled)
            for i in row_params:
                row_logits[i] = scaled[i]
                row_params[i] = replace(params[i], temperature=1.0)  # already divided
        else:
            row_params = {}
        sampled = [
            self.sample(row_logits.get(i, logits[i]), row_params.get(i, p), metadata.generators[i]) if take[i]
            else None
            for i, p in enumerate(params)
        ]
        out: list[dict[int, Logprob] | None] = [None] * len(sampled)
        for j, i in enumerate(want_lp):
            k = params[i].logprobs
            out[i] = gather_logprobs(raw[j], logits.shape[1] if k == -1 else k, sampled[i])
        return SamplerOutput(sampled, out)

    @staticmethod
    def apply_logits_processors(logits: np.ndarray, metadata: SamplingMetadata,
                                rows: list[int], non_argmax_invariant: Sequence = ()) -> np.ndarray:
        """Steps 2-5 on ``logits`` [b, V], whose row j belongs to batch row ``rows[j]``;
        custom ``non_argmax_invariant`` processors (given only when ``rows`` is the
        whole batch) run after logit bias and before the penalties, as upstream's.
        Returns a new float64 array; the input is not changed."""
        logits = np.array(logits, dtype=np.float64)
        params = [metadata.params[i] for i in rows]
        outputs = [metadata.output_token_ids[i] for i in rows]
        for j, p in enumerate(params):
            if p.allowed_token_ids is not None:
                apply_allowed_token_ids(logits[j], p.allowed_token_ids)
            if p.bad_words:
                apply_bad_words(logits[j], p.bad_words, outputs[j])
            if p.min_tokens and len(outputs[j]) < p.min_tokens:
                logits[j, list(metadata.stop_token_ids[rows[j]])] = -np.inf
            if p.logit_bias:
                logits[j, list(p.logit_bias)] += np.array(list(p.logit_bias.values()))
        for lp in non_argmax_invariant:
            logits = np.asarray(lp.apply(logits), dtype=np.float64)
            if logits.shape != (len(rows), logits.shape[1]):
                raise ValueError(f"{type(lp).__name__}.apply must return logits of shape [B, V], "
                                 f"got {logits.shape}")
        if any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 for p in params):
            logits = apply_penalties(
                logits,
                [metadata.prompt_token_ids[i] for i in rows],
                outputs,
                np.array([p.presence_penalty for p in params]),
                np.array([p.frequency_penalty for p in params]),
                np.array([p.repetition_penalty for p in params]),
            )
        return logits

    def sample(
        self,
        logits: np.ndarray,
        params: SamplingParams,
        generator: np.random.Generator | None = None,
    ) -> int:
        logits = np.asarray(logits, dtype=np.float64)
        if logits.ndim != 1:
            raise ValueError(f"logits must be one row [vocab], got shape {logits.shape}")
        if params.temperature == 0:
            return int(np.argmax(logits))  # ties -> lowest id, like torch.argmax
        probs = self.probs(logits, params)
        rng = generator if generator is not None else np.random.default_rng(params.seed)
        return int(rng.choice(len(probs), p=probs))

    def probs(self, logits: np.ndarray, params: SamplingParams) -> np.ndarray:
        """The distribution a non-greedy draw uses (after all filters)."""
        logits = np.asarray(logits, dtype=np.float64) / params.temperature
        if params.min_p > 0.0:
            logits = _apply_min_p(logits, params.min_p)
        if params.top_k > 0:
            logits = _apply_top_k(logits, params.top_k)
        if params.top_p < 1.0:
            logits = _apply_top_p(logits, params.top_p)
        return _softmax(logits)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


def _apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    # As upstream: threshold = min_p x the top probability of the full
    # (temperature-scaled) distribution; tokens strictly below it become -inf.
    probs = _softmax(logits)
    return np.where(probs < min_p * probs.max(), -np.inf, logits)


def _apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    if k >= len(logits):
        return logits
    kth = np.partition(logits, len(logits) - k)[len(logits) - k]
    return np.where(logits < kth, -np.inf, logits)


def _apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    # As upstream: sort ascending, drop the tokens whose cumulative mass from the
    # bottom is <= 1 - p, and never drop the most likely one.
    order = np.argsort(logits, kind="stable")
    cum = np.cumsum(_softmax(logits)[order])
    drop = cum <= 1.0 - p
    drop[-1] = False
    out = logits.copy()
    out[order[drop]] = -np.inf
    return out


def compute_logprobs(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis, in float64 (upstream: float32)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def gather_logprobs(logprobs: np.ndarray, k: int, token_id: int) -> dict[int, Logprob]:
    """One position's dict: ``token_id`` with its rank, then the top ``k`` with ranks 1..k.

    The rank counts the tokens whose logprob is ``>=`` the sampled one's, as
    upstream's ``batched_count_greater_than`` does (ties share the worse
    rank). The top k are ordered by logprob, ties by the lower id (upstream's
    ``torch.topk`` leaves tie order unspecified). A sampled token inside the
    top k keeps its top-k rank: the dict insert overwrites, as upstream's.
    """
    rank = int((logprobs >= logprobs[token_id]).sum())
    top = np.argsort(-logprobs, kind="stable")[:k]
    out = {int(token_id): Logprob(float(logprobs[token_id]), rank)}
    for r, t in enumerate(top.tolist(), start=1):
        out[t] = Logprob(float(logprobs[t]), r)
    return out


def apply_allowed_token_ids(row: np.ndarray, allowed: list[int]) -> None:
    """Every token not in ``allowed`` -> -inf, in place."""
    keep = row[allowed].copy()
    row[:] = -np.inf
    row[allowed] = keep


def apply_bad_words(row: np.ndarray, bad_words: list[list[int]], past_tokens: list[int]) -> None:
    """Ban the last token of each sequence whose other tokens end ``past_tokens``
    (the output so far: upstream passes output tokens, not the prompt), in place."""
    for word in bad_words:
        if len(word) > len(past_tokens) + 1:
            continue
        prefix = len(word) - 1
        if prefix == 0 or list(past_tokens[-prefix:]) == word[:prefix]:
            row[word[-1]] = -np.inf


def apply_penalties(logits: np.ndarray, prompt_token_ids: list[list[int]],
                    output_token_ids: list[list[int]], presence: np.ndarray,
                    frequency: np.ndarray, repetition: np.ndarray) -> np.ndarray:
    """Upstream's ``apply_penalties`` on [B, V] float64 logits; returns a new array.

    Repetition scales every token seen in the prompt OR the output: a
    positive logit is divided by the penalty, any other multiplied by it.
    Then ``logits -= frequency x count`` and ``logits -= presence x
    [count > 0]``, counts over the OUTPUT only.
    """
    b, v = logits.shape
    out_counts = np.zeros((b, v), dtype=np.int64)
    prompt_mask = np.zeros((b, v), dtype=bool)
    for i in range(b):
        np.add.at(out_counts[i], np.asarray(output_token_ids[i], dtype=np.int64), 1)
        prompt_mask[i, np.asarray(prompt_token_ids[i], dtype=np.int64)] = True
    out_mask = out_counts > 0
    pen = np.where(prompt_mask | out_mask, repetition[:, None], 1.0)
    logits = np.where(logits > 0, logits / pen, logits * pen)
    logits = logits - frequency[:, None] * out_counts
    return logits - presence[:, None] * out_mask
