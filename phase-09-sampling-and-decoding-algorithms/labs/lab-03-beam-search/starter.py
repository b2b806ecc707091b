"""Lab 09-03 — beam search the way vLLM runs it (your implementation).

Greedy decoding commits to the single most likely token at every step. That is
the best choice for the next token and can be the wrong choice for the
sequence: a token that looks good now may only lead to poor continuations,
while a slightly worse one leads to a near-certain one. Beam search keeps the
``beam_width`` best partial sequences (*beams*) alive at each step instead of
one, and picks among whole sequences at the end.

Part 1 works on any next-token distribution given as a function, with no
engine: ``greedy_decode``, ``beam_search`` and ``brute_force_best`` (the
exhaustive answer both are judged against), on ``TRAP``, a six-token Markov
chain built so that greedy walks into a trap (joint probability 0.306) that a
width-2 beam avoids (0.36).

Part 2 is vLLM's algorithm. vLLM has no beam-search kernel: its offline
``LLM.beam_search`` is a loop *around* the engine. Each step, every live beam
becomes its own one-token greedy request asking for ``2 * beam_width``
logprobs; each returned token extends the beam into a candidate; candidates
ending in EOS are set aside as finished; the ``beam_width`` best of the rest
live on. Beams are ranked by ``beam_search_score``, the cumulative log
probability divided by ``len(tokens) ** length_penalty``, where ``tokens``
holds the prompt too (one less when the last token is EOS).
``engine_beam_search`` runs that loop on mini_vllm. Prefix caching is what
makes it affordable: a beam's request shares all but its last partial block
with the request of its parent, so it computes at most one block of tokens.

Given (not for you to write): ``Beam``, the ``TRAP`` fixture and
``trap_logprobs``, and ``MarkovLM``, a model mini_vllm can serve whose next
token depends only on the last one (so ``TRAP`` runs through the engine too).

upstream: vllm/entrypoints/generate/beam_search/offline.py:27 beam_search
upstream: vllm/entrypoints/generate/beam_search/utils.py:137 get_beam_search_score
upstream: vllm/entrypoints/generate/beam_search/utils.py:112 BeamSearchInstance
upstream: vllm/sampling_params.py:977 BeamSearchParams
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------- given: beams and the TRAP fixture


@dataclass
class Beam:
    """One sequence and its cumulative log probability.

    ``tokens`` holds the prompt followed by the generated tokens (upstream's
    ``BeamSearchSequence.tokens`` does too); ``cum_logprob`` sums the log
    probabilities of the generated tokens only.
    """

    tokens: list[int]
    cum_logprob: float


# TRAP: a Markov chain over six tokens; the next token depends only on the last.
S, A, B, C, D, EOS = range(6)
TRAP_NAMES = ("S", "A", "B", "C", "D", "EOS")
TRAP_PROBS = np.array([
    #  S    A    B     C     D    EOS
    [0.0, 0.6, 0.4, 0.00, 0.00, 0.0],  # S: A is the likelier first step ...
    [0.0, 0.0, 0.0, 0.51, 0.49, 0.0],  # A: ... but after A nothing is likely
    [0.0, 0.0, 0.0, 0.90, 0.10, 0.0],  # B: after B, C is nearly certain
    [0.0, 0.0, 0.0, 0.00, 0.00, 1.0],  # C: then the sequence ends
    [0.0, 0.0, 0.0, 0.00, 0.00, 1.0],  # D: likewise
    [0.0, 0.0, 0.0, 0.00, 0.00, 1.0],  # EOS: never extended by the searches
])
with np.errstate(divide="ignore"):
    TRAP_LOGPROBS = np.log(TRAP_PROBS)  # probability 0 -> -inf


def trap_logprobs(tokens) -> np.ndarray:
    """Given. The next-token log probabilities [6] (float64) after ``tokens``: row ``tokens[-1]``."""
    return TRAP_LOGPROBS[tokens[-1]]


class MarkovLM:
    """Given. A model mini_vllm's ``LLMEngine`` can serve: logits = ``table[last token]``.

    ``table`` is ``[V, V]`` log probabilities (row i: the next token after i);
    each row's log-softmax is the row itself when it already sums to one in
    probability. It has no attention and no KV cache, but the engine schedules,
    caches prefixes and samples for it exactly as for a transformer.
    """

    def __init__(self, table, eos_token_id: int, max_model_len: int = 512) -> None:
        from mini_vllm.tokenizer import ByteTokenizer

        self.table = np.asarray(table, dtype=np.float64)
        if self.table.ndim != 2 or self.table.shape[0] != self.table.shape[1]:
            raise ValueError(f"table must be a square [V, V] array, got shape {self.table.shape}")
        self.vocab_size = self.table.shape[0]
        if not 0 <= eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id must be in [0, {self.vocab_size}), got {eos_token_id}")
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.tokenizer = ByteTokenizer()  # only used to decode text, never to encode

    def init_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Nothing to allocate: the next token depends on the last one alone."""

    def execute(self, model_input) -> np.ndarray:
        """Logits [B, V]: the table's row for each request's last scheduled token."""
        return self.table[model_input.token_ids[model_input.logits_indices]]


def _check_common(prompt, max_tokens: int, beam_width: int | None = None) -> list[int]:
    """Given. Validate the shared arguments; return the prompt as a list of ints."""
    tokens = [int(t) for t in prompt]
    if not tokens:
        raise ValueError("prompt must hold at least one token, got an empty sequence")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if beam_width is not None and (isinstance(beam_width, bool) or not isinstance(beam_width, int)
                                   or beam_width < 1):
        raise ValueError(f"beam_width must be an integer >= 1, got {beam_width!r}")
    return tokens


NextLogprobs = Callable[[tuple[int, ...]], np.ndarray]

# ---------------------------------------------------------------- Part 1: search on a distribution


def greedy_decode(next_logprobs: NextLogprobs, prompt, max_tokens: int, eos_token_id: int) -> Beam:
    """Append the most likely token, step by step, up to ``max_tokens`` tokens.

    ``next_logprobs(tokens)`` takes a tuple of token ids (prompt + generated so
    far) and returns a float array [V] of log probabilities. Ties go to the
    lowest token id (``np.argmax``). Decoding stops after EOS (which is kept in
    ``tokens``) or after ``max_tokens`` generated tokens.

    Returns a ``Beam`` whose tokens start with the prompt. Raises ``ValueError``
    naming ``prompt`` (empty) or ``max_tokens`` (not an integer >= 1).
    """
    raise NotImplementedError("greedy_decode: take np.argmax of next_logprobs(tuple(tokens)) each step; stop after EOS")


def beam_search(next_logprobs: NextLogprobs, prompt, beam_width: int, max_tokens: int,
                eos_token_id: int) -> list[Beam]:
    """Textbook beam search ranked by cumulative log probability (joint probability).

    Start from one beam, the prompt. Each step (at most ``max_tokens``), every
    live beam is extended by every token whose log probability is finite
    (probability 0 is never a candidate), in beam order and, within a beam, in
    token-id order. A candidate ending in ``eos_token_id`` is finished: it goes
    to a completed list and is never extended. The other candidates are sorted
    by ``cum_logprob``, highest first (a stable sort, so ties keep candidate
    order), and the first ``beam_width`` become the live beams. The search
    stops early when no beam is live.

    Returns completed + live beams, sorted by ``cum_logprob`` highest first
    (stable, completed before live on ties), at most ``beam_width`` of them.
    Width 1 follows greedy's path, with one difference: an EOS candidate that
    greedy passes over is kept as a finished sequence and can win at the end.
    Raises ``ValueError`` naming ``prompt``, ``beam_width`` or ``max_tokens``.
    """
    raise NotImplementedError("beam_search: extend every live beam by every finite-logprob token; EOS candidates go to a completed list; keep the best beam_width")


def brute_force_best(next_logprobs: NextLogprobs, prompt, max_tokens: int, eos_token_id: int) -> Beam:
    """The sequence with the highest joint probability, found by trying them all.

    A sequence ends at EOS (included) or after ``max_tokens`` generated
    tokens; only tokens of finite log probability extend it. The search
    enumerates every such sequence (depth first, tokens in id order) and
    returns the one with the largest ``cum_logprob`` (the first found on a
    tie). Exponential in ``max_tokens``: for fixtures and tiny vocabularies.
    Raises ``ValueError`` naming ``prompt`` or ``max_tokens``.
    """
    raise NotImplementedError("brute_force_best: a recursive walk over every finite-logprob token; a sequence ends at EOS or after max_tokens")


# ---------------------------------------------------------------- Part 2: vLLM's algorithm on mini_vllm


def beam_search_score(tokens, cum_logprob: float, eos_token_id: int, length_penalty: float = 1.0) -> float:
    """vLLM's beam score: ``cum_logprob / seq_len ** length_penalty``.

    ``seq_len`` is ``len(tokens)``, prompt included, minus one when the last
    token is ``eos_token_id`` (the EOS itself does not count as length).
    ``length_penalty`` 0 ranks by ``cum_logprob`` alone; larger values favor
    longer sequences (their negative sum is divided by more). Returns a float.

    upstream: vllm/entrypoints/generate/beam_search/utils.py:137 get_beam_search_score
    """
    raise NotImplementedError("beam_search_score: cum_logprob / seq_len ** length_penalty, seq_len = len(tokens) minus one for a final EOS")


def engine_beam_search(llm, prompt_ids, beam_width: int, max_tokens: int, length_penalty: float = 1.0,
                       eos_token_id: int | None = None) -> list[Beam]:
    """vLLM's offline beam search, run on mini_vllm one engine request per beam per step.

    ``llm`` is a mini_vllm ``LLM`` or ``LLMEngine``; ``prompt_ids`` a non-empty
    list of token ids; ``eos_token_id`` defaults to the model's. Each of at
    most ``max_tokens`` steps:

    1. every live beam becomes a request ``{"prompt_token_ids": beam.tokens}``
       with ``SamplingParams(logprobs=2 * beam_width, max_tokens=1,
       temperature=0)``, all of them submitted together;
    2. every entry of a request's logprobs dict (its only position) extends
       that beam: tokens + [id], cum_logprob + logprob;
    3. a candidate ending in EOS goes to the completed list; the others are
       sorted by ``beam_search_score`` (highest first, stable) and the first
       ``beam_width`` live on.

    The loop stops early when no beam is live. Returns completed + live,
    sorted by score, highest first (stable), at most ``beam_width`` beams.
    Raises ``ValueError`` naming ``prompt``, ``beam_width`` or ``max_tokens``.

    upstream: vllm/entrypoints/generate/beam_search/offline.py:75 sampling_params
    upstream: vllm/entrypoints/generate/beam_search/offline.py:160 eos_token_id
    """
    raise NotImplementedError("engine_beam_search: each step: engine.generate one request per live beam with SamplingParams(logprobs=2 * beam_width, max_tokens=1, temperature=0.0)")


if __name__ == "__main__":
    def show(beam: Beam) -> str:
        return " ".join(TRAP_NAMES[t] for t in beam.tokens) + f"  p = {math.exp(beam.cum_logprob):.3f}"

    print("greedy      :", show(greedy_decode(trap_logprobs, [S], 3, EOS)))
    for width in (1, 2):
        print(f"beam width {width}:", show(beam_search(trap_logprobs, [S], width, 3, EOS)[0]))
    print("brute force :", show(brute_force_best(trap_logprobs, [S], 3, EOS)))
