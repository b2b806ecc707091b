"""Lab 10-07 — Data-parallel routing, and DP ranks that step in lockstep (your implementation).

Data parallelism runs several complete copies of the engine ("DP ranks"),
each with its own scheduler and KV cache, and a front end that decides
which copy gets each new request. vLLM's front end for this,
``DPLBAsyncMPClient``, does not ask the engines how busy they are when a
request arrives. A coordinator process collects every engine's queue lengths
and publishes them to the front ends at most every 100 ms; between two
publications the front end routes on a stale table that it edits itself:

    score(engine) = waiting * 4 + running       (a queued request costs 4x a running one)
    scan the engines from this client's start index, keep the first lowest score
    then add client_count to the chosen engine's waiting count

The local increment is what keeps a burst from landing on a single engine:
without it, eight requests that arrive within one publication interval all
see the same table and all pick the same engine.

The second half runs real DP ranks: forked processes joined by gloo, one
mini_vllm engine each. vLLM's MoE models need every DP rank to run a forward
pass at the same time, because the expert layers exchange tokens across the
ranks. A rank with nothing to do therefore runs a one-token dummy batch, and
the ranks agree on when a "wave" of work is over with an all-reduce of their
has-unfinished flags, done only every 32 steps to keep it cheap.

upstream: vllm/v1/engine/core_client.py:1349 DPLBAsyncMPClient
upstream: vllm/v1/engine/core_client.py:1382 get_core_engine_for_request
upstream: vllm/v1/engine/coordinator.py:23 DPCoordinator
upstream: vllm/v1/engine/core.py:1819 run_busy_loop
upstream: vllm/config/parallel.py:662 has_unfinished_dp
upstream: vllm/v1/worker/dp_utils.py:36 _run_ar
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

WAITING_WEIGHT = 4  # a waiting request counts four times a running one in the score
DP_SYNC_INTERVAL = 32  # steps between two "is anyone still busy?" all-reduces
DUMMY_BATCH_TOKENS = 1  # an idle rank's forward pass in a wave: one dummy decode token
POLICIES = ("score", "round_robin")


# ---------------------------------------------------------------- given helpers


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    """Given. ``value`` as an int in ``[low, high)`` (no upper bound when ``high`` is None).

    Raises ValueError naming ``name`` for a bool, a non-integer or a value out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value >= high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


@dataclass
class DPRun:
    """Given. What ``serve_dp`` did, one entry per request in ``arrivals`` order.

    engine_of: the engine index each request was sent to.
    arrival_tick / first_token_tick: the tick it arrived in and the tick whose
    engine step produced its first output token (TTFT in ticks is the difference).
    queue_sizes: after each routing decision, in decision order, every engine's
    ``waiting + running`` as the engines themselves report it (not the stale view).
    token_ids: each request's output tokens.
    ticks: how many ticks the run took.
    """

    engine_of: list[int] = field(default_factory=list)
    arrival_tick: list[int] = field(default_factory=list)
    first_token_tick: list[int] = field(default_factory=list)
    queue_sizes: list[list[int]] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    ticks: int = 0

    def ttft_ticks(self) -> np.ndarray:
        return np.asarray(self.first_token_tick) - np.asarray(self.arrival_tick)


# ---------------------------------------------------------------- the front end's choice


def engine_start_index(num_engines: int, client_index: int, client_count: int) -> int:
    """Where client ``client_index`` of ``client_count`` front ends starts its scan.

    ``(num_engines * client_index) // client_count``: the clients' start points
    are spread evenly over the engines, so that several front ends routing
    into idle engines (all scores 0) do not all pick engine 0.

    Raises ValueError naming ``num_engines`` (integer >= 1), ``client_count``
    (integer >= 1) or ``client_index`` (integer in ``[0, client_count)``).
    """
    raise NotImplementedError("engine_start_index: validate the three ints, "
                              "then (num_engines * client_index) // client_count")


def lb_score(waiting: int, running: int) -> int:
    """The load score of one engine: ``waiting * 4 + running``.

    A waiting request has not even been prefilled; it will cost a whole prompt
    of compute before it gets a token, so it weighs four times a running one.

    Raises ValueError naming ``waiting`` or ``running`` unless it is an integer >= 0.
    """
    raise NotImplementedError("lb_score: validate both counts, "
                              "then waiting * WAITING_WEIGHT + running")


def choose_engine(counts: list[list[int]], start_index: int = 0, client_count: int = 1,
                  dp_rank: int | None = None) -> int:
    """Pick an engine for one request, as ``DPLBAsyncMPClient`` does, and book it locally.

    counts: the front end's table, one mutable ``[waiting, running]`` list per
    engine (the last published counts plus this client's own increments).
    start_index: where the scan starts (``engine_start_index``). The scan visits
    ``start_index, start_index + 1, ...`` modulo the number of engines and keeps
    the first engine with the strictly lowest ``lb_score``; ties go to the
    engine scanned first. Then ``counts[chosen][0] += client_count`` *in place*:
    every front end assumes the others are routing the same way, so one of its
    requests stands for ``client_count`` of them.
    dp_rank: an explicit engine asked for by the request. It is returned as is,
    with no scan and no increment (upstream's ``data_parallel_rank``).

    Returns the chosen engine index.

    Raises ValueError naming ``counts`` unless it is a non-empty list of
    two-item lists of integers >= 0, ``start_index`` unless it is in
    ``[0, len(counts))``, ``client_count`` unless it is >= 1, ``dp_rank``
    unless it is None or in ``[0, len(counts))``.
    """
    raise NotImplementedError("choose_engine: validate; a dp_rank wins; scan from start_index, "
                              "keep the first strictly lowest lb_score; "
                              "counts[best][0] += client_count")


def engine_counts(engine) -> list[int]:
    """One engine's entry for the published table: ``[waiting, running]``.

    engine: a ``mini_vllm.LLMEngine``; waiting is ``len(engine.scheduler.waiting)``,
    running ``len(engine.scheduler.running)``. Note the order: the table is
    [waiting, running], while upstream's ``Scheduler.get_request_counts``
    returns (running, waiting) and the coordinator swaps them.
    Returns a new list on every call.
    """
    raise NotImplementedError("engine_counts: [len(engine.scheduler.waiting), "
                              "len(engine.scheduler.running)]")


# ---------------------------------------------------------------- a front end over in-process engines


def serve_dp(engines: list, arrivals: list, policy: str = "score", publish_every: int = 1,
             client_index: int = 0, client_count: int = 1) -> DPRun:
    """Route ``arrivals`` over ``engines`` tick by tick and run every engine to completion.

    engines: non-empty list of ``mini_vllm.LLMEngine`` (the DP ranks, in rank order).
    arrivals: list of ``(tick, prompt, params)``: the tick (integer >= 0) the
    request arrives in, a prompt ``add_request`` accepts, a ``SamplingParams``.
    policy: ``"score"`` (``choose_engine`` on the front end's table) or
    ``"round_robin"`` (the k-th request routed goes to
    ``(start + k) % len(engines)``).
    publish_every: the coordinator's interval in ticks: at the start of every
    tick ``t`` with ``t % publish_every == 0`` the front end's table is replaced
    by fresh ``engine_counts`` of every engine; between publications it only
    changes through ``choose_engine``'s own increments.
    client_index, client_count: this front end's place among ``client_count``
    front ends; the scan starts at ``engine_start_index(len(engines), ...)``.

    One tick: (1) publish if due; (2) route and ``add_request`` every request
    arriving in this tick, in list order, appending every engine's
    ``waiting + running`` to ``queue_sizes`` after each one; (3) ``step()``
    every engine that has unfinished requests; (4) record ``first_token_tick``
    for requests that got their first output token in this tick. Ticks go on
    until every request has arrived and every engine is idle.

    Returns a ``DPRun``.

    Raises ValueError naming ``engines`` (empty or not a list), ``arrivals``
    (not a list of 3-tuples), ``policy`` (not in ``POLICIES``),
    ``publish_every`` (integer >= 1), or as ``engine_start_index`` does.
    """
    raise NotImplementedError("serve_dp: each tick: publish if tick % publish_every == 0, "
                              "route its arrivals, step busy engines, note first tokens")


# ---------------------------------------------------------------- DP ranks on real gloo


def num_tokens_across_dp(num_tokens: int, group=None) -> list[int]:
    """Every DP rank's token count for this forward pass, on every rank (one all-reduce).

    Each rank writes its ``num_tokens`` into slot ``rank`` of a zero int32
    tensor of length ``world_size`` and all-reduces it with SUM: the result is
    the same list on every rank (upstream pads every rank to its max).
    Must be called by every rank of ``group`` (None: the default group).

    Raises ValueError naming ``num_tokens`` unless it is an integer >= 0.
    """
    raise NotImplementedError("num_tokens_across_dp: zeros(world_size, int32), "
                              "your count in slot rank, dist.all_reduce with SUM")


def has_unfinished_dp(local_unfinished: bool, group=None) -> bool:
    """True on every rank when at least one rank of ``group`` still has unfinished requests.

    A logical OR across ranks as one all-reduce of an int32 flag (MAX, or a SUM
    compared with 0). Must be called by every rank of ``group``.

    Raises ValueError naming ``local_unfinished`` unless it is a bool.
    """
    raise NotImplementedError("has_unfinished_dp: an int32 tensor holding the flag, "
                              "dist.all_reduce with MAX, back to bool")


def dp_wave_loop(engine, sync_every: int = DP_SYNC_INTERVAL, group=None) -> dict:
    """One DP rank's busy loop for one wave: step or dummy-step until every rank is done.

    Every iteration: if ``engine`` has unfinished requests, ``engine.step()``
    (a busy step; its token count is the sum of the step's
    ``num_scheduled_tokens``), otherwise a dummy batch of
    ``DUMMY_BATCH_TOKENS`` tokens (a dummy step). Either way the rank then joins
    ``num_tokens_across_dp`` with that count: the collective stands for the
    ones inside an MoE forward pass, which every rank must join. Then the
    iteration counter goes up by one, and when it is a multiple of
    ``sync_every`` the rank calls ``has_unfinished_dp`` with its own
    ``engine.has_unfinished_requests()``; the wave ends when that returns
    False. Between syncs the wave goes on unconditionally.

    Returns ``{"iterations", "busy_steps", "dummy_steps", "syncs"}`` (ints) and
    ``"tokens_across_dp"``: the list each ``num_tokens_across_dp`` call returned.

    Raises ValueError naming ``sync_every`` unless it is an integer >= 1.
    """
    raise NotImplementedError("dp_wave_loop: step or dummy (1 token), join num_tokens_across_dp, "
                              "count, every sync_every-th iteration has_unfinished_dp")


# ---------------------------------------------------------------- demo


def skewed_workload(seed: int = 0, num_requests: int = 24):
    """Given. A seeded stream: 3 requests a tick, a third of them with 96-token prompts.

    Returns ``arrivals`` for ``serve_dp`` (token-id prompts, greedy, ``ignore_eos``).
    """
    from mini_vllm import SamplingParams

    rng = np.random.default_rng(seed)
    arrivals = []
    for i in range(num_requests):
        long = rng.random() < 1 / 3
        prompt = rng.integers(0, 256, size=96 if long else 8).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=int(rng.integers(4, 13)), ignore_eos=True)
        arrivals.append((i // 3, {"prompt_token_ids": prompt}, params))
    return arrivals


def make_engines(num_engines: int = 4):
    """Given. ``num_engines`` tiny-random engines with a small step budget (32 tokens, 4 sequences)."""
    from mini_vllm import LLMEngine

    return [LLMEngine("tiny-random", seed=0, max_num_batched_tokens=32, max_num_seqs=4,
                      enable_caching=False) for _ in range(num_engines)]


def main() -> None:
    arrivals = skewed_workload()
    for policy in POLICIES:
        run = serve_dp(make_engines(), arrivals, policy=policy, publish_every=2)
        ttft = run.ttft_ticks()
        per_engine = np.bincount(run.engine_of, minlength=4).tolist()
        print(f"{policy:11s}: requests per engine {per_engine}, TTFT ticks mean {ttft.mean():.2f} "
              f"max {ttft.max()}, {run.ticks} ticks")


if __name__ == "__main__":
    main()
