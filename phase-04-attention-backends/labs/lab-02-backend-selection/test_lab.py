import course
from course import load_impl

impl = load_impl(__file__)

import ast  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
UPSTREAM = course.UPSTREAM

T4, A100, L4, H100, H200, B200 = (7, 5), (8, 0), (8, 9), (9, 0), (9, 0), (10, 0)
NON_10 = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
SM10 = ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]


def cfg(head_size=64, dtype="bfloat16", **kw):
    return impl.AttnConfig(head_size, dtype, **kw)


def mla(**kw):
    # DeepSeek-V3's latent cache: 512 + 64 = 576 per token.
    return impl.AttnConfig(576, "bfloat16", use_mla=True, **kw)


def reasons(name, config, capability):
    return impl.validate_configuration(impl.BACKENDS[name], config, capability)


def auto_line(chosen, potential):
    names = ", ".join(f"'{n}'" for n in potential)
    return f"Using {chosen} attention backend out of potential backends: [{names}]."


# ---------------------------------------------------------------- priorities


def test_priorities_one_list_for_blackwell_one_for_everything_else():
    # vllm/platforms/cuda.py:79 _get_backend_priorities: major == 10 puts FlashInfer first.
    assert impl.backend_priorities(False, B200) == SM10
    assert impl.backend_priorities(False, (10, 3)) == SM10
    for cap in (T4, A100, L4, H100, (12, 0)):
        assert impl.backend_priorities(False, cap) == NON_10, cap


def test_mla_priorities_and_the_sparse_tail_on_blackwell():
    assert impl.backend_priorities(True, H100) == [
        "FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE"]
    assert impl.backend_priorities(True, L4) == impl.backend_priorities(True, H100)
    head = ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA",
            "TRITON_MLA"]
    fi_first = head + ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
    fm_first = head + ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"]
    # Unquantized cache: 16 heads or fewer prefer FlashInfer (no head padding).
    assert impl.backend_priorities(True, B200) == fm_first
    assert impl.backend_priorities(True, B200, num_heads=16) == fi_first
    assert impl.backend_priorities(True, B200, num_heads=17) == fm_first
    assert impl.backend_priorities(True, B200, 128, "auto") == fm_first
    # A quantized cache (fp8*, *per_token_head, nvfp4) prefers FlashInfer whatever the heads.
    for kv in ("fp8", "fp8_e4m3", "fp8_ds_mla", "int8_per_token_head", "nvfp4"):
        assert impl.backend_priorities(True, B200, 128, kv) == fi_first, kv
    assert impl.backend_priorities(True, B200, 128, "bfloat16") == fm_first
    # The head count and cache dtype change nothing outside 10.x.
    assert impl.backend_priorities(True, H100, 8, "fp8") == impl.backend_priorities(True, H100)


def test_priorities_reject_a_malformed_capability():
    for bad in (9.0, (9,), (9, 0, 0), (-1, 0), (9, 10), ("9", "0")):
        with pytest.raises(ValueError, match="capability"):
            impl.backend_priorities(False, bad)


# ---------------------------------------------------------------- validation


def test_every_reason_in_upstreams_order():
    # vllm/v1/attention/backend.py:271 validate_configuration appends in this order:
    # head size, dtype, KV-cache dtype, block size, MLA kind, sparse kind, capability.
    bad = cfg(80, "float32", kv_cache_dtype="fp8_e5m2", block_size=8)
    assert reasons("FLASHMLA_SPARSE", bad, A100) == [
        "head_size not supported", "dtype not supported", "kv_cache_dtype not supported",
        "block_size not supported", "non-MLA not supported", "non-sparse not supported",
        "compute capability not supported"]
    # The other wording of each mismatch: an MLA, sparse model on a dense non-MLA backend.
    sparse_mla = impl.AttnConfig(576, "bfloat16", use_mla=True, use_sparse=True)
    assert reasons("FLASH_ATTN", sparse_mla, H100) == [
        "head_size not supported", "MLA not supported", "sparse not supported"]
    assert reasons("FLASHMLA_SPARSE", sparse_mla, H100) == []
    assert reasons("FLASHMLA", sparse_mla, H100) == ["sparse not supported"]


def test_head_size_rules_per_backend():
    # FLASH_ATTN: a multiple of 8, at most 256 (flash_attn.py:174-176).
    for h, ok in ((64, True), (72, True), (80, True), (256, True), (84, False), (264, False),
                  (512, False)):
        assert (reasons("FLASH_ATTN", cfg(h), H100) == []) is ok, h
    # FLASHINFER: a fixed list (flashinfer.py:405).
    for h, ok in ((64, True), (128, True), (256, True), (512, True), (80, False), (96, False)):
        assert (reasons("FLASHINFER", cfg(h), H100) == []) is ok, h
    # TRITON_ATTN: 32 or more, anything (triton_attn.py:367); FLEX: anything.
    assert reasons("TRITON_ATTN", cfg(32), H100) == []
    assert reasons("TRITON_ATTN", cfg(24), H100) == ["head_size not supported"]
    assert reasons("TRITON_ATTN", cfg(8), T4) == ["head_size not supported"]
    assert reasons("FLEX_ATTENTION", cfg(24), H100) == []
    # MLA heads are the latent width: 320 or 576, except Triton MLA (any).
    assert reasons("FLASHMLA", mla(), H100) == []
    assert reasons("FLASHMLA", impl.AttnConfig(320, use_mla=True), H100) == []
    assert reasons("FLASHMLA", impl.AttnConfig(512, use_mla=True), H100) == ["head_size not supported"]
    assert reasons("TRITON_MLA", impl.AttnConfig(512, use_mla=True), H100) == []


def test_dtype_and_kv_cache_dtype():
    assert reasons("FLASH_ATTN", cfg(dtype="float32"), H100) == ["dtype not supported"]
    assert reasons("FLASHINFER", cfg(dtype="float32"), H100) == ["dtype not supported"]
    assert reasons("TRITON_ATTN", cfg(dtype="float32"), H100) == []
    assert reasons("FLASHMLA_SPARSE", impl.AttnConfig(576, "float16", use_mla=True, use_sparse=True),
                   H100) == ["dtype not supported"]
    # FlashAttention's fp8 cache is FA3's, so 9.x only (flash_attn.py:186-191).
    assert reasons("FLASH_ATTN", cfg(kv_cache_dtype="fp8"), H100) == []
    assert reasons("FLASH_ATTN", cfg(kv_cache_dtype="fp8_e4m3"), (9, 0)) == []
    for cap in (A100, L4, B200):
        assert reasons("FLASH_ATTN", cfg(kv_cache_dtype="fp8"), cap) == ["kv_cache_dtype not supported"]
    assert reasons("FLASH_ATTN", cfg(kv_cache_dtype="fp8_e5m2"), H100) == ["kv_cache_dtype not supported"]
    assert reasons("FLASHINFER", cfg(kv_cache_dtype="nvfp4"), A100) == []
    assert reasons("TURBOQUANT", cfg(), H100) == ["kv_cache_dtype not supported"]
    assert reasons("TURBOQUANT", cfg(kv_cache_dtype="turboquant_k8v4"), H100) == []


def test_block_size_is_checked_only_when_set_and_as_a_multiple():
    assert reasons("FLASHINFER", cfg(block_size=None), H100) == []
    # 48 is none of FlashInfer's [16, 32, 64], but a multiple of 16: accepted
    # (backend.py supports_block_size treats every size as a divisor).
    for bs, ok in ((16, True), (48, True), (128, True), (8, False), (24, False)):
        assert (reasons("FLASHINFER", cfg(block_size=bs), H100) == []) is ok, bs
    assert reasons("FLASHMLA", mla(block_size=32), H100) == ["block_size not supported"]
    assert reasons("FLASHMLA", mla(block_size=128), H100) == []
    assert reasons("CUTLASS_MLA", mla(block_size=64), B200) == ["block_size not supported"]
    assert reasons("TRITON_ATTN", cfg(block_size=1), H100) == ["block_size not supported"]


def test_compute_capability_bounds():
    # FLASH_ATTN: >= 8.0. FLASHINFER: 7.5 ..= 12.1. Triton: any.
    assert reasons("FLASH_ATTN", cfg(), T4) == ["compute capability not supported"]
    assert reasons("FLASH_ATTN", cfg(), (7, 9)) == ["compute capability not supported"]
    assert reasons("FLASH_ATTN", cfg(), A100) == []
    assert reasons("FLASHINFER", cfg(), T4) == []
    assert reasons("FLASHINFER", cfg(), (7, 0)) == ["compute capability not supported"]
    assert reasons("FLASHINFER", cfg(), (12, 1)) == []
    assert reasons("FLASHINFER", cfg(), (12, 2)) == ["compute capability not supported"]
    assert reasons("TRITON_ATTN", cfg(), (6, 0)) == []
    # MLA kernels name major versions: FA-MLA 9, FlashMLA 9 or 10, FlashInfer-MLA 10.
    table = {"FLASH_ATTN_MLA": {9}, "FLASHMLA": {9, 10}, "FLASHINFER_MLA": {10},
             "CUTLASS_MLA": {10}, "TRITON_MLA": {8, 9, 10, 12}}
    for name, majors in table.items():
        for major in (8, 9, 10, 12):
            got = reasons(name, mla(), (major, 0))
            assert (got == []) is (major in majors), (name, major, got)


def test_validation_rejects_a_malformed_capability():
    with pytest.raises(ValueError, match="capability"):
        impl.validate_configuration(impl.BACKENDS["FLASH_ATTN"], cfg(), (9,))


# ---------------------------------------------------------------- auto selection


def test_t4_fp16_head_64_gets_flashinfer():
    # FLASH_ATTN needs >= 8.0; FLASHINFER starts at 7.5 and takes head 64.
    name, line = impl.select_backend(cfg(dtype="float16"), T4)
    assert name == "FLASHINFER"
    assert line == auto_line("FLASHINFER", ["FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"])


@pytest.mark.parametrize("cap", [A100, L4, H100, H200])
def test_ampere_ada_hopper_bf16_get_flash_attn(cap):
    # Nothing before FLASH_ATTN fails; TURBOQUANT is never valid with an "auto" cache.
    assert impl.select_backend(cfg(), cap) == (
        "FLASH_ATTN", auto_line("FLASH_ATTN", ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN",
                                               "FLEX_ATTENTION"]))


def test_b200_gets_flashinfer_first_in_its_list():
    assert impl.select_backend(cfg(128), B200) == (
        "FLASHINFER", auto_line("FLASHINFER", ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN",
                                               "FLEX_ATTENTION"]))


def test_l4_float32_gets_triton():
    assert impl.select_backend(cfg(dtype="float32"), L4) == (
        "TRITON_ATTN", auto_line("TRITON_ATTN", ["TRITON_ATTN", "FLEX_ATTENTION"]))


def test_t4_head_80_gets_triton():
    # FLASH_ATTN: capability; FLASHINFER: 80 is not in 64/128/256/512.
    assert reasons("FLASHINFER", cfg(80, "float16"), T4) == ["head_size not supported"]
    assert impl.select_backend(cfg(80, "float16"), T4) == (
        "TRITON_ATTN", auto_line("TRITON_ATTN", ["TRITON_ATTN", "FLEX_ATTENTION"]))


def test_head_80_on_an_h100_still_gets_flash_attn():
    assert impl.select_backend(cfg(80), H100) == (
        "FLASH_ATTN", auto_line("FLASH_ATTN", ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]))


def test_user_block_size_8_on_l4_leaves_nothing_valid():
    # Every kernel needs a multiple of 16; TURBOQUANT also refuses the "auto" cache.
    want = ("No valid attention backend found for cuda with AttentionSelectorConfig(head_size=64, "
            "dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=8, use_mla=False, "
            "has_sink=False, use_sparse=False, use_mm_prefix=False, "
            "use_per_head_quant_scales=False, attn_type=AttentionType.DECODER, "
            "use_non_causal=False, use_batch_invariant=False). Reasons: "
            "{FLASH_ATTN: [block_size not supported], FLASHINFER: [block_size not supported], "
            "TRITON_ATTN: [block_size not supported], FLEX_ATTENTION: [block_size not supported], "
            "TURBOQUANT: [kv_cache_dtype not supported, block_size not supported]}.")
    with pytest.raises(ValueError) as err:
        impl.select_backend(cfg(block_size=8), L4)
    assert str(err.value) == want


def test_a_user_block_size_can_move_the_choice_down_the_list():
    # MLA on a B200 with --block-size 16: FLASHINFER_MLA (32/64), CUTLASS_MLA (128) and
    # FLASHMLA (64) drop out; FLASH_ATTN_MLA is Hopper-only; TRITON_MLA is left.
    assert impl.select_backend(mla(block_size=16), B200) == (
        "TRITON_MLA", auto_line("TRITON_MLA", ["TRITON_MLA"]))
    assert impl.select_backend(mla(block_size=32), H100) == (
        "FLASH_ATTN_MLA", auto_line("FLASH_ATTN_MLA", ["FLASH_ATTN_MLA", "TRITON_MLA"]))
    assert impl.select_backend(cfg(block_size=48), B200)[0] == "FLASHINFER"


def test_mla_on_l4_h100_b200():
    # L4 (8.9): FA-MLA needs 9, FlashMLA 9/10, FlashInfer-MLA 10 -> Triton MLA, never FlashMLA.
    assert impl.select_backend(mla(), L4) == ("TRITON_MLA", auto_line("TRITON_MLA", ["TRITON_MLA"]))
    assert reasons("FLASHMLA", mla(), L4) == ["compute capability not supported"]
    assert impl.select_backend(mla(), H100) == (
        "FLASH_ATTN_MLA", auto_line("FLASH_ATTN_MLA", ["FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"]))
    # B200: TOKENSPEED_MLA takes an fp8 cache only; the sparse pair wants a sparse model.
    assert impl.select_backend(mla(), B200) == (
        "FLASHINFER_MLA", auto_line("FLASHINFER_MLA", ["FLASHINFER_MLA", "CUTLASS_MLA",
                                                       "FLASHMLA", "TRITON_MLA"]))
    assert impl.select_backend(mla(kv_cache_dtype="fp8"), B200) == (
        "FLASHINFER_MLA", auto_line("FLASHINFER_MLA", ["FLASHINFER_MLA", "TOKENSPEED_MLA",
                                                       "CUTLASS_MLA", "FLASHMLA", "TRITON_MLA"]))


def test_sparse_mla_on_blackwell_follows_the_head_count():
    sparse = impl.AttnConfig(576, "bfloat16", use_mla=True, use_sparse=True, num_heads=128)
    assert impl.select_backend(sparse, B200)[1] == auto_line(
        "FLASHMLA_SPARSE", ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"])
    few = impl.AttnConfig(576, "bfloat16", use_mla=True, use_sparse=True, num_heads=16)
    assert impl.select_backend(few, B200)[1] == auto_line(
        "FLASHINFER_MLA_SPARSE", ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"])
    assert impl.select_backend(sparse, H100) == (
        "FLASHMLA_SPARSE", auto_line("FLASHMLA_SPARSE", ["FLASHMLA_SPARSE"]))


def test_turboquant_cache_reaches_the_last_backend():
    assert impl.select_backend(cfg(kv_cache_dtype="turboquant_4bit_nc"), H100) == (
        "TURBOQUANT", auto_line("TURBOQUANT", ["TURBOQUANT"]))


# ---------------------------------------------------------------- explicit choice


def test_explicit_valid_choice_logs_the_enum_member():
    assert impl.select_backend(cfg(), H100, "FLASHINFER") == (
        "FLASHINFER", "Using AttentionBackendEnum.FLASHINFER backend.")
    # A lower-priority backend is used when asked for; names are upper-cased.
    assert impl.select_backend(cfg(), H100, "triton_attn") == (
        "TRITON_ATTN", "Using AttentionBackendEnum.TRITON_ATTN backend.")
    # "auto" in any case is automatic selection.
    assert impl.select_backend(cfg(), H100, "Auto") == impl.select_backend(cfg(), H100)


def test_explicit_invalid_choice_raises_instead_of_falling_back():
    # Auto would pick FLASHINFER on a T4; asking for FLASH_ATTN is an error.
    with pytest.raises(ValueError) as err:
        impl.select_backend(cfg(dtype="float16"), T4, "FLASH_ATTN")
    assert str(err.value) == ("Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for "
                              "this configuration. Reason: ['compute capability not supported']")
    with pytest.raises(ValueError, match=re.escape("Reason: ['block_size not supported']")):
        impl.select_backend(cfg(block_size=8), L4, "TRITON_ATTN")


def test_explicit_flashmla_on_a_llama_model():
    # head 128 is not an MLA width (appended first), and the model is not MLA.
    with pytest.raises(ValueError) as err:
        impl.select_backend(cfg(128), H100, "FLASHMLA")
    assert str(err.value) == ("Selected backend AttentionBackendEnum.FLASHMLA is not valid for "
                              "this configuration. Reason: ['head_size not supported', "
                              "'non-MLA not supported']")
    with pytest.raises(ValueError, match=re.escape(
            "Reason: ['head_size not supported', 'non-MLA not supported', "
            "'compute capability not supported']")):
        impl.select_backend(cfg(128), L4, "FLASHMLA")


# ---------------------------------------------------------------- CPU platform


def test_cpu_platform_ignores_an_explicit_choice():
    for choice in ("FLASH_ATTN", "FLASHMLA", "flashinfer"):
        name, line = impl.select_backend(cfg(dtype="float32"), None, choice, platform="cpu")
        assert name == "CPU_ATTN"
        assert line == f"Cannot use AttentionBackendEnum.{choice.upper()} backend on CPU."
    # Auto and an explicit CPU_ATTN log nothing.
    assert impl.select_backend(cfg(dtype="float32"), None, platform="cpu") == ("CPU_ATTN", "")
    assert impl.select_backend(cfg(dtype="float32"), (8, 0), "CPU_ATTN", "cpu") == ("CPU_ATTN", "")


def test_cpu_platform_refuses_mla_and_sparse():
    # The same platform takes an ordinary model; MLA and sparse stop it (cpu.py:82-85).
    assert impl.select_backend(cfg(dtype="float32"), None, "FLASHMLA", platform="cpu")[0] == "CPU_ATTN"
    with pytest.raises(NotImplementedError, match="MLA is not supported on CPU."):
        impl.select_backend(mla(), None, platform="cpu")
    with pytest.raises(NotImplementedError, match="Sparse Attention is not supported on CPU."):
        impl.select_backend(cfg(use_sparse=True), None, "FLASH_ATTN", platform="cpu")


# ---------------------------------------------------------------- bad input


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="platform"):
        impl.select_backend(cfg(), H100, platform="rocm")
    with pytest.raises(ValueError, match="selected"):
        impl.select_backend(cfg(), H100, "FLASH_ATTENTION")
    with pytest.raises(ValueError, match="selected"):
        impl.select_backend(cfg(), H100, "CPU_ATTN")  # a CPU-only name on cuda
    with pytest.raises(ValueError, match="selected"):
        impl.select_backend(cfg(), H100, 3)
    with pytest.raises(ValueError, match="capability"):
        impl.select_backend(cfg(), (9, 0, 1))
    with pytest.raises(ValueError, match="capability"):
        impl.select_backend(cfg(), None, "FLASH_ATTN")


def test_config_and_log_parsing_helpers():
    for kw, field in (({"head_size": 0}, "head_size"), ({"head_size": 64, "dtype": "fp16"}, "dtype"),
                      ({"head_size": 64, "kv_cache_dtype": ""}, "kv_cache_dtype"),
                      ({"head_size": 64, "block_size": 0}, "block_size"),
                      ({"head_size": 64, "num_heads": 0}, "num_heads")):
        with pytest.raises(ValueError, match=field):
            impl.AttnConfig(**kw)
    prefix = "INFO 05-01 12:00:00 [cuda.py:378] "
    assert impl.parse_backend_from_log(prefix + auto_line("FLASH_ATTN", ["FLASH_ATTN"])) == "FLASH_ATTN"
    assert impl.parse_backend_from_log("Using AttentionBackendEnum.FLASHINFER backend.") == "FLASHINFER"
    assert impl.parse_backend_from_log("Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU.") \
        == "CPU_ATTN"
    assert impl.parse_backend_from_log("Using FLASHINFER KV cache layout for x backend.") is None
    assert impl.check_capability((9, 0)) == (9, 0)
    # What select_backend logs, the parser reads back.
    for cap, choice in ((H100, None), (H100, "TRITON_ATTN"), (None, "FLASH_ATTN")):
        platform = "cuda" if cap else "cpu"
        name, line = impl.select_backend(cfg(), cap, choice, platform)
        assert impl.parse_backend_from_log(line) == name


# ---------------------------------------------------------------- the README table


GPU_ROWS = [("T4", T4), ("A100", A100), ("L4", L4), ("H100", H100), ("H200", H200), ("B200", B200)]


def predicted_table():
    """Rows of the README's table, computed by the implementation. 16-bit means
    float16 below 8.0 (vLLM refuses bf16 there before selection) and bfloat16 above."""
    rows = []
    for gpu, cap in GPU_ROWS:
        half = "float16" if cap < (8, 0) else "bfloat16"
        cells = [impl.select_backend(impl.AttnConfig(h, half), cap)[0] for h in (64, 128)]
        cells.append(impl.select_backend(impl.AttnConfig(64, "float32"), cap)[0])
        cells.append(impl.select_backend(impl.AttnConfig(576, half, use_mla=True), cap)[0])
        rows.append([f"{gpu} ({cap[0]}.{cap[1]})", *cells])
    return rows


def test_readme_table_matches_the_solution():
    text = (HERE / "README.md").read_text()
    start = text.index("| GPU (capability) | 16-bit, head 64 |")
    lines = text[start:].splitlines()
    body = [ln for ln in lines[2:] if ln.startswith("|")]
    body = body[:len(GPU_ROWS)]
    parsed = [[c.strip().strip("`") for c in ln.strip("|").split("|")] for ln in body]
    assert parsed == predicted_table()


# ---------------------------------------------------------------- upstream


def _function(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.upstream
def test_priorities_match_upstream_source():
    """Run the pin's _get_backend_priorities (its AST, decorator dropped) with stand-ins
    for the enum and DeviceCapability, and compare with backend_priorities."""
    tree = ast.parse((UPSTREAM / "vllm/platforms/cuda.py").read_text())
    fn = _function(tree, "_get_backend_priorities")
    fn.decorator_list = []
    fn.returns = None
    for a in fn.args.args:
        a.annotation = None
    quant = _function(ast.parse((UPSTREAM / "vllm/utils/torch_utils.py").read_text()),
                      "is_quantized_kv_cache")

    class Enum:
        def __getattr__(self, name):
            return name

    class Cap:
        def __init__(self, major, minor):
            self.major, self.minor = major, minor

    ns = {"AttentionBackendEnum": Enum()}
    exec(compile(ast.Module(body=[quant, fn], type_ignores=[]), "cuda.py", "exec"), ns)
    upstream_fn = ns["_get_backend_priorities"]
    seen = set()
    for use_mla in (False, True):
        for cap in ((7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)):
            for heads in (None, 8, 16, 17, 128):
                for kv in (None, "auto", "bfloat16", "fp8", "nvfp4", "int8_per_token_head"):
                    want = upstream_fn(use_mla, Cap(*cap), heads, kv)
                    assert impl.backend_priorities(use_mla, cap, heads, kv) == want
                    seen.add(tuple(want))
    assert len(seen) == 5  # two ordinary lists, one MLA list, two Blackwell MLA orders


def _class(path, name):
    tree = ast.parse((UPSTREAM / path).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _classvar(cls, attr):
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == attr:
            return node.value
    return None


def _method_returns(cls, name):
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            found = [n for n in ast.walk(node) if isinstance(n, ast.Return)]
            return [n.value for n in sorted(found, key=lambda n: n.lineno)]
    return None


def _ints(node):
    return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, int)]


SOURCES = {
    "FLASH_ATTN": ("vllm/v1/attention/backends/flash_attn.py", "FlashAttentionBackend"),
    "FLASHINFER": ("vllm/v1/attention/backends/flashinfer.py", "FlashInferBackend"),
    "TRITON_ATTN": ("vllm/v1/attention/backends/triton_attn.py", "TritonAttentionBackend"),
    "FLEX_ATTENTION": ("vllm/v1/attention/backends/flex_attention.py", "FlexAttentionBackend"),
    "TURBOQUANT": ("vllm/v1/attention/backends/turboquant_attn.py", "TurboQuantAttentionBackend"),
    "FLASH_ATTN_MLA": ("vllm/v1/attention/backends/mla/flashattn_mla.py", "FlashAttnMLABackend"),
    "FLASHMLA": ("vllm/v1/attention/backends/mla/flashmla.py", "FlashMLABackend"),
    "FLASHINFER_MLA": ("vllm/v1/attention/backends/mla/flashinfer_mla.py", "FlashInferMLABackend"),
    "TRITON_MLA": ("vllm/v1/attention/backends/mla/triton_mla.py", "TritonMLABackend"),
    "CUTLASS_MLA": ("vllm/v1/attention/backends/mla/cutlass_mla.py", "CutlassMLABackend"),
    "TOKENSPEED_MLA": ("vllm/v1/attention/backends/mla/tokenspeed_mla.py", "TokenspeedMLABackend"),
    "FLASHMLA_SPARSE": ("vllm/v1/attention/backends/mla/flashmla_sparse.py", "FlashMLASparseBackend"),
    "FLASHINFER_MLA_SPARSE": ("vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py",
                              "FlashInferMLASparseBackend"),
}


@pytest.mark.upstream
def test_backends_table_matches_upstream_declarations():
    mla_base = _class("vllm/model_executor/layers/attention/mla_attention.py", "MLACommonBackend")
    mla_heads = tuple(_ints(_method_returns(mla_base, "get_supported_head_sizes")[0]))
    assert mla_heads == (320, 576)
    assert set(SOURCES) == set(impl.BACKENDS)
    # The table holds exactly the candidates the priority lists can name.
    every = set(impl.backend_priorities(False, B200)) | set(impl.backend_priorities(True, B200))
    assert every == set(impl.BACKENDS)
    for name, (path, cls_name) in SOURCES.items():
        spec, cls = impl.BACKENDS[name], _class(path, cls_name)
        dtypes = tuple(e.attr for e in _classvar(cls, "supported_dtypes").elts)
        assert spec.dtypes == dtypes, name
        kv = tuple(e.value for e in _classvar(cls, "supported_kv_cache_dtypes").elts)
        assert spec.kv_cache_dtypes == kv, name
        # The last return of get_supported_kernel_block_sizes: ints and MultipleOf(n) bases.
        blocks = _method_returns(cls, "get_supported_kernel_block_sizes")[-1]
        assert spec.kernel_block_sizes == tuple(_ints(blocks)), name
        heads = _method_returns(cls, "get_supported_head_sizes")
        if heads is not None:
            assert spec.head_sizes == tuple(_ints(heads[0])), name
        elif spec.is_mla:
            assert spec.head_sizes == mla_heads, name
        cap = _method_returns(cls, "supports_compute_capability")
        if cap is None or (isinstance(cap[0], ast.Constant) and cap[0].value is True):
            assert (spec.min_capability, spec.max_capability, spec.capability_majors) == \
                (None, None, ()), name
        elif "major" in ast.unparse(cap[0]):
            assert spec.capability_majors == tuple(_ints(cap[0])), name
        else:  # DeviceCapability(a, b) bounds
            bounds = _ints(cap[0])
            assert spec.min_capability == tuple(bounds[:2]), name
            assert (spec.max_capability or ()) == tuple(bounds[2:4]), name
    # The head-size rules that are code rather than a list.
    fa = ast.unparse(_class(*SOURCES["FLASH_ATTN"]))
    assert f"head_size % {impl.BACKENDS['FLASH_ATTN'].head_size_multiple} != 0" in fa
    assert f"head_size <= {impl.BACKENDS['FLASH_ATTN'].head_size_max}" in fa
    triton = ast.unparse(_class(*SOURCES["TRITON_ATTN"]))
    assert f"head_size >= {impl.BACKENDS['TRITON_ATTN'].head_size_min}" in triton
