"""Every number in Phase 09's exercises, interview answers and cheatsheet, recomputed.

The pages quote these values; if one changes here, the text is wrong. numpy only. Where
mini_vllm has the piece (the sampler's filters and penalties, ``gather_logprobs``), the
answer is checked against it; the tests marked ``upstream`` read the pinned vLLM source
and run three of its pure-Python pieces cut out with ``ast`` (beam-search scoring, the
batch-update builder, the dict-state helper of the built-in processors). The byte counts
of exercise 16 and interview Q6 rest on stated assumptions (a 128,256-token vocabulary,
float32 logprobs); they come from the ASSUMPTIONS block.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

import course
from mini_vllm.beam_search import get_beam_search_score as mini_score
from mini_vllm.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from mini_vllm.logits_processor import PersistentBatch as MiniBatch
from mini_vllm.sampler import (
    Sampler,
    _apply_min_p,
    _apply_top_k,
    _apply_top_p,
    apply_penalties,
    compute_logprobs,
    gather_logprobs,
)
from mini_vllm.sampling_params import SamplingParams

UPSTREAM = course.UPSTREAM

# -- ASSUMPTIONS (stated as such where the pages use them) ----------------------------------
VOCAB = 128_256          # a Llama-3-sized vocabulary
B_LARGE = 256            # decode batch of the cost question


def _node(path, name, kind=ast.FunctionDef):
    tree = ast.parse((UPSTREAM / path).read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name)


def _exec(path, nodes, ns):
    mod = ast.Module(body=nodes, type_ignores=[])
    exec(compile(mod, str(UPSTREAM / path), "exec", dont_inherit=True), ns)
    return ns


# == 1. Penalties by hand ==========================================================================

ROW = np.array([[1.5, -1.0, 0.25, 2.0, -0.5]])
PROMPT, OUTPUT = [0, 4], [3, 3, 1]


def test_ex1_penalties_by_hand():
    out = apply_penalties(ROW, [PROMPT], [OUTPUT], np.array([0.3]), np.array([0.4]), np.array([1.25]))
    # repetition over prompt U output = {0, 1, 3, 4}: positives / 1.25, negatives x 1.25
    #   0: 1.5 -> 1.2; 1: -1.0 -> -1.25; 3: 2.0 -> 1.6; 4: -0.5 -> -0.625; 2 untouched
    # frequency 0.4 x count (3 twice, 1 once), presence 0.3 x [count > 0], output only
    assert np.allclose(out, [[1.2, -1.95, 0.25, 0.5, -0.625]])
    assert int(np.argmax(ROW)) == 3 and int(np.argmax(out)) == 0      # the greedy pick moves

    # the wrong versions of the answer
    only_output = apply_penalties(ROW, [[]], [OUTPUT], np.array([0.3]), np.array([0.4]), np.array([1.25]))
    assert np.allclose(only_output, [[1.5, -1.95, 0.25, 0.5, -0.5]])
    divide_all = ROW / 1.25
    divide_all[0, [1, 3]] -= [0.7, 1.1]
    divide_all[0, 2] = 0.25
    assert np.allclose(divide_all, [[1.2, -1.5, 0.25, 0.5, -0.4]])    # token 1 got MORE likely
    freq_on_prompt = apply_penalties(ROW, [[]], [PROMPT + OUTPUT], np.array([0.3]), np.array([0.4]),
                                     np.array([1.25]))
    assert np.allclose(freq_on_prompt, [[0.5, -1.95, 0.25, 0.5, -1.325]])
    # additive terms first, then repetition: token 3 ends at 0.72 instead of 0.5
    assert (2.0 - 0.8 - 0.3) / 1.25 == pytest.approx(0.72)
    # through mini_vllm's batched sampler: greedy row, same penalties -> token 0
    from mini_vllm.sampler import SamplingMetadata
    p = SamplingParams(temperature=0.0, presence_penalty=0.3, frequency_penalty=0.4, repetition_penalty=1.25)
    md = SamplingMetadata([p], [None], [PROMPT], [OUTPUT], [()])
    assert Sampler().forward(ROW, md).sampled == [0]


# == 2. The order: min-p before top-p ===============================================================

P5 = np.array([0.5, 0.2, 0.15, 0.1, 0.05])


def _survivors(logits):
    return int(np.isfinite(logits).sum())


def test_ex2_min_p_then_top_p_keeps_fewer():
    lg = np.log(P5)
    # upstream's order: min-p 0.25 (threshold 0.125) keeps 3, then top-p 0.8 on the renormalized 3
    a = _apply_top_p(_apply_min_p(lg, 0.25), 0.8)
    assert _survivors(_apply_min_p(lg, 0.25)) == 3 and _survivors(a) == 2
    assert np.allclose(np.array([0.5, 0.2, 0.15]) / 0.85, [0.588235, 0.235294, 0.176471], atol=1e-6)
    # the reversed order keeps 3
    b = _apply_min_p(_apply_top_p(lg, 0.8), 0.25)
    assert _survivors(_apply_top_p(lg, 0.8)) == 3 and _survivors(b) == 3
    # mini_vllm's Sampler.probs is upstream's order
    probs = Sampler().probs(lg, SamplingParams(temperature=1.0, min_p=0.25, top_p=0.8))
    assert np.allclose(probs, [5 / 7, 2 / 7, 0, 0, 0])


# == 3. Survivors ====================================================================================

P6 = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def test_ex3_survivors():
    lg = np.log(P6)
    assert _survivors(_apply_top_k(lg, 2)) == 2
    assert _survivors(_apply_top_p(lg, 0.75)) == 3          # 0.4 + 0.25 = 0.65 < 0.75
    assert _survivors(_apply_min_p(lg, 0.2)) == 4           # threshold 0.08
    # all three in upstream's order: min-p -> 4, top-k -> 2, top-p on [0.615, 0.385] keeps both
    pr = Sampler().probs(lg, SamplingParams(temperature=1.0, min_p=0.2, top_k=2, top_p=0.75))
    assert np.allclose(pr[:2], [0.4 / 0.65, 0.25 / 0.65]) and np.all(pr[2:] == 0)
    assert round(0.4 / 0.65, 3) == 0.615
    # temperature 0.5 squares the ratios to the top: (0.15 / 0.4)^2 = 0.14 < 0.2
    assert _survivors(_apply_min_p(lg / 0.5, 0.2)) == 2
    assert round((0.15 / 0.4) ** 2, 2) == 0.14 and round((0.25 / 0.4) ** 2, 2) == 0.39
    # top-k keeps every token tied with the k-th
    assert _survivors(_apply_top_k(np.array([3.0, 2.0, 2.0, 1.0]), 2)) == 3
    # top-p at 0.9 on this row: 1 - 0.9 is 0.0999..., 0.04 + 0.06 is 0.1: the 0.06 token stays
    assert 0.04 + 0.06 > 1 - 0.9
    assert _survivors(_apply_top_p(lg, 0.9)) == 5


# == 4. The exponential race =========================================================================

def test_ex4_exponential_race():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([1.2, 0.25, 0.5])
    assert np.allclose(p / q, [0.416667, 1.2, 0.4], atol=1e-6) and int(np.argmax(p / q)) == 1
    # a filtered token (p = 0) scores 0 and cannot win
    assert int(np.argmax(np.array([0.0, 0.6, 0.4]) / np.array([1e-9, 5.0, 1.0]))) == 2
    # Gumbel-max form: argmax(log p - log q) is the same token
    assert int(np.argmax(np.log(p) - np.log(q))) == 1
    # distribution: 100,000 races land within 4.5 sigma of p
    rng = np.random.default_rng(9)
    n = 100_000
    wins = np.argmax(p / rng.exponential(size=(n, 3)), axis=1)
    freq = np.bincount(wins, minlength=3) / n
    assert np.all(np.abs(freq - p) < 4.5 * np.sqrt(p * (1 - p) / n))


# == 5. Seeded vs unseeded (upstream's random_sample, restated on numpy) ===========================

def random_sample(probs, generators, shared):
    q = np.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q[:] = shared.exponential(size=probs.shape)
    for i, g in generators.items():
        q[i] = g.exponential(size=probs.shape[1])
    return np.argmax(probs / q, axis=1)


def _run(rows, steps=12, vocab=8, seed_shared=0):
    """rows: list of (name, seed or None); every request sees the same probs per step."""
    shared = np.random.default_rng(seed_shared)
    gens = {i: np.random.default_rng(s) for i, (_, s) in enumerate(rows) if s is not None}
    base = np.random.default_rng(123).dirichlet(np.ones(vocab), size=steps)
    out = {name: [] for name, _ in rows}
    for t in range(steps):
        probs = np.repeat(base[t][None], len(rows), axis=0)
        toks = random_sample(probs, gens, shared)
        for i, (name, _) in enumerate(rows):
            out[name].append(int(toks[i]))
    return out


def test_ex5_seeded_is_batch_invariant_unseeded_is_not():
    alone = _run([("s", 42)])["s"]
    for neighbours in (1, 5):
        rows = [(f"n{j}", None) for j in range(neighbours)] + [("s", 42)]
        assert _run(rows)["s"] == alone
    u_alone = _run([("u", None)])["u"]
    u_batch = _run([("x", None), ("u", None)])["u"]
    assert u_alone != u_batch
    # numbers the shared stream gives per step: B x V, the seeded rows included
    B, V = 3, 4
    assert B * V == 12 and list(range(2 * V, 3 * V)) == [8, 9, 10, 11]


# == 6. Logprobs entries and ranks with ties ========================================================

RAW = np.array([2.0, 1.0, 1.0, 0.0, -1.0])


def test_ex6_logprobs_entries_and_ranks():
    lp = compute_logprobs(RAW[None])[0]
    lse = math.log(math.exp(2) + 2 * math.e + 1 + math.exp(-1))
    assert lp[0] == pytest.approx(2 - lse) and round(2 - lse, 4) == -0.6528
    assert round(1 - lse, 4) == -1.6528

    def entries(tok, k):
        d = gather_logprobs(lp, k, tok)
        return len(d), {t: x.rank for t, x in d.items()}

    assert entries(0, 2) == (2, {0: 1, 1: 2})
    assert entries(2, 2) == (3, {2: 3, 0: 1, 1: 2})      # tied with token 1, shown at rank 3
    assert entries(1, 2) == (2, {1: 2, 0: 1})            # count rank 3, overwritten by top-k rank 2
    assert int((lp >= lp[1]).sum()) == 3
    assert entries(3, 2) == (3, {3: 4, 0: 1, 1: 2})
    assert entries(3, 0) == (1, {3: 4})
    assert entries(4, 5)[0] == 5                          # k = V: the whole row


@pytest.mark.upstream
def test_ex6_upstreams_dict_building_overwrites_the_rank():
    path = "vllm/logprobs.py"
    fn = _node(path, "append_logprobs_for_next_position")
    fn.args.args[0].annotation = None
    ns = _exec(path, [fn], {"itertools": itertools, "Iterable": Sequence,
                            "Logprob": lambda logprob, rank, decoded_token: rank,
                            "FlatLogprobs": type("FlatLogprobs", (), {}),
                            "PromptLogprobs": list, "SampleLogprobs": list})
    got = []
    # sampled token 1 (count rank 3), top-2 listed as [0, 1]
    ns["append_logprobs_for_next_position"](got, [1, 0, 1], [-1.55, -0.55, -1.55], [None] * 3, 3, 2)
    assert got == [{1: 2, 0: 1}]


# == 7. n = 4 through the prefix cache ==============================================================

def hit_tokens(prompt_len, block):
    return (prompt_len - 1) // block * block        # the last prompt token is always computed


def test_ex7_parallel_sampling_prefix_cache():
    P, n, bs = 2000, 4, 16
    hit = hit_tokens(P, bs)
    assert hit == 1984 and P - hit == 16
    computed = P + (n - 1) * (P - hit)
    assert computed == 2048 and n * P == 8000
    assert round((n - 1) * hit / (n * P), 4) == 0.744
    assert round(n * P / computed, 2) == 3.91
    # 2,001 tokens: 125 full blocks hit, one token computed per child
    assert hit_tokens(2001, bs) == 2000 and round(3 * 2000 / (4 * 2001), 4) == 0.7496
    # a prompt shorter than a block never hits; 75% would need hit = P
    assert hit_tokens(8, bs) == 0
    # child seeds
    assert [7 + i for i in range(4)] == [7, 8, 9, 10]


@pytest.mark.upstream
def test_facts_at_the_pin():
    def text(p):
        return (UPSTREAM / p).read_text(encoding="utf-8")

    ps = text("vllm/v1/engine/parallel_sampling.py")
    assert "child_sampling_params.seed = seed + index" in ps
    sp = text("vllm/sampling_params.py")
    assert "self.skip_reading_prefix_cache = self.prompt_logprobs is not None" in sp
    s = text("vllm/v1/sample/sampler.py")
    assert s.index("for processor in sampling_metadata.logitsprocs.argmax_invariant") < s.index(
        "random_sampled, processed_logprobs = self.topk_topp_sampler(")
    assert s.index("self.compute_logprobs(logits)") < s.index("logits = self.apply_logits_processors(")
    ts = text("vllm/v1/sample/ops/topk_topp_sampler.py")
    assert "if len(generators) != probs.shape[0]:\n        q.exponential_()" in ts
    assert "return probs.div_(q).argmax(dim=-1).view(-1)" in ts
    lp = text("vllm/v1/sample/ops/logprobs.py")
    assert "return (x >= values).sum(-1)" in lp
    mc = text("vllm/config/model.py")
    assert "max_logprobs: int = 20" in mc and 'logprobs_mode: LogprobsMode = "raw_logprobs"' in mc
    off = text("vllm/entrypoints/generate/beam_search/offline.py")
    assert "logprobs=2 * beam_width," in off
    assert "if token_id == eos_token_id and not ignore_eos:" in off
    pu = text("vllm/model_executor/layers/utils.py")
    assert "logits -= frequency_penalties.unsqueeze(dim=1) * output_bin_counts" in pu
    co = text("vllm/_custom_ops.py")
    assert "scaling = torch.where(logits > 0, 1.0 / penalties, penalties)" in co
    gb = text("vllm/v1/worker/gpu_input_batch.py")
    assert "(last_req_index, empty_index, MoveDirectionality.UNIDIRECTIONAL)" in gb
    mr = text("vllm/v1/worker/gpu_model_runner.py")
    assert mr.index("self.input_batch.condense()") < mr.index("self.input_batch.refresh_metadata()")


# == 8-9. Beam search by hand, and the length penalty =============================================

PROMPT_IDS = [1, 2, 3, 4]
EOS, A, Bt, C, D = 0, 5, 6, 7, 8
TREE = {                       # next-token probabilities after each generated prefix
    (): {A: 0.5, Bt: 0.4, EOS: 0.1},
    (A,): {C: 0.45, D: 0.35, EOS: 0.2},
    (Bt,): {C: 0.2, D: 0.05, EOS: 0.75},
}


def score(tokens, cum, lp=1.0):
    n = len(tokens) - (tokens[-1] == EOS)
    return cum / n ** lp


def beam_search(width, max_tokens, lp=1.0):
    """upstream's offline loop on TREE (every candidate kept: the tree is small)."""
    beams, completed = [(list(PROMPT_IDS), 0.0)], []
    for _ in range(max_tokens):
        new = []
        for toks, cum in beams:
            for t, p in TREE[tuple(toks[len(PROMPT_IDS):])].items():
                cand = (toks + [t], cum + math.log(p))
                (completed if t == EOS else new).append(cand)
        beams = sorted(new, key=lambda b: score(*b, lp), reverse=True)[:width]
    return sorted(completed + beams, key=lambda b: score(*b, lp), reverse=True)[:width]


def test_ex8_beam_search_by_hand():
    greedy = 0.5 * 0.45
    assert greedy == pytest.approx(0.225)
    best = beam_search(2, 2)
    assert [b[0][4:] for b in best] == [[Bt, EOS], [A, C]]
    assert math.exp(best[0][1]) == pytest.approx(0.3)
    # the scores the answer lists (prompt counted, EOS not)
    assert round(score(PROMPT_IDS + [EOS], math.log(0.1)), 4) == -0.5756
    assert round(score(PROMPT_IDS + [A], math.log(0.5)), 4) == -0.1386
    assert round(score(PROMPT_IDS + [Bt], math.log(0.4)), 4) == -0.1833
    assert round(score(PROMPT_IDS + [A, C], math.log(0.225)), 4) == -0.2486
    assert round(score(PROMPT_IDS + [A, D], math.log(0.175)), 4) == -0.2905
    assert round(score(PROMPT_IDS + [Bt, EOS], math.log(0.3)), 4) == -0.2408
    assert round(score(PROMPT_IDS + [A, EOS], math.log(0.1)), 4) == -0.4605
    # width 1 is greedy
    assert [b[0][4:] for b in beam_search(1, 2)][0] == [A, C]


def test_ex9_length_penalty_counts_the_prompt():
    be, ac = ([Bt, EOS], math.log(0.3)), ([A, C], math.log(0.225))
    # generated tokens only (the wrong score): AC wins
    assert round(be[1] / 1, 3) == -1.204 and round(ac[1] / 2, 3) == -0.746
    # prompt counted: B EOS wins (-0.241 vs -0.249)
    assert score(PROMPT_IDS + be[0], be[1]) > score(PROMPT_IDS + ac[0], ac[1])
    # length_penalty 2 with the prompt: AC wins again
    assert round(score(PROMPT_IDS + be[0], be[1], 2), 4) == -0.0482
    assert round(score(PROMPT_IDS + ac[0], ac[1], 2), 4) == -0.0414
    assert [b[0][4:] for b in beam_search(2, 2, lp=2.0)][0] == [A, C]
    # length_penalty 0: raw joint probability
    assert [b[0][4:] for b in beam_search(2, 2, lp=0.0)][0] == [Bt, EOS]


@pytest.mark.upstream
def test_ex8_upstreams_score_function():
    path = "vllm/entrypoints/generate/beam_search/utils.py"
    ns = _exec(path, [_node(path, "get_beam_search_score")], {})
    f = ns["get_beam_search_score"]
    for toks, cum in [(PROMPT_IDS + [Bt, EOS], math.log(0.3)), (PROMPT_IDS + [A, C], math.log(0.225))]:
        for lp in (0.0, 1.0, 2.0):
            assert f(toks, cum, EOS, lp) == pytest.approx(score(toks, cum, lp))
            assert mini_score(toks, cum, EOS, lp) == pytest.approx(score(toks, cum, lp))


# == 10. Batch updates traced by hand ===============================================================

UNI = MoveDirectionality.UNIDIRECTIONAL


def _builder_cls():
    path = "vllm/v1/sample/logits_processor/state.py"
    cls = _node(path, "BatchUpdateBuilder", ast.ClassDef)
    bu = _node("vllm/v1/sample/logits_processor/interface.py", "BatchUpdate", ast.ClassDef)
    ns = {"dataclass": dataclass, "Sequence": Sequence, "RemovedRequest": int, "AddedRequest": tuple,
          "MovedRequest": tuple, "MoveDirectionality": MoveDirectionality}
    _exec("vllm/v1/sample/logits_processor/interface.py", [bu], ns)
    return _exec(path, [cls], ns)["BatchUpdateBuilder"]


class PersistentBatch:
    """The slot logic of upstream's InputBatch: remove, add (lowest hole first), condense."""

    def __init__(self, builder_cls):
        self.slots: list[str | None] = []
        self.b = builder_cls()

    def step(self, finished=(), new=()):
        for r in finished:
            i = self.slots.index(r)
            self.slots[i] = None
            self.b.removed_append(i)
        for r in new:
            i = self.b.pop_removed()
            if i is None:
                i = sum(s is not None for s in self.slots)
                self.slots[i:i + 1] = [r]
            else:
                self.slots[i] = r
            self.b.added.append((i, r, None, []))
        num = sum(s is not None for s in self.slots)
        empty = self.b.removed
        if empty and num:
            last = num + len(empty) - 1
            while empty:
                while last in empty:
                    last -= 1
                hole = self.b.peek_removed()
                if hole >= last:
                    break
                self.b.pop_removed()
                self.slots[hole], self.slots[last] = self.slots[last], None
                self.b.moved.append((last, hole, UNI))
        del self.slots[num:]
        u = self.b.get_and_reset(num)
        return None if u is None else (u.batch_size, list(u.removed), [a[:2] for a in u.added],
                                       [(a, b) for a, b, _ in u.moved])


@pytest.mark.upstream
def test_ex10_batch_update_sequence():
    pb = PersistentBatch(_builder_cls())
    assert pb.step(new="ABCDE") == (5, [], [(0, "A"), (1, "B"), (2, "C"), (3, "D"), (4, "E")], [])
    # B and C finish, F arrives: F takes hole 1, E moves 4 -> 2, nothing left in removed
    assert pb.step(finished="BC", new="F") == (4, [], [(1, "F")], [(4, 2)])
    assert pb.slots == ["A", "F", "E", "D"]
    # A finishes: D moves 3 -> 0
    assert pb.step(finished="A") == (3, [], [], [(3, 0)])
    assert pb.slots == ["D", "F", "E"]
    # E (the last row) finishes: no move, removed = [2]
    assert pb.step(finished="E") == (2, [2], [], [])
    # nothing changes: update_state gets None
    assert pb.step() is None
    # two holes, one new request: G fills 0, the hole at 1 is the tail -> removed [1]
    assert pb.step(finished="DF", new="G") == (1, [1], [(0, "G")], [])


def test_ex10_mini_vllms_persistent_batch_agrees():
    reqs = {c: SimpleNamespace(request_id=c, sampling_params=None, prompt_token_ids=[], output_token_ids=[])
            for c in "ABCDEFG"}
    mb = MiniBatch()

    def step(names):
        u = mb.update([reqs[c] for c in names])
        return None if u is None else (u.batch_size, list(u.removed), [a[0] for a in u.added],
                                       [(a, b) for a, b, _ in u.moved])

    assert step("ABCDE")[:2] == (5, [])
    assert step("ADEF") == (4, [], [1], [(4, 2)]) and mb.req_ids == list("AFED")
    assert step("DEF") == (3, [], [], [(3, 0)]) and mb.req_ids == list("DFE")
    assert step("DF") == (2, [2], [], [])
    assert step("DF") is None
    assert step("G") == (1, [1], [0], [])


# == 11. Building a processor (the answer's class) ==================================================

class MaxRunLogitsProcessor(LogitsProcessor):
    """Forbid a token once the output ends with ``max_run`` copies of it (per request)."""

    def __init__(self, vllm_config=None, device="cpu", is_pin_memory=False):
        self.rows: dict[int, tuple[int, list[int]]] = {}

    @classmethod
    def validate_params(cls, params):
        n = (params.extra_args or {}).get("max_run")
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ValueError(f"max_run must be an int >= 1, got {n!r}")

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.rows.pop(i, None)
        for i, params, _prompt, out in batch_update.added:
            n = (params.extra_args or {}).get("max_run")
            if n is None:
                self.rows.pop(i, None)
            else:
                self.rows[i] = (n, out)
        for a, b, d in batch_update.moved:
            ea, eb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ea is not None:
                self.rows[b] = ea
            if eb is not None and d == MoveDirectionality.SWAP:
                self.rows[a] = eb

    def apply(self, logits):
        for i, (n, out) in self.rows.items():
            if len(out) >= n and len(set(out[-n:])) == 1:
                logits[i, out[-1]] = -np.inf
        return logits


def test_ex11_custom_processor():
    P = type("P", (), {})
    with_arg, without = P(), P()
    with_arg.extra_args, without.extra_args = {"max_run": 2}, None
    proc = MaxRunLogitsProcessor()
    out0, out1 = [5, 5], [3, 5]
    proc.update_state(BatchUpdate(2, [], [(0, with_arg, None, out0), (1, without, None, out1)], []))
    lg = proc.apply(np.zeros((2, 8)))
    assert lg[0, 5] == -np.inf and np.isfinite(lg[1]).all()
    out0.append(6)                                  # the live reference: the run is broken
    assert np.isfinite(proc.apply(np.zeros((2, 8)))).all()
    # row 0 finishes, a request without the arg takes its slot: its state must go
    proc.update_state(BatchUpdate(2, [], [(0, without, None, [5, 5])], []))
    assert proc.rows == {}
    # a move carries the state along
    proc.update_state(BatchUpdate(3, [], [(2, with_arg, None, [1, 1])], []))
    proc.update_state(BatchUpdate(2, [], [], [(2, 0, UNI)]))
    assert list(proc.rows) == [0] and proc.apply(np.zeros((2, 4)))[0, 1] == -np.inf
    with pytest.raises(ValueError, match="max_run"):
        bad = P()
        bad.extra_args = {"max_run": 0}
        MaxRunLogitsProcessor.validate_params(bad)


# == 16. Logprobs cost ===============================================================================

def test_ex16_logprobs_bytes():
    k = 20
    per_row = (k + 1) * (4 + 4) + 8            # int32 ids, float32 logprobs, int64 rank
    assert per_row == 176 and B_LARGE * per_row == 45_056
    full = B_LARGE * VOCAB * 4
    assert full == 131_334_144                 # logprobs = -1: 131 MB per step
    assert round(full / (B_LARGE * per_row)) == 2915
    assert B_LARGE * (k + 1) == 5376           # Logprob objects per step
    # prompt logprobs for a 2,000-token prompt chunk: a [2000, V] float32 logits block
    assert 2000 * VOCAB * 4 == 1_026_048_000


# == 17. Beam search cost with and without the prefix cache =======================================

def beam_cost(prompt, width, steps, block):
    no_cache = prompt + sum(width * (prompt + s) for s in range(1, steps))
    cached = prompt + sum(width * ((prompt + s) - hit_tokens(prompt + s, block)) for s in range(1, steps))
    return no_cache, cached


def test_ex17_beam_search_cost():
    no_cache, cached = beam_cost(1000, 4, 50, 16)
    assert no_cache == 201_900
    assert cached == 2_668
    assert round(no_cache / cached, 1) == 75.7
    # every beam request computes between 1 and block_size tokens
    assert all(1 <= L - hit_tokens(L, 16) <= 16 for L in range(1001, 1050))
