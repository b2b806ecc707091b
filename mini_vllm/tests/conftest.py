"""Shared helpers for mini_vllm's tests (fixtures only: test modules import nothing from here)."""
from __future__ import annotations

import itertools

import pytest

from mini_vllm.kv_cache import KVCacheManager
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.scheduler import Scheduler


@pytest.fixture
def make_request():
    """make_request(token_ids, max_tokens=4, request_id=None, **params) -> Request (EOS 256)."""
    counter = itertools.count()

    def make(token_ids, max_tokens=4, request_id=None, **params):
        params.setdefault("temperature", 0.0)
        params.setdefault("ignore_eos", True)
        rid = request_id if request_id is not None else f"r{next(counter)}"
        return Request(rid, list(token_ids), SamplingParams(max_tokens=max_tokens, **params), 256)

    return make


@pytest.fixture
def make_scheduler():
    """make_scheduler(num_blocks, block_size, enable_caching=True, **scheduler_kwargs)."""

    def make(num_blocks=64, block_size=4, enable_caching=True, **kwargs):
        kv = KVCacheManager(num_blocks, block_size, enable_caching)
        return Scheduler(kv, **kwargs)

    return make


@pytest.fixture
def run_step():
    """run_step(scheduler, token=7) -> (SchedulerOutput, finished): one step where
    every request that needs a sample gets ``token``."""

    def step(scheduler, token=7):
        out = scheduler.schedule()
        sampled = {
            r.request_id: token
            for r in out.scheduled_requests
            if Scheduler.needs_sample(r, out.num_scheduled_tokens[r.request_id])
        }
        return out, scheduler.update_from_output(out, sampled)

    return step


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's torch work on one thread: tensors this small only lose time to a
    second intra-op thread, and on a busy 2-core machine that costs seconds."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_sessionfinish(session, exitstatus):
    """Phase 10's promise, checked once for the whole run: no process a test started outlives it.

    Tensor-parallel engines and the labs' gloo worlds fork workers; every one must have exited
    (shutdown, an exception or a timeout) by the time the suite ends. A live child fails the run.
    """
    import multiprocessing
    import sys
    import time

    if "vllm" in sys.modules:
        # the vllm tier: real vLLM's engine-core and worker processes are vLLM's to stop (at exit)
        return

    def alive() -> list[str]:
        found = {f"{p.name} (pid {p.pid})" for p in multiprocessing.active_children()}
        try:
            import psutil
        except ImportError:
            return sorted(found)
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    found.add(f"{child.name()} (pid {child.pid})")
            except psutil.NoSuchProcess:
                pass
        return sorted(found)

    deadline = time.monotonic() + 5.0  # a worker told to stop may need a moment to exit
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        print(f"\nprocesses still running after the test session: {', '.join(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
