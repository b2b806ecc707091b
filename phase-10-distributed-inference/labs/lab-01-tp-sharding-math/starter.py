"""Lab 10-01 — tensor-parallel sharding: column, row, one all-reduce (your implementation).

Tensor parallelism (TP) cuts every large weight matrix of a transformer into
``tp_size`` slices, gives one slice to each rank (one GPU in vLLM, one process
here), and joins the partial results with a collective. Two cuts are enough
for a whole model:

* **column-parallel**: a weight ``W [out, in]`` (PyTorch's ``F.linear`` layout,
  ``y = x @ W.T``) is cut along ``out``. Rank ``r`` holds rows
  ``r * out / tp .. (r + 1) * out / tp`` and computes that slice of ``y``
  from the *whole* input. Joining is a concatenation: an all-gather, or
  nothing at all when the next layer can consume the slice.
* **row-parallel**: ``W`` is cut along ``in``. Rank ``r`` holds columns
  ``r * in / tp .. (r + 1) * in / tp``, needs only that slice of ``x``, and
  produces a full-width but *partial* ``y``. Joining is a sum: an all-reduce.

Pair them (column first, activation on the slice, row second) and an MLP
costs one all-reduce and no gather: the hidden activation never exists in
one piece. That is the Megatron-LM pattern vLLM uses in every model.

The lab has three parts:

1. numpy, no processes: ``shard_range``, ``column_shard``, ``row_shard``,
   ``column_parallel``, ``row_parallel`` and ``mlp_tp`` simulate the ranks
   in a loop and count the all-reduces the real thing would need.
2. real collectives: ``ColumnParallelLinear``, ``RowParallelLinear`` and
   ``tp_mlp`` run inside real processes joined by ``torch.distributed``
   (gloo), one shard per process, and call ``dist.all_gather`` /
   ``dist.all_reduce``. The tests start those processes with
   ``mini_vllm.distributed.run_in_processes``.
3. the two pieces of bookkeeping TP needs beyond linears:
   ``pad_vocab_size`` and ``vocab_parallel_embedding`` (an embedding table
   cut by vocabulary rows, with out-of-shard ids masked to zero before the
   all-reduce), and ``qkv_head_split`` (which attention heads a rank owns,
   with KV heads replicated when there are more ranks than KV heads).

Inside a process group, rank and world size come from ``torch.distributed``
(``_tp_rank_and_size``, given); outside one, a layer behaves as rank 0 of a
world of 1 and calls no collective, as vLLM's layers do at TP = 1.

upstream: vllm/model_executor/layers/linear.py:410 ColumnParallelLinear
upstream: vllm/model_executor/layers/linear.py:1392 RowParallelLinear
upstream: vllm/model_executor/layers/linear.py:1559 tensor_model_parallel_all_reduce
upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:81 pad_vocab_size
upstream: vllm/model_executor/layers/vocab_parallel_embedding.py:163 get_masked_input_and_mask
upstream: vllm/model_executor/layers/linear.py:1031 num_kv_head_replicas
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

DEFAULT_VOCAB_PADDING = 64  # vLLM pads every vocabulary to a multiple of 64 rows


# ---------------------------------------------------------------- given helpers


def _check_count(value, name: str, low: int = 1) -> int:
    """Given. ``value`` as an int, refused (naming ``name``) unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _as_matrix(a, name: str) -> np.ndarray:
    """Given. ``a`` as a float64 2-D array of finite numbers, refused (naming ``name``) otherwise."""
    arr = np.asarray(a)
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iuf" or not np.isfinite(arr).all():
        raise ValueError(f"{name} must be a non-empty 2-D array of finite numbers, got "
                         f"{arr.dtype} {arr.shape}")
    return arr.astype(np.float64)


def _as_weight(w, name: str) -> torch.Tensor:
    """Given. ``w`` as a 2-D floating torch tensor, refused (naming ``name``) otherwise."""
    if not isinstance(w, torch.Tensor) or w.ndim != 2 or not w.is_floating_point() or w.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 2-D floating torch.Tensor, got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    return w


def _tp_rank_and_size() -> tuple[int, int]:
    """Given. ``(rank, world_size)`` of the default process group; ``(0, 1)`` when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ---------------------------------------------------------------- part 1: numpy


def shard_range(size: int, rank: int, tp_size: int) -> tuple[int, int]:
    """The half-open range ``[start, end)`` of a dimension of ``size`` that ``rank`` owns.

    The dimension is cut into ``tp_size`` equal, contiguous pieces in rank order:
    ``start = rank * size / tp_size``, ``end = start + size / tp_size``.

    Raises ValueError naming ``size`` (not an integer >= 1), ``tp_size`` (not an
    integer >= 1, or not a divisor of ``size``) or ``rank`` (outside
    ``0 .. tp_size - 1``).
    """
    raise NotImplementedError("shard_range: per_rank = size // tp_size; return rank * per_rank, (rank + 1) * per_rank (after the checks)")


def column_shard(W, rank: int, tp_size: int) -> np.ndarray:
    """Rank ``rank``'s column-parallel slice of ``W [out, in]``: rows ``shard_range(out, ...)``.

    "Column" names the columns of ``W.T`` (the ``[in, out]`` matrix of ``x @ W.T``);
    in the ``[out, in]`` layout they are rows. Returns float64 ``[out / tp_size, in]``.

    Raises ValueError naming ``W`` (not a non-empty 2-D array of finite numbers),
    ``tp_size`` or ``rank`` (as ``shard_range``).
    """
    raise NotImplementedError("column_shard: rows of W [out, in]: W[start:end, :] with shard_range(out, rank, tp_size)")


def row_shard(W, rank: int, tp_size: int) -> np.ndarray:
    """Rank ``rank``'s row-parallel slice of ``W [out, in]``: columns ``shard_range(in, ...)``.

    Returns float64 ``[out, in / tp_size]``. Errors as ``column_shard``.
    """
    raise NotImplementedError("row_shard: columns of W [out, in]: W[:, start:end] with shard_range(in, rank, tp_size)")


def column_parallel(x, W, num_ranks: int) -> np.ndarray:
    """``x @ W.T`` computed as ``num_ranks`` column-parallel ranks would.

    x: ``[T, in]``; W: ``[out, in]``. Each rank multiplies the whole ``x`` by its
    ``column_shard``, giving ``[T, out / num_ranks]``; the slices are
    concatenated in rank order along the last axis (what an all-gather does).
    Returns float64 ``[T, out]``.

    Raises ValueError naming ``x`` (not a 2-D finite array, or its width is not
    ``in``), ``W``, or ``num_ranks`` (not an integer >= 1 dividing ``out``).
    """
    raise NotImplementedError("column_parallel: concatenate x @ column_shard(W, r, n).T over r along the last axis")


def row_parallel(x, W, num_ranks: int) -> np.ndarray:
    """``x @ W.T`` computed as ``num_ranks`` row-parallel ranks would.

    Rank ``r`` takes columns ``shard_range(in, r, num_ranks)`` of ``x`` and its
    ``row_shard`` of ``W`` and computes a partial ``[T, out]``; the partials are
    summed in rank order (what an all-reduce does). Returns float64 ``[T, out]``.

    Errors as ``column_parallel``, with ``in`` in place of ``out``.
    """
    raise NotImplementedError("row_parallel: sum over r of x[:, in-slice r] @ row_shard(W, r, n).T")


def mlp_tp(x, W1, W2, num_ranks: int) -> tuple[np.ndarray, int]:
    """A two-layer ReLU MLP, ``relu(x @ W1.T) @ W2.T``, split Megatron-style.

    x: ``[T, hidden]``; W1: ``[ffn, hidden]`` (column-parallel); W2:
    ``[hidden, ffn]`` (row-parallel). Rank ``r`` computes its hidden slice
    ``relu(x @ column_shard(W1, r).T)`` (ReLU works element by element, so it
    can run on the slice), multiplies it by ``row_shard(W2, r)`` and yields a
    partial output; the partials are summed.

    Returns ``(y, num_all_reduces)``: y float64 ``[T, hidden]``, and the number
    of collectives a real run needs: 1 when ``num_ranks > 1`` (the final sum)
    and 0 when ``num_ranks == 1`` (nothing to join). No all-gather is needed.

    Raises ValueError naming ``x``, ``W1``, ``W2`` (not 2-D finite, or shapes that
    do not chain: ``W1.shape[1] != x.shape[1]`` names ``W1``,
    ``W2.shape != (hidden, ffn)`` names ``W2``) or ``num_ranks`` (not an
    integer >= 1 dividing ``ffn``).
    """
    raise NotImplementedError("mlp_tp: per rank relu(x @ W1_r.T) @ W2_r.T, summed; count 1 collective if num_ranks > 1")


# ---------------------------------------------------------------- part 2: real collectives


class ColumnParallelLinear:
    """This rank's piece of a column-parallel linear layer.

    weight: this rank's ``[out / world, in]`` slice (a 2-D floating tensor);
    bias: this rank's ``[out / world]`` slice of the bias, or None;
    gather_output: when True, ``forward`` all-gathers the slices so every rank
    returns the full ``[..., out]``; when False (vLLM's default) it returns the
    local ``[..., out / world]`` slice and calls no collective.

    Collectives go through ``dist.all_gather`` (the module attribute, so the
    tests can count them) and only when the world size is above 1.

    Raises ValueError naming ``weight`` (not a 2-D floating tensor) or ``bias``
    (not None and not a tensor of shape ``[weight.shape[0]]``).
    """

    def __init__(self, weight, bias=None, gather_output: bool = False):
        self.weight = _as_weight(weight, "weight")
        if bias is not None and (not isinstance(bias, torch.Tensor)
                                 or tuple(bias.shape) != (weight.shape[0],)):
            raise ValueError(f"bias must be None or a tensor of shape ({weight.shape[0]},)")
        self.bias = bias
        self.gather_output = bool(gather_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in]`` -> ``[..., out / world]``, or ``[..., out]`` with ``gather_output``.

        Raises ValueError naming ``x`` when its last axis is not ``in``.
        """
        raise NotImplementedError("ColumnParallelLinear.forward: x @ weight.T (+ bias); with gather_output and world > 1, dist.all_gather then torch.cat(dim=-1)")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Given. ``self.forward(x)``."""
        return self.forward(x)


class RowParallelLinear:
    """This rank's piece of a row-parallel linear layer.

    weight: this rank's ``[out, in / world]`` slice; bias: the *full* ``[out]``
    bias or None; input_is_parallel: when True (vLLM's default, the usual case
    after a column-parallel layer) ``x`` is already this rank's ``[..., in /
    world]`` slice; when False ``x`` is the full ``[..., in]`` and the layer
    takes its own slice (``shard_range`` of the last axis).

    ``forward`` computes the partial product, adds the bias on rank 0 only (so
    the sum holds it once), and all-reduces (``dist.all_reduce``, sum) when the
    world size is above 1. Every rank returns the full ``[..., out]``.

    Raises ValueError naming ``weight`` or ``bias`` (not None and not of shape
    ``[weight.shape[0]]``).
    """

    def __init__(self, weight, bias=None, input_is_parallel: bool = True):
        self.weight = _as_weight(weight, "weight")
        if bias is not None and (not isinstance(bias, torch.Tensor)
                                 or tuple(bias.shape) != (weight.shape[0],)):
            raise ValueError(f"bias must be None or a tensor of shape ({weight.shape[0]},)")
        self.bias = bias
        self.input_is_parallel = bool(input_is_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in / world]`` (or ``[..., in]``) -> ``[..., out]``, summed over ranks.

        Raises ValueError naming ``x`` when its last axis is not ``in / world``
        (``input_is_parallel``) or ``in`` (otherwise).
        """
        raise NotImplementedError("RowParallelLinear.forward: x_local @ weight.T, bias on rank 0 only, then dist.all_reduce when world > 1")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Given. ``self.forward(x)``."""
        return self.forward(x)


def tp_mlp(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """``relu(x @ W1.T) @ W2.T`` on this rank's shards, with exactly one all-reduce.

    x: the full ``[T, hidden]`` (the same on every rank); w1_shard: this rank's
    column slice ``[ffn / world, hidden]`` of W1; w2_shard: this rank's row slice
    ``[hidden, ffn / world]`` of W2. Build a ``ColumnParallelLinear`` (no gather)
    and a ``RowParallelLinear`` (input already parallel) and apply ReLU in
    between. Returns the full ``[T, hidden]`` on every rank. In a world of
    ``N > 1`` it calls ``dist.all_reduce`` once and ``dist.all_gather`` never;
    in a world of 1, no collective.

    Raises ValueError as the two layers do.
    """
    raise NotImplementedError("tp_mlp: ColumnParallelLinear(w1_shard) -> torch.relu -> RowParallelLinear(w2_shard)")


# ---------------------------------------------------------------- part 3: vocabulary and heads


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING) -> int:
    """The smallest multiple of ``pad_to`` that is >= ``vocab_size``.

    vLLM pads the embedding and LM-head rows so every TP rank gets the same
    number of rows (and GPU kernels get aligned shapes); the padded rows are
    never indexed by a real token.

    Raises ValueError naming ``vocab_size`` or ``pad_to`` (not an integer >= 1).
    """
    raise NotImplementedError("pad_vocab_size: round vocab_size up to a multiple of pad_to")


def vocab_parallel_embedding(ids: torch.Tensor, E_shard: torch.Tensor, start: int, end: int
                             ) -> torch.Tensor:
    """Embedding lookup with the table cut by vocabulary rows across the ranks.

    ids: integer tensor of token ids, any shape, the same on every rank;
    E_shard: this rank's rows ``start .. end - 1`` of the (padded) table,
    ``[end - start, H]``. An id in ``[start, end)`` is looked up locally at row
    ``id - start``; any other id belongs to another rank: look up row 0 instead
    (a valid index) and set its output row to zero. Then all-reduce
    (``dist.all_reduce``, sum; skipped in a world of 1): each id's row comes
    from exactly one rank and zeros from the others. Returns ``[*ids.shape, H]``.

    Raises ValueError naming ``ids`` (not an integer tensor, or a negative id),
    ``E_shard`` (not a 2-D floating tensor, or ``end - start`` rows missing) or
    ``start`` (negative, or not below ``end``).
    """
    raise NotImplementedError("vocab_parallel_embedding: mask ids outside [start, end), look up ids - start (0 when masked), zero masked rows, dist.all_reduce")


class HeadSplit(NamedTuple):
    """Given. Which attention heads one TP rank holds.

    q_heads: the global query-head ids on this rank, ascending;
    kv_heads: the global KV-head ids on this rank, ascending;
    num_kv_head_replicas: how many ranks hold each of those KV heads.
    """

    q_heads: list[int]
    kv_heads: list[int]
    num_kv_head_replicas: int


def qkv_head_split(num_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> HeadSplit:
    """The heads rank ``rank`` of ``tp_size`` owns, by vLLM's ``QKVParallelLinear`` rule.

    Query heads are cut into equal contiguous blocks: ``num_heads / tp_size`` per
    rank. KV heads (grouped-query attention: ``num_kv_heads`` divides
    ``num_heads``) are cut the same way while ``tp_size < num_kv_heads``
    (replicas = 1). When ``tp_size >= num_kv_heads`` every rank holds exactly one
    KV head, ``tp_size / num_kv_heads`` consecutive ranks share it (the
    replicas), and rank ``r`` holds KV head ``r // replicas``.

    Raises ValueError naming ``num_heads`` / ``num_kv_heads`` / ``tp_size``
    (not integers >= 1), ``num_kv_heads`` (not a divisor of ``num_heads``),
    ``tp_size`` (not a divisor of ``num_heads``; when below ``num_kv_heads``,
    not a divisor of it; when at or above, not a multiple of it) or ``rank``
    (outside ``0 .. tp_size - 1``).
    """
    raise NotImplementedError("qkv_head_split: q heads by shard_range; tp_size >= num_kv_heads: one KV head rank // replicas, else shard_range of the KV heads")


if __name__ == "__main__":
    from mini_vllm.distributed import run_in_processes

    def _demo(rank: int, world: int) -> tuple[float, float]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(8, 1024, generator=gen)
        w = torch.randn(1024, 1024, generator=gen)
        start, end = shard_range(1024, rank, world)
        y = RowParallelLinear(w[:, start:end])(x[:, start:end])
        dense = x @ w.T
        return float((y - dense).abs().max()), float(dense.abs().max())

    for world in (2, 4):
        diff, scale = run_in_processes(world, _demo)[0]
        print(f"TP = {world}: row-parallel vs dense, max |diff| {diff:.2e} on outputs up to {scale:.1f}")
