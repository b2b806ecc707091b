"""Phase 09's sampling knobs: penalties, min_tokens, logit bias, allowed ids, bad words, logprobs.

Off by default, and off is the old path bit for bit (``Sampler.forward`` with
no knob == ``Sampler.sample`` row by row, same tokens and same generator
states after). On, each knob matches a hand-computed value in upstream's
order; the engine's output with them on is unchanged by chunked prefill,
prefix caching and preemption; logprobs equal a float64 log-softmax of the
model's own logits (tiny-random and SmolLM2), whatever the temperature or
penalties; ``n > 1`` children share the prompt's blocks and use ``seed + i``.
"""
from __future__ import annotations

import numpy as np
import pytest

from mini_vllm.engine import LLM, LLMEngine
from mini_vllm.sampler import (
    Logprob,
    Sampler,
    SamplingMetadata,
    apply_bad_words,
    apply_penalties,
    compute_logprobs,
    gather_logprobs,
)
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import ByteTokenizer

# --- SamplingParams ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\], got 2.5"),
    ({"presence_penalty": -2.01}, r"presence_penalty must be in \[-2, 2\], got -2.01"),
    ({"presence_penalty": "1"}, r"presence_penalty must be a number in \[-2, 2\]"),
    ({"frequency_penalty": 3}, r"frequency_penalty must be in \[-2, 2\], got 3"),
    ({"frequency_penalty": float("nan")}, r"frequency_penalty must be in \[-2, 2\], got nan"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty must be a finite number > 0, got 0.0"),
    ({"repetition_penalty": -1.0}, r"repetition_penalty must be a finite number > 0, got -1.0"),
    ({"repetition_penalty": float("inf")}, r"repetition_penalty must be a finite number > 0, got inf"),
    ({"min_tokens": -1}, r"min_tokens must be in \[0, max_tokens=16\], got -1"),
    ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be in \[0, max_tokens=4\], got 5"),
    ({"min_tokens": 1.0}, r"min_tokens must be an integer in \[0, max_tokens\]"),
    ({"logit_bias": {-1: 1.0}}, r"logit_bias must be None or a dict of token id \(int >= 0\)"),
    ({"logit_bias": {1: float("inf")}}, r"logit_bias must be None or a dict of token id"),
    ({"logit_bias": [1.0]}, r"logit_bias must be None or a dict of token id"),
    ({"allowed_token_ids": []}, r"allowed_token_ids must be None or a non-empty list of token ids"),
    ({"allowed_token_ids": [1, -2]}, r"allowed_token_ids must be None or a non-empty list"),
    ({"bad_words": [[]]}, r"bad_words must be None or a list of non-empty token-id lists"),
    ({"bad_words": ["bad"]}, r"bad_words must be None or a list of non-empty token-id lists"),
    ({"bad_words": [[1, True]]}, r"bad_words must be None or a list of non-empty token-id lists"),
    ({"logprobs": -2}, r"logprobs must be None, -1 \(the whole vocabulary\) or an integer >= 0, got -2"),
    ({"logprobs": 1.5}, r"logprobs must be None, -1 \(the whole vocabulary\) or an integer >= 0, got 1.5"),
    ({"logprobs": True}, r"logprobs must be None, -1"),
])
def test_every_bad_value_names_the_field_and_its_range(kwargs, message):
    with pytest.raises(ValueError, match="^" + message):
        SamplingParams(**kwargs)


def test_upstream_defaults_and_boundaries_are_accepted():
    p = SamplingParams()
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_tokens) == (0.0, 0.0, 1.0, 0)
    assert (p.logit_bias, p.allowed_token_ids, p.bad_words, p.logprobs) == (None, None, None, None)
    assert not p.has_logits_processing
    edge = SamplingParams(presence_penalty=-2, frequency_penalty=2.0, repetition_penalty=1e-3,
                          min_tokens=16, logprobs=-1, logit_bias={3: -100}, bad_words=[(1, 2)])
    assert edge.has_logits_processing and edge.logit_bias == {3: -100.0} and edge.bad_words == [[1, 2]]
    assert SamplingParams(logprobs=0).logprobs == 0 and not SamplingParams(logprobs=5).has_logits_processing
    for knob in ({"presence_penalty": 0.1}, {"frequency_penalty": -0.1}, {"repetition_penalty": 0.9},
                 {"min_tokens": 1}, {"logit_bias": {0: 0.5}}, {"allowed_token_ids": [0]}, {"bad_words": [[0]]}):
        assert SamplingParams(**knob).has_logits_processing, knob


def test_the_engine_checks_ids_against_the_vocabulary_and_logprobs_against_max_logprobs():
    engine = LLMEngine(block_size=4)  # toy model: vocab 257
    for kw, message in [
        ({"logit_bias": {257: 1.0}}, r"logit_bias token ids must be in \[0, 257\), got \[257\]"),
        ({"allowed_token_ids": [3, 300]}, r"allowed_token_ids token ids must be in \[0, 257\), got \[300\]"),
        ({"bad_words": [[1, 999]]}, r"bad_words token ids must be in \[0, 257\), got \[999\]"),
        ({"logprobs": 21}, r"logprobs must be <= max_logprobs \(20\), got 21"),
        ({"logprobs": -1}, r"logprobs must be <= max_logprobs \(20\), got -1"),
    ]:
        with pytest.raises(ValueError, match="^" + message):
            engine.add_request("x", SamplingParams(**kw))
    assert not engine.has_unfinished_requests()
    uncapped = LLMEngine(block_size=4, max_logprobs=-1).generate("x", SamplingParams(max_tokens=1, logprobs=-1))[0]
    assert len(uncapped.logprobs[0]) == 257  # the whole vocabulary, ranks 1..257
    with pytest.raises(ValueError, match=r"^max_logprobs must be -1 \(no cap\) or an integer >= 0, got -2"):
        LLMEngine(max_logprobs=-2)
    spec = LLMEngine(block_size=4, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                       "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    for kw in ({"repetition_penalty": 1.2}, {"logprobs": 1}, {"min_tokens": 1}, {"bad_words": [[1]]}):
        with pytest.raises(ValueError, match="must be off with speculative_config"):
            spec.add_request("x", SamplingParams(**kw))


# --- the sampler's ops, by hand -----------------------------------------------------------------

def test_penalties_against_hand_computed_values():
    logits = np.array([[2.0, -1.0, 0.5, 0.0, 3.0]])
    # prompt {0, 1}; output 2, 2, 4. Repetition 2 scales tokens 0, 1, 2, 4 (prompt OR output):
    # 2 -> 1, -1 -> -2 (negative: multiplied), 0.5 -> 0.25, 3 -> 1.5; token 3 (0.0) untouched.
    # Frequency 0.5 x output count: token 2 -1.0, token 4 -0.5. Presence 0.25 on tokens 2, 4.
    out = apply_penalties(logits, [[0, 1]], [[2, 2, 4]], np.array([0.25]), np.array([0.5]), np.array([2.0]))
    np.testing.assert_allclose(out, [[1.0, -2.0, -1.0, 0.0, 0.75]], rtol=0, atol=1e-15)
    # Frequency and presence never look at the prompt: prompt-only tokens keep their logits.
    only_fp = apply_penalties(logits, [[0, 1]], [[]], np.array([2.0]), np.array([2.0]), np.array([1.0]))
    np.testing.assert_array_equal(only_fp, logits)
    # Repetition covers the prompt even with no output yet.
    only_rep = apply_penalties(logits, [[0, 1]], [[]], np.zeros(1), np.zeros(1), np.array([2.0]))
    np.testing.assert_array_equal(only_rep, [[1.0, -2.0, 0.5, 0.0, 3.0]])


def test_bad_words_follow_the_output_not_the_prompt():
    row = np.zeros(6)
    apply_bad_words(row, [[5], [1, 2, 3], [4, 0]], past_tokens=[9, 1, 2])
    # [5] always banned; [1, 2, 3]: the output ends with 1, 2 -> ban 3; [4, 0]: output ends with 2, not 4.
    assert np.isneginf(row).tolist() == [False, False, False, True, False, True]
    row = np.zeros(6)
    apply_bad_words(row, [[1, 2, 3]], past_tokens=[2])  # longer than output + 1: skipped
    assert np.isfinite(row).all()
    # In the engine, a prompt ending in the prefix does not trigger the ban (upstream passes
    # output_token_ids only): the bad word's first token is sampled freely afterwards.
    meta = SamplingMetadata([SamplingParams(temperature=0, bad_words=[[1, 2]])], [None],
                            prompt_token_ids=[[0, 1]], output_token_ids=[[]])
    assert Sampler().forward(np.array([[0.0, 0.0, 5.0]]), meta).sampled == [2]


def _meta(params, prompt=(0,), output=(), eos=(4,)):
    return SamplingMetadata([params], [np.random.default_rng(0)], [list(prompt)], [list(output)], [tuple(eos)])


def test_order_allowed_then_bad_words_then_min_tokens_and_bias_then_penalties():
    sampler = Sampler()
    logits = np.array([[1.0, 0.5, -3.0, 0.2, 9.0]])
    # Bias before repetition: token 0 (in the prompt) 1.0 + 1.0 = 2.0, / 2 = 1.0; penalties
    # first would give 0.5 + 1.0 = 1.5.
    p = SamplingParams(temperature=0, logit_bias={0: 1.0}, repetition_penalty=2.0)
    got = sampler.apply_logits_processors(logits, _meta(p, prompt=[0]), [0])
    np.testing.assert_array_equal(got, [[1.0, 0.5, -3.0, 0.2, 9.0]])
    # min_tokens bans EOS (4) while the output is shorter; allowed ids ban all but {1, 2, 4};
    # the bias on banned token 0 stays -inf; token 2 gets +4: -3 + 4 = 1 > 0.5.
    p = SamplingParams(temperature=0, allowed_token_ids=[1, 2, 4], min_tokens=2, logit_bias={0: 50.0, 2: 4.0})
    got = sampler.apply_logits_processors(logits, _meta(p, output=[3]), [0])
    np.testing.assert_array_equal(got, [[-np.inf, 0.5, 1.0, -np.inf, -np.inf]])
    assert sampler.forward(logits, _meta(p, output=[3])).sampled == [2]
    # At min_tokens outputs, EOS is free again.
    assert sampler.forward(logits, _meta(p, output=[3, 3])).sampled == [4]
    # min_tokens bans EOS even with ignore_eos (upstream adds EOS to the stop ids regardless).
    p = SamplingParams(temperature=0, min_tokens=1, ignore_eos=True)
    assert sampler.forward(logits, _meta(p)).sampled == [0]


OLD_KNOBS = [
    dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=3), dict(temperature=1.3, top_p=0.8),
    dict(temperature=1.0, min_p=0.2), dict(temperature=0.5, top_k=5, top_p=0.9, min_p=0.05),
    dict(temperature=2.0, top_k=1), dict(temperature=1.0, top_p=0.3), dict(temperature=0.01),
    dict(temperature=1.0, top_k=-1), dict(temperature=0.9, min_p=1.0), dict(temperature=1.0, seed=3),
    dict(temperature=1.1, top_k=50, top_p=0.95), dict(temperature=0.0, top_k=2), dict(temperature=1.0, logprobs=3),
]


def test_forward_with_every_new_knob_off_is_sample_row_by_row_bit_for_bit():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((len(OLD_KNOBS), 64)) * 3).astype(np.float32)
    params = [SamplingParams(**kw) for kw in OLD_KNOBS]
    gens_a = [np.random.default_rng(100 + i) for i in range(len(params))]
    gens_b = [np.random.default_rng(100 + i) for i in range(len(params))]
    for _ in range(20):
        out = Sampler().forward(logits, SamplingMetadata(params, gens_a))
        ref = [Sampler().sample(logits[i], p, gens_b[i]) for i, p in enumerate(params)]
        assert out.sampled == ref
    assert [g.bit_generator.state for g in gens_a] == [g.bit_generator.state for g in gens_b]
    # Only the logprobs row gets logprobs.
    assert [lp is None for lp in out.logprobs] == [True] * (len(params) - 1) + [False]


def test_forward_is_row_by_row_with_knobs_on():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((4, 32)).astype(np.float32)
    params = [SamplingParams(temperature=0.8, repetition_penalty=1.4, presence_penalty=0.5, seed=1),
              SamplingParams(temperature=0),
              SamplingParams(temperature=0, frequency_penalty=1.0, bad_words=[[3, 7]], logprobs=2),
              SamplingParams(temperature=1.0, allowed_token_ids=[1, 5, 9], logit_bias={5: 2.0})]
    prompts, outputs = [[1, 2, 3], [4], [5, 5], [6]], [[7, 7], [], [3], [9]]
    batch = Sampler().forward(logits, SamplingMetadata(params, [np.random.default_rng(i) for i in range(4)],
                                                       prompts, outputs, [(31,)] * 4))
    for i in range(4):
        alone = Sampler().forward(logits[i:i + 1], SamplingMetadata(
            [params[i]], [np.random.default_rng(i)], [prompts[i]], [outputs[i]], [(31,)]))
        assert alone.sampled == [batch.sampled[i]] and alone.logprobs == [batch.logprobs[i]]
    assert batch.sampled[3] in (1, 5, 9)


# --- logprobs -------------------------------------------------------------------------------------

def _reference_log_softmax(row):
    row = np.asarray(row, dtype=np.float64)
    return row - np.log(np.sum(np.exp(row - row.max()))) - row.max()


def test_gather_logprobs_puts_the_sampled_token_first_with_its_rank():
    lp = compute_logprobs(np.array([1.0, 3.0, 2.0, 3.0, 0.0]))
    # Sampled token 4 (the worst): rank 5; then the top 2 in order, ties by lower id: 1, 3.
    assert list(gather_logprobs(lp, 2, 4).items()) == [
        (4, Logprob(lp[4], 5)), (1, Logprob(lp[1], 1)), (3, Logprob(lp[3], 2))]
    # Sampled inside the top k: one entry fewer, and its top-k rank wins (the dict insert overwrites).
    assert list(gather_logprobs(lp, 2, 1).items()) == [(1, Logprob(lp[1], 1)), (3, Logprob(lp[3], 2))]
    # A tie shares the worse rank: token 3 ties token 1 at the top, so count(lp >= lp[3]) = 2.
    assert gather_logprobs(lp, 0, 3) == {3: Logprob(lp[3], 2)}


def test_logprobs_are_raw_whatever_the_temperature_and_penalties():
    logits = np.random.default_rng(2).standard_normal((1, 40)).astype(np.float32)
    ref = _reference_log_softmax(logits[0])
    for kw in (dict(temperature=0), dict(temperature=0.3, seed=1), dict(temperature=2.0, seed=2, top_k=3),
               dict(temperature=0, repetition_penalty=1.8, logit_bias={0: 30.0}, presence_penalty=2.0)):
        out = Sampler().forward(logits, _meta(SamplingParams(logprobs=4, **kw), prompt=[1, 2], output=[3]))
        entries = out.logprobs[0]
        assert next(iter(entries)) == out.sampled[0]
        top = np.argsort(-ref, kind="stable")[:4].tolist()
        assert set(entries) == set(top) | {out.sampled[0]}
        for t, e in entries.items():
            assert abs(e.logprob - ref[t]) < 1e-12
            assert e.rank == (top.index(t) + 1 if t in top else int((ref >= ref[t]).sum()))


class _Recorder:
    """Wraps ``model.execute`` and keeps every logits array it returns."""

    def __init__(self, engine):
        self.rows, self._execute = [], engine.model.execute
        engine.model.execute = self

    def __call__(self, model_input):
        logits = self._execute(model_input)
        self.rows.append(np.array(logits))
        return logits


def _check_logprobs_against_the_model(engine, prompt, params):
    rec = _Recorder(engine)
    req = engine.generate(prompt, params)[0]
    assert len(req.logprobs) == len(req.output_token_ids)
    steps = [r[-1] for r in rec.rows]  # one request: its sampling row is the last row of each step
    total = 0.0
    for token, entries, row in zip(req.output_token_ids, req.logprobs, steps, strict=True):
        ref = _reference_log_softmax(row)
        assert next(iter(entries)) == token
        assert entries[token].rank == int((ref >= ref[token]).sum())
        top = np.argsort(-ref, kind="stable")[:params.logprobs]
        assert set(entries) == set(top.tolist()) | {token}
        for t, e in entries.items():
            assert abs(e.logprob - ref[t]) < 1e-9
        total += ref[token]
    assert abs(req.cumulative_logprob - total) < 1e-9
    return req


def test_logprobs_equal_a_float64_log_softmax_of_tiny_random_logits():
    engine = LLMEngine("tiny-random", block_size=4, enable_caching=False)
    req = _check_logprobs_against_the_model(
        engine, "hello world", SamplingParams(temperature=0.7, seed=5, max_tokens=6, logprobs=3,
                                              repetition_penalty=1.2, ignore_eos=True))
    out = LLM("tiny-random", block_size=4).generate("hello world", SamplingParams(
        temperature=0.7, seed=5, max_tokens=6, logprobs=3, repetition_penalty=1.2, ignore_eos=True))[0].outputs[0]
    assert out.logprobs == req.logprobs and out.cumulative_logprob == req.cumulative_logprob
    plain = LLM("tiny-random", block_size=4).generate("hello world", SamplingParams(max_tokens=2))[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None


@pytest.mark.model
def test_logprobs_equal_a_float64_log_softmax_of_smollm2_logits():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mini_vllm.models import get_model

    with threadpoolctl.threadpool_limits(1, "blas"):
        engine = LLMEngine(get_model("smollm2"), block_size=16, num_blocks=8)
        req = _check_logprobs_against_the_model(
            engine, "The capital of France is", SamplingParams(temperature=0, max_tokens=3, logprobs=5))
    assert req.logprobs[0][req.output_token_ids[0]].rank == 1  # greedy: the sampled token is the top one


# --- the engine -----------------------------------------------------------------------------------

class _EosLover:
    """Greedy favourite EOS (256), then token 97: ``min_tokens`` decides the length."""

    vocab_size, max_model_len, eos_token_id = 257, 256, 256
    tokenizer = ByteTokenizer()

    def init_kv_cache(self, num_blocks, block_size):
        pass

    def execute(self, model_input):
        logits = np.zeros((len(model_input.logits_indices), 257), dtype=np.float32)
        logits[:, 256], logits[:, 97], logits[:, 98] = 10.0, 5.0, 1.0
        return logits


def test_min_tokens_holds_eos_and_stop_strings_back():
    engine = LLMEngine(_EosLover(), block_size=4)
    greedy = dict(temperature=0, max_tokens=8)
    assert engine.generate("x", SamplingParams(**greedy))[0].output_token_ids == [256]
    req = engine.generate("x", SamplingParams(**greedy, min_tokens=3))[0]
    assert req.output_token_ids == [97, 97, 97, 256] and req.finish_reason == "stop"
    # A stop string counts only if it ends after the first min_tokens tokens' text: with EOS
    # biased away, "aa" stops at token 2 without min_tokens, at token 4 with min_tokens=3.
    no_eos = dict(greedy, logit_bias={256: -20.0}, stop="aa")
    req = engine.generate("x", SamplingParams(**no_eos))[0]
    assert req.output_token_ids == [97, 97] and req.output_text() == ""
    req = engine.generate("x", SamplingParams(**no_eos, min_tokens=3))[0]
    assert req.output_token_ids == [97, 97, 97, 97] and req.stop_reason == "aa"
    assert req.output_text() == "aa"  # cut at the match ending past "aaa": "aa|aa"
    # bad_words [97] then leaves 98 (EOS banned by min_tokens), allowed ids restrict the choice.
    req = engine.generate("x", SamplingParams(**greedy, min_tokens=2, bad_words=[[97]]))[0]
    assert req.output_token_ids == [98, 98, 256]
    req = engine.generate("x", SamplingParams(**{**greedy, "max_tokens": 3}, allowed_token_ids=[98, 99]))[0]
    assert req.output_token_ids == [98, 98, 98]


KNOBS = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3, logit_bias={101: 1.5},
             bad_words=[[104, 101]], min_tokens=2, logprobs=2, max_tokens=6, ignore_eos=True)
PROMPTS = ["hello world hello", "hello world again and again", "abcdefgh"]


def _outputs(engine, params):
    reqs = engine.generate(PROMPTS, params)
    return [r.output_token_ids for r in reqs], [r.logprobs for r in reqs]


def _assert_same(a, b):
    assert a[0] == b[0]
    for lps_a, lps_b in zip(a[1], b[1], strict=True):
        for pa, pb in zip(lps_a, lps_b, strict=True):
            assert list(pa) == list(pb)
            assert all(abs(pa[t].logprob - pb[t].logprob) < 1e-5 and pa[t].rank == pb[t].rank for t in pa)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, **KNOBS),
                                    SamplingParams(temperature=0.9, top_k=20, seed=11, **KNOBS)])
def test_knobs_on_output_survives_chunking_caching_and_preemption(params):
    ref = _outputs(LLMEngine("tiny-random", block_size=4, enable_caching=False), params)
    hard = LLMEngine("tiny-random", block_size=4, num_blocks=10, max_num_batched_tokens=5)
    _assert_same(_outputs(hard, params), ref)
    assert sum(len(s.preempted) for s in hard.stats) > 0
    assert sum(s.num_cached_tokens for s in hard.stats) > 0
    # The knobs do act: the same run without them differs.
    plain = SamplingParams(temperature=params.temperature, top_k=params.top_k, seed=params.seed,
                           max_tokens=6, ignore_eos=True)
    assert _outputs(LLMEngine("tiny-random", block_size=4), plain)[0] != ref[0]


def test_parallel_sampling_children_share_the_prompt_blocks_and_use_seed_plus_i():
    prompt = {"prompt_token_ids": list(range(1, 41))}  # 40 tokens: 2 full blocks of 16
    params = SamplingParams(n=4, temperature=1.0, seed=9, max_tokens=4, ignore_eos=True,
                            repetition_penalty=1.1, logprobs=1)
    out = LLM("tiny-random", block_size=16).generate(prompt, params)[0]
    # Child 0 computes the prompt; children 1-3 hit floor(39 / 16) * 16 = 32 tokens each.
    assert [o.metrics.num_cached_tokens for o in out.outputs] == [0, 32, 32, 32]
    for i, child in enumerate(out.outputs):
        alone = LLM("tiny-random", block_size=16).generate(prompt, SamplingParams(
            temperature=1.0, seed=9 + i, max_tokens=4, ignore_eos=True, repetition_penalty=1.1, logprobs=1))
        assert child.token_ids == alone[0].outputs[0].token_ids
        # Alone, the model runs a batch of one: its float32 logits differ in the last bits.
        assert child.cumulative_logprob == pytest.approx(alone[0].outputs[0].cumulative_logprob, abs=1e-5)
