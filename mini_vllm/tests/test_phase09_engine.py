"""Phase 09's engine features: prompt logprobs, custom logits processors, beam search.

Each is off by default (the old path exactly), equal to an independent
reference when on, and unchanged by chunked prefill, prefix caching and
preemption.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.beam_search import BeamSearchParams, get_beam_search_score
from mini_vllm.engine import LLM, LLMEngine
from mini_vllm.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    PersistentBatch,
)
from mini_vllm.models import get_model
from mini_vllm.models.runner import Chunk, make_model_input
from mini_vllm.sampler import compute_logprobs
from mini_vllm.sampling_params import SamplingParams

PROMPT = {"prompt_token_ids": [5, 17, 33, 4, 90, 61, 2, 250, 8, 14, 77, 3, 9]}  # 13 tokens


def _full_prompt_logits(prompt_ids: list[int], block_size: int = 4) -> np.ndarray:
    """tiny-random's logits at every prompt position, from one unchunked forward."""
    model = get_model("tiny-random", seed=0)
    model.init_kv_cache(16, block_size)
    table = list(range(1, 1 + -(-len(prompt_ids) // block_size)))
    model_input = make_model_input([Chunk(prompt_ids, 0, table)], block_size)
    model_input.logits_indices = np.arange(len(prompt_ids), dtype=np.int64)
    return np.asarray(model.execute(model_input), dtype=np.float64)


# --- prompt logprobs -------------------------------------------------------------------------------

def _check_prompt_logprobs(entries, prompt_ids, k):
    ref = compute_logprobs(_full_prompt_logits(prompt_ids))
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for p in range(1, len(prompt_ids)):
        row, token = ref[p - 1], prompt_ids[p]  # position p - 1 predicts prompt token p
        got = entries[p]
        assert next(iter(got)) == token
        assert got[token].rank == int((row >= row[token]).sum())
        top = np.argsort(-row, kind="stable")[:k].tolist()
        assert set(got) == set(top) | {token}
        for t, e in got.items():
            assert e.logprob == pytest.approx(row[t], abs=1e-5)


def test_prompt_logprobs_equal_a_log_softmax_of_the_models_logits_at_every_position():
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    out = LLM("tiny-random", block_size=4).generate(PROMPT, params)[0]
    _check_prompt_logprobs(out.prompt_logprobs, PROMPT["prompt_token_ids"], 3)
    plain = LLM("tiny-random", block_size=4).generate(PROMPT, SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.prompt_logprobs is None and plain.outputs[0].token_ids == out.outputs[0].token_ids


def test_prompt_logprobs_survive_chunking_and_preemption_and_never_read_the_prefix_cache():
    params = SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=2, ignore_eos=True)
    other = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=8, max_num_batched_tokens=5)
    # The first request caches the prompt's blocks; the second reads them; the third,
    # asking for prompt logprobs, must compute every prompt token anyway.
    reqs = engine.generate([PROMPT, PROMPT, PROMPT], [other, other, params])
    assert sum(len(s.preempted) for s in engine.stats) > 0
    assert reqs[1].metrics.num_cached_tokens > 0
    assert reqs[2].metrics.num_cached_tokens == 0
    _check_prompt_logprobs(reqs[2].prompt_logprobs, PROMPT["prompt_token_ids"], 2)
    assert reqs[2].output_token_ids == reqs[0].output_token_ids


def test_prompt_logprobs_are_checked_like_logprobs():
    with pytest.raises(ValueError, match=r"prompt_logprobs must be None, -1 \(the whole vocabulary\) or an integer >= 0, got -2"):
        SamplingParams(prompt_logprobs=-2)
    with pytest.raises(ValueError, match=r"prompt_logprobs must be <= max_logprobs \(20\), got 21"):
        LLMEngine("tiny-random").add_request(PROMPT, SamplingParams(prompt_logprobs=21))
    with pytest.raises(ValueError, match=r"prompt_logprobs must be off with speculative_config"):
        LLMEngine("tiny-random", speculative_config={"method": "ngram", "num_speculative_tokens": 2}).add_request(
            PROMPT, SamplingParams(prompt_logprobs=1))


# --- the persistent batch ----------------------------------------------------------------------------

class _Req:
    def __init__(self, rid):
        self.request_id, self.sampling_params = rid, SamplingParams()
        self.prompt_token_ids, self.output_token_ids = [1], []


def test_persistent_batch_refills_the_lowest_hole_then_condenses_from_the_end():
    r = {c: _Req(c) for c in "abcdef"}
    batch = PersistentBatch()
    first = batch.update([r["a"], r["b"], r["c"], r["d"], r["e"]])
    assert [a[0] for a in first.added] == [0, 1, 2, 3, 4] and not first.removed and not first.moved
    assert batch.update([r["a"], r["b"], r["c"], r["d"], r["e"]]) is None
    # b (1) and d (3) leave, f arrives: f takes 1, e (4) slides down into 3.
    update = batch.update([r["a"], r["c"], r["e"], r["f"]])
    assert [a[0] for a in update.added] == [1] and update.added[0][3] is r["f"].output_token_ids
    assert update.moved == [(4, 3, MoveDirectionality.UNIDIRECTIONAL)]
    assert list(update.removed) == [] and update.batch_size == 4
    assert batch.req_ids == ["a", "f", "c", "e"]
    # The last two leave: nothing to move, both indices reported, highest first.
    update = batch.update([r["a"], r["f"]])
    assert list(update.removed) == [3, 2] and not update.moved and not update.added
    assert batch.req_ids == ["a", "f"]
    # a leaves, nothing new: f (1) moves into 0.
    update = batch.update([r["f"]])
    assert update.moved == [(1, 0, MoveDirectionality.UNIDIRECTIONAL)] and list(update.removed) == []


def test_persistent_batch_matches_a_replay_of_its_own_updates_on_random_schedules():
    """A consumer that applies each BatchUpdate (removed, added, moved) always holds
    exactly the rows ``req_ids`` says, over 300 random steps."""
    rng = np.random.default_rng(0)
    pool = [_Req(f"r{i}") for i in range(12)]
    batch, mirror = PersistentBatch(), {}
    for _ in range(300):
        live = [q for q in pool if rng.random() < 0.5]
        rng.shuffle(live)
        update = batch.update(live)
        if update is not None:
            for i in update.removed:
                mirror.pop(i, None)
            for index, _, _, out in update.added:
                mirror[index] = next(q.request_id for q in pool if q.output_token_ids is out)
            for i1, i2, _ in update.moved:
                mirror[i2] = mirror.pop(i1)
            assert update.batch_size == len(live)
        assert {i: rid for i, rid in mirror.items() if i < len(live)} == dict(enumerate(batch.req_ids))
        assert sorted(batch.req_ids) == sorted(q.request_id for q in live)
        mirror = {i: rid for i, rid in mirror.items() if i < len(live)}


# --- custom logits processors --------------------------------------------------------------------------

class BanToken(LogitsProcessor):
    """Bans ``extra_args["ban"]`` for the requests that give it; keeps state per row."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, int] = {}
        self.updates: list[BatchUpdate | None] = []

    @classmethod
    def validate_params(cls, sampling_params):
        ban = (sampling_params.extra_args or {}).get("ban")
        if ban is not None and (not isinstance(ban, int) or ban < 0):
            raise ValueError(f"extra_args['ban'] must be a token id >= 0, got {ban!r}")

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        self.updates.append(batch_update)
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.rows.pop(i, None)
        for index, params, _, _ in batch_update.added:
            ban = (params.extra_args or {}).get("ban")
            if ban is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = ban
        for i1, i2, direction in batch_update.moved:
            a, b = self.rows.pop(i1, None), self.rows.pop(i2, None)
            if a is not None:
                self.rows[i2] = a
            if direction == MoveDirectionality.SWAP and b is not None:
                self.rows[i1] = b

    def apply(self, logits):
        for i, token in self.rows.items():
            logits[i, token] = -np.inf
        return logits


class Identity(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        self.invariant = True

    def is_argmax_invariant(self):
        return self.invariant

    def update_state(self, batch_update):
        pass

    def apply(self, logits):
        return logits


MIXED = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
         SamplingParams(temperature=0.8, seed=3, top_p=0.9, max_tokens=6, ignore_eos=True),
         SamplingParams(temperature=1.0, seed=4, min_p=0.05, repetition_penalty=1.2, max_tokens=6, ignore_eos=True)]
PROMPTS = ["hello world hello", "the quick brown fox jumps", "abcdefgh"]


def _tokens(engine, prompts=PROMPTS, params=MIXED):
    return [r.output_token_ids for r in engine.generate(prompts, params)]


@pytest.mark.parametrize("invariant", [True, False])
def test_a_do_nothing_processor_leaves_every_token_unchanged(invariant):
    ref = _tokens(LLMEngine("tiny-random", block_size=4))
    engine = LLMEngine("tiny-random", block_size=4, logits_processors=[Identity])
    engine.logits_processors[0].invariant = invariant
    assert _tokens(engine) == ref


def test_a_processor_changes_only_its_own_rows_whatever_the_chunking_caching_and_preemption():
    ref = _tokens(LLMEngine("tiny-random", block_size=4, enable_caching=False))
    banned = ref[1][0]  # the sampled request's first token, banned for it alone
    params = [MIXED[0], SamplingParams(**{f: getattr(MIXED[1], f) for f in ("temperature", "seed", "top_p",
              "max_tokens", "ignore_eos")}, extra_args={"ban": banned}), MIXED[2]]
    easy = _tokens(LLMEngine("tiny-random", block_size=4, logits_processors=[BanToken]), params=params)
    hard_engine = LLMEngine("tiny-random", block_size=4, num_blocks=10, max_num_batched_tokens=5,
                            logits_processors=[BanToken])
    hard = _tokens(hard_engine, params=params)
    assert sum(len(s.preempted) for s in hard_engine.stats) > 0
    assert hard == easy
    assert easy[0] == ref[0] and easy[2] == ref[2]
    assert banned not in easy[1] and easy[1] != ref[1]
    # It was told about every change: the rows it holds are those of requests still running.
    assert hard_engine.logits_processors[0].rows == {}


def test_logits_processors_are_classes_validated_per_request_and_refused_with_speculation():
    with pytest.raises(ValueError, match="logits_processors must be a list of LogitsProcessor subclasses"):
        LLMEngine("tiny-random", logits_processors=[BanToken(None, "cpu", False)])
    with pytest.raises(ValueError, match="logits_processors must be empty with speculative_config"):
        LLMEngine("tiny-random", logits_processors=[BanToken],
                  speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    engine = LLMEngine("tiny-random", logits_processors=[BanToken])
    with pytest.raises(ValueError, match=r"extra_args\['ban'\] must be a token id >= 0, got -1"):
        engine.add_request("hi", SamplingParams(extra_args={"ban": -1}))
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="extra_args must be None or a dict, got list"):
        SamplingParams(extra_args=[1])


# --- beam search -------------------------------------------------------------------------------------

def test_beam_search_score_counts_the_prompt_and_not_a_final_eos():
    assert get_beam_search_score([1, 2, 3, 4], -2.0, eos_token_id=9) == -0.5
    assert get_beam_search_score([1, 2, 3, 9], -2.0, eos_token_id=9) == pytest.approx(-2.0 / 3)
    assert get_beam_search_score([1, 2, 3, 4], -2.0, eos_token_id=9, length_penalty=2.0) == -2.0 / 16


def _reference_beam_search(prompt_ids, width, steps, length_penalty=1.0):
    """Upstream's rule with no EOS, on logprobs from an unchunked forward of each sequence:
    every beam offers its top 2 x width tokens; the best width by score live on."""
    beams = [(list(prompt_ids), 0.0)]
    for _ in range(steps):
        cands = []
        for tokens, lp in beams:
            row = compute_logprobs(_full_prompt_logits(tokens))[-1]
            cands += [(tokens + [int(t)], lp + row[t]) for t in np.argsort(-row, kind="stable")[:2 * width]]
        cands.sort(key=lambda c: c[1] / len(c[0]) ** length_penalty, reverse=True)
        beams = cands[:width]
    return beams


@pytest.mark.parametrize(("width", "length_penalty"), [(1, 1.0), (2, 1.0), (3, 0.5)])
def test_beam_search_equals_a_reference_of_upstreams_rule(width, length_penalty):
    llm = LLM("tiny-random", block_size=4)
    ids = PROMPT["prompt_token_ids"]
    got = llm.beam_search([PROMPT], BeamSearchParams(beam_width=width, max_tokens=3, ignore_eos=True,
                                                     length_penalty=length_penalty))[0].sequences
    ref = _reference_beam_search(ids, width, 3, length_penalty)
    assert [s.tokens for s in got] == [tokens for tokens, _ in ref]
    assert [s.cum_logprob for s in got] == pytest.approx([lp for _, lp in ref], abs=1e-5)
    for s in got:
        assert s.text == llm.llm_engine.tokenizer.decode(s.tokens) and s.finish_reason == "length"
        assert s.cum_logprob == pytest.approx(sum(p[t].logprob for p, t in zip(s.logprobs, s.tokens[len(ids):],
                                                                                strict=True)))
    if width == 1:
        greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
        assert got[0].tokens == ids + greedy.outputs[0].token_ids


def test_beam_search_steps_reuse_the_cached_prefix():
    llm = LLM("tiny-random", block_size=4)
    llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True))
    stats = llm.llm_engine.stats
    # After the first step, each beam-step request computes only its last, partial block.
    later = [s for s in stats[1:] if s.num_scheduled_tokens]
    assert later and all(n <= 4 for s in later for n in s.num_scheduled_tokens.values())
    assert sum(s.num_cached_tokens for s in stats) > 0


def test_beam_search_params_are_checked():
    for kwargs, message in [({"beam_width": 0, "max_tokens": 2}, "beam_width must be an integer >= 1, got 0"),
                            ({"beam_width": 2, "max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
                            ({"beam_width": 2, "max_tokens": 2, "length_penalty": float("nan")},
                             "length_penalty must be a finite number, got nan")]:
        with pytest.raises(ValueError, match=message):
            BeamSearchParams(**kwargs)
    with pytest.raises(ValueError, match=r"prompt \(13 tokens\) \+ max_tokens \(60\) exceeds max_model_len = 64"):
        LLM("tiny-random", max_model_len=64).beam_search([PROMPT], BeamSearchParams(beam_width=1, max_tokens=60))


def test_beam_search_token_counts_quoted_in_the_mini_build():
    """02-mini-build.md's table: width 4, 8 steps, a 40-token prompt, block 16 on tiny-random.
    Off: 40 + 4 x (41 + ... + 47) = 1,272 tokens computed. On: every later request hits its
    first 32 tokens, so 40 + 4 x (9 + ... + 15) = 376 computed and 7 x 4 x 32 = 896 cached."""
    prompt = {"prompt_token_ids": [(7 * i + 3) % 250 + 1 for i in range(40)]}
    counts = {}
    for caching in (True, False):
        llm = LLM("tiny-random", block_size=16, enable_caching=caching)
        llm.beam_search([prompt], BeamSearchParams(beam_width=4, max_tokens=8, ignore_eos=True))
        stats = llm.llm_engine.stats
        counts[caching] = (sum(sum(s.num_scheduled_tokens.values()) for s in stats),
                           sum(s.num_cached_tokens for s in stats))
    assert counts == {True: (376, 896), False: (1272, 0)}
    assert 40 + 4 * sum(range(41, 48)) == 1272 and 40 + 4 * sum(range(9, 16)) == 376
