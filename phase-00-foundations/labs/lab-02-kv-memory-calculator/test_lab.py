"""Lab 00-02 — every memory number of the Phase 00 guide, computed and pinned."""
from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402

GiB, MiB, KiB, GB = impl.GiB, impl.MiB, impl.KiB, impl.GB
L8, L70 = impl.LLAMA_3_1_8B, impl.LLAMA_3_1_70B


def per_token(cfg, dtype_bytes=2, kv_heads=None):
    heads = cfg.num_kv_heads if kv_heads is None else kv_heads
    return impl.kv_bytes_per_token(cfg.num_layers, heads, cfg.head_dim, dtype_bytes)


def test_llama3_8b_per_token():
    assert per_token(L8) == 131_072 == 128 * KiB


def test_llama3_70b_per_token():
    assert per_token(L70) == 327_680 == 320 * KiB


def test_sequence_sizes():
    assert impl.kv_bytes_per_seq(per_token(L8), 2048) == 268_435_456 == 256 * MiB
    # 2,000 tokens: 262 MB in decimal units, 250 MiB in binary ones
    assert impl.kv_bytes_per_seq(per_token(L8), 2000) == 262_144_000 == 250 * MiB
    seq70 = impl.kv_bytes_per_seq(per_token(L70), 8192)
    assert seq70 == 2_684_354_560 == int(2.5 * GiB)
    assert round(seq70 / GB, 2) == 2.68


def test_llama3_8b_concurrency_on_the_round_budget():
    # 24 GiB card, 16 GiB of weights (round numbers), 2,048-token sequences.
    seq = impl.kv_bytes_per_seq(per_token(L8), 2048)
    assert impl.max_concurrent_seqs(24 * GiB, 16 * GiB, seq) == 32


def test_parameter_counts_come_from_the_configs():
    assert impl.num_params(L8) == 8_030_261_248
    assert impl.num_params(L70) == 70_553_706_496
    assert L8.vocab_size * L8.hidden_size == 525_336_576  # the embedding table
    w8 = impl.weight_bytes(L8, 2)
    assert w8 == 16_060_522_496
    assert round(w8 / GiB, 2) == 14.96
    # the MLP holds about 70% of Llama-3.1-8B's weights
    mlp = L8.num_layers * 3 * L8.hidden_size * L8.intermediate_size
    assert round(mlp / impl.num_params(L8), 3) == 0.702
    assert L8.intermediate_size / L8.hidden_size == 3.5  # the guide's "3.5 times the hidden size"


def test_llama3_8b_concurrency_with_real_weights_and_units():
    seq = impl.kv_bytes_per_seq(per_token(L8), 2048)
    w8 = impl.weight_bytes(L8, 2)
    assert impl.max_concurrent_seqs(24 * GiB, w8, seq) == 36  # a true 24 GiB
    assert impl.max_concurrent_seqs(24 * GB, w8, seq) == 29  # a "24 GB" label, decimal
    # vLLM's default gpu_memory_utilization at the pin is 0.92
    assert impl.max_concurrent_seqs(24 * GiB, w8, seq, gpu_memory_utilization=0.92) == 28
    assert impl.max_concurrent_seqs(80 * GiB, w8, seq) == 260
    assert impl.max_concurrent_seqs(80 * GiB, w8, impl.kv_bytes_per_seq(per_token(L8), 8192)) == 65


def test_fp8_kv_doubles_concurrency():
    bf16 = impl.kv_bytes_per_seq(per_token(L8, 2), 2048)
    fp8 = impl.kv_bytes_per_seq(per_token(L8, 1), 2048)
    assert per_token(L8, 1) == 64 * KiB
    assert impl.max_concurrent_seqs(24 * GiB, 16 * GiB, fp8) == 64
    assert impl.max_concurrent_seqs(24 * GiB, 16 * GiB, fp8) == 2 * impl.max_concurrent_seqs(
        24 * GiB, 16 * GiB, bf16
    )


def test_gqa_saves_vs_mha():
    mha = per_token(L8, kv_heads=L8.num_q_heads)  # 32 KV heads, one per query head
    assert mha == 524_288 == 512 * KiB
    assert mha // per_token(L8) == 4
    seq = impl.kv_bytes_per_seq(mha, 2048)
    assert seq == GiB  # EXERCISES item 12: 1 GiB per 2,048-token sequence without GQA
    assert impl.max_concurrent_seqs(24 * GiB, 16 * GiB, seq) == 8


def test_llama3_70b_does_not_fit_one_80_gib_card_in_bf16():
    w70 = impl.weight_bytes(L70, 2)
    assert w70 == 141_107_412_992
    assert round(w70 / GB, 1) == 141.1 and round(w70 / GiB, 1) == 131.4
    seq = impl.kv_bytes_per_seq(per_token(L70), 8192)
    assert impl.max_concurrent_seqs(80 * GiB, w70, seq) == 0
    # four cards pooled (tensor parallelism splits weights and KV evenly)
    assert impl.max_concurrent_seqs(4 * 80 * GiB, w70, seq) == 75
    # fp8 weights fit on one card, leaving room for a handful of 8k sequences
    assert round(impl.weight_bytes(L70, 1) / GB, 1) == 70.6
    assert impl.max_concurrent_seqs(80 * GiB, impl.weight_bytes(L70, 1), seq) == 5


def test_the_script_capacity_table():
    # the rows `python solution.py` prints: bf16 weights, (KV dtype, card GiB, context) -> seqs
    expected = {
        (2, 24, 2048): 36, (2, 24, 8192): 9, (2, 80, 2048): 260, (2, 80, 8192): 65,
        (1, 24, 2048): 72, (1, 24, 8192): 18, (1, 80, 2048): 520, (1, 80, 8192): 130,
    }
    w8 = impl.weight_bytes(L8, 2)
    for (kv_dtype, card, ctx), seqs in expected.items():
        seq = impl.kv_bytes_per_seq(per_token(L8, kv_dtype), ctx)
        assert impl.max_concurrent_seqs(card * GiB, w8, seq) == seqs
    w70 = impl.weight_bytes(L70, 2)
    for kv_dtype in (2, 1):
        for card in (24, 80):
            for ctx in (2048, 8192):
                seq = impl.kv_bytes_per_seq(per_token(L70, kv_dtype), ctx)
                assert impl.max_concurrent_seqs(card * GiB, w70, seq) == 0
    assert per_token(L70, 1) == 160 * KiB
    assert impl.kv_bytes_per_seq(per_token(L70), 2048) == 640 * MiB


def test_no_room_returns_zero():
    assert impl.max_concurrent_seqs(16 * GiB, 24 * GiB, 256 * MiB) == 0
    assert impl.max_concurrent_seqs(16 * GiB, 16 * GiB, 256 * MiB) == 0


def test_max_concurrency_reproduces_the_vllm_log_line():
    c = impl.max_concurrency(num_blocks=8788, block_size=16, max_model_len=2048)
    assert c == 68.65625 == 140_608 / 2048
    assert int(c * 2048) == 140_608  # the "GPU KV cache size: 140,608 tokens" line
    line = impl.concurrency_log_line(2048, c)
    assert line == "Maximum concurrency for 2,048 tokens per request: 68.66x"


def test_block_view_agrees_with_the_sequence_view():
    blocks = impl.num_kv_blocks(8 * GiB, per_token(L8), block_size=16)
    assert blocks == 4096
    c = impl.max_concurrency(blocks, 16, 2048)
    assert c == 32.0
    assert impl.concurrency_log_line(2048, c).endswith("32.00x")
    # a max_model_len that is not a multiple of the block size rounds up to whole blocks
    assert impl.max_concurrency(100, 16, 17) == 50.0


def test_going_further_capacity_question():
    need = 200 * impl.kv_bytes_per_seq(per_token(L8), 4096)
    assert need == 100 * GiB


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: impl.kv_bytes_per_token(0, 8, 128, 2), "num_layers"),
        (lambda: impl.kv_bytes_per_token(32, 8, 128, 0), "dtype_bytes"),
        (lambda: impl.kv_bytes_per_seq(131072, 0), "seq_len"),
        (lambda: impl.max_concurrent_seqs(GiB, 0, MiB, gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (lambda: impl.max_concurrency(10, 0, 2048), "block_size"),
    ],
)
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# Every argument check the README promises, at its boundary: (function, valid keyword
# arguments, parameter, smallest rejected value, smallest accepted value).
VALID = {
    "kv_bytes_per_token": dict(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "kv_bytes_per_seq": dict(bytes_per_token=131072, seq_len=2048),
    "max_concurrent_seqs": dict(gpu_bytes=24 * GiB, weights=16 * GiB, seq_bytes=256 * MiB),
    "num_kv_blocks": dict(kv_budget_bytes=8 * GiB, bytes_per_token=131072, block_size=16),
    "max_concurrency": dict(num_blocks=8788, block_size=16, max_model_len=2048),
}
BOUNDARIES = [
    ("kv_bytes_per_token", "num_layers", 0, 1),
    ("kv_bytes_per_token", "num_kv_heads", 0, 1),
    ("kv_bytes_per_token", "head_dim", 0, 1),
    ("kv_bytes_per_token", "dtype_bytes", 0, 0.5),
    ("kv_bytes_per_seq", "bytes_per_token", 0, 1),
    ("kv_bytes_per_seq", "seq_len", 0, 1),
    ("max_concurrent_seqs", "gpu_bytes", 0, 1),
    ("max_concurrent_seqs", "seq_bytes", 0, 1),
    ("max_concurrent_seqs", "weights", -1, 0),
    ("max_concurrent_seqs", "gpu_memory_utilization", 0, 1.0),
    ("max_concurrent_seqs", "gpu_memory_utilization", 1.01, 0.01),
    ("num_kv_blocks", "kv_budget_bytes", -1, 0),
    ("num_kv_blocks", "bytes_per_token", 0, 1),
    ("num_kv_blocks", "block_size", 0, 1),
    ("max_concurrency", "num_blocks", -1, 0),
    ("max_concurrency", "block_size", 0, 1),
    ("max_concurrency", "max_model_len", 0, 1),
]


@pytest.mark.parametrize(("function", "param", "rejected", "accepted"), BOUNDARIES)
def test_every_argument_check_sits_exactly_at_its_boundary(function, param, rejected, accepted):
    fn = getattr(impl, function)
    fn(**{**VALID[function], param: accepted})  # the edge of the allowed range is allowed
    for bad in (rejected, rejected - 1 if rejected <= 0 else rejected + 1):
        with pytest.raises(ValueError, match=param):
            fn(**{**VALID[function], param: bad})


def test_weight_bytes_rejects_a_dtype_without_bytes():
    for bad in (0, -2):
        with pytest.raises(ValueError, match="dtype_bytes"):
            impl.weight_bytes(L8, bad)


def test_tied_embeddings_drop_the_lm_head_from_the_count():
    import dataclasses

    tied = dataclasses.replace(L8, tie_word_embeddings=True)
    assert impl.num_params(L8) - impl.num_params(tied) == L8.vocab_size * L8.hidden_size
    # a toy config small enough to count by hand: 1 layer, h=4, 2 query heads and
    # 1 KV head of dim 2, MLP 8, vocab 10
    toy = impl.ModelConfig("toy", 1, 4, 2, 1, 2, 8, 10, tie_word_embeddings=True)
    # q 4x4 + k,v 4x2 each + o 4x4 + mlp 3x4x8 + 2 norms of 4; embedding 10x4; final norm 4
    assert impl.num_params(toy) == (16 + 16 + 16 + 96 + 8) + 40 + 4
    assert impl.num_params(dataclasses.replace(toy, tie_word_embeddings=False)) == 152 + 40 + 40 + 4


def test_sub_byte_dtypes_count_fractional_bytes_before_rounding():
    # 4-bit weights and a 4-bit KV cache: half a byte per element, not zero
    assert impl.weight_bytes(L8, 0.5) == 4_015_130_624
    assert impl.kv_bytes_per_token(32, 8, 128, 0.5) == 32 * KiB


def test_block_counts_are_whole_blocks_rounded_down():
    per_tok = per_token(L8)
    for budget, blocks in ((8 * GiB, 4096), (8 * GiB + 1, 4096), (8 * GiB - 1, 4095), (0, 0)):
        got = impl.num_kv_blocks(budget, per_tok, block_size=16)
        assert got == blocks and type(got) is int
    seqs = impl.max_concurrent_seqs(24 * GiB, 16 * GiB - 1, 256 * MiB)
    assert seqs == 32 and type(seqs) is int  # one spare byte buys no 33rd sequence


def test_utilization_caps_the_card_before_the_weights_come_off():
    # 10 GiB card at 0.5: a 5 GiB budget, 4 GiB of weights, 1 GiB left: 4 sequences of 256 MiB
    # (taking 0.5 of what the weights leave would give 12)
    assert impl.max_concurrent_seqs(10 * GiB, 4 * GiB, 256 * MiB, gpu_memory_utilization=0.5) == 4
    # weights larger than the budget but smaller than the card: still zero, never negative
    assert impl.max_concurrent_seqs(10 * GiB, 6 * GiB, 256 * MiB, gpu_memory_utilization=0.5) == 0


def test_concurrency_log_line_format():
    assert impl.concurrency_log_line(131072, 1.005) == (
        "Maximum concurrency for 131,072 tokens per request: 1.00x"  # 1.005 is stored as 1.00499...
    )
    assert impl.concurrency_log_line(512, 0.125) == (
        "Maximum concurrency for 512 tokens per request: 0.12x"  # an exact tie rounds to even
    )
    assert impl.concurrency_log_line(1_000_000, 3.0) == (
        "Maximum concurrency for 1,000,000 tokens per request: 3.00x"
    )


def test_formula_matches_what_mini_vllm_allocates():
    # mini_vllm's tiny-random model: 2 layers, 2 KV heads, head_dim 16, float32 cache
    from mini_vllm.models import get_model

    model = get_model("tiny-random")
    c = model.config
    per_tok = impl.kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 4)
    assert per_tok == 512 == c.kv_bytes_per_token(4)
    model.init_kv_cache(num_blocks=16, block_size=4)
    assert model.kv_cache_bytes == 16 * 4 * per_tok == 32_768
    assert impl.num_kv_blocks(model.kv_cache_bytes, per_tok, block_size=4) == 16


def test_exercise_numbers():
    # EXERCISES.md design items
    w70 = impl.weight_bytes(L70, 2)
    seq_bf16 = impl.kv_bytes_per_seq(per_token(L70, 2), 8192)
    seq_fp8 = impl.kv_bytes_per_seq(per_token(L70, 1), 8192)
    assert seq_fp8 == int(1.25 * GiB)
    assert impl.max_concurrent_seqs(8 * 80 * GiB, w70, seq_bf16) == 203
    assert impl.max_concurrent_seqs(8 * 80 * GiB, w70, seq_fp8) == 406
    assert impl.max_concurrent_seqs(4 * 80 * GiB, w70, seq_fp8) == 150
    # Little's Law item: 50 sequences of 4,096 tokens of Llama-3.1-8B
    seq_4k = impl.kv_bytes_per_seq(per_token(L8), 4096)
    assert seq_4k == 512 * MiB and 50 * seq_4k == 25 * GiB
    assert impl.max_concurrent_seqs(24 * GiB, 16 * GiB, seq_4k) == 16
    fp8_4k = impl.kv_bytes_per_seq(per_token(L8, 1), 4096)
    assert impl.max_concurrent_seqs(24 * GiB, 16 * GiB, fp8_4k) == 32
    assert impl.max_concurrent_seqs(80 * GiB, impl.weight_bytes(L8, 2), seq_4k) == 130
