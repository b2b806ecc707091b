"""Lab 08-01 — prompt lookup, exactly as vLLM does it (reference solution).

Speculative decoding lets a cheap drafter guess the next few tokens and has
the expensive target model check all the guesses in one pass. This lab builds
the whole loop with the cheapest drafter there is: no second model at all,
just a search of the text already in the context (vLLM's ``method="ngram"``,
also called prompt lookup).

* ``ngram_propose`` is vLLM's n-gram proposer, rule for rule: take the
  longest suffix of the context, ``n`` tokens long with ``min_n <= n <=
  max_n``, that also occurs earlier; among its earlier occurrences take the
  **first** one; propose the (at most ``k``) tokens that followed it. The
  number of drafts is also capped so the context never runs past
  ``max_model_len``.
* ``verify_greedy`` is the greedy verification: keep drafts while they equal
  the target's own argmax at their position, then add one token from the
  target (the correction at the first mismatch, or the bonus token after the
  last draft). Every verification pass therefore emits at least one token.
* ``run_speculative`` and ``run_baseline`` generate the same tokens; the
  first counts how many target passes ("runs") it needed, in the counters
  vLLM's ``SpecDecodingStats`` keeps.
* ``tokens_per_run`` and ``mean_acceptance_length`` turn those counters into
  the two numbers people quote, which are not the same number.

A *target* here is any callable ``target(tokens: list[int]) -> int`` that
returns the greedy next token after ``tokens``. ``replay_target`` (given)
turns a recorded greedy sequence into such a callable.

upstream: vllm/v1/spec_decode/ngram_proposer.py:12 NgramProposer
upstream: vllm/v1/spec_decode/ngram_proposer.py:199 _find_longest_matched_ngram_and_propose_tokens
upstream: vllm/v1/sample/rejection_sampler.py:708 rejection_greedy_sample_kernel
upstream: vllm/v1/spec_decode/metrics.py:18 SpecDecodingStats
upstream: vllm/v1/core/sched/scheduler.py:396 max_model_len
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Target = Callable[[list[int]], int]

STATS_KEYS = ("num_runs", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
              "num_accepted_tokens_per_pos")


# ---------------------------------------------------------------- given helpers


def _check_int(name: str, value, low: int) -> int:
    """Given. ``value`` as an int, refused (naming ``name``) unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_tokens(name: str, tokens) -> list[int]:
    """Given. ``tokens`` as a list of Python ints, refused (naming ``name``) unless 1-D integers."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        return []
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D sequence of integer token ids, got "
                         f"{arr.dtype} with shape {arr.shape}")
    return [int(t) for t in arr]


def replay_target(sequence: Sequence[int]) -> Target:
    """Given. A greedy target that replays a recorded greedy sequence.

    Greedy decoding is a function of the prefix: the model's choice after
    ``sequence[:t]`` is ``sequence[t]``. The returned ``target(tokens)``
    answers exactly that, and raises ``ValueError`` (naming ``tokens``) when
    asked about anything that is not a proper prefix of ``sequence``, so a
    verification loop that feeds it the wrong context fails loudly.
    """
    recorded = _check_tokens("sequence", sequence)

    def target(tokens: list[int]) -> int:
        t = len(tokens)
        if t >= len(recorded) or list(tokens) != recorded[:t]:
            raise ValueError(f"tokens: not a proper prefix of the recorded sequence "
                             f"(length {t}, recorded {len(recorded)})")
        return recorded[t]

    return target


# ---------------------------------------------------------------- the proposer


def ngram_propose(tokens, min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """Propose up to ``k`` draft tokens by prompt lookup, with vLLM's rules.

    tokens: 1-D sequence of integer token ids (list or ndarray): the whole
        context so far, prompt plus generated tokens, ``len(tokens) <= max_model_len``.
    min_n, max_n: the n-gram lengths searched, ``1 <= min_n <= max_n``.
    k: the most drafts wanted, ``k >= 0``.
    max_model_len: the longest context the model accepts, ``>= 1``.

    Let ``T = len(tokens)``. An *occurrence* of the suffix ``tokens[T-n:]`` is a
    start ``s`` with ``tokens[s:s+n] == tokens[T-n:]`` that ends strictly
    before the last token (``s + n <= T - 1``; the suffix is not its own
    match). Find the largest ``n`` in ``[min_n, max_n]`` that has an
    occurrence, take its smallest ``s`` (the earliest occurrence), and return
    ``tokens[s+n : s+n+m]`` with ``m = min(k, max_model_len - T)`` (there may be
    fewer tokens left after the match: return what there is). Return ``[]``
    when ``T < min_n``, when ``m <= 0`` or when no ``n`` in range matches.

    Returns a list of Python ints. Raises ValueError naming ``tokens`` (not a
    1-D integer sequence, or longer than ``max_model_len``), ``min_n``,
    ``max_n`` (below ``min_n``), ``k`` or ``max_model_len``.
    """
    toks = _check_tokens("tokens", tokens)
    min_n = _check_int("min_n", min_n, 1)
    max_n = _check_int("max_n", max_n, min_n)
    k = _check_int("k", k, 0)
    max_model_len = _check_int("max_model_len", max_model_len, 1)
    total = len(toks)
    if total > max_model_len:
        raise ValueError(f"tokens: {total} tokens is longer than max_model_len = {max_model_len}")
    # never draft past the context limit (upstream: k = min(k, max_model_len - total_token))
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return []
    # Longest n first; the first n that matches anywhere wins, even if a shorter n
    # would have matched earlier in the text.
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = toks[total - n:]
        # s + n <= total - 1: the occurrence must end before the last token, so the
        # suffix never matches itself. Scanning s upward finds the earliest occurrence.
        for s in range(0, total - n):
            if toks[s:s + n] == suffix:
                start = s + n
                return toks[start:start + k]  # the slice stops at the end of the context
    return []


# ---------------------------------------------------------------- verification


def verify_greedy(context, proposed, target: Target) -> tuple[list[int], int]:
    """Verify draft tokens against a greedy target; return ``(emitted, num_accepted)``.

    context: 1-D integer sequence, the tokens before the drafts (not empty).
    proposed: 1-D integer sequence of draft tokens (may be empty).
    target: callable, ``target(tokens: list[int]) -> int``, the greedy next token.

    Draft ``i`` is accepted when it equals ``target(context + proposed[:i])``
    and every draft before it was accepted. At the first mismatch the
    target's own token (the correction) is emitted and the rest are dropped;
    when every draft is accepted, ``target(context + proposed)`` (the bonus
    token) is emitted after them. So ``emitted == proposed[:a] + [one target
    token]`` with ``a = num_accepted``, and ``len(emitted) == a + 1``.

    ``target`` is called exactly ``a + 1`` times, on ``context + proposed[:i]``
    for ``i = 0..a`` in that order, each time with a fresh list. (A real
    target computes all ``len(proposed) + 1`` positions in one pass; the ones
    after a rejection are thrown away, so this loop does not ask for them.)

    Raises ValueError naming ``context`` (empty or not integers),
    ``proposed`` or ``target`` (not callable).
    """
    ctx = _check_tokens("context", context)
    if not ctx:
        raise ValueError("context must hold at least one token")
    drafts = _check_tokens("proposed", proposed)
    if not callable(target):
        raise ValueError(f"target must be a callable tokens -> next token, got {target!r}")
    emitted: list[int] = []
    for draft in drafts:
        # the target's choice at this position sees every token accepted so far
        choice = int(target(ctx + emitted))
        if choice != draft:
            return emitted + [choice], len(emitted)  # correction token
        emitted.append(draft)
    return emitted + [int(target(ctx + emitted))], len(emitted)  # bonus token


# ---------------------------------------------------------------- generation loops


def new_stats(k: int) -> dict:
    """Given. Zeroed counters, named after ``SpecDecodingStats``, plus ``num_runs``.

    num_runs: target passes; num_drafts: passes that verified >= 1 draft;
    num_draft_tokens / num_accepted_tokens: drafts verified / accepted;
    num_accepted_tokens_per_pos: list of ``k`` counts, entry ``i`` = passes that
    accepted draft ``i`` (so entry 0 >= entry 1 >= ...).
    """
    return {"num_runs": 0, "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
            "num_accepted_tokens_per_pos": [0] * k}


def run_speculative(prompt, target: Target, num_tokens: int, *, k: int = 3, min_n: int = 1,
                    max_n: int = 3, max_model_len: int = 1024) -> tuple[list[int], dict]:
    """Generate ``num_tokens`` tokens with n-gram drafts and greedy verification.

    prompt: non-empty 1-D integer sequence, ``len(prompt) < max_model_len``.
    target: ``target(tokens: list[int]) -> int``, the greedy next token.
    num_tokens: tokens to generate, ``>= 1``.
    k, min_n, max_n, max_model_len: as in ``ngram_propose`` (``k >= 0``).

    Each run: ``d = ngram_propose(context, min_n, max_n, k, max_model_len)``;
    trim ``d`` to ``budget - 1`` tokens, where ``budget`` is how many tokens may
    still be emitted (``num_tokens`` minus those generated, and no more than
    ``max_model_len - len(context)``) — a run emits up to ``len(d) + 1`` tokens,
    so this is what keeps it inside both limits; then ``verify_greedy`` and
    append what it emits. Stop when ``num_tokens`` tokens are generated or the
    context reaches ``max_model_len``.

    Returns ``(generated, stats)``: the generated tokens only (not the prompt),
    always equal to ``run_baseline(prompt, target, num_tokens, max_model_len)``,
    and ``stats`` as ``new_stats(k)`` describes, updated once per run with the
    trimmed ``d``. ``len(generated) == num_accepted_tokens + num_runs``.

    Raises ValueError naming ``prompt``, ``num_tokens``, ``target``, ``k``,
    ``min_n``, ``max_n`` or ``max_model_len``.
    """
    context, num_tokens = _check_loop_args(prompt, target, num_tokens, max_model_len)
    k = _check_int("k", k, 0)  # before new_stats(k); min_n and max_n: ngram_propose checks them
    stats = new_stats(k)
    generated: list[int] = []
    while len(generated) < num_tokens and len(context) < max_model_len:
        budget = min(num_tokens - len(generated), max_model_len - len(context))
        drafts = ngram_propose(context, min_n, max_n, k, max_model_len)[:budget - 1]
        emitted, accepted = verify_greedy(context, drafts, target)
        stats["num_runs"] += 1
        if drafts:  # upstream counts a draft only for a pass that verified drafts
            stats["num_drafts"] += 1
            stats["num_draft_tokens"] += len(drafts)
            stats["num_accepted_tokens"] += accepted
            for i in range(accepted):
                stats["num_accepted_tokens_per_pos"][i] += 1
        context += emitted
        generated += emitted
    return generated, stats


def run_baseline(prompt, target: Target, num_tokens: int, max_model_len: int = 1024) -> list[int]:
    """Plain greedy decoding: one target pass per token.

    Same arguments as ``run_speculative`` without the drafting ones. Returns
    the ``min(num_tokens, max_model_len - len(prompt))`` generated tokens.
    Raises ValueError naming ``prompt``, ``num_tokens``, ``target`` or
    ``max_model_len``.
    """
    context, num_tokens = _check_loop_args(prompt, target, num_tokens, max_model_len)
    generated: list[int] = []
    while len(generated) < num_tokens and len(context) < max_model_len:
        token = int(target(list(context)))
        context.append(token)
        generated.append(token)
    return generated


def _check_loop_args(prompt, target, num_tokens, max_model_len) -> tuple[list[int], int]:
    """Given. The checks ``run_speculative`` and ``run_baseline`` share."""
    context = _check_tokens("prompt", prompt)
    max_model_len = _check_int("max_model_len", max_model_len, 1)
    if not context or len(context) >= max_model_len:
        raise ValueError(f"prompt must hold 1 to max_model_len - 1 = {max_model_len - 1} tokens, "
                         f"got {len(context)}")
    if not callable(target):
        raise ValueError(f"target must be a callable tokens -> next token, got {target!r}")
    return context, _check_int("num_tokens", num_tokens, 1)


# ---------------------------------------------------------------- metrics


def _check_stats(stats) -> dict:
    """Given. ``stats`` refused (naming it) unless it has the counters and ``num_runs >= 1``."""
    if not isinstance(stats, dict) or any(key not in stats for key in STATS_KEYS):
        raise ValueError(f"stats must be a dict with the keys {', '.join(STATS_KEYS)}")
    if stats["num_runs"] < 1:
        raise ValueError(f"stats must count at least one run, got num_runs = {stats['num_runs']}")
    return stats


def tokens_per_run(stats: dict) -> float:
    """Tokens emitted per target pass, every pass counted: ``(accepted + runs) / runs``.

    stats: a dict as ``run_speculative`` returns (``num_runs >= 1``). Plain
    decoding gives exactly 1.0; ``k`` drafts per pass give at most ``k + 1``.
    Raises ValueError naming ``stats``.
    """
    stats = _check_stats(stats)
    return (stats["num_accepted_tokens"] + stats["num_runs"]) / stats["num_runs"]


def mean_acceptance_length(stats: dict) -> float:
    """vLLM's "Mean acceptance length": ``1 + accepted / num_drafts``.

    Only passes that verified drafts are counted (a pass with no draft is not
    a draft), and the 1 is the token every pass adds (correction or bonus).
    Returns ``nan`` when no pass had drafts. Raises ValueError naming ``stats``.
    """
    stats = _check_stats(stats)
    if stats["num_drafts"] == 0:
        return float("nan")
    return 1 + stats["num_accepted_tokens"] / stats["num_drafts"]


# ---------------------------------------------------------------- example


def _example() -> None:
    """Print the README's example: periodic text, then a random target."""
    def periodic(tokens: list[int]) -> int:
        return (tokens[-1] + 1) % 7  # ... 5, 6, 0, 1, ...: period 7

    out, stats = run_speculative([0], periodic, 40, k=4, min_n=1, max_n=3)
    assert out == run_baseline([0], periodic, 40)
    print(f"periodic: {len(out)} tokens in {stats['num_runs']} runs, "
          f"tokens/run {tokens_per_run(stats):.3f}, "
          f"mean acceptance length {mean_acceptance_length(stats):.3f}")
    sequence = [int(t) for t in np.random.default_rng(0).integers(0, 50, 201)]
    out, stats = run_speculative(sequence[:1], replay_target(sequence), 200, k=4, min_n=1, max_n=3)
    assert out == sequence[1:]
    print(f"random:   {len(out)} tokens in {stats['num_runs']} runs, "
          f"{stats['num_accepted_tokens']} of {stats['num_draft_tokens']} drafts accepted, "
          f"tokens/run {tokens_per_run(stats):.3f}")


if __name__ == "__main__":
    _example()
