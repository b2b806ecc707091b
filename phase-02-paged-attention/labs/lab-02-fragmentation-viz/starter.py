"""Lab 02-02 — contiguous reservation vs paging on the same memory (your implementation).

Two allocators over one pool of ``total_slots`` KV slots (one slot = one token's
K and V in every layer):

* ``ContiguousPool`` — the pre-vLLM way: every request reserves one unbroken
  run of slots, first fit, sized for the worst case it might reach.
* ``PagedPool`` — vLLM's way: fixed-size blocks handed out from anywhere, only
  as many as the tokens actually need.

``contiguous_admit`` / ``paged_admit`` run a stream of arrivals through each and
count admissions, rejections and wasted slots. ``occupancy`` turns a pool into
a per-slot picture; ``python solution.py [out.png]`` draws it.

upstream: vllm/v1/core/block_pool.py:333 BlockPool.get_new_blocks
upstream: vllm/v1/core/single_type_kv_cache_manager.py:120 num_required_blocks (cdiv(num_tokens, block_size))
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

FREE, RESERVED_UNUSED, USED = 0, 1, 2


@dataclass(slots=True)
class AdmitResult:
    """What one allocator did with a stream of arrivals."""

    admitted: int
    rejected: int
    used_slots: int  # slots holding a real token's KV
    wasted_slots: int  # slots held by admitted requests but holding nothing


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """The fewest blocks of ``block_size`` slots that hold ``num_tokens`` tokens.

    Exact for any size of integer (0 tokens need 0 blocks). Raises ValueError
    naming ``block_size`` when it is < 1, and naming ``num_tokens`` when it is < 0.
    """
    raise NotImplementedError("blocks_needed: ceiling division")


class ContiguousPool:
    """First-fit allocator of contiguous slot runs."""

    def __init__(self, total_slots: int) -> None:
        if total_slots < 1:
            raise ValueError(f"total_slots must be >= 1, got {total_slots}")
        self.total_slots = total_slots
        self.extents: dict[int, int] = {}  # start -> length, for live reservations

    def free_runs(self) -> list[tuple[int, int]]:
        """Free (start, length) runs in address order."""
        runs, cursor = [], 0
        for start in sorted(self.extents):
            if start > cursor:
                runs.append((cursor, start - cursor))
            cursor = start + self.extents[start]
        if cursor < self.total_slots:
            runs.append((cursor, self.total_slots - cursor))
        return runs

    def allocate(self, num_slots: int) -> int | None:
        """Reserve ``num_slots`` contiguous slots; return the start address, or None.

        First fit: the reservation goes at the lowest address whose free run is long
        enough, even if a later run would fit more tightly. Afterwards
        ``self.extents[start] == num_slots``. Nothing fits: None, and nothing changes
        (a rejection, not an error). Raises ValueError naming ``num_slots`` when it
        is < 1.
        """
        raise NotImplementedError("ContiguousPool.allocate: first fit")

    def free(self, start: int) -> None:
        if start not in self.extents:
            raise ValueError(f"start={start} is not the start of a live reservation")
        del self.extents[start]

    def num_free_slots(self) -> int:
        return self.total_slots - sum(self.extents.values())

    def largest_free_run(self) -> int:
        return max((length for _, length in self.free_runs()), default=0)


class PagedPool:
    """Blocks of ``block_size`` slots from a free list; any block serves any request."""

    def __init__(self, total_slots: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if total_slots < block_size:
            raise ValueError(f"total_slots must be >= block_size={block_size}, got {total_slots}")
        self.block_size = block_size
        self.num_blocks = total_slots // block_size
        self.free_list: list[int] = list(range(self.num_blocks))

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Take the block ids that ``num_tokens`` tokens need out of ``self.free_list``.

        Returns them (any ids will do: that is the point of paging), or None when
        fewer are free, leaving the free list unchanged.
        """
        raise NotImplementedError("PagedPool.allocate: take blocks from the free list")

    def free(self, blocks: list[int]) -> None:
        self.free_list.extend(blocks)

    def num_free_slots(self) -> int:
        return len(self.free_list) * self.block_size


def contiguous_admit(used_lens: list[int], total_slots: int, max_len: int) -> AdmitResult:
    """Run the arrivals, in order, through one fresh ``ContiguousPool(total_slots)``.

    ``used_lens[i]`` is how many tokens arrival ``i`` ends up holding; each arrival
    reserves ``max_len`` contiguous slots, since its length is unknown on arrival.
    Nothing is freed. An arrival that does not fit is rejected, not an error.
    Returns the counts: admitted, rejected, slots holding tokens, and slots
    reserved by admitted requests but holding nothing.

    Raises ValueError naming ``max_len`` when it is < 1, and naming the used
    length when any is outside ``[1, max_len]``.
    """
    raise NotImplementedError("contiguous_admit: reserve the worst case")


def paged_admit(used_lens: list[int], total_slots: int, block_size: int) -> AdmitResult:
    """Run the arrivals, in order, through one fresh ``PagedPool(total_slots, block_size)``.

    Each arrival takes only the blocks its ``used_lens[i]`` tokens need, from
    anywhere in the pool. Nothing is freed; an arrival that does not fit is
    rejected. Returns the same four counts as ``contiguous_admit``; the waste of an
    admitted request is the empty part of its blocks (below ``block_size``).

    Raises ValueError naming the used length when any is < 1, and naming
    ``block_size`` when it is < 1.
    """
    raise NotImplementedError("paged_admit: take only the blocks the tokens need")


def external_fragmentation_demo(
    total_slots: int = 4096, reservation: int = 512, request: int = 1024, block_size: int = 16
) -> dict[str, int | bool]:
    """Fill the pool with reservations, free every other one, then ask for ``request`` slots.

    Returns the free slots, the largest free run, and whether each allocator
    could place the request.
    """
    contiguous = ContiguousPool(total_slots)
    starts = []
    while (start := contiguous.allocate(reservation)) is not None:
        starts.append(start)
    for start in starts[::2]:
        contiguous.free(start)
    paged = PagedPool(total_slots, block_size)
    held = [paged.allocate(reservation) for _ in starts]
    for blocks in held[::2]:
        paged.free(blocks)
    return {
        "free_slots": contiguous.num_free_slots(),
        "largest_free_run": contiguous.largest_free_run(),
        "contiguous_fits": contiguous.allocate(request) is not None,
        "paged_free_slots": paged.num_free_slots(),
        "paged_fits": paged.allocate(request) is not None,
    }


def block_size_sweep(used_len: int, block_sizes: list[int]) -> list[tuple[int, int, int]]:
    """For one request of ``used_len`` tokens: (block_size, tail waste, table entries)."""
    rows = []
    for bs in block_sizes:
        n = blocks_needed(used_len, bs)
        rows.append((bs, n * bs - used_len, n))
    return rows


def occupancy(
    used_lens: list[int], total_slots: int, max_len: int, block_size: int
) -> tuple[list[int], list[int]]:
    """Per-slot state (FREE / RESERVED_UNUSED / USED) after admitting ``used_lens``.

    Returns (contiguous row, paged row), each of length ``total_slots``.
    """
    contiguous = [FREE] * total_slots
    pool = ContiguousPool(total_slots)
    for u in used_lens:
        start = pool.allocate(max_len)
        if start is None:
            continue
        contiguous[start : start + max_len] = [USED] * u + [RESERVED_UNUSED] * (max_len - u)
    paged = [FREE] * total_slots
    ppool = PagedPool(total_slots, block_size)
    for u in used_lens:
        blocks = ppool.allocate(u)
        if blocks is None:
            continue
        for i, b in enumerate(blocks):
            filled = min(block_size, u - i * block_size)
            base = b * block_size
            paged[base : base + block_size] = [USED] * filled + [RESERVED_UNUSED] * (block_size - filled)
    return contiguous, paged


def report(
    total_slots: int = 4096, max_len: int = 512, used_len: int = 32, block_size: int = 16,
    arrivals: int = 64,
) -> str:
    arrivals_list = [used_len] * arrivals
    c = contiguous_admit(arrivals_list, total_slots, max_len)
    p = paged_admit(arrivals_list, total_slots, block_size)
    return (
        f"contiguous  {c.admitted:3d} in, {c.rejected:3d} turned away, {c.wasted_slots:5d} slots idle\n"
        f"paged       {p.admitted:3d} in, {p.rejected:3d} turned away, {p.wasted_slots:5d} slots idle"
    )


def plot(path: str = "fragmentation.png", total_slots: int = 4096, max_len: int = 512,
         used_len: int = 33, block_size: int = 16, arrivals: int = 64) -> str:
    """Draw both occupancy rows as a picture (green used, red reserved-but-empty, grey free)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    contiguous, paged = occupancy([used_len] * arrivals, total_slots, max_len, block_size)
    width = 128
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    cmap = ListedColormap(["#dddddd", "#d9534f", "#5cb85c"])
    for ax, row, title in ((axes[0], contiguous, "contiguous (reserve max_len)"),
                           (axes[1], paged, f"paged (block_size={block_size})")):
        grid = [row[i : i + width] for i in range(0, total_slots, width)]
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{arrivals} arrivals of {used_len} tokens into {total_slots} slots: "
                 "green = KV, red = reserved but empty, grey = free")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(report())
    print(report(used_len=33))
    print(external_fragmentation_demo())
    print("wrote", plot(sys.argv[1] if len(sys.argv) > 1 else "fragmentation.png"))
