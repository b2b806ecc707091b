"""Lab 04-04 tests: split-KV attention merged by log-sum-exp equals dense attention."""
from __future__ import annotations

import contextlib
import io
import math
import pathlib
import runpy
import warnings

import numpy as np
import pytest

from course import load_impl

impl = load_impl(__file__)

TOKENS, HEADS, KV_HEADS, DIM = 3, 4, 2, 8
SCALE = 0.3  # deliberately not 1/sqrt(DIM): the scale argument must be the one used


def oracle(q, k, v, scale):
    """Independent of the learner: one (token, head) at a time, float64, max-shifted.

    Returns (out [T, H, D], lse [H, T]); query head h reads KV head h // group.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    num_tokens, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    out = np.zeros(q.shape)
    lse = np.full((num_heads, num_tokens), -np.inf)
    for t in range(num_tokens):
        for h in range(num_heads):
            s = k[:, h // group] @ q[t, h] * scale
            if s.size == 0:
                continue
            m = s.max()
            p = np.exp(s - m)
            out[t, h] = p @ v[:, h // group] / p.sum()
            lse[h, t] = m + math.log(p.sum())
    return out, lse


def make_qkv(seed, num_keys, tokens=TOKENS, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, spread=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((tokens, heads, dim)) * spread
    k = rng.standard_normal((num_keys, kv_heads, dim))
    v = rng.standard_normal((num_keys, kv_heads, dim))
    return q, k, v


def assert_close(actual, expected, atol=1e-12):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)


@contextlib.contextmanager
def no_numpy_warnings():
    """Turns numpy's overflow / invalid-value warnings into failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


# --------------------------------------------------------------------------
# partition_bounds: where the cuts go
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("num_keys", "num_partitions", "expected"), [
    (4, 2, [(0, 2), (2, 4)]),
    (12, 4, [(0, 3), (3, 6), (6, 9), (9, 12)]),
    # size ceil(10/4) = 3: three full partitions, then the remainder, 1 key
    (10, 4, [(0, 3), (3, 6), (6, 9), (9, 10)]),
    # size ceil(10/7) = 2: five partitions of 2 cover all 10 keys, two are left empty
    # (np.array_split would give 2, 2, 2, 1, 1, 1, 1 instead)
    (10, 7, [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 10), (10, 10)]),
    (5, 1, [(0, 5)]),
    (3, 5, [(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]),
    (0, 3, [(0, 0), (0, 0), (0, 0)]),
])
def test_partition_bounds_fixed_size_rule(num_keys, num_partitions, expected):
    assert impl.partition_bounds(num_keys, num_partitions) == expected


def test_partition_bounds_cover_every_key_once():
    for num_keys in range(0, 41):
        for num_partitions in range(1, 46):
            bounds = impl.partition_bounds(num_keys, num_partitions)
            size = -(-num_keys // num_partitions)
            assert len(bounds) == num_partitions
            assert bounds[0][0] == 0 and bounds[-1][1] == num_keys
            for (_, stop), (start, _) in zip(bounds, bounds[1:], strict=False):
                assert start == stop  # contiguous: no gap, no overlap
            sizes = [stop - start for start, stop in bounds]
            assert all(0 <= s <= size for s in sizes)
            assert sum(sizes) == num_keys  # the remainder is never dropped
            full = num_keys // size if size else 0
            assert sizes[:full] == [size] * full  # full partitions first


# --------------------------------------------------------------------------
# attend_partial: one key range, normalized output plus LSE
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (6, 3), (4, 1), (2, 2)])
def test_attend_partial_matches_an_independent_softmax(heads, kv_heads):
    q, k, v = make_qkv(1, 11, heads=heads, kv_heads=kv_heads, spread=2.0)
    out, lse = impl.attend_partial(q, k, v, SCALE)
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert out.shape == (TOKENS, heads, DIM) and lse.shape == (heads, TOKENS)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    assert_close(out, want_out)
    assert_close(lse, want_lse)
    # array-likes of any float dtype are accepted; the result is float64
    out32, lse32 = impl.attend_partial(q.astype(np.float32).tolist(), k.tolist(),
                                       v.astype(np.float32), SCALE)
    assert out32.dtype == np.float64 and lse32.dtype == np.float64
    assert_close(out32, want_out, atol=1e-5)


def test_attend_partial_the_guide_partitions_by_hand():
    """Guide section 5: scores [2, 1] over values [10, 20], and [4, 3] over [30, 40].

    out_a = (10 e^0 + 20 e^-1) / (1 + e^-1) = 12.6894, lse_a = 2 + log(1 + e^-1) = 2.3133;
    partition b is partition a shifted by 2 in score and by 20 in value.
    """
    q = np.ones((1, 1, 1))
    out_a, lse_a = impl.attend_partial(q, [[[2.0]], [[1.0]]], [[[10.0]], [[20.0]]], 1.0)
    out_b, lse_b = impl.attend_partial(q, [[[4.0]], [[3.0]]], [[[30.0]], [[40.0]]], 1.0)
    e = math.exp(-1)
    assert out_a.item() == pytest.approx((10 + 20 * e) / (1 + e), abs=1e-12)
    assert lse_a.item() == pytest.approx(2 + math.log(1 + e), abs=1e-12)
    assert out_b.item() == pytest.approx(out_a.item() + 20, abs=1e-12)
    assert lse_b.item() == pytest.approx(lse_a.item() + 2, abs=1e-12)
    assert round(out_a.item(), 4) == 12.6894 and round(lse_b.item(), 4) == 4.3133


def test_attend_partial_empty_range_is_zero_and_minus_inf():
    q, k, v = make_qkv(2, 0)
    with no_numpy_warnings():
        out, lse = impl.attend_partial(q, k, v, SCALE)
    assert out.shape == (TOKENS, HEADS, DIM) and lse.shape == (HEADS, TOKENS)
    np.testing.assert_array_equal(out, 0.0)
    assert np.all(lse == -np.inf)


def test_attend_partial_uses_the_scale_given():
    q, k, v = make_qkv(3, 6)
    out, lse = impl.attend_partial(q, k, v, 0.05)
    want_out, want_lse = oracle(q, k, v, 0.05)
    assert_close(out, want_out)
    assert_close(lse, want_lse)


# --------------------------------------------------------------------------
# merge_attn_states
# --------------------------------------------------------------------------


def test_merge_the_guide_example_and_not_the_average():
    """Merging the two hand-worked partitions gives section 3's 30.3054, not 22.6894."""
    q = np.ones((1, 1, 1))
    out_a, lse_a = impl.attend_partial(q, [[[2.0]], [[1.0]]], [[[10.0]], [[20.0]]], 1.0)
    out_b, lse_b = impl.attend_partial(q, [[[4.0]], [[3.0]]], [[[30.0]], [[40.0]]], 1.0)
    out, lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    w = np.exp([2.0, 1.0, 4.0, 3.0])
    assert out.item() == pytest.approx(w @ [10, 20, 30, 40] / w.sum(), abs=1e-12)
    assert lse.item() == pytest.approx(math.log(w.sum()), abs=1e-12)
    assert round(out.item(), 4) == 30.3054 and round(lse.item(), 4) == 4.4402
    assert abs(out.item() - (out_a.item() + out_b.item()) / 2) > 7  # the plain average is 22.6894


def test_merge_lse_is_the_logsumexp_of_all_scores():
    q, k, v = make_qkv(4, 13, spread=2.0)
    a = impl.attend_partial(q, k[:4], v[:4], SCALE)
    b = impl.attend_partial(q, k[4:], v[4:], SCALE)
    out, lse = impl.merge_attn_states(*a, *b)
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert out.shape == (TOKENS, HEADS, DIM) and lse.shape == (HEADS, TOKENS)
    assert_close(out, want_out)
    assert_close(lse, want_lse)
    # the same lse straight from the scores (q . k for head h reads KV head h // 2)
    scores = np.einsum("thd,nhd->htn", q, k[:, [0, 0, 1, 1]]) * SCALE
    m = scores.max(axis=-1)
    assert_close(lse, m + np.log(np.exp(scores - m[..., None]).sum(axis=-1)))


def test_merge_is_commutative_and_associative():
    q, k, v = make_qkv(5, 17, spread=2.0)
    a = impl.attend_partial(q, k[:3], v[:3], SCALE)
    b = impl.attend_partial(q, k[3:11], v[3:11], SCALE)
    c = impl.attend_partial(q, k[11:], v[11:], SCALE)
    ab, ba = impl.merge_attn_states(*a, *b), impl.merge_attn_states(*b, *a)
    assert_close(ab[0], ba[0])
    assert_close(ab[1], ba[1])
    left = impl.merge_attn_states(*ab, *c)  # merge(merge(a, b), c)
    right = impl.merge_attn_states(*a, *impl.merge_attn_states(*b, *c))  # merge(a, merge(b, c))
    odd = impl.merge_attn_states(*impl.merge_attn_states(*c, *a), *b)  # another order and tree
    want_out, want_lse = oracle(q, k, v, SCALE)
    for out, lse in (left, right, odd):
        assert_close(out, want_out)
        assert_close(lse, want_lse)
    assert_close(left[0], right[0])
    assert_close(left[1], right[1])


def test_merge_with_an_empty_side_returns_the_other():
    """A side with lse -inf carries weight exp(-inf) = 0, whatever its output holds."""
    q, k, v = make_qkv(6, 9)
    full = impl.attend_partial(q, k, v, SCALE)
    garbage = np.full(full[0].shape, 1e3)  # an empty side's output is never read
    empty_lse = np.full(full[1].shape, -np.inf)
    for args in ((garbage, empty_lse, *full), (*full, garbage, empty_lse)):
        with no_numpy_warnings():
            out, lse = impl.merge_attn_states(*args)
        assert_close(out, full[0], atol=1e-15)
        np.testing.assert_array_equal(lse, full[1])


def test_merge_two_empty_sides_gives_zero_and_minus_inf_without_nan():
    """Both -inf: the max is -inf too, and lse - max would be -inf - (-inf) = NaN."""
    shape = (TOKENS, HEADS, DIM)
    empty_lse = np.full((HEADS, TOKENS), -np.inf)
    for prefix in (np.zeros(shape), np.full(shape, 7.0)):
        with no_numpy_warnings():
            out, lse = impl.merge_attn_states(prefix, empty_lse, np.full(shape, -3.0), empty_lse)
        np.testing.assert_array_equal(out, 0.0)
        assert np.all(lse == -np.inf)


def test_merge_reads_plus_inf_as_empty():
    """Upstream turns an LSE of +inf (FA2's empty sequence) into -inf before merging."""
    q, k, v = make_qkv(7, 5)
    full = impl.attend_partial(q, k, v, SCALE)
    plus_inf = np.full(full[1].shape, np.inf)
    minus_inf = -plus_inf
    junk = np.full(full[0].shape, 5.0)
    for args in ((junk, plus_inf, *full), (*full, junk, plus_inf)):
        with no_numpy_warnings():
            out, lse = impl.merge_attn_states(*args)
        assert_close(out, full[0], atol=1e-15)
        np.testing.assert_array_equal(lse, full[1])
    for p_lse, s_lse in ((plus_inf, plus_inf), (plus_inf, minus_inf), (minus_inf, plus_inf)):
        with no_numpy_warnings():
            out, lse = impl.merge_attn_states(junk, p_lse, junk, s_lse)
        np.testing.assert_array_equal(out, 0.0)
        assert np.all(lse == -np.inf)


def test_merge_per_row_and_head_mixture_of_empty_and_full():
    """Emptiness is decided per (head, token): one merge can hold all four cases."""
    q, k, v = make_qkv(8, 8, tokens=4)
    a = list(impl.attend_partial(q, k[:5], v[:5], SCALE))
    b = list(impl.attend_partial(q, k[5:], v[5:], SCALE))
    a[1][:, 1] = -np.inf  # token 1: prefix empty -> the suffix alone
    b[1][:, 2] = -np.inf  # token 2: suffix empty -> the prefix alone
    a[1][:, 3] = -np.inf  # token 3: both empty
    b[1][:, 3] = -np.inf
    with no_numpy_warnings():
        out, lse = impl.merge_attn_states(*a, *b)
    want_out, want_lse = oracle(q[:1], k, v, SCALE)
    assert_close(out[0], want_out[0])
    assert_close(lse[:, 0], want_lse[:, 0])
    assert_close(out[1], b[0][1], atol=1e-15)
    assert_close(out[2], a[0][2], atol=1e-15)
    np.testing.assert_array_equal(out[3], 0.0)
    np.testing.assert_array_equal(lse[:, 1], b[1][:, 1])
    np.testing.assert_array_equal(lse[:, 2], a[1][:, 2])
    assert np.all(lse[:, 3] == -np.inf)


@pytest.mark.parametrize("n_ctx", [0, 2, 5])
def test_prefill_tokens_with_context_copies_suffix_rows_bit_exactly(n_ctx):
    """Rows t >= prefill_tokens_with_context have no prefix: output and LSE are the suffix's."""
    q, k, v = make_qkv(9, 10, tokens=5)
    prefix = list(impl.attend_partial(q, k[:6], v[:6], SCALE))
    suffix = list(impl.attend_partial(q, k[6:], v[6:], SCALE))
    prefix[0][n_ctx:] = np.nan  # a copied row never reads the prefix
    prefix[1][:, n_ctx:] = 50.0  # a large, finite prefix LSE: any leak would dominate
    if n_ctx < 5:
        suffix[1][0, 4] = np.inf  # copied verbatim, not reinterpreted (upstream stores s_lse as is)
        suffix[0][4, 0] = 1.0 / 3.0
    out, lse = impl.merge_attn_states(*prefix, *suffix, prefill_tokens_with_context=n_ctx)
    np.testing.assert_array_equal(out[n_ctx:], suffix[0][n_ctx:])
    np.testing.assert_array_equal(lse[:, n_ctx:], suffix[1][:, n_ctx:])
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert_close(out[:n_ctx], want_out[:n_ctx])
    assert_close(lse[:, :n_ctx], want_lse[:, :n_ctx])


def test_prefill_tokens_with_context_none_merges_every_row():
    q, k, v = make_qkv(10, 7, tokens=4)
    prefix = impl.attend_partial(q, k[:3], v[:3], SCALE)
    suffix = impl.attend_partial(q, k[3:], v[3:], SCALE)
    out, lse = impl.merge_attn_states(*prefix, *suffix, None)
    all_rows = impl.merge_attn_states(*prefix, *suffix, prefill_tokens_with_context=4)
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert_close(out, want_out)
    assert_close(lse, want_lse)
    np.testing.assert_array_equal(out, all_rows[0])
    np.testing.assert_array_equal(lse, all_rows[1])


def test_merge_leaves_its_inputs_unchanged():
    q, k, v = make_qkv(11, 6, tokens=4)
    prefix = impl.attend_partial(q, k[:2], v[:2], SCALE)
    suffix = impl.attend_partial(q, k[2:], v[2:], SCALE)
    prefix[1][0, 0] = np.inf
    copies = [x.copy() for x in (*prefix, *suffix)]
    impl.merge_attn_states(*prefix, *suffix, prefill_tokens_with_context=2)
    for before, after in zip(copies, (*prefix, *suffix), strict=True):
        np.testing.assert_array_equal(before, after)


# --------------------------------------------------------------------------
# partitioned_attention
# --------------------------------------------------------------------------


def test_one_partition_is_plain_attention():
    q, k, v = make_qkv(12, 37)
    out, lse = impl.partitioned_attention(q, k, v, 1, SCALE)
    single = impl.attend_partial(q, k, v, SCALE)
    np.testing.assert_array_equal(out, single[0])
    np.testing.assert_array_equal(lse, single[1])
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert_close(out, want_out)
    assert_close(lse, want_lse)


@pytest.mark.parametrize("num_partitions", [2, 3, 7, 32, 100])
def test_many_partitions_equal_dense_attention(num_partitions):
    """37 keys: 3 and 7 leave a short last partition, 32 (size 2) and 100 (size 1) leave
    13 and 63 empty ones."""
    q, k, v = make_qkv(13, 37, spread=2.0)
    with no_numpy_warnings():
        out, lse = impl.partitioned_attention(q, k, v, num_partitions, SCALE)
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert out.shape == (TOKENS, HEADS, DIM) and lse.shape == (HEADS, TOKENS)
    assert_close(out, want_out)
    assert_close(lse, want_lse)


@pytest.mark.parametrize(("num_keys", "num_partitions"), [(5, 7), (1, 4), (3, 12)])
def test_more_partitions_than_keys(num_keys, num_partitions):
    q, k, v = make_qkv(14, num_keys)
    with no_numpy_warnings():
        out, lse = impl.partitioned_attention(q, k, v, num_partitions, SCALE)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    want_out, want_lse = oracle(q, k, v, SCALE)
    assert_close(out, want_out)
    assert_close(lse, want_lse)


def test_no_keys_at_all_gives_zero_and_minus_inf():
    q, k, v = make_qkv(15, 0)
    with no_numpy_warnings():
        out, lse = impl.partitioned_attention(q, k, v, 3, SCALE)
    np.testing.assert_array_equal(out, 0.0)
    assert np.all(lse == -np.inf)


def test_partitioned_attention_attends_each_range_in_order(monkeypatch):
    """10 keys in 7 partitions: attend_partial sees keys [0:2], [2:4], ..., [8:10], then two
    empty ranges, and 6 merges fold the 7 results."""
    q, k, v = make_qkv(16, 10)
    seen, merges = [], []
    attend, merge = impl.attend_partial, impl.merge_attn_states

    def spy_attend(q_, k_, v_, scale_):
        seen.append((np.array(k_, copy=True), np.array(v_, copy=True), scale_))
        return attend(q_, k_, v_, scale_)

    def spy_merge(*args, **kwargs):
        merges.append(1)
        return merge(*args, **kwargs)

    monkeypatch.setattr(impl, "attend_partial", spy_attend)
    monkeypatch.setattr(impl, "merge_attn_states", spy_merge)
    out, _ = impl.partitioned_attention(q, k, v, 7, SCALE)
    ranges = [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 10), (10, 10)]
    assert len(seen) == 7 and len(merges) == 6
    for (k_seen, v_seen, scale_seen), (start, stop) in zip(seen, ranges, strict=True):
        np.testing.assert_array_equal(k_seen, k[start:stop])
        np.testing.assert_array_equal(v_seen, v[start:stop])
        assert scale_seen == SCALE
    assert_close(out, oracle(q, k, v, SCALE)[0])


@pytest.mark.parametrize("peak", [200.0, 800.0])
def test_huge_scores_do_not_overflow(peak):
    """Head 0 scores near +peak, head 1 near -peak. exp(800) overflows float64
    (the largest finite exponent is about 709.78) and exp(-800) underflows to 0."""
    offsets = np.array([0.0, -1.0, -0.5, -3.0, -2.0, -0.25, -4.0])
    k = (peak + offsets)[:, None, None]  # 7 keys, 1 KV head, head_dim 1
    v = np.arange(7.0)[:, None, None]
    q = np.array([[[1.0], [-1.0]]])  # 1 token, 2 heads over the one KV head
    want_out, want_lse = oracle(q, k, v, 1.0)
    assert want_lse[0, 0] == pytest.approx(peak + math.log(np.exp(offsets).sum()), abs=1e-12)
    with no_numpy_warnings():
        single = impl.attend_partial(q, k, v, 1.0)
        split = impl.partitioned_attention(q, k, v, 3, 1.0)
    for out, lse in (single, split):
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
        assert_close(out, want_out)
        assert_close(lse, want_lse, atol=1e-12 * peak)


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


def test_partition_bounds_rejects_bad_arguments():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"num_partitions must be an integer >= 1"):
            impl.partition_bounds(5, bad)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match=r"num_keys must be an integer >= 0"):
            impl.partition_bounds(bad, 2)
    assert impl.partition_bounds(np.int64(6), np.int64(2)) == [(0, 3), (3, 6)]


def test_attend_partial_rejects_bad_shapes():
    q, k, v = make_qkv(17, 4)
    with pytest.raises(ValueError, match=r"^q must be \[num_tokens, num_heads, head_dim\]"):
        impl.attend_partial(q[0], k, v, SCALE)
    with pytest.raises(ValueError, match=r"^k must be \[num_keys, num_kv_heads, head_dim\]"):
        impl.attend_partial(q, k[:, 0], v, SCALE)
    with pytest.raises(ValueError, match=r"^v must have k's shape"):
        impl.attend_partial(q, k, v[:3], SCALE)
    with pytest.raises(ValueError, match=r"head_dim of k \(4\) must equal head_dim of q \(8\)"):
        impl.attend_partial(q, k[..., :4], v[..., :4], SCALE)
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) must be >= 1 and divide num_heads \(4\)"):
        impl.attend_partial(q, np.zeros((4, 3, DIM)), np.zeros((4, 3, DIM)), SCALE)
    with pytest.raises(ValueError, match=r"num_kv_heads \(0\) must be >= 1"):
        impl.attend_partial(q, np.zeros((4, 0, DIM)), np.zeros((4, 0, DIM)), SCALE)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"scale must be a finite number"):
            impl.attend_partial(q, k, v, bad)


def test_merge_rejects_bad_shapes():
    q, k, v = make_qkv(18, 4)
    out, lse = impl.attend_partial(q, k, v, SCALE)
    with pytest.raises(ValueError, match=r"^prefix_output must be \[num_tokens, num_heads, head_dim\]"):
        impl.merge_attn_states(out[0], lse, out, lse)
    with pytest.raises(ValueError, match=r"^suffix_output must have prefix_output's shape"):
        impl.merge_attn_states(out, lse, out[:2], lse)
    # the LSEs are [num_heads, num_tokens] = (4, 3); the transpose (3, 4) is the classic slip
    with pytest.raises(ValueError, match=r"^prefix_lse must be \[num_heads, num_tokens\] = \(4, 3\)"):
        impl.merge_attn_states(out, lse.T, out, lse)
    with pytest.raises(ValueError, match=r"^suffix_lse must be \[num_heads, num_tokens\] = \(4, 3\)"):
        impl.merge_attn_states(out, lse, out, lse.T)
    for bad in (-1, 4, 1.5, True):
        with pytest.raises(ValueError, match=r"prefill_tokens_with_context must be None or an integer "
                                             r"in 0\.\.3"):
            impl.merge_attn_states(out, lse, out, lse, prefill_tokens_with_context=bad)


def test_partitioned_attention_rejects_bad_arguments():
    q, k, v = make_qkv(19, 6)
    for bad in (0, -2):
        with pytest.raises(ValueError, match=r"num_partitions must be an integer >= 1"):
            impl.partitioned_attention(q, k, v, bad, SCALE)
    for bad_k in (k[0], 3.0):  # 2-D, and a scalar, which has no key axis to split at all
        with pytest.raises(ValueError, match=r"^k must be \[num_keys, num_kv_heads, head_dim\]"):
            impl.partitioned_attention(q, bad_k, v, 2, SCALE)
    # nested lists are array-likes too (4 partitions of 6 keys: the last one is empty)
    out, _ = impl.partitioned_attention(q.tolist(), k.tolist(), v.tolist(), 4, SCALE)
    assert_close(out, oracle(q, k, v, SCALE)[0])
    with pytest.raises(ValueError, match=r"^v must have k's shape"):
        impl.partitioned_attention(q, k, v[:, :1], 2, SCALE)


def test_script_example_prints_the_readme_numbers():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(pathlib.Path(impl.__file__)), run_name="__main__")
    assert buf.getvalue().splitlines() == [
        "partition a: out = 12.6894  lse = 2.3133",
        "partition b: out = 32.6894  lse = 4.3133",
        "merged:      out = 30.3054  lse = 4.4402",
        "plain average (wrong): 22.6894",
        "7 partitions over 4 keys: [(0, 1), (1, 2), (2, 3), (3, 4), (4, 4), (4, 4), (4, 4)]"
        " -> out = 30.3054",
    ]
