"""Lab 11-01 — Punica in numpy: many LoRA adapters in one batch (your implementation).

A LoRA adapter changes a linear layer ``y = x @ W.T`` into
``y = x @ W.T + scale * (x @ A.T) @ B.T`` with ``A [r, in]`` and ``B [out, r]``
and a small rank ``r``. vLLM serves several adapters, and the base model, in
the *same* batch: every token carries the slot of its adapter, and two batched
kernels apply each token's own ``A`` and ``B``:

* **shrink** ``[T, in] -> [T, r]``: ``buffer[t] = scale * A[slot[t]] @ x[t]``;
* **expand** ``[T, r] -> [T, out]``: ``y[t] += B[slot[t]] @ buffer[t]``.

The names come from Punica: **BGMV** takes one slot per token (any order),
**SGMV** one slot per *segment* of consecutive tokens (a request's prompt).
vLLM stores the adapters of one layer as preallocated stacks, one per output
slice (a fused QKV layer has three)::

    lora_a_stacked[i]   [max_loras, 1, max_lora_rank, in_features]
    lora_b_stacked[i]   [max_loras, 1, output_slices[i], max_lora_rank]

Slot ``s`` of the stacks holds the adapter that the manager put there; an
adapter of rank ``r < max_lora_rank`` fills the first ``r`` rows of ``A`` and
the first ``r`` columns of ``B`` and leaves zeros in the rest. The index ``-1``
means "no adapter": such a token's output must stay exactly the base output.
Python and numpy read ``-1`` as "the last slot"; a kernel that indexes the
stack with it applies the last slot's adapter to a base-model token.

upstream: vllm/lora/ops/torch_ops/lora_ops.py:67 bgmv_shrink
upstream: vllm/lora/ops/torch_ops/lora_ops.py:24 bgmv_expand
upstream: vllm/lora/punica_wrapper/punica_cpu.py:265 add_lora_linear
upstream: vllm/lora/layers/base_linear.py:99 create_lora_weights
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NO_LORA = -1  # the slot index of a token that uses no adapter


# ---------------------------------------------------------------- given helpers


def new_stacks(max_loras: int, max_lora_rank: int, in_features: int,
               output_slices: Sequence[int], dtype=np.float32):
    """Given. Zero stacks for one layer, shaped as vLLM allocates them.

    Returns ``(lora_a_stacked, lora_b_stacked)``, two tuples with one array per
    output slice: ``lora_a_stacked[i]`` is ``[max_loras, 1, max_lora_rank,
    in_features]`` and ``lora_b_stacked[i]`` is ``[max_loras, 1,
    output_slices[i], max_lora_rank]``, all zeros (every slot empty).

    upstream: vllm/lora/layers/base_linear.py:99 create_lora_weights
    """
    for name, value in (("max_loras", max_loras), ("max_lora_rank", max_lora_rank),
                        ("in_features", in_features)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if len(output_slices) == 0 or any(int(s) != s or s < 1 for s in output_slices):
        raise ValueError(f"output_slices must be a non-empty sequence of sizes >= 1, "
                         f"got {output_slices!r}")
    a = tuple(np.zeros((max_loras, 1, max_lora_rank, in_features), dtype)
              for _ in output_slices)
    b = tuple(np.zeros((max_loras, 1, int(size), max_lora_rank), dtype)
              for size in output_slices)
    return a, b


def _float_array(a, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != ndim or arr.dtype.kind != "f":
        raise ValueError(f"{name} must be a {ndim}-D float array, got shape {arr.shape} "
                         f"dtype {arr.dtype}")
    return arr


def _check_stack(w, name: str) -> np.ndarray:
    w = _float_array(w, name, 4)
    if w.shape[1] != 1 or w.shape[0] < 1:
        raise ValueError(f"{name} must be shaped [max_loras >= 1, 1, rows, cols], got {w.shape}")
    return w


def _check_out(output_tensor, name: str = "output_tensor") -> np.ndarray:
    if not isinstance(output_tensor, np.ndarray) or output_tensor.ndim != 2 \
            or output_tensor.dtype.kind != "f":
        raise ValueError(f"{name} must be a 2-D float numpy array (it is written in place)")
    return output_tensor


def _check_indices(idx, num_slots: int, num_tokens: int, name: str) -> np.ndarray:
    idx = np.asarray(idx)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be a 1-D integer array, got shape {idx.shape} "
                         f"dtype {idx.dtype}")
    if idx.shape[0] != num_tokens:
        raise ValueError(f"{name} must hold one index per token ({num_tokens}), got {idx.shape[0]}")
    bad = idx[(idx < NO_LORA) | (idx >= num_slots)]
    if bad.size:
        raise ValueError(f"{name} must hold slot indices in [-1, {num_slots - 1}] "
                         f"(-1 = no LoRA), got {int(bad[0])}")
    return idx.astype(np.int64)


def _check_op(inputs, weights, weights_name: str, output_tensor, lora_indices_tensor):
    """Shared checks of the four kernels. ``weights`` is ``[S, 1, n_out, n_in]``:
    ``inputs`` must be ``[T, n_in]`` and ``output_tensor`` ``[T, n_out]``."""
    w = _check_stack(weights, weights_name)
    out = _check_out(output_tensor)
    x = _float_array(inputs, "inputs", 2)
    if x.shape[1] != w.shape[3]:
        raise ValueError(f"inputs must be [T, {w.shape[3]}] to match {weights_name}, "
                         f"got {x.shape}")
    if out.shape != (x.shape[0], w.shape[2]):
        raise ValueError(f"output_tensor must be [{x.shape[0]}, {w.shape[2]}], got {out.shape}")
    idx = _check_indices(lora_indices_tensor, w.shape[0], x.shape[0], "lora_indices_tensor")
    return x, w, idx


def _check_segments(b_seq_start_loc, seq_len_tensor, lora_indices_tensor, batches,
                    max_seq_length, token_nums, num_tokens: int) -> None:
    """The prefill metadata of vLLM's ``compute_meta``, checked for consistency."""
    lens = np.asarray(seq_len_tensor)
    if lens.ndim != 1 or lens.dtype.kind not in "iu" or lens.size == 0 or (lens < 1).any():
        raise ValueError(f"seq_len_tensor must be a non-empty 1-D array of lengths >= 1, "
                         f"got {lens!r}")
    if batches != lens.shape[0] or np.shape(lora_indices_tensor) != (batches,):
        raise ValueError(f"batches must equal the number of segments ({lens.shape[0]}) and of "
                         f"lora_indices_tensor entries, got {batches}")
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    if np.shape(b_seq_start_loc) != starts.shape or (np.asarray(b_seq_start_loc) != starts).any():
        raise ValueError(f"b_seq_start_loc must be the segments' start rows {starts.tolist()}, "
                         f"got {np.asarray(b_seq_start_loc).tolist()}")
    if token_nums != lens.sum() or token_nums != num_tokens:
        raise ValueError(f"token_nums must equal sum(seq_len_tensor) = {int(lens.sum())} and "
                         f"the rows of inputs ({num_tokens}), got {token_nums}")
    if max_seq_length != lens.max():
        raise ValueError(f"max_seq_length must be max(seq_len_tensor) = {int(lens.max())}, "
                         f"got {max_seq_length}")


def _check_linear(y, x, lora_a_stacked, lora_b_stacked, output_slices):
    """Checks of ``add_lora_linear`` and ``merged_weight``; returns (a, b, slices)."""
    if len(lora_a_stacked) == 0 or len(lora_b_stacked) != len(lora_a_stacked):
        raise ValueError(f"lora_b_stacked must have one stack per lora_a_stacked stack "
                         f"({len(lora_a_stacked)}), got {len(lora_b_stacked)}")
    if len(output_slices) != len(lora_a_stacked):
        raise ValueError(f"output_slices must have one size per slice ({len(lora_a_stacked)}), "
                         f"got {len(output_slices)}")
    a = [_check_stack(s, "lora_a_stacked") for s in lora_a_stacked]
    b = [_check_stack(s, "lora_b_stacked") for s in lora_b_stacked]
    slices = [int(s) for s in output_slices]
    for i, (ai, bi, size) in enumerate(zip(a, b, slices, strict=True)):
        if bi.shape[0] != ai.shape[0] or bi.shape[3] != ai.shape[2] or bi.shape[2] != size:
            raise ValueError(f"lora_b_stacked[{i}] must be [{ai.shape[0]}, 1, {size}, "
                             f"{ai.shape[2]}] to match lora_a_stacked[{i}] and "
                             f"output_slices[{i}], got {bi.shape}")
        if ai.shape[3] != a[0].shape[3] or ai.shape[0] != a[0].shape[0]:
            raise ValueError("lora_a_stacked must share max_loras and in_features across slices")
    if y is not None and y.shape[1] != sum(slices):
        raise ValueError(f"output_slices must sum to the width of y ({y.shape[1]}), "
                         f"got {sum(slices)}")
    if x is not None:
        if x.shape[1] != a[0].shape[3]:
            raise ValueError(f"x must be [T, {a[0].shape[3]}], got {x.shape}")
        if y is not None and y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have one row per row of x ({x.shape[0]}), got {y.shape[0]}")
    return a, b, slices


def _check_adapter(lora_a_stacked, lora_b_stacked, index, lora_a, lora_b) -> None:
    a, b, _ = _check_linear(None, None, lora_a_stacked, lora_b_stacked,
                            [s.shape[2] for s in lora_b_stacked])
    max_loras, max_rank, in_features = a[0].shape[0], a[0].shape[2], a[0].shape[3]
    if int(index) != index or not 0 <= index < max_loras:
        raise ValueError(f"index must be a slot in [0, {max_loras - 1}], got {index!r}")
    if len(lora_a) != len(a) or len(lora_b) != len(b):
        raise ValueError(f"lora_a and lora_b must have one entry per slice ({len(a)}), "
                         f"got {len(lora_a)} and {len(lora_b)}")
    for i, (ai, bi) in enumerate(zip(lora_a, lora_b, strict=True)):
        if (ai is None) != (bi is None):
            raise ValueError(f"lora_a[{i}] and lora_b[{i}] must both be None or both arrays")
        if ai is None:
            continue
        ai, bi = np.asarray(ai), np.asarray(bi)
        if ai.ndim != 2 or not 1 <= ai.shape[0] <= max_rank or ai.shape[1] != in_features:
            raise ValueError(f"lora_a[{i}] must be [r, {in_features}] with 1 <= r <= "
                             f"max_lora_rank = {max_rank}, got {ai.shape}")
        if bi.shape != (b[i].shape[2], ai.shape[0]):
            raise ValueError(f"lora_b[{i}] must be [{b[i].shape[2]}, {ai.shape[0]}], "
                             f"got {bi.shape}")


# ---------------------------------------------------------------- loading a slot


def set_lora(lora_a_stacked, lora_b_stacked, index: int, lora_a, lora_b) -> None:
    """Write one adapter into slot ``index`` of every slice's stacks, in place.

    lora_a, lora_b: one entry per slice. ``lora_a[i]`` is ``[r, in_features]``
    and ``lora_b[i]`` is ``[output_slices[i], r]`` with ``1 <= r <=
    max_lora_rank``; both ``None`` for a slice the adapter does not touch (that
    slice then applies no delta). The slot is first cleared (every slice, all of
    ``max_lora_rank``) and then the adapter's matrices are copied into its top-
    left corner: rows ``0..r-1`` of A, columns ``0..r-1`` of B. Everything else
    in the slot is zero, whatever the slot held before. Other slots are not
    touched.

    Raises ValueError naming ``index`` (not a slot), ``lora_a`` / ``lora_b``
    (wrong count, shapes, rank above max_lora_rank) or the stacks.

    upstream: vllm/lora/layers/column_parallel_linear.py:300 set_lora
    """
    raise NotImplementedError("set_lora: per slice, zero slot `index` of both stacks, then "
                              "copy A into rows :r and B into columns :r")


def lora_ids_to_slots(token_lora_mapping, lora_index_to_id) -> np.ndarray:
    """Per-token adapter ids to per-token slot indices (``-1`` = no adapter).

    token_lora_mapping: one ``lora_int_id`` per token, ``0`` for a token that
    uses the base model (ids of real adapters are >= 1). lora_index_to_id: one
    entry per slot, the id of the adapter loaded there or ``None``. Returns an
    int64 array: the *position* of the token's id in ``lora_index_to_id``, or
    ``-1`` for id 0. An adapter's id is a name; only its slot indexes the stacks.

    Raises ValueError naming ``token_lora_mapping`` for a negative id or an id
    that is in no slot.

    upstream: vllm/lora/punica_wrapper/utils.py:54 convert_mapping
    """
    raise NotImplementedError("lora_ids_to_slots: 0 -> -1; "
                              "any other id -> its index in lora_index_to_id (else ValueError)")


# ---------------------------------------------------------------- the four kernels


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor,
                scaling: float = 1.0) -> None:
    """Shrink, one slot per token: ``output_tensor[t] = scaling * A[s] @ inputs[t]``.

    inputs: float ``[T, in]``. lora_a_weights: ``[max_loras, 1, max_lora_rank,
    in]``. output_tensor: float ``[T, max_lora_rank]``, written in place (its
    old content is replaced, not added to). lora_indices_tensor: int ``[T]``,
    ``s = lora_indices_tensor[t]`` in ``[-1, max_loras - 1]``. A row with
    ``-1`` is written with zeros and never reads the stack. Computed in the
    dtype of ``output_tensor``. Returns None.

    Raises ValueError naming ``lora_a_weights`` (not ``[S, 1, r, in]``),
    ``inputs`` (width), ``output_tensor`` (shape, or not a float numpy array)
    or ``lora_indices_tensor`` (length, dtype, a value outside ``[-1, S-1]``).

    upstream: vllm/lora/ops/torch_ops/lora_ops.py:67 bgmv_shrink
    """
    raise NotImplementedError("bgmv_shrink: check with _check_op; "
                              "rows with index -1 get 0; others: scaling * A[slot, 0] @ x[t]")


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                add_inputs: bool = True) -> None:
    """Expand, one slot per token: ``output_tensor[t] (+)= B[s] @ inputs[t]``.

    inputs: float ``[T, max_lora_rank]`` (a shrink's output). lora_b_weights:
    ``[max_loras, 1, out, max_lora_rank]``. output_tensor: float ``[T, out]``,
    updated in place (it may be a column slice of a wider array: writing into it
    writes into that array). With ``add_inputs`` the product is added to the
    row, without it the row is replaced. A row with index ``-1`` is not written
    at all, in either mode: it keeps its exact bits. Computed in the dtype of
    ``output_tensor``. Returns None.

    Raises ValueError naming ``lora_b_weights``, ``inputs``, ``output_tensor``
    or ``lora_indices_tensor``, as ``bgmv_shrink`` does.

    upstream: vllm/lora/ops/torch_ops/lora_ops.py:24 bgmv_expand
    """
    raise NotImplementedError("bgmv_expand: check with _check_op; "
                              "skip rows with -1; others: (+)= B[slot, 0] @ inputs[t]")


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches: int, max_seq_length: int, token_nums: int,
                scaling: float) -> None:
    """Shrink, one slot per segment of consecutive tokens.

    Segment ``k`` covers rows ``b_seq_start_loc[k] .. b_seq_start_loc[k] +
    seq_len_tensor[k] - 1`` of ``inputs`` and uses slot
    ``lora_indices_tensor[k]`` (``-1`` = no adapter). The metadata must be
    consistent, as vLLM's ``compute_meta`` builds it: ``batches`` segments,
    contiguous from row 0 (``b_seq_start_loc`` is the exclusive prefix sum of
    ``seq_len_tensor``), ``token_nums`` = total rows, ``max_seq_length`` = the
    longest segment. The result equals ``bgmv_shrink`` with each segment's slot
    repeated over its rows. Shapes and errors as ``bgmv_shrink``, plus
    ValueError naming ``seq_len_tensor``, ``batches``, ``b_seq_start_loc``,
    ``token_nums`` or ``max_seq_length`` when the metadata disagree.

    upstream: vllm/lora/ops/torch_ops/lora_ops.py:50 sgmv_shrink
    """
    raise NotImplementedError("sgmv_shrink: check with _check_segments; "
                              "repeat each segment's slot over its rows; call bgmv_shrink")


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches: int, max_seq_length: int, token_nums: int,
                add_inputs: bool = False) -> None:
    """Expand, one slot per segment: ``bgmv_expand`` with each segment's slot
    repeated over its rows. Note the default: ``add_inputs=False`` here (as
    upstream), ``True`` in ``bgmv_expand``. Metadata rules and errors as
    ``sgmv_shrink``; shapes and errors as ``bgmv_expand``.

    upstream: vllm/lora/ops/torch_ops/lora_ops.py:7 sgmv_expand
    """
    raise NotImplementedError("sgmv_expand: check with _check_segments; "
                              "repeat each segment's slot over its rows; call bgmv_expand")


# ---------------------------------------------------------------- a whole layer


def add_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale: float,
                    output_slices, token_lora_indices) -> None:
    """Add every token's LoRA delta to a layer's base output ``y``, in place.

    y: float ``[T, sum(output_slices)]``, the base output ``x @ W.T``. x: float
    ``[T, in]``. lora_a_stacked / lora_b_stacked: one stack per slice, shaped as
    ``new_stacks`` makes them. scale: multiplies the delta once (vLLM passes
    1.0 because its loader has already folded the scaling into B).
    output_slices: the width of each slice; slice ``i`` owns the columns
    ``offset_i .. offset_i + output_slices[i] - 1`` of ``y``, where ``offset_i``
    is the sum of the sizes before it. token_lora_indices: int ``[T]``, a slot
    per token or ``-1``.

    For each slice: shrink ``x`` into a zeroed float32 buffer ``[T,
    max_lora_rank]`` with ``scale``, then expand the buffer into the slice's
    columns of ``y`` with ``add_inputs=True``. Rows with ``-1`` keep the exact
    bits of ``y``. Returns None.

    Raises ValueError naming ``lora_b_stacked`` / ``output_slices`` (counts,
    shapes, or sizes that do not sum to ``y``'s width), ``x`` (not a 2-D float
    array of width in), ``y`` (not a 2-D float numpy array, or a row count
    different from x's), or
    ``lora_indices_tensor`` (from the kernels) for ``token_lora_indices``.

    upstream: vllm/lora/punica_wrapper/punica_cpu.py:265 add_lora_linear
    """
    raise NotImplementedError("add_lora_linear: per slice, bgmv_shrink into a zeroed float32 "
                              "buffer, then bgmv_expand into y[:, off:off + size]")


def merged_weight(base_weight, lora_a_stacked, lora_b_stacked, scale: float,
                  output_slices, slot: int) -> np.ndarray:
    """The weight that slot ``slot``'s adapter amounts to: ``W + scale * B @ A``.

    base_weight: float ``[sum(output_slices), in]`` (torch's ``[out, in]``).
    Returns a new float32 array of the same shape whose rows ``offset_i ..
    offset_i + output_slices[i] - 1`` are ``W[rows] + scale * B_i[slot, 0] @
    A_i[slot, 0]``. ``slot = -1`` returns a float32 copy of ``W``. So
    ``x @ merged_weight(...).T`` equals ``x @ W.T`` followed by
    ``add_lora_linear`` with every token in ``slot``.

    Raises ValueError naming ``base_weight`` (shape), ``slot`` (outside
    ``[-1, max_loras - 1]``), or as ``add_lora_linear`` for the stacks.
    """
    raise NotImplementedError("merged_weight: copy W as float32; "
                              "per slice add scale * B[slot, 0] @ A[slot, 0] to its rows")


# ---------------------------------------------------------------- demo


def _demo() -> None:
    """Two adapters (ids 7 and 3) and a base request in one batch of a QKV layer."""
    rng = np.random.default_rng(0)
    in_features, slices = 16, (8, 4, 4)  # q, k, v under GQA: 2 query heads per KV head
    a_st, b_st = new_stacks(2, 4, in_features, slices)
    for slot, r in ((0, 2), (1, 4)):
        set_lora(a_st, b_st, slot,
                 [rng.standard_normal((r, in_features)).astype(np.float32) for _ in slices],
                 [rng.standard_normal((s, r)).astype(np.float32) for s in slices])
    lora_index_to_id = [7, 3]
    ids = [7, 7, 0, 3, 3, 3]
    slots = lora_ids_to_slots(ids, lora_index_to_id)
    x = rng.standard_normal((len(ids), in_features)).astype(np.float32)
    W = rng.standard_normal((sum(slices), in_features)).astype(np.float32)
    base = x @ W.T
    y = base.copy()
    add_lora_linear(y, x, a_st, b_st, 0.5, slices, slots)
    print(f"lora ids {ids} -> slots {slots.tolist()}")
    for t, s in enumerate(slots.tolist()):
        merged = merged_weight(W, a_st, b_st, 0.5, slices, s)
        err = float(np.abs(x[t] @ merged.T - y[t]).max())
        same = bool(np.array_equal(y[t], base[t]))
        print(f"token {t}  slot {s:2d}  max|delta| {np.abs(y[t] - base[t]).max():6.3f}  "
              f"vs merged {'ok' if err < 1e-4 else 'WRONG'}  bit-equal to base: {same}")


if __name__ == "__main__":
    _demo()
