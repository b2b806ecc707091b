"""Lab 07-01 — the MoE forward, the way fused_moe does it (reference solution).

A mixture-of-experts layer replaces one MLP by ``E`` of them ("experts") and a
router that sends every token to only ``k`` of them. vLLM runs the whole layer
in four steps, and this lab writes each one in numpy:

1. ``route``: a softmax over the router logits of all ``E`` experts, the
   ``k`` largest probabilities, and (for Mixtral and most models) a
   renormalization so that a token's ``k`` weights sum to 1.
2. ``moe_align_block_size``: the ``T * k`` (token, expert) assignments,
   numbered ``slot = t * k + j``, are sorted by expert and each expert's run
   is padded to a multiple of ``block_size`` with the value ``T * k``. Every
   block of the result then belongs to one expert, so one GEMM per block does
   the work, and the padding is recognisable (it is not a real slot).
3. one SwiGLU expert MLP per block: ``(silu(x w1^T) * (x w3^T)) w2^T`` with
   Mixtral's names (``w1`` gate, ``w3`` up, ``w2`` down).
4. ``scatter_back``: every real slot's output, times its routing weight, is
   added to its token's row. A token has ``k`` slots, so ``k`` rows land on
   the same output row: the add must accumulate duplicates.

``moe_forward_reference`` is the same layer as a plain loop over tokens, the
definition the grouped path must reproduce.

upstream: vllm/model_executor/layers/fused_moe/router/fused_topk_router.py:69 fused_topk
upstream: vllm/model_executor/layers/fused_moe/moe_align_block_size.py:11 moe_align_block_size
upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:1664 fused_experts_impl
"""
from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------- given helpers


def _as_matrix(a, name: str) -> np.ndarray:
    """Given. ``a`` as a float32 2-D array (no copy when it already is one).

    Raises ValueError naming ``name`` unless ``a`` is a non-empty 2-D array of
    finite numbers.
    """
    arr = np.asarray(a)
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "fiu" or arr.dtype == bool:
        raise ValueError(f"{name} must be a non-empty 2-D array of numbers, got shape "
                         f"{arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must hold finite numbers (no NaN or inf)")
    return arr


def _positive_int(value, name: str) -> int:
    """Given. ``value`` as an int; ValueError naming ``name`` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_assignments(topk_ids, num_experts: int) -> np.ndarray:
    """Given. ``topk_ids`` as an int64 ``[T, k]`` array of expert ids in ``[0, num_experts)``.

    Raises ValueError naming ``topk_ids`` otherwise.
    """
    ids = np.asarray(topk_ids)
    if ids.ndim != 2 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"topk_ids must be a non-empty 2-D integer array [T, k], got shape "
                         f"{ids.shape} dtype {ids.dtype}")
    if ids.min() < 0 or ids.max() >= num_experts:
        raise ValueError(f"topk_ids must lie in [0, {num_experts - 1}] (num_experts = "
                         f"{num_experts}), got values from {ids.min()} to {ids.max()}")
    return ids.astype(np.int64)


# ---------------------------------------------------------------- 1. routing


def route(router_logits, top_k: int, renormalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Pick each token's ``top_k`` experts and their weights (vLLM's ``fused_topk``).

    router_logits: float ``[T, E]``, one row per token (computed in float32;
    not modified). top_k: an integer in ``[1, E]``.

    Returns ``(topk_weights, topk_ids)``, both ``[T, top_k]``:

    * ``topk_ids`` int32: the ``top_k`` experts with the largest softmax
      probability, largest first; among equal probabilities the lower expert
      id comes first (as upstream's kernel breaks ties). The ``top_k`` ids of
      a row are distinct.
    * ``topk_weights`` float32: those probabilities, where the softmax runs
      over all ``E`` logits of the row. With ``renormalize=True`` they are
      then divided by their sum, so each row sums to 1 (which equals a softmax
      over the ``top_k`` selected logits alone); with ``renormalize=False``
      they stay the plain probabilities and a row sums to less than 1.

    The softmax must not overflow: logits of 1000 are fine.

    Raises ValueError naming ``router_logits`` unless it is a non-empty 2-D
    array of finite numbers, and naming ``top_k`` unless it is an integer in
    ``[1, E]``.
    """
    logits = _as_matrix(router_logits, "router_logits")
    num_experts = logits.shape[1]
    if (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
            or not 1 <= top_k <= num_experts):
        raise ValueError(f"top_k must be an integer in [1, {num_experts}] (the number of "
                         f"experts), got {top_k!r}")
    # Softmax over ALL experts. Subtracting the row maximum first changes nothing
    # mathematically and keeps exp() from overflowing.
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    # Largest first; a stable sort of -probs puts the lower id first on a tie.
    topk_ids = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    topk_weights = np.take_along_axis(probs, topk_ids, axis=1)
    if renormalize:
        # p_i / sum_sel p_j = exp(l_i) / sum_sel exp(l_j): a softmax over the k selected logits.
        topk_weights = topk_weights / topk_weights.sum(axis=1, keepdims=True)
    return topk_weights.astype(np.float32), topk_ids.astype(np.int32)


# ---------------------------------------------------------------- 2. sort and pad


def moe_align_block_size(topk_ids, block_size: int,
                         num_experts: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Sort the ``T * k`` assignments by expert and pad each expert to whole blocks.

    topk_ids: integer ``[T, k]``, every value in ``[0, num_experts)``. The
    assignment ``topk_ids[t, j]`` is *slot* ``t * k + j`` (row-major, the
    order of ``topk_ids.ravel()``). block_size, num_experts: integers >= 1.

    Returns ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``:

    * ``num_tokens_post_padded`` (int): the sum over experts of their slot
      count rounded up to a multiple of ``block_size``; an expert with no
      slot contributes 0 (it gets no block).
    * ``sorted_token_ids`` int32 ``[num_tokens_post_padded]``: expert 0's
      slots, then expert 1's, and so on; inside one expert the slots are in
      increasing order; each expert's run is followed by copies of the
      padding value ``T * k`` (``topk_ids.size``, never a real slot) up to the
      next multiple of ``block_size``.
    * ``expert_ids`` int32 ``[num_tokens_post_padded // block_size]``: the
      expert that owns each block of ``sorted_token_ids``.

    Raises ValueError naming ``topk_ids`` (not a non-empty 2-D integer array,
    or a value outside ``[0, num_experts)``), ``block_size`` or
    ``num_experts`` (not an integer >= 1).
    """
    block_size = _positive_int(block_size, "block_size")
    num_experts = _positive_int(num_experts, "num_experts")
    ids = _check_assignments(topk_ids, num_experts)
    flat = ids.ravel()  # flat[slot] is the expert of slot = t * k + j
    numel = flat.size
    # A stable sort keeps the slots of one expert in increasing order.
    slots_by_expert = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    padded = -(-counts // block_size) * block_size  # ceil to a block; 0 stays 0
    total = int(padded.sum())
    sorted_token_ids = np.full(total, numel, dtype=np.int32)
    src = dst = 0
    for e in range(num_experts):
        n = int(counts[e])
        sorted_token_ids[dst:dst + n] = slots_by_expert[src:src + n]
        src += n
        dst += int(padded[e])
    expert_ids = np.repeat(np.arange(num_experts, dtype=np.int32), padded // block_size)
    return sorted_token_ids, expert_ids, total


# ---------------------------------------------------------------- 3. one expert


def expert_mlp(x, w1, w2, w3) -> np.ndarray:
    """One SwiGLU expert, Mixtral's naming: ``(silu(x w1^T) * (x w3^T)) w2^T``.

    x: float ``[n, H]``. w1 (gate) and w3 (up): float ``[I, H]``. w2 (down):
    float ``[H, I]``. ``silu(g) = g * sigmoid(g)``. Returns float32 ``[n, H]``;
    a row of zeros in ``x`` gives a row of zeros (no biases). Nothing is
    modified.

    Raises ValueError naming ``x`` unless it is a non-empty 2-D array of
    finite numbers, naming ``w1`` unless it is ``[I, H]`` with ``H`` the width
    of ``x``, naming ``w3`` unless its shape equals ``w1``'s, and naming ``w2``
    unless it is ``[H, I]``.
    """
    x = _as_matrix(x, "x")
    w1 = _as_matrix(w1, "w1")
    if w1.shape[1] != x.shape[1]:
        raise ValueError(f"w1 must be [I, {x.shape[1]}] (H = the width of x), got {w1.shape}")
    w3 = _as_matrix(w3, "w3")
    if w3.shape != w1.shape:
        raise ValueError(f"w3 must have w1's shape {w1.shape}, got {w3.shape}")
    w2 = _as_matrix(w2, "w2")
    if w2.shape != (w1.shape[1], w1.shape[0]):
        raise ValueError(f"w2 must be [H, I] = {(w1.shape[1], w1.shape[0])}, got {w2.shape}")
    gate = x @ w1.T
    up = x @ w3.T
    # sigmoid(g) = (1 + tanh(g / 2)) / 2 never overflows, unlike 1 / (1 + exp(-g)).
    silu = gate * (np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * gate)))
    return ((silu * up) @ w2.T).astype(np.float32)


def _check_forward_inputs(x, experts, topk_ids, topk_weights):
    """Given. The shared checks of the two forwards; returns (x, ids, weights)."""
    x = _as_matrix(x, "x")
    if not isinstance(experts, (list, tuple)) or len(experts) == 0 or not all(
            isinstance(e, (list, tuple)) and len(e) == 3 for e in experts):
        raise ValueError("experts must be a non-empty list of (w1, w2, w3) triples")
    ids = _check_assignments(topk_ids, len(experts))
    if ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids must have one row per token ({x.shape[0]}), got {ids.shape}")
    weights = _as_matrix(topk_weights, "topk_weights")
    if weights.shape != ids.shape:
        raise ValueError(f"topk_weights must have topk_ids' shape {ids.shape}, got {weights.shape}")
    return x, ids, weights


# ---------------------------------------------------------------- 4. the layer, two ways


def moe_forward_reference(x, experts, topk_ids, topk_weights) -> np.ndarray:
    """The MoE layer by its definition, one token at a time.

    ``out[t] = sum_j topk_weights[t, j] * expert_mlp(x[t], *experts[topk_ids[t, j]])``

    x: float ``[T, H]``. experts: a list of ``E`` triples ``(w1, w2, w3)`` as
    ``expert_mlp`` takes them. topk_ids: integer ``[T, k]`` in ``[0, E)``.
    topk_weights: float ``[T, k]``. Returns float32 ``[T, H]``.

    Raises ValueError naming ``x``, ``experts`` (not a non-empty list of
    triples), ``topk_ids`` (not ``[T, k]`` integers in range) or
    ``topk_weights`` (not finite numbers of ``topk_ids``' shape).
    """
    x, ids, weights = _check_forward_inputs(x, experts, topk_ids, topk_weights)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            w1, w2, w3 = experts[ids[t, j]]
            out[t] += weights[t, j] * expert_mlp(x[t:t + 1], w1, w2, w3)[0]
    return out


def scatter_back(expert_out, sorted_token_ids, topk_weights) -> np.ndarray:
    """Weighted un-permute: each real slot's row, times its weight, into its token's row.

    expert_out: float ``[P, H]``, row ``r`` the expert output for the slot
    ``sorted_token_ids[r]``. sorted_token_ids: integer ``[P]``, values in
    ``[0, T * k]``, where ``T * k`` marks padding. topk_weights: float
    ``[T, k]`` (``T`` and ``k`` come from its shape).

    Returns float32 ``[T, H]``: ``out[s // k] += topk_weights.flat[s] *
    expert_out[r]`` for every row ``r`` whose slot ``s`` is real; padding
    rows are ignored whatever they hold. A token's ``k`` slots all land on
    its one output row, and every one of them must count.

    Raises ValueError naming ``expert_out`` (not a 2-D array of finite
    numbers with one row per id), ``sorted_token_ids`` (not a 1-D integer
    array with values in ``[0, T * k]``) or ``topk_weights``.
    """
    weights = _as_matrix(topk_weights, "topk_weights")
    num_tokens, top_k = weights.shape
    ids = np.asarray(sorted_token_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"sorted_token_ids must be a 1-D integer array, got shape {ids.shape} "
                         f"dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() > weights.size):
        raise ValueError(f"sorted_token_ids must lie in [0, {weights.size}] ({weights.size} "
                         f"marks padding), got values from {ids.min()} to {ids.max()}")
    rows = np.asarray(expert_out, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[0] != ids.size or not np.isfinite(rows).all():
        raise ValueError(f"expert_out must be [{ids.size}, H] finite numbers (one row per "
                         f"sorted id), got shape {rows.shape}")
    out = np.zeros((num_tokens, rows.shape[1]), dtype=np.float32)
    real = ids < weights.size
    slots = ids[real].astype(np.int64)
    contrib = rows[real] * weights.ravel()[slots][:, None]
    # out[slots // top_k] += contrib would be wrong: numpy's fancy-index += reads
    # every target row once and writes once, so of a token's k rows only the
    # last survives. np.add.at accumulates duplicates.
    np.add.at(out, slots // top_k, contrib)
    return out


def moe_forward_grouped(x, experts, topk_ids, topk_weights, block_size: int = 16) -> np.ndarray:
    """The MoE layer the way ``fused_experts`` runs it: align, one GEMM per block, scatter back.

    Same arguments and result as ``moe_forward_reference``, plus
    ``block_size`` (an integer >= 1). Steps:

    1. ``moe_align_block_size(topk_ids, block_size, len(experts))``.
    2. For every block ``b`` of ``sorted_token_ids`` (in order), exactly one
       call ``expert_mlp(rows, *experts[expert_ids[b]])`` where ``rows`` is
       ``[block_size, H]``: row ``i`` is ``x[s // k]`` for a real slot ``s``
       (slot ``s`` belongs to token ``s // k``) and zeros for padding.
    3. ``scatter_back`` of all the blocks' outputs.

    Equals ``moe_forward_reference`` to float32 rounding. Raises ValueError
    as ``moe_forward_reference`` does, and naming ``block_size``.
    """
    x, ids, weights = _check_forward_inputs(x, experts, topk_ids, topk_weights)
    num_tokens, top_k = ids.shape
    # moe_align_block_size checks block_size (and raises naming it) before it is used.
    sorted_ids, expert_ids, total = moe_align_block_size(ids, block_size, len(experts))
    block_out = np.zeros((total, x.shape[1]), dtype=np.float32)
    for b, e in enumerate(expert_ids):
        block = sorted_ids[b * block_size:(b + 1) * block_size]
        real = block < num_tokens * top_k
        rows = np.zeros((block_size, x.shape[1]), dtype=np.float32)
        # The kernel's masked load: a padded row reads zeros (other=0), never x[T].
        rows[real] = x[block[real] // top_k]
        w1, w2, w3 = experts[e]
        block_out[b * block_size:(b + 1) * block_size] = expert_mlp(rows, w1, w2, w3)
    return scatter_back(block_out, sorted_ids, weights)


if __name__ == "__main__":
    example = np.array([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]])
    sorted_ids, expert_ids, total = moe_align_block_size(example, 4, 5)
    for b, e in enumerate(expert_ids.tolist()):
        print(f"block {b}: expert {e}, sorted ids {sorted_ids[4 * b:4 * b + 4].tolist()}")
    print("num_tokens_post_padded:", total)
    rng = np.random.default_rng(0)
    T, H, inter, E, k = 8, 16, 32, 4, 2
    x = rng.standard_normal((T, H)).astype(np.float32)
    experts = [tuple((rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32)
                     for s in ((inter, H), (H, inter), (inter, H))) for _ in range(E)]
    w, ids = route(x @ rng.standard_normal((E, H)).astype(np.float32).T, k)
    ref = moe_forward_reference(x, experts, ids, w)
    grouped = moe_forward_grouped(x, experts, ids, w, block_size=4)
    print(f"T={T} k={k} E={E}: grouped vs reference max |diff| = {np.abs(grouped - ref).max():.2e}")
