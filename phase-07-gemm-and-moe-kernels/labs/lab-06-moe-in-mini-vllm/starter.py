"""Lab 07-06 — your MoE layer inside mini_vllm (your file).

Lab 01 built the MoE forward from four steps (route, align, one expert GEMM
per block, weighted scatter back) over a list of ``(w1, w2, w3)`` experts.
An engine does not hold experts that way. mini_vllm's Mixtral, like vLLM's
``FusedMoE``, keeps each layer's experts as two stacked tensors:

* ``w13`` ``[E, 2 * I, H]``: for expert ``e``, rows ``0 .. I-1`` are the gate
  projection (Mixtral's ``w1``) and rows ``I .. 2I-1`` the up projection
  (``w3``), so one GEMM computes both;
* ``w2`` ``[E, H, I]``: the down projection;

and a router ``[H, E]`` (``x @ router`` gives the logits). This lab rewrites
the forward for that layout as ``fused_experts`` (the name and argument order
of vLLM's function), wraps it in ``LearnerMoE``, a layer with the call
interface mini_vllm's decoder uses (``layer(x) -> [T, H]`` and a
``last_expert_loads`` histogram), and ``install_moe`` swaps it into every MoE
layer of a loaded model. The engine then serves ``tiny-moe`` and a Mixtral
checkpoint written by transformers through your code and nothing else; the
per-step expert histogram the engine reports (``StepStats.expert_loads``) is
the one your layer counts.

Slots, as in lab 01: the assignment ``topk_ids[t, j]`` is slot ``t * k + j``;
its token is ``slot // k``; ``T * k`` is the padding value.

upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:1587 fused_experts
upstream: vllm/model_executor/layers/fused_moe/layer.py:73 FusedMoE
upstream: vllm/model_executor/models/mixtral.py:77 MixtralMoE
"""
from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------- given helpers


def _as_array(a, name: str, ndim: int) -> np.ndarray:
    """Given. ``a`` as a float32 array of ``ndim`` dimensions (no copy when it already is one).

    Raises ValueError naming ``name`` unless ``a`` is a non-empty ``ndim``-D
    array of finite numbers.
    """
    arr = np.asarray(a)
    if arr.ndim != ndim or arr.size == 0 or arr.dtype.kind not in "fiu" or arr.dtype == bool:
        raise ValueError(f"{name} must be a non-empty {ndim}-D array of numbers, got shape "
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


def _check_expert_weights(w13, w2, hidden: int, stacked: bool) -> tuple[np.ndarray, np.ndarray]:
    """Given. One expert (``stacked=False``: ``w13 [2I, H]``, ``w2 [H, I]``) or a
    layer's experts (``stacked=True``: ``w13 [E, 2I, H]``, ``w2 [E, H, I]``),
    as float32 arrays.

    Raises ValueError naming ``w13`` unless its last dimension is ``hidden``
    and the one before it is even (gate rows, then as many up rows), and
    naming ``w2`` unless it is ``[H, I]`` (``[E, H, I]``) to match.
    """
    lead = 1 if stacked else 0
    w13 = _as_array(w13, "w13", 2 + lead)
    want13 = "[E, 2*I, H]" if stacked else "[2*I, H]"
    if w13.shape[-1] != hidden or w13.shape[-2] % 2:
        raise ValueError(f"w13 must be {want13} with H = {hidden} (the width of x) and an even "
                         f"number of gate + up rows, got {w13.shape}")
    w2 = _as_array(w2, "w2", 2 + lead)
    want2 = w13.shape[:lead] + (hidden, w13.shape[-2] // 2)
    if w2.shape != want2:
        raise ValueError(f"w2 must be {'[E, H, I]' if stacked else '[H, I]'} = {want2} to match "
                         f"w13 {w13.shape}, got {w2.shape}")
    return w13, w2


# ---------------------------------------------------------------- 1. routing and alignment (lab 01)


def route(router_logits, top_k: int, renormalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each token's ``top_k`` experts and their weights, as lab 01's ``route`` (vLLM's ``fused_topk``).

    router_logits: float ``[T, E]`` (not modified). top_k: an integer in ``[1, E]``.

    Returns ``(topk_weights float32 [T, top_k], topk_ids int32 [T, top_k])``:
    the ``top_k`` largest softmax probabilities (softmax over all ``E``
    logits), largest first, ties to the lower expert id; with
    ``renormalize=True`` the weights of a row are divided by their sum (each
    row sums to 1), with ``False`` they stay the plain probabilities. Logits
    of 1000 must not overflow.

    Raises ValueError naming ``router_logits`` (not a non-empty 2-D array of
    finite numbers) or ``top_k`` (not an integer in ``[1, E]``).
    """
    raise NotImplementedError("route: copy lab 01's route (softmax, stable top-k, optional renormalize)")


def moe_align_block_size(topk_ids, block_size: int,
                         num_experts: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Slots sorted by expert, each expert padded to whole blocks, as lab 01's version.

    topk_ids: integer ``[T, k]`` in ``[0, num_experts)``; slot ``t * k + j``
    is ``topk_ids[t, j]``. block_size, num_experts: integers >= 1.

    Returns ``(sorted_token_ids int32 [P], expert_ids int32 [P // block_size], P)``:
    expert 0's slots in increasing order, then expert 1's, ...; each expert's
    run is followed by the padding value ``T * k`` up to the next multiple of
    ``block_size``; an expert with no slot gets no block; ``expert_ids[b]``
    owns block ``b``.

    Raises ValueError naming ``topk_ids``, ``block_size`` or ``num_experts``.
    """
    raise NotImplementedError("moe_align_block_size: copy lab 01's version (stable sort, pad each expert with T * k)")


# ---------------------------------------------------------------- 2. the stacked layout


def expert_mlp(x, w13, w2) -> np.ndarray:
    """One SwiGLU expert in the fused layout: ``(silu(x G^T) * (x U^T)) w2^T``.

    x: float ``[n, H]``. w13: float ``[2I, H]``, gate rows ``G = w13[:I]``
    then up rows ``U = w13[I:]`` (Mixtral's ``w1`` stacked over ``w3``).
    w2: float ``[H, I]``. ``silu(g) = g * sigmoid(g)``, with no overflow for
    large ``|g|``. Returns float32 ``[n, H]``. Nothing is modified.

    Raises ValueError naming ``x`` (not a non-empty 2-D array of finite
    numbers), ``w13`` (not ``[2I, H]`` with ``H`` the width of ``x``) or
    ``w2`` (not ``[H, I]``).
    """
    raise NotImplementedError("expert_mlp: one GEMM with w13, split gate | up, silu(gate) * up, then w2")


def fused_experts(x, w13, w2, topk_weights, topk_ids, block_size: int = 16) -> np.ndarray:
    """The MoE output for routed tokens, the way vLLM's ``fused_experts`` computes it.

    x: float ``[T, H]``. w13: float ``[E, 2I, H]`` and w2: float ``[E, H, I]``
    (``expert_mlp``'s layout, one slice per expert). topk_weights: float
    ``[T, k]``. topk_ids: integer ``[T, k]`` in ``[0, E)``. block_size: an
    integer >= 1.

    Steps: ``moe_align_block_size(topk_ids, block_size, E)``; for every block
    ``b``, one ``expert_mlp`` call with expert ``expert_ids[b]`` on the rows
    ``x[s // k]`` of the block's real slots ``s`` (padding, ``s == T * k``,
    is never used as an index); each result row times its slot's weight
    ``topk_weights.flat[s]``, added into output row ``s // k``. A token's
    ``k`` rows all land on its one output row and every one must count.

    Returns float32 ``[T, H]``, equal to
    ``sum_j topk_weights[t, j] * expert_mlp(x[t], w13[e], w2[e])`` with
    ``e = topk_ids[t, j]`` to float32 rounding. Nothing is modified.

    Raises ValueError naming ``x``, ``w13``, ``w2`` (as ``expert_mlp``, with a
    leading ``E``), ``topk_ids`` (not ``[T, k]`` integers in ``[0, E)``, one
    row per token of ``x``), ``topk_weights`` (not finite numbers of
    ``topk_ids``' shape) or ``block_size``.
    """
    raise NotImplementedError("fused_experts: align, then per block: real slots, tokens s // k, weighted np.add.at")


def count_expert_loads(topk_ids, num_experts: int) -> np.ndarray:
    """How many slots each expert received: int64 ``[num_experts]``.

    topk_ids: integer ``[T, k]`` in ``[0, num_experts)``. The result sums to
    ``T * k`` (every slot counted once); with distinct top-k ids no entry
    exceeds ``T``. Padding plays no part: this counts routing decisions, not
    the rows a kernel multiplies.

    Raises ValueError naming ``num_experts`` (not an integer >= 1) or
    ``topk_ids``.
    """
    raise NotImplementedError("count_expert_loads: one count per slot, never per token or per padded row")


# ---------------------------------------------------------------- 3. the layer and the plug


class LearnerMoE:
    """A MoE MLP with mini_vllm's ``FusedMoE`` call interface, computed by this file.

    ``layer(x)`` maps the post-attention hidden rows ``[T, H]`` of one step to
    the MLP output ``[T, H]`` and leaves ``last_expert_loads`` (int64 ``[E]``)
    for the model to copy into ``StepStats.expert_loads``. It also counts its
    own work (``num_calls``, ``num_tokens``) so that a test can see it ran.
    """

    def __init__(self, router, w13, w2, top_k: int, renormalize: bool = True,
                 block_size: int = 16) -> None:
        """Given. router ``[H, E]``, w13 ``[E, 2I, H]``, w2 ``[E, H, I]`` (kept, not copied).

        Raises ValueError naming ``w13``/``w2`` (see ``fused_experts``),
        ``router`` (not ``[H, E]`` for the experts' ``H`` and ``E``),
        ``top_k`` (not an integer in ``[1, E]``) or ``block_size``.
        """
        w13 = np.asarray(w13)
        hidden = w13.shape[-1] if w13.ndim == 3 else -1
        self.w13, self.w2 = _check_expert_weights(w13, w2, hidden, stacked=True)
        self.num_experts = self.w13.shape[0]
        self.router = _as_array(router, "router", 2)
        if self.router.shape != (hidden, self.num_experts):
            raise ValueError(f"router must be [H, E] = {(hidden, self.num_experts)}, got "
                             f"{self.router.shape}")
        if (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                or not 1 <= top_k <= self.num_experts):
            raise ValueError(f"top_k must be an integer in [1, {self.num_experts}], got {top_k!r}")
        self.top_k = int(top_k)
        self.renormalize = bool(renormalize)
        self.block_size = _positive_int(block_size, "block_size")
        self.last_expert_loads = np.zeros(self.num_experts, dtype=np.int64)
        self.num_calls = 0  # forward calls so far
        self.num_tokens = 0  # rows of x seen so far, all calls

    def __call__(self, x) -> np.ndarray:
        """One forward: route ``x @ router``, record the loads, run ``fused_experts``.

        x: float ``[T, H]``. Returns float32 ``[T, H]``. Afterwards
        ``last_expert_loads`` holds ``count_expert_loads`` of this call's
        routing (it sums to ``T * top_k``), ``num_calls`` has grown by 1 and
        ``num_tokens`` by ``T``. Routing uses this layer's ``top_k`` and
        ``renormalize``; the experts run with its ``block_size``.

        Raises ValueError naming ``x`` unless it is a non-empty 2-D array of
        finite numbers of width ``H``.
        """
        raise NotImplementedError("LearnerMoE.__call__: route x @ router, record loads and counters, run fused_experts")


def install_moe(model) -> list[LearnerMoE]:
    """Replace the MoE of every MoE layer of a mini_vllm model by a ``LearnerMoE``.

    model: a loaded mini_vllm transformer (``engine.model`` or ``get_model(...)``),
    whose ``model.linears[i].moe`` is a layer with attributes ``router``,
    ``w13``, ``w2``, ``top_k``, ``renormalize`` and ``block_size`` (mini_vllm's
    ``FusedMoE``, or a ``LearnerMoE`` already installed), or None in a dense
    layer. Each such layer's ``moe`` becomes a ``LearnerMoE`` built from those
    six attributes (the weight arrays are shared, not copied); dense layers
    are left alone; nothing else of the model changes.

    Returns the new layers in layer order.

    Raises ValueError naming ``model`` when it has no ``linears`` or no layer
    with a MoE (a dense model).
    """
    raise NotImplementedError("install_moe: swap each layer's model.linears[i].moe for a LearnerMoE")


if __name__ == "__main__":
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    prompts = [{"prompt_token_ids": list(range(40, 61)) + [n]} for n in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    stock = LLMEngine("tiny-moe", block_size=4, num_blocks=64, max_num_batched_tokens=16)
    want = [list(r.output_token_ids) for r in stock.generate(prompts, params)]
    engine = LLMEngine("tiny-moe", block_size=4, num_blocks=64, max_num_batched_tokens=16)
    layers = install_moe(engine.model)
    got = [list(r.output_token_ids) for r in engine.generate(prompts, params)]
    print("stock  :", want)
    print("learner:", got)
    print("same tokens:", got == want)
    for s in engine.stats[:3]:
        tokens = sum(s.num_scheduled_tokens.values())
        print(f"step {s.step}: {tokens:2d} tokens, expert loads per layer {list(s.expert_loads)}")
    print("calls per layer:", [m.num_calls for m in layers],
          "tokens per layer:", [m.num_tokens for m in layers])
