"""Lab 02-03 tests: the capacity calculator on the CPU; the real engine on a GPU box."""
from __future__ import annotations

import pathlib

import pytest

import course
from course import load_impl

impl = load_impl(__file__)

GiB = 1 << 30
HERE = pathlib.Path(__file__).resolve().parent
UPSTREAM = course.UPSTREAM


def test_kv_bytes_per_token_for_real_model_configs():
    got = {name: impl.kv_bytes_per_token(impl.kv_spec_from_hf_config(cfg))
           for name, cfg in impl.MODEL_CONFIGS.items()}
    assert got == {
        "facebook/opt-125m": 36_864,  # 2 * 12 layers * 12 heads * 64 * 2 B
        "Qwen/Qwen2.5-0.5B-Instruct": 12_288,  # 2 KV heads of 64: GQA shrinks KV 7x
        "Qwen/Qwen3-0.6B": 114_688,  # head_dim 128 read from the config, not 1024/16
        "meta-llama/Llama-3.1-8B-Instruct": 131_072,  # 128 KiB per token
    }


def test_guide_numbers_for_llama_8b():
    spec = impl.kv_spec_from_hf_config(impl.MODEL_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"])
    per_conversation = impl.kv_bytes_per_token(spec) * 2048
    assert per_conversation == 256 * (1 << 20)  # 256 MiB for one 2,048-token conversation
    assert (8 * GiB) // per_conversation == 32  # 8 GiB of KV space -> 32 such conversations


def test_exercise_numbers_for_qwen_and_a_shared_system_prompt():
    qwen = impl.kv_spec_from_hf_config(impl.MODEL_CONFIGS["Qwen/Qwen2.5-0.5B-Instruct"])
    # EXERCISES 4: 8,192 B per layer per 16-token block, 196,608 B = 192 KiB across 24 layers
    assert impl.page_size_bytes(qwen, 16) == 8_192
    assert impl.page_size_bytes(qwen, 16) * qwen.num_layers == 196_608 == 192 * 1024
    # EXERCISES 14: 100 requests of a 4,096-token system prompt + 50 tokens on Llama-3.1-8B
    llama = impl.kv_spec_from_hf_config(impl.MODEL_CONFIGS["meta-llama/Llama-3.1-8B-Instruct"])
    per_token = impl.kv_bytes_per_token(llama)
    without = 100 * (4096 + 50) * per_token
    shared, tails = 4096 * per_token, 100 * 50 * per_token
    assert round(without / GiB, 1) == 50.6
    assert (shared, tails) == (512 * (1 << 20), 625 * (1 << 20))
    assert round((shared + tails) / GiB, 2) == 1.11
    assert round(without / (shared + tails), 1) == 45.6
    # EXERCISES 17: at block size 64 a prompt must have at least 65 tokens to ever hit
    assert impl.expected_prefix_hit_rate(64, 8, 64) == 0.0
    assert impl.expected_prefix_hit_rate(65, 8, 64) > 0.0


def test_config_defaults_without_gqa_or_head_dim():
    spec = impl.kv_spec_from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                        "hidden_size": 64})
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (2, 4, 16, 2)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        impl.kv_spec_from_hf_config({"num_attention_heads": 4, "hidden_size": 64})


def test_config_fields_written_as_null_fall_back_to_their_defaults():
    # some published configs spell an absent field as null rather than leaving it out
    spec = impl.kv_spec_from_hf_config({"num_hidden_layers": 3, "num_attention_heads": 8,
                                        "num_key_value_heads": None, "head_dim": None,
                                        "hidden_size": 512})
    assert (spec.num_kv_heads, spec.head_dim) == (8, 64)


def test_gqa_config_without_head_dim_divides_by_attention_heads():
    # 4:1 GQA, no explicit head_dim: head_dim comes from the query heads, not the KV heads
    spec = impl.kv_spec_from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 16,
                                        "num_key_value_heads": 4, "hidden_size": 1024},
                                       dtype_bytes=1)
    assert (spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (4, 64, 1)
    assert impl.kv_bytes_per_token(spec) == 2 * 2 * 4 * 64 * 1


def test_page_size_is_per_layer_and_blocks_divide_by_layers():
    spec = impl.kv_spec_from_hf_config(impl.MODEL_CONFIGS["facebook/opt-125m"])
    assert impl.page_size_bytes(spec, 16) == 49_152  # 2 * 16 * 12 * 64 * 2
    assert impl.page_size_bytes(spec, 16) * spec.num_layers == 589_824  # 576 KiB per block
    assert impl.num_gpu_blocks(10 * GiB, spec, 16) == 18_204
    assert impl.num_gpu_blocks(589_823, spec, 16) == 0


def test_requested_memory_rounds_up_and_validates_utilization():
    assert impl.requested_memory(24 * GiB, 0.5) == 12 * GiB
    assert impl.requested_memory(10, 0.33) == 4  # ceil(3.3)
    for bad in (0.0, -0.1, 1.01):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            impl.requested_memory(24 * GiB, bad)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        impl.available_kv_memory(4 * GiB, 0.1, weights_bytes=GiB, peak_activation_bytes=GiB)
    assert impl.requested_memory(7, 1.0) == 7  # utilization 1 is allowed


def test_available_memory_subtracts_every_cost_and_rejects_exactly_zero():
    costs = {"weights_bytes": 100, "peak_activation_bytes": 20, "non_torch_bytes": 3,
             "cudagraph_bytes": 7}
    assert impl.available_kv_memory(1000, 0.5, **costs) == 500 - 130
    assert impl.available_kv_memory(261, 1.0, **costs) == 131
    assert impl.available_kv_memory(131, 1.0, **costs) == 1
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        impl.available_kv_memory(130, 1.0, **costs)  # 0 bytes left is no KV cache at all


@pytest.mark.parametrize("call, name", [
    (lambda: impl.kv_spec_from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                          "hidden_size": 64}, dtype_bytes=3), "dtype_bytes"),
    (lambda: impl.page_size_bytes(impl.KVSpec(1, 1, 8), 0), "block_size"),
    (lambda: impl.max_concurrency(10, 0, 16), "max_model_len"),
    (lambda: impl.expected_prefix_hit_rate(0, 8, 16), "prompt_len"),
    (lambda: impl.expected_prefix_hit_rate(32, 0, 16), "num_requests"),
    (lambda: impl.expected_prefix_hit_rate(32, 8, 0), "block_size"),
])
def test_every_promised_value_error_is_raised(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_smallest_allowed_values_are_accepted():
    spec = impl.KVSpec(num_layers=1, num_kv_heads=2, head_dim=4, dtype_bytes=4)
    assert impl.page_size_bytes(spec, 1) == 2 * 1 * 2 * 4 * 4
    assert impl.max_concurrency(5, 1, 16) == 5.0  # a 1-token request still needs a block
    assert impl.expected_prefix_hit_rate(1, 8, 16) == 0.0
    assert impl.expected_prefix_hit_rate(17, 1, 16) == 0.0  # one request: nobody to share with
    assert impl.expected_prefix_hit_rate(3, 2, 1) == 2 / 6  # block size 1: all but the last token
    fp32 = impl.kv_spec_from_hf_config({"num_hidden_layers": 1, "num_attention_heads": 2,
                                        "hidden_size": 16}, dtype_bytes=4)
    assert fp32.dtype_bytes == 4


def test_sizes_and_block_counts_are_integers():
    spec = impl.kv_spec_from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                        "hidden_size": 64})
    assert type(spec.head_dim) is int and type(impl.kv_bytes_per_token(spec)) is int
    blocks = impl.num_gpu_blocks(10 * GiB, spec, 16)
    assert type(blocks) is int and blocks == 10 * GiB // (2 * 16 * 4 * 16 * 2) // 2


def test_illustrative_opt_125m_capacity_at_two_utilizations():
    """The README's illustrative numbers: a 24 GiB card, fixed costs of 2 GiB."""
    fixed = {"weights_bytes": GiB // 4, "peak_activation_bytes": GiB,
             "non_torch_bytes": GiB // 4, "cudagraph_bytes": GiB // 2}
    half = impl.capacity_report("facebook/opt-125m", 24 * GiB, 0.5, **fixed)
    high = impl.capacity_report("facebook/opt-125m", 24 * GiB, 0.9, **fixed)
    assert half["available_kv_bytes"] == 10 * GiB
    assert (half["num_gpu_blocks"], half["kv_cache_tokens"]) == (18_204, 291_264)
    assert round(half["max_concurrency"], 2) == 142.22
    assert f"{half['num_gpu_blocks'] * half['block_bytes_all_layers'] / GiB:.2f}" == "10.00"
    assert (high["num_gpu_blocks"], high["kv_cache_tokens"]) == (35_680, 570_880)
    assert round(high["max_concurrency"], 2) == 278.75
    # 0.9 / 0.5 = 1.8x the budget but 1.96x the blocks: the fixed costs do not scale
    assert round(high["num_gpu_blocks"] / half["num_gpu_blocks"], 2) == 1.96


def test_startup_lines_use_upstream_rounding():
    lines = impl.startup_log_lines(8788, 2048, 16)
    # 8788 / 128 = 68.65625, which %.2f prints as 68.66 (not 68.65)
    assert lines == ["GPU KV cache size: 140,608 tokens",
                     "Maximum concurrency for 2,048 tokens per request: 68.66x"]
    assert impl.max_concurrency(8788, 2048, 16) == 68.65625
    assert impl.max_concurrency(100, 2047, 16) == 100 / 128  # cdiv, not floor


def test_kv_cache_tokens_truncate_when_max_model_len_is_not_a_block_multiple():
    # 100 blocks, max_model_len 2,045 -> 128 blocks per request, 100/128 * 2045 = 1597.66
    assert impl.kv_cache_size_tokens(100, 2045, 16) == 1597  # int(), not round(), not 1,600
    assert impl.startup_log_lines(100, 2045, 16)[0] == "GPU KV cache size: 1,597 tokens"


def test_prefix_hit_rate_needs_prompts_longer_than_a_block():
    # a 6-token prompt has no full block: nothing can ever hit
    assert impl.expected_prefix_hit_rate(6, 8, 16) == 0.0
    # exactly one block: the last-token cap (15 usable tokens) still leaves 0 blocks
    assert impl.expected_prefix_hit_rate(16, 8, 16) == 0.0
    assert impl.expected_prefix_hit_rate(17, 8, 16) == 7 * 16 / (8 * 17)
    assert round(impl.expected_prefix_hit_rate(200, 8, 16), 3) == 0.84  # 7 * 192 / 1600
    with pytest.raises(ValueError):
        impl.expected_prefix_hit_rate(0, 8, 16)


def test_parse_kv_log_reads_the_three_capacity_lines():
    text = "\n".join([
        "INFO 01-01 00:00:00 [gpu_worker.py:467] Available KV cache memory: 10.0 GiB",
        "INFO 01-01 00:00:01 [kv_cache_utils.py:1733] " + impl.startup_log_lines(18204, 2048, 16)[0],
        "INFO 01-01 00:00:01 [kv_cache_utils.py:1734] " + impl.startup_log_lines(18204, 2048, 16)[1],
    ])
    assert impl.parse_kv_log(text) == {"available_kv_gib": 10.0, "kv_cache_tokens": 291_264.0,
                                       "max_model_len": 2048.0, "max_concurrency": 142.22}
    assert impl.parse_kv_log("nothing here") == {}


@pytest.mark.upstream
def test_log_parser_matches_upstream_format_strings():
    utils = (UPSTREAM / "vllm/v1/core/kv_cache_utils.py").read_text()
    worker = (UPSTREAM / "vllm/v1/worker/gpu_worker.py").read_text()
    fmt_tokens = '"GPU KV cache size: %s tokens"'
    fmt_conc = '"Maximum concurrency for %s tokens per request: %.2fx"'
    fmt_avail = '"Available KV cache memory: %s GiB"'
    assert fmt_tokens in utils and fmt_conc in utils and fmt_avail in worker
    text = "\n".join([
        fmt_avail.strip('"') % "7.5",
        fmt_tokens.strip('"') % f"{140608:,}",
        fmt_conc.strip('"') % (f"{2048:,}", 68.65625),
    ])
    assert impl.parse_kv_log(text) == {"available_kv_gib": 7.5, "kv_cache_tokens": 140_608.0,
                                       "max_model_len": 2048.0, "max_concurrency": 68.66}


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_engine_capacity_is_consistent_with_the_calculator():
    from course.loader import import_path

    run = import_path(HERE / "run.py")
    llm = run.build_llm(0.5)
    info = run.inspect_capacity(llm)
    assert info["num_gpu_blocks"] > 0 and info["block_size"] == 16
    assert info["kv_bytes_per_token"] == 36_864
    r = run.prefix_demo(llm, run.SHORT_PROMPT)
    assert r["prompt_tokens"] < 16 and r["measured_hit_rate"] == 0.0
    r = run.prefix_demo(llm, run.LONG_PROMPT)
    assert abs(r["measured_hit_rate"] - r["expected_hit_rate"]) < 0.02
