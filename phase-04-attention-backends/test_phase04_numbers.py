"""Every worked number in Phase 04's pages, recomputed.

The guide, the deep-dive, the exercises, the interview page and the cheatsheet quote these values;
if one of them changes here, the text is wrong. Pure Python, no imports beyond the standard
library, well under a second.
"""

from __future__ import annotations

import math

import pytest

# The hand example of the guide (section 3): four keys, scalar values, two blocks of two.
SCORES = [2.0, 1.0, 4.0, 3.0]
VALUES = [10.0, 20.0, 30.0, 40.0]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def online_softmax(scores, values, block):
    """The recurrence of the guide, written out: returns every state and the output."""
    m, l, acc = -math.inf, 0.0, 0.0  # noqa: E741  (the guide's names: max, sum, accumulator)
    states = []
    for start in range(0, len(scores), block):
        s, v = scores[start:start + block], values[start:start + block]
        m_new = max(m, *s)
        factor = math.exp(m - m_new)  # exp(-inf) == 0.0 on the first block: nothing to rescale
        l = l * factor + sum(math.exp(x - m_new) for x in s)  # noqa: E741
        acc = acc * factor + sum(math.exp(x - m_new) * y for x, y in zip(s, v, strict=True))
        m = m_new
        states.append((m, l, acc, factor))
    return acc / l, m + math.log(l), states


def dense(scores, values):
    w = [math.exp(x) for x in scores]
    return sum(a * b for a, b in zip(w, values, strict=True)) / sum(w), math.log(sum(w))


def merge(out_a, lse_a, out_b, lse_b):
    """merge_attn_states for one row and one head, max-shifted as vLLM does."""
    top = max(lse_a, lse_b)
    lse = top + math.log(math.exp(lse_a - top) + math.exp(lse_b - top))
    w_a = math.exp(lse_a - lse)
    return w_a * out_a + (1 - w_a) * out_b, lse, w_a


def test_online_softmax_by_hand():
    out, lse, states = online_softmax(SCORES, VALUES, block=2)
    (m1, l1, acc1, _), (m2, l2, acc2, factor) = states
    assert (m1, round(l1, 4), round(acc1, 4)) == (2.0, 1.3679, 17.3576)
    assert round(factor, 4) == 0.1353          # e^(2 - 4): the max rose from 2 to 4
    assert round(l1 * factor, 4) == 0.1851 and round(acc1 * factor, 4) == 2.3491
    assert (m2, round(l2, 4), round(acc2, 4)) == (4.0, 1.5530, 47.0643)
    assert round(out, 4) == 30.3054
    assert round(lse, 4) == 4.4402
    d_out, d_lse = dense(SCORES, VALUES)
    assert out == pytest.approx(d_out, abs=1e-12) and lse == pytest.approx(d_lse, abs=1e-12)


def test_block_size_does_not_change_the_answer():
    for block in (1, 2, 3, 4):
        out, lse, _ = online_softmax(SCORES, VALUES, block)
        assert out == pytest.approx(30.3054, abs=1e-4) and lse == pytest.approx(4.4402, abs=1e-4)


def test_flash_decoding_merge_by_hand():
    out_a, lse_a, _ = online_softmax(SCORES[:2], VALUES[:2], block=2)
    out_b, lse_b, _ = online_softmax(SCORES[2:], VALUES[2:], block=2)
    assert (round(out_a, 4), round(lse_a, 4)) == (12.6894, 2.3133)
    assert (round(out_b, 4), round(lse_b, 4)) == (32.6894, 4.3133)
    out, lse, w_a = merge(out_a, lse_a, out_b, lse_b)
    assert round(w_a, 4) == 0.1192 and round(1 - w_a, 4) == 0.8808
    assert w_a == pytest.approx(1 / (1 + math.e ** 2), abs=1e-15)  # the LSEs differ by exactly 2
    assert out == pytest.approx(30.3054, abs=1e-4) and lse == pytest.approx(4.4402, abs=1e-4)
    # the wrong merge: a plain average of the two partial outputs
    assert round((out_a + out_b) / 2, 4) == 22.6894


def test_an_empty_partition_merges_as_nothing():
    out, lse, w_a = merge(0.0, -math.inf, 32.6894, 4.3133)
    assert w_a == 0.0 and out == 32.6894 and lse == 4.3133


def test_overflow_without_the_max_shift():
    with pytest.raises(OverflowError):
        math.exp(800.0)
    assert math.exp(800.0 - 800.0) == 1.0


def use_cascade_attention(common_prefix_len, query_lens, num_query_heads, num_kv_heads,
                          use_alibi=False, use_sliding_window=False, num_sms=132):
    """Transcribed from vllm/v1/attention/backends/flash_attn.py:1054 (DCP and local off)."""
    if common_prefix_len < 256 or use_alibi or use_sliding_window or len(query_lens) < 8:
        return False, None
    per_kv = num_query_heads // num_kv_heads
    if not (per_kv > 1 and all(q == 1 for q in query_lens)):
        return True, None
    tiles = cdiv(common_prefix_len, 128)
    cascade_time = cdiv(num_query_heads * cdiv(len(query_lens), 128), num_sms) * tiles
    fd_time = cdiv(len(query_lens) * num_kv_heads * cdiv(per_kv, 128) * tiles, num_sms)
    return cascade_time < fd_time, (cascade_time, fd_time)


def test_cascade_heuristic_cases():
    assert use_cascade_attention(255, [1] * 8, 32, 8) == (False, None)
    assert use_cascade_attention(512, [1] * 7, 32, 8) == (False, None)
    assert use_cascade_attention(512, [1] * 8, 32, 32) == (True, None)   # MHA: no flash-decoding
    assert use_cascade_attention(512, [1] * 8, 32, 8) == (False, (4, 2))
    assert use_cascade_attention(512, [1] * 64, 32, 8) == (True, (4, 16))
    assert use_cascade_attention(512, [1] * 8, 32, 8, use_sliding_window=True) == (False, None)


def test_cascade_rows_read():
    n, prefix, own = 8, 512, 64
    plain = n * (prefix + own)
    cascade = prefix + n * own
    assert (plain, cascade, plain - cascade) == (4608, 1024, 3584)
    assert plain - cascade == (n - 1) * prefix


def cascade_prefix_len(num_common_blocks, block_size, num_computed_tokens):
    length = min(num_common_blocks * block_size, min(num_computed_tokens))
    return length // block_size * block_size


def test_cascade_prefix_len_is_capped_and_rounded():
    assert cascade_prefix_len(32, 16, [512, 530, 600]) == 512
    assert cascade_prefix_len(32, 16, [300, 530, 600]) == 288   # 300 rounded down to 18 blocks
    assert cascade_prefix_len(0, 16, [300]) == 0


def test_one_decode_leaves_most_sms_idle():
    heads, sms = 32, 132
    assert round(heads / sms, 3) == 0.242
    assert heads * 4 == 128 and round(heads * 4 / sms, 3) == 0.970   # 4 KV splits per head


def test_bottom_right_alignment_example():
    # a chunk of 4 new tokens at positions 5..8 of a 9-token context
    seq_len, q_len = 9, 4
    last_visible = [seq_len - q_len + i for i in range(q_len)]
    assert last_visible == [5, 6, 7, 8]
    # top-left alignment would let row 0 see key 0 only
    assert [i for i in range(q_len)] == [0, 1, 2, 3]


def test_varlen_metadata_example():
    q_lens, computed = [3, 1, 1], [0, 7, 12]
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    seq_lens = [c + q for c, q in zip(computed, q_lens, strict=True)]
    assert qsl == [0, 3, 4, 5] and seq_lens == [3, 8, 13]


def test_rows_read_at_block_granularity():
    block_size, seq_lens = 4, [13, 5]
    streamed = sum(cdiv(s, block_size) * block_size for s in seq_lens)
    padded = len(seq_lens) * cdiv(max(seq_lens), block_size) * block_size
    assert (streamed, padded) == (24, 32)


def test_flashinfer_head_sizes_and_fa_capability():
    flashinfer_heads = [64, 128, 256, 512]   # flashinfer.py:403 get_supported_head_sizes
    assert 80 not in flashinfer_heads and 64 in flashinfer_heads
    assert (7, 5) < (8, 0) <= (8, 9) and (9, 0) >= (8, 0)   # FA needs >= (8, 0)


def test_backend_enum_has_25_members():
    import pathlib
    import re
    registry = pathlib.Path(__file__).resolve().parents[1] / "upstream/vllm/v1/attention/backends/registry.py"
    if not registry.exists():
        pytest.skip("upstream/ not checked out")
    text = registry.read_text(encoding="utf-8")
    body = text[text.index("class AttentionBackendEnum"):]
    body = body[:body.index("\n    def ")]
    assert len(re.findall(r"^    [A-Z][A-Z0-9_]* = ", body, re.MULTILINE)) == 25


def test_many_decodes_already_fill_the_gpu():
    assert 64 * 32 == 2048


def test_exercise_1_online_softmax():
    out, lse, states = online_softmax([3.0, 1.0, 5.0], [2.0, 4.0, 6.0], block=2)
    (m1, l1, acc1, _), (m2, l2, acc2, factor) = states
    assert (m1, round(l1, 4), round(acc1, 4)) == (3.0, 1.1353, 2.5413)
    assert round(factor, 4) == 0.1353
    assert (m2, round(l2, 4), round(acc2, 4)) == (5.0, 1.1537, 6.3439)
    assert (round(out, 4), round(lse, 4)) == (5.4990, 5.1429)
    assert out == pytest.approx(dense([3.0, 1.0, 5.0], [2.0, 4.0, 6.0])[0], abs=1e-12)


def test_exercise_2_metadata():
    q_lens, computed = [4, 1, 2], [8, 20, 0]
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    seq_lens = [c + q for c, q in zip(computed, q_lens, strict=True)]
    assert qsl == [0, 4, 5, 7] and seq_lens == [12, 21, 2]
    # bottom-right: request E's rows see keys up to 8, 9, 10, 11
    assert [seq_lens[0] - q_lens[0] + i for i in range(q_lens[0])] == [8, 9, 10, 11]
    # blocks of 16 each request touches
    assert [cdiv(s, 16) for s in seq_lens] == [1, 2, 1]


def test_exercise_equal_lse_gives_equal_weights():
    out, lse, w_a = merge(1.0, 3.0, 5.0, 3.0)
    assert w_a == pytest.approx(0.5, abs=1e-15) and out == pytest.approx(3.0, abs=1e-14)
    assert lse == pytest.approx(3.0 + math.log(2), abs=1e-14)


def test_interview_decode_bytes_example():
    # one decode step of one layer, 8 KV heads x 128 dims, bf16, K and V, 4,096-token context
    per_token = 2 * 8 * 128 * 2
    assert per_token == 4096
    assert per_token * 4096 == 16 * 2 ** 20   # 16 MiB per layer per request per step


def test_guide_intermediate_terms():
    assert round(40 * math.exp(-1), 4) == 14.7152
    assert round(30 + 40 * math.exp(-1), 4) == 44.7152
    assert round(1 + math.exp(-1), 4) == 1.3679


def test_guide_contract_example_slots():
    block_size = 4
    tables = {"A": [4, 0, 0, 0], "B": [9, 2, 0, 0], "C": [1, 6, 3, 8]}
    rows = [("A", 0), ("A", 1), ("A", 2), ("B", 7), ("C", 12)]
    slots = [tables[r][p // block_size] * block_size + p % block_size for r, p in rows]
    assert slots == [16, 17, 18, 11, 32]
    seq_lens = [3, 8, 13]
    assert [cdiv(s, block_size) for s in seq_lens] == [1, 2, 4]


def test_triton_3d_threshold():
    min_grid_2d = 128          # triton_attn.py:54 MIN_LAUNCH_GRID_SIZE_2D
    assert min_grid_2d // 8 == 16   # 8 KV heads: decode batches of up to 16 sequences go 3D
