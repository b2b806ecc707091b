"""Lab 09-01 — a batched sampler in upstream's order (your implementation).

A decode step hands the sampler one row of logits per running request,
``logits [B, V]``, and every request brings its own knobs: one is greedy, the
next wants top-p 0.9 at temperature 0.7, a third has a repetition penalty and
a ban list. vLLM does not loop over the requests. It keeps each knob as a
per-row array and applies every step to the whole batch at once, in a fixed
order (the steps listed in the docstring of upstream's ``Sampler``):

1. allowed token ids: every id outside a row's allow-list becomes -inf;
2. bad words: the last id of a banned sequence becomes -inf when the row's
   generated tokens end with the rest of that sequence;
3. min_tokens: the stop ids (EOS included) are -inf until a row has
   generated ``min_tokens`` tokens; then logit bias: ``logits[i, t] += b``;
4. penalties: repetition over the prompt *and* the output (a positive logit
   is divided by the penalty, a negative one multiplied), then frequency
   (times the count) and presence (once) over the *output only*;
5. greedy rows take their argmax here and skip the rest;
6. temperature, 7. min-p, 8. top-k then top-p, 9. one draw per row.

Everything is computed in float64 on numpy, like mini_vllm's per-row
``Sampler``, so a row of this batched sampler gives the same distribution and
the same token as ``Sampler.sample`` with the same generator. Every function
returns a new array and never modifies its inputs (upstream works in place on
a GPU tensor).

upstream: vllm/v1/sample/sampler.py:20 Sampler
upstream: vllm/v1/sample/sampler.py:366 apply_logits_processors
upstream: vllm/model_executor/layers/utils.py:51 apply_penalties
upstream: vllm/v1/sample/ops/topk_topp_sampler.py:328 apply_top_k_top_p_pytorch
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SAMPLING_EPS = 1e-5  # a temperature below this is greedy (upstream's _SAMPLING_EPS)


# ---------------------------------------------------------------- given helpers


def as_logits(logits) -> np.ndarray:
    """Given. ``logits`` as a new float64 ``[B, V]`` array (always a copy).

    Raises ValueError naming ``logits`` unless it is a 2-D array of numbers
    with B >= 1 and V >= 1 holding no NaN and no +inf (-inf, a masked token,
    is allowed).
    """
    arr = np.asarray(logits)
    if arr.ndim != 2 or 0 in arr.shape or arr.dtype.kind not in "fiu":
        raise ValueError(f"logits must be a non-empty 2-D array [B, V] of numbers, got shape "
                         f"{arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=True)
    if np.isnan(arr).any() or (arr == np.inf).any():
        raise ValueError("logits must not hold NaN or +inf (-inf marks a masked token)")
    return arr


def per_row(values, name: str, batch: int, kind: str = "f") -> np.ndarray:
    """Given. ``values`` as a 1-D array of length ``batch``: float64 for
    ``kind="f"``, int64 for ``kind="i"`` (which refuses fractional values).

    Raises ValueError naming ``name`` for another shape, a non-number, NaN, or
    a fractional value where an integer is required.
    """
    arr = np.asarray(values)
    if arr.shape != (batch,) or arr.dtype.kind not in "fiub":
        raise ValueError(f"{name} must hold one number per row ({batch}), got shape {arr.shape}")
    out = arr.astype(np.float64)
    if np.isnan(out).any():
        raise ValueError(f"{name} must not hold NaN")
    if kind == "i":
        if (out != np.round(out)).any():
            raise ValueError(f"{name} must hold integers, got {arr.tolist()}")
        return out.astype(np.int64)
    return out


def token_lists(lists, name: str, batch: int, vocab: int) -> list[np.ndarray]:
    """Given. One int64 array of token ids per row, every id in ``[0, vocab)``.

    Raises ValueError naming ``name`` unless ``lists`` has ``batch`` entries,
    each a (possibly empty) sequence of integer ids in range.
    """
    if isinstance(lists, np.ndarray | str) or len(lists) != batch:
        raise ValueError(f"{name} must be a list of {batch} token-id lists, one per row")
    out = [np.asarray(row) for row in lists]
    for row, arr in zip(lists, out, strict=True):
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(f"{name} must hold lists of integer token ids, got {row!r}")
    flat = np.concatenate(out) if out else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= vocab):
        raise ValueError(f"{name}: token ids must be in [0, {vocab}), got {flat.tolist()[:20]}")
    return [arr.astype(np.int64, copy=False) for arr in out]


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Given. Row-wise softmax in float64 (max subtracted first).

    Raises ValueError naming ``logits`` when a row has no finite logit left
    (every token masked): there is nothing to sample from.
    """
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    if not np.isfinite(top).all():
        rows = np.flatnonzero(~np.isfinite(top.reshape(-1))).tolist()
        raise ValueError(f"logits: rows {rows} have every token masked (-inf); nothing to sample")
    e = np.exp(x - top)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class SamplingMetadata:
    """Given. The batch's knobs as per-row arrays, upstream's ``SamplingMetadata``
    in miniature. Build it with ``make_metadata``; field ``i`` belongs to row ``i``.

    upstream: vllm/v1/sample/metadata.py:15 SamplingMetadata
    """

    temperature: np.ndarray  # [B] float; < SAMPLING_EPS means greedy
    top_k: np.ndarray  # [B] int; 0, -1 or >= V: off
    top_p: np.ndarray  # [B] float in (0, 1]; 1.0: off
    min_p: np.ndarray  # [B] float in [0, 1]; 0.0: off
    presence_penalties: np.ndarray  # [B] float in [-2, 2]; 0.0: off
    frequency_penalties: np.ndarray  # [B] float in [-2, 2]; 0.0: off
    repetition_penalties: np.ndarray  # [B] float > 0; 1.0: off
    min_tokens: np.ndarray  # [B] int >= 0; 0: off
    prompt_token_ids: list[list[int]]
    output_token_ids: list[list[int]]
    stop_token_ids: list[list[int]]  # EOS and the request's stop ids, per row
    allowed_token_ids: list[list[int] | None]  # None: every token allowed
    logit_bias: list[dict[int, float] | None]
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.temperature)


ROW_DEFAULTS = {
    "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "min_tokens": 0, "prompt_token_ids": (), "output_token_ids": (), "stop_token_ids": (),
    "allowed_token_ids": None, "logit_bias": None, "bad_words": (),
}


def make_metadata(rows: Sequence[dict]) -> SamplingMetadata:
    """Given. One dict of knobs per row (missing knobs are off) -> metadata.

    Keys: ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``presence_penalty``,
    ``frequency_penalty``, ``repetition_penalty``, ``min_tokens``,
    ``prompt_token_ids``, ``output_token_ids``, ``stop_token_ids``,
    ``allowed_token_ids``, ``logit_bias``, ``bad_words`` (a list of token-id
    sequences). Values are packed, not range-checked: the ops check them.
    Raises ValueError naming ``rows`` for an empty batch or an unknown key.
    """
    if not rows:
        raise ValueError("rows must hold at least one request")
    full = []
    for r in rows:
        unknown = set(r) - set(ROW_DEFAULTS)
        if unknown:
            raise ValueError(f"rows: unknown knobs {sorted(unknown)}; known: {sorted(ROW_DEFAULTS)}")
        full.append({**ROW_DEFAULTS, **r})

    def col(key):
        return [r[key] for r in full]

    return SamplingMetadata(
        temperature=np.array(col("temperature"), dtype=np.float64),
        top_k=np.array(col("top_k"), dtype=np.int64),
        top_p=np.array(col("top_p"), dtype=np.float64),
        min_p=np.array(col("min_p"), dtype=np.float64),
        presence_penalties=np.array(col("presence_penalty"), dtype=np.float64),
        frequency_penalties=np.array(col("frequency_penalty"), dtype=np.float64),
        repetition_penalties=np.array(col("repetition_penalty"), dtype=np.float64),
        min_tokens=np.array(col("min_tokens"), dtype=np.int64),
        prompt_token_ids=[list(t) for t in col("prompt_token_ids")],
        output_token_ids=[list(t) for t in col("output_token_ids")],
        stop_token_ids=[list(t) for t in col("stop_token_ids")],
        allowed_token_ids=[None if a is None else list(a) for a in col("allowed_token_ids")],
        logit_bias=[None if b is None else dict(b) for b in col("logit_bias")],
        bad_words_token_ids={i: [list(w) for w in r["bad_words"]]
                             for i, r in enumerate(full) if r["bad_words"]},
    )


# ---------------------------------------------------------------- the ops before the penalties


def apply_allowed_token_ids(logits, allowed_token_ids) -> np.ndarray:
    """Restrict rows to an allow-list: every other token id becomes -inf.

    logits: ``[B, V]`` (see ``as_logits``). allowed_token_ids: B entries, each
    None (the row is unrestricted) or a non-empty list of ids in ``[0, V)``.
    Returns a new float64 ``[B, V]``: allowed logits unchanged, the rest -inf.

    Raises ValueError naming ``allowed_token_ids`` for a length other than B,
    an empty list, or an id outside ``[0, V)``.

    upstream: vllm/v1/sample/sampler.py:391 allowed_token_ids_mask
    """
    raise NotImplementedError("apply_allowed_token_ids: "
                              "build a [B, V] bool mask, True outside each row's list (None rows all False), then x[mask] = -inf")


def apply_bad_words(logits, bad_words_token_ids, output_token_ids) -> np.ndarray:
    """Ban the last token of every bad word whose prefix the row just generated.

    logits: ``[B, V]``. bad_words_token_ids: ``{row: [word, ...]}``, each word a
    non-empty list of ids in ``[0, V)``. output_token_ids: B lists of the ids
    each row has *generated* (the prompt is not consulted, as upstream).
    A word ``w`` of length n bans ``w[-1]`` (sets it to -inf) when the last
    ``n - 1`` generated tokens equal ``w[:-1]``; a one-token word is always
    banned; a word longer than ``len(output) + 1`` cannot match yet.

    Raises ValueError naming ``bad_words_token_ids`` for a row outside
    ``[0, B)``, an empty word or an id outside ``[0, V)``, and naming
    ``output_token_ids`` as ``token_lists`` does.

    upstream: vllm/v1/sample/ops/bad_words.py:30 apply_bad_words
    """
    raise NotImplementedError("apply_bad_words: "
                              "for each word: if the last len(word)-1 generated tokens equal word[:-1], set x[row, word[-1]] = -inf")


def apply_min_tokens(logits, min_tokens, output_token_ids, stop_token_ids) -> np.ndarray:
    """Forbid stopping early: a row that has generated fewer than
    ``min_tokens[i]`` tokens gets -inf on every id in ``stop_token_ids[i]``
    (EOS and the request's stop ids).

    logits: ``[B, V]``. min_tokens: B integers >= 0. output_token_ids,
    stop_token_ids: B lists of ids in ``[0, V)``.
    Returns a new float64 ``[B, V]``.

    Raises ValueError naming ``min_tokens`` for a negative or non-integer
    value, and naming ``output_token_ids`` / ``stop_token_ids`` as
    ``token_lists`` does.

    upstream: vllm/v1/sample/logits_processor/builtin.py:167 MinTokensLogitsProcessor
    """
    raise NotImplementedError("apply_min_tokens: "
                              "rows with len(output) < min_tokens get -inf on their stop ids")


def apply_logit_bias(logits, logit_bias) -> np.ndarray:
    """Add each row's bias to its logits: ``logits[i, t] += logit_bias[i][t]``.

    logits: ``[B, V]``. logit_bias: B entries, each None or a dict
    ``{token id in [0, V): finite float}``. Returns a new float64 ``[B, V]``;
    a -inf logit stays -inf.

    Raises ValueError naming ``logit_bias`` for a length other than B, an id
    outside ``[0, V)`` or a non-finite bias.

    upstream: vllm/v1/sample/logits_processor/builtin.py:118 LogitBiasLogitsProcessor
    """
    raise NotImplementedError("apply_logit_bias: "
                              "x[rows, ids] += biases, one scatter for the batch")


# ---------------------------------------------------------------- penalties


def apply_penalties(logits, prompt_token_ids, output_token_ids, presence_penalties,
                    frequency_penalties, repetition_penalties) -> np.ndarray:
    """Repetition, frequency and presence penalties for the whole batch.

    logits: ``[B, V]``. prompt_token_ids, output_token_ids: B lists of ids in
    ``[0, V)``. The three penalties: B floats each.

    For row i with ``r = repetition_penalties[i]``:

    1. repetition, over the tokens seen in the prompt **or** the output: a
       positive logit becomes ``logit / r``, a zero or negative one
       ``logit * r`` (so r > 1 always pushes a seen token down);
    2. frequency: ``logit -= frequency_penalties[i] * count``, where count is
       how often the token occurs in the *output* (the prompt never counts);
    3. presence: ``logit -= presence_penalties[i]`` once for every token that
       occurs in the *output* at least once.

    Returns a new float64 ``[B, V]``.

    Raises ValueError naming ``presence_penalties`` or
    ``frequency_penalties`` for a value outside ``[-2, 2]``, naming
    ``repetition_penalties`` for a value <= 0, and naming
    ``prompt_token_ids`` / ``output_token_ids`` as ``token_lists`` does.

    upstream: vllm/model_executor/layers/utils.py:51 apply_penalties
    upstream: vllm/_custom_ops.py:360 apply_repetition_penalties_torch
    """
    raise NotImplementedError("apply_penalties: "
                              "counts by np.add.at; r where seen in prompt|output; x>0 ? x/r : x*r; then -= f*count, -= p*(count>0)")


# ---------------------------------------------------------------- the ops after the greedy split


def apply_temperature(logits, temperature) -> np.ndarray:
    """Divide each row by its temperature.

    logits: ``[B, V]``. temperature: B finite floats >= 0. A greedy row
    (``temperature < SAMPLING_EPS``) is divided by 1.0 instead, as upstream
    guards it, so a mixed batch never divides by zero (its token is taken
    before this step anyway). Returns a new float64 ``[B, V]``.

    Raises ValueError naming ``temperature`` for a negative or non-finite value.

    upstream: vllm/v1/sample/sampler.py:223 apply_temperature
    """
    raise NotImplementedError("apply_temperature: "
                              "x / t[:, None], with t replaced by 1.0 where t < SAMPLING_EPS")


def apply_min_p(logits, min_p) -> np.ndarray:
    """Min-p: drop every token whose probability is below ``min_p[i]`` times
    the row's largest probability (probabilities from the softmax of these
    logits, i.e. after temperature). ``min_p = 0`` leaves a row unchanged; the
    most likely token always survives.

    logits: ``[B, V]``. min_p: B floats in ``[0, 1]``. Returns a new float64
    ``[B, V]`` with the dropped tokens at -inf.

    Raises ValueError naming ``min_p`` for a value outside ``[0, 1]``, and
    naming ``logits`` for a row with every token masked.

    upstream: vllm/v1/sample/logits_processor/builtin.py:101 apply
    """
    raise NotImplementedError("apply_min_p: "
                              "probs = softmax_rows(x); x[probs < min_p[:, None] * probs.max(1, keepdims=True)] = -inf")


def apply_top_k_top_p(logits, top_k, top_p) -> np.ndarray:
    """Top-k, then top-p on what top-k kept, for every row at once.

    logits: ``[B, V]``. top_k: B integers; 0, -1 or >= V means off, else keep
    every token whose logit is >= the k-th largest (ties at the k-th value
    all survive). top_p: B floats in ``(0, 1]``; 1.0 means off, else sort the
    row ascending, softmax it, and drop each token whose cumulative mass
    from the bottom is ``<= 1 - p`` -- except the most likely token, which
    always stays. Ties are ordered by token id (a stable sort).

    Returns a new float64 ``[B, V]`` with the dropped tokens at -inf.

    Raises ValueError naming ``top_k`` for a value < -1 or a non-integer, and
    naming ``top_p`` for a value outside ``(0, 1]``.

    upstream: vllm/v1/sample/ops/topk_topp_sampler.py:328 apply_top_k_top_p_pytorch
    """
    raise NotImplementedError("apply_top_k_top_p: "
                              "sort ascending (stable); mask below the k-th largest; cumsum of softmax <= 1 - p dropped, keep the last; scatter back")


# ---------------------------------------------------------------- the pipeline and the draw


def sampling_probs(logits, metadata: SamplingMetadata) -> np.ndarray:
    """The distribution each row draws from, through every step in upstream's order.

    allowed ids -> bad words -> min_tokens -> logit bias -> penalties ->
    (greedy rows: a one-hot on the argmax of these logits, lowest id on a tie)
    -> temperature -> min-p -> top-k/top-p -> softmax.

    logits: ``[B, V]``; metadata: B rows (``make_metadata``). Returns float64
    ``[B, V]``, each row summing to 1. Raises what the steps raise, and
    ValueError naming ``metadata`` when its batch size is not B.

    upstream: vllm/v1/sample/sampler.py:67 forward
    upstream: vllm/v1/sample/sampler.py:238 sample
    """
    raise NotImplementedError("sampling_probs: "
                              "allowed -> bad words -> min_tokens -> bias -> penalties -> (greedy argmax) -> temperature -> min-p -> top-k/top-p -> softmax")


def sample(logits, metadata: SamplingMetadata, generators) -> np.ndarray:
    """One token per row: int64 ``[B]``.

    Greedy rows (``temperature < SAMPLING_EPS``) take the argmax after the
    penalties and never touch their generator. Every other row ``i`` draws
    with its own ``generators[i]`` exactly as ``Generator.choice(V, p=row)``
    does: ``u = generators[i].random()``, ``cdf = cumsum(row) / cumsum(row)[-1]``,
    token = how many ``cdf`` entries are ``<= u``. So row i gives the token
    mini_vllm's ``Sampler.sample`` gives with the same generator, whatever
    its neighbours in the batch. The same Generator object may serve several
    rows; it is then advanced once per non-greedy row, in row order.

    generators: a sequence of B ``np.random.Generator`` (an entry of a greedy
    row may be None). Raises ValueError naming ``generators`` for a length
    other than B or a non-greedy row without a Generator, and what
    ``sampling_probs`` raises.

    upstream: vllm/v1/sample/ops/topk_topp_sampler.py:395 random_sample
    """
    raise NotImplementedError("sample: "
                              "greedy rows: argmax; others: u = generators[i].random(), token = (cdf <= u).sum()")


if __name__ == "__main__":
    V = 8
    logits = np.log(np.array([[0.5, 0.3, 0.12, 0.08, 1e-9, 1e-9, 1e-9, 1e-9]] * 4))
    md = make_metadata([
        {"temperature": 0.0},
        {"top_p": 0.85},
        {"min_p": 0.2, "top_p": 0.85},
        {"repetition_penalty": 2.0, "prompt_token_ids": [0], "output_token_ids": [1, 1],
         "frequency_penalty": 0.5},
    ])
    names = ["greedy", "top_p 0.85", "min_p 0.2 + top_p 0.85", "penalties"]
    probs = sampling_probs(logits, md)
    gens = [np.random.default_rng(s) for s in range(4)]
    draws = np.stack([sample(logits, md, gens) for _ in range(8)], axis=1)
    for name, p, d in zip(names, probs, draws, strict=True):
        print(f"{name:24s} p[:4] = {np.round(p[:4], 4).tolist()}  8 draws: {d.tolist()}")
