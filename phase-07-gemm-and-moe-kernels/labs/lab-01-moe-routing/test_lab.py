"""Lab 07-01 tests: top-k routing, moe_align_block_size, SwiGLU experts, and the grouped MoE forward."""
from __future__ import annotations

import ast

import course
from course import load_impl

impl = load_impl(__file__)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

UPSTREAM = course.UPSTREAM


def gaussian(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def make_experts(num_experts, hidden, inter, seed=0):
    """E random SwiGLU experts (w1 [I, H], w2 [H, I], w3 [I, H]), scaled so outputs are O(1)."""
    rng = np.random.default_rng(seed)

    def w(shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)

    return [(w((inter, hidden)), w((hidden, inter)), w((inter, hidden))) for _ in range(num_experts)]


def swiglu64(x, w1, w2, w3):
    """Test-side expert in float64: (silu(x w1^T) * x w3^T) w2^T."""
    x, w1, w2, w3 = (np.asarray(a, np.float64) for a in (x, w1, w2, w3))
    g = x @ w1.T
    return ((g / (1.0 + np.exp(-g))) * (x @ w3.T)) @ w2.T


def softmax64(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- 1. routing


def test_route_by_hand_with_and_without_renormalize():
    # logits log([1, 2, 3, 4]) -> softmax [0.1, 0.2, 0.3, 0.4]; top-2 is experts 3 and 2.
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32))
    w, ids = impl.route(logits, 2)
    assert ids.dtype == np.int32 and w.dtype == np.float32 and ids.shape == w.shape == (1, 2)
    assert ids.tolist() == [[3, 2]]  # largest first
    # renormalized (the default, Mixtral's choice): 0.4 / 0.7 and 0.3 / 0.7
    np.testing.assert_allclose(w, [[4 / 7, 3 / 7]], rtol=1e-6)
    # plain probabilities (OLMoE, Qwen2-MoE with norm_topk_prob=False): a row sums to 0.7
    w_plain, ids_plain = impl.route(logits, 2, renormalize=False)
    assert ids_plain.tolist() == [[3, 2]]
    np.testing.assert_allclose(w_plain, [[0.4, 0.3]], rtol=1e-6)


def test_renormalized_weights_are_a_softmax_over_the_selected_logits():
    logits = gaussian((64, 8), seed=1, scale=2.0)
    w, ids = impl.route(logits, 2)
    # the identity: p_i / sum_sel p_j == exp(l_i) / sum_sel exp(l_j)
    selected = np.take_along_axis(logits, ids.astype(np.int64), axis=1)
    np.testing.assert_allclose(w, softmax64(selected), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)
    # top_k = E with renormalize is the full softmax, sorted
    w_all, ids_all = impl.route(logits, 8)
    np.testing.assert_allclose(w_all, np.take_along_axis(softmax64(logits), ids_all.astype(np.int64), 1),
                               rtol=1e-6, atol=1e-7)


def test_without_renormalize_the_weights_are_full_softmax_probabilities():
    # The wrong implementation "softmax over the k selected logits" is the renormalized
    # answer: it must not come back when the model asked for plain probabilities.
    logits = gaussian((64, 8), seed=2, scale=2.0)
    w, ids = impl.route(logits, 2, renormalize=False)
    probs = softmax64(logits)
    np.testing.assert_allclose(w, np.take_along_axis(probs, ids.astype(np.int64), 1), rtol=1e-6, atol=1e-7)
    sums = w.sum(axis=1)
    assert (sums < 0.999).all() and (sums > 0.25).all()  # 2 of 8 experts: at least 2/8 of the mass
    # the selection itself does not depend on the flag
    assert impl.route(logits, 2, renormalize=True)[1].tolist() == ids.tolist()


def test_topk_is_largest_first_and_ties_go_to_the_lower_id():
    logits = gaussian((128, 16), seed=3, scale=3.0)
    w, ids = impl.route(logits, 4, renormalize=False)
    assert (np.diff(w, axis=1) <= 0).all()  # descending
    # the ids are exactly the 4 largest logits (softmax is monotonic)
    want = np.argsort(-logits.astype(np.float64), axis=1, kind="stable")[:, :4]
    assert ids.tolist() == want.tolist()
    # all-equal logits: every probability 1/6, upstream's kernel picks the lowest ids
    w, ids = impl.route(np.zeros((2, 6), np.float32), 3, renormalize=False)
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    np.testing.assert_allclose(w, 1 / 6, rtol=1e-6)
    # top-1: the argmax, with weight 1 renormalized and its probability plain
    w, ids = impl.route(np.log(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)), 1)
    assert ids.tolist() == [[3]] and w.tolist() == [[1.0]]
    np.testing.assert_allclose(impl.route(np.log([[1.0, 2.0, 3.0, 4.0]]), 1, renormalize=False)[0], [[0.4]],
                               rtol=1e-6)
    # a tie for second place between experts 4 and 1: expert 1 goes first
    _, ids = impl.route(np.array([[0.0, 1.0, -1.0, 0.5, 1.0, 3.0]], np.float32), 3)
    assert ids.tolist() == [[5, 1, 4]]


def test_a_token_never_hits_an_expert_twice():
    for seed, (T, E, k) in enumerate([(64, 8, 2), (33, 4, 4), (50, 16, 6)]):
        _, ids = impl.route(gaussian((T, E), seed=10 + seed), k)
        assert all(len(set(row)) == k for row in ids.tolist())
    # even when every logit is equal, the k picks are k different experts
    _, ids = impl.route(np.ones((5, 8), np.float32), 8)
    assert all(sorted(row) == list(range(8)) for row in ids.tolist())


def test_softmax_does_not_overflow():
    # exp(1000) is inf in float32: subtract the row max first.
    w, ids = impl.route(np.array([[1000.0, 999.0, 0.0, -1000.0]], np.float32), 2)
    assert ids.tolist() == [[0, 1]]
    # 1 / (1 + e^-1) and e^-1 / (1 + e^-1)
    np.testing.assert_allclose(w, [[0.7310586, 0.2689414]], rtol=1e-6)
    w, _ = impl.route(np.array([[1000.0, 999.0, 0.0, -1000.0]], np.float32), 2, renormalize=False)
    np.testing.assert_allclose(w, [[0.7310586, 0.2689414]], rtol=1e-6)  # the rest is ~e^-999


# ---------------------------------------------------------------- 2. moe_align_block_size

# upstream's docstring example (moe_align_block_size.py, lines 59-68)
DOC_TOPK_IDS = np.array([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]])
DOC_SORTED = ([3, 6, 9, 12]  # block 0, expert 1 (12 = padding)
              + [0, 4, 10, 12]  # block 1, expert 2
              + [1, 7, 11, 12]  # block 2, expert 3
              + [2, 5, 8, 12])  # block 3, expert 4


def test_align_reproduces_upstreams_docstring_example():
    # The example says num_experts = 4, but it uses expert ids 1..4: it needs 5 experts,
    # expert 0 being empty (so it gets no block). 12 slots, each expert has 3 of them,
    # padded with one 12 (= topk_ids.size) to a block of 4.
    sorted_ids, expert_ids, total = impl.moe_align_block_size(DOC_TOPK_IDS, 4, 5)
    assert sorted_ids.dtype == np.int32 and expert_ids.dtype == np.int32
    assert sorted_ids.tolist() == DOC_SORTED
    assert expert_ids.tolist() == [1, 2, 3, 4]
    assert total == 16 and isinstance(total, int)
    # with num_experts = 4, id 4 is out of range: refuse (upstream's kernel skips such
    # ids silently and the expert-4 slots would be lost)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 3\]"):
        impl.moe_align_block_size(DOC_TOPK_IDS, 4, 4)


def test_align_pads_with_numel_not_minus_one_or_zero():
    # 3 tokens x top-2 = 6 slots: slot 0,2,4 -> expert 0; 1,5 -> expert 1; 3 -> expert 2.
    # block 2: expert 0 needs 4 places (one pad), expert 1 exactly 2, expert 2 two (one pad).
    topk_ids = np.array([[0, 1], [0, 2], [0, 1]])
    sorted_ids, expert_ids, total = impl.moe_align_block_size(topk_ids, 2, 3)
    assert sorted_ids.tolist() == [0, 2, 4, 6, 1, 5, 3, 6]
    assert expert_ids.tolist() == [0, 0, 1, 2]
    assert total == 8
    # the padding value is numel: a -1 would index the last row, a 0 would be slot 0
    assert sorted_ids[3] == 6 == topk_ids.size


def test_align_gives_empty_experts_no_block_and_exact_multiples_no_pad():
    # block 1: nothing to pad at all, the result is a stable sort of the slots
    topk_ids = np.array([[7, 2], [2, 9], [7, 0]])
    sorted_ids, expert_ids, total = impl.moe_align_block_size(topk_ids, 1, 10)
    assert sorted_ids.tolist() == [5, 1, 2, 0, 4, 3]
    assert expert_ids.tolist() == [0, 2, 2, 7, 7, 9]
    assert total == 6
    # block 2: experts 2 and 7 hold exactly 2 slots each, experts 0 and 9 one each
    sorted_ids, expert_ids, total = impl.moe_align_block_size(topk_ids, 2, 10)
    assert sorted_ids.tolist() == [5, 6, 1, 2, 0, 4, 3, 6]
    assert expert_ids.tolist() == [0, 2, 7, 9]
    assert total == 8


def blocks_by_expert(sorted_ids, expert_ids, block_size, numel):
    """Test-side: expert -> the real slots found in its blocks (upstream's check)."""
    found = {}
    for b, e in enumerate(expert_ids.tolist()):
        block = sorted_ids[b * block_size:(b + 1) * block_size]
        found.setdefault(e, []).extend(block[block < numel].tolist())
    return found


def test_every_expert_sees_exactly_its_slots():
    rng = np.random.default_rng(4)
    for T, k, E, bs in [(37, 3, 8, 4), (64, 2, 8, 16), (5, 2, 16, 8), (100, 6, 32, 7)]:
        topk_ids = np.stack([rng.permutation(E)[:k] for _ in range(T)])
        sorted_ids, expert_ids, total = impl.moe_align_block_size(topk_ids, bs, E)
        numel = T * k
        counts = np.bincount(topk_ids.ravel(), minlength=E)
        assert total == int((-(-counts // bs) * bs).sum()) and total % bs == 0
        assert sorted_ids.shape == (total,) and expert_ids.shape == (total // bs,)
        assert numel <= total <= numel + E * (bs - 1)
        # every slot exactly once, the rest padding
        real = sorted_ids[sorted_ids < numel]
        assert sorted(real.tolist()) == list(range(numel))
        assert (sorted_ids[sorted_ids >= numel] == numel).all()
        # blocks are grouped by expert in increasing expert order, and each expert's
        # blocks hold exactly its slots, in increasing slot order
        assert (np.diff(expert_ids) >= 0).all()
        found = blocks_by_expert(sorted_ids, expert_ids, bs, numel)
        flat = topk_ids.ravel()
        assert set(found) == {e for e in range(E) if counts[e]}
        for e, slots in found.items():
            assert slots == np.flatnonzero(flat == e).tolist()


def _upstream_golden():
    """upstream's own stable-sort golden, lifted out of its test file and run on torch."""
    torch = pytest.importorskip("torch")
    path = UPSTREAM / "tests/kernels/moe/test_moe_align_block_size.py"
    fn = next(node for node in ast.parse(path.read_text()).body
              if isinstance(node, ast.FunctionDef) and node.name == "torch_moe_align_block_size")
    namespace = {"torch": torch, "round_up": lambda x, y: (x + y - 1) // y * y}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return torch, namespace["torch_moe_align_block_size"]


@pytest.mark.upstream
def test_align_matches_upstreams_golden_on_random_routings():
    torch, golden = _upstream_golden()
    rng = np.random.default_rng(5)
    for _ in range(40):
        E = int(rng.choice([4, 8, 16, 33]))
        k = int(rng.integers(1, min(E, 6) + 1))
        T = int(rng.integers(1, 80))
        bs = int(rng.choice([1, 2, 4, 16, 32]))
        topk_ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        g_sorted, g_experts, g_total = golden(torch.from_numpy(topk_ids), bs, E)
        total = int(g_total.item())
        sorted_ids, expert_ids, mine = impl.moe_align_block_size(topk_ids, bs, E)
        assert mine == total
        # upstream allocates the worst case; past num_tokens_post_padded it is all
        # padding (numel) and inactive blocks (-1)
        assert sorted_ids.tolist() == g_sorted[:total].tolist()
        assert (g_sorted[total:] == topk_ids.size).all()
        assert expert_ids.tolist() == g_experts[:total // bs].tolist()
        assert (g_experts[total // bs:] == -1).all()
        # block-level agreement, what upstream checks its CUDA kernel with
        assert blocks_by_expert(sorted_ids, expert_ids, bs, topk_ids.size) == \
            blocks_by_expert(g_sorted[:total].numpy(), g_experts[:total // bs].numpy(), bs, topk_ids.size)


# ---------------------------------------------------------------- 3. the expert


def test_expert_mlp_is_swiglu_with_mixtrals_names():
    # gate = x w1^T = 1, up = x w3^T = 2, silu(1) = 0.7310586; times up = 1.4621172;
    # w2 = [[1], [2]] -> [1.4621172, 2.9242344]. Swapping gate and up gives silu(2) * 1
    # = 1.7615942 instead.
    x = np.array([[1.0, 2.0]], np.float32)
    w1 = np.array([[1.0, 0.0]], np.float32)
    w3 = np.array([[0.0, 1.0]], np.float32)
    w2 = np.array([[1.0], [2.0]], np.float32)
    y = impl.expert_mlp(x, w1, w2, w3)
    assert y.dtype == np.float32 and y.shape == (1, 2)
    np.testing.assert_allclose(y, [[1.4621172, 2.9242344]], rtol=1e-6)
    # a negative gate: silu(-3) = -3 * sigmoid(-3) = -0.1422776; up = 2
    y = impl.expert_mlp(x, -3 * w1, w2, w3)
    np.testing.assert_allclose(y, [[-0.2845552, -0.5691104]], rtol=1e-5)
    # random weights against float64, and a zero row stays zero
    w1, w2, w3 = make_experts(1, 16, 24, seed=6)[0]
    xs = gaussian((9, 16), seed=7)
    xs[4] = 0.0
    y = impl.expert_mlp(xs, w1, w2, w3)
    np.testing.assert_allclose(y, swiglu64(xs, w1, w2, w3), rtol=1e-5, atol=1e-6)
    assert not y[4].any()
    # large gates do not overflow: silu(-200) is -0.0, silu(200) is 200
    y = impl.expert_mlp(np.array([[200.0], [-200.0]], np.float32), [[1.0]], [[1.0]], [[1.0]])
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, [[40000.0], [0.0]], atol=1e-3)


# ---------------------------------------------------------------- 4. the layer


def routed_problem(T=33, H=16, inter=24, E=6, k=2, seed=8):
    x = gaussian((T, H), seed=seed)
    experts = make_experts(E, H, inter, seed=seed + 1)
    w, ids = impl.route(gaussian((T, E), seed=seed + 2, scale=2.0), k)
    return x, experts, ids, w


def reference64(x, experts, ids, w):
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            out[t] += float(w[t, j]) * swiglu64(x[t:t + 1], *experts[ids[t, j]])[0]
    return out


def test_reference_forward_is_the_weighted_sum_of_k_experts():
    x, experts, ids, w = routed_problem()
    out = impl.moe_forward_reference(x, experts, ids, w)
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_allclose(out, reference64(x, experts, ids, w), rtol=1e-5, atol=1e-6)
    # weights matter: with the weights doubled, the output doubles
    np.testing.assert_allclose(impl.moe_forward_reference(x, experts, ids, 2 * w), 2 * out, rtol=1e-6, atol=1e-6)


def test_scatter_back_accumulates_duplicates():
    # T = 2 tokens, k = 2: slots 0, 1 belong to token 0, slots 2, 3 to token 1.
    # Sorted by some expert order: [0, 2, | 1, 3]; plus two padding rows (id 4).
    w = np.array([[0.25, 0.75], [0.5, 0.5]], np.float32)
    sorted_ids = np.array([0, 2, 4, 1, 3, 4], np.int32)
    rows = np.array([[1.0, 10.0], [2.0, 20.0], [7e6, 7e6], [4.0, 40.0], [8.0, 80.0], [-7e6, 1.0]], np.float32)
    out = impl.scatter_back(rows, sorted_ids, w)
    assert out.dtype == np.float32 and out.shape == (2, 2)
    # token 0: 0.25 * row(slot 0) + 0.75 * row(slot 1) = 0.25 * [1, 10] + 0.75 * [4, 40]
    # token 1: 0.5 * [2, 20] + 0.5 * [8, 80]. out[idx] += y would keep only one of the two
    # (token 0 -> [3, 30], token 1 -> [4, 40]); the padding rows (7e6) must not appear.
    assert out.tolist() == [[3.25, 32.5], [5.0, 50.0]]
    # k = 4 contributions of 1.0 each land on the one row of the one token
    ones = impl.scatter_back(np.ones((4, 3), np.float32), np.arange(4), np.ones((1, 4), np.float32))
    assert ones.tolist() == [[4.0, 4.0, 4.0]]


def test_grouped_equals_reference():
    x, experts, ids, w = routed_problem()
    ref = impl.moe_forward_reference(x, experts, ids, w)
    for bs in (1, 3, 4, 16, 64):
        out = impl.moe_forward_grouped(x, experts, ids, w, block_size=bs)
        assert out.dtype == np.float32 and out.shape == x.shape
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=f"block_size={bs}")
    # the default block size, top-4 of 8, and a single token
    x, experts, ids, w = routed_problem(T=20, E=8, k=4, seed=20)
    np.testing.assert_allclose(impl.moe_forward_grouped(x, experts, ids, w),
                               reference64(x, experts, ids, w), rtol=1e-5, atol=1e-6)
    x, experts, ids, w = routed_problem(T=1, E=4, k=2, seed=30)
    np.testing.assert_allclose(impl.moe_forward_grouped(x, experts, ids, w, block_size=4),
                               reference64(x, experts, ids, w), rtol=1e-5, atol=1e-6)


def test_grouped_runs_one_expert_call_per_block(monkeypatch):
    x, experts, ids, w = routed_problem(T=13, E=5, k=2, seed=40)
    bs = 4
    sorted_ids, expert_ids, total = impl.moe_align_block_size(ids, bs, 5)
    calls = []
    real_mlp = impl.expert_mlp

    def spy(rows, w1, w2, w3):
        calls.append((np.array(rows, copy=True), w1))
        return real_mlp(rows, w1, w2, w3)

    monkeypatch.setattr(impl, "expert_mlp", spy)
    impl.moe_forward_grouped(x, experts, ids, w, block_size=bs)
    assert len(calls) == total // bs == len(expert_ids)
    numel = ids.size
    for b, (rows, w1) in enumerate(calls):
        assert rows.shape == (bs, 16)
        np.testing.assert_array_equal(w1, experts[expert_ids[b]][0])  # that block's expert
        block = sorted_ids[b * bs:(b + 1) * bs]
        for i, s in enumerate(block.tolist()):
            # slot s is token s // k; padding rows read nothing
            want = x[s // 2] if s < numel else np.zeros(16, np.float32)
            np.testing.assert_array_equal(rows[i], want)


def test_matches_transformers_mixtral_block():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    H, inter, E, k, T = 16, 24, 4, 2, 11
    config = MixtralConfig(hidden_size=H, intermediate_size=inter, num_local_experts=E,
                           num_experts_per_tok=k)
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        hidden = torch.randn(1, T, H)
        want = block(hidden).reshape(T, H).numpy()
        _, hf_weights, hf_ids = block.gate(hidden.reshape(T, H))
    # transformers 5 keeps the experts fused: gate_up_proj [E, 2I, H] (gate rows first),
    # down_proj [E, H, I]; the router is a bias-free linear [E, H].
    gate_up = block.experts.gate_up_proj.detach().numpy()
    down = block.experts.down_proj.detach().numpy()
    experts = [(gate_up[e, :inter], down[e], gate_up[e, inter:]) for e in range(E)]
    x = hidden.reshape(T, H).numpy()
    w, ids = impl.route(x @ block.gate.weight.detach().numpy().T, k)  # Mixtral renormalizes
    assert ids.tolist() == hf_ids.tolist()
    np.testing.assert_allclose(w, hf_weights.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(impl.moe_forward_grouped(x, experts, ids, w, block_size=4), want,
                               rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- contracts


def test_inputs_are_not_modified():
    x, experts, ids, w = routed_problem(T=9, seed=50)
    logits = gaussian((9, 6), seed=51)
    saved = [a.copy() for a in (x, ids, w, logits, *experts[0])]
    impl.route(logits, 2)
    impl.moe_align_block_size(ids, 4, 6)
    impl.moe_forward_reference(x, experts, ids, w)
    impl.moe_forward_grouped(x, experts, ids, w, block_size=4)
    for before, after in zip(saved, (x, ids, w, logits, *experts[0]), strict=True):
        np.testing.assert_array_equal(before, after)


def test_bad_inputs_name_the_parameter():
    logits = gaussian((3, 4))
    with pytest.raises(ValueError, match="router_logits"):
        impl.route(np.ones(4), 1)
    with pytest.raises(ValueError, match="router_logits"):
        impl.route([[0.0, np.inf]], 1)
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 4\]"):
            impl.route(logits, bad)
    ids = np.array([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="topk_ids"):
        impl.moe_align_block_size(np.array([0, 1]), 4, 3)
    with pytest.raises(ValueError, match="topk_ids"):
        impl.moe_align_block_size(np.array([[0.0, 1.0]]), 4, 3)
    with pytest.raises(ValueError, match="topk_ids"):
        impl.moe_align_block_size(np.array([[-1, 1]]), 4, 3)
    for bad in (0, -4, 2.5):
        with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
            impl.moe_align_block_size(ids, bad, 3)
    with pytest.raises(ValueError, match="num_experts must be an integer >= 1"):
        impl.moe_align_block_size(ids, 4, 0)
    w1, w2, w3 = make_experts(1, 4, 6)[0]
    with pytest.raises(ValueError, match="w1"):
        impl.expert_mlp(np.ones((2, 5)), w1, w2, w3)
    with pytest.raises(ValueError, match="w3"):
        impl.expert_mlp(np.ones((2, 4)), w1, w2, w3[:5])
    with pytest.raises(ValueError, match="w2"):
        impl.expert_mlp(np.ones((2, 4)), w1, w2.T, w3)
    with pytest.raises(ValueError, match="x"):
        impl.expert_mlp(np.ones(4), w1, w2, w3)
    x, experts, ids, w = routed_problem(T=4, E=3, seed=60)
    for fn in (impl.moe_forward_reference, impl.moe_forward_grouped):
        with pytest.raises(ValueError, match="topk_ids"):
            fn(x, experts, ids + 3, w)
        with pytest.raises(ValueError, match="topk_ids"):
            fn(x[:3], experts, ids, w)
        with pytest.raises(ValueError, match="topk_weights"):
            fn(x, experts, ids, w[:, :1])
        with pytest.raises(ValueError, match="experts"):
            fn(x, [], ids, w)
    with pytest.raises(ValueError, match="block_size"):
        impl.moe_forward_grouped(x, experts, ids, w, block_size=0)
    with pytest.raises(ValueError, match="sorted_token_ids"):
        impl.scatter_back(np.ones((2, 3)), np.array([0, 9]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="sorted_token_ids"):
        impl.scatter_back(np.ones((2, 3)), np.array([-1, 0]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="sorted_token_ids"):
        impl.scatter_back(np.ones((2, 3)), np.array([0.0, 1.0]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="sorted_token_ids"):
        impl.scatter_back(np.ones((2, 3)), np.array([[0, 1]]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="expert_out"):
        impl.scatter_back(np.ones((3, 3)), np.array([0, 1]), np.ones((2, 2)))
