"""Every number in Phase 11's deep-dive (01-deep-dive.md), recomputed.

The page quotes these values; if one changes here, the text is wrong. Upstream rules that
need no GPU are restated in a few lines of Python (the id -> slot conversion, the
scheduler's skip, the two LRU levels, the CUDA-graph counts) and, where the upstream
function imports only torch or nothing, cut out of the pinned source with ``ast`` and run
(``compute_meta``, ``get_captured_lora_counts``) or loaded whole (the CPU torch ops, whose
-1 behaviour the page describes). Where mini_vllm has the piece (``LoRARequest``,
``PEFTHelper``, ``LinearWithLoRA``, ``PunicaWrapperNumpy``, the engine's ``max_loras``
rule and slot manager) the answer is checked against it too. Tests marked ``upstream``
read ``upstream/`` and are skipped without it.
"""

from __future__ import annotations

import ast
import bisect
import importlib.util
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

import course
from mini_vllm import LLMEngine, LoRARequest, SamplingParams
from mini_vllm.lora import PEFTHelper, PunicaWrapperNumpy, write_peft_adapter
from mini_vllm.lora.layers import LinearWithLoRA
from mini_vllm.lora.model_manager import MAX_LORA_RANKS
from mini_vllm.models.config import tiny_random_config

UPSTREAM = course.UPSTREAM


def upstream_function(rel_path: str, name: str, namespace: dict):
    """Cut one top-level function out of an upstream file and define it in ``namespace``."""
    tree = ast.parse((UPSTREAM / rel_path).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    module = ast.Module(body=[node], type_ignores=[])
    exec(compile(module, rel_path, "exec"), namespace)  # noqa: S102 - pinned upstream source
    return namespace[name]


# ------------------------------------------------------------------- section 1 and 5: config
@pytest.mark.upstream
def test_max_lora_rank_takes_nine_values_and_mini_vllm_has_the_same():
    tree = ast.parse((UPSTREAM / "vllm/config/lora.py").read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "MaxLoRARanks")
    values = tuple(e.value for e in node.value.slice.elts)
    assert values == (1, 8, 16, 32, 64, 128, 256, 320, 512)
    assert len(values) == 9
    assert values == MAX_LORA_RANKS


def test_lora_int_id_starts_at_one_and_equality_is_by_name():
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("a", 0, "/x")
    assert LoRARequest("sql", 1, "/p") == LoRARequest("sql", 2, "/p")  # check-yourself 1
    assert len({LoRARequest("sql", 1, "/p"), LoRARequest("sql", 2, "/p")}) == 1


@pytest.mark.upstream
def test_upstream_refuses_id_below_one_and_the_server_counter_starts_at_one():
    src = (UPSTREAM / "vllm/lora/request.py").read_text(encoding="utf-8")
    assert "if self.lora_int_id < 1:" in src
    spec = importlib.util.spec_from_file_location("_p11_counter", UPSTREAM / "vllm/utils/counter.py")
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)  # imports threading only
    ids = counter.AtomicCounter(0)
    assert [ids.inc(1), ids.inc(1)] == [1, 2]


# ------------------------------------------------------------------- section 6: the scheduler rule
def admit(waiting: list[int | None], max_loras: int) -> tuple[list[int], list[int]]:
    """The waiting loop's LoRA rule alone (scheduler.py:572-582, :797): returns (admitted, skipped)."""
    scheduled: set[int] = set()
    admitted, skipped = [], []
    for i, lora in enumerate(waiting):
        if lora is not None and len(scheduled) == max_loras and lora not in scheduled:
            skipped.append(i)
            continue
        admitted.append(i)
        if lora is not None:
            scheduled.add(lora)
    return admitted, skipped


def test_check_yourself_2_the_third_adapter_is_skipped_not_a_barrier():
    a, b, c = 1, 2, 3
    admitted, skipped = admit([a, b, c, None, a], max_loras=2)
    assert admitted == [0, 1, 3, 4] and skipped == [2]
    assert admit([a] * 200, max_loras=1) == (list(range(200)), [])  # the cap counts adapters


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("p11_adapters")
    cfg = tiny_random_config()
    names = "abcd"
    return {n: write_peft_adapter(root / n, cfg, r=8, target_modules=("q_proj", "v_proj"), seed=i + 1)
            for i, n in enumerate(names)}


def _lr(adapters, name):
    return LoRARequest(name, "abcd".index(name) + 1, str(adapters[name]))


def test_check_yourself_2_in_mini_vllm(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16)
    sp = SamplingParams(max_tokens=2, temperature=0.0)
    order = ["a", "b", "c", None, "a"]
    ids = [engine.add_request("hi", sp, lora_request=None if n is None else _lr(adapters, n)) for n in order]
    engine.step()
    assert set(engine.stats[0].num_scheduled_tokens) == {ids[0], ids[1], ids[3], ids[4]}
    assert engine.stats[0].active_loras == (1, 2)
    assert [r.request_id for r in engine.scheduler.waiting] == [ids[2]]


# ------------------------------------------------------------------- section 9 and 13: ids -> slots
def convert(index_mapping, lora_index_to_id):
    """utils.py:95-107 restated: (slot per token, embedding slot per token)."""
    slots, emb = [], []
    for x in index_mapping:
        idx = lora_index_to_id.index(x) if x > 0 else -1
        slots.append(idx)
        emb.append(idx if x > 0 else 0)
    return slots, emb


def test_make_lora_inputs_repeats_ids_per_scheduled_token():
    assert np.repeat(np.array([7, 0, 3]), [2, 1, 2]).tolist() == [7, 7, 0, 3, 3]


def test_check_yourself_3_ids_become_slots_and_base_becomes_minus_one():
    slots, emb = convert([7, 7, 0, 3, 3], [3, 7])
    assert slots == [1, 1, -1, 0, 0]
    assert emb == [1, 1, 0, 0, 0]  # the embedding lookup gives a base token slot 0 (section 15)
    with pytest.raises(ValueError):
        convert([9], [3, 7])  # an id that is not seated cannot be converted


@pytest.mark.upstream
def test_check_yourself_3_segments_from_upstreams_compute_meta():
    compute_meta = upstream_function("vllm/lora/punica_wrapper/utils.py", "compute_meta", {"torch": torch})
    starts, lengths, slots, batch, max_len, total, no_lora = compute_meta(torch.tensor([1, 1, -1, 0, 0]))
    assert slots.tolist() == [1, -1, 0] and lengths.tolist() == [2, 1, 2] and starts.tolist() == [0, 2, 3]
    assert (batch, max_len, total, no_lora) == (3, 2, 5, False)
    *_, batch, _, _, no_lora = compute_meta(torch.tensor([-1, -1, -1]))
    assert (batch, no_lora) == (1, True)


# ------------------------------------------------------------------- section 11: scaling
def test_check_yourself_5_scaling_folded_into_b():
    plain = PEFTHelper(r=8, lora_alpha=16, target_modules=["q_proj"])
    rs = PEFTHelper(r=8, lora_alpha=16, target_modules=["q_proj"], use_rslora=True)
    assert plain.vllm_lora_scaling_factor == 2.0
    assert rs.vllm_lora_scaling_factor == pytest.approx(16 / math.sqrt(8))
    assert round(rs.vllm_lora_scaling_factor, 3) == 5.657
    assert plain.vllm_lora_scaling_factor ** 2 == 4.0  # the kernel applying it again: 4x


# ------------------------------------------------------------------- section 12 and 14: slots
def test_check_yourself_6_a_smaller_adapter_does_not_inherit_the_old_rows():
    class Base:
        input_size, output_size, prefix = 6, 5, "x"

    layer = LinearWithLoRA(Base(), (5,), max_loras=2, max_lora_rank=16, punica_wrapper=PunicaWrapperNumpy(2))
    rng = np.random.default_rng(0)
    layer.set_lora(1, [rng.standard_normal((16, 6))], [rng.standard_normal((5, 16))])
    a4, b4 = rng.standard_normal((4, 6)), rng.standard_normal((5, 4))
    layer.set_lora(1, [a4], [b4])
    assert not layer.lora_a_stacked[0][1, 0, 4:].any() and not layer.lora_b_stacked[0][1, 0, :, 4:].any()
    np.testing.assert_array_equal(layer.lora_a_stacked[0][1, 0, :4], a4.astype(np.float32))


def lru_trace(steps: list[str], max_loras: int, max_cpu_loras: int):
    """The two LRU levels of worker_manager.py:273 and model_manager.py:1208, one adapter per step."""
    registered: OrderedDict[str, None] = OrderedDict()
    active: OrderedDict[str, None] = OrderedDict()
    slots: list[str | None] = [None] * max_loras

    def deactivate(name):
        if name in active:
            del active[name]
            slots[slots.index(name)] = None

    for name in steps:
        if name not in registered:
            if len(registered) + 1 > max_cpu_loras:
                oldest = next(iter(registered))
                del registered[oldest]
                deactivate(oldest)
            registered[name] = None
        else:
            registered.move_to_end(name)
        if name not in active and len(active) >= max_loras:
            deactivate(next(iter(active)))
        if name not in active:
            slots[slots.index(None)] = name  # the first free slot
            active[name] = None
        active.move_to_end(name)
    return list(registered), slots


def test_check_yourself_7_two_lru_levels():
    registered, slots = lru_trace(list("ABCAD"), max_loras=2, max_cpu_loras=3)
    assert registered == ["C", "A", "D"]
    assert slots == ["D", "A"]


def test_check_yourself_7_in_mini_vllm(adapters):
    engine = LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=3)
    m = engine.lora_manager
    for name in "abcad":
        m.set_active_adapters([_lr(adapters, name)])
    ids = {i + 1: n.upper() for i, n in enumerate("abcd")}
    assert [ids[i] for i in m.list_adapters()] == ["C", "A", "D"]
    assert [ids[i] for i in m.lora_index_to_id] == ["D", "A"]


# ------------------------------------------------------------------- section 16: the CPU -1 bug
@pytest.fixture(scope="module")
def torch_ops():
    spec = importlib.util.spec_from_file_location("_p11_lora_ops", UPSTREAM / "vllm/lora/ops/torch_ops/lora_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports torch only
    return module


@pytest.mark.upstream
def test_upstream_cpu_bgmv_shrink_gives_minus_one_the_last_slot(torch_ops):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, generator=gen).repeat(3, 1)  # three identical rows
    a = torch.randn(2, 1, 4, 8, generator=gen)  # two slots, rank 4
    out = torch.zeros(3, 4)
    torch_ops.bgmv_shrink(x, a, out, torch.tensor([0, 1, -1]), 1.0)
    torch.testing.assert_close(out[2], out[1], rtol=0, atol=0)  # "no adapter" got slot 1's A
    assert out[2].abs().sum() > 0


@pytest.mark.upstream
def test_check_yourself_4_base_row_gets_the_neighbours_delta_on_the_cpu_and_not_in_mini_vllm(torch_ops):
    """max_loras = 1, rows: [adapter, base], through the segment ops V1 uses on the CPU."""
    compute_meta = upstream_function("vllm/lora/punica_wrapper/utils.py", "compute_meta", {"torch": torch})
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, generator=gen)
    a = torch.randn(1, 1, 4, 8, generator=gen)
    b = torch.randn(1, 1, 6, 4, generator=gen)
    base = torch.randn(2, 6, generator=gen)
    slots = torch.tensor([0, -1])
    starts, lengths, seg_slots, batch, max_len, total, no_lora = compute_meta(slots)
    assert no_lora is False
    buf = torch.zeros(2, 4)
    torch_ops.sgmv_shrink(x, a, buf, starts, lengths, seg_slots, batch, max_len, total, 1.0)
    y = base.clone()
    torch_ops.sgmv_expand_slice(buf, b, y, starts, lengths, seg_slots, batch, max_len, total, 0, 6, True)
    delta = x[1] @ a[0, 0].T @ b[0, 0].T
    torch.testing.assert_close(y[1], base[1] + delta)  # the base row was adapted

    wrapper = PunicaWrapperNumpy(1)
    wrapper.update_metadata(slots.numpy())
    y_np = base.numpy().copy()
    wrapper.add_lora_linear(y_np, x.numpy(), (a.numpy(),), (b.numpy(),), 1.0, (6,))
    np.testing.assert_array_equal(y_np[1], base.numpy()[1])  # mini_vllm leaves it bit for bit
    np.testing.assert_allclose(y_np[0], (base[0] + x[0] @ a[0, 0].T @ b[0, 0].T).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.upstream
def test_upstream_kernel_tests_never_draw_minus_one_or_the_last_slot():
    src = (UPSTREAM / "tests/lora/utils.py").read_text(encoding="utf-8")
    assert "0, lora_nums - 1 if lora_nums > 1 else 1, (batches,)" in src
    lora_nums = 4
    drawn = torch.randint(0, lora_nums - 1, (10_000,), generator=torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {0, 1, 2}  # never 3 (the last slot), never -1


# ------------------------------------------------------------------- section 18: CUDA graphs
@pytest.fixture(scope="module")
def captured_counts():
    return upstream_function("vllm/lora/utils.py", "get_captured_lora_counts", {})


def lora_cases(max_loras, specialize_cudagraph, specialize_active, counts):
    """cudagraph_dispatcher.py:115 _get_lora_cases restated."""
    if specialize_cudagraph:
        return [0] + counts(max_loras, specialize_active)
    return [max_loras + 1]


@pytest.mark.upstream
def test_check_yourself_9_captured_lora_counts(captured_counts):
    assert captured_counts(4, False) == [5]
    assert captured_counts(4, True) == [1, 2, 4, 5]
    assert lora_cases(4, True, False, captured_counts) == [0, 5]  # the default: two graphs per size
    assert len(lora_cases(4, True, False, captured_counts)) == 2
    assert lora_cases(4, True, True, captured_counts) == [0, 1, 2, 4, 5]
    assert lora_cases(4, False, False, captured_counts) == [5]


@pytest.mark.upstream
def test_specialized_counts_differ_between_dispatcher_and_kernel_metadata(captured_counts):
    """Section 18: two adapters plus base tokens at max_loras = 4 (the arithmetic, not a GPU run)."""
    counts = captured_counts(4, True)
    adapters_in_batch = 2
    dispatcher = counts[bisect.bisect_left(counts, adapters_in_batch)]
    distinct_slot_values = adapters_in_batch + 1  # -1 is one of the torch.unique values
    kernel_meta = counts[bisect.bisect_left(counts, distinct_slot_values)]
    assert (dispatcher, kernel_meta) == (2, 4)


def test_dummy_warmup_rank_is_min_of_max_lora_rank_and_8():
    rule = {r: (r if r < 8 else 8) for r in MAX_LORA_RANKS}  # lora_model_runner_mixin.py:104
    assert rule == {r: min(r, 8) for r in MAX_LORA_RANKS}
    assert rule[1] == 1 and rule[16] == 8


@pytest.mark.upstream
def test_lm_head_vocab_limit_is_258048():
    src = (UPSTREAM / "vllm/lora/layers/logits_processor.py").read_text(encoding="utf-8")
    assert "if self.base_layer.vocab_size > 258048:" in src
