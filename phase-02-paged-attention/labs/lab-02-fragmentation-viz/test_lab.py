"""Lab 02-02 tests: admissions and waste, contiguous reservation vs paging."""
from __future__ import annotations

import pytest

from course import load_impl

impl = load_impl(__file__)

TOTAL, MAX_LEN, BLOCK = 4096, 512, 16


def test_headline_8_admissions_vs_64_on_identical_memory():
    arrivals = [32] * 64
    c = impl.contiguous_admit(arrivals, TOTAL, MAX_LEN)
    p = impl.paged_admit(arrivals, TOTAL, BLOCK)
    assert (c.admitted, c.rejected, c.wasted_slots, c.used_slots) == (8, 56, 3840, 256)
    assert (p.admitted, p.rejected, p.wasted_slots, p.used_slots) == (64, 0, 0, 2048)
    assert p.admitted // c.admitted == 8  # 8x, not the 15x a careless reading claims


def test_contiguous_waste_is_exactly_the_over_reservation():
    arrivals = [1, 100, 512, 37, 250, 8, 499, 64]
    c = impl.contiguous_admit(arrivals, TOTAL, MAX_LEN)
    assert c.admitted == 8
    assert c.wasted_slots == sum(MAX_LEN - u for u in arrivals)
    # the share of the pool doing work: 256 of 4096 slots in the headline case
    head = impl.contiguous_admit([32] * 8, TOTAL, MAX_LEN)
    assert head.wasted_slots / (head.wasted_slots + head.used_slots) == 480 / 512 == 0.9375


def test_paged_waste_is_below_one_block_per_request():
    arrivals = [33] * 64
    p = impl.paged_admit(arrivals, TOTAL, BLOCK)
    assert p.admitted == 64
    assert p.wasted_slots == 64 * 15 == 960
    mixed = [1, 15, 16, 17, 31, 32, 33, 100]
    pm = impl.paged_admit(mixed, TOTAL, BLOCK)
    assert pm.wasted_slots == sum((-u) % BLOCK for u in mixed) == 15 + 1 + 0 + 15 + 1 + 0 + 15 + 12
    assert all((-u) % BLOCK <= BLOCK - 1 for u in mixed)


def test_rejections_are_counted_not_raised():
    c = impl.contiguous_admit([10] * 3, total_slots=1000, max_len=400)
    assert (c.admitted, c.rejected) == (2, 1)
    p = impl.paged_admit([40] * 5, total_slots=128, block_size=16)  # 8 blocks, 3 each
    assert (p.admitted, p.rejected) == (2, 3)


def test_paged_never_admits_fewer_than_contiguous():
    import random

    rng = random.Random(7)
    for _ in range(20):
        arrivals = [rng.randint(1, MAX_LEN) for _ in range(40)]
        c = impl.contiguous_admit(arrivals, TOTAL, MAX_LEN)
        p = impl.paged_admit(arrivals, TOTAL, BLOCK)
        assert p.admitted >= c.admitted
        assert p.wasted_slots < BLOCK * p.admitted or p.admitted == 0


def test_first_fit_reuses_the_lowest_hole():
    pool = impl.ContiguousPool(1000)
    assert [pool.allocate(200) for _ in range(5)] == [0, 200, 400, 600, 800]
    assert pool.allocate(1) is None
    pool.free(200)
    pool.free(600)
    assert pool.num_free_slots() == 400 and pool.largest_free_run() == 200
    assert pool.allocate(300) is None  # 400 free, but no 300-slot run
    assert pool.allocate(150) == 200


def test_first_fit_takes_the_lowest_hole_even_when_a_later_one_fits_tighter():
    pool = impl.ContiguousPool(1000)
    assert [pool.allocate(n) for n in (300, 100, 200, 400)] == [0, 300, 400, 600]
    pool.free(0)    # a 300-slot hole at address 0
    pool.free(400)  # a 200-slot hole at address 400
    # best fit would choose the tighter hole at 400; first fit takes the lowest address
    assert pool.allocate(150) == 0
    assert pool.free_runs() == [(150, 150), (400, 200)]


def test_first_fit_takes_the_lowest_hole_even_when_a_later_one_is_larger():
    pool = impl.ContiguousPool(1000)
    assert [pool.allocate(n) for n in (200, 100, 300, 400)] == [0, 200, 300, 600]
    pool.free(0)    # 200 slots at 0
    pool.free(300)  # 300 slots at 300
    assert pool.allocate(200) == 0  # an exact fit is a fit
    assert pool.allocate(250) == 300
    assert pool.allocate(50) == 550 and pool.allocate(1) is None


def test_external_fragmentation_blocks_contiguous_but_not_paged():
    demo = impl.external_fragmentation_demo()
    assert demo == {
        "free_slots": 2048,
        "largest_free_run": 512,
        "contiguous_fits": False,
        "paged_free_slots": 2048,
        "paged_fits": True,
    }


def test_block_size_trades_tail_waste_for_table_length():
    rows = impl.block_size_sweep(33, [1, 4, 16, 64, 256])
    assert rows == [(1, 0, 33), (4, 3, 9), (16, 15, 3), (64, 31, 1), (256, 223, 1)]


def test_tail_waste_and_table_length_for_the_exercise_workloads():
    # EXERCISES 2: a 100-token request wastes 12 slots at block size 16, 28 at 64
    assert impl.block_size_sweep(100, [16, 64]) == [(16, 12, 7), (64, 28, 2)]
    # EXERCISES 17: a 30,000-token document needs 1,875 table entries at 16, 469 at 64
    assert impl.block_size_sweep(30_000, [16, 64]) == [(16, 0, 1875), (64, 16, 469)]


def test_occupancy_picture_matches_the_counts():
    contiguous, paged = impl.occupancy([33] * 64, TOTAL, MAX_LEN, BLOCK)
    assert len(contiguous) == len(paged) == TOTAL
    assert contiguous.count(impl.USED) == 8 * 33
    assert contiguous.count(impl.RESERVED_UNUSED) == 8 * (512 - 33)
    assert contiguous.count(impl.FREE) == 0
    assert paged.count(impl.USED) == 64 * 33
    assert paged.count(impl.RESERVED_UNUSED) == 960
    assert paged.count(impl.FREE) == TOTAL - 64 * 48


def test_report_prints_the_readme_numbers():
    assert impl.report() == (
        "contiguous    8 in,  56 turned away,  3840 slots idle\n"
        "paged        64 in,   0 turned away,     0 slots idle"
    )


def test_bad_parameters_raise_value_errors_that_name_them():
    with pytest.raises(ValueError, match="block_size"):
        impl.blocks_needed(5, 0)
    with pytest.raises(ValueError, match="max_len"):
        impl.contiguous_admit([600], TOTAL, MAX_LEN)
    with pytest.raises(ValueError, match="total_slots"):
        impl.ContiguousPool(0)


@pytest.mark.parametrize("call, name", [
    (lambda: impl.blocks_needed(-1, 16), "num_tokens"),
    (lambda: impl.blocks_needed(16, -4), "block_size"),
    (lambda: impl.ContiguousPool(100).allocate(0), "num_slots"),
    (lambda: impl.contiguous_admit([32], TOTAL, 0), "max_len"),
    (lambda: impl.contiguous_admit([], TOTAL, 0), "max_len"),  # checked even with no arrivals
    (lambda: impl.contiguous_admit([32, 0, 32], TOTAL, MAX_LEN), "used length"),
    (lambda: impl.paged_admit([32, 0], TOTAL, BLOCK), "used length"),
    (lambda: impl.paged_admit([32], TOTAL, 0), "block_size"),
])
def test_every_promised_value_error_is_raised(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_boundary_lengths_are_accepted():
    assert impl.blocks_needed(0, 16) == 0
    assert [impl.blocks_needed(n, 16) for n in (1, 15, 16, 17, 32, 33)] == [1, 1, 1, 2, 2, 3]
    tiny = impl.contiguous_admit([1, 1, 1], 2, 1)  # max_len 1 is allowed
    assert (tiny.admitted, tiny.rejected, tiny.wasted_slots) == (2, 1, 0)
    full = impl.contiguous_admit([MAX_LEN, 1], TOTAL, MAX_LEN)  # a request may fill its reservation
    assert (full.admitted, full.used_slots, full.wasted_slots) == (2, 513, 511)
    exact = impl.paged_admit([48, 48], 96, BLOCK)  # the second takes the last 3 blocks
    assert (exact.admitted, exact.rejected, exact.wasted_slots) == (2, 0, 0)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = impl.plot(str(tmp_path / "occ.png"), total_slots=512, max_len=128, used_len=20,
                    block_size=16, arrivals=8)
    assert (tmp_path / "occ.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.endswith("occ.png")
