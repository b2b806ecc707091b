"""Tensor parallelism: ``LLMEngine(tensor_parallel_size=N)`` on forked gloo workers.

Every engine start forks N processes (0.1-1 s here), so the checks are grouped:
one workload runs on TP = 1, 2 and 4 engines (module fixture) and each test reads
what it needs from those runs. TP > 1 sums partial products in another order than
TP = 1, so logits are compared within a tolerance, never bit for bit; greedy tokens
must be identical.
"""
from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mini_vllm.engine import LLMEngine  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

NUM_LAYERS = 2  # tiny-random
# A shared 12-token prefix (3 blocks of 4: prefix-cache hits), prompts up to 23 tokens
# prefilled in chunks of at most 16 tokens a step, and 16 blocks for 5 requests that
# need 7 each: the scheduler must preempt.
PREFIX = list(range(40, 52))
PROMPTS = [PREFIX + [7, 8, 9], PREFIX + [7, 8, 10, 11], list(range(100, 123)), PREFIX + [1],
           [200, 3, 200, 3, 9]]
ENGINE_KW = dict(model_backend="torch", block_size=4, num_blocks=16, max_num_batched_tokens=16)
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def run_workload(tp: int, **extra):
    """Tokens, stats, per-step logits, KV bytes per rank and step time of one engine run."""
    engine = LLMEngine("tiny-random", tensor_parallel_size=tp, **ENGINE_KW, **extra)
    model, logits = engine.model, []
    execute = model.execute
    model.execute = lambda mi: logits.append(execute(mi)) or logits[-1]
    engine.generate([{"prompt_token_ids": PREFIX}], PARAMS)  # warm-up (fills the prefix cache too)
    start, steps = time.perf_counter(), engine.num_steps
    reqs = engine.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
    step_s = (time.perf_counter() - start) / (engine.num_steps - steps)
    kv = model.kv_cache_bytes_per_rank() if tp > 1 else [model.kv_cache_bytes]
    return dict(engine=engine, tokens=[list(r.output_token_ids) for r in reqs], stats=engine.stats,
                logits=logits, kv=kv, step_s=step_s)


def children_alive() -> set[int]:
    """Pids of this process's live worker children (multiprocessing's view, and psutil's if installed)."""
    alive = {p.pid for p in multiprocessing.active_children() if p.name.startswith("mini_vllm-TP")}
    try:
        import psutil
    except ImportError:
        return alive
    return alive | {c.pid for c in psutil.Process().children(recursive=True)
                    if c.is_running() and c.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(scope="module")
def runs(one_torch_thread):
    out = {tp: run_workload(tp) for tp in (1, 2, 4)}
    print(f"\ntiny-random step time (gloo, this CPU): TP=1 {out[1]['step_s'] * 1e3:.2f} ms, "
          f"TP=2 {out[2]['step_s'] * 1e3:.2f} ms, TP=4 {out[4]['step_s'] * 1e3:.2f} ms")
    yield out
    for run in out.values():
        run["engine"].shutdown()


def test_workload_exercises_chunking_prefix_cache_and_preemption(runs):
    stats = runs[1]["stats"]
    assert any(len(s.preempted) for s in stats)
    assert sum(s.num_cached_tokens for s in stats) > 0
    assert max(sum(s.num_scheduled_tokens.values()) for s in stats) == 16  # the budget cut a prefill


@pytest.mark.parametrize("tp", [2, 4])
def test_greedy_tokens_and_schedule_equal_tp1(runs, tp):
    assert runs[tp]["tokens"] == runs[1]["tokens"]
    assert [s.num_scheduled_tokens for s in runs[tp]["stats"]] == [s.num_scheduled_tokens
                                                                   for s in runs[1]["stats"]]
    assert [s.preempted for s in runs[tp]["stats"]] == [s.preempted for s in runs[1]["stats"]]


@pytest.mark.parametrize("tp", [2, 4])
def test_logits_match_tp1_within_tolerance(runs, tp):
    ref, got = runs[1]["logits"], runs[tp]["logits"]
    assert len(got) == len(ref)
    for a, b in zip(ref, got, strict=True):
        assert a.shape == b.shape == (a.shape[0], 257)  # padding (320) cut off after the gather
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_kv_cache_bytes_per_rank(runs):
    full = runs[1]["kv"][0]
    assert runs[2]["kv"] == [full // 2] * 2  # 2 KV heads, one per rank
    # TP = 4 > 2 KV heads: each rank holds one KV head (2 replicas of each), so 1/2, not 1/4
    assert runs[4]["kv"] == [full // 2] * 4


def test_num_collectives_per_step(runs):
    assert {s.num_collectives for s in runs[1]["stats"]} == {0}
    for tp in (2, 4):  # 2L all-reduces in the layers + 1 for the embedding, + 1 logits gather
        assert {s.num_collectives for s in runs[tp]["stats"]} == {2 * NUM_LAYERS + 2}


def test_tp1_is_the_in_process_path_bit_for_bit(runs, one_torch_thread):
    from mini_vllm.models.torch_backend import TorchLlamaForCausalLM

    engine = runs[1]["engine"]
    assert engine.model_executor is None and type(engine.model) is TorchLlamaForCausalLM
    plain = run_workload(1)  # tensor_parallel_size=1 given explicitly vs the old default
    old = LLMEngine("tiny-random", **ENGINE_KW)
    assert old.model_executor is None
    old_logits = []
    execute = old.model.execute
    old.model.execute = lambda mi: old_logits.append(execute(mi)) or old_logits[-1]
    old.generate([{"prompt_token_ids": PREFIX}], PARAMS)
    reqs = old.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
    assert [list(r.output_token_ids) for r in reqs] == plain["tokens"]
    assert all(np.array_equal(a, b) for a, b in zip(old_logits, plain["logits"], strict=True))


@pytest.mark.parametrize("kw, match", [
    (dict(tensor_parallel_size=3), r"tensor_parallel_size must divide num_attention_heads .*\[1, 2, 4\]"),
    (dict(tensor_parallel_size=8), r"tensor_parallel_size .*allowed values for this model: \[1, 2, 4\]"),
    (dict(tensor_parallel_size=0), r"tensor_parallel_size must be an integer >= 1"),
    (dict(tensor_parallel_size=True), r"tensor_parallel_size must be an integer >= 1"),
    (dict(tensor_parallel_size="2"), r"tensor_parallel_size must be an integer >= 1"),
    (dict(tensor_parallel_size=2, model_backend="numpy"), r"tensor_parallel_size > 1 needs model_backend='torch'"),
    (dict(tensor_parallel_size=2, compilation_config={"mode": "VLLM_COMPILE"}),
     r"tensor_parallel_size > 1 runs eagerly"),
    (dict(tensor_parallel_size=2, kv_cache_dtype="fp8"), r"tensor_parallel_size > 1 keeps a float32 KV"),
    (dict(tensor_parallel_size=2, model="tiny-moe"), r"tensor_parallel_size > 1 runs dense transformers only"),
])
def test_bad_tensor_parallel_values(kw, match):
    kw = {"model": "tiny-random", "model_backend": "torch", **kw}
    before = children_alive()
    with pytest.raises(ValueError, match=match):
        LLMEngine(**kw)
    assert children_alive() <= before  # refused before any worker was forked: nothing new


def test_worker_exception_becomes_runtime_error(runs):
    """A rank that raises mid-step: its traceback reaches the parent at once (rank 0 is left
    waiting in an all-reduce and is killed), and no worker outlives the failure."""
    engine = runs[2]["engine"]
    engine.model_executor.collective_rpc("inject_fault", (1, "raise"))
    engine.add_request({"prompt_token_ids": [1, 2, 3]}, PARAMS)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)worker rank 1 raised.*fault injected into rank 1"):
        engine.step()
    assert time.monotonic() - start < engine.model_executor.timeout_s
    assert not engine.model_executor.is_alive
    with pytest.raises(RuntimeError, match="shut down"):
        engine.step()


def test_hung_collective_times_out(one_torch_thread):
    """A rank that never joins the collective: RuntimeError after the executor's timeout."""
    engine = LLMEngine("tiny-random", tensor_parallel_size=2, **ENGINE_KW)
    engine.model_executor.timeout_s = 1.5
    engine.model_executor.collective_rpc("inject_fault", (0, "hang"))
    engine.add_request({"prompt_token_ids": [1, 2, 3]}, PARAMS)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not finish 'execute_model' within 1.5 s"):
        engine.step()
    assert time.monotonic() - start < 5
    assert not set(engine.model_executor.pids) & children_alive()


def test_shutdown_leaves_no_process(runs):
    pids = runs[4]["engine"].model_executor.pids
    runs[4]["engine"].shutdown()
    runs[4]["engine"].shutdown()  # idempotent
    assert not set(pids) & children_alive()
    try:
        import psutil
    except ImportError:
        return
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.model
def test_smollm2_tp3_gives_the_golden_greedy_tokens(one_torch_thread):
    """SmolLM2 has 9 query heads over 3 KV heads: TP = 2 is refused, TP = 3 splits it. Its greedy
    tokens equal the golden ones recorded from transformers (golden/smollm2.json), which the
    TP = 1 engine matches in test_smollm2_model.py; 3 ranks on 2 cores are slow, so 4 tokens."""
    import json
    import pathlib

    from mini_vllm.distributed.sharding import allowed_tp_sizes

    threadpoolctl = pytest.importorskip("threadpoolctl")
    chat = json.loads((pathlib.Path(__file__).parent / "golden" / "smollm2.json").read_text())["chat"][0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with threadpoolctl.threadpool_limits(1, "blas"):
        engine = LLMEngine("smollm2", model_backend="torch", tensor_parallel_size=3, block_size=16,
                           num_blocks=8)
        start = time.perf_counter()
        tokens = list(engine.generate({"prompt_token_ids": chat["prompt_ids"]}, params)[0].output_token_ids)
        step = (time.perf_counter() - start) / engine.num_steps
        engine.shutdown()
    print(f"\nSmolLM2 step time at TP=3 (gloo, this CPU): {step * 1e3:.1f} ms")
    assert tokens == chat["greedy_ids"][:4]
    assert allowed_tp_sizes(engine.model.config) == [1, 3]  # so tensor_parallel_size=2 is a ValueError
    assert not set(engine.model_executor.pids) & children_alive()


@pytest.mark.gpu
def test_tp2_on_two_gpus_with_nccl():
    """The same workers on CUDA with NCCL (one GPU per rank): greedy tokens equal the CPU's."""
    from mini_vllm.distributed.executor import TensorParallelModel
    from mini_vllm.models import get_model
    from mini_vllm.models.runner import greedy_generate

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    prompts = [p for p in PROMPTS]
    expected = greedy_generate(get_model("tiny-random", backend="torch"), prompts, 6, chunk_size=5)
    model = TensorParallelModel("tiny-random", 2, device="cuda")
    try:
        assert greedy_generate(model, prompts, 6, chunk_size=5) == expected
    finally:
        model.shutdown()
