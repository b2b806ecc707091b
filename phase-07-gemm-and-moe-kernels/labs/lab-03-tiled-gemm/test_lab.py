"""Lab 07-03 tests: the tile loop, its exact load count, the grouped tile order, a Triton matmul.

Tests marked ``triton`` run on a GPU, or on the CPU through Triton's interpreter
(the root conftest sets TRITON_INTERPRET=1 when there is no CUDA device).
"""
from __future__ import annotations

import ast
import contextlib
import io
from fractions import Fraction

import numpy as np
import pytest

import course
from course import load_impl

impl = load_impl(__file__)

FUSED_MOE = course.UPSTREAM / "vllm/model_executor/layers/fused_moe/fused_moe.py"


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def run_counting(A, B, tm, tn, tk):
    """Run the learner's tiled_gemm and record every slab it reports."""
    calls = []
    C = impl.tiled_gemm(A, B, tm, tn, tk, on_load=lambda *c: calls.append(c))
    return C, calls


def loads(calls):
    """Elements loaded: the sum of each reported slab's area."""
    return sum((r1 - r0) * (c1 - c0) for _, r0, r1, c0, c1 in calls)


# ---------------------------------------------------------------- the tile loop


def test_tiled_equals_matmul_when_tiles_divide():
    A, B = rand((64, 32), 0), rand((32, 48), 1)
    C = impl.tiled_gemm(A, B, 16, 16, 8)
    assert C.dtype == np.float32 and C.shape == (64, 48)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=0, atol=1e-4)


def test_ragged_37x23x19_equals_matmul_and_never_reads_outside():
    # No tile side divides its axis: 37 = 2*16 + 5 rows, 23 = 2*8 + 7 columns,
    # 19 = 3*5 + 4 along K. The last tiles are smaller, not padded and not dropped.
    A, B = rand((37, 19), 2), rand((19, 23), 3)
    C, calls = run_counting(A, B, 16, 8, 5)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=0, atol=1e-4)
    a_slabs = [c for c in calls if c[0] == "A"]
    b_slabs = [c for c in calls if c[0] == "B"]
    # 3 row tiles x 3 column tiles x 4 K steps, one A slab and one B slab each
    assert len(a_slabs) == len(b_slabs) == 3 * 3 * 4 == 36
    assert all(0 <= r0 < r1 <= 37 and 0 <= k0 < k1 <= 19 for _, r0, r1, k0, k1 in a_slabs)
    assert all(0 <= k0 < k1 <= 19 and 0 <= c0 < c1 <= 23 for _, k0, k1, c0, c1 in b_slabs)
    assert {(r0, r1) for _, r0, r1, _, _ in a_slabs} == {(0, 16), (16, 32), (32, 37)}
    assert {(c0, c1) for _, _, _, c0, c1 in b_slabs} == {(0, 8), (8, 16), (16, 23)}
    assert {(k0, k1) for _, k0, k1, _, _ in b_slabs} == {(0, 5), (5, 10), (10, 15), (15, 19)}


def test_slabs_come_tile_by_tile_with_k_innermost():
    # 4 x 4 x 4 with 2 x 2 tiles and K steps of 2: tiles (0,0), (0,2), (2,0), (2,2) in
    # row-major order; for each, K steps 0 and 2; for each step, A's slab then B's.
    _, calls = run_counting(rand((4, 4), 4), rand((4, 4), 5), 2, 2, 2)
    want = []
    for i0 in (0, 2):
        for j0 in (0, 2):
            for k0 in (0, 2):
                want += [("A", i0, i0 + 2, k0, k0 + 2), ("B", k0, k0 + 2, j0, j0 + 2)]
    assert calls == want


def test_reported_loads_equal_tiled_traffic_whatever_tk():
    A, B = rand((37, 19), 6), rand((19, 23), 7)
    for tm, tn in ((16, 8), (8, 16), (5, 23), (64, 3), (1, 1)):
        want = impl.tiled_traffic(37, 23, 19, tm, tn)
        for tk in (1, 4, 19, 32):  # the K step changes how loads are cut, never how many
            _, calls = run_counting(A, B, tm, tn, tk)
            assert loads(calls) == want, (tm, tn, tk)


def test_tile_size_one_is_the_naive_algorithm():
    # 1 x 1 tiles: every output element reads its whole row of A and column of B
    A, B = rand((6, 5), 8), rand((5, 7), 9)
    C, calls = run_counting(A, B, 1, 1, 5)
    assert loads(calls) == impl.naive_traffic(6, 7, 5) == 6 * 7 * 2 * 5 == 420
    assert impl.tiled_traffic(6, 7, 5, 1, 1) == 420
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=0, atol=1e-5)


def test_float16_inputs_accumulate_in_float32():
    # K = 4096 products in [0, 1): sums near 1000, where a float16 step is 0.5 (and 1.0
    # above 1024). Each slab's partial sum and the running total must stay in float32;
    # the result is then within 1e-5 of the exact (float64) sum of the same fp16 values.
    rng = np.random.default_rng(10)
    A = rng.random((4, 4096)).astype(np.float16)
    B = rng.random((4096, 3)).astype(np.float16)
    want = A.astype(np.float64) @ B.astype(np.float64)
    C = impl.tiled_gemm(A, B, 2, 2, 64)
    assert C.dtype == np.float32
    # measured: 3.3e-7 relative; float16 slab products 9.1e-5, a float16 accumulator 2.1e-3
    np.testing.assert_allclose(C, want, rtol=1e-5, atol=0)


def test_integer_inputs_are_widened_before_multiplying():
    # int8 100 * 100 summed 8 times is 80,000: int8 (or int16) arithmetic wraps around
    A = np.full((3, 8), 100, dtype=np.int8)
    B = np.full((8, 2), 100, dtype=np.int8)
    C = impl.tiled_gemm(A, B, 2, 2, 3)
    assert C.dtype == np.float32 and (C == 80_000).all()


def test_inputs_are_not_modified():
    A, B = rand((9, 7), 11), rand((7, 5), 12)
    a0, b0 = A.copy(), B.copy()
    impl.tiled_gemm(A, B, 4, 2, 3)
    np.testing.assert_array_equal(A, a0)
    np.testing.assert_array_equal(B, b0)


# ---------------------------------------------------------------- the traffic model


def test_traffic_of_1024_cubed_with_128_tiles():
    naive = impl.naive_traffic(1024, 1024, 1024)
    tiled = impl.tiled_traffic(1024, 1024, 1024, 128, 128)
    # naive: 1024 * 1024 outputs x 2048 loads = 2^31, one past int32's largest value
    assert type(naive) is int and naive == 2_147_483_648 == 2**31
    # tiled: A read 1024/128 = 8 times, B 8 times: 2 * 8 * 2^20 = 2^24
    assert type(tiled) is int and tiled == 16_777_216 == 2**24
    assert naive // tiled == 128
    # element loads, not bytes: at fp16 (2 bytes) that is 4 GiB against 32 MiB
    assert naive * 2 == 4 * 2**30 and tiled * 2 == 32 * 2**20


def test_ragged_traffic_by_hand():
    # 37 x 23 x 19, tiles 16 x 8: A (37*19) read ceil(23/8) = 3 times, B (19*23) read
    # ceil(37/16) = 3 times. Swapping tm and tn gives 1406 + 2185 = 3591, floor division
    # 2280, and no rounding at all a fraction.
    assert impl.tiled_traffic(37, 23, 19, 16, 8) == 37 * 19 * 3 + 19 * 23 * 3 == 3420
    assert impl.tiled_traffic(37, 23, 19, 8, 16) == 37 * 19 * 2 + 19 * 23 * 5 == 3591
    assert type(impl.tiled_traffic(37, 23, 19, 16, 8)) is int


def test_tiles_bigger_than_the_matrix_read_every_element_once():
    # the floor of the model: M*K + K*N (the operand part of upstream's launch metadata
    # bytes, bytes_per_elem * (m*k + n*k + m*n), which also counts the store of C)
    assert impl.tiled_traffic(37, 23, 19, 64, 64) == 37 * 19 + 19 * 23 == 1140
    assert impl.tiled_traffic(37, 23, 19, 37, 23) == 1140
    assert impl.tiled_traffic(37, 23, 19, 36, 23) == 1140 + 19 * 23  # one row over: B twice


def test_bigger_tiles_mean_less_traffic():
    sides = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    t = [impl.tiled_traffic(1024, 1024, 1024, s, s) for s in sides]
    assert t[0] == impl.naive_traffic(1024, 1024, 1024)
    assert all(a == 2 * b for a, b in zip(t, t[1:], strict=False))  # doubling a square tile halves it
    assert t[-1] == 2 * 1024 * 1024  # one tile: each element once


def test_reuse_factor_is_the_harmonic_mean_of_the_sides():
    assert impl.reuse_factor(128, 128) == 128.0
    assert impl.reuse_factor(256, 16) == pytest.approx(512 / 17, rel=1e-12)  # 30.12, not 136
    assert round(impl.reuse_factor(256, 16), 1) == 30.1
    assert impl.reuse_factor(16, 256) == impl.reuse_factor(256, 16)
    assert impl.reuse_factor(1, 1) == 1.0
    assert impl.reuse_factor(64, 32) == pytest.approx(128 / 3, rel=1e-12)
    assert isinstance(impl.reuse_factor(3, 5), float)


def test_reuse_factor_is_naive_over_tiled_when_tiles_divide():
    for tm, tn in ((128, 128), (256, 16), (64, 32), (8, 512), (1, 1024)):
        ratio = Fraction(impl.naive_traffic(1024, 1024, 1024),
                         impl.tiled_traffic(1024, 1024, 1024, tm, tn))
        assert float(ratio) == pytest.approx(impl.reuse_factor(tm, tn), rel=1e-12)


def test_decode_shape_has_no_reuse_to_harvest():
    # M = 1: one row of A, so each element of B is used once whatever the tiles are.
    # naive / tiled = 2 * N * K / (K * N + K * N / tn) = 2 / (1 + 1/tn) < 2.
    naive = impl.naive_traffic(1, 4096, 4096)
    for tn in (16, 128, 4096):
        tiled = impl.tiled_traffic(1, 4096, 4096, 128, tn)
        assert Fraction(naive, tiled) == Fraction(2 * tn, tn + 1) < 2
        assert impl.reuse_factor(1, tn) == pytest.approx(2 * tn / (tn + 1), rel=1e-12)
        assert impl.reuse_factor(1, tn) < 2


def test_arithmetic_intensity_decode_against_prefill():
    # M = 1 (decode), N = K = 4096, 128 x 128 tiles, fp16:
    # loads 4096*4096 (B once) + 4096*32 (the A row, once per column tile), stores 4096
    flops = 2 * 4096 * 4096
    decode = Fraction(flops, 2 * (4096 * 4096 + 4096 * 32 + 4096))
    assert impl.arithmetic_intensity(1, 4096, 4096, 128, 128) == pytest.approx(float(decode))
    assert round(float(decode), 3) == 0.992  # about one FLOP per byte
    # M = 4096 (a long prefill): A and B each read 32 times, plus 4096^2 stores
    prefill = Fraction(2 * 4096**3, 2 * (2 * 4096 * 4096 * 32 + 4096 * 4096))
    assert impl.arithmetic_intensity(4096, 4096, 4096, 128, 128) == pytest.approx(float(prefill))
    assert round(float(prefill), 2) == 63.02
    # four-byte elements halve it; default dtype_bytes is 2
    assert impl.arithmetic_intensity(4096, 4096, 4096, 128, 128, 4) == pytest.approx(
        float(prefill) / 2)


# ---------------------------------------------------------------- the grouped tile order


def test_group_size_one_is_row_major():
    order = [impl.tile_order(p, 3, 4, 1) for p in range(12)]
    assert order == [(p // 4, p % 4) for p in range(12)]


def test_grouped_order_by_hand_with_a_short_last_band():
    # 5 tile rows, 3 tile columns, bands of 2 rows: the third band has only row 4.
    order = [impl.tile_order(p, 5, 3, 2) for p in range(15)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                     (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2),
                     (4, 0), (4, 1), (4, 2)]
    assert all(type(a) is int and type(b) is int for a, b in order)


@pytest.mark.parametrize("num_pid_m, num_pid_n, group", [(7, 5, 3), (8, 3, 8), (4, 6, 16),
                                                         (1, 9, 4), (9, 1, 2), (13, 7, 4)])
def test_every_tile_is_computed_exactly_once(num_pid_m, num_pid_n, group):
    order = [impl.tile_order(p, num_pid_m, num_pid_n, group) for p in range(num_pid_m * num_pid_n)]
    assert sorted(order) == [(m, n) for m in range(num_pid_m) for n in range(num_pid_n)]


def test_grouped_order_needs_fewer_tiles_per_wave():
    # 9 x 9 output tiles, 9 K steps each, a wave of 9 programs running together.
    # Row-major: one row of A tiles and nine columns of B: (1 + 9) * 9 = 90 tile loads.
    # Bands of 3: a 3 x 3 square: (3 + 3) * 9 = 54.
    def wave_loads(group):
        tiles = [impl.tile_order(p, 9, 9, group) for p in range(9)]
        return (len({m for m, _ in tiles}) + len({n for _, n in tiles})) * 9

    assert wave_loads(1) == 90
    assert wave_loads(3) == 54
    assert {impl.tile_order(p, 9, 9, 3) for p in range(9)} == {(m, n) for m in range(3)
                                                              for n in range(3)}


def _upstream_tile_order():
    """The pid -> (pid_m, pid_n) statements of upstream's ``fused_moe_kernel``, run in Python.

    They are pure integer arithmetic, so the assignments are cut out of the kernel's
    body with ``ast`` and executed with ``pid``, ``num_pid_m``, ``num_pid_n`` and
    ``GROUP_SIZE_M`` supplied; neither triton nor vllm is imported.
    """
    tree = ast.parse(FUSED_MOE.read_text())
    kernel = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                  and n.name == "fused_moe_kernel")
    wanted = ["num_pid_in_group", "group_id", "first_pid_m", "group_size_m", "pid_m", "pid_n"]
    stmts = [s for s in kernel.body if isinstance(s, ast.Assign) and len(s.targets) == 1
             and isinstance(s.targets[0], ast.Name) and s.targets[0].id in wanted]
    assert [s.targets[0].id for s in stmts] == wanted
    code = compile(ast.Module(body=stmts, type_ignores=[]), str(FUSED_MOE), "exec")

    def order(pid, num_pid_m, num_pid_n, group):
        ns = {"pid": pid, "num_pid_m": num_pid_m, "num_pid_n": num_pid_n, "GROUP_SIZE_M": group}
        exec(code, ns)
        return ns["pid_m"], ns["pid_n"]

    return order


@pytest.mark.upstream
def test_tile_order_matches_fused_moe_kernel():
    up = _upstream_tile_order()
    for num_pid_m, num_pid_n, group in ((5, 3, 2), (7, 5, 3), (8, 3, 8), (13, 7, 4), (6, 6, 16),
                                        (1, 4, 1)):
        for pid in range(num_pid_m * num_pid_n):
            assert impl.tile_order(pid, num_pid_m, num_pid_n, group) == up(
                pid, num_pid_m, num_pid_n, group), (pid, num_pid_m, num_pid_n, group)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("call, name", [
    (lambda: impl.tiled_gemm(np.ones(4), np.ones((4, 2)), 2, 2, 2), "A"),
    (lambda: impl.tiled_gemm(np.ones((0, 4)), np.ones((4, 2)), 2, 2, 2), "A"),
    (lambda: impl.tiled_gemm(np.ones((3, 4)), np.ones((4, 2, 1)), 2, 2, 2), "B"),
    (lambda: impl.tiled_gemm(np.ones((3, 4)), np.ones((5, 2)), 2, 2, 2), "B"),
    (lambda: impl.tiled_gemm(np.ones((3, 4)), np.ones((4, 2)), 0, 2, 2), "tm"),
    (lambda: impl.tiled_gemm(np.ones((3, 4)), np.ones((4, 2)), 2, -1, 2), "tn"),
    (lambda: impl.tiled_gemm(np.ones((3, 4)), np.ones((4, 2)), 2, 2, 1.5), "tk"),
    (lambda: impl.naive_traffic(0, 4, 4), "M"),
    (lambda: impl.naive_traffic(4, 0, 4), "N"),
    (lambda: impl.naive_traffic(4, 4, 2.0), "K"),
    (lambda: impl.tiled_traffic(0, 4, 4, 2, 2), "M"),
    (lambda: impl.tiled_traffic(4, -4, 4, 2, 2), "N"),
    (lambda: impl.tiled_traffic(4, 4, 0, 2, 2), "K"),
    (lambda: impl.tiled_traffic(4, 4, 4, 0, 2), "tm"),
    (lambda: impl.tiled_traffic(4, 4, 4, 2, True), "tn"),
    (lambda: impl.reuse_factor(0, 2), "tm"),
    (lambda: impl.reuse_factor(2, 0), "tn"),
    (lambda: impl.arithmetic_intensity(4, 4, 4, 2, 2, 0), "dtype_bytes"),
    (lambda: impl.arithmetic_intensity(0, 4, 4, 2, 2), "M"),
    (lambda: impl.tile_order(0, 0, 3, 1), "num_pid_m"),
    (lambda: impl.tile_order(0, 3, 0, 1), "num_pid_n"),
    (lambda: impl.tile_order(0, 3, 3, 0), "group_size_m"),
    (lambda: impl.tile_order(9, 3, 3, 1), "pid"),
    (lambda: impl.tile_order(-1, 3, 3, 1), "pid"),
])
def test_bad_arguments_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        call()


def test_smallest_valid_inputs_are_accepted():
    assert impl.tiled_gemm(np.array([[3.0]]), np.array([[4.0]]), 1, 1, 1).tolist() == [[12.0]]
    assert impl.naive_traffic(1, 1, 1) == 2
    assert impl.tiled_traffic(1, 1, 1, 1, 1) == 2
    assert impl.tile_order(8, 3, 3, 1) == (2, 2)  # the last pid is valid
    got = impl.tile_order(np.int64(4), 3, 3, 3)  # numpy integers are integers
    assert got == (1, 1) and all(type(v) is int for v in got)  # and come back as Python ints


def test_launcher_without_triton_says_so(monkeypatch):
    # runs with or without triton installed: the launcher must refuse before touching torch
    monkeypatch.setattr(impl, "triton", None)
    with pytest.raises(RuntimeError, match="triton") as err:
        impl.triton_matmul(np.ones((16, 16), np.float32), np.ones((16, 16), np.float32))
    assert type(err.value) is RuntimeError  # NotImplementedError is a RuntimeError too


def test_example_prints_the_readme_lines():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        impl._example()
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["naive", "1024^3:", "2,147,483,648", "loads", "4.00", "GiB",
                                "at", "fp16"]
    assert "16,777,216 loads     32.0 MiB  128.00x less (reuse 128.00)" in lines[3]
    assert "30.12x less (reuse 30.12)" in lines[4]
    assert lines[5].endswith("0.99 FLOP/byte at fp16")
    assert lines[7].endswith("63.02 FLOP/byte at fp16")


# ---------------------------------------------------------------- the Triton kernel


@pytest.mark.triton
def test_triton_matmul_ragged_37x23x19_equals_numpy():
    import torch

    A, B = rand((37, 19), 20), rand((19, 23), 21)
    C = impl.triton_matmul(torch.from_numpy(A), torch.from_numpy(B))
    assert C.dtype == torch.float32 and tuple(C.shape) == (37, 23)
    np.testing.assert_allclose(C.cpu().numpy(), A.astype(np.float64) @ B, rtol=0, atol=1e-4)


@pytest.mark.triton
def test_launcher_runs_the_jit_kernel_once_on_a_1d_grid(monkeypatch):
    import os

    import torch
    import triton

    kernel = impl._matmul_kernel
    assert isinstance(kernel, triton.runtime.jit.KernelInterface)  # made by @triton.jit
    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    grids = []

    class CountLaunches:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(impl, "_matmul_kernel", CountLaunches())
    A, B = torch.from_numpy(rand((37, 19), 22)), torch.from_numpy(rand((19, 23), 23))
    C = impl.triton_matmul(A, B)
    # cdiv(37, 16) * cdiv(23, 16) = 3 * 2 programs
    assert len(grids) == 1 and tuple(grids[0]) == (6,)
    torch.testing.assert_close(C, A @ B, rtol=0, atol=1e-4)


@pytest.mark.triton
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_triton_every_group_size_covers_every_tile(group):
    import torch

    # 80 x 48 in 16 x 16 tiles: 5 tile rows, so bands of 2 and 4 leave a short last band
    A, B = rand((80, 32), 24), rand((32, 48), 25)
    C = impl.triton_matmul(torch.from_numpy(A), torch.from_numpy(B), group_size_m=group)
    np.testing.assert_allclose(C.numpy(), A.astype(np.float64) @ B, rtol=0, atol=1e-4)


@pytest.mark.triton
def test_triton_float16_accumulates_in_float32_and_returns_float16():
    import torch

    # K = 1024 products in [0, 1): sums near 256, where a float16 step is 0.125 or 0.25.
    # Accumulating in float32 and rounding once to float16 leaves at most half a step
    # (plus float32 noise, < 1e-4); 64 float16 additions of 16-term slabs drift further.
    rng = np.random.default_rng(26)
    A = rng.random((16, 1024)).astype(np.float16)
    B = rng.random((1024, 16)).astype(np.float16)
    C = impl.triton_matmul(torch.from_numpy(A), torch.from_numpy(B), block_k=16)
    assert C.dtype == torch.float16
    want = A.astype(np.float64) @ B.astype(np.float64)
    steps = np.abs(C.numpy().astype(np.float64) - want) / np.spacing(want.astype(np.float16))
    assert steps.max() <= 0.5 + 1e-3  # measured 0.496; a float16 accumulator: 5.4 steps


@pytest.mark.triton
def test_triton_reads_strided_views():
    import torch

    # A as the transpose of a contiguous [19, 37] tensor, B as every other column of [19, 46]
    At = torch.from_numpy(rand((19, 37), 27))
    Bw = torch.from_numpy(rand((19, 46), 28))
    A, B = At.t(), Bw[:, ::2]
    assert not A.is_contiguous() and not B.is_contiguous()
    C = impl.triton_matmul(A, B, block_m=32, block_n=16, block_k=16)
    torch.testing.assert_close(C, A.contiguous() @ B.contiguous(), rtol=0, atol=1e-4)


@pytest.mark.triton
def test_triton_masks_keep_loads_inside_the_matrix():
    import torch

    # A and B are windows into buffers whose other cells are NaN, so a load that strays past
    # K (in either operand, through a dropped or loosened mask) puts a NaN into C.
    bufA = torch.full((48, 32), float("nan"))
    bufB = torch.full((32, 32), float("nan"))
    A, B = bufA[:37, :19], bufB[:19, :23]
    A.copy_(torch.from_numpy(rand((37, 19), 29)))
    B.copy_(torch.from_numpy(rand((19, 23), 30)))
    C = impl.triton_matmul(A, B)
    assert torch.isfinite(C).all()
    torch.testing.assert_close(C, A.contiguous() @ B.contiguous(), rtol=0, atol=1e-4)


@pytest.mark.triton
def test_triton_launcher_rejects_what_the_kernel_cannot_tile():
    import torch

    A, B = torch.ones(20, 16), torch.ones(16, 8)
    with pytest.raises(ValueError, match="^block_m must"):
        impl.triton_matmul(A, B, block_m=8)
    with pytest.raises(ValueError, match="^block_k must"):
        impl.triton_matmul(A, B, block_k=24)
    with pytest.raises(ValueError, match="^block_n must"):
        impl.triton_matmul(A, B, block_n=32.0)
    with pytest.raises(ValueError, match="^B must"):
        impl.triton_matmul(A, torch.ones(15, 8))
    with pytest.raises(ValueError, match="^B must"):
        impl.triton_matmul(A, B.half())
    with pytest.raises(ValueError, match="^A must"):
        impl.triton_matmul(A.double(), B.double())
    with pytest.raises(ValueError, match="^A must"):
        impl.triton_matmul(torch.ones(20), B)
    with pytest.raises(ValueError, match="^group_size_m must"):
        impl.triton_matmul(A, B, group_size_m=0)
