"""Lab 02-04 tests: a Triton decode kernel that reads K/V through a block table.

Tests marked ``triton`` run on a GPU, or on the CPU through Triton's
interpreter (the root conftest sets TRITON_INTERPRET=1 when there is no CUDA).
The bandwidth arithmetic needs neither torch nor triton.
"""
from __future__ import annotations

import math

import pytest

from course import load_impl

impl = load_impl(__file__)


def dense_decode(q, k, v):
    """Oracle for one sequence: contiguous k/v ``[n, kv_heads, d]``, q ``[heads, d]``."""
    import torch

    group = q.shape[0] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q.float(), k) / math.sqrt(q.shape[1])
    return torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), v)


def contiguous_kv(cache, table, seq_len):
    import torch

    bs = cache.shape[1]
    t = torch.arange(seq_len)
    return cache.reshape(-1, *cache.shape[2:])[table.long()[t // bs] * bs + t % bs]


@pytest.mark.triton
def test_torch_reference_equals_dense_attention_on_shuffled_blocks():
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([37, 5, 16], 4, 2, 8, block_size=8)
    out = impl.paged_decode_torch(q, kc, vc, tables, lens)
    for i, n in enumerate(lens.tolist()):
        want = dense_decode(q[i], contiguous_kv(kc, tables[i], n), contiguous_kv(vc, tables[i], n))
        torch.testing.assert_close(out[i], want, rtol=0, atol=1e-5)


@pytest.mark.triton
def test_triton_kernel_matches_reference_with_ragged_lengths():
    import torch

    # 130 tokens at block size 16 -> 9 logical blocks, the last holding 2 tokens
    seq_lens = [130, 17, 1]
    q, kc, vc, tables, lens = impl.make_paged_inputs(seq_lens, 2, 1, 16, block_size=16)
    assert -(-130 // 16) == 9 and 130 - 8 * 16 == 2
    assert tables[0].tolist() == [14, 4, 3, 2, 12, 0, 13, 5, 1]  # the README's shuffled ids
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    ref = impl.paged_decode_torch(q, kc, vc, tables, lens)
    assert torch.isfinite(out).all()  # poisoned 1e4 tail slots were never read
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    for i, n in enumerate(seq_lens):  # and against the test's own dense oracle
        want = dense_decode(q[i], contiguous_kv(kc, tables[i], n), contiguous_kv(vc, tables[i], n))
        torch.testing.assert_close(out[i], want, rtol=0, atol=1e-5)


@pytest.mark.triton
def test_launcher_runs_the_triton_kernel_not_a_torch_fallback(monkeypatch):
    """The output must come from a launch of ``_paged_decode_kernel``, a real ``@triton.jit``
    function (on a CPU, run by Triton's interpreter), not from torch code in the launcher."""
    import os

    import torch
    import triton

    kernel = impl._paged_decode_kernel
    assert isinstance(kernel, triton.runtime.jit.KernelInterface)  # made by @triton.jit
    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    grids = []

    class CountLaunches:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(impl, "_paged_decode_kernel", CountLaunches())
    q, kc, vc, tables, lens = impl.make_paged_inputs([9, 3], 2, 1, 8, block_size=4, seed=7)
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    assert len(grids) == 1 and tuple(grids[0]) == (2, 2)  # one program per (sequence, head)
    torch.testing.assert_close(out, impl.paged_decode_torch(q, kc, vc, tables, lens),
                               rtol=0, atol=1e-5)


@pytest.mark.triton
def test_single_token_sequence_returns_its_value_row():
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([1], 2, 2, 8, block_size=4)
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    row = vc[int(tables[0, 0])][0]  # [kv_heads, d]; softmax over one score is 1
    torch.testing.assert_close(out[0], row, rtol=0, atol=1e-6)


@pytest.mark.triton
def test_multi_head_without_grouping_and_small_blocks():
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([13, 6], 2, 2, 8, block_size=4, seed=3)
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    torch.testing.assert_close(out, impl.paged_decode_torch(q, kc, vc, tables, lens),
                               rtol=0, atol=1e-5)


@pytest.mark.triton
@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 2), (8, 1)])
def test_gqa_maps_each_query_head_to_its_own_kv_head(num_heads, num_kv_heads):
    """4:1 and 8:1 grouping: query head h reads KV head h // (num_heads // num_kv_heads)."""
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([11, 5], num_heads, num_kv_heads, 8,
                                                     block_size=4, seed=11)
    ref = impl.paged_decode_torch(q, kc, vc, tables, lens)
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    group = num_heads // num_kv_heads
    for i, n in enumerate(lens.tolist()):
        k, v = contiguous_kv(kc, tables[i], n), contiguous_kv(vc, tables[i], n)
        for h in range(num_heads):  # one head at a time, against its own KV head
            kv = h // group
            want = dense_decode(q[i, h:h + 1], k[:, kv:kv + 1], v[:, kv:kv + 1])[0]
            torch.testing.assert_close(ref[i, h], want, rtol=0, atol=1e-5)
            torch.testing.assert_close(out[i, h], want, rtol=0, atol=1e-5)


@pytest.mark.triton
def test_large_scores_do_not_overflow_the_softmax():
    """Scores in the hundreds: exp() of them overflows float32 unless the max is subtracted."""
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([20, 9], 2, 1, 16, block_size=8, seed=2)
    q = q * 400.0  # scores around +-400 after the 1/sqrt(d) scale
    scores = torch.einsum("hd,nd->hn", q[0].float(),
                          contiguous_kv(kc, tables[0], 20)[:, 0].float()) / 4.0
    assert scores.max().item() > 200  # far beyond float32's exp range (about 88)
    ref = impl.paged_decode_torch(q, kc, vc, tables, lens)
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    assert torch.isfinite(ref).all() and torch.isfinite(out).all()
    for i, n in enumerate(lens.tolist()):
        want = dense_decode(q[i], contiguous_kv(kc, tables[i], n), contiguous_kv(vc, tables[i], n))
        torch.testing.assert_close(ref[i], want, rtol=0, atol=1e-4)
        torch.testing.assert_close(out[i], want, rtol=0, atol=1e-4)


@pytest.mark.triton
def test_reference_returns_the_query_dtype():
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([7], 2, 1, 8, block_size=4,
                                                     dtype=torch.float16, seed=4)
    assert impl.paged_decode_torch(q, kc, vc, tables, lens).dtype == torch.float16


@pytest.mark.triton
def test_launcher_accepts_non_contiguous_views():
    """Strided views of every input (as slicing a bigger batch gives) must give the same output."""
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([9, 14], 4, 2, 8, block_size=4, seed=12)
    want = impl.paged_decode_attention(q, kc, vc, tables, lens)
    q_wide = torch.zeros(2, 4, 16)
    q_wide[..., ::2] = q
    kc_wide, vc_wide = torch.zeros(*kc.shape[:3], 16), torch.zeros(*vc.shape[:3], 16)
    kc_wide[..., ::2], vc_wide[..., ::2] = kc, vc
    tables_t = tables.t().contiguous().t()  # same values, column-major
    lens_strided = torch.stack([lens, lens], 1)[:, 0]  # same values, stride 2
    views = (q_wide[..., ::2], kc_wide[..., ::2], vc_wide[..., ::2], tables_t, lens_strided)
    assert not any(x.is_contiguous() for x in views)
    got = impl.paged_decode_attention(*views)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.triton
def test_fp16_cache_with_fp32_accumulation_is_within_1e_2():
    import torch

    q, kc, vc, tables, lens = impl.make_paged_inputs([48, 31], 2, 1, 16, block_size=16,
                                                     dtype=torch.float16, seed=5)
    out = impl.paged_decode_attention(q, kc, vc, tables, lens)
    assert out.dtype == torch.float16
    ref = impl.paged_decode_torch(q.float(), kc.float(), vc.float(), tables, lens)
    assert (out.float() - ref).abs().max().item() < 1e-2


@pytest.mark.triton
def test_launcher_rejects_shapes_the_kernel_cannot_tile():
    q, kc, vc, tables, lens = impl.make_paged_inputs([10], 2, 2, 8, block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        impl.paged_decode_attention(q, kc[:, :3], vc[:, :3], tables, lens)
    with pytest.raises(ValueError, match="num_kv_heads"):
        impl.paged_decode_attention(q[:, :1].repeat(1, 3, 1), kc, vc, tables, lens)
    with pytest.raises(ValueError, match="head_dim"):
        impl.paged_decode_attention(q[..., :6], kc[..., :6], vc[..., :6], tables, lens)
    lens[0] = tables.shape[1] * 4 + 1
    with pytest.raises(ValueError, match="seq_lens"):
        impl.paged_decode_attention(q, kc, vc, tables, lens)
    lens[0] = 0
    with pytest.raises(ValueError, match="seq_lens"):
        impl.paged_decode_attention(q, kc, vc, tables, lens)


def test_bytes_moved_counts_kv_once_plus_q_out_and_tables():
    # two sequences, 3 and 17 tokens, block size 16: 1 + 2 table entries
    moved = impl.decode_bytes_moved([3, 17], num_heads=4, num_kv_heads=2, head_dim=8,
                                    block_size=16, dtype_bytes=2)
    kv = 2 * 20 * 2 * 8 * 2
    q_out = 2 * 2 * 4 * 8 * 2
    assert moved == kv + q_out + 3 * 4 + 2 * 4 == 1280 + 256 + 12 + 8


def test_illustrative_h100_numbers_in_the_readme():
    """64 x 2048 tokens, 32 heads / 8 KV heads, d=128, fp16, block 16."""
    moved = impl.decode_bytes_moved([2048] * 64, 32, 8, 128, 16)
    assert moved == 536_870_912 + 1_048_576 + 32_768 + 256 == 537_952_512
    frac = impl.bandwidth_fraction(moved, 0.5e-3, impl.peak_bandwidth_for("NVIDIA H100 80GB HBM3"))
    assert round(moved / 0.5e-3 / 1e12, 3) == 1.076
    assert round(frac, 3) == 0.321


def test_fraction_of_peak_uses_the_right_card():
    moved = impl.decode_bytes_moved([1000], 8, 8, 64, 16)
    cards = {
        "NVIDIA H100 PCIe": 2.0e12,
        "NVIDIA A100-SXM4-80GB": 2.039e12,
        "NVIDIA A100-PCIE-40GB": 1.555e12,
        "NVIDIA A10": 600e9,
        "NVIDIA L40S": 864e9,
        "NVIDIA L4": 300e9,
    }
    for name, peak in cards.items():
        assert impl.bandwidth_fraction(moved, 1e-3, impl.peak_bandwidth_for(name)) == pytest.approx(
            moved / 1e-3 / peak
        )
    with pytest.raises(ValueError, match="seconds"):
        impl.bandwidth_fraction(moved, 0.0, 1e12)
    with pytest.raises(ValueError, match="seq_lens"):
        impl.decode_bytes_moved([], 8, 8, 64, 16)


@pytest.mark.parametrize("call, name", [
    (lambda: impl.decode_bytes_moved([4, 0], 8, 8, 64, 16), "seq_lens"),
    (lambda: impl.decode_bytes_moved([4], 0, 8, 64, 16), "num_heads"),
    (lambda: impl.decode_bytes_moved([4], 8, 0, 64, 16), "num_kv_heads"),
    (lambda: impl.decode_bytes_moved([4], 8, 8, 64, 0), "block_size"),
    (lambda: impl.bandwidth_fraction(100, -1.0, 1e12), "seconds"),
    (lambda: impl.bandwidth_fraction(100, 1e-3, 0.0), "peak_bytes_per_s"),
])
def test_every_promised_value_error_is_raised(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_smallest_valid_inputs_are_accepted():
    assert impl.decode_bytes_moved([1], 1, 1, 1, 1, dtype_bytes=1, index_bytes=1) == 2 + 2 + 1 + 1
    assert impl.bandwidth_fraction(10, 4.0, 1.0) == 2.5  # true division, any positive peak
    assert impl.bandwidth_fraction(3, 0.5, 0.5) == 12.0


def test_one_block_exactly_full_needs_one_table_entry():
    one = impl.decode_bytes_moved([16], 1, 1, 8, 16, dtype_bytes=2, index_bytes=4)
    assert one == 2 * 16 * 8 * 2 + 2 * 8 * 2 + 1 * 4 + 4
    assert impl.decode_bytes_moved([17], 1, 1, 8, 16) - one == 2 * 8 * 2 + 4  # one token, one entry


@pytest.mark.gpu
@pytest.mark.triton
def test_benchmark_on_this_gpu_is_correct_and_below_peak():
    result = impl.benchmark(num_seqs=16, seq_len=1024, iters=10)
    assert result["max_abs_err"] < 1e-2
    assert 0.0 < result["fraction_of_peak"] < 1.2
