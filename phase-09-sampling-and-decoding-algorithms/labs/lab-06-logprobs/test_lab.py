"""Lab 09-06 tests: log-softmax, ranks, vLLM's logprob dicts, raw vs processed, prompt logprobs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from course import load_impl
from mini_vllm import sampler as mv
from mini_vllm.engine import LLM
from mini_vllm.sampler import Logprob, Sampler, SamplingMetadata
from mini_vllm.sampling_params import SamplingParams

impl = load_impl(__file__)

PROMPT_LOGPROBS_LANDED = "prompt_logprobs" in getattr(SamplingParams, "__dataclass_fields__", {})


# ---------------------------------------------------------------- test-side references


def torch_log_softmax(rows) -> np.ndarray:
    """The reference log-softmax: torch's, in float64 (importing torch costs ~1 s, once)."""
    torch = pytest.importorskip("torch")
    return torch.log_softmax(torch.as_tensor(np.asarray(rows, dtype=np.float64)), dim=-1).numpy()


def ref_log_softmax(rows) -> np.ndarray:
    """The same in numpy, float64, written out: x - max - log(sum(exp(x - max)))."""
    x = np.asarray(rows, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def all_logits(model, token_ids) -> np.ndarray:
    """The model run directly on ``token_ids`` in one prefill: float32 logits ``[T, V]``,
    row t = the distribution of token t + 1. The model's KV cache is put back after."""
    from mini_vllm.models.runner import Chunk, make_model_input

    blocks = -(-len(token_ids) // 16)
    saved = model.kv_cache
    model.init_kv_cache(blocks + 1, 16)
    try:
        return model.compute_logits(model.forward(
            make_model_input([Chunk(list(token_ids), 0, list(range(1, blocks + 1)))], 16)))
    finally:
        model.kv_cache = saved


def meta(params, prompts=None, outputs=None, eos=(4,)):
    """SamplingMetadata for len(params) rows, each with a generator seeded by its row."""
    b = len(params)
    return SamplingMetadata(list(params), [np.random.default_rng(i) for i in range(b)],
                            prompts or [[0, 1]] * b, outputs or [[2]] * b, [tuple(eos)] * b)


def assert_same_dicts(got, want, tol=1e-12):
    """Same keys in the same order, same ranks, logprobs within tol (None for None)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
            continue
        assert list(g) == list(w), (list(g), list(w))
        for t in w:
            assert g[t].rank == w[t].rank, (t, g[t].rank, w[t].rank)
            assert g[t].logprob == pytest.approx(w[t].logprob, abs=tol, rel=0)


# ---------------------------------------------------------------- compute_logprobs


def test_compute_logprobs_is_a_log_softmax_row_by_row():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((4, 50)) * 5).astype(np.float32)
    logits[2, :] += 40.0  # one row shifted: a per-row log-softmax does not care
    before = logits.copy()
    lp = impl.compute_logprobs(logits)
    assert lp.dtype == np.float64 and lp.shape == (4, 50)
    np.testing.assert_allclose(lp, ref_log_softmax(logits), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), np.ones(4), rtol=0, atol=1e-12)
    np.testing.assert_allclose(lp, mv.compute_logprobs(logits), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(logits, before)  # the input is not touched


def test_compute_logprobs_is_torch_log_softmax():
    logits = np.random.default_rng(1).standard_normal((3, 257)) * 4
    np.testing.assert_allclose(impl.compute_logprobs(logits), torch_log_softmax(logits), rtol=0, atol=1e-12)


def test_compute_logprobs_does_not_overflow():
    # exp(1000) is inf in float64; shifted by the max, row 0 is [0, -1, -2] - log(1 + e^-1 + e^-2)
    lp = impl.compute_logprobs([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -np.inf]])
    z = math.log(1 + math.exp(-1) + math.exp(-2))  # 0.40760596444438
    np.testing.assert_allclose(lp[0], [-z, -1 - z, -2 - z], rtol=0, atol=1e-12)
    # row 1: [0, -1] - log(1 + e^-1); a banned (-inf) token stays -inf, no NaN
    w = math.log(1 + math.exp(-1))  # 0.31326168751822
    np.testing.assert_allclose(lp[1, :2], [-w, -1 - w], rtol=0, atol=1e-12)
    assert lp[1, 2] == -np.inf and not np.isnan(lp).any()


# ---------------------------------------------------------------- ranks and the dicts

TIED = np.array([[2.0, 1.0, 2.0, 0.0, -1.0]])  # tokens 0 and 2 tie at the top


def test_rank_counts_the_tokens_at_least_as_likely():
    lp = impl.compute_logprobs(TIED)
    # token 0: tokens 0 and 2 are >= it -> 2; token 1: 0, 1, 2 -> 3; token 3: 4; token 4: 5
    got = impl.ranks(np.repeat(lp, 5, axis=0), [0, 1, 2, 3, 4])
    assert got.dtype == np.int64 and got.tolist() == [2, 3, 2, 4, 5]
    # a strict winner has rank 1, the strict loser rank V
    row = impl.compute_logprobs([[0.5, 3.0, -2.0, 1.0]])
    assert impl.ranks(np.repeat(row, 2, axis=0), [1, 2]).tolist() == [1, 4]


def test_two_tokens_tied_at_the_top():
    lp = impl.compute_logprobs(TIED)
    top = float(lp[0, 0])  # log(e^2 / (2e^2 + e + 1 + e^-1))
    assert top == pytest.approx(2 - math.log(2 * math.e**2 + math.e + 1 + math.exp(-1)), abs=1e-12)
    # k = 0: only the sampled token, with its shared (worse) rank
    assert impl.gather_logprobs(lp, 0, [0]) == [{0: Logprob(top, 2)}]
    # k = 1: the top-1 list is token 0 (ties go to the lower id). Sampled 0 is in it:
    # its entry is overwritten with the top-k rank 1 and the dict has k = 1 entry.
    assert impl.gather_logprobs(lp, 1, [0]) == [{0: Logprob(top, 1)}]
    # Sampled 2 is tied for the best, yet not in the top-1 list: k + 1 = 2 entries, rank 2 first.
    assert list(impl.gather_logprobs(lp, 1, [2])[0].items()) == [(2, Logprob(top, 2)), (0, Logprob(top, 1))]
    # k = 2: both tied tokens listed, lower id first; sampled 2 keeps its first place in the dict
    assert list(impl.gather_logprobs(lp, 2, [2])[0].items()) == [(2, Logprob(top, 2)), (0, Logprob(top, 1))]
    # mini_vllm's greedy pick among tied logits is the lower id, and the engine's dicts agree
    for k in (0, 1, 2):
        m = meta([SamplingParams(temperature=0, logprobs=k)])
        out = Sampler().forward(TIED, m)
        assert out.sampled == [0]
        assert_same_dicts(impl.logprobs_for_step(TIED, m, out.sampled), out.logprobs)
        assert out.logprobs[0][0].rank == (2 if k == 0 else 1)


def test_dict_is_sampled_token_first_then_top_k():
    lp = impl.compute_logprobs([[0.1, 2.0, -1.0, 3.0, 0.5, 1.0]])
    # order by logprob: 3 (rank 1), 1, 5, 4, 0, 2 (rank 6)
    d = impl.gather_logprobs(lp, 3, [2])[0]
    assert list(d) == [2, 3, 1, 5]  # k + 1 entries: the sampled token is not in the top 3
    assert [e.rank for e in d.values()] == [6, 1, 2, 3]
    assert all(type(e.logprob) is float and type(e.rank) is int for e in d.values())
    assert d[3].logprob == pytest.approx(float(lp[0, 3]), abs=1e-15)
    d = impl.gather_logprobs(lp, 3, [5])[0]
    assert list(d) == [5, 3, 1] and [e.rank for e in d.values()] == [3, 1, 2]  # k entries
    assert impl.gather_logprobs(lp, 0, [4]) == [{4: Logprob(float(lp[0, 4]), 4)}]


def test_gather_logprobs_equals_mini_vllms_on_a_batch():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 40)) * 3
    logits[1, [5, 9, 30]] = logits[1].max() + 1.0  # a three-way tie at the top
    logits[4, :] = 0.0  # a flat row: every token rank 40
    lp = impl.compute_logprobs(logits)
    tokens = [7, 9, 0, 39, 12, 22]
    for k in (0, 1, 5, 40):
        got = impl.gather_logprobs(lp, k, tokens)
        want = [mv.gather_logprobs(mv.compute_logprobs(logits[i]), k, tokens[i]) for i in range(6)]
        assert_same_dicts(got, want)
    assert impl.gather_logprobs(lp, 0, tokens)[4][12].rank == 40
    assert impl.gather_logprobs(lp, 1, tokens)[1][9].rank == 3  # three-way tie: all share rank 3, but...
    assert list(impl.gather_logprobs(lp, 1, tokens)[1]) == [9, 5]  # ...top-1 is the lowest id, 5


def test_k_minus_one_is_the_whole_vocabulary():
    lp = impl.compute_logprobs(np.random.default_rng(4).standard_normal((2, 30)))
    for d in impl.gather_logprobs(lp, -1, [3, 29]):
        assert len(d) == 30 and sorted(e.rank for e in d.values()) == list(range(1, 31))
    assert list(impl.gather_logprobs(lp, -1, [3, 29])[1])[0] == 29


# ---------------------------------------------------------------- one step, four modes

MIXED = [
    SamplingParams(temperature=0.8, logprobs=3),
    SamplingParams(temperature=0.0, logprobs=2, repetition_penalty=1.8),
    SamplingParams(temperature=1.0),  # no logprobs asked: None
    SamplingParams(temperature=0.5, top_k=4, logprobs=0, presence_penalty=2.0),
    SamplingParams(temperature=2.0, min_p=0.2, top_p=0.9, logprobs=5, logit_bias={3: 4.0}),
    SamplingParams(temperature=0.3, logprobs=-1),
]


def mixed_logits():
    return np.random.default_rng(5).standard_normal((len(MIXED), 12)) * 2


def test_raw_logprobs_equal_mini_vllms_forward_on_a_mixed_batch():
    logits = mixed_logits()
    m = meta(MIXED)
    out = Sampler().forward(logits, m)
    got = impl.logprobs_for_step(logits, m, out.sampled)
    assert got[2] is None and len(got[5]) == 12 and len(got[3]) == 1
    assert_same_dicts(got, out.logprobs)
    assert impl.logprobs_for_step(logits, m, out.sampled, mode="raw_logprobs") == got


def test_raw_logprobs_ignore_temperature_and_penalties():
    logits = mixed_logits()[:1]
    ref = ref_log_softmax(logits)[0]
    top4 = [int(t) for t in np.argsort(-ref, kind="stable")[:4]]
    for kw in (dict(temperature=0.1), dict(temperature=3.0), dict(temperature=0.0),
               dict(temperature=0.8, repetition_penalty=2.0, presence_penalty=-2.0),
               dict(temperature=0.8, logit_bias={top4[-1]: 10.0}, top_k=2, min_p=0.3)):
        params = SamplingParams(logprobs=4, **kw)
        d = impl.logprobs_for_step(logits, meta([params], prompts=[top4[:2]]), [top4[3]])[0]
        # sampled top4[3] is in the top 4: k entries, the sampled one first with top-k rank 4
        assert list(d) == [top4[3], *top4[:3]]
        for r, t in enumerate(top4, start=1):
            assert d[t] == Logprob(pytest.approx(ref[t], abs=1e-12), r)
        # the processed view of the same step moves (temperature, penalties, bias or filters)
        proc = impl.logprobs_for_step(logits, meta([params], prompts=[top4[:2]]), [top4[3]],
                                      mode="processed_logprobs")[0]
        moved = any(abs(proc[t].logprob - ref[t]) > 1e-3 for t in proc)
        assert moved == (kw != dict(temperature=0.0)), kw  # plain greedy: nothing to process


def test_processed_logprobs_by_hand():
    # temperature 0.5 doubles the logits: [4, 2, 4, 0, -2]; log-softmax of that
    p = SamplingParams(temperature=0.5, logprobs=1)
    got = impl.processed_logprobs(TIED, meta([p]))
    np.testing.assert_allclose(got, ref_log_softmax(TIED / 0.5), rtol=0, atol=1e-12)
    # temperature 1, no knob: processed == raw
    np.testing.assert_allclose(impl.processed_logprobs(TIED, meta([SamplingParams()])),
                               ref_log_softmax(TIED), rtol=0, atol=1e-12)
    # greedy: no temperature (no division by 0), but the penalties apply. Repetition 2 on
    # prompt {0, 1} and output {2}: [1, 0.5, 1, 0, -1] (positive logits halved)
    g = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    np.testing.assert_allclose(impl.processed_logits(TIED, meta([g])), [[1.0, 0.5, 1.0, 0.0, -1.0]],
                               rtol=0, atol=0)
    np.testing.assert_allclose(impl.processed_logprobs(TIED, meta([g])),
                               ref_log_softmax([[1.0, 0.5, 1.0, 0.0, -1.0]]), rtol=0, atol=1e-12)
    # top-k 2 at temperature 1: the three others are -inf, the two tied top tokens log(1/2)
    k2 = impl.processed_logprobs(TIED, meta([SamplingParams(top_k=2)]))[0]
    assert np.isneginf(k2).tolist() == [False, True, False, True, True]
    assert k2[0] == pytest.approx(-math.log(2), abs=1e-12) and k2[2] == pytest.approx(-math.log(2), abs=1e-12)


def test_processed_logprobs_are_the_distribution_the_draw_used():
    logits = mixed_logits()
    m = meta(MIXED)
    proc = impl.processed_logprobs(logits, m)
    penalized = logits.copy()
    rows = [i for i, p in enumerate(MIXED) if p.has_logits_processing]
    penalized[rows] = Sampler.apply_logits_processors(logits[rows], m, rows)
    for i, p in enumerate(MIXED):
        if p.temperature > 0:
            np.testing.assert_allclose(np.exp(proc[i]), Sampler().probs(penalized[i], p), rtol=0, atol=1e-12)
        else:
            np.testing.assert_allclose(proc[i], ref_log_softmax(penalized[i:i + 1])[0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(impl.processed_logits(logits, m)[1], penalized[1])  # greedy row
    assert np.isneginf(proc[3]).sum() == 12 - 4  # top_k=4 keeps 4 tokens


def test_the_four_modes():
    logits = mixed_logits()
    m = meta(MIXED)
    sampled = Sampler().forward(logits, m).sampled
    raw_logits = impl.logprobs_for_step(logits, m, sampled, mode="raw_logits")
    want = [None if p.logprobs is None else mv.gather_logprobs(
        logits[i].astype(np.float64), 12 if p.logprobs == -1 else p.logprobs, sampled[i])
        for i, p in enumerate(MIXED)]
    assert_same_dicts(raw_logits, want)  # the logits themselves, ranked the same way
    proc = impl.processed_logits(logits, m)
    for mode, values in (("processed_logits", proc), ("processed_logprobs", ref_log_softmax(proc))):
        got = impl.logprobs_for_step(logits, m, sampled, mode=mode)
        want = [None if p.logprobs is None else mv.gather_logprobs(
            values[i], 12 if p.logprobs == -1 else p.logprobs, sampled[i]) for i, p in enumerate(MIXED)]
        assert_same_dicts(got, want)
    # row 3 asked for 0 logprobs: its sampled token survived top-k, so its processed rank is <= 4
    assert next(iter(impl.logprobs_for_step(logits, m, sampled, mode="processed_logprobs")[3].values())).rank <= 4


# ---------------------------------------------------------------- prompt logprobs


def test_prompt_logprobs_by_hand():
    rows = np.array([[3.0, 0.0, 0.0, 0.0],   # position 0: predicts token 1 of the prompt
                     [0.0, 0.0, 0.0, 5.0],   # position 1: predicts token 2
                     [0.0, 9.0, 0.0, 0.0]])  # position 2: the first generated token (unused)
    prompt = [2, 0, 1]
    out = impl.prompt_logprobs(rows, prompt, 1)
    assert len(out) == 3 and out[0] is None
    lp = ref_log_softmax(rows)
    # entry 1: token 0 scored by row 0, where it is the top token: k entries
    assert out[1] == {0: Logprob(pytest.approx(lp[0, 0], abs=1e-12), 1)}
    # entry 2: token 1 scored by row 1 (three tokens tie at 0.0: rank 4), then the top token 3
    assert list(out[2].items()) == [(1, Logprob(pytest.approx(lp[1, 1], abs=1e-12), 4)),
                                    (3, Logprob(pytest.approx(lp[1, 3], abs=1e-12), 1))]
    assert impl.prompt_logprobs(rows[:2], prompt, 1) == out  # T - 1 rows are enough
    assert impl.prompt_logprobs(rows[:1], [3], 2) == [None]  # a one-token prompt
    assert len(impl.prompt_logprobs(rows, prompt, -1)[2]) == 4


def test_prompt_logprobs_of_the_model_itself():
    llm = LLM("tiny-random", block_size=16)
    model = llm.llm_engine.model
    prompt = model.tokenizer.encode("a cat sat")
    rows = all_logits(model, prompt)
    got = impl.prompt_logprobs(rows, prompt, 2)
    ref = ref_log_softmax(rows)
    assert got[0] is None and len(got) == len(prompt)
    for j in range(1, len(prompt)):
        d = got[j]
        assert next(iter(d)) == prompt[j]
        assert d[prompt[j]].logprob == pytest.approx(ref[j - 1, prompt[j]], abs=1e-12)
    assert sum(d[prompt[j]].logprob for j, d in enumerate(got) if d) == pytest.approx(
        sum(ref[j - 1, prompt[j]] for j in range(1, len(prompt))), abs=1e-10)


@pytest.mark.skipif(not PROMPT_LOGPROBS_LANDED,
                    reason="mini_vllm has no SamplingParams.prompt_logprobs yet (Phase 09's engine "
                           "work adds it); this test compares your prompt_logprobs with the engine's")
def test_engine_prompt_logprobs_equal_yours():
    llm = LLM("tiny-random", block_size=4)
    out = llm.generate("a cat sat", SamplingParams(prompt_logprobs=3, max_tokens=1))[0]
    rows = all_logits(llm.llm_engine.model, out.prompt_token_ids)
    assert out.prompt_logprobs[0] is None
    assert_same_dicts(out.prompt_logprobs[1:], impl.prompt_logprobs(rows, out.prompt_token_ids, 3)[1:],
                      tol=1e-5)


# ---------------------------------------------------------------- the engine


def engine_vs_model(llm, prompt, params, tol):
    """Generate, then score every output position with the model run directly on the same
    context (one prefill of prompt + outputs); return (output, reference rows)."""
    out = llm.generate(prompt, params)[0]
    comp = out.outputs[0]
    p = len(out.prompt_token_ids)
    rows = all_logits(llm.llm_engine.model, out.prompt_token_ids + comp.token_ids[:-1])[p - 1:]
    assert len(comp.logprobs) == len(comp.token_ids) == len(rows)
    np.testing.assert_allclose(impl.compute_logprobs(rows), ref_log_softmax(rows), rtol=0, atol=1e-12)
    want = impl.gather_logprobs(impl.compute_logprobs(rows), params.logprobs, comp.token_ids)
    assert_same_dicts(comp.logprobs, want, tol=tol)
    for tok, d in zip(comp.token_ids, comp.logprobs, strict=True):
        assert next(iter(d)) == tok  # the sampled token is in every dict, first
    assert comp.cumulative_logprob == pytest.approx(
        sum(float(want[i][t].logprob) for i, t in enumerate(comp.token_ids)), abs=8 * tol)
    return comp, rows


def test_engine_logprobs_are_a_log_softmax_of_the_models_logits():
    llm = LLM("tiny-random", block_size=4)
    # seed 1 draws ranks 19, 50, 112, 17, 2, 38, 1, 10: two picks in the top 5 (5 entries), six not (6)
    params = SamplingParams(logprobs=5, temperature=0.8, seed=1, max_tokens=8, ignore_eos=True)
    comp, rows = engine_vs_model(llm, "hello", params, tol=1e-5)  # decode vs prefill: ~1e-6
    r = impl.ranks(impl.compute_logprobs(rows), comp.token_ids)
    assert r.tolist() == [19, 50, 112, 17, 2, 38, 1, 10]
    assert [len(d) for d in comp.logprobs] == [6, 6, 6, 6, 5, 6, 5, 6]


def test_engine_logprobs_do_not_move_with_temperature_or_penalties():
    llm = LLM("tiny-random", block_size=16)  # a 5-token prompt fills no block: no prefix-cache hits
    firsts = []
    for kw in (dict(temperature=0.8, seed=1), dict(temperature=0.05, seed=1), dict(temperature=0.0),
               dict(temperature=1.5, seed=2, repetition_penalty=2.0, presence_penalty=2.0, top_k=3)):
        comp = llm.generate("hello", SamplingParams(logprobs=5, max_tokens=1, **kw))[0].outputs[0]
        firsts.append((comp.token_ids[0], comp.logprobs[0]))
    model = llm.llm_engine.model
    row = all_logits(model, model.tokenizer.encode("hello"))[-1:]
    lp = impl.compute_logprobs(row)
    top5 = [int(t) for t in np.argsort(-lp[0], kind="stable")[:5]]
    for tok, d in firsts:
        want = impl.gather_logprobs(lp, 5, [tok])[0]
        assert_same_dicts([d], [want], tol=1e-5)
        assert [d[t].rank for t in top5] == [1, 2, 3, 4, 5]
        # bit for bit the same top-5 numbers whatever the sampling knobs
        assert [d[t].logprob for t in top5] == [firsts[0][1][t].logprob for t in top5]


# ---------------------------------------------------------------- bad input


def test_bad_arguments_name_the_parameter():
    lp = impl.compute_logprobs(TIED)
    with pytest.raises(ValueError, match=r"^logits must be a 2-D array \[B, V\]"):
        impl.compute_logprobs(np.zeros(5))
    with pytest.raises(ValueError, match=r"^logits must have a finite maximum"):
        impl.compute_logprobs([[-np.inf, -np.inf]])
    with pytest.raises(ValueError, match=r"^logits must have a finite maximum"):
        impl.compute_logprobs([[0.0, np.nan]])
    with pytest.raises(ValueError, match=r"^token_ids must be in \[0, 5\)"):
        impl.ranks(lp, [5])
    with pytest.raises(ValueError, match=r"^token_ids must be 1 integer token ids"):
        impl.ranks(lp, [0, 1])
    with pytest.raises(ValueError, match=r"^token_ids must be 1 integer token ids"):
        impl.gather_logprobs(lp, 1, [1.0])
    for k in (-2, 6, 1.0, True):
        with pytest.raises(ValueError, match=r"^k must be -1 \(the whole vocabulary\) or an integer in \[0, 5\]"):
            impl.gather_logprobs(lp, k, [0])
    assert len(impl.gather_logprobs(lp, 5, [0])[0]) == 5  # k = V is allowed
    m = meta([SamplingParams(logprobs=1)])
    with pytest.raises(ValueError, match=r"^mode must be one of raw_logprobs, raw_logits, "):
        impl.logprobs_for_step(TIED, m, [0], mode="logprobs")
    with pytest.raises(ValueError, match=r"^sampled must be in \[0, 5\)"):
        impl.logprobs_for_step(TIED, m, [-1])
    with pytest.raises(ValueError, match=r"^logits must have one row per SamplingParams \(2\)"):
        impl.logprobs_for_step(TIED, meta([SamplingParams()] * 2), [0, 0])
    with pytest.raises(ValueError, match=r"^logits must have one row per SamplingParams \(2\)"):
        impl.processed_logits(TIED, meta([SamplingParams()] * 2))
    with pytest.raises(ValueError, match=r"^prompt_ids must hold at least one token id"):
        impl.prompt_logprobs(TIED, [], 1)
    with pytest.raises(ValueError, match=r"^logits_per_position must have 4 or 3 rows"):
        impl.prompt_logprobs(TIED, [1, 2, 3, 4], 1)
    with pytest.raises(ValueError, match=r"^prompt_ids must be in \[0, 5\)"):
        impl.prompt_logprobs(np.repeat(TIED, 2, 0), [1, 9], 1)
    with pytest.raises(ValueError, match=r"^k must be -1"):
        impl.prompt_logprobs(np.repeat(TIED, 2, 0), [1, 2], 7)


# ---------------------------------------------------------------- the real model (last: it loads SmolLM2)


@pytest.mark.model
def test_smollm2_logprobs_are_a_log_softmax_of_its_logits():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mini_vllm.models import get_model

    with threadpoolctl.threadpool_limits(1, "blas"):
        llm = LLM(get_model("smollm2"), block_size=16, num_blocks=8)
        params = SamplingParams(logprobs=5, temperature=0.8, seed=1, max_tokens=4)
        comp, _ = engine_vs_model(llm, "The capital of France is", params, tol=1e-4)
    assert all(len(d) in (5, 6) for d in comp.logprobs)
