"""Lab 08-05 — Speculative decoding inside mini_vllm, with your pieces (your implementation).

mini_vllm speculates: with ``LLMEngine(speculative_config={"method": "ngram",
...})`` it drafts up to ``k`` tokens per decoding request after every step,
schedules them behind the request's last token, runs the target model once
over all of them, and keeps the longest prefix the target agrees with plus one
token of its own. Three small pieces carry the whole scheme, and this lab has
you write them with the names and arguments the engine calls:

* ``calc_spec_decode_metadata`` (the model runner): which rows of the flat
  batch need logits. A request that scheduled its last token and ``d`` drafts
  needs all ``d + 1`` rows: row ``i`` judges draft ``i``, the last row gives the
  bonus token. A request without drafts needs only its last row.
* ``rejection_greedy_sample`` and ``rejection_sample`` (the rejection
  sampler): greedy requests accept a draft while it equals the target's argmax;
  sampled requests accept draft ``x`` with probability ``min(1, p(x) / q(x))``
  and, at the first rejection, draw from ``normalize(max(p - q, 0))``. An
  n-gram draft has no probabilities: it is a one-hot ``q``, so acceptance is
  ``p(x)`` and the recovery draws from ``p`` with ``x`` removed.
* ``update_after_verify`` (the scheduler): advance ``num_computed_tokens`` by
  what was scheduled, take back the slots of the rejected drafts, and append
  the kept tokens one at a time, stopping at the first one that finishes the
  request (EOS, a stop string, ``max_tokens``, ``max_model_len``).

``install(impl)`` (given) plugs the four functions into a running mini_vllm
without editing it, and puts the engine's own back when the block ends::

    with install(this_module):
        LLMEngine("tiny-random", speculative_config={"method": "ngram", ...}).generate(...)

upstream: vllm/v1/worker/gpu_model_runner.py:2713 _calc_spec_decode_metadata
upstream: vllm/v1/sample/rejection_sampler.py:392 rejection_sample
upstream: vllm/v1/sample/rejection_sampler.py:708 rejection_greedy_sample_kernel
upstream: vllm/v1/sample/rejection_sampler.py:762 rejection_random_sample_kernel
upstream: vllm/v1/core/sched/scheduler.py:1374 num_rejected
upstream: vllm/v1/core/sched/scheduler.py:1649 _update_request_with_output
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

import mini_vllm.model_runner as _model_runner
from mini_vllm.request import Request
from mini_vllm.scheduler import Scheduler
from mini_vllm.spec_decode.metadata import SpecDecodeMetadata
from mini_vllm.spec_decode.rejection_sampler import RejectionSampler

PLACEHOLDER_TOKEN_ID = -1  # a rejected position in the [B, d + 1] outputs, as upstream

LEARNER_FUNCTIONS = ("calc_spec_decode_metadata", "rejection_greedy_sample", "rejection_sample",
                     "update_after_verify")


# ---------------------------------------------------------------- given helpers


def _int_vector(a, name: str, low: int = 0) -> np.ndarray:
    """Given. ``a`` as a non-empty 1-D int64 array of integers >= ``low``.

    Raises ValueError naming ``name`` otherwise.
    """
    arr = np.asarray(a)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or (arr < low).any():
        raise ValueError(f"{name} must be a non-empty 1-D array of integers >= {low}, got {a!r:.80}")
    return arr.astype(np.int64)


def _check_metadata_inputs(num_draft_tokens, cu_num_scheduled_tokens, input_ids):
    """Given. Checked int64 copies of the three inputs of ``calc_spec_decode_metadata``.

    Every request must have scheduled at least its drafts plus its last token:
    ``cu_num_scheduled_tokens[i] - cu_num_scheduled_tokens[i - 1] >= num_draft_tokens[i] + 1``
    (``cu[-1]`` counts as 0). ``input_ids``, when given, holds one id per scheduled row.
    """
    drafts = _int_vector(num_draft_tokens, "num_draft_tokens")
    cu = _int_vector(cu_num_scheduled_tokens, "cu_num_scheduled_tokens")
    if len(cu) != len(drafts):
        raise ValueError(f"cu_num_scheduled_tokens must have one entry per request "
                         f"({len(drafts)}), got {len(cu)}")
    scheduled = np.diff(cu, prepend=0)
    if (scheduled < drafts + 1).any():
        i = int(np.flatnonzero(scheduled < drafts + 1)[0])
        raise ValueError(f"cu_num_scheduled_tokens: request {i} scheduled {int(scheduled[i])} "
                         f"tokens, fewer than its {int(drafts[i])} drafts + 1")
    if input_ids is not None:
        input_ids = np.asarray(input_ids)
        if input_ids.ndim != 1 or len(input_ids) != cu[-1] or input_ids.dtype.kind not in "iu":
            raise ValueError(f"input_ids must be a 1-D integer array of cu_num_scheduled_tokens[-1] "
                             f"= {int(cu[-1])} ids, got shape {input_ids.shape}")
        input_ids = input_ids.astype(np.int64)
    return drafts, cu, input_ids


def _check_verify_inputs(draft_token_ids, target, bonus_token_ids, target_name: str):
    """Given. ``draft_token_ids`` [B, d] and ``bonus_token_ids`` [B] as int64, checked against
    ``target`` (``target_argmax`` [B, d] or ``target_probs`` [B, d, V], named ``target_name``).
    """
    draft = np.asarray(draft_token_ids)
    if draft.ndim != 2 or draft.shape[0] == 0 or (draft.size and draft.dtype.kind not in "iu"):
        raise ValueError(f"draft_token_ids must be a 2-D [batch, num_drafts] integer array with "
                         f"batch >= 1, got shape {draft.shape}")
    target = np.asarray(target)
    if target.shape[:2] != draft.shape:
        raise ValueError(f"{target_name} must start with draft_token_ids' shape {draft.shape}, "
                         f"got {target.shape}")
    bonus = np.asarray(bonus_token_ids)
    if bonus.shape != draft.shape[:1] or bonus.dtype.kind not in "iu":
        raise ValueError(f"bonus_token_ids must be [batch] = [{draft.shape[0]}] integers, "
                         f"got shape {bonus.shape}")
    if target.ndim == 3:
        vocab = target.shape[2]
        for name, ids in (("draft_token_ids", draft), ("bonus_token_ids", bonus)):
            if ids.size and not ((ids >= 0) & (ids < vocab)).all():
                raise ValueError(f"{name} must be token ids in [0, {vocab}), got {ids.tolist()!r:.80}")
    return draft.astype(np.int64), target, bonus.astype(np.int64)


def _check_probs(probs, name: str, shape: tuple | None = None) -> np.ndarray:
    """Given. ``probs`` as float64 [B, d, V]: finite, >= 0, every row summing to 1 (1e-4)."""
    arr = np.asarray(probs, dtype=np.float64)
    if arr.ndim != 3 or (shape is not None and arr.shape != shape):
        raise ValueError(f"{name} must be a [batch, num_drafts, vocab] array"
                         f"{'' if shape is None else f' of shape {shape}'}, got shape {arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any() or \
            (arr.size and not np.allclose(arr.sum(axis=-1), 1.0, atol=1e-4)):
        raise ValueError(f"{name} must hold probability rows: finite, >= 0, each summing to 1")
    return arr


def _check_update_inputs(request, num_scheduled_tokens, num_draft_tokens, new_token_ids) -> list[int]:
    """Given. Checks ``update_after_verify``'s inputs; returns ``new_token_ids`` as a list."""
    if not isinstance(request, Request):
        raise ValueError(f"request must be a mini_vllm Request, got {type(request).__name__}")
    for name, value, low in (("num_scheduled_tokens", num_scheduled_tokens, 1),
                             ("num_draft_tokens", num_draft_tokens, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if num_draft_tokens + 1 > num_scheduled_tokens:
        raise ValueError(f"num_draft_tokens must be <= num_scheduled_tokens - 1 = "
                         f"{num_scheduled_tokens - 1}, got {num_draft_tokens}")
    tokens = [int(t) for t in new_token_ids]
    if len(tokens) > num_draft_tokens + 1 or (num_draft_tokens and not tokens):
        raise ValueError(f"new_token_ids must hold 1 to num_draft_tokens + 1 = {num_draft_tokens + 1} "
                         f"tokens (0 only for a chunk without drafts), got {tokens}")
    return tokens


def _verify(impl):
    """Given. A ``RejectionSampler.__call__`` that runs ``impl``'s two rejection samplers.

    Same steps, same random draws, in the same order as mini_vllm's own: greedy
    requests use the argmax of every row; sampled ones the ``Sampler``'s
    probabilities of the ``d`` draft rows and a bonus token sampled from the last row.
    """

    def __call__(self, draft_token_ids, logits, params, generator, draft_probs=None):
        d = len(draft_token_ids)
        if logits.shape[0] != d + 1:
            raise ValueError(f"logits must have len(draft_token_ids) + 1 = {d + 1} rows, "
                             f"got {logits.shape[0]}")
        argmax = np.argmax(logits, axis=-1)
        if params.temperature == 0:
            out = impl.rejection_greedy_sample(np.array([draft_token_ids], dtype=np.int64),
                                               argmax[None, :d], argmax[d:])[0]
        else:
            probs = np.stack([self.sampler.probs(row, params) for row in logits[:d]])
            bonus = self.sampler.sample(logits[d], params, generator)
            out = impl.rejection_sample(np.array([draft_token_ids], dtype=np.int64), probs[None],
                                        np.array([bonus]), generator,
                                        None if draft_probs is None else draft_probs[None])[0]
        out = np.asarray(out)
        return out[out != PLACEHOLDER_TOKEN_ID].tolist()

    return __call__


def _update_from_output(impl):
    """Given. A ``Scheduler.update_from_output`` whose per-request work is ``impl.update_after_verify``.

    The rest is mini_vllm's: the same input checks, aborted requests skipped, the
    finished ones removed from ``running`` in one pass and their blocks freed.
    """

    def update_from_output(self, scheduler_output, sampled):
        self._check_sampled(scheduler_output, sampled)
        finished = []
        for request in scheduler_output.scheduled_requests:
            if request.is_finished():  # aborted after schedule()
                continue
            rid = request.request_id
            tokens = sampled.get(rid, [])
            tokens = list(tokens) if isinstance(tokens, list | tuple) else [tokens]
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid, [])
            _, stopped = impl.update_after_verify(request, scheduler_output.num_scheduled_tokens[rid],
                                                  len(drafts), tokens, self.max_model_len)
            if stopped:
                finished.append(request)
        if finished:
            self.running = [r for r in self.running if not r.is_finished()]
            for request in finished:
                self._free_request(request)
        return finished

    return update_from_output


@contextlib.contextmanager
def install(impl) -> Iterator[None]:
    """Given. Inside the block, every mini_vllm engine runs ``impl``'s four functions.

    ``impl`` is any object with the attributes named in ``LEARNER_FUNCTIONS``
    (this module, a ``types.SimpleNamespace``). Patched: the model runner's
    ``calc_spec_decode_metadata`` (the one ``spec_decode_metadata`` calls),
    ``RejectionSampler.__call__`` and ``Scheduler.update_from_output``. The
    originals come back when the block ends, also on an exception.
    Raises ValueError naming ``impl`` when a function is missing.
    """
    missing = [n for n in LEARNER_FUNCTIONS if not callable(getattr(impl, n, None))]
    if missing:
        raise ValueError(f"impl must provide {', '.join(LEARNER_FUNCTIONS)}; missing {', '.join(missing)}")
    saved = (_model_runner.calc_spec_decode_metadata, RejectionSampler.__call__, Scheduler.update_from_output)
    _model_runner.calc_spec_decode_metadata = impl.calc_spec_decode_metadata
    RejectionSampler.__call__ = _verify(impl)
    Scheduler.update_from_output = _update_from_output(impl)
    try:
        yield
    finally:
        (_model_runner.calc_spec_decode_metadata, RejectionSampler.__call__,
         Scheduler.update_from_output) = saved


# ---------------------------------------------------------------- 1. the model runner


def calc_spec_decode_metadata(num_draft_tokens, cu_num_scheduled_tokens,
                              input_ids: np.ndarray | None = None) -> SpecDecodeMetadata:
    """The logits rows of a step with drafts, as ``SpecDecodeMetadata``.

    Inputs, one entry per scheduled request, in batch order:
      num_draft_tokens          ints >= 0: drafts the request scheduled (``d_i``)
      cu_num_scheduled_tokens   cumulative scheduled rows; request ``i`` owns rows
                                ``[cu[i-1], cu[i])`` and its last ``d_i + 1`` rows are
                                its last real token and its drafts
      input_ids                 optional [cu[-1]] token ids of the rows

    Outputs (int64 arrays; ``num_sampled_i = d_i + 1``):
      logits_indices        the last ``num_sampled_i`` rows of every request, in order
      target_logits_indices for draft ``j`` of request ``i``: ``start_i + j``, where
                            ``start_i = cumsum(num_sampled)[i] - num_sampled_i`` is the
                            request's first place in the gathered logits
      bonus_logits_indices  ``cumsum(num_sampled) - 1``: each request's last gathered row
      cu_num_draft_tokens, cu_num_sampled_tokens: the inclusive cumulative sums
      num_draft_tokens      as a list of ints
      draft_token_ids       ``input_ids[logits_indices][target_logits_indices + 1]``
                            (the token after the row that judges it), or an empty
                            int64 array when ``input_ids`` is None

    Upstream's example, five requests ending at rows 4, 104, 107, 207, 209 with
    3, 0, 2, 0, 1 drafts: gathered rows 0-3, 103-106 and 206-208; judging rows
    0, 1, 2, 5, 6, 9 and bonus rows 3, 4, 7, 8, 10 of the gathered logits.

    Raises ValueError naming the parameter (``_check_metadata_inputs``).
    """
    raise NotImplementedError("calc_spec_decode_metadata: repeat each request's first logits row, add the position inside the request")


# ---------------------------------------------------------------- 2. the rejection sampler


def rejection_greedy_sample(draft_token_ids, target_argmax, bonus_token_ids) -> np.ndarray:
    """Greedy verification of a batch of equal-length drafts.

    draft_token_ids [B, d] int; target_argmax [B, d] int (the target's argmax at
    the row that judges each draft); bonus_token_ids [B] int (the argmax of each
    request's last row). Returns int64 [B, d + 1]: while ``draft == argmax`` the
    draft is kept; the first mismatch writes the argmax there and ends the row
    with ``PLACEHOLDER_TOKEN_ID`` (-1); a row with every draft kept ends with its
    bonus token. ``d = 0`` gives just the bonus tokens.

    Raises ValueError naming the parameter (``_check_verify_inputs``).
    """
    raise NotImplementedError("rejection_greedy_sample: count the leading matches with cumprod, then place the argmax or the bonus")


def rejection_sample(draft_token_ids, target_probs, bonus_token_ids, rng: np.random.Generator,
                     draft_probs=None) -> np.ndarray:
    """Random verification of a batch of equal-length drafts (temperature > 0).

    draft_token_ids [B, d] int; target_probs [B, d, V] (the target's distribution
    ``p`` at the row that judges each draft); bonus_token_ids [B] int, already
    sampled from each last row; rng a ``numpy.random.Generator``; draft_probs
    [B, d, V] (the drafter's ``q``) or None for one-hot drafts (n-gram).

    Draft ``x`` at a position is accepted when ``q(x) > 0`` and ``p(x) >= u * q(x)``
    (``q(x) = 1`` for one-hot drafts); the first rejected position gets a token
    drawn from the residual ``max(p - q, 0)`` (one-hot: ``p`` with ``x`` zeroed),
    the positions after it ``PLACEHOLDER_TOKEN_ID`` (-1); a row with every draft
    accepted ends with its bonus token. Returns int64 [B, d + 1].

    Random draws, exactly these and in this order, so that a seed gives the
    same tokens as mini_vllm's own sampler: ``u = rng.random((B, d))``, then
    ``E = rng.exponential(size=(B, d, V))``; the recovered token at a position
    is ``argmax(residual / E)`` (the exponential race: it picks token ``t``
    with probability ``residual[t] / sum(residual)``).

    Raises ValueError naming the parameter.
    """
    raise NotImplementedError("rejection_sample: u = rng.random((B, d)) first, then the exponential race over the residual")


# ---------------------------------------------------------------- 3. the scheduler


def update_after_verify(request: Request, num_scheduled_tokens: int, num_draft_tokens: int,
                        new_token_ids: Sequence[int], max_model_len: int | None = None
                        ) -> tuple[list[int], bool]:
    """One request's update after a step: computed counter, rollback, tokens, stops.

    request               the mini_vllm ``Request`` (its ``num_computed_tokens`` still
                          marks where this step's chunk started)
    num_scheduled_tokens  rows the step ran for it (its drafts included)
    num_draft_tokens      drafts among them (0 without speculation)
    new_token_ids         what the rejection sampler kept: the accepted drafts plus
                          one recovered or bonus token (1 to ``num_draft_tokens + 1``
                          tokens), or ``[]`` for a prefill chunk that samples nothing
    max_model_len         passed on to ``request.maybe_finish``

    1. ``num_computed_tokens += num_scheduled_tokens``.
    2. With drafts, subtract the rejected count ``num_draft_tokens + 1 - len(new_token_ids)``:
       the KV in those slots belongs to tokens that are not in the sequence and
       will be overwritten by the next step (no block is freed).
    3. Append the tokens one by one with ``request.append_output_token`` and call
       ``request.maybe_finish(max_model_len)`` after each; at the first ``True``
       stop: the tokens after it are dropped.

    Returns ``(appended, stopped)``: the tokens actually appended and whether the
    request finished. Raises ValueError naming the parameter (``_check_update_inputs``).
    """
    raise NotImplementedError("update_after_verify: add the scheduled rows, subtract the rejected ones, append token by token")


if __name__ == "__main__":
    import sys

    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = ["hello world hello world", "abcabcabcabcab"]
    stock = LLMEngine("tiny-random", block_size=4, num_blocks=128)
    plain = [r.output_token_ids for r in stock.generate(prompts, params)]
    with install(sys.modules[__name__]):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, speculative_config=spec)
        mine = [r.output_token_ids for r in engine.generate(prompts, params)]
    print("same tokens as no-spec:", mine == plain)
    print(f"steps: {stock.num_steps} without drafts, {engine.num_steps} with your pieces")
    print(engine.spec_decoding_stats.log_line())
