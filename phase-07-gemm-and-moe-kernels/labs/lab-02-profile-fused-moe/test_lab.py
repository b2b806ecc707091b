"""Lab 07-02 tests: a Triton fused-MoE kernel over sorted slot ids, and a profiler-trace parser.

Tests marked ``triton`` run on a GPU, or on the CPU through Triton's interpreter
(the root conftest sets TRITON_INTERPRET=1 when there is no CUDA device). The
reference is the engine's numpy MoE, ``mini_vllm.models.moe`` (read-only).
"""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from course import load_impl
from mini_vllm.models.moe import expert_mlp, fused_experts, fused_topk, moe_align_block_size

impl = load_impl(__file__)

# The tiny layer every kernel test uses: 8 tokens, top-2 of 4 experts, hidden 32,
# intermediate 48. Seed 0 routes the 16 slots as 6 / 4 / 2 / 4 over experts 0..3,
# so with block_m = 16 every expert has one block: 4 blocks, 64 sorted ids, of
# which 16 are real and 48 are the padding id 16 (= T * k).
T, K_TOP, E, H, INTER = 8, 2, 4, 32, 48


def make_layer(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H)).astype(np.float32)
    w13 = (rng.standard_normal((E, 2 * INTER, H)) / np.sqrt(H)).astype(np.float32)
    w2 = (rng.standard_normal((E, H, INTER)) / np.sqrt(INTER)).astype(np.float32)
    router = rng.standard_normal((H, E)).astype(np.float32)
    topk_weights, topk_ids = fused_topk(x @ router, K_TOP)
    return x, w13, w2, topk_weights, topk_ids


def aligned(topk_ids, block_m=16):
    import torch

    ids, experts, used = moe_align_block_size(topk_ids, block_m, E)
    return torch.from_numpy(ids), torch.from_numpy(experts), used


def slot_rows(x, w, topk_ids, top_k):
    """Test-side expectation of one launch: row s = A[s // top_k] @ w[expert of s].T."""
    experts = topk_ids.ravel()
    return np.stack([x[s // top_k].astype(np.float64) @ w[experts[s]].T.astype(np.float64)
                     for s in range(experts.size)])


# ---------------------------------------------------------------- padding first, then the whole layer


@pytest.mark.triton
def test_padding_ids_are_never_written():
    import torch

    # C is the first 16 rows of a 24-row buffer filled with a sentinel. The padding id
    # is 16, so an unmasked store lands on buffer row 16. 48 of the 64 sorted ids are
    # padding; each of them must leave the buffer alone. block_n = 64 > N = 32 also
    # leaves columns 32..63 of each tile, which must not be stored either.
    # A, too, is a window: a padding row that is read rather than masked reads buffer
    # row 16, inside the allocation, so the wrong kernel fails here instead of crashing.
    x, _, w2, tw, ti = make_layer()
    rng = np.random.default_rng(6)
    A = torch.from_numpy(rng.standard_normal((T * K_TOP + 8, INTER)).astype(np.float32))[:T * K_TOP]
    buf = torch.full((T * K_TOP + 8, 2 * H), 12345.0)
    C = buf[:T * K_TOP, :H]
    ids, experts, used = aligned(ti)
    assert int((ids == T * K_TOP).sum()) == 48
    impl.invoke_fused_moe_kernel(A, torch.from_numpy(w2), C, None, ids, experts, used,
                                 top_k=1, mul_routed_weight=False, block_n=64)
    assert (buf[T * K_TOP:] == 12345.0).all()  # rows past the last slot: untouched
    assert (buf[:, H:] == 12345.0).all()  # columns past N: untouched
    assert not math.isclose(float(C.abs().max()), 12345.0) and torch.isfinite(C).all()


@pytest.mark.triton
def test_fused_experts_equals_the_engine_reference():
    import torch

    x, w13, w2, tw, ti = make_layer()
    assert np.bincount(ti.ravel(), minlength=E).tolist() == [6, 4, 2, 4]  # the routing above
    ref = fused_experts(x, w13, w2, tw, ti)
    out = impl.fused_experts_triton(*(torch.from_numpy(a) for a in (x, w13, w2, tw, ti)))
    assert out.dtype == torch.float32 and tuple(out.shape) == (T, H)
    # float32 everywhere, tl.dot in IEEE mode: measured max error 4e-7 on outputs of size ~1
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-4)
    # and the per-token definition, independent of any alignment: sum_j w_tj * expert(x_t)
    by_token = np.stack([sum(tw[t, j] * expert_mlp(x[t:t + 1], w13[ti[t, j]], w2[ti[t, j]])[0]
                             for j in range(K_TOP)) for t in range(T)])
    np.testing.assert_allclose(out.numpy(), by_token, rtol=0, atol=1e-4)


@pytest.mark.triton
def test_ragged_tiles_in_n_and_k_still_match():
    import torch

    # block_n = 64: launch 1 has N = 96 = 64 + 32 (a ragged column tile), launch 2 has
    # N = 32 < 64. block_k = 32: launch 2 has K = 48 = 32 + 16, a ragged K tail whose
    # unmasked load would read the next row's first 16 values. block_m = 32: expert 2
    # has 2 slots and 30 padding ids in its block.
    x, w13, w2, tw, ti = make_layer(seed=1)
    ref = fused_experts(x, w13, w2, tw, ti)
    out = impl.fused_experts_triton(*(torch.from_numpy(a) for a in (x, w13, w2, tw, ti)),
                                    block_m=32, block_n=64, block_k=32)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-4)


# ---------------------------------------------------------------- one launch, row by row


@pytest.mark.triton
def test_each_slot_row_is_its_expert_on_its_token_row():
    import torch

    # Launch 1 alone: C[s] = x[s // 2] @ w13[expert of s].T, for all 16 slots.
    # A is a window into a buffer whose extra rows are NaN: gathering row s instead of
    # s // 2 reads rows 8..15, which are NaN, and wrong rows poison the result.
    # B is a transposed view ([E, H, 2I] storage), so the kernel must honour its strides;
    # reading expert e at e * stride of another axis gives wrong rows.
    x, w13, _, tw, ti = make_layer()
    bufA = torch.full((2 * T, H), float("nan"))
    A = bufA[:T]
    A.copy_(torch.from_numpy(x))
    B = torch.from_numpy(np.ascontiguousarray(w13.transpose(0, 2, 1))).transpose(1, 2)
    assert not B.is_contiguous() and tuple(B.shape) == (E, 2 * INTER, H)
    C = torch.full((T * K_TOP, 2 * INTER), float("nan"))
    ids, experts, used = aligned(ti)
    got = impl.invoke_fused_moe_kernel(A, B, C, None, ids, experts, used,
                                       top_k=K_TOP, mul_routed_weight=False)
    assert got is C  # written in place and returned
    np.testing.assert_allclose(C.numpy(), slot_rows(x, w13, ti, K_TOP), rtol=0, atol=1e-4)


@pytest.mark.triton
def test_top_k_one_reads_the_slot_row_itself():
    import torch

    # Launch 2's situation: A has one row per slot (16 rows), top_k = 1, so row s of C
    # is A[s] @ w2[expert of s].T. A kernel that still divides by the token's top_k
    # (2) reads row s // 2.
    rng = np.random.default_rng(5)
    x, _, w2, tw, ti = make_layer()
    A = rng.standard_normal((T * K_TOP, INTER)).astype(np.float32)
    C = torch.zeros((T * K_TOP, H))
    ids, experts, used = aligned(ti)
    impl.invoke_fused_moe_kernel(torch.from_numpy(A), torch.from_numpy(w2), C, None,
                                 ids, experts, used, top_k=1, mul_routed_weight=False)
    np.testing.assert_allclose(C.numpy(), slot_rows(A, w2, ti, 1), rtol=0, atol=1e-4)
    # The K tail, in both operands: A and B are windows whose columns 48..63 are NaN, and
    # block_k = 32 makes the second K step cover indices 32..63. A K mask dropped,
    # loosened to <= K, or or-ed with the row mask in either load reads a NaN into C.
    bufA = torch.full((T * K_TOP, 64), float("nan"))
    bufB = torch.full((E, H, 64), float("nan"))
    An, Bn = bufA[:, :INTER], bufB[:, :, :INTER]
    An.copy_(torch.from_numpy(A))
    Bn.copy_(torch.from_numpy(w2))
    C = torch.zeros((T * K_TOP, H))
    impl.invoke_fused_moe_kernel(An, Bn, C, None, ids, experts, used, top_k=1,
                                 mul_routed_weight=False, block_k=32)
    assert torch.isfinite(C).all()
    np.testing.assert_allclose(C.numpy(), slot_rows(A, w2, ti, 1), rtol=0, atol=1e-4)


@pytest.mark.triton
def test_routed_weight_is_applied_once_per_slot():
    import torch

    # With MUL_ROUTED_WEIGHT each row is multiplied by its own slot's weight, once.
    # Renormalized top-2 weights lie in (0.5, 1) and (0, 0.5): applying a weight twice
    # gives w^2, forgetting it gives 1, and the weight of slot s // top_k (a token index
    # used as a slot index) is another slot's weight.
    x, _, w2, tw, ti = make_layer()
    rng = np.random.default_rng(7)
    A = torch.from_numpy(rng.standard_normal((T * K_TOP, INTER)).astype(np.float32))
    ids, experts, used = aligned(ti)
    plain = torch.zeros((T * K_TOP, H))
    weighted = torch.zeros((T * K_TOP, H))
    impl.invoke_fused_moe_kernel(A, torch.from_numpy(w2), plain, None, ids, experts, used,
                                 top_k=1, mul_routed_weight=False)
    impl.invoke_fused_moe_kernel(A, torch.from_numpy(w2), weighted, torch.from_numpy(tw),
                                 ids, experts, used, top_k=1, mul_routed_weight=True)
    flat = tw.ravel()
    assert np.ptp(flat) > 0.1  # the weights differ enough for each wrong variant to show
    np.testing.assert_allclose(weighted.numpy(), plain.numpy() * flat[:, None],
                               rtol=1e-5, atol=1e-6)
    # with top_k = 2 (a gather launch) the weight still belongs to the slot, not the token
    C2 = torch.zeros((T * K_TOP, 2 * INTER))
    C1 = torch.zeros((T * K_TOP, 2 * INTER))
    _, w13, _, _, _ = make_layer()
    for C, mul in ((C1, False), (C2, True)):
        impl.invoke_fused_moe_kernel(torch.from_numpy(x), torch.from_numpy(w13), C,
                                     torch.from_numpy(tw), ids, experts, used,
                                     top_k=K_TOP, mul_routed_weight=mul)
    np.testing.assert_allclose(C2.numpy(), C1.numpy() * flat[:, None], rtol=1e-5, atol=1e-6)


@pytest.mark.triton
def test_blocks_past_num_tokens_post_padded_do_nothing():
    import torch

    # Upstream sizes the id buffer for the worst case and passes the used length in a
    # tensor. Here two extra blocks follow the 64 used ids: they list real slots 0..15
    # and claim expert 3. A kernel that runs them overwrites those slots with expert 3's
    # rows; one that stops at num_tokens_post_padded leaves the right answer.
    x, _, w2, tw, ti = make_layer()
    rng = np.random.default_rng(8)
    A = rng.standard_normal((T * K_TOP, INTER)).astype(np.float32)
    ids, experts, used = aligned(ti)
    assert used == 64
    long_ids = torch.cat([ids, torch.arange(16), torch.arange(16)])
    long_experts = torch.cat([experts, torch.tensor([3, 3])])
    C = torch.zeros((T * K_TOP, H))
    impl.invoke_fused_moe_kernel(torch.from_numpy(A), torch.from_numpy(w2), C, None,
                                 long_ids, long_experts, torch.tensor([used]),
                                 top_k=1, mul_routed_weight=False)
    np.testing.assert_allclose(C.numpy(), slot_rows(A, w2, ti, 1), rtol=0, atol=1e-4)
    # num_tokens_post_padded = 0: nothing at all is written
    C0 = torch.full((T * K_TOP, H), 7.0)
    impl.invoke_fused_moe_kernel(torch.from_numpy(A), torch.from_numpy(w2), C0, None,
                                 ids, experts, 0, top_k=1, mul_routed_weight=False)
    assert (C0 == 7.0).all()


@pytest.mark.triton
def test_launcher_runs_the_jit_kernel_once_per_call_on_a_1d_grid(monkeypatch):
    import os

    import torch
    import triton

    kernel = impl.fused_moe_kernel
    assert isinstance(kernel, triton.runtime.jit.KernelInterface)  # made by @triton.jit
    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    grids = []

    class CountLaunches:
        def __getitem__(self, grid):
            grids.append(tuple(grid))
            return kernel[grid]

    monkeypatch.setattr(impl, "fused_moe_kernel", CountLaunches())
    x, w13, w2, tw, ti = make_layer()
    out = impl.fused_experts_triton(*(torch.from_numpy(a) for a in (x, w13, w2, tw, ti)))
    # 64 sorted ids / block_m 16 = 4 blocks; launch 1: N = 96 / block_n 32 = 3 column
    # tiles -> 12 programs; launch 2: N = 32 -> 1 column tile -> 4 programs
    assert grids == [(12,), (4,)]
    np.testing.assert_allclose(out.numpy(), fused_experts(x, w13, w2, tw, ti), rtol=0, atol=1e-4)


@pytest.mark.triton
def test_launcher_rejects_what_the_kernel_cannot_run():
    import torch

    x, w13, w2, tw, ti = make_layer()
    A, B = torch.from_numpy(x), torch.from_numpy(w13)
    C = torch.zeros((T * K_TOP, 2 * INTER))
    ids, experts, used = aligned(ti)

    def call(**kw):
        args = dict(A=A, B=B, C=C, topk_weights=torch.from_numpy(tw), sorted_token_ids=ids,
                    expert_ids=experts, num_tokens_post_padded=used, top_k=K_TOP,
                    mul_routed_weight=True)
        args.update(kw)
        return impl.invoke_fused_moe_kernel(**args)

    with pytest.raises(ValueError, match="^A must"):
        call(A=A.double())
    with pytest.raises(ValueError, match="^B must"):
        call(B=B[:, :, :16])
    with pytest.raises(ValueError, match="^B must"):
        call(B=B.half())
    with pytest.raises(ValueError, match="^C must"):
        call(C=torch.zeros((T, 2 * INTER)))  # one row per token, not per slot
    with pytest.raises(ValueError, match="^top_k must"):
        call(top_k=0)
    with pytest.raises(ValueError, match="^topk_weights must"):
        call(topk_weights=torch.from_numpy(tw)[:4])
    with pytest.raises(ValueError, match="^topk_weights must"):
        call(topk_weights=None)
    with pytest.raises(ValueError, match="^sorted_token_ids must"):
        call(sorted_token_ids=ids[:40])
    with pytest.raises(ValueError, match="^expert_ids must"):
        call(expert_ids=experts[:3])
    with pytest.raises(ValueError, match="^expert_ids must"):
        call(expert_ids=experts + 1)  # expert 4 of 4
    with pytest.raises(ValueError, match="^num_tokens_post_padded must"):
        call(num_tokens_post_padded=80)
    with pytest.raises(ValueError, match="^num_tokens_post_padded must"):
        call(num_tokens_post_padded=24)
    for bad in (torch.tensor([64, 0]), torch.tensor([64.0]), 64.0):
        with pytest.raises(ValueError, match="^num_tokens_post_padded must"):
            call(num_tokens_post_padded=bad)
    call(num_tokens_post_padded=torch.tensor([used]))  # a one-element integer tensor is fine
    with pytest.raises(ValueError, match="^block_m must"):
        call(block_m=8)
    with pytest.raises(ValueError, match="^block_n must"):
        call(block_n=48)
    with pytest.raises(ValueError, match="^block_k must"):
        call(block_k=24)
    with pytest.raises(ValueError, match="^topk_ids must"):
        impl.fused_experts_triton(A, B, torch.from_numpy(w2), torch.from_numpy(tw),
                                  torch.from_numpy(ti)[:4])
    with pytest.raises(ValueError, match="^topk_weights must have topk_ids' shape"):
        impl.fused_experts_triton(A, B, torch.from_numpy(w2), torch.from_numpy(tw)[:, :1],
                                  torch.from_numpy(ti))


def test_launcher_without_triton_says_so(monkeypatch):
    # runs with or without triton installed: the launcher must refuse before touching torch
    monkeypatch.setattr(impl, "triton", None)
    with pytest.raises(RuntimeError) as err:
        impl.invoke_fused_moe_kernel(None, None, None, None, None, None, 0, 1, False)
    if isinstance(err.value, NotImplementedError):  # a RuntimeError too: the starter's, unwritten
        raise err.value
    assert type(err.value) is RuntimeError and "triton" in str(err.value)


# ---------------------------------------------------------------- the trace parser


def test_kernel_category_by_name():
    # names as they appear in CUDA traces of vLLM (Triton kernels keep their Python name,
    # CUDA kernels their C++ one, cuBLAS/CUTLASS GEMMs their tile-encoded one)
    want = {
        "fused_moe_kernel": "fused_moe",
        "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*)": "moe_routing",
        "void vllm::moe::count_and_sort_expert_tokens_kernel<int>(...)": "moe_routing",
        "void vllm::moe::moeTopK<8, 1>(float const*, bool const*, float*)": "moe_routing",
        "void vllm::moe::moe_sum_kernel<c10::BFloat16, 8>(...)": "moe_routing",
        "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>(...)": "attention",
        "FlashAttnFwdSm90": "attention",
        "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(...)": "norm",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
        "nvjet_tst_128x64_64x8_1x1_v_bz_coopA_NTN": "gemm",
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16>(...)": "gemm",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>": "other",
    }
    assert {n: impl.kernel_category(n) for n in want} == want
    with pytest.raises(ValueError, match="^name must"):
        impl.kernel_category(None)


def synthetic_trace():
    """A tiny Chrome trace: GPU kernels whose durations add up to exactly 1000 us,
    plus events a parser must skip (CPU ops, runtime calls, memcpy, an instant event)."""
    def ev(cat, name, dur, ph="X"):
        return {"ph": ph, "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": 1.0, "dur": dur}
    return {"schemaVersion": 1, "traceEvents": [
        ev("cpu_op", "aten::mm", 999.0),
        ev("cuda_runtime", "cudaLaunchKernel", 5.0),
        ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 77.0),
        ev("kernel", "fused_moe_kernel", 300.0),
        ev("kernel", "fused_moe_kernel", 200.0),
        ev("kernel", "void flash::flash_fwd_splitkv_kernel<...>", 250.0),
        ev("kernel", "nvjet_tst_128x64_64x8_1x1_v_bz_coopA_NTN", 150.0),
        ev("kernel", "void vllm::moe::moe_align_block_size_kernel<int>(...)", 40),
        ev("Kernel", "void vllm::moe::moe_sum_kernel<float, 8>(...)", 10.0),  # old torch: "Kernel"
        ev("kernel", "void vllm::rms_norm_kernel<c10::BFloat16>(...)", 30.0),
        ev("kernel", "void at::native::vectorized_elementwise_kernel<4>(...)", 20.0),
        ev("kernel", "fused_moe_kernel", 0.0, ph="i"),  # an instant marker, not a kernel run
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]}


def test_kernel_shares_of_a_synthetic_trace(tmp_path):
    # 500 + 250 + 150 + 50 + 30 + 20 = 1000 us of kernels; the 999 us CPU op, the runtime
    # call, the memcpy and the instant event are not GPU kernel time.
    path = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(synthetic_trace(), f)
    rows = impl.kernel_shares(impl.load_trace(path))
    assert [(c, n, us) for c, n, us, _ in rows] == [
        ("fused_moe", 2, 500.0), ("attention", 1, 250.0), ("gemm", 1, 150.0),
        ("moe_routing", 2, 50.0), ("norm", 1, 30.0), ("other", 1, 20.0)]
    assert [round(s, 6) for *_, s in rows] == [0.5, 0.25, 0.15, 0.05, 0.03, 0.02]
    assert abs(sum(s for *_, s in rows) - 1.0) < 1e-12


def test_kernel_shares_ties_empty_and_bad_input():
    tie = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": n, "dur": 5}
                           for n in ("rms_norm_kernel", "flash_fwd", "fused_moe_kernel")]}
    # equal times: alphabetical by category
    assert [r[0] for r in impl.kernel_shares(tie)] == ["attention", "fused_moe", "norm"]
    assert impl.kernel_shares({"traceEvents": []}) == []
    # a zero-length kernel is a kernel (duration 0 is allowed); with no time at all the
    # share is 0, not 1 and not a division by zero
    zero = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 0}]}
    assert impl.kernel_shares(zero) == [("other", 1, 0.0, 0.0)]
    assert impl.kernel_shares({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x",
                                                "dur": 3}]}) == []
    with pytest.raises(ValueError, match="^trace must"):
        impl.kernel_shares([])
    with pytest.raises(ValueError, match="^trace must"):
        impl.kernel_shares({"events": []})
    with pytest.raises(ValueError, match="^dur must"):
        impl.kernel_shares({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k"}]})
    with pytest.raises(ValueError, match="^dur must"):
        impl.kernel_shares({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": -1}]})
