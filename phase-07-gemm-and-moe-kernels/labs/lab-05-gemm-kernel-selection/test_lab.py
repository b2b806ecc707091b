"""Lab 07-05 tests: the FP8 linear-kernel selector, card by card, and against the pin's code."""
from __future__ import annotations

import course
from course import load_impl

impl = load_impl(__file__)

import ast  # noqa: E402
import itertools  # noqa: E402
import pathlib  # noqa: E402
import random  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
UPSTREAM = course.UPSTREAM
LINEAR = "vllm/model_executor/kernels/linear"

MARLIN, FLASHINFER, CUTLASS = impl.MARLIN, impl.FLASHINFER, impl.CUTLASS
TORCH_T, TORCH_C = impl.TORCH_PER_TENSOR, impl.TORCH_CHANNELWISE
T, TOK, CH = impl.PER_TENSOR, impl.PER_TOKEN, impl.PER_CHANNEL

# The four layouts an FP8 layer can have here (activation, weight).
TT = impl.FP8Config(T, T)      # static input scales, per-tensor weight (Fp8LinearMethod, static)
KT = impl.FP8Config(TOK, T)    # dynamic per-token activations (Fp8LinearMethod on >= 8.9)
TC = impl.FP8Config(T, CH)     # per-channel weight, per-tensor activations
KC = impl.FP8Config(TOK, CH)   # compressed-tensors "channel" strategy, dynamic tokens
ALL = (TT, KT, TC, KC)

NO_ENV = impl.Env()


def cuda(cap, flashinfer=False):
    return impl.Device("cuda", cap, has_flashinfer=flashinfer)


CPU = impl.Device("cpu", None)


def choose(cfg, device, **kw):
    return impl.choose_fp8_kernel(cfg, device, **kw)


# ---------------------------------------------------------------- capability


def test_capability_to_int_is_major_times_ten_plus_minor():
    # T4 7.5, A100 8.0, A10G 8.6, L4 8.9, H100 9.0, B200 10.0, RTX 5090 12.0, GB10 12.1
    got = [impl.capability_to_int(c) for c in
           [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (12, 1)]]
    assert got == [75, 80, 86, 89, 90, 100, 120, 121]
    # 100 > 90 > 89 as ints: the comparisons the kernels make are on these numbers
    assert impl.capability_to_int((10, 0)) > impl.capability_to_int((9, 0))
    assert impl.capability_to_int(None) is None
    # the contract's edges: major 0 and minor 9 are still encodable
    assert impl.capability_to_int((0, 9)) == 9
    assert isinstance(impl.capability_to_int((9, 0)), int)


@pytest.mark.parametrize("bad", [(8, 10), (-1, 0), (8,), (8, 9, 0), "8.9", (8.0, 9), [8, 9]])
def test_capability_to_int_refuses_what_the_encoding_cannot_hold(bad):
    # a two-digit minor would collide: (8, 10) would read as 90, an H100
    with pytest.raises(ValueError, match="capability"):
        impl.capability_to_int(bad)


# ---------------------------------------------------------------- is_supported, kernel by kernel


def test_marlin_runs_from_7_5_up_to_but_not_including_8_9():
    for cap in (75, 80, 86, 88):
        assert impl.is_supported(MARLIN, cuda(cap), NO_ENV) == (True, None), cap
    assert impl.is_supported(MARLIN, cuda(70), NO_ENV) == (False, impl.R_MARLIN_SM75)
    assert impl.is_supported(MARLIN, cuda(74), NO_ENV) == (False, impl.R_MARLIN_SM75)
    # 89 itself is refused (L4, RTX 4090: FP8 tensor cores exist there)
    for cap in (89, 90, 100, 120):
        assert impl.is_supported(MARLIN, cuda(cap), NO_ENV) == (False, impl.R_MARLIN_FORCE), cap
    assert impl.is_supported(MARLIN, CPU, NO_ENV) == (False, impl.R_NEEDS_CUDA)


def test_force_fp8_marlin_opens_high_cards_but_not_old_ones():
    forced = impl.Env(force_fp8_marlin=True)
    for cap in (89, 90, 100):
        assert impl.is_supported(MARLIN, cuda(cap), forced) == (True, None)
    # the switch lifts the upper limit only: 7.0 still lacks what Marlin needs
    assert impl.is_supported(MARLIN, cuda(70), forced) == (False, impl.R_MARLIN_SM75)
    assert impl.is_supported(MARLIN, CPU, forced) == (False, impl.R_NEEDS_CUDA)


def test_batch_invariant_mode_refuses_marlin_and_is_checked_before_the_89_limit():
    inv = impl.Env(batch_invariant=True)
    assert impl.is_supported(MARLIN, cuda(80), inv) == (False, impl.R_MARLIN_BATCH_INVARIANT)
    # on an H100 both refusals apply: upstream reports the batch-invariant one first
    assert impl.is_supported(MARLIN, cuda(90), inv) == (False, impl.R_MARLIN_BATCH_INVARIANT)
    # and the 7.5 test comes before it
    assert impl.is_supported(MARLIN, cuda(70), inv) == (False, impl.R_MARLIN_SM75)
    # the other kernels do not read the switch
    assert impl.is_supported(CUTLASS, cuda(80), inv) == (True, None)


def test_flashinfer_needs_the_package_and_capability_10_0():
    assert impl.is_supported(FLASHINFER, cuda(100, True), NO_ENV) == (True, None)
    assert impl.is_supported(FLASHINFER, cuda(120, True), NO_ENV) == (True, None)
    assert impl.is_supported(FLASHINFER, cuda(90, True), NO_ENV) == (False, impl.R_NEEDS_SM100)
    assert impl.is_supported(FLASHINFER, cuda(99, True), NO_ENV) == (False, impl.R_NEEDS_SM100)
    # not installed: that reason wins even on a card that is too old as well
    assert impl.is_supported(FLASHINFER, cuda(100), NO_ENV) == (False, impl.R_NEEDS_FLASHINFER)
    assert impl.is_supported(FLASHINFER, cuda(80), NO_ENV) == (False, impl.R_NEEDS_FLASHINFER)
    assert impl.is_supported(FLASHINFER, impl.Device("cpu", None, True), NO_ENV) == \
        (False, impl.R_NEEDS_CUDA)


def test_cutlass_claims_every_cuda_card_and_no_cpu():
    # no capability test at all: a 7.0 card passes is_supported
    for cap in (70, 75, 80, 89, 90, 100, 120):
        assert impl.is_supported(CUTLASS, cuda(cap), NO_ENV) == (True, None)
    assert impl.is_supported(CUTLASS, CPU, NO_ENV) == (False, impl.R_NEEDS_CUDA)


def test_torch_kernels_need_8_9_on_cuda_and_nothing_on_cpu():
    for k in (TORCH_T, TORCH_C):
        assert impl.is_supported(k, cuda(80), NO_ENV) == (False, impl.R_NEEDS_SM89)
        assert impl.is_supported(k, cuda(88), NO_ENV) == (False, impl.R_NEEDS_SM89)
        assert impl.is_supported(k, cuda(89), NO_ENV) == (True, None)
        assert impl.is_supported(k, cuda(100), NO_ENV) == (True, None)
        # a CPU has no capability, so the 8.9 test does not apply
        assert impl.is_supported(k, CPU, NO_ENV) == (True, None)


def test_is_supported_ignores_disabled_kernels():
    # VLLM_DISABLED_KERNELS is the selector's test (check_kernel), not the kernel's
    env = impl.Env(disabled_kernels=(CUTLASS, MARLIN))
    assert impl.is_supported(CUTLASS, cuda(90), env) == (True, None)
    assert impl.is_supported(MARLIN, cuda(80), env) == (True, None)


# ---------------------------------------------------------------- can_implement


def test_can_implement_by_scale_layout():
    want = {
        # kernel: accepted layouts out of (TT, KT, TC, KC)
        MARLIN: (True, True, True, True),
        CUTLASS: (True, True, True, True),
        FLASHINFER: (True, False, False, False),
        TORCH_T: (True, False, False, False),
        TORCH_C: (False, True, True, True),
    }
    for kernel, oks in want.items():
        got = tuple(impl.can_implement(kernel, cfg)[0] for cfg in ALL)
        assert got == oks, kernel
    assert impl.can_implement(FLASHINFER, KT) == (False, impl.R_NEEDS_PER_TENSOR)
    assert impl.can_implement(TORCH_T, TC) == (False, impl.R_NEEDS_PER_TENSOR)
    assert impl.can_implement(TORCH_C, TT) == (False, impl.R_NOT_PER_TENSOR)
    assert impl.can_implement(MARLIN, KC) == (True, None)


def test_exactly_one_torch_kernel_fits_any_layer():
    for cfg in ALL:
        assert impl.can_implement(TORCH_T, cfg)[0] != impl.can_implement(TORCH_C, cfg)[0]


# ---------------------------------------------------------------- check_kernel messages


def test_check_kernel_messages_are_upstreams_text():
    assert impl.check_kernel(CUTLASS, KT, cuda(90), NO_ENV) == (True, "")
    # reason + ".": most reasons already end in a period, hence ".."
    assert impl.check_kernel(MARLIN, KT, cuda(90), NO_ENV) == (
        False, "MarlinFP8ScaledMMLinearKernel To apply FP8 Marlin on high-capability GPUs, "
               "please set VLLM_TEST_FORCE_FP8_MARLIN=1.")
    assert impl.check_kernel(FLASHINFER, KT, cuda(90), NO_ENV) == (
        False, "FlashInferFP8ScaledMMLinearKernel requires FlashInfer to be installed..")
    assert impl.check_kernel(FLASHINFER, KT, cuda(100, True), NO_ENV) == (
        False, "FlashInferFP8ScaledMMLinearKernel requires per tensor activation and "
               "weight scales..")
    # disabled: leading space, no period, and checked before anything else
    env = impl.Env(disabled_kernels=(TORCH_T,))
    assert impl.check_kernel(TORCH_T, TT, CPU, env) == (
        False, " PerTensorTorchFP8ScaledMMLinearKernel is disabled by environment variable")


def test_check_kernel_tests_support_before_the_layout():
    # both fail on an A100 for a per-token layer: the support reason is the one reported
    ok, msg = impl.check_kernel(TORCH_T, KT, cuda(80), NO_ENV)
    assert not ok and msg == f"{TORCH_T} {impl.R_NEEDS_SM89}."
    ok, msg = impl.check_kernel(TORCH_T, KT, cuda(90), NO_ENV)
    assert not ok and msg == f"{TORCH_T} {impl.R_NEEDS_PER_TENSOR}."


# ---------------------------------------------------------------- the selection, card by card


@pytest.mark.parametrize("cap", [75, 80, 86])
def test_cards_without_fp8_math_run_marlin_for_every_layout(cap):
    # T4, A100, A10G: Marlin is first in the list and accepts everything
    for flashinfer in (False, True):
        for cfg in ALL:
            assert choose(cfg, cuda(cap, flashinfer)) == MARLIN


@pytest.mark.parametrize("cap", [89, 90])
def test_ada_and_hopper_run_cutlass(cap):
    # Marlin refuses >= 89, FlashInfer refuses < 100, CUTLASS takes anything
    for flashinfer in (False, True):
        for cfg in ALL:
            assert choose(cfg, cuda(cap, flashinfer)) == CUTLASS


def test_blackwell_runs_flashinfer_only_for_per_tensor_scales():
    b200 = cuda(100, flashinfer=True)
    assert choose(TT, b200) == FLASHINFER
    # per-channel weight scales, or per-token activations: FlashInfer refuses, CUTLASS takes it
    assert [choose(c, b200) for c in (KT, TC, KC)] == [CUTLASS, CUTLASS, CUTLASS]
    # without the package, CUTLASS everywhere
    assert [choose(c, cuda(100)) for c in ALL] == [CUTLASS] * 4


def test_cpu_runs_a_torch_kernel_chosen_by_the_layout():
    assert [choose(c, CPU) for c in ALL] == [TORCH_T, TORCH_C, TORCH_C, TORCH_C]


def test_marlin_can_be_forced_onto_hopper_by_env():
    forced = impl.Env(force_fp8_marlin=True)
    assert choose(KT, cuda(90), env=forced) == MARLIN
    # it is first in the list, so it even beats FlashInfer on a B200
    assert choose(TT, cuda(100, True), env=forced) == MARLIN


def test_batch_invariant_sends_an_a100_to_cutlass():
    # Marlin refuses; CUTLASS's is_supported has no capability test, so it is next
    assert choose(KT, cuda(80), env=impl.Env(batch_invariant=True)) == CUTLASS


def test_disabling_kernels_walks_down_the_list():
    no_cutlass = impl.Env(disabled_kernels=(CUTLASS,))
    # H100 without CUTLASS: the torch fallbacks, one per layout
    assert choose(TT, cuda(90), env=no_cutlass) == TORCH_T
    assert choose(KT, cuda(90), env=no_cutlass) == TORCH_C
    # A100 without Marlin: CUTLASS again (it never looks at the capability)
    assert choose(KT, cuda(80), env=impl.Env(disabled_kernels=(MARLIN,))) == CUTLASS
    # B200 + FlashInfer without FlashInfer: CUTLASS
    assert choose(TT, cuda(100, True), env=impl.Env(disabled_kernels=(FLASHINFER,))) == CUTLASS


def test_no_kernel_left_raises_with_every_reason_in_list_order():
    env = impl.Env(disabled_kernels=(MARLIN, CUTLASS))
    with pytest.raises(ValueError, match="Failed to find a kernel") as err:
        choose(KT, cuda(80), env=env)
    head, *reasons = str(err.value).split("\n")
    assert head == ("Failed to find a kernel that can implement the ScaledMM linear layer. "
                    "Reasons: ")
    assert reasons == [
        f" {MARLIN} is disabled by environment variable",
        f"{FLASHINFER} {impl.R_NEEDS_FLASHINFER}.",
        f" {CUTLASS} is disabled by environment variable",
        f"{TORCH_T} {impl.R_NEEDS_SM89}.",
        f"{TORCH_C} {impl.R_NEEDS_SM89}.",
    ]
    # a CPU with both torch kernels disabled: two lines
    env = impl.Env(disabled_kernels=(TORCH_T, TORCH_C))
    with pytest.raises(ValueError, match="Failed to find a kernel") as err:
        choose(TT, CPU, env=env)
    assert len(str(err.value).split("\n")) == 3


def test_force_kernel_wins_when_it_can_and_is_dropped_when_it_cannot():
    assert choose(TT, cuda(90), force_kernel=TORCH_T) == TORCH_T
    assert choose(KT, cuda(90), force_kernel=TORCH_C) == TORCH_C
    # forced but wrong layout: no error, the normal walk gives CUTLASS
    assert choose(KT, cuda(90), force_kernel=TORCH_T) == CUTLASS
    # forced Marlin on an H100 (not supported there): CUTLASS, not Marlin
    assert choose(KT, cuda(90), force_kernel=MARLIN) == CUTLASS
    # forced but disabled: dropped too
    env = impl.Env(disabled_kernels=(TORCH_T,))
    assert choose(TT, cuda(90), env=env, force_kernel=TORCH_T) == CUTLASS
    # forced FlashInfer on an A100 with the package: refused (< 10.0), Marlin as usual
    assert choose(TT, cuda(80, True), force_kernel=FLASHINFER) == MARLIN
    # forcing a kernel that the list would reach later skips the ones before it
    assert choose(TT, cuda(80), force_kernel=CUTLASS) == CUTLASS


def test_linear_backend_filters_the_platform_list():
    assert choose(KT, cuda(90), linear_backend="torch") == TORCH_C
    assert choose(TT, cuda(90), linear_backend="torch") == TORCH_T
    assert choose(KT, cuda(80), linear_backend="cutlass") == CUTLASS
    assert choose(TT, cuda(100, True), linear_backend="cutlass") == CUTLASS
    assert choose(TT, cuda(100, True), linear_backend="flashinfer_cutlass") == FLASHINFER
    assert choose(TT, cuda(80), linear_backend="marlin") == MARLIN
    assert choose(KT, cuda(80), linear_backend="auto") == MARLIN
    # the family exists here but refuses: the "Failed to find" error, not a fallback
    with pytest.raises(ValueError, match="Failed to find a kernel") as err:
        choose(KT, cuda(90), linear_backend="marlin")
    assert str(err.value).split("\n")[1:] == [f"{MARLIN} {impl.R_MARLIN_FORCE}."]
    with pytest.raises(ValueError, match="Failed to find a kernel"):
        choose(KT, cuda(80), linear_backend="torch")


@pytest.mark.parametrize("backend,device", [
    ("triton", cuda(90)), ("deep_gemm", cuda(90)), ("cutlas", cuda(90)),
    ("cutlass", CPU), ("marlin", CPU), ("flashinfer_cutlass", CPU)])
def test_linear_backend_without_a_kernel_on_this_platform_raises(backend, device):
    # the filter runs over the platform's list: CUTLASS exists, but not in the CPU list
    with pytest.raises(ValueError, match=f"^--linear-backend={backend} was requested but no "
                                         f"'{backend}' kernel exists for this layer type.$"):
        choose(TT, device, linear_backend=backend)


def test_force_kernel_beats_linear_backend():
    # force is judged before the backend filter
    assert choose(KT, cuda(90), force_kernel=CUTLASS, linear_backend="torch") == CUTLASS
    assert choose(KT, cuda(90), force_kernel=CUTLASS, linear_backend="triton") == CUTLASS


# ---------------------------------------------------------------- the FP8 checkpoint's layout


def test_fp8_linear_method_asks_for_per_token_activations_where_cutlass_fp8_exists():
    for cap in (89, 90, 100):
        assert impl.fp8_linear_scales(cuda(cap), static_activation=False) == KT
    for cap in (75, 80, 86, 88):
        assert impl.fp8_linear_scales(cuda(cap), static_activation=False) == TT
    assert impl.fp8_linear_scales(CPU, static_activation=False) == TT
    # static input scales in the checkpoint: per tensor everywhere
    for dev in (cuda(80), cuda(90), cuda(100, True), CPU):
        assert impl.fp8_linear_scales(dev, static_activation=True) == TT


def test_a_b200_runs_flashinfer_only_for_checkpoints_with_static_input_scales():
    b200 = cuda(100, flashinfer=True)
    assert choose(impl.fp8_linear_scales(b200, True), b200) == FLASHINFER
    # dynamic activations become per token, which FlashInfer refuses
    assert choose(impl.fp8_linear_scales(b200, False), b200) == CUTLASS
    # an A100 runs either through Marlin
    a100 = cuda(80)
    assert {choose(impl.fp8_linear_scales(a100, s), a100) for s in (False, True)} == {MARLIN}


# ---------------------------------------------------------------- bad input


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="kernel"):
        impl.is_supported("CutlassFP8", cuda(90), NO_ENV)
    with pytest.raises(ValueError, match="kernel"):
        impl.can_implement("Marlin", TT)
    with pytest.raises(ValueError, match="kernel"):
        impl.check_kernel("cutlass", TT, cuda(90), NO_ENV)
    # a misspelt name in VLLM_DISABLED_KERNELS too is a bad kernel, not a disabled one
    with pytest.raises(ValueError, match="kernel"):
        impl.check_kernel("cutlass", TT, cuda(90), impl.Env(disabled_kernels=("cutlass",)))
    with pytest.raises(ValueError, match="config"):
        impl.can_implement(MARLIN, (T, T))
    with pytest.raises(ValueError, match="device"):
        impl.is_supported(CUTLASS, impl.Device("cuda", None), NO_ENV)
    with pytest.raises(ValueError, match="device"):
        impl.is_supported(CUTLASS, impl.Device("rocm", 94), NO_ENV)
    with pytest.raises(ValueError, match="device"):
        choose(TT, impl.Device("cpu", 80))
    with pytest.raises(ValueError, match="device"):
        choose(TT, impl.Device("rocm", 94))  # a KeyError on the table is not the contract
    with pytest.raises(ValueError, match="device"):
        impl.fp8_linear_scales(impl.Device("cuda", (9, 0)), False)
    with pytest.raises(ValueError, match="force_kernel"):
        choose(TT, cuda(90), force_kernel="Cutlass")
    with pytest.raises(ValueError, match="config"):
        choose((T, T), cuda(90))
    with pytest.raises(ValueError, match="config"):
        choose(impl.FP8Config(T, (1, 1)), cuda(90))


@pytest.mark.parametrize("layout", [(1, 0), (2, -1), (-1, 128), (128, 128)])
def test_layouts_outside_the_three_are_refused(layout):
    # (1, 0) is not a group of 1: per group means row 1 and at least one column
    for cfg in (impl.FP8Config(layout, T), impl.FP8Config(T, layout)):
        with pytest.raises(ValueError, match="config") as err:
            choose(cfg, cuda(90))
        assert "per group" not in str(err.value)


@pytest.mark.parametrize("group", [(1, 128), (1, 64), (1, 1)])
def test_block_scaled_activations_belong_to_another_table(group):
    # DeepSeek-style (1, 128) activation groups go to the block-scaled list upstream
    with pytest.raises(ValueError, match="config.activation.*per group"):
        choose(impl.FP8Config(group, (128, 128)), cuda(90))


# ---------------------------------------------------------------- README


def test_readme_table_matches_the_solution():
    text = (HERE / "README.md").read_text()
    start = text.index("| device | both per-tensor |")
    body = [ln for ln in text[start:].splitlines()[2:] if ln.startswith("|")][:8]
    parsed = [[c.strip() for c in ln.strip("|").split("|")] for ln in body]
    assert parsed == impl.selection_rows()
    assert parsed[1] == ["A100 (80)", "Marlin", "Marlin", "Marlin"]


# ---------------------------------------------------------------- upstream


def _tree(rel):
    return ast.parse((UPSTREAM / rel).read_text())


def _names(node):
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _top_assign(tree, name):
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return node.value
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value
    raise AssertionError(name)


def _strip(fn):
    """A FunctionDef without decorators or annotations, so it execs without vllm's types."""
    fn = ast.fix_missing_locations(fn)
    fn.decorator_list, fn.returns = [], None
    for a in fn.args.args + fn.args.kwonlyargs:
        a.annotation = None
    return fn


@pytest.mark.upstream
def test_table_order_matches_upstream():
    table = _top_assign(_tree(f"{LINEAR}/__init__.py"), "_POSSIBLE_FP8_KERNELS")
    got = {}
    for key, value in zip(table.keys, table.values, strict=True):
        got[key.attr.lower()] = tuple(e.id for e in value.elts)
    assert got["cuda"] == impl.POSSIBLE_FP8_KERNELS["cuda"]
    assert got["cpu"] == impl.POSSIBLE_FP8_KERNELS["cpu"]
    assert set(impl.POSSIBLE_FP8_KERNELS) == {"cuda", "cpu"}
    # the head of each list is what an old card and a CPU get for a per-tensor layer
    assert impl.choose_fp8_kernel(TT, cuda(80)) == got["cuda"][0]
    assert impl.choose_fp8_kernel(TT, CPU) == got["cpu"][0]
    # and the backend map's rows, restricted to these five kernels
    bmap = _top_assign(_tree(f"{LINEAR}/__init__.py"), "_LINEAR_BACKEND_KERNEL_MAP")
    rows = {k.value: frozenset(n for n in _names(v) if n in impl.KERNELS)
            for k, v in zip(bmap.keys, bmap.values, strict=True)}
    assert {k: v for k, v in rows.items() if v} == impl.LINEAR_BACKENDS


class _Shape(tuple):
    def is_per_tensor(self):
        return self[0] == -1 and self[1] == -1


def _cfg(cfg):
    def key(g):
        return types.SimpleNamespace(scale=types.SimpleNamespace(group_shape=_Shape(g)))

    return types.SimpleNamespace(activation_quant_key=key(cfg.activation),
                                 weight_quant_key=key(cfg.weight))


def _upstream_selector():
    """Upstream's selector, executed from the pin's source.

    The five kernels' ``is_supported`` / ``can_implement`` (the torch pair with their parent),
    ``is_fp8_marlin_supported``, ``_filter_kernels_by_backend``,
    ``is_supported_and_can_implement_kernel``, ``choose_scaled_mm_linear_kernel`` and the
    two tables are taken from the source with ``ast`` and run against stand-ins for
    ``current_platform``, ``envs``, ``has_flashinfer``, the logger and the vllm config.
    """
    state = types.SimpleNamespace(device=None, env=None, backend="auto")

    class Platform:
        @property
        def _enum(self):
            return state.device.platform.upper()

        def is_cuda(self):
            return state.device.platform == "cuda"

        def is_cpu(self):
            return state.device.platform == "cpu"

        def is_rocm(self):
            return False

        def is_cuda_alike(self):
            return self.is_cuda()

        def get_device_capability(self):
            cap = state.device.capability
            return None if cap is None else types.SimpleNamespace(major=cap // 10,
                                                                  minor=cap % 10)

        def has_device_capability(self, c):
            return state.device.capability is not None and state.device.capability >= c

    class Envs:
        @property
        def VLLM_TEST_FORCE_FP8_MARLIN(self):
            return state.env.force_fp8_marlin

        @property
        def VLLM_BATCH_INVARIANT(self):
            return state.env.batch_invariant

        @property
        def VLLM_DISABLED_KERNELS(self):
            return list(state.env.disabled_kernels)

    class Logger:
        def info_once(self, *args, **kwargs):
            pass

    class Enum:
        def __getattr__(self, name):
            return name

    ns = {"current_platform": Platform(), "envs": Envs(), "logger": Logger(),
          "PlatformEnum": Enum(), "has_flashinfer": lambda: state.device.has_flashinfer,
          "_get_linear_backend": lambda: state.backend, "ABC": object}
    marlin_utils = _tree("vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py")
    body = [_strip(n) for n in marlin_utils.body
            if isinstance(n, ast.FunctionDef) and n.name == "is_fp8_marlin_supported"]
    classes = [("scaled_mm/marlin.py", "MarlinFP8ScaledMMLinearKernel"),
               ("scaled_mm/flashinfer.py", "FlashInferFP8ScaledMMLinearKernel"),
               ("scaled_mm/cutlass.py", "CutlassFP8ScaledMMLinearKernel"),
               ("scaled_mm/pytorch.py", "TorchFP8ScaledMMLinearKernel"),
               ("scaled_mm/pytorch.py", "PerTensorTorchFP8ScaledMMLinearKernel"),
               ("scaled_mm/pytorch.py", "ChannelWiseTorchFP8ScaledMMLinearKernel")]
    for path, name in classes:
        cls = next(n for n in _tree(f"{LINEAR}/{path}").body
                   if isinstance(n, ast.ClassDef) and n.name == name)
        methods = [_strip(m) for m in cls.body if isinstance(m, ast.FunctionDef)
                   and m.name in ("is_supported", "can_implement")]
        for m in methods:
            m.decorator_list = [ast.Name("classmethod", ast.Load())]
        base = "TorchFP8ScaledMMLinearKernel" if "Torch" in name and name[0] != "T" else "object"
        cls.bases, cls.keywords, cls.decorator_list = [ast.Name(base, ast.Load())], [], []
        cls.body = methods or [ast.Pass()]
        body.append(cls)
    init = _tree(f"{LINEAR}/__init__.py")
    funcs = {"_filter_kernels_by_backend", "is_supported_and_can_implement_kernel",
             "choose_scaled_mm_linear_kernel"}
    body += [_strip(n) for n in init.body if isinstance(n, ast.FunctionDef) and n.name in funcs]
    for table in ("_POSSIBLE_FP8_KERNELS", "_LINEAR_BACKEND_KERNEL_MAP"):
        value = _top_assign(init, table)
        for n in set(_names(value)) - {c for _, c in classes}:
            ns.setdefault(n, type(n, (), {}))  # other platforms' kernels: placeholders
        body.append(ast.Assign([ast.Name(table, ast.Store())], value, lineno=0))
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    exec(compile(module, "upstream-selector", "exec"), ns)

    def select(cfg, device, env, force_kernel, backend):
        state.device, state.env, state.backend = device, env, backend
        force = None if force_kernel is None else ns[force_kernel]
        try:
            return ns["choose_scaled_mm_linear_kernel"](
                _cfg(cfg), ns["_POSSIBLE_FP8_KERNELS"], device.capability, force).__name__
        except ValueError as e:
            return ("ValueError", str(e))

    return select


@pytest.mark.upstream
def test_selection_matches_upstream_code_on_a_grid():
    select = _upstream_selector()
    devices = [cuda(c, f) for c in (70, 75, 80, 86, 89, 90, 100, 120) for f in (False, True)]
    devices.append(CPU)
    envs = [impl.Env(m, b, d) for m in (False, True) for b in (False, True)
            for d in ((), (MARLIN,), (CUTLASS,), (CUTLASS, FLASHINFER), (TORCH_T, TORCH_C))]
    grid = list(itertools.product(ALL, devices, envs, (None, MARLIN, TORCH_T, TORCH_C),
                                  ("auto", "cutlass", "torch", "marlin", "triton")))
    rng = random.Random(7)
    sample = rng.sample(grid, 4000)  # of 27,200
    outcomes = set()
    for cfg, device, env, force, backend in sample:
        want = select(cfg, device, env, force, backend)
        try:
            got = impl.choose_fp8_kernel(cfg, device, env, force, backend)
        except ValueError as e:
            got = ("ValueError", str(e))
        assert got == want, (cfg, device, env, force, backend)
        outcomes.add(want if isinstance(want, str) else want[1][:6])
    # every kernel and both kinds of error occurred in the sample
    assert set(impl.KERNELS) < outcomes and len(outcomes) == 7
