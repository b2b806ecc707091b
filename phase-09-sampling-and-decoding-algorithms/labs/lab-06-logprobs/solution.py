"""Lab 09-06 — logprobs: what the model believed, what the sampler drew from (reference solution).

Ask vLLM for ``SamplingParams(logprobs=k)`` and every generated position
comes back as a small dict, token id -> ``Logprob(logprob, rank)``: the token
that was sampled, first, with its rank in the whole vocabulary, then the ``k``
most likely tokens with ranks 1..k. Ask for ``prompt_logprobs=k`` and every
prompt token gets the same dict, scored by the model before it saw that token.
This lab rebuilds both from logits, in vLLM's exact shape, and then asks the
question the output dict hides: *which* logits?

By default (``logprobs_mode="raw_logprobs"``) vLLM takes the log-softmax of
the model's logits *before* allowed ids, bad words, min_tokens, logit bias,
penalties, temperature, min-p, top-k and top-p: the numbers describe the
model, not the sampler, so a temperature of 0.1 or a repetition penalty of 2
leaves them untouched. ``processed_logprobs`` is the other choice: the
log-softmax of the logits the draw actually used, where filtered tokens are
``-inf`` and the temperature sharpens or flattens everything.

The pieces, in the order vLLM runs them:

* ``compute_logprobs`` — a log-softmax that does not overflow;
* ``ranks`` — a token's rank is how many tokens have a logprob ``>=`` its own,
  so tied tokens share the worse rank and rank 1 is the best;
* ``gather_logprobs`` — one dict per row: the sampled token first, then the
  top ``k``; ``k`` or ``k + 1`` entries;
* ``processed_logits`` / ``processed_logprobs`` — the sampler's own view;
* ``logprobs_for_step`` — one step of the engine: the dicts of a batch under
  any of the four ``logprobs_mode`` values;
* ``prompt_logprobs`` — a prompt's list, ``None`` for its first token.

Numbers are float64 here (vLLM: float32 on the GPU), so they can be compared
with a reference to 1e-12.

upstream: vllm/v1/sample/sampler.py:67 Sampler.forward
upstream: vllm/v1/sample/sampler.py:300 Sampler.compute_logprobs
upstream: vllm/v1/sample/sampler.py:304 Sampler.gather_logprobs
upstream: vllm/v1/sample/ops/logprobs.py:11 batched_count_greater_than
upstream: vllm/logprobs.py:175 append_logprobs_for_next_position
upstream: vllm/config/model.py:98 LogprobsMode
upstream: vllm/v1/worker/gpu_model_runner.py:5338 GPUModelRunner._get_prompt_logprobs_dict
"""
from __future__ import annotations

import numpy as np

from mini_vllm.sampler import Logprob, Sampler, SamplingMetadata
from mini_vllm.sampling_params import SamplingParams

__all__ = [
    "LOGPROBS_MODES",
    "Logprob",
    "compute_logprobs",
    "gather_logprobs",
    "logprobs_for_step",
    "processed_logits",
    "processed_logprobs",
    "prompt_logprobs",
    "ranks",
    "sampling_filters",
]

# ---------------------------------------------------------------- given

# vLLM's four choices for what the logprobs of a request describe (ModelConfig.logprobs_mode).
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


def sampling_filters(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Given. Min-p, then top-k, then top-p on one temperature-scaled row, as mini_vllm's sampler.

    row: float64 ``[V]``, already divided by the temperature. Returns a new
    float64 row where every token the filters drop is ``-inf`` and every other
    logit is unchanged. The order and the rules are those of
    ``mini_vllm.sampler.Sampler.probs``: min-p drops tokens whose probability
    is below ``min_p`` times the top probability; top-k keeps every token at
    least as large as the k-th largest; top-p drops, from the least likely up,
    the tokens whose cumulative probability stays ``<= 1 - top_p``, never the
    most likely one.

    upstream: vllm/v1/sample/ops/topk_topp_sampler.py:328 apply_top_k_top_p_pytorch
    """
    out = np.array(row, dtype=np.float64)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    if params.min_p > 0.0:
        p = softmax(out)
        out[p < params.min_p * p.max()] = -np.inf
    if 0 < params.top_k < out.size:
        kth = np.sort(out)[out.size - params.top_k]
        out[out < kth] = -np.inf
    if params.top_p < 1.0:
        order = np.argsort(out, kind="stable")
        drop = np.cumsum(softmax(out)[order]) <= 1.0 - params.top_p
        drop[-1] = False
        out[order[drop]] = -np.inf
    return out


def _check_rows(logprobs, name: str) -> np.ndarray:
    arr = np.asarray(logprobs, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"{name} must be a 2-D array [B, V] with V >= 1, got shape {arr.shape}")
    return arr


def _check_token_ids(token_ids, b: int, v: int, name: str) -> np.ndarray:
    ids = np.asarray(token_ids)
    if ids.shape != (b,) or (b and ids.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be {b} integer token ids (one per row), got {token_ids!r:.60}")
    if b and (ids.min() < 0 or ids.max() >= v):
        raise ValueError(f"{name} must be in [0, {v}), got {ids.tolist()!r:.60}")
    return ids.astype(np.int64)


def _check_k(k, v: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not -1 <= k <= v:
        raise ValueError(f"{name} must be -1 (the whole vocabulary) or an integer in [0, {v}], got {k!r}")
    return v if k == -1 else int(k)


# ---------------------------------------------------------------- what you write


def compute_logprobs(logits) -> np.ndarray:
    """Log-softmax of each row: ``logits[b, t] - log(sum_s exp(logits[b, s]))``.

    logits: float array ``[B, V]`` (any float dtype; ``-inf`` allowed, it
    becomes a logprob of ``-inf``). Returns float64 ``[B, V]``; every row's
    ``exp`` sums to 1. Must not overflow: logits of 1000 are fine.

    Raises ValueError naming ``logits`` when it is not 2-D with V >= 1, or
    when a row has no finite maximum (all ``-inf``, a ``+inf`` or a NaN).

    upstream: vllm/v1/sample/sampler.py:300 Sampler.compute_logprobs
    """
    x = _check_rows(logits, "logits")
    if x.shape[0] == 0:
        return x.copy()
    m = x.max(axis=-1, keepdims=True)
    if not np.isfinite(m).all():
        raise ValueError("logits must have a finite maximum in every row (no NaN, no +inf, "
                         "not every token -inf)")
    # Shift by the row's max first: exp() then sees values <= 0 and cannot overflow,
    # and the largest term of the sum is exactly exp(0) = 1.
    shifted = x - m
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def ranks(logprobs, token_ids) -> np.ndarray:
    """Rank of ``token_ids[b]`` in row ``b``: the number of tokens whose logprob is ``>=`` its own.

    logprobs: float ``[B, V]``; token_ids: ``B`` integers in ``[0, V)``.
    Returns int64 ``[B]``, each in ``[1, V]``. Rank 1 is the most likely token;
    tokens that tie share the *worse* rank (two tokens tied at the top are both
    rank 2), exactly as upstream counts.

    Raises ValueError naming ``logprobs`` (not 2-D) or ``token_ids`` (wrong
    length, not integers, out of ``[0, V)``).

    upstream: vllm/v1/sample/ops/logprobs.py:11 batched_count_greater_than
    """
    lp = _check_rows(logprobs, "logprobs")
    ids = _check_token_ids(token_ids, lp.shape[0], lp.shape[1], "token_ids")
    own = lp[np.arange(lp.shape[0]), ids][:, None]
    return (lp >= own).sum(axis=-1).astype(np.int64)


def gather_logprobs(logprobs, k: int, token_ids) -> list[dict[int, Logprob]]:
    """One dict per row, in vLLM's shape: ``token_ids[b]`` first, then the top ``k``.

    logprobs: float ``[B, V]``; k: ``-1`` (the whole vocabulary) or an integer
    in ``[0, V]``; token_ids: ``B`` integers in ``[0, V)`` (the sampled tokens,
    or for a prompt the tokens that came next).

    Row ``b``'s dict, in insertion order: ``token_ids[b]`` ->
    ``Logprob(logprob, rank)`` with its ``ranks`` rank; then the ``k`` largest
    logprobs, largest first (ties: lower id first), with ranks ``1..k``. A
    token already in the dict is overwritten in place (it keeps its first
    position but takes the top-k rank), so a dict holds ``k + 1`` entries, or
    ``k`` when the token is among the top ``k``. ``logprob`` values are Python
    floats, ranks Python ints.

    Raises ValueError naming ``logprobs``, ``k`` or ``token_ids``.

    upstream: vllm/v1/sample/sampler.py:304 Sampler.gather_logprobs
    upstream: vllm/logprobs.py:175 append_logprobs_for_next_position
    """
    lp = _check_rows(logprobs, "logprobs")
    k = _check_k(k, lp.shape[1])
    token_rank = ranks(lp, token_ids)
    out = []
    for row, tok, rank in zip(lp, np.asarray(token_ids).tolist(), token_rank.tolist(), strict=True):
        position = {int(tok): Logprob(float(row[tok]), int(rank))}
        # stable sort of the negated row: largest first, ties in id order
        top = np.argsort(-row, kind="stable")[:k]
        for r, t in enumerate(top.tolist(), start=1):
            position[t] = Logprob(float(row[t]), r)  # overwrites the sampled token's entry if present
        out.append(position)
    return out


def processed_logits(logits, metadata: SamplingMetadata) -> np.ndarray:
    """The logits each row's draw used: vLLM's ``processed_logits`` mode.

    logits: float ``[B, V]``, one row per ``metadata.params``. Returns a new
    float64 ``[B, V]``:

    1. rows whose params have ``has_logits_processing`` go through
       ``Sampler.apply_logits_processors`` (allowed ids, bad words,
       min_tokens, logit bias, penalties: mini_vllm's, in upstream's order);
    2. rows with ``temperature > 0`` are divided by their temperature and then
       go through ``sampling_filters`` (min-p, top-k, top-p; dropped tokens
       ``-inf``);
    3. greedy rows (``temperature == 0``) stop after step 1: no division by
       zero, no filters (what vLLM returns when the whole batch is greedy).

    The input is not modified.

    Raises ValueError naming ``logits`` when it is not ``[B, V]`` with
    ``B == len(metadata.params)``.

    upstream: vllm/v1/sample/sampler.py:263 processed_logprobs
    upstream: vllm/v1/sample/ops/topk_topp_sampler.py:128 logits_to_return
    """
    x = _check_rows(logits, "logits").copy()
    if x.shape[0] != len(metadata.params):
        raise ValueError(f"logits must have one row per SamplingParams ({len(metadata.params)}), "
                         f"got shape {x.shape}")
    rows = [i for i, p in enumerate(metadata.params) if p.has_logits_processing]
    if rows:
        x[rows] = Sampler.apply_logits_processors(x[rows], metadata, rows)
    for i, p in enumerate(metadata.params):
        if p.temperature > 0:
            x[i] = sampling_filters(x[i] / p.temperature, p)
    return x


def processed_logprobs(logits, metadata: SamplingMetadata) -> np.ndarray:
    """``compute_logprobs(processed_logits(logits, metadata))``: vLLM's ``processed_logprobs``.

    For a non-greedy row, ``exp`` of it is the distribution the token was
    drawn from (``Sampler.probs``); filtered tokens have logprob ``-inf``.
    Same arguments and errors as ``processed_logits``.

    upstream: vllm/v1/sample/ops/topk_topp_sampler.py:128 logits_to_return
    """
    return compute_logprobs(processed_logits(logits, metadata))


def logprobs_for_step(logits, metadata: SamplingMetadata, sampled,
                      mode: str = "raw_logprobs") -> list[dict[int, Logprob] | None]:
    """One engine step's logprobs: ``Sampler.forward``'s ``logprobs`` list, for any mode.

    logits: the model's float ``[B, V]`` for the step (before anything else);
    metadata: one ``SamplingParams`` per row; sampled: the ``B`` tokens the
    sampler chose; mode: one of ``LOGPROBS_MODES``.

    Returns a list of ``B`` entries: ``None`` for a row whose
    ``params.logprobs`` is ``None``; otherwise ``gather_logprobs`` of that
    row with ``k = params.logprobs`` (``-1``: the whole vocabulary) and its
    sampled token, over the values the mode names:

    * ``raw_logprobs`` (vLLM's default): ``compute_logprobs(logits)``;
    * ``raw_logits``: the logits themselves, as float64;
    * ``processed_logprobs``: ``processed_logprobs(logits, metadata)``;
    * ``processed_logits``: ``processed_logits(logits, metadata)``.

    Raises ValueError naming ``mode`` (not one of the four), ``logits`` (not
    ``[B, V]``) or ``sampled`` (not ``B`` ids in ``[0, V)``).

    upstream: vllm/v1/sample/sampler.py:83 raw_logprobs
    upstream: vllm/v1/sample/sampler.py:99 raw_logprobs
    """
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"mode must be one of {', '.join(LOGPROBS_MODES)}, got {mode!r}")
    x = _check_rows(logits, "logits")
    b, v = x.shape
    if b != len(metadata.params):
        raise ValueError(f"logits must have one row per SamplingParams ({len(metadata.params)}), "
                         f"got shape {x.shape}")
    ids = _check_token_ids(sampled, b, v, "sampled")
    if mode == "raw_logprobs":
        values = compute_logprobs(x)
    elif mode == "raw_logits":
        values = x
    elif mode == "processed_logprobs":
        values = processed_logprobs(x, metadata)
    else:
        values = processed_logits(x, metadata)
    out: list[dict[int, Logprob] | None] = [None] * b
    for i, p in enumerate(metadata.params):
        if p.logprobs is not None:
            out[i] = gather_logprobs(values[i:i + 1], p.logprobs, ids[i:i + 1])[0]
    return out


def prompt_logprobs(logits_per_position, prompt_ids, k: int) -> list[dict[int, Logprob] | None]:
    """A prompt's logprobs, as ``RequestOutput.prompt_logprobs``.

    logits_per_position: float ``[T, V]`` or ``[T - 1, V]`` where
    ``T = len(prompt_ids)``: row ``t`` is the model's output at position ``t``,
    the distribution of the token at ``t + 1`` (a last row, for the first
    generated token, is ignored). prompt_ids: ``T >= 1`` token ids in
    ``[0, V)``. k: as in ``gather_logprobs``.

    Returns a list of ``T`` entries: entry 0 is ``None`` (nothing predicts the
    first token); entry ``j`` is the dict of ``gather_logprobs`` over the
    log-softmax of row ``j - 1`` for token ``prompt_ids[j]``.

    Raises ValueError naming ``prompt_ids`` (empty), ``logits_per_position``
    (wrong number of rows, not 2-D), ``prompt_ids`` again when an id is out
    of ``[0, V)``, or ``k``.

    upstream: vllm/logprobs.py:162 create_prompt_logprobs
    upstream: vllm/v1/worker/gpu_model_runner.py:5412 tgt_token_ids
    """
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must hold at least one token id")
    x = _check_rows(logits_per_position, "logits_per_position")
    if x.shape[0] not in (len(ids), len(ids) - 1):
        raise ValueError(f"logits_per_position must have {len(ids)} or {len(ids) - 1} rows "
                         f"(one per prompt position), got shape {x.shape}")
    ids = _check_token_ids(ids, len(ids), x.shape[1], "prompt_ids")
    # Row j - 1 scores token j: the last row (if given) predicts a token that is not in
    # the prompt, and nothing scores token 0.
    scored = gather_logprobs(compute_logprobs(x[:len(ids) - 1]), k, ids[1:])
    return [None, *scored]


if __name__ == "__main__":
    from mini_vllm.engine import LLM

    row = np.array([[2.0, 1.0, 2.0, 0.0, -1.0]])
    lp = compute_logprobs(row)
    print("logits [2, 1, 2, 0, -1], ranks of tokens 0, 1, 2:", ranks(np.repeat(lp, 3, 0), [0, 1, 2]).tolist())
    for k, tok in ((0, 0), (1, 0), (1, 2), (2, 4)):
        d = gather_logprobs(lp, k, [tok])[0]
        print(f"k={k} sampled={tok}:", [(t, e.rank) for t, e in d.items()])
    llm = LLM("tiny-random", block_size=16)
    for temp in (0.8, 0.1):
        out = llm.generate("hello", SamplingParams(temperature=temp, seed=3, max_tokens=1,
                                                   logprobs=3))[0].outputs[0]
        first = out.logprobs[0]
        print(f"temperature {temp}: sampled {out.token_ids[0]},",
              ", ".join(f"{t}: {e.logprob:.4f} (rank {e.rank})" for t, e in first.items()))
