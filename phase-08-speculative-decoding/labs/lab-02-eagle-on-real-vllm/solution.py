"""Lab 08-02 — read vLLM's speculative-decoding log line and check it adds up (reference solution).

With ``disable_log_stats=False``, vLLM prints one line about speculation every
time it logs its stats (every ``VLLM_LOG_STATS_INTERVAL`` seconds, 10 by
default, and whenever ``do_log_stats()`` is called). It looks like this::

    SpecDecoding metrics: Mean acceptance length: 2.94, Accepted throughput: 96.91 tokens/s,
    Drafted throughput: 249.50 tokens/s, Accepted: 1938 tokens, Drafted: 4990 tokens,
    Per-position acceptance rate: 0.702, 0.487, 0.339, 0.238, 0.176, Avg Draft acceptance rate: 38.8%

(one line in the log; wrapped here). Every number on it comes from four
counters summed over the interval: ``drafts`` (verifies that carried at least
one draft token), ``drafted`` and ``accepted`` tokens, and ``accepted`` per
draft position. So the numbers are tied to each other:

* mean acceptance length ``L = 1 + accepted / drafts``: the bonus token (the
  one the target adds after the last kept draft) is included;
* per-position rate ``i`` = drafts whose position ``i`` was kept / drafts, an
  *unconditional* rate (position ``i`` is kept only if 0..i-1 were), so the
  rates never increase and ``1 + sum(rates) = L``;
* "Avg Draft acceptance rate" = accepted / drafted, which is ``(L - 1) / k``
  when every draft has ``k`` tokens (EAGLE, draft models) and larger when
  drafts are shorter (n-gram lookup proposes fewer when the match runs out).

This module parses the line, turns ``L`` back into the per-position
acceptance ``alpha`` of lab 04's model, checks a line for numbers that cannot
come from one run, and predicts the inter-token latency speculation buys.

upstream: vllm/v1/spec_decode/metrics.py:74 log
upstream: vllm/v1/spec_decode/metrics.py:95 mean_acceptance_length
upstream: vllm/v1/spec_decode/metrics.py:98 acceptance_rates
upstream: vllm/v1/core/sched/scheduler.py:1372 num_draft_tokens
upstream: vllm/v1/spec_decode/utils.py:599 unconditional_to_conditional_rates
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

# ---------------------------------------------------------------- given

# The format vLLM 0.22.1 logs (SpecDecodingLogging.log), joined into one string;
# a test checks it against upstream/ character for character.
METRICS_FORMAT = (
    "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
    "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
    "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%"
)

# The checks reconcile_metrics can fail, in the order it reports them.
CHECKS = (
    "per_position_range",
    "per_position_order",
    "length_vs_per_position",
    "rate_vs_counts",
    "throughput_vs_counts",
    "rate_vs_length",
    "full_drafts",
)


@dataclass(frozen=True)
class SpecDecodingMetrics:
    """Given. The seven fields of one "SpecDecoding metrics" line, as logged (already rounded).

    mean_acceptance_length: float, 2 decimals in the log.
    accepted_throughput, drafted_throughput: float tokens/s, 2 decimals.
    accepted, drafted: int token counts over the interval.
    per_position: tuple of k floats, 3 decimals each (k = num_speculative_tokens).
    draft_acceptance_rate_pct: float percent, 1 decimal; nan when nothing was drafted.
    """

    mean_acceptance_length: float
    accepted_throughput: float
    drafted_throughput: float
    accepted: int
    drafted: int
    per_position: tuple[float, ...]
    draft_acceptance_rate_pct: float

    @property
    def k(self) -> int:
        """num_speculative_tokens: one per-position rate per draft position."""
        return len(self.per_position)


def render_metrics_line(mean_acceptance_length, accepted_throughput, drafted_throughput,
                        accepted, drafted, per_position, draft_acceptance_rate_pct) -> str:
    """Given. The line vLLM would log for these values (``METRICS_FORMAT`` filled in as
    upstream does, rates joined with ``", "`` at 3 decimals)."""
    rates_str = ", ".join(f"{p:.3f}" for p in per_position)
    return METRICS_FORMAT % (mean_acceptance_length, accepted_throughput, drafted_throughput,
                             accepted, drafted, rates_str, draft_acceptance_rate_pct)


def expected_tokens_per_verify(alpha: float, k: int) -> float:
    """Given (lab 04's model). ``1 + alpha + ... + alpha**k``: tokens one verify emits when
    each draft position is kept with conditional probability ``alpha``."""
    return float(sum(alpha ** i for i in range(k + 1)))


def _check_k(k) -> int:
    """Given. ``k`` as an int; ValueError naming ``k`` unless it is an integer >= 1."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def _check_length(mean_acceptance_length, k: int) -> float:
    """Given. ValueError naming ``mean_acceptance_length`` unless it is a number in [1, k + 1]."""
    L = mean_acceptance_length
    if (isinstance(L, bool) or not isinstance(L, numbers.Real) or not math.isfinite(L)
            or not 1.0 <= L <= k + 1):
        raise ValueError(f"mean_acceptance_length must be a number in [1, k + 1] = "
                         f"[1, {k + 1}], got {L!r}")
    return float(L)


def _check_nonneg(value, name: str, allow_zero: bool = True) -> float:
    """Given. ValueError naming ``name`` unless ``value`` is finite and >= 0 (> 0 if not
    ``allow_zero``)."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and math.isfinite(value) and (value >= 0 if allow_zero else value > 0))
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, "
                         f"got {value!r}")
    return float(value)


# ---------------------------------------------------------------- 1. parse

_NUM = r"(?:nan|-?inf|-?\d+(?:\.\d+)?)"
# The rates are themselves joined with ", ", the separator of the fields: anchor every
# field on its label, never split the line on commas.
_LINE_RE = re.compile(
    r"SpecDecoding metrics: "
    rf"Mean acceptance length: (?P<mean>{_NUM}), "
    rf"Accepted throughput: (?P<acc_tp>{_NUM}) tokens/s, "
    rf"Drafted throughput: (?P<draft_tp>{_NUM}) tokens/s, "
    r"Accepted: (?P<accepted>\d+) tokens, "
    r"Drafted: (?P<drafted>\d+) tokens, "
    rf"Per-position acceptance rate: (?P<rates>{_NUM}(?:, {_NUM})*), "
    rf"Avg Draft acceptance rate: (?P<rate>{_NUM})%"
)


def parse_metrics_line(line) -> SpecDecodingMetrics:
    """Parse one "SpecDecoding metrics" line into a ``SpecDecodingMetrics``.

    line: a str holding the line anywhere in it (a logger prefix such as
    ``"(EngineCore pid=7) INFO 06-01 12:00:00 [loggers.py:276] "`` before it
    is fine). The rates string is split into floats, the counts are ints, the
    percent sign is not part of the number; "nan" parses to float nan.

    Raises ValueError naming ``line`` when it is not a str or holds no
    complete metrics line in upstream's format.
    """
    if not isinstance(line, str):
        raise ValueError(f"line must be a str, got {type(line).__name__}")
    m = _LINE_RE.search(line)
    if m is None:
        raise ValueError(f"line holds no 'SpecDecoding metrics:' line in vLLM's format: {line!r}")
    return SpecDecodingMetrics(
        mean_acceptance_length=float(m["mean"]),
        accepted_throughput=float(m["acc_tp"]),
        drafted_throughput=float(m["draft_tp"]),
        accepted=int(m["accepted"]),
        drafted=int(m["drafted"]),
        per_position=tuple(float(x) for x in m["rates"].split(", ")),
        draft_acceptance_rate_pct=float(m["rate"]),
    )


def find_metrics_lines(log_text) -> list[SpecDecodingMetrics]:
    """Every "SpecDecoding metrics" line of a log, parsed, in order.

    log_text: a str (a whole captured log; other lines are ignored). A line
    that starts the metrics but does not complete the format (cut off) is
    skipped. Returns [] when there is none.

    Raises ValueError naming ``log_text`` when it is not a str.
    """
    if not isinstance(log_text, str):
        raise ValueError(f"log_text must be a str, got {type(log_text).__name__}")
    return [parse_metrics_line(ln) for ln in log_text.splitlines() if _LINE_RE.search(ln)]


# ---------------------------------------------------------------- 2. from L to rates


def draft_acceptance_rate(mean_acceptance_length, k) -> float:
    """What "Avg Draft acceptance rate" must be, as a fraction, when every draft has k tokens.

    accepted / drafted with drafted = k * drafts and accepted = (L - 1) * drafts:
    ``(L - 1) / k``. L = 2.8, k = 5 -> 0.36; L = 3.8 -> 0.56.

    Raises ValueError naming ``k`` (not an integer >= 1) or
    ``mean_acceptance_length`` (outside [1, k + 1]).
    """
    k = _check_k(k)
    L = _check_length(mean_acceptance_length, k)
    # L counts the bonus token, which was never drafted: take it off first
    return (L - 1.0) / k


def alpha_from_mean_acceptance_length(mean_acceptance_length, k, tol=1e-12) -> float:
    """The conditional acceptance ``alpha`` for which lab 04's model predicts this L.

    Solves ``1 + alpha + ... + alpha**k = L`` (that is ``(1 - alpha**(k+1)) /
    (1 - alpha) = L``) for alpha in [0, 1] by bisection: the left side rises
    strictly from 1 at alpha = 0 to k + 1 at alpha = 1, so the root is unique.
    Returns exactly 0.0 for L = 1 and exactly 1.0 for L = k + 1; otherwise
    a float within ``tol`` of the root. L = 2.8, k = 5 -> 0.6773; 3.8 -> 0.8126.

    Raises ValueError naming ``k`` (not an integer >= 1),
    ``mean_acceptance_length`` (outside [1, k + 1]) or ``tol`` (not > 0).
    """
    k = _check_k(k)
    L = _check_length(mean_acceptance_length, k)
    tol = _check_nonneg(tol, "tol", allow_zero=False)
    if L == 1.0:
        return 0.0
    if L == k + 1:
        return 1.0
    # Search [0, 1] only and use the sum, not 1 - a**(k+1) - L (1 - a): that product
    # form also vanishes at a = 1, a root that is no acceptance rate at all.
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_tokens_per_verify(mid, k) < L:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def conditional_acceptance_rates(per_position) -> list[float]:
    """Turn vLLM's per-position rates (unconditional) into conditional ones.

    per_position: a sequence of k >= 1 numbers in [0, 1], as logged:
    ``P(position i kept)``. Returns ``P(position i kept | positions 0..i-1
    kept)`` = ``r[i] / r[i-1]`` (``r[-1]`` taken as 1), and 0.0 where the
    previous rate is 0 (nothing to condition on). Under lab 04's model every
    entry is alpha. A list of floats of the same length.

    Raises ValueError naming ``per_position`` when it is empty or holds a
    value outside [0, 1] (or not a number).
    """
    rates = list(per_position) if not isinstance(per_position, str) else None
    if not rates or not all(not isinstance(r, bool) and isinstance(r, numbers.Real)
                            and 0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"per_position must be a non-empty sequence of numbers in [0, 1], "
                         f"got {per_position!r}")
    out, prev = [], 1.0
    for r in rates:
        out.append(float(r) / prev if prev > 0.0 else 0.0)
        prev = float(r)
    return out


# ---------------------------------------------------------------- 3. reconcile


def reconcile_metrics(metrics, full_drafts=False) -> list[str]:
    """The names (from ``CHECKS``, in that order) of the checks a parsed line fails.

    Every printed number is rounded, so each check allows exactly the rounding
    of the numbers it uses (L: 0.005; a rate: 0.0005; a percentage: 0.05
    points; a throughput: 0.005 tokens/s) plus 1e-9, and no more. With k =
    ``metrics.k``, rates ``r``, L and rate ``R`` (as a fraction):

    * ``per_position_range``: some r outside [0, 1].
    * ``per_position_order``: some r[i] > r[i-1] (a position cannot be kept
      more often than the one before it).
    * ``length_vs_per_position``: ``|1 + sum(r) - L| > 0.005 + 0.0005 k``.
    * ``rate_vs_counts``: accepted > drafted, or drafted > 0 and
      ``|100 accepted / drafted - pct| > 0.05``, or drafted == 0 and pct is
      not nan.
    * ``throughput_vs_counts``: one time divides both counts; when drafted > 0
      and drafted_throughput > 0.005 (else skipped): ``|acc_tp / draft_tp -
      accepted / drafted| > 0.005 (1 + acc_tp / draft_tp) / (draft_tp - 0.005)``.
    * ``rate_vs_length``: a draft holds between 1 and k tokens, so ``(L - 1) /
      k <= R <= L - 1``; failed when ``R + 0.0005 < (L - 1 - 0.005) / k`` or
      ``R - 0.0005 > L - 1 + 0.005``.
    * ``full_drafts`` (checked only when ``full_drafts`` is True, for drafters
      that always propose k tokens): ``|R - (L - 1) / k| > 0.0005 + 0.005 / k``.

    Skip the checks on R when pct is nan. Returns [] for a consistent line.

    Raises ValueError naming ``metrics`` when it is not a SpecDecodingMetrics.
    """
    if not isinstance(metrics, SpecDecodingMetrics):
        raise ValueError(f"metrics must be a SpecDecodingMetrics, got {type(metrics).__name__}")
    eps = 1e-9
    k = metrics.k
    L = metrics.mean_acceptance_length
    r = metrics.per_position
    pct = metrics.draft_acceptance_rate_pct
    R = pct / 100.0
    failed = set()

    if any(not 0.0 <= x <= 1.0 for x in r):
        failed.add("per_position_range")
    # rounding to 3 decimals is monotone, so the order survives it exactly
    if any(b > a for a, b in zip(r, r[1:], strict=False)):
        failed.add("per_position_order")
    # the rates are unconditional: summed, they are accepted / drafts = L - 1
    if abs(1.0 + sum(r) - L) > 0.005 + 0.0005 * k + eps:
        failed.add("length_vs_per_position")

    if metrics.accepted > metrics.drafted:
        failed.add("rate_vs_counts")
    elif metrics.drafted > 0:
        if math.isnan(pct) or abs(100.0 * metrics.accepted / metrics.drafted - pct) > 0.05 + eps:
            failed.add("rate_vs_counts")
    elif not math.isnan(pct):
        failed.add("rate_vs_counts")

    acc_tp, draft_tp = metrics.accepted_throughput, metrics.drafted_throughput
    if draft_tp > 0.005 and metrics.drafted > 0:
        ratio = acc_tp / draft_tp
        if abs(ratio - metrics.accepted / metrics.drafted) > 0.005 * (1 + ratio) / (draft_tp - 0.005) + eps:
            failed.add("throughput_vs_counts")

    if not math.isnan(pct):
        # drafts of k tokens give the smallest rate, drafts of 1 token the largest
        if R + 0.0005 + eps < (L - 1.0 - 0.005) / k or R - 0.0005 - eps > L - 1.0 + 0.005:
            failed.add("rate_vs_length")
        if full_drafts and abs(R - (L - 1.0) / k) > 0.0005 + 0.005 / k + eps:
            failed.add("full_drafts")
    return [name for name in CHECKS if name in failed]


# ---------------------------------------------------------------- 4. what it buys


def predicted_itl_ms(baseline_itl_ms, mean_acceptance_length, k, draft_cost) -> float:
    """Inter-token latency with speculation, from the plain ITL and a measured L.

    One speculative step costs ``k * draft_cost + 1`` plain steps (k draft
    passes at ``draft_cost`` each, one verify priced as a plain step) and emits
    L tokens on average (lab 04's model with E = L). Returns
    ``baseline_itl_ms * (k * draft_cost + 1) / L`` as a float.

    Raises ValueError naming ``baseline_itl_ms`` (not finite > 0), ``k``,
    ``mean_acceptance_length`` (outside [1, k + 1]) or ``draft_cost`` (not
    finite >= 0).
    """
    baseline_itl_ms = _check_nonneg(baseline_itl_ms, "baseline_itl_ms", allow_zero=False)
    k = _check_k(k)
    L = _check_length(mean_acceptance_length, k)
    draft_cost = _check_nonneg(draft_cost, "draft_cost")
    # L already counts the bonus token: a step that keeps no draft still emits 1 token
    return baseline_itl_ms * (k * draft_cost + 1.0) / L


if __name__ == "__main__":
    for L in (2.8, 3.8):
        a = alpha_from_mean_acceptance_length(L, 5)
        print(f"L={L}, k=5: alpha={a:.4f}, draft acceptance rate={draft_acceptance_rate(L, 5):.1%}"
              f", conditional check E(alpha)={expected_tokens_per_verify(a, 5):.6f}")
    seed = render_metrics_line(2.8, 90.0, 160.71, 252, 450, [0.6, 0.45, 0.35, 0.25, 0.15], 56.0)
    print(seed)
    m = parse_metrics_line(seed)
    print("any drafter:", reconcile_metrics(m) or "consistent",
          "| k-token drafts:", reconcile_metrics(m, full_drafts=True))
    print(f"ITL 20 ms -> {predicted_itl_ms(20.0, 2.8, 5, 0.05):.2f} ms (L=2.8, k=5, c=0.05)")
