"""Speculative decoding (``mini_vllm/spec_decode``): drafts change the step count, never the output.

Greedy output with n-gram speculation must equal the output without it,
token for token, on the toy model, tiny-random and SmolLM2, under chunked
prefill, prefix caching and preemption; a stop (EOS, stop string,
``max_tokens``) inside an accepted run cuts the output exactly where the
plain engine stops. Sampled output keeps the target's distribution (a
chi-square test, with a negative control that must fail). The proposer,
the metadata and the metrics are checked on upstream's own examples.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.engine import LLMEngine
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.scheduler import Scheduler
from mini_vllm.spec_decode import (
    NgramProposer,
    RejectionSampler,
    SpecDecodingStats,
    SpeculativeConfig,
    calc_spec_decode_metadata,
    find_longest_matched_ngram_and_propose_tokens,
    rejection_sample,
)
from mini_vllm.spec_decode import rejection_sampler as rs_module
from mini_vllm.tokenizer import ByteTokenizer


def ngram(k=3, lo=1, hi=3):
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}


GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
SHARED = list(range(40, 61))  # a 21-token prefix two prompts share
PROMPTS = [
    "hello world hello world",  # tiny-random falls into a loop here: drafts get accepted
    {"prompt_token_ids": SHARED + [1, 2, 3]},
    {"prompt_token_ids": list(range(100, 137))},
    "abcabcabcabcab",
    {"prompt_token_ids": SHARED},
]


def run(model, prompts=PROMPTS, params=GREEDY, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 128)
    engine = LLMEngine(model, **kw)
    return [list(r.output_token_ids) for r in engine.generate(prompts, params)], engine


class CycleModel:
    """Greedy next token = ``NEXT[token]`` (default ``a``): a model that copies perfectly,
    so n-gram drafts are accepted whole. KV is ignored, like ToyModel's."""

    def __init__(self, nxt: dict[int, int]):
        self.vocab_size, self.max_model_len, self.eos_token_id = 257, 4096, 256
        self.tokenizer = ByteTokenizer()
        self.nxt = nxt

    def init_kv_cache(self, num_blocks, block_size):
        pass

    def execute(self, model_input):
        tokens = model_input.token_ids[model_input.logits_indices]
        logits = np.zeros((len(tokens), self.vocab_size), dtype=np.float32)
        logits[np.arange(len(tokens)), [self.nxt.get(int(t), 97) for t in tokens]] = 10.0
        return logits


ABCD = CycleModel({97: 98, 98: 99, 99: 100, 100: 97})  # a -> b -> c -> d -> a


# --- config -------------------------------------------------------------------------------------

@pytest.mark.parametrize("config, message", [
    ("ngram", "speculative_config must be None or a dict, got str"),
    ({**ngram(), "foo": 1}, "speculative_config: unknown key 'foo'; allowed keys are method, "
                            "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, model"),
    ({**ngram(), "method": "eagle"}, "method must be one of ngram, draft_model, got 'eagle'"),
    ({"num_speculative_tokens": 3}, "method must be one of ngram, draft_model, got None"),
    ({"method": "ngram"}, "num_speculative_tokens must be an integer >= 1, got None"),
    (ngram(k=0), "num_speculative_tokens must be an integer >= 1, got 0"),
    (ngram(k=True), "num_speculative_tokens must be an integer >= 1, got True"),
    (ngram(k="3"), "num_speculative_tokens must be an integer >= 1, got '3'"),
    (ngram(lo=0), "prompt_lookup_min must be an integer >= 1, got 0"),
    (ngram(hi=0), "prompt_lookup_max must be an integer >= 1, got 0"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0},
     "prompt_lookup_max must be an integer >= 1, got 0"),
    (ngram(lo=4, hi=2), "prompt_lookup_min must be <= prompt_lookup_max, got 4 > 2"),
    ({**ngram(), "model": "tiny-random"}, "model applies to method 'draft_model' only, not 'ngram', "
                                          "got 'tiny-random'"),
    ({"method": "draft_model", "num_speculative_tokens": 2},
     "model must be a mini_vllm model name (such as 'tiny-random') for method 'draft_model', got None"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "toy", "prompt_lookup_max": 2},
     "prompt_lookup_max applies to method 'ngram' only, not 'draft_model'"),
])
def test_every_bad_config_is_a_value_error_naming_the_key(config, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        LLMEngine("toy", speculative_config=config)


def test_a_draft_model_must_share_the_targets_vocabulary():
    from mini_vllm.model import ToyModel

    with pytest.raises(ValueError, match=r"^model: the draft model's vocab_size \(257\) must equal "
                                         r"the target's \(300\)$"):
        LLMEngine(ToyModel(vocab_size=300), speculative_config={
            "method": "draft_model", "num_speculative_tokens": 2, "model": "toy"})


def test_prompt_lookup_defaults_are_upstreams():
    # Neither given: 5 and 5; one given: the other copies it (vllm/config/speculative.py:589).
    base = {"method": "ngram", "num_speculative_tokens": 2}
    assert SpeculativeConfig.from_any(base) == SpeculativeConfig("ngram", 2, 5, 5)
    assert SpeculativeConfig.from_any({**base, "prompt_lookup_max": 3}) == SpeculativeConfig("ngram", 2, 3, 3)
    assert SpeculativeConfig.from_any({**base, "prompt_lookup_min": 2}) == SpeculativeConfig("ngram", 2, 2, 2)
    assert LLMEngine("toy").speculative_config is None


# --- the proposer -------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, lo, hi, k, expected", [
    # upstream tests/v1/spec_decode/test_ngram.py:16 test_find_longest_matched_ngram_and_propose_tokens
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 2, [4, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the EARLIEST "3", not the latest
    # upstream test_ngram_proposer's cases
    ([1, 2, 3, 4, 5], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram wins, not [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),  # the 3-gram wins, not [5, 2]
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
    ([], 2, 2, 2, []),
    ([1, 2, 3, 1, 2], 2, 2, 2, [3, 1]),
    ([4, 5, 6], 2, 2, 2, []),
    # k capped by the tokens after the match: [7, 7, 7] matches "7 7" at 0, one token follows
    ([7, 7, 7], 1, 2, 5, [7]),
])
def test_proposer_on_upstreams_cases(tokens, lo, hi, k, expected):
    assert find_longest_matched_ngram_and_propose_tokens(tokens, lo, hi, 1024, k) == expected


def test_proposer_stops_at_max_model_len_and_at_max_drafts():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert find_longest_matched_ngram_and_propose_tokens(tokens, 1, 2, 1024, 4) == [3, 4, 5, 6]
    assert find_longest_matched_ngram_and_propose_tokens(tokens, 1, 2, 10, 4) == [3, 4]  # 10 - 8 = 2
    assert find_longest_matched_ngram_and_propose_tokens(tokens, 1, 2, 8, 4) == []
    proposer = NgramProposer(1, 2, 4, 1024)
    assert proposer.propose(tokens) == [3, 4, 5, 6] and proposer.propose(tokens, max_drafts=1) == [3]


@pytest.mark.upstream
def test_proposer_equals_upstreams_own_function_on_random_contexts():
    """Upstream's matcher (KMP over the reversed tokens, under numba's @jit) read from upstream/
    with ast, its decorator dropped, against ours on 1,500 short contexts over tiny vocabularies,
    where long, repeated and overlapping matches are common."""
    import ast

    import course

    path = course.UPSTREAM / "vllm/v1/spec_decode/ngram_proposer.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "_find_longest_matched_ngram_and_propose_tokens")
    fn.decorator_list = []
    namespace = {"np": np}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    upstream = namespace[fn.name]
    rng = np.random.default_rng(8)
    lengths = set()
    for _ in range(1500):
        tokens = rng.integers(0, int(rng.integers(1, 5)), int(rng.integers(0, 30)))
        lo = int(rng.integers(1, 4))
        hi, k = lo + int(rng.integers(0, 3)), int(rng.integers(1, 6))
        max_len = len(tokens) + int(rng.integers(0, 6))
        want = [int(t) for t in upstream(origin_tokens=tokens, min_ngram=lo, max_ngram=hi,
                                         max_model_len=max_len, k=k)]
        assert find_longest_matched_ngram_and_propose_tokens(tokens.tolist(), lo, hi, max_len, k) \
            == want, (tokens.tolist(), lo, hi, max_len, k)
        lengths.add(min(len(want), 2))
    assert lengths == {0, 1, 2}  # no draft, one token and longer drafts all occurred


# --- metadata, rejection sampler, metrics -------------------------------------------------------

def test_metadata_reproduces_upstreams_worked_example():
    # vllm/v1/worker/gpu_model_runner.py:2713 _calc_spec_decode_metadata's comment, number for number.
    input_ids = np.arange(209) + 1000  # row r holds token 1000 + r
    meta = calc_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209], input_ids)
    assert meta.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert meta.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert meta.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert meta.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert meta.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    # The drafts sit one row after the row that checks them: rows 1, 2, 3, 105, 106, 208.
    assert meta.draft_token_ids.tolist() == [1001, 1002, 1003, 1105, 1106, 1208]
    assert meta.max_spec_len == 3


def test_greedy_rejection_keeps_the_agreeing_prefix_then_the_targets_token():
    sampler, params, gen = RejectionSampler(), SamplingParams(temperature=0.0), np.random.default_rng(0)
    logits = np.eye(8)[[5, 6, 1, 2]]  # the target's argmax per row: 5, 6, 1, 2
    assert sampler([5, 6, 7], logits, params, gen) == [5, 6, 1]  # third draft rejected -> target's 1
    assert sampler([5, 6, 1], logits, params, gen) == [5, 6, 1, 2]  # all accepted + bonus 2
    assert sampler([0, 6, 1], logits, params, gen) == [5]
    with pytest.raises(ValueError, match=r"^logits must have len\(draft_token_ids\) \+ 1 = 3 rows, got 4$"):
        sampler([5, 6], logits, params, gen)


P = np.array([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02])
CHI2_7DF_P1E6 = 40.52  # chi-square critical value, 7 degrees of freedom, p = 1e-6


def chi_square(samples, p):
    counts = np.bincount(samples, minlength=len(p))
    expected = len(samples) * p
    return float(((counts - expected) ** 2 / expected).sum())


def draw(n=200_000, drafts=(0, 0), seed=0):
    """n one-hot-draft verify steps over two positions, both with target P."""
    draft = np.tile(drafts, (n, 1))
    target = np.broadcast_to(P, (n, len(drafts), len(P)))
    rng = np.random.default_rng(seed)
    bonus = rng.choice(len(P), size=n, p=P)
    return rejection_sample(draft, target, bonus, rng)


def test_sampled_tokens_follow_the_target_distribution():
    out = draw()
    # First token: accepted draft 0 with probability P[0], else recovered from P with 0 zeroed.
    assert chi_square(out[:, 0], P) < CHI2_7DF_P1E6
    assert abs(np.mean(out[:, 0] == 0) - P[0]) < 0.005
    # Given the first draft was accepted, the second token follows P again.
    second = out[out[:, 0] == 0, 1]
    assert chi_square(second, P) < CHI2_7DF_P1E6
    # Whatever was rejected is -1; the first rejection ends the row.
    assert np.all((out[:, 0] != 0) <= (out[:, 1:] == -1).all(axis=1))


def test_negative_control_resampling_from_p_without_zeroing_the_draft_fails(monkeypatch):
    # The classic bug: recover from P itself. Token 0 then comes out with P0 + (1 - P0) P0 = 0.51.
    monkeypatch.setattr(rs_module, "recovery_probs", lambda target, draft, q: target.copy())
    out = draw()
    assert chi_square(out[:, 0], P) > 100 * CHI2_7DF_P1E6
    assert abs(np.mean(out[:, 0] == 0) - 0.51) < 0.005


def test_probabilistic_drafts_follow_the_target_too():
    n, q = 200_000, np.full(8, 1 / 8)  # a uniform drafter samples its draft from q
    rng = np.random.default_rng(1)
    draft = rng.choice(8, size=(n, 1), p=q)
    out = rejection_sample(draft, np.broadcast_to(P, (n, 1, 8)), np.zeros(n, dtype=int), rng,
                           draft_probs=np.broadcast_to(q, (n, 1, 8)))
    assert chi_square(out[:, 0], P) < CHI2_7DF_P1E6
    assert abs(np.mean(out[:, 1] != -1) - np.minimum(P, q).sum()) < 0.005  # acceptance = sum min(p, q)


def test_metrics_arithmetic_and_upstreams_log_line():
    stats = SpecDecodingStats.new(3)
    for drafted, accepted in [(3, 2), (3, 0), (2, 2)]:
        stats.observe_draft(drafted, accepted)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.num_accepted_tokens_per_pos == [2, 2, 0]
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)  # the bonus token counts
    assert stats.draft_acceptance_rate == 0.5
    assert stats.log_line() == (
        "SpecDecoding metrics: Mean acceptance length: 2.33, Accepted: 4 tokens, Drafted: 8 tokens, "
        "Per-position acceptance rate: 0.667, 0.667, 0.000, Avg Draft acceptance rate: 50.0%")
    # Upstream's two numbers are tied: L = 2.8 with k = 5 means (2.8 - 1) / 5 = 36% acceptance.
    five = SpecDecodingStats.new(5)
    for accepted in (5, 0, 2, 1, 1):
        five.observe_draft(5, accepted)
    assert five.mean_acceptance_length == pytest.approx(2.8) and five.draft_acceptance_rate == 0.36
    with pytest.raises(ValueError, match=r"^num_accepted_tokens must be in \[0, num_draft_tokens\] and "
                                         r"num_draft_tokens <= 3, got 3 of 2$"):
        stats.observe_draft(2, 3)
    with pytest.raises(ValueError, match="num_draft_tokens <= 3, got 1 of 4$"):
        stats.observe_draft(4, 1)


# --- scheduler --------------------------------------------------------------------------------

def test_scheduler_schedules_drafts_cuts_them_to_the_budget_and_rolls_back(make_scheduler, make_request):
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=3)
    req = make_request([1, 2, 3, 4, 5], max_tokens=8)
    sched.add_request(req)
    out = sched.schedule()  # 3 of the 5 prompt tokens
    sched.update_from_output(out, {})
    out = sched.schedule()
    sched.update_from_output(out, {req.request_id: 9})  # prefill done, first token 9
    req.spec_token_ids = [10, 11, 12]
    assert req.num_tokens_with_spec == 6 + 3
    blocks = list(sched.kv_cache_manager.get_blocks(req.request_id))
    out = sched.schedule()  # budget 3: the last token and only 2 drafts
    assert out.num_scheduled_tokens[req.request_id] == 3
    assert out.scheduled_spec_decode_tokens == {req.request_id: [10, 11]} and req.spec_token_ids == []
    assert Scheduler.needs_sample(req, 3)
    with pytest.raises(ValueError, match=r"must get 1 to 3 tokens \(drafts \+ 1\), got \[10, 11, 12, 13\]"):
        sched.update_from_output(out, {req.request_id: [10, 11, 12, 13]})
    sched.update_from_output(out, {req.request_id: [10, 7]})  # draft 11 rejected, 7 recovered
    assert req.output_token_ids == [9, 10, 7]
    assert req.num_computed_tokens == 5 + 3 - 1 == req.num_tokens - 1  # rolled back by 1
    assert sched.kv_cache_manager.get_blocks(req.request_id)[: len(blocks)] == blocks  # nothing freed


def test_drafts_are_cut_at_max_model_len_never_an_error(make_scheduler, make_request):
    sched = make_scheduler(num_blocks=16, block_size=4, max_model_len=8)
    req = make_request([1, 2, 3, 4, 5], max_tokens=3)
    sched.add_request(req)
    sched.update_from_output(sched.schedule(), {req.request_id: 9})  # 6 tokens, 5 computed
    req.spec_token_ids = [1, 2, 3]
    out = sched.schedule()  # at most max_model_len - 1 - 5 = 2 tokens: the last one and 1 draft
    assert out.num_scheduled_tokens[req.request_id] == 2
    assert out.scheduled_spec_decode_tokens[req.request_id] == [1]


def test_a_stop_inside_the_accepted_run_drops_the_rest(make_scheduler, make_request):
    sched = make_scheduler(num_blocks=16, block_size=4)
    req = make_request([1, 2, 3], max_tokens=3)
    sched.add_request(req)
    sched.update_from_output(sched.schedule(), {req.request_id: 9})
    req.spec_token_ids = [4, 5, 6]
    out = sched.schedule()
    finished = sched.update_from_output(out, {req.request_id: [4, 5, 6, 8]})
    assert finished == [req] and req.output_token_ids == [9, 4, 5] and req.finish_reason == "length"


def test_preemption_clears_the_drafts(make_scheduler, make_request):
    sched = make_scheduler(num_blocks=3, block_size=4)  # 2 usable blocks
    a, b = make_request([1, 2, 3], max_tokens=4), make_request([4, 5, 6], max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)
    sched.update_from_output(sched.schedule(), {a.request_id: 7, b.request_id: 7})
    a.spec_token_ids, b.spec_token_ids = [1, 2], [1, 2]  # 4 + 2 tokens each: 2 blocks each
    out = sched.schedule()
    assert out.preempted_req_ids == [b.request_id] and b.spec_token_ids == []
    assert out.scheduled_spec_decode_tokens == {a.request_id: [1, 2]}


# --- the engine: greedy output never changes -------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    return {m: run(m, enable_caching=False)[0] for m in ("toy", "tiny-random")}


def test_no_config_is_the_old_engine():
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=3)
    old, old_engine = run("tiny-random", params=params)
    new, new_engine = run("tiny-random", params=params, speculative_config=None)
    assert new == old and new_engine.spec_decoding_stats is None
    assert all(s.spec_decoding is None for s in new_engine.stats)
    # Spec on but never a match (5-grams): no drafts, so the very same random draws.
    never, engine = run("tiny-random", params=params, speculative_config=ngram(3, 5, 5))
    assert never == old and engine.spec_decoding_stats.num_drafts == 0


@pytest.mark.parametrize("model", ["toy", "tiny-random"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_output_is_unchanged_for_every_k(reference, model, k):
    tokens, engine = run(model, speculative_config=ngram(k))
    assert tokens == reference[model]
    stats = engine.spec_decoding_stats
    assert stats.num_draft_tokens > 0 and len(stats.num_accepted_tokens_per_pos) == k
    if model == "tiny-random":
        assert stats.num_accepted_tokens > 0
    # The step stats add up to the engine's totals.
    assert sum(s.spec_decoding.num_accepted_tokens for s in engine.stats if s.spec_decoding) \
        == stats.num_accepted_tokens


def test_a_draft_model_equal_to_the_target_has_every_draft_accepted(reference):
    # Same name, same seed: the draft model IS the target, so only max_tokens caps acceptance.
    draft = {"method": "draft_model", "num_speculative_tokens": 3, "model": "tiny-random"}
    tokens, engine = run("tiny-random", speculative_config=draft)
    assert tokens == reference["tiny-random"]
    assert engine.spec_decoding_stats.draft_acceptance_rate == 1.0
    assert engine.num_steps < 16  # 16 tokens each, four at a time
    # A draft model that never agrees (toy drafting for tiny-random) changes nothing either.
    tokens, engine = run("tiny-random", speculative_config={**draft, "model": "toy"})
    assert tokens == reference["tiny-random"] and engine.spec_decoding_stats.num_accepted_tokens == 0


def run_checking_blocks(engine, prompts, params):
    """Step by step; a running request that was not preempted never loses a block."""
    ids = [engine.add_request(p, params) for p in prompts]
    kv, done = engine.kv_cache_manager, {}
    while len(done) < len(ids):
        before = {r.request_id: list(kv.get_blocks(r.request_id)) for r in engine.scheduler.running}
        for req in engine.step():
            done[req.request_id] = req
        preempted = set(engine.stats[-1].preempted)
        for rid, blocks in before.items():
            if rid not in done and rid not in preempted:
                assert kv.get_blocks(rid)[: len(blocks)] == blocks
    return [list(done[i].output_token_ids) for i in ids]


@pytest.mark.parametrize("kw", [
    {"max_num_batched_tokens": 3},  # chunked prefill, and drafts cut by the budget
    {"max_num_batched_tokens": 6, "long_prefill_token_threshold": 4},
    {"num_blocks": 14},  # 13 usable blocks: the 37-token prompt alone fills them -> preemption
])
def test_greedy_output_survives_chunking_and_preemption(reference, kw):
    engine = LLMEngine("tiny-random", block_size=4, **{"num_blocks": 128, **kw}, speculative_config=ngram(3))
    assert run_checking_blocks(engine, PROMPTS, GREEDY) == reference["tiny-random"]
    stats = engine.spec_decoding_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepted and rejected drafts
    if "num_blocks" in kw:
        assert any(s.preempted for s in engine.stats)
    else:
        assert max(sum(s.num_scheduled_tokens.values()) for s in engine.stats) <= kw["max_num_batched_tokens"]


def test_greedy_output_survives_prefix_caching(reference):
    engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, speculative_config=ngram(3))
    first = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    second = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    assert first == second == reference["tiny-random"]
    assert sum(s.num_cached_tokens for s in engine.stats) >= 80  # hits really happened


def test_drafts_never_pass_max_tokens_so_whole_runs_are_accepted():
    # abcd repeats: every draft is accepted. Drafts per step: 3, 3, then 2 (room for 12 - 9 - 1).
    engine = LLMEngine(ABCD, block_size=4, num_blocks=32, speculative_config=ngram(3, 1, 2))
    out = engine.generate("abcdabcd", SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert out.output_token_ids == list(b"abcdabcdabcd") and out.finish_reason == "length"
    assert [s.spec_decoding.num_draft_tokens for s in engine.stats if s.spec_decoding] == [3, 3, 2]
    assert engine.num_steps == 4 and engine.spec_decoding_stats.draft_acceptance_rate == 1.0
    assert engine.stats[1].num_decode_tokens == 4  # one token + three drafts


@pytest.mark.parametrize("model, prompt, params, expected", [
    # c -> EOS: drafts after "...c" are [EOS, a, b], all accepted; output stops at EOS.
    (CycleModel({**ABCD.nxt, 99: 256, 256: 97}), {"prompt_token_ids": [97, 98, 99, 256, 97, 98]},
     SamplingParams(temperature=0.0, max_tokens=10), [99, 256]),
    # Stop string "da" inside the accepted run d, a, b: the "b" and the bonus are dropped.
    (ABCD, "abcdab", SamplingParams(temperature=0.0, max_tokens=10, stop="da"), list(b"cda")),
])
def test_eos_and_stop_strings_inside_an_accepted_run(model, prompt, params, expected):
    plain = LLMEngine(model, block_size=4, num_blocks=32).generate(prompt, params)[0]
    engine = LLMEngine(model, block_size=4, num_blocks=32, speculative_config=ngram(3, 1, 2))
    spec = engine.generate(prompt, params)[0]
    assert spec.output_token_ids == plain.output_token_ids == expected
    assert spec.finish_reason == plain.finish_reason == "stop" and spec.stop_reason == plain.stop_reason
    stats = engine.spec_decoding_stats
    assert stats.num_drafts == 1 and stats.num_accepted_tokens == 3  # stopped mid-run, not rejected


def test_sampled_output_is_reproducible_and_batch_independent():
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    alone = run(ABCD, ["abcdabcd"], params, speculative_config=ngram(3))[0]
    again, engine = run(ABCD, ["abcdabcd", "dcbadcba"], params, speculative_config=ngram(3))
    assert again[0] == alone[0] and engine.spec_decoding_stats.num_accepted_tokens > 0


# --- SmolLM2 ---------------------------------------------------------------------------------

SMOL_BASE = "one two three four, one two three four, one two"
SMOL_PROMPTS = [SMOL_BASE + " three", SMOL_BASE + " three four, one", "The capital of France is"]
SMOL_PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
# 4 blocks of 16 for three requests of 13, 16 and 5 prompt tokens and 6 outputs each: the pool
# runs out mid-decode (preemption), the first two share a full block (a prefix-cache hit on
# resume), and a 24-token budget chunks the prefills.
SMOL_ENGINE = dict(block_size=16, num_blocks=4, max_num_batched_tokens=24)


@pytest.fixture(scope="module")
def smollm2_plain():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mini_vllm.models import get_model

    with threadpoolctl.threadpool_limits(1, "blas"):
        model = get_model("smollm2")
        engine = LLMEngine(model, **SMOL_ENGINE)
        plain = [r.output_token_ids for r in engine.generate(SMOL_PROMPTS, SMOL_PARAMS)]
    return model, plain, engine.num_steps


@pytest.mark.model
@pytest.mark.parametrize("k", [1, 3, 5])  # the tiny-random tests cover every k; three keep the real model's cost down
def test_smollm2_greedy_output_is_unchanged_under_chunking_caching_and_preemption(smollm2_plain, k):
    import threadpoolctl

    model, plain, plain_steps = smollm2_plain
    with threadpoolctl.threadpool_limits(1, "blas"):
        engine = LLMEngine(model, **SMOL_ENGINE, speculative_config=ngram(k, 1, 3))
        spec = [r.output_token_ids for r in engine.generate(SMOL_PROMPTS, SMOL_PARAMS)]
    assert spec == plain
    assert any(s.preempted for s in engine.stats) and sum(s.num_cached_tokens for s in engine.stats)
    assert engine.spec_decoding_stats.num_accepted_tokens > 0  # drafts were really kept
    assert engine.num_steps <= plain_steps


def test_the_cli_passes_speculative_config_through(capsys):
    from mini_vllm.__main__ import main

    argv = ["generate", "--model", "toy", "--max-tokens", "6", "--quiet", "abcabcabc"]
    assert main(argv + ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, '
                                                 '"prompt_lookup_min": 1}']) == 0
    assert "SpecDecoding metrics: Mean acceptance length" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--speculative-config", '{"method": "ngram"}'])
    assert exit_info.value.code == 2
    assert "num_speculative_tokens must be an integer >= 1, got None" in capsys.readouterr().err
