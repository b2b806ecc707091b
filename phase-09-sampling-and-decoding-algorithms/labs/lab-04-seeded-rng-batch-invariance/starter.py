"""Lab 09-04 — seeded generators and batch invariance (your implementation).

A sampler that serves a batch draws random numbers for every row at once.
Whose random numbers, exactly, decides whether a request's tokens depend on
who else happened to be in the batch. vLLM's answer has two halves, and this
lab builds both in numpy:

* A request that sets ``SamplingParams.seed`` gets a generator of its own,
  created once from that seed when the request is added and kept until it
  finishes. Its row of noise comes from that generator alone, so its tokens
  are the same alone, next to one neighbour or next to fifty.
* Every other random request draws from **one shared stream** (in vLLM,
  torch's global generator, seeded once from the engine's ``seed``). One call
  fills the noise of the whole batch, so the numbers a request gets depend on
  its row and on how many rows came before it, this step and every earlier
  one: an unseeded request is reproducible only if the whole batch is.

The draw itself is the exponential race: ``argmax(p / q)`` with ``q`` a row
of independent Exp(1) numbers picks token ``i`` with probability ``p[i]``
(Phase 08's lab 03 proves it). ``random_sample`` is vLLM's function of the
same name, line for line, with ``numpy.random.Generator`` in place of
``torch.Generator``; ``SeededBatchSampler`` is the bookkeeping around it:
which request owns which generator, and the greedy rows that touch none.

Everything is float64. Nothing here modifies an input array.

upstream: vllm/v1/sample/ops/topk_topp_sampler.py:395 random_sample
upstream: vllm/v1/sample/sampler.py:238 sample
upstream: vllm/sampling_params.py:628 sampling_type
upstream: vllm/v1/worker/gpu_model_runner.py:1200 manual_seed
upstream: vllm/v1/worker/gpu_input_batch.py:413 InputBatch.generators
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Upstream's _SAMPLING_EPS: a temperature below it means greedy.
SAMPLING_EPS = 1e-5


# ---------------------------------------------------------------- given helpers


def _as_probs(probs) -> np.ndarray:
    """Given. ``probs`` as float64 ``[B, V]``, refused unless finite, >= 0, rows summing above 0."""
    arr = np.asarray(probs)
    if arr.dtype.kind not in "iuf" or arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"probs must be a non-empty 2-D float array [batch, vocab], got shape "
                         f"{arr.shape} of {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr.sum(axis=1) <= 0).any():
        raise ValueError("probs must be finite and >= 0, with a positive sum in every row")
    return arr


def _check_generators(generators, batch: int) -> None:
    """Given. ``generators`` must map row numbers in [0, batch) to numpy Generators."""
    if not isinstance(generators, dict):
        raise ValueError(f"generators must be a dict {{row: numpy Generator}}, got "
                         f"{type(generators).__name__}")
    for row, gen in generators.items():
        if isinstance(row, bool) or not isinstance(row, int | np.integer) or not 0 <= row < batch:
            raise ValueError(f"generators: row {row!r} is not an integer in [0, {batch})")
        if not isinstance(gen, np.random.Generator):
            raise ValueError(f"generators: row {row} maps to {type(gen).__name__}, "
                             f"not a numpy Generator")


def _as_logits(logits, batch: int) -> np.ndarray:
    """Given. ``logits`` as float64 ``[batch, V]``, refused unless finite with ``batch`` rows."""
    arr = np.asarray(logits)
    if arr.dtype.kind not in "iuf" or arr.ndim != 2 or arr.shape[1] == 0 or arr.shape[0] != batch:
        raise ValueError(f"logits must be a 2-D array [{batch}, vocab] (one row per request id), "
                         f"got shape {arr.shape} of {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise ValueError("logits must be finite")
    return arr


# ---------------------------------------------------------------- the draw


def random_sample(probs, generators: dict[int, np.random.Generator],
                  shared: np.random.Generator) -> np.ndarray:
    """One token per row by the exponential race, with vLLM's choice of noise.

    probs: array ``[B, V]`` (float; finite, >= 0, every row with a positive
    sum; rows need not sum to 1). generators: ``{row: Generator}`` for the
    rows whose request has its own seed (any subset of ``range(B)``, possibly
    empty). shared: the one ``numpy.random.Generator`` every other row draws
    from.

    The noise ``q`` is float64 ``[B, V]``, built exactly like this:

    1. If some row has no generator (``len(generators) != B``), fill all of
       ``q`` with ONE call ``shared.standard_exponential((B, V))``; the rows
       that do have a generator are drawn too and then overwritten, as
       upstream does. If every row has one, ``shared`` is not touched.
    2. For each ``row, gen`` in ``generators`` (in the dict's order):
       ``q[row] = gen.standard_exponential(V)``: V numbers from that
       request's stream, whatever ``B`` is and wherever the row sits.

    Returns int64 ``[B]``: ``argmax(probs / q)`` along each row (token ``i``
    wins with probability ``probs[i] / sum(probs)``; a zero never wins).
    ``probs`` is not modified (upstream divides it in place).

    Raises ValueError naming ``probs`` (not 2-D, empty, non-finite, negative,
    a row of zeros), ``generators`` (not a dict, a row outside ``[0, B)``, a
    value that is not a Generator) or ``shared`` (not a Generator).

    upstream: vllm/v1/sample/ops/topk_topp_sampler.py:395 random_sample
    """
    raise NotImplementedError("random_sample: shared (B, V) draw, seeded rows redrawn, argmax(p / q)")


# ---------------------------------------------------------------- the sampler


class SeededBatchSampler:
    """Per-request generators around ``random_sample``: vLLM's seeding rules.

    ``seed`` (int >= 0, default 0) seeds the shared stream,
    ``self.shared = np.random.default_rng(seed)``, as vLLM seeds torch's global
    generator from ``EngineArgs.seed``. Requests are added with a temperature
    and an optional seed, sampled in batches of any composition by request
    id, and removed when they finish.

    upstream: vllm/utils/torch_utils.py:405 set_random_seed
    upstream: vllm/v1/worker/gpu_input_batch.py:552 InputBatch.generators
    """

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.shared = np.random.default_rng(seed)
        self._temperature: dict[str, float] = {}
        self._generators: dict[str, np.random.Generator] = {}

    def add_request(self, request_id: str, temperature: float, seed: int | None = None) -> None:
        """Register a request before its first step.

        request_id: a non-empty str not already registered. temperature: a
        finite number >= 0; below ``SAMPLING_EPS`` the request is greedy.
        seed: ``None`` or an integer >= 0.

        A request that is random (temperature >= ``SAMPLING_EPS``) and seeded
        gets its generator now, ``np.random.default_rng(seed)``, created once
        and kept for the request's whole life. A greedy request never gets
        one, seed or not (vLLM classifies it GREEDY before it looks at the
        seed); an unseeded random request gets none either (it will draw
        from ``self.shared``).

        Raises ValueError naming ``request_id`` (not a non-empty str, or
        already registered), ``temperature`` (not a finite number >= 0; bool
        refused) or ``seed`` (not None or an integer >= 0; bool refused).

        upstream: vllm/sampling_params.py:628 sampling_type
        upstream: vllm/v1/worker/gpu_model_runner.py:1200 manual_seed
        """
        raise NotImplementedError("add_request: a generator only for a seeded, non-greedy request")

    def remove_request(self, request_id: str) -> None:
        """Forget a finished request: its temperature and its generator.

        Afterwards ``request_id`` may be added again, and then starts from a
        fresh generator (a reused id must not continue the old stream).

        Raises ValueError naming ``request_id`` if it is not registered.
        """
        raise NotImplementedError("remove_request: forget the temperature and the generator")

    def generators_for(self, request_ids: Sequence[str]) -> dict[int, np.random.Generator]:
        """The ``generators`` argument of ``random_sample`` for one batch.

        request_ids: the batch's rows in order (row ``r`` is
        ``request_ids[r]``); each registered, none twice. Returns ``{row:
        generator}`` for exactly the rows whose request owns a generator, and
        the values are the request's own objects (never copies, never new
        ones), so drawing from them moves the request's stream on. The same
        request gets the same object whatever row it sits in.

        Raises ValueError naming ``request_ids`` (an id not registered, an id
        twice, or not a sequence of str).
        """
        raise NotImplementedError("generators_for: {row: the request's own generator}")

    def sample(self, request_ids: Sequence[str], logits) -> np.ndarray:
        """One step: one token for each row of ``logits``.

        request_ids: B distinct registered ids, row ``r`` of ``logits``
        belonging to ``request_ids[r]``. logits: finite array ``[B, V]``.
        Returns int64 ``[B]``.

        * Greedy rows get ``argmax(logits[r])`` (the lowest id on a tie).
        * If every row is greedy, that is all: no generator is touched, not
          even ``self.shared``.
        * Otherwise, as upstream's ``Sampler.sample`` does: divide each row
          by its temperature, with greedy rows' temperature replaced by 1.0
          (they go through the draw too, and their result is thrown away);
          softmax each row (float64, max subtracted first, so logits of any
          size work); call ``random_sample(probs, self.generators_for(
          request_ids), self.shared)`` once for the whole batch; take the
          drawn token for random rows and the argmax for greedy ones. So a
          greedy row still widens the shared draw by one row.

        Raises ValueError naming ``request_ids`` (as ``generators_for``) or
        ``logits`` (not 2-D with B rows and V >= 1 columns, or not finite).

        upstream: vllm/v1/sample/sampler.py:223 apply_temperature
        upstream: vllm/v1/sample/sampler.py:238 sample
        """
        raise NotImplementedError("sample: all greedy -> argmax; else one random_sample call")

    # Given: the request_ids check shared by generators_for and sample.
    def _check_request_ids(self, request_ids) -> list[str]:
        if isinstance(request_ids, str) or not isinstance(request_ids, Sequence):
            raise ValueError(f"request_ids must be a sequence of registered ids, got {request_ids!r:.60}")
        ids = list(request_ids)
        unknown = [r for r in ids if r not in self._temperature]
        if unknown:
            raise ValueError(f"request_ids: {unknown[0]!r} is not registered")
        if len(set(ids)) != len(ids):
            raise ValueError("request_ids: an id appears twice in one batch")
        return ids


# ---------------------------------------------------------------- demo


def _demo() -> None:
    vocab, steps = 64, 8
    flat = np.zeros((1, vocab))  # uniform: every token equally likely

    def run(neighbours: int, seed: int | None) -> list[int]:
        s = SeededBatchSampler(seed=0)
        for j in range(neighbours):
            s.add_request(f"n{j}", 1.0)
        s.add_request("me", 1.0, seed=seed)
        ids = [f"n{j}" for j in range(neighbours)] + ["me"]
        logits = np.repeat(flat, len(ids), axis=0)
        return [int(s.sample(ids, logits)[-1]) for _ in range(steps)]

    for seed in (7, None):
        label = f"seed={seed}" if seed is not None else "no seed"
        for n in (0, 1, 5):
            print(f"{label:8s} {n} neighbour(s) in front: {run(n, seed)}")


if __name__ == "__main__":
    _demo()
