"""A sparse mixture-of-experts MLP in numpy, computed the way vLLM's fused_moe computes it.

A MoE layer replaces one MLP by ``E`` expert MLPs and a router. For each token
the router scores every expert, the ``top_k`` best are kept, and the token's
output is the weighted sum of those experts' outputs. vLLM never runs the
experts token by token. It works on *slots*, one per (token, choice) pair,
``T * top_k`` of them numbered ``t * top_k + j``:

1. **Route** (``fused_topk``): softmax over all experts, keep the ``top_k``
   largest (ties to the lower expert id), optionally renormalize the kept
   weights to sum to 1 (Mixtral does; some models do not).
2. **Align** (``moe_align_block_size``): sort the slots by expert, stable,
   and pad each expert's run to a multiple of ``block_size`` with the value
   ``T * top_k`` (a slot id that does not exist), so that every block of
   ``block_size`` slots belongs to one expert. ``expert_ids[b]`` names block
   ``b``'s expert. Experts with no slot get no block.
3. **Compute** (``fused_experts``): for each block, gather the rows of its
   slots' tokens, run that expert's SwiGLU MLP, scale each row by its slot's
   weight; vLLM's Triton kernel does one block per program.
4. **Combine**: add each slot's row into its token's output. A token appears
   at most once per expert (top-k picks distinct experts), but ``top_k`` times
   in all, so the sum over slots must accumulate (``np.add.at``), never
   assign.

Weights use vLLM's ``FusedMoE`` layout: ``w13`` ``[E, 2 * I, H]`` (gate rows
then up rows, Mixtral's ``w1`` and ``w3``) and ``w2`` ``[E, H, I]``; the router
is ``[H, E]`` here (``x @ W``, mini_vllm's layout for every matmul).

upstream: vllm/model_executor/layers/fused_moe/router/fused_topk_router.py:69 fused_topk
upstream: vllm/model_executor/layers/fused_moe/moe_align_block_size.py:11 moe_align_block_size
upstream: vllm/model_executor/layers/fused_moe/fused_moe.py:1587 fused_experts
upstream: vllm/model_executor/layers/fused_moe/layer.py:73 FusedMoE
"""
from __future__ import annotations

import numpy as np

from mini_vllm.models.llama import silu


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low \
            or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def fused_topk(router_logits: np.ndarray, top_k: int,
               renormalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """router_logits [T, E] -> (topk_weights float32 [T, k], topk_ids int64 [T, k]), best first."""
    logits = np.asarray(router_logits)
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"router_logits must be [num_tokens, num_experts], got shape {logits.shape}")
    top_k = _check_int("top_k", top_k, 1, logits.shape[1])
    z = logits.astype(np.float32)
    z = z - z.max(axis=1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=1, keepdims=True)
    # A stable sort of -p keeps the lower expert id first among equal probabilities.
    topk_ids = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    topk_weights = np.take_along_axis(probs, topk_ids, axis=1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(axis=1, keepdims=True)
    return topk_weights.astype(np.float32), topk_ids.astype(np.int64)


def moe_align_block_size(topk_ids: np.ndarray, block_size: int,
                         num_experts: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted_token_ids [P], expert_ids [P / block_size], num_tokens_post_padded = P).

    ``sorted_token_ids`` lists slot ids (``t * top_k + j``) grouped by expert,
    in slot order inside an expert, each group padded to a multiple of
    ``block_size`` with ``topk_ids.size``; upstream allocates worst-case
    buffers and returns the used length, this returns exactly the used part.
    """
    ids = np.asarray(topk_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"topk_ids must be an integer [num_tokens, top_k] array, got "
                         f"{ids.dtype} {ids.shape}")
    block_size = _check_int("block_size", block_size, 1)
    num_experts = _check_int("num_experts", num_experts, 1)
    flat = ids.ravel()
    if flat.size and (flat.min() < 0 or flat.max() >= num_experts):
        raise ValueError(f"topk_ids must lie in [0, {num_experts}) (num_experts), got "
                         f"[{flat.min()}, {flat.max()}]")
    pad = flat.size
    sorted_ids, expert_ids = [], []
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    start = 0
    for e in range(num_experts):
        c = int(counts[e])
        if c == 0:
            continue
        blocks = -(-c // block_size)
        sorted_ids.append(order[start:start + c])
        sorted_ids.append(np.full(blocks * block_size - c, pad, dtype=np.int64))
        expert_ids += [e] * blocks
        start += c
    sorted_token_ids = (np.concatenate(sorted_ids).astype(np.int64) if sorted_ids
                        else np.zeros(0, dtype=np.int64))
    return sorted_token_ids, np.asarray(expert_ids, dtype=np.int64), int(sorted_token_ids.size)


def expert_mlp(x: np.ndarray, w13: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """One expert's SwiGLU: x [n, H], w13 [2I, H] (gate rows, then up rows), w2 [H, I] -> [n, H]."""
    inter = w2.shape[1]
    gate_up = x @ w13.T
    act = silu(gate_up[:, :inter])
    act *= gate_up[:, inter:]
    return act @ w2.T


def fused_experts(x: np.ndarray, w13: np.ndarray, w2: np.ndarray, topk_weights: np.ndarray,
                  topk_ids: np.ndarray, block_size: int = 16) -> np.ndarray:
    """The MoE output [T, H]: align the slots, run each block's expert, add weighted rows back."""
    num_tokens, top_k = topk_ids.shape
    num_experts = w13.shape[0]
    if x.shape[0] != num_tokens or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"x [{x.shape[0]}, H], topk_weights {topk_weights.shape} and topk_ids "
                         f"{topk_ids.shape} must agree on the number of tokens and top_k")
    sorted_ids, expert_ids, _ = moe_align_block_size(topk_ids, block_size, num_experts)
    out = np.zeros_like(x)
    weights = topk_weights.ravel()
    # One expert's blocks are contiguous, so run each expert once on all of its slots.
    blocks = sorted_ids.reshape(-1, block_size)
    for e in np.unique(expert_ids).tolist():
        slots = blocks[expert_ids == e].ravel()
        slots = slots[slots < num_tokens * top_k]  # drop the padding
        tokens = slots // top_k
        y = expert_mlp(x[tokens], w13[e], w2[e]) * weights[slots, None]
        np.add.at(out, tokens, y)
    return out


class FusedMoE:
    """A MoE MLP: router ``[H, E]``, experts ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``."""

    def __init__(self, router: np.ndarray, w13: np.ndarray, w2: np.ndarray, top_k: int,
                 renormalize: bool = True, block_size: int = 16) -> None:
        num_experts, two_inter, hidden = w13.shape
        if router.shape != (hidden, num_experts) or w2.shape != (num_experts, hidden, two_inter // 2) \
                or two_inter % 2:
            raise ValueError(f"expected router [H, E], w13 [E, 2I, H], w2 [E, H, I]; got "
                             f"{router.shape}, {w13.shape}, {w2.shape}")
        self.router, self.w13, self.w2 = router, w13, w2
        self.top_k = _check_int("top_k", top_k, 1, num_experts)
        self.renormalize = renormalize
        self.block_size = _check_int("block_size", block_size, 1)
        self.num_experts = num_experts
        self.last_expert_loads = np.zeros(num_experts, dtype=np.int64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        topk_weights, topk_ids = fused_topk(x @ self.router, self.top_k, self.renormalize)
        self.last_expert_loads = np.bincount(topk_ids.ravel(), minlength=self.num_experts)
        return fused_experts(x, self.w13, self.w2, topk_weights, topk_ids, self.block_size)
