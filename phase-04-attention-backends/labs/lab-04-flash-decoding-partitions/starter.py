"""Lab 04-04 — flash-decoding: split the keys, merge by log-sum-exp (your implementation).

A decode step has one query row per request, so a kernel that gives each
(request, head) pair one thread block leaves most of a large GPU idle while
that block walks a long context alone. Flash-decoding cuts the keys of each
context into partitions, lets one thread block attend to each partition, and
combines the pieces in a second, cheap step. The combination is exact, not an
approximation, provided each piece carries two things:

* its **normalized** partial output, ``softmax(scores_part) @ V_part``;
* its **log-sum-exp** ``lse = log(sum(exp(scores_part)))``, the logarithm of
  the softmax denominator it divided by.

Two pieces ``a`` and ``b`` then merge as

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

computed against ``max(lse_a, lse_b)`` so that no exponent is positive. A piece
with no keys has ``lse = -inf`` and weight 0, and the merge must produce that 0
without ever evaluating ``-inf - (-inf)``.

The functions, in the order you write them:

* ``partition_bounds`` — where the cuts go: fixed-size partitions of
  ``ceil(num_keys / num_partitions)`` keys, the trailing ones possibly short
  or empty (the rule of the Triton kernel's segments, with tiles of one key);
* ``attend_partial`` — attention of query rows over one key range, returning
  ``(out, lse)`` in vLLM's shapes;
* ``merge_attn_states`` — vLLM's merge, with its shapes, its ``+inf`` rule and
  its ``prefill_tokens_with_context`` copy rule;
* ``partitioned_attention`` — the three together: split, attend, merge.

Shapes follow vLLM: outputs ``[num_tokens, num_heads, head_dim]``, LSEs
``[num_heads, num_tokens]``; keys and values ``[num_keys, num_kv_heads,
head_dim]``, query head ``h`` reading KV head ``h // (num_heads //
num_kv_heads)``. Everything is computed in float64.

upstream: vllm/v1/attention/ops/merge_attn_states.py:9 merge_attn_states
upstream: vllm/v1/attention/ops/triton_merge_attn_states.py:126-127 p_lse
upstream: csrc/attention/merge_attn_states.cu:109 max_lse
upstream: csrc/attention/attention_kernels.cuh:529 paged_attention_v2_kernel
upstream: vllm/v1/attention/ops/triton_unified_attention.py:646 reduce_segments
"""
from __future__ import annotations

import numpy as np


def partition_bounds(num_keys: int, num_partitions: int) -> list[tuple[int, int]]:
    """Half-open key ranges ``[(start, stop), ...]``, one per partition, in order.

    Every partition but the trailing ones holds exactly
    ``size = ceil(num_keys / num_partitions)`` keys: partition ``i`` covers
    ``[min(i * size, num_keys), min((i + 1) * size, num_keys))``. The ranges
    are contiguous, start at 0, end at ``num_keys`` and cover every key once;
    when ``num_keys`` is not a multiple of ``size`` the last non-empty range is
    short, and the ranges after it are empty (``start == stop == num_keys``).
    Examples: 10 keys in 4 partitions give sizes 3, 3, 3, 1; 10 keys in 7 give
    2, 2, 2, 2, 2, 0, 0; 0 keys give only empty ranges.

    Raises ValueError naming ``num_keys`` when it is not an integer >= 0 and
    ``num_partitions`` when it is not an integer >= 1.

    upstream: vllm/v1/attention/ops/triton_unified_attention.py:302-303 tiles_per_segment
    """
    raise NotImplementedError("partition_bounds: fixed size ceil(num_keys / num_partitions), clipped at num_keys")


def attend_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                   scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Attention of every query row over one range of keys: ``(out, lse)``.

    q: ``[num_tokens, num_heads, head_dim]``; k, v: ``[num_keys, num_kv_heads,
    head_dim]`` (array-likes, any float dtype). No mask: every row sees every
    key of the range. Scores are ``q . k * scale`` (``scale`` used as given).

    Returns, in float64:

    * ``out`` ``[num_tokens, num_heads, head_dim]``, **normalized**:
      ``softmax(scores) @ v`` for each row and head;
    * ``lse`` ``[num_heads, num_tokens]``: ``log(sum(exp(scores)))``, computed
      as ``max + log(sum(exp(scores - max)))`` so that scores of several
      hundred (800 included) neither overflow nor lose precision.

    An empty range (``num_keys == 0``) gives ``out = 0`` and ``lse = -inf``:
    the state of "no keys", which ``merge_attn_states`` gives weight 0.

    Raises ValueError naming ``q`` (not 3-D), ``k`` (not 3-D), ``v`` (shape
    unlike k's), ``head_dim`` (k's last axis unlike q's), ``num_kv_heads``
    (0, or not dividing num_heads) or ``scale`` (not finite).
    """
    raise NotImplementedError("attend_partial: normalized output and max + log(sum(exp(s - max)))")


def merge_attn_states(prefix_output: np.ndarray, prefix_lse: np.ndarray,
                      suffix_output: np.ndarray, suffix_lse: np.ndarray,
                      prefill_tokens_with_context: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's merge of two normalized partial attentions: ``(output, output_lse)``.

    prefix_output, suffix_output: ``[num_tokens, num_heads, head_dim]``,
    normalized; prefix_lse, suffix_lse: ``[num_heads, num_tokens]``. Upstream
    writes into an ``output`` tensor it is given and fills ``output_lse`` only
    when asked; here both are returned, in float64.

    Row ``t`` (a query token) with ``t < prefill_tokens_with_context`` is
    merged, per head:

    * an LSE of ``+inf`` is first read as ``-inf`` (upstream's rule: FA2
      reports an empty sequence as ``+inf``, FA3 as ``-inf``);
    * ``max_lse = max(p_lse, s_lse)``; if it is ``-inf`` (both sides empty)
      the row's output is 0 and its LSE ``-inf``, with no NaN computed;
    * otherwise ``p_se = exp(p_lse - max_lse)``, ``s_se = exp(s_lse -
      max_lse)``, ``output = prefix * p_se / (p_se + s_se) + suffix * s_se /
      (p_se + s_se)``, ``output_lse = log(p_se + s_se) + max_lse``.

    Rows ``t >= prefill_tokens_with_context`` have no prefix part: output and
    LSE are the suffix's, copied bit for bit (the LSE as given, ``+inf``
    included). ``None`` (the default) means every row is merged.

    The merge is commutative, and associative up to rounding, so any split of
    the keys merged in any order or tree gives the same attention.

    Raises ValueError naming ``prefix_output`` (not 3-D), ``suffix_output``
    (shape unlike prefix_output's), ``prefix_lse`` or ``suffix_lse`` (shape not
    ``(num_heads, num_tokens)``) or ``prefill_tokens_with_context`` (not an
    integer in ``0..num_tokens``).

    upstream: vllm/v1/attention/ops/merge_attn_states.py:9 merge_attn_states
    upstream: vllm/v1/attention/ops/triton_merge_attn_states.py:126-127 p_lse
    upstream: csrc/attention/merge_attn_states.cu:109 max_lse
    """
    raise NotImplementedError("merge_attn_states: weights exp(lse - max_lse), no NaN when both are -inf")


def partitioned_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, num_partitions: int,
                          scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Flash-decoding on a CPU: split the keys, attend to each part, merge.

    q: ``[num_tokens, num_heads, head_dim]``; k, v: ``[num_keys, num_kv_heads,
    head_dim]``. Splits the keys by ``partition_bounds(num_keys,
    num_partitions)``, calls ``attend_partial`` once per partition in order
    (empty partitions included: their ``-inf`` LSE must pass through the
    merge harmlessly), and folds the results left to right with
    ``merge_attn_states``: ``merge(merge(p0, p1), p2)``, and so on. Returns
    ``(out [T, H, D], lse [H, T])``, equal to ``attend_partial`` over all keys
    to rounding, for any ``num_partitions >= 1``, more partitions than keys
    included.

    Raises ValueError naming ``k`` when it is not 3-D and ``num_partitions``
    when it is not an integer >= 1; other shape errors come from
    ``attend_partial``.
    """
    raise NotImplementedError("partitioned_attention: attend each range, fold with merge_attn_states")


def _example() -> None:
    """The guide's worked example: scores 2, 1, 4, 3 and values 10, 20, 30, 40."""
    q = np.ones((1, 1, 1))  # one token, one head, head_dim 1
    k = np.array([2.0, 1.0, 4.0, 3.0]).reshape(4, 1, 1)  # scores = k with scale 1
    v = np.array([10.0, 20.0, 30.0, 40.0]).reshape(4, 1, 1)
    (lo_a, hi_a), (lo_b, hi_b) = partition_bounds(4, 2)
    out_a, lse_a = attend_partial(q, k[lo_a:hi_a], v[lo_a:hi_a], 1.0)
    out_b, lse_b = attend_partial(q, k[lo_b:hi_b], v[lo_b:hi_b], 1.0)
    out, lse = merge_attn_states(out_a, lse_a, out_b, lse_b)
    print(f"partition a: out = {out_a.item():.4f}  lse = {lse_a.item():.4f}")
    print(f"partition b: out = {out_b.item():.4f}  lse = {lse_b.item():.4f}")
    print(f"merged:      out = {out.item():.4f}  lse = {lse.item():.4f}")
    print(f"plain average (wrong): {(out_a.item() + out_b.item()) / 2:.4f}")
    out7, _ = partitioned_attention(q, k, v, 7, 1.0)
    print(f"7 partitions over 4 keys: {partition_bounds(4, 7)} -> out = {out7.item():.4f}")


if __name__ == "__main__":
    _example()
