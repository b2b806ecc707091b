"""The numbers of Phase 11's mini-build, recomputed; and the script that measured its step times.

``02-mini-build.md`` quotes what mini_vllm reserves for adapter slots on tiny-random
(``engine.lora_manager.lora_bytes()`` at ``max_loras=2, max_lora_rank=16``), the arithmetic
behind it, and how many small products one adapter adds to a step. Each test below rebuilds one
of those figures from the model's config and compares it with what the engine reports; if one
fails, the page is wrong. The step times on the page are measurements of this shared machine, so
nothing asserts them; ``test_the_timed_batches_are_what_the_page_says`` checks only that the four
timed engines run the batch the page describes.

Run the tests (a few seconds on this shared 2-core CPU):

    pytest -q phase-11-multi-lora/test_phase11_minibuild.py

Measure the step times yourself (a few seconds):

    python phase-11-multi-lora/test_phase11_minibuild.py

upstream: vllm/lora/layers/base_linear.py:99 create_lora_weights
upstream: vllm/lora/layers/column_parallel_linear.py:205 create_lora_weights
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # one BLAS thread, set before numpy loads, so the timings are comparable
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pathlib
import statistics
import tempfile
import time

import pytest

from mini_vllm import LLMEngine, LoRARequest, SamplingParams
from mini_vllm.lora import write_peft_adapter
from mini_vllm.models.config import tiny_random_config

KIB = 1024
FLOAT32 = 4
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BATCH = 8  # decode rows in every timed step


def engine(**kw) -> LLMEngine:
    return LLMEngine("tiny-random", **kw)


def wrapped_modules(c):
    """mini_vllm's four wrapped modules: (input width, output slices), as ``LinearWithLoRA`` gets them."""
    return {
        "qkv_proj": (
            c.hidden_size,
            (c.num_attention_heads * c.head_dim,) + (c.num_key_value_heads * c.head_dim,) * 2,
        ),
        "o_proj": (c.num_attention_heads * c.head_dim, (c.hidden_size,)),
        "gate_up_proj": (c.hidden_size, (c.intermediate_size,) * 2),
        "down_proj": (c.intermediate_size, (c.hidden_size,)),
    }


def elements_per_rank(c) -> dict[str, int]:
    """Stack elements one slot holds per unit of rank: one A row (``in``) and one B column (``out_i``) per slice."""
    return {
        name: len(slices) * n_in + sum(slices)
        for name, (n_in, slices) in wrapped_modules(c).items()
    }


# --------------------------------------------------------------------------- the reservation
def test_tiny_random_shapes_behind_the_arithmetic():
    c = tiny_random_config()
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (64, 128, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 16)
    assert wrapped_modules(c)["qkv_proj"] == (64, (64, 32, 32))
    # per unit of rank: qkv 3 x 64 + 128, o 64 + 64, gate_up 2 x 64 + 256, down 128 + 64
    assert elements_per_rank(c) == {
        "qkv_proj": 320,
        "o_proj": 128,
        "gate_up_proj": 384,
        "down_proj": 192,
    }
    assert sum(elements_per_rank(c).values()) == 1024


def test_lora_bytes_two_slots_of_rank_16():
    c = tiny_random_config()
    e = engine(enable_lora=True, max_loras=2, max_lora_rank=16)
    per_layer_per_slot = 16 * sum(elements_per_rank(c).values())
    assert per_layer_per_slot == 16_384
    expected = (
        2 * c.num_hidden_layers * per_layer_per_slot * FLOAT32
    )  # slots x layers x elements x bytes
    assert expected == 262_144 == 256 * KIB
    assert e.lora_manager.lora_bytes() == expected
    # module by module, against the stacks the manager allocated
    for key, module in e.lora_manager.modules.items():
        name = key.split(".")[1]
        assert module.lora_bytes() == 2 * 16 * elements_per_rank(c)[name] * FLOAT32, key
        assert all(a.shape[:3] == (2, 1, 16) for a in module.lora_a_stacked)
    assert e.lora_manager.list_adapters() == {}  # reserved before any adapter arrives


def test_seating_adapters_allocates_nothing_more(tmp_path):
    e = engine(enable_lora=True, max_loras=2, max_lora_rank=16)
    before = e.lora_manager.lora_bytes()
    a, b = make_adapters(tmp_path)
    assert e.lora_manager.set_active_adapters([a, None, b]).tolist() == [0, -1, 1]
    assert e.lora_manager.lora_bytes() == before == 262_144  # loading copies into the slots


def test_the_reservation_against_the_base_projections():
    e = engine(enable_lora=True, max_loras=2, max_lora_rank=16)
    base = sum(m.weight_bytes() for m in e.lora_manager.modules.values())
    assert base == 294_912 == 2 * (64 * 128 + 64 * 64 + 64 * 256 + 128 * 64) * FLOAT32
    assert e.lora_manager.lora_bytes() * 9 == base * 8  # 8/9 of the projections' own weights
    assert round(e.lora_manager.lora_bytes() / base, 3) == 0.889


@pytest.mark.parametrize(
    "max_loras, max_lora_rank, kib", [(1, 16, 128), (2, 8, 128), (4, 16, 512), (2, 64, 1024)]
)
def test_the_reservation_is_linear_in_slots_and_rank(max_loras, max_lora_rank, kib):
    e = engine(enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank)
    assert (
        e.lora_manager.lora_bytes() == max_loras * max_lora_rank * 1024 * 2 * FLOAT32 == kib * KIB
    )


def test_lora_off_reserves_nothing():
    assert engine().lora_manager is None


# --------------------------------------------------------------------------- the work per step
def test_one_adapter_adds_28_small_products_to_a_step():
    e = engine(enable_lora=True, max_loras=2, max_lora_rank=16)
    slices = sum(len(m.output_slices) for m in e.lora_manager.modules.values())
    assert len(e.lora_manager.modules) == 8  # 2 layers x 4 wrapped modules: 8 add_lora_linear calls
    assert slices == 14  # 2 layers x (3 + 1 + 2 + 1)
    assert (
        2 * slices == 28
    )  # a shrink and an expand per slice, for each distinct adapter in the step


# --------------------------------------------------------------------------- the timed batches
def make_adapters(root: pathlib.Path) -> tuple[LoRARequest, LoRARequest]:
    cfg = tiny_random_config()
    a = write_peft_adapter(root / "a", cfg, r=16, lora_alpha=32, target_modules=ALL, seed=1)
    b = write_peft_adapter(root / "b", cfg, r=16, lora_alpha=32, target_modules=ALL, seed=2)
    return LoRARequest("a", 1, str(a)), LoRARequest("b", 2, str(b))


def cases(a: LoRARequest, b: LoRARequest) -> dict[str, tuple[dict, list]]:
    lora = dict(enable_lora=True, max_loras=2, max_lora_rank=16)
    return {
        "LoRA off": ({}, [None] * BATCH),
        "enable_lora, no adapter": (lora, [None] * BATCH),
        "1 adapter, 8 rows": (lora, [a] * BATCH),
        "2 adapters, 4 rows each": (lora, [a, b] * (BATCH // 2)),
    }


def decode_steps(kwargs: dict, loras: list, steps: int) -> tuple[list[float], LLMEngine]:
    """Prefill eight 16-token prompts, then time ``steps`` steps of eight decode rows each."""
    e = engine(**kwargs)
    sp = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    for i, lora in enumerate(loras):
        e.add_request({"prompt_token_ids": list(range(10 + i, 26 + i))}, sp, lora_request=lora)
    e.step()  # the eight prefills
    e.step()  # the first decode step (warm)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        e.step()
        times.append(time.perf_counter() - t0)
    return times, e


def test_the_timed_batches_are_what_the_page_says(tmp_path):
    a, b = make_adapters(tmp_path)
    want = {
        "LoRA off": (),
        "enable_lora, no adapter": (),
        "1 adapter, 8 rows": (1,),
        "2 adapters, 4 rows each": (1, 2),
    }
    for name, (kwargs, loras) in cases(a, b).items():
        _, e = decode_steps(kwargs, loras, steps=3)
        assert sum(e.stats[0].num_scheduled_tokens.values()) == BATCH * 16, (
            name
        )  # step 1: all prefills
        for s in e.stats[1:]:
            assert list(s.num_scheduled_tokens.values()) == [1] * BATCH, (
                name
            )  # then 8 decode rows a step
            assert s.active_loras == want[name], name


def main(reps: int = 9, steps: int = 50) -> None:
    root = pathlib.Path(tempfile.mkdtemp())
    table = cases(*make_adapters(root))
    medians: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(reps):  # round-robin, so a burst of load on the machine hits every case
        for name, (kwargs, loras) in table.items():
            times, _ = decode_steps(kwargs, loras, steps)
            medians[name].append(statistics.median(times) * 1e3)
    print(
        f"tiny-random, {BATCH} decode rows a step; median of {steps} steps, {reps} repetitions "
        f"(median and range of the medians), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    for name, ms in medians.items():
        print(f"{name:26s} {statistics.median(ms):6.3f} ms   ({min(ms):.3f} - {max(ms):.3f})")
    e = engine(enable_lora=True, max_loras=2, max_lora_rank=16)
    print(f"lora_bytes() at max_loras=2, max_lora_rank=16: {e.lora_manager.lora_bytes():,} B")


if __name__ == "__main__":
    main()
