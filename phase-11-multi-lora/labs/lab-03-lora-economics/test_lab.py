"""Lab 11-03 tests: adapter size, the shrink ratio, fleet and FLOP arithmetic, vLLM's slot memory."""
from __future__ import annotations

import math
import warnings

from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402

MiB = 1024 * 1024
L2 = impl.LLAMA_2_7B   # hidden 4096, intermediate 11008, 32 layers, 32 heads, 32 KV heads, vocab 32000
L3 = impl.LLAMA_3_8B   # hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256
ATTN = impl.ATTENTION_MODULES
ALL7 = impl.PEFT_LINEAR_MODULES
LINEAR4 = impl.VLLM_PER_LAYER_MODULES  # qkv_proj, o_proj, gate_up_proj, down_proj
# A small shape whose query width (4 heads x head_dim 24 = 96) differs from hidden (64), as
# Gemma-7B's does (16 x 256 = 4096 against hidden 3072), with 2 KV heads (k and v 48 wide).
ODD = impl.ModelShape(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128, head_dim=24)


# ---------------------------------------------------------------- one layer


def test_lora_params_per_layer_is_r_times_in_plus_out():
    # A (16, 4096) + B (4096, 16) = 16 x 8,192 = 131,072; the layer has 4096^2 = 16,777,216 (128x)
    assert impl.lora_params_per_layer(4096, 4096, 16) == 131_072
    # a rectangle: gate_proj of Llama-2-7B, 16 x (4,096 + 11,008) = 241,664
    assert impl.lora_params_per_layer(4096, 11008, 16) == 241_664
    # 2 x (3 + 5) = 16; r * in * out would be 30, r * in + out 11
    assert impl.lora_params_per_layer(3, 5, 2) == 16
    assert impl.lora_params_per_layer(1, 1, 1) == 2           # every lower bound is 1, inclusive
    assert isinstance(impl.lora_params_per_layer(3, 5, 2), int)


def test_linear_shapes_use_head_counts_not_hidden():
    s2 = impl.linear_shapes(L2)
    assert s2 == {"q_proj": (4096, 4096), "k_proj": (4096, 4096), "v_proj": (4096, 4096),
                  "o_proj": (4096, 4096), "gate_proj": (4096, 11008), "up_proj": (4096, 11008),
                  "down_proj": (11008, 4096)}
    # GQA: 8 KV heads x 128 = 1,024 columns for k and v, a quarter of q's 4,096
    s3 = impl.linear_shapes(L3)
    assert s3["k_proj"] == s3["v_proj"] == (4096, 1024)
    assert s3["q_proj"] == s3["o_proj"] == (4096, 4096)
    assert s3["gate_proj"] == (4096, 14336) and s3["down_proj"] == (14336, 4096)
    # query width 4 x 24 = 96 != hidden 64; o_proj maps 96 back to 64; k/v 2 x 24 = 48
    so = impl.linear_shapes(ODD)
    assert so["q_proj"] == (64, 96) and so["o_proj"] == (96, 64)
    assert so["k_proj"] == (64, 48) and so["gate_proj"] == (64, 176) and so["down_proj"] == (176, 64)


# ---------------------------------------------------------------- whole adapters


def test_attention_adapter_on_llama2_7b_is_32_mib():
    # 4 targets x 131,072 x 32 layers = 16,777,216 params; x 2 B (bf16) = 33,554,432 B = 32 MiB
    assert impl.adapter_params(L2, 16, ATTN) == 16_777_216
    assert impl.adapter_bytes(L2, 16, ATTN) == 33_554_432 == 32 * MiB
    assert impl.adapter_bytes(L2, 16, ATTN, dtype_bytes=4) == 64 * MiB   # saved in fp32
    # the order of the names does not matter (it is a set of modules)
    assert impl.adapter_params(L2, 16, ["o_proj", "v_proj", "k_proj", "q_proj"]) == 16_777_216


def test_gqa_makes_k_and_v_adapters_narrower():
    # Llama-3-8B, r 16: q 16 x 8,192 = 131,072; k = v = 16 x (4,096 + 1,024) = 81,920;
    # o 131,072: 425,984 per layer x 32 = 13,631,488 params, 27,262,976 B = 26 MiB.
    # Taking k and v as 4,096 x 4,096 gives Llama-2's 16,777,216 instead.
    assert impl.adapter_params(L3, 16, ATTN) == 13_631_488
    assert impl.adapter_bytes(L3, 16, ATTN) == 26 * MiB
    assert impl.adapter_params(L3, 16, ("v_proj",)) == 32 * 81_920 == 2_621_440
    # ODD, r 4: q 4 x (64 + 96) = 640, k = v = 4 x (64 + 48) = 448, o 640 -> 2,176 x 2 layers
    assert impl.adapter_params(ODD, 4, ATTN) == 4352


def test_all_linear_adapter_counts_the_mlp():
    # Llama-2-7B, r 16: attention 4 x 131,072 = 524,288; gate = up = 241,664;
    # down 16 x (11,008 + 4,096) = 241,664 -> 1,249,280 per layer x 32 = 39,976,960 params
    assert impl.adapter_params(L2, 16, ALL7) == 39_976_960
    assert impl.adapter_bytes(L2, 16, ALL7) == 79_953_920          # 76.25 MiB
    assert impl.adapter_bytes(L2, 16, ALL7) / MiB == 76.25
    # Llama-3-8B: 425,984 + 3 x 16 x (4,096 + 14,336) = 425,984 + 884,736 = 1,310,720 per
    # layer, x 32 = 41,943,040 params = 80 MiB in bf16
    assert impl.adapter_params(L3, 16, ALL7) == 41_943_040
    assert impl.adapter_bytes(L3, 16, ALL7) == 80 * MiB


def test_a_module_named_twice_counts_once():
    # PEFT's target_modules is a set of names: ["q_proj", "q_proj"] adapts q once,
    # 131,072 x 32 = 4,194,304
    assert impl.adapter_params(L2, 16, ["q_proj", "q_proj"]) == 4_194_304


def test_rank_is_linear():
    # r 64 costs exactly 4x r 16; r 1 exactly 1/16
    assert impl.adapter_bytes(L2, 64, ATTN) == 4 * impl.adapter_bytes(L2, 16, ATTN) == 128 * MiB
    assert 16 * impl.adapter_params(L3, 1, ALL7) == impl.adapter_params(L3, 16, ALL7)


# ---------------------------------------------------------------- the one ratio


def test_shrink_ratio_nominal_and_real():
    p = impl.adapter_params(L2, 16, ATTN)
    # nominal: 7e9 / 16,777,216 = 417.23
    assert impl.shrink_ratio(7e9, p) == pytest.approx(417.2325134, rel=1e-9)
    assert round(impl.shrink_ratio(7e9, p)) == 417
    # real: 6,738,415,616 / 16,777,216 = 401.64 -> 402x
    real = impl.base_model_params(L2)
    assert real == 6_738_415_616
    assert impl.shrink_ratio(real, p) == pytest.approx(401.6408691, rel=1e-9)
    assert round(impl.shrink_ratio(real, p)) == 402
    # the same number from bytes: 12.55 GiB of bf16 weights over 32 MiB
    assert impl.shrink_ratio(real * 2, impl.adapter_bytes(L2, 16, ATTN)) == impl.shrink_ratio(real, p)
    # the ratio is base over adapter, never below 1 for a real adapter
    assert impl.shrink_ratio(10, 4) == 2.5


# ---------------------------------------------------------------- the fleet


def test_gpus_saved():
    # 100 dedicated GPUs against ceil(100 / 8) = 13 engines: 87 saved
    assert impl.gpus_saved(100, 8) == 87
    # a TP = 2 model: 200 against 26
    assert impl.gpus_saved(100, 8, gpus_per_model=2) == 174
    # 9 adapters need 2 engines (ceil); floor would say 1, round(9 / 8) would say 1
    assert impl.gpus_saved(9, 8) == 7
    assert impl.gpus_saved(16, 8) == 14      # exactly two full engines
    assert impl.gpus_saved(1, 1) == 0        # one slot per engine: nothing shared, nothing saved
    assert impl.gpus_saved(0, 8) == 0        # no tenants
    assert impl.gpus_saved(3, 8, 4) == 8     # 3 x 4 = 12 against one engine of 4


# ---------------------------------------------------------------- FLOPs


def test_flops_per_token_base_and_lora():
    # 4096 x 4096 at r 16: base 2 x 4096^2 = 33,554,432; LoRA 2 x 16 x 8,192 = 262,144 (1/128)
    assert impl.flops_per_token(4096, 4096, 16) == (33_554_432, 262_144)
    # GQA's k_proj: base 2 x 4,096 x 1,024 = 8,388,608; LoRA 2 x 16 x 5,120 = 163,840
    assert impl.flops_per_token(4096, 1024, 16) == (8_388_608, 163_840)
    assert impl.flops_per_token(3, 5, 2) == (30, 32)   # a LoRA can cost more than a tiny layer


def test_serving_plan_unmerged_against_merged():
    # base: 6,738,415,616 x 2 = 13,476,831,232 B; 100 adapters of 33,554,432 B = 3,355,443,200 B
    plan = impl.serving_plan(L2, 16, ATTN, 100, merged=False)
    assert plan.weight_bytes == 13_476_831_232 + 3_355_443_200 == 16_832_274_432
    # projection FLOPs: 2 x 202,375,168 weights per layer x 32 = 12,952,010,752 per token; the
    # attention adapter adds 2 x 16,777,216 = 33,554,432 (0.26%)
    assert plan.projection_flops_per_token == 12_952_010_752 + 33_554_432
    merged = impl.serving_plan(L2, 16, ATTN, 100, merged=True)
    # 100 merged copies: 1,347,683,123,200 B (1.2 TiB), and not one extra FLOP
    assert merged.weight_bytes == 100 * 13_476_831_232
    assert merged.projection_flops_per_token == 12_952_010_752
    # the whole model's LoRA FLOPs are twice its LoRA parameters: 2 x 39,976,960 (0.62%)
    unmerged_all = impl.serving_plan(L3, 16, ALL7, 1, merged=False)
    merged_all = impl.serving_plan(L3, 16, ALL7, 1, merged=True)
    extra = unmerged_all.projection_flops_per_token - merged_all.projection_flops_per_token
    assert extra == 2 * impl.adapter_params(L3, 16, ALL7) == 83_886_080
    # Llama-3-8B's projections: 2 x 32 x (2 x 4,096^2 + 2 x 4,096 x 1,024 + 3 x 4,096 x 14,336)
    assert merged_all.projection_flops_per_token == 2 * 32 * 218_103_808 == 13_958_643_712
    # with a single fine-tune the two plans differ by exactly one adapter's bytes
    assert unmerged_all.weight_bytes - merged_all.weight_bytes == 80 * MiB


# ---------------------------------------------------------------- vLLM's slots


def test_slot_elements_llama2_7b_per_layer():
    e = impl.slot_elements(L2, 16)
    # qkv: three A slices (16, 4,096) = 196,608 + B (4,096 + 4,096 + 4,096) x 16 = 196,608
    assert e["qkv_proj"] == 393_216
    assert e["o_proj"] == 131_072                      # (16, 4,096) + (4,096, 16)
    # gate_up: two A (16, 4,096) = 131,072 + two B (11,008, 16) = 352,256
    assert e["gate_up_proj"] == 483_328
    assert e["down_proj"] == 241_664                   # (16, 11,008) + (4,096, 16)
    assert sum(e[m] for m in LINEAR4) == 1_249_280      # per layer per slot
    # the embeddings are wrapped too: 32,000 x 16 + 4,096 x 16 = 577,536 each
    assert e["embed_tokens"] == e["lm_head"] == 577_536
    assert set(e) == set(impl.VLLM_LORA_MODULES)


def test_slot_elements_gqa_qkv_is_narrower():
    e = impl.slot_elements(L3, 16)
    # A stays 3 x (16, 4,096) = 196,608; B is (4,096 + 1,024 + 1,024) x 16 = 98,304
    assert e["qkv_proj"] == 294_912
    assert e["gate_up_proj"] == 131_072 + 2 * 14_336 * 16 == 589_824
    assert e["down_proj"] == 16 * 14_336 + 4096 * 16 == 294_912
    assert sum(e[m] for m in LINEAR4) == 1_310_720
    # 128,256 x 16 + 4,096 x 16 = 2,117,632
    assert e["embed_tokens"] == e["lm_head"] == 2_117_632
    # ODD: A 3 x (16, 64) = 3,072, B (96 + 48 + 48) x 16 = 3,072; o takes the 96-wide input
    eo = impl.slot_elements(ODD, 16)
    assert eo["qkv_proj"] == 6144 and eo["o_proj"] == 16 * 96 + 64 * 16 == 2560


def test_slot_reservation_llama2_7b_linear_layers():
    # 1,249,280 elements x 32 layers x 2 B = 79,953,920 B = 76.25 MiB per slot
    one = impl.slot_reservation_bytes(L2, 1, 16, target_modules=LINEAR4)
    assert one == 79_953_920 and one / MiB == 76.25
    # 8 slots: 639,631,360 B = 610 MiB
    eight = impl.slot_reservation_bytes(L2, 8, 16, target_modules=LINEAR4)
    assert eight == 639_631_360 and eight / MiB == 610
    # a slot is exactly one all-linear PEFT adapter at rank max_lora_rank
    assert one == impl.adapter_bytes(L2, 16, ALL7)


def test_slot_reservation_default_targets_include_embeddings():
    # vLLM's default (target_modules=None) also wraps embed_tokens and lm_head:
    # 79,953,920 + 2 x 577,536 x 2 = 82,264,064 B (78.453125 MiB) per slot
    assert impl.slot_reservation_bytes(L2, 1, 16) == 82_264_064
    # 8 slots: 658,112,512 B = 627.625 MiB, 17.625 MiB more than the linear layers alone
    assert impl.slot_reservation_bytes(L2, 8, 16) == 658_112_512
    assert impl.slot_reservation_bytes(L2, 8, 16) / MiB == 627.625
    # Llama-3-8B: (32 x 1,310,720 + 2 x 2,117,632) x 2 B x 8 = 738,852,864 B = 704.625 MiB
    assert impl.slot_reservation_bytes(L3, 8, 16) == 738_852_864
    # the embeddings alone, and the projections alone, add up to the default
    emb = impl.slot_reservation_bytes(L3, 8, 16, target_modules=["embed_tokens", "lm_head"])
    assert emb == 8 * 2 * 2 * 2_117_632
    assert emb + impl.slot_reservation_bytes(L3, 8, 16, target_modules=LINEAR4) == 738_852_864


def test_slot_reservation_scales_with_slots_rank_and_dtype():
    base = impl.slot_reservation_bytes(L2, 1, 16)
    assert impl.slot_reservation_bytes(L2, 3, 16) == 3 * base
    # one tenant at rank 64 makes every slot 4x larger
    assert impl.slot_reservation_bytes(L2, 1, 64) == 4 * base
    assert impl.slot_reservation_bytes(L2, 1, 16, dtype_bytes=4) == 2 * base
    # max_loras = 32 at max_lora_rank = 64: 32 x 4 x 82,264,064 = 10,529,800,192 B (9.8 GiB)
    assert impl.slot_reservation_bytes(L2, 32, 64) == 10_529_800_192


def test_slot_targets_wrap_whole_packed_modules():
    # a PEFT child name wraps its packed parent whole: all three q/k/v slices
    assert impl.slot_elements(L2, 16, ["q_proj"]) == {"qkv_proj": 393_216}
    assert impl.slot_elements(L2, 16, ["up_proj", "o_proj"]) == {"gate_up_proj": 483_328,
                                                                   "o_proj": 131_072}
    # 32 layers x 393,216 x 2 B = 25,165,824 B = 24 MiB for the qkv stacks of one slot
    assert impl.slot_reservation_bytes(L2, 1, 16, target_modules=["k_proj"]) == 24 * MiB
    # the embeddings are counted once, not per layer: 577,536 x 2 B
    assert impl.slot_reservation_bytes(L2, 1, 16, target_modules=["lm_head"]) == 1_155_072


def test_max_lora_rank_takes_only_upstream_values():
    for rank in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        assert impl.slot_elements(ODD, rank)["o_proj"] == rank * (96 + 64)
    for bad in (0, 2, 12, 24, 1024, 16.0, True):
        with pytest.raises(ValueError, match="max_lora_rank"):
            impl.slot_reservation_bytes(L2, 1, bad)


# ---------------------------------------------------------------- bad input


def test_lower_bounds_are_inclusive():
    # 1 is a valid size, rank, byte width and adapter count everywhere
    assert impl.flops_per_token(1, 1, 1) == (2, 4)
    assert impl.adapter_bytes(ODD, 1, ["o_proj"], dtype_bytes=1) == 2 * (96 + 64) == 320
    # ODD, r 1, one fp8-sized copy: base 121,152 B; one q_proj adapter 2 x (64 + 96) = 320 B
    plan = impl.serving_plan(ODD, 1, ["q_proj"], 1, merged=False, dtype_bytes=1)
    assert plan.weight_bytes == 121_152 + 320
    assert impl.slot_reservation_bytes(ODD, 1, 1, dtype_bytes=1, target_modules=["o_proj"]) == 320


@pytest.mark.parametrize("call, name", [
    (lambda: impl.lora_params_per_layer(0, 8, 4), "in_features"),
    (lambda: impl.lora_params_per_layer(8, 0, 4), "out_features"),
    (lambda: impl.lora_params_per_layer(8, 8, 0), "r"),
    (lambda: impl.lora_params_per_layer(8, 8, 2.0), "r"),
    (lambda: impl.adapter_params(L2, 0, ATTN), "r"),
    (lambda: impl.adapter_params(L2, 16, []), "target_modules"),
    (lambda: impl.adapter_params(L2, 16, "q_proj"), "target_modules"),
    (lambda: impl.adapter_params(L2, 16, ["qkv_proj"]), "target_modules"),
    (lambda: impl.adapter_params(L2, 16, ["q_proj", "lm_head"]), "target_modules"),
    (lambda: impl.adapter_bytes(L2, 16, ATTN, dtype_bytes=0), "dtype_bytes"),
    (lambda: impl.adapter_bytes(L2, 16, ["bogus"]), "target_modules"),
    (lambda: impl.shrink_ratio(0, 5), "base_params"),
    (lambda: impl.shrink_ratio(7e9, 0), "adapter_params"),
    (lambda: impl.shrink_ratio(7e9, math.inf), "adapter_params"),
    (lambda: impl.shrink_ratio(math.nan, 5), "base_params"),
    (lambda: impl.gpus_saved(-1, 8), "num_adapters"),
    (lambda: impl.gpus_saved(10, 0), "max_loras"),
    (lambda: impl.gpus_saved(10, 8, 0), "gpus_per_model"),
    (lambda: impl.gpus_saved(10.5, 8), "num_adapters"),
    (lambda: impl.flops_per_token(0, 8, 4), "in_features"),
    (lambda: impl.flops_per_token(8, 0, 4), "out_features"),
    (lambda: impl.flops_per_token(8, 8, 0), "r"),
    (lambda: impl.serving_plan(L2, 16, ATTN, 0, False), "num_adapters"),
    (lambda: impl.serving_plan(L2, 16, ATTN, 1, "yes"), "merged"),
    (lambda: impl.serving_plan(L2, 16, ATTN, 1, False, dtype_bytes=0), "dtype_bytes"),
    (lambda: impl.serving_plan(L2, 16, ATTN, 1, True, dtype_bytes=0), "dtype_bytes"),
    (lambda: impl.serving_plan(L2, 0, ATTN, 1, False), "r"),
    (lambda: impl.serving_plan(L2, 16, ["x"], 1, True), "target_modules"),
    (lambda: impl.slot_elements(L2, 16, ["gate_proj", "mlp"]), "target_modules"),
    (lambda: impl.slot_elements(L2, 16, []), "target_modules"),
    (lambda: impl.slot_reservation_bytes(L2, 0, 16), "max_loras"),
    (lambda: impl.slot_reservation_bytes(L2, 1, 16, dtype_bytes=0), "dtype_bytes"),
    (lambda: impl.slot_reservation_bytes(L2, 1, 16, target_modules="qkv_proj"), "target_modules"),
])
def test_bad_inputs_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        call()


# ---------------------------------------------------------------- the PEFT oracle


@pytest.fixture(scope="module")
def peft_counts():
    """Real PEFT adapters on a tiny random Llama (ODD's shape): lora_A/lora_B parameters counted."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, head_dim=24, tie_word_embeddings=False)
    counts = {"base": sum(p.numel() for p in transformers.LlamaForCausalLM(config).parameters())}
    for r, targets in ((4, ATTN), (4, ALL7), (8, ("k_proj", "v_proj", "down_proj"))):
        model = transformers.LlamaForCausalLM(config)
        with warnings.catch_warnings():  # transformers' deprecation notice, reached through peft
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = peft.get_peft_model(model, peft.LoraConfig(r=r, target_modules=list(targets)))
        counts[(r, targets)] = sum(p.numel() for n, p in wrapped.named_parameters()
                                   if ".lora_A." in n or ".lora_B." in n)
    return impl.ModelShape.from_hf(config), counts


def test_adapter_params_match_a_real_peft_adapter(peft_counts):
    shape, counts = peft_counts
    assert shape == ODD
    for key, count in counts.items():
        if key != "base":
            r, targets = key
            assert impl.adapter_params(shape, r, targets) == count
    # 2 layers x (640 + 448 + 448 + 640 + 3 x 960) = 10,112: 5,056 per layer at r 4
    assert counts[(4, ALL7)] == 10_112
    assert impl.base_model_params(shape) == counts["base"] == 121_152
