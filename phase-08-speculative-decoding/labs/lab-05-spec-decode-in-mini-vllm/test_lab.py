"""Lab 08-05 tests: your metadata, rejection samplers and scheduler update run mini_vllm's speculation."""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

import math  # noqa: E402
import types  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mini_vllm.model_runner as model_runner  # noqa: E402
from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.request import Request  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402
from mini_vllm.scheduler import Scheduler  # noqa: E402
from mini_vllm.spec_decode import rejection_sampler as stock_rs  # noqa: E402
from mini_vllm.spec_decode.rejection_sampler import RejectionSampler  # noqa: E402
from mini_vllm.tokenizer import ByteTokenizer  # noqa: E402

# Chi-square critical values at p = 1e-6 (the upper tail of the chi-square law, as
# scipy.stats.chi2.isf(1e-6, df) gives them): a correct sampler fails one in a million runs.
CHI2_P1E6 = {3: 30.66, 7: 40.52, 15: 56.49}


def chi_square(samples, probs) -> float:
    counts = np.bincount(np.asarray(samples).ravel(), minlength=len(probs))
    expected = len(np.asarray(samples).ravel()) * np.asarray(probs, dtype=np.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def ngram(k=3, lo=1, hi=3):
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}


def counted(source=impl):
    """The learner's four functions, each counting its calls in ``.calls``."""
    calls = Counter()

    def wrap(name):
        fn = getattr(source, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call
    ns = types.SimpleNamespace(**{n: wrap(n) for n in impl.LEARNER_FUNCTIONS})
    ns.calls = calls
    return ns


class CycleModel:
    """Greedy next token = ``nxt[token]`` (97 otherwise); a copier, so n-gram drafts of a
    repeating text are all accepted. The KV cache is ignored."""

    def __init__(self, nxt):
        self.vocab_size, self.max_model_len, self.eos_token_id = 257, 256, 256
        self.tokenizer, self.nxt = ByteTokenizer(), nxt

    def init_kv_cache(self, num_blocks, block_size):
        pass

    def execute(self, model_input):
        tokens = model_input.token_ids[model_input.logits_indices]
        logits = np.zeros((len(tokens), self.vocab_size), dtype=np.float32)
        logits[np.arange(len(tokens)), [self.nxt.get(int(t), 97) for t in tokens]] = 10.0
        return logits


ABCD = {97: 98, 98: 99, 99: 100, 100: 97}  # a -> b -> c -> d -> a


class MarkovModel:
    """A 4-token Markov chain: the logits of a row are log P[row's token]. At temperature 1
    the output is the chain itself, so the law of any output tokens is known exactly."""

    P = np.array([[0.10, 0.50, 0.20, 0.20],   # each token goes to the next one (mod 4)
                  [0.20, 0.10, 0.50, 0.20],   # with probability 0.5: the n-gram drafts of
                  [0.25, 0.15, 0.10, 0.50],   # the prompt [0, 1, 2, 3, 0, 1, 2] propose
                  [0.50, 0.20, 0.20, 0.10]])  # exactly that successor

    def __init__(self):
        self.vocab_size, self.max_model_len, self.eos_token_id = 4, 64, None
        self.tokenizer = ByteTokenizer()

    def init_kv_cache(self, num_blocks, block_size):
        pass

    def execute(self, model_input):
        return np.log(self.P).astype(np.float32)[model_input.token_ids[model_input.logits_indices]]


GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
SHARED = list(range(40, 61))  # a 21-token prefix two prompts share
PROMPTS = [
    "hello world hello world",  # tiny-random loops here: drafts get accepted
    {"prompt_token_ids": SHARED + [1, 2, 3]},
    {"prompt_token_ids": list(range(100, 137))},
    "abcabcabcabcab",
    {"prompt_token_ids": SHARED},
]


@pytest.fixture(scope="module")
def reference():
    """Plain greedy outputs (no speculation, the stock engine): what every spec run must give."""
    out = {}
    for model in ("toy", "tiny-random"):
        engine = LLMEngine(model, block_size=4, num_blocks=128, enable_caching=False)
        out[model] = [list(r.output_token_ids) for r in engine.generate(PROMPTS, GREEDY)]
    return out


def generate(engine, prompts, params):
    return [list(r.output_token_ids) for r in engine.generate(prompts, params)]


# ---------------------------------------------------------------- 1. calc_spec_decode_metadata


def test_metadata_upstreams_worked_example():
    # vllm/v1/worker/gpu_model_runner.py:2713: five requests, drafts 3, 0, 2, 0, 1.
    # Request 0 owns rows 0..3 (last token + 3 drafts: all four rows), request 1 row 103 only,
    # request 2 rows 104..106, request 3 row 206, request 4 rows 207..208.
    meta = impl.calc_spec_decode_metadata(np.array([3, 0, 2, 0, 1]), np.array([4, 104, 107, 207, 209]))
    assert meta.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    # Gathered rows: request 0 at 0..3, 1 at 4, 2 at 5..7, 3 at 8, 4 at 9..10.
    assert meta.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert meta.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert meta.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert meta.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert meta.num_draft_tokens == [3, 0, 2, 0, 1] and meta.max_spec_len == 3
    assert meta.draft_token_ids.tolist() == []
    # With the input ids, draft j is the row after the one that judges it: rows 1, 2, 3,
    # 105, 106, 208 (upstream's comment "draft_token_indices").
    meta = impl.calc_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209],
                                          input_ids=np.arange(209) * 10)
    assert meta.draft_token_ids.tolist() == [10, 20, 30, 1050, 1060, 2080]


def test_metadata_without_drafts_is_each_requests_last_row():
    # Chunks of 5, 1 and 3 rows and no drafts: the last rows 4, 5, 8, exactly what the model
    # runner uses without speculation; no target rows; every gathered row is a bonus row.
    meta = impl.calc_spec_decode_metadata([0, 0, 0], [5, 6, 9])
    assert meta.logits_indices.tolist() == [4, 5, 8]
    assert meta.target_logits_indices.tolist() == [] and meta.bonus_logits_indices.tolist() == [0, 1, 2]
    # A prefill chunk next to a request whose whole chunk is its drafts plus one token.
    meta = impl.calc_spec_decode_metadata([0, 2], [7, 10])
    assert meta.logits_indices.tolist() == [6, 7, 8, 9]
    assert meta.target_logits_indices.tolist() == [1, 2] and meta.bonus_logits_indices.tolist() == [0, 3]


@pytest.mark.parametrize("args, message", [
    (([1, -1], [2, 4]), r"num_draft_tokens must be a non-empty 1-D array of integers >= 0"),
    (([], []), r"num_draft_tokens must be a non-empty 1-D array"),
    (([1, 0], [2]), r"cu_num_scheduled_tokens must have one entry per request \(2\), got 1"),
    (([2, 0], [2, 3]), r"cu_num_scheduled_tokens: request 0 scheduled 2 tokens, fewer than its 2 drafts \+ 1"),
    (([0, 1], [3, 4]), r"cu_num_scheduled_tokens: request 1 scheduled 1 tokens, fewer than its 1 drafts \+ 1"),
    (([0, 1], [3, 5], np.arange(4)), r"input_ids must be a 1-D integer array of cu_num_scheduled_tokens\[-1\] = 5"),
])
def test_metadata_bad_inputs_name_the_parameter(args, message):
    with pytest.raises(ValueError, match=message):
        impl.calc_spec_decode_metadata(*args)


# ---------------------------------------------------------------- 2. the rejection samplers


def test_greedy_keeps_the_leading_matches_then_the_targets_token():
    draft = [[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]]
    argmax = [[5, 6, 7], [5, 9, 7], [1, 6, 7], [5, 6, 2]]
    out = impl.rejection_greedy_sample(np.array(draft), np.array(argmax), np.array([8, 8, 8, 8]))
    assert out.tolist() == [[5, 6, 7, 8],      # all three agree: the bonus token follows
                            [5, 9, -1, -1],    # draft 6 loses to 9; the later match 7 does not count
                            [1, -1, -1, -1],   # the first draft is wrong: one token, the target's
                            [5, 6, 2, -1]]
    assert out.dtype == np.int64
    # No drafts: the bonus token alone.
    assert impl.rejection_greedy_sample(np.zeros((2, 0), np.int64), np.zeros((2, 0), np.int64),
                                        np.array([3, 4])).tolist() == [[3], [4]]


def random_case(batch=400, d=3, vocab=6, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.5), size=(batch, d))
    q = rng.dirichlet(np.full(vocab, 0.5), size=(batch, d))
    draft = rng.integers(0, vocab, size=(batch, d))
    bonus = rng.integers(0, vocab, size=batch)
    return draft, p, q, bonus


@pytest.mark.parametrize("with_q", [False, True])
def test_random_path_matches_mini_vllm_draw_for_draw(with_q):
    # Same seed, the draws in the documented order: the very tokens mini_vllm's own sampler gives
    # (400 rows of 3 drafts over 6 tokens, with and without draft probabilities).
    draft, p, q, bonus = random_case()
    q = q if with_q else None
    mine = impl.rejection_sample(draft, p, bonus, np.random.default_rng(7), q)
    stock = stock_rs.rejection_sample(draft, p, bonus, np.random.default_rng(7), q)
    assert mine.dtype == np.int64 and mine.shape == (400, 4)
    assert mine.tolist() == stock.tolist()
    assert 0 < (mine[:, 0] == draft[:, 0]).sum() < 400  # accepted and rejected rows both occur
    # No drafts: the bonus tokens, and no random number used.
    rng = np.random.default_rng(0)
    out = impl.rejection_sample(np.zeros((3, 0), np.int64), np.zeros((3, 0, 6)), np.array([1, 2, 3]), rng)
    assert out.tolist() == [[1], [2], [3]] and rng.random() == np.random.default_rng(0).random()


P8 = np.array([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02])


def test_one_hot_drafts_keep_the_target_distribution():
    # 200,000 verifies of the n-gram kind (no q): drafts 0 then 3, the target P8 at both rows.
    n = 200_000
    rng = np.random.default_rng(1)
    bonus = rng.choice(8, size=n, p=P8)
    out = impl.rejection_sample(np.tile([0, 3], (n, 1)), np.broadcast_to(P8, (n, 2, 8)), bonus, rng)
    # First token: draft 0 kept with probability P8[0] = 0.30, else drawn from P8 with 0 removed.
    assert chi_square(out[:, 0], P8) < CHI2_P1E6[7]
    assert abs(np.mean(out[:, 0] == 0) - 0.30) < 4.5 * math.sqrt(0.3 * 0.7 / n)
    # Given draft 0 was kept, the second token follows P8 again (draft 3 kept with 0.10).
    kept = out[:, 0] == 0
    assert chi_square(out[kept, 1], P8) < CHI2_P1E6[7]
    # Every row: accepted drafts, one token, then -1 to the end.
    filled = out != -1
    assert (filled[:, :-1] >= filled[:, 1:]).all() and filled[:, 0].all()
    assert (out[~kept, 1:] == -1).all() and (out[kept & (out[:, 1] == 3), 2] == bonus[kept & (out[:, 1] == 3)]).all()


def test_resampling_from_p_fails_the_same_check():
    # The check above has teeth: mini_vllm's sampler made to recover from P8 itself (the draft
    # not removed) gives token 0 with 0.30 + 0.70 * 0.30 = 0.51; yours, on the same draws, 0.30.
    n = 200_000
    args = (np.zeros((n, 1), np.int64), np.broadcast_to(P8, (n, 1, 8)), np.zeros(n, np.int64))
    mine = impl.rejection_sample(*args, np.random.default_rng(1))
    saved = stock_rs.recovery_probs
    stock_rs.recovery_probs = lambda target, draft, q: target.copy()
    try:
        buggy = stock_rs.rejection_sample(*args, np.random.default_rng(1))
    finally:
        stock_rs.recovery_probs = saved
    assert chi_square(mine[:, 0], P8) < CHI2_P1E6[7] < chi_square(buggy[:, 0], P8) / 100
    assert abs(np.mean(buggy[:, 0] == 0) - 0.51) < 0.005


def test_probabilistic_drafts_accept_sum_min_and_keep_p():
    # A uniform drafter: draft x ~ q, accepted with min(1, p(x)/q(x)); the acceptance rate is
    # sum(min(p, q)) and the output follows P8, not q.
    n = 200_000
    q = np.full(8, 1 / 8)
    rng = np.random.default_rng(3)
    draft = rng.choice(8, size=(n, 1), p=q)
    out = impl.rejection_sample(draft, np.broadcast_to(P8, (n, 1, 8)), np.zeros(n, np.int64), rng,
                                draft_probs=np.broadcast_to(q, (n, 1, 8)))
    assert chi_square(out[:, 0], P8) < CHI2_P1E6[7]
    alpha = np.minimum(P8, q).sum()  # 0.125 * 3 + 0.10 + 0.10 + 0.08 + 0.05 + 0.02 = 0.725
    assert alpha == pytest.approx(0.725)
    assert abs(np.mean(out[:, 1] != -1) - alpha) < 4.5 * math.sqrt(alpha * (1 - alpha) / n)


def test_a_draft_the_drafter_gave_zero_probability_is_rejected():
    # q(x) = 0 (a drafter that could not have proposed x): always rejected, never a NaN, so
    # position 1 is -1 in every row (an accepted draft would be followed by the bonus 2). The
    # recovery draws from max(p - q, 0) = [0.5, 0.5, 0]: token 0 itself half of the time.
    p = np.array([[[0.5, 0.5, 0.0]]] * 400)
    q = np.array([[[0.0, 0.0, 1.0]]] * 400)
    out = impl.rejection_sample(np.zeros((400, 1), np.int64), p, np.full(400, 2), np.random.default_rng(0), q)
    assert (out[:, 1] == -1).all() and set(out[:, 0].tolist()) == {0, 1}


@pytest.mark.parametrize("kwargs, message", [
    ({"draft_token_ids": np.zeros(3, np.int64)}, r"draft_token_ids must be a 2-D \[batch, num_drafts\]"),
    ({"target_probs": np.full((2, 1, 4), 0.25)}, r"target_probs must start with draft_token_ids' shape \(2, 2\)"),
    ({"bonus_token_ids": np.zeros(3, np.int64)}, r"bonus_token_ids must be \[batch\] = \[2\] integers"),
    ({"rng": 0}, r"rng must be a numpy.random.Generator, got int"),
    ({"target_probs": np.full((2, 2, 4), 0.5)}, r"target_probs must hold probability rows"),
    ({"draft_token_ids": np.array([[0, 4], [1, 1]])}, r"draft_token_ids must be token ids in \[0, 4\)"),
    ({"draft_probs": np.full((2, 2, 3), 1 / 3)}, r"draft_probs must be a \[batch, num_drafts, vocab\] array of shape"),
])
def test_rejection_sample_bad_inputs_name_the_parameter(kwargs, message):
    args = {"draft_token_ids": np.zeros((2, 2), np.int64), "target_probs": np.full((2, 2, 4), 0.25),
            "bonus_token_ids": np.zeros(2, np.int64), "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(ValueError, match=message):
        impl.rejection_sample(**args)
    with pytest.raises(ValueError, match=r"target_argmax must start with draft_token_ids' shape"):
        impl.rejection_greedy_sample(np.zeros((2, 2), np.int64), np.zeros((2, 3), np.int64), np.zeros(2, np.int64))


# ---------------------------------------------------------------- 3. update_after_verify


def make_request(prompt=(1, 2, 3, 4, 5), eos=256, **params):
    sp = SamplingParams(temperature=0.0, **{"max_tokens": 10, **params})
    return Request("r", list(prompt), sp, eos, tokenizer=ByteTokenizer())


def test_update_counts_rolls_back_and_appends():
    req = make_request()
    assert impl.update_after_verify(req, 3, 0, []) == ([], False)  # a prefill chunk: 3 of 5
    assert req.num_computed_tokens == 3 and req.output_token_ids == []
    assert impl.update_after_verify(req, 2, 0, [9]) == ([9], False)  # prompt done, first token
    assert req.num_computed_tokens == 5 and req.num_tokens == 6
    # Last token + 3 drafts scheduled (4 rows); draft 1 kept, draft 2 rejected, 7 recovered:
    # 2 of the 4 rows are rolled back (drafts 2 and 3), so computed = 5 + 4 - 2 = 7.
    assert impl.update_after_verify(req, 4, 3, [10, 7]) == ([10, 7], False)
    assert req.output_token_ids == [9, 10, 7] and req.num_computed_tokens == 7 == req.num_tokens - 1
    # Every draft kept plus the bonus: nothing to roll back.
    assert impl.update_after_verify(req, 3, 2, [11, 12, 13]) == ([11, 12, 13], False)
    assert req.num_computed_tokens == 10 == req.num_tokens - 1
    # Only the target's token (every draft rejected): back to one step of plain decoding.
    assert impl.update_after_verify(req, 4, 3, [14]) == ([14], False)
    assert req.num_computed_tokens == 11 == req.num_tokens - 1


@pytest.mark.parametrize("params, tokens, kept, reason", [
    ({"max_tokens": 3}, [20, 21, 22, 23], [20, 21], "length"),  # 1 + 2 reaches max_tokens
    ({}, [20, 256, 22, 23], [20, 256], "stop"),  # EOS in the middle of the accepted run
    ({"stop": "bc"}, [97, 98, 99, 100], [97, 98, 99], "stop"),  # "abc" holds "bc" after the third
])
def test_a_stop_inside_the_run_drops_what_follows(params, tokens, kept, reason):
    req = make_request(**params)
    impl.update_after_verify(req, 5, 0, [1])  # first token 1
    appended, stopped = impl.update_after_verify(req, 4, 3, tokens)
    assert (appended, stopped) == (kept, True)
    assert req.output_token_ids == [1] + kept and req.finish_reason == reason
    assert req.num_computed_tokens == 9  # rolled back by 0: all drafts were accepted
    # max_model_len, passed through: 5 prompt + 3 tokens reaches 8.
    req = make_request()
    impl.update_after_verify(req, 5, 0, [1])
    assert impl.update_after_verify(req, 4, 3, [2, 3, 4, 5], 8) == ([2, 3], True)


@pytest.mark.parametrize("args, message", [
    (("r", 1, 0, [1]), r"request must be a mini_vllm Request, got str"),
    ((None, 0, 0, []), r"num_scheduled_tokens must be an integer >= 1, got 0"),
    ((None, 3, -1, [1]), r"num_draft_tokens must be an integer >= 0, got -1"),
    ((None, 3, 3, [1]), r"num_draft_tokens must be <= num_scheduled_tokens - 1 = 2, got 3"),
    ((None, 3, 2, [1, 2, 3, 4]), r"new_token_ids must hold 1 to num_draft_tokens \+ 1 = 3 tokens"),
    ((None, 3, 2, []), r"new_token_ids must hold 1 to num_draft_tokens \+ 1 = 3 tokens"),
])
def test_update_bad_inputs_name_the_parameter(args, message):
    req = make_request()
    args = (req if args[0] is None else args[0],) + args[1:]
    with pytest.raises(ValueError, match=message):
        impl.update_after_verify(*args)
    assert req.num_computed_tokens == 0 and req.output_token_ids == []  # nothing changed


# ---------------------------------------------------------------- 4. the engine runs your pieces


def test_install_plugs_every_piece_and_puts_the_engines_back(reference):
    originals = (model_runner.calc_spec_decode_metadata, RejectionSampler.__call__,
                 Scheduler.update_from_output)
    mine = counted()
    with impl.install(mine):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, speculative_config=ngram(3))
        assert generate(engine, PROMPTS, GREEDY) == reference["tiny-random"]
    assert (model_runner.calc_spec_decode_metadata, RejectionSampler.__call__,
            Scheduler.update_from_output) == originals
    stats = engine.spec_decoding_stats
    # Your metadata ran on every step with drafts, your greedy sampler once per verify,
    # your update once per scheduled request per step.
    assert mine.calls["calc_spec_decode_metadata"] >= sum(1 for s in engine.stats if s.spec_decoding)
    assert mine.calls["rejection_greedy_sample"] == stats.num_drafts > 0
    assert mine.calls["update_after_verify"] == sum(len(s.num_scheduled_tokens) for s in engine.stats)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    with pytest.raises(ValueError, match="impl must provide .*; missing rejection_greedy_sample, rejection_sample, update_after_verify$"):
        with impl.install(types.SimpleNamespace(calc_spec_decode_metadata=impl.calc_spec_decode_metadata)):
            pass


@pytest.mark.parametrize("model, k, kw", [
    ("toy", 2, {}),
    ("tiny-random", 1, {}),
    ("tiny-random", 4, {"max_num_batched_tokens": 3}),  # chunked prefill; drafts cut by the budget
    ("tiny-random", 3, {"max_num_batched_tokens": 6, "long_prefill_token_threshold": 4}),
    ("tiny-random", 3, {"num_blocks": 14}),  # 13 usable blocks: the 37-token prompt forces preemption
])
def test_greedy_output_never_changes(reference, model, k, kw):
    mine = counted()
    with impl.install(mine):
        engine = LLMEngine(model, block_size=4, **{"num_blocks": 128, **kw}, speculative_config=ngram(k))
        assert generate(engine, PROMPTS, GREEDY) == reference[model]
    stats = engine.spec_decoding_stats
    assert stats.num_draft_tokens > 0 and mine.calls["rejection_greedy_sample"] == stats.num_drafts
    if model == "tiny-random":
        assert stats.num_accepted_tokens > 0
    if "num_blocks" in kw:
        assert any(s.preempted for s in engine.stats)
    if "max_num_batched_tokens" in kw:
        assert max(sum(s.num_scheduled_tokens.values()) for s in engine.stats) <= kw["max_num_batched_tokens"]


def test_greedy_output_survives_prefix_caching(reference):
    with impl.install(impl):
        engine = LLMEngine("tiny-random", block_size=4, num_blocks=128, speculative_config=ngram(3))
        first = generate(engine, PROMPTS, GREEDY)
        second = generate(engine, PROMPTS, GREEDY)
    assert first == second == reference["tiny-random"]
    assert sum(s.num_cached_tokens for s in engine.stats) >= 80  # hits really happened


@pytest.mark.parametrize("nxt, prompt, params, expected", [
    # c -> EOS: drafts after "...abc" are [EOS, a, b], all accepted; the output stops at EOS.
    ({**ABCD, 99: 256, 256: 97}, {"prompt_token_ids": [97, 98, 99, 256, 97, 98]},
     SamplingParams(temperature=0.0, max_tokens=10), [99, 256]),
    # The stop string "da" completes inside the accepted run d, a, b: "b" and the bonus dropped.
    (ABCD, "abcdab", SamplingParams(temperature=0.0, max_tokens=10, stop="da"), list(b"cda")),
])
def test_eos_and_stop_strings_inside_an_accepted_run(nxt, prompt, params, expected):
    plain = LLMEngine(CycleModel(nxt), block_size=4, num_blocks=32).generate(prompt, params)[0]
    with impl.install(impl):
        engine = LLMEngine(CycleModel(nxt), block_size=4, num_blocks=32, speculative_config=ngram(3, 1, 3))
        spec = engine.generate(prompt, params)[0]
    assert spec.output_token_ids == plain.output_token_ids == expected
    assert spec.finish_reason == plain.finish_reason == "stop" and spec.stop_reason == plain.stop_reason
    stats = engine.spec_decoding_stats
    assert stats.num_drafts == 1 and stats.num_accepted_tokens == 3  # accepted, then cut by the stop
    assert engine.num_steps == 2  # the prefill, then one verify that finishes the request


def test_max_tokens_in_the_middle_of_whole_runs():
    # abcd repeats, every draft is accepted; max_tokens 12: drafts per verify 3, 3, then 2
    # (room 12 - 9 - 1 = 2), so 4 steps make 1 + 4 + 4 + 3 = 12 tokens and stop at "length".
    with impl.install(impl):
        engine = LLMEngine(CycleModel(ABCD), block_size=4, num_blocks=32, speculative_config=ngram(3, 1, 2))
        out = engine.generate("abcdabcd", SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert out.output_token_ids == list(b"abcdabcdabcd") and out.finish_reason == "length"
    assert [s.spec_decoding.num_draft_tokens for s in engine.stats if s.spec_decoding] == [3, 3, 2]
    assert engine.num_steps == 4 and engine.spec_decoding_stats.draft_acceptance_rate == 1.0
    assert [s.num_decode_tokens for s in engine.stats] == [0, 4, 4, 3]


def test_stats_equal_what_the_test_counts_and_kv_stays_in_bounds(reference):
    # Step by step, greedy, tiny-random: before each step read every running request's drafts;
    # the accepted count is how many of them the no-spec output has at that place. The engine's
    # SpecDecodingStats must say the same; no request holds more blocks than its no-spec peak
    # plus ceil(k / block_size), and a request that was not preempted never loses a block.
    k, bs = 3, 4
    expected = dict(zip([f"req-{i}" for i in range(5)], reference["tiny-random"], strict=True))
    with impl.install(impl):
        engine = LLMEngine("tiny-random", block_size=bs, num_blocks=128, speculative_config=ngram(k))
        for prompt in PROMPTS:
            engine.add_request(prompt, GREEDY)
        drafted = accepted = drafts = 0
        per_pos = [0] * k
        kv, peak = engine.kv_cache_manager, Counter()
        while engine.has_unfinished_requests():
            before = {r.request_id: (list(r.spec_token_ids), r.num_output_tokens, list(kv.get_blocks(r.request_id)))
                      for r in engine.scheduler.running}
            finished = {r.request_id for r in engine.step()}
            for rid, (spec, n_out, blocks) in before.items():
                if spec:
                    ref = expected[rid][n_out:]
                    a = next((i for i, t in enumerate(spec) if i >= len(ref) or ref[i] != t), len(spec))
                    drafts, drafted, accepted = drafts + 1, drafted + len(spec), accepted + a
                    for i in range(a):
                        per_pos[i] += 1
                if rid not in finished:
                    assert kv.get_blocks(rid)[: len(blocks)] == blocks
                    peak[rid] = max(peak[rid], len(kv.get_blocks(rid)))
    stats = engine.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (drafts, drafted, accepted)
    assert stats.num_accepted_tokens_per_pos == per_pos and accepted > 0
    lengths = {f"req-{i}": len(engine.tokenizer.encode(p) if isinstance(p, str) else p["prompt_token_ids"])
               for i, p in enumerate(PROMPTS)}
    for rid, n in peak.items():
        assert n <= math.ceil((lengths[rid] + GREEDY.max_tokens - 1) / bs) + math.ceil(k / bs)


MARKOV_PROMPT = {"prompt_token_ids": [0, 1, 2, 3, 0, 1, 2]}


def markov_run(num_requests, source=impl, seed=0):
    """Output tokens of ``num_requests`` sampled requests (temperature 1, 4 tokens each)."""
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True)
    with impl.install(source):
        engine = LLMEngine(MarkovModel(), block_size=16, num_blocks=num_requests + 2, seed=seed,
                           max_num_seqs=num_requests, max_num_batched_tokens=8 * num_requests,
                           speculative_config=ngram(3))
        out = np.array(generate(engine, [MARKOV_PROMPT] * num_requests, params))
    return out, engine


def markov_pairs():
    """Exact law of (t2, t3), the two tokens the first verify decides: P[2] -> t1 -> t2 -> t3."""
    P = MarkovModel.P
    return (P[2] @ P)[:, None] * P  # [t2, t3]


def test_sampled_output_keeps_the_targets_law_through_the_engine():
    # 800 requests: t1 from the prefill, then one verify of 2 drafts (max_tokens 4 leaves room
    # for 2). The joint histogram of (t2, t3) against the chain's exact law, 16 cells.
    out, engine = markov_run(800)
    pairs = out[:, 1] * 4 + out[:, 2]
    assert chi_square(pairs, markov_pairs().ravel()) < CHI2_P1E6[15]
    assert abs(successor_rate(out) - 0.5) < 4.5 * math.sqrt(0.25 / 800)
    stats = engine.spec_decoding_stats
    assert stats.num_drafts >= 800 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    # The same seeds through mini_vllm's own sampler give the same tokens (draws in the same order).
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True)
    stock = LLMEngine(MarkovModel(), block_size=16, num_blocks=202, max_num_seqs=200,
                      max_num_batched_tokens=1600, speculative_config=ngram(3))
    assert generate(stock, [MARKOV_PROMPT] * 200, params) == out[:200].tolist()


def successor_rate(out):
    """How often t2 is the successor of t1 (the first draft): 0.5 under the chain."""
    return float(np.mean(out[:, 1] == (out[:, 0] + 1) % 4))


def test_negative_control_recovering_from_p_fails_the_engine_check():
    # Your metadata and update, with mini_vllm's sampler made to recover from p itself: the
    # first draft, always t1's successor (probability 0.5), comes out with 0.5 + 0.5 * 0.5 = 0.75.
    def buggy(draft, probs, bonus, rng, draft_probs=None):
        saved = stock_rs.recovery_probs
        stock_rs.recovery_probs = lambda target, d, q: target.copy()
        try:
            return stock_rs.rejection_sample(draft, probs, bonus, rng, draft_probs)
        finally:
            stock_rs.recovery_probs = saved
    n = 400
    out, _ = markov_run(n, types.SimpleNamespace(
        calc_spec_decode_metadata=impl.calc_spec_decode_metadata, rejection_sample=buggy,
        rejection_greedy_sample=impl.rejection_greedy_sample, update_after_verify=impl.update_after_verify))
    assert chi_square(out[:, 1] * 4 + out[:, 2], markov_pairs().ravel()) > CHI2_P1E6[15]
    assert successor_rate(out) - 0.5 > 4.5 * math.sqrt(0.25 / n)  # about 0.75: 10 sigma off
