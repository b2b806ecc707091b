"""Run a function in N real processes joined by torch.distributed (gloo): the CPU test bed.

vLLM starts one worker process per GPU and joins them with NCCL
(``MultiprocExecutor``); the same ``torch.distributed`` calls run on a CPU
with the gloo backend. ``run_in_processes(world_size, fn, *args)`` forks
``world_size`` processes, gives each a process group (a ``file://``
rendezvous in a fresh temporary folder, so parallel tests never collide),
calls ``fn(rank, world_size, *args)`` in each, and returns the ranks' results
in rank order.

Forking costs well under a second here, where spawning a fresh interpreter
that imports torch takes several; so the workers fork, and each limits torch
to one thread (two ranks on a 2-core machine must not fight over cores).

Failures are loud and bounded: an exception in any rank becomes a
``RuntimeError`` in the parent carrying that rank's traceback, and a world
that does not finish within ``timeout`` seconds (a rank stuck in a
collective its peers never join) is killed and reported the same way. No
worker outlives the call.

upstream: vllm/distributed/parallel_state.py:1370 init_distributed_environment
upstream: vllm/v1/executor/multiproc_executor.py:102 MultiprocExecutor
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any


def _worker(rank: int, world_size: int, init_file: str, fn: Callable, args: tuple, results) -> None:
    status, payload = "ok", None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size)
        try:
            payload = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        status, payload = "error", traceback.format_exc()
    try:
        results.put((rank, status, payload))
    except Exception:  # noqa: BLE001 - an unpicklable result
        results.put((rank, "error", f"rank {rank}: its result could not be pickled:\n"
                                    f"{traceback.format_exc()}"))
    results.close()
    results.join_thread()
    os._exit(0)


def run_in_processes(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0) -> list:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``, each in its
    own forked process with a gloo process group. Raises ``ValueError`` for a bad
    ``world_size`` or ``timeout``, ``RuntimeError`` when a rank fails or the world times out."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="mini_vllm_dist_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_worker, args=(r, world_size, init_file, fn, args, results), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        got: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(got) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(world_size)) - set(got))
                    raise RuntimeError(f"ranks {missing} of {world_size} did not finish within "
                                       f"{timeout} s (a collective that not every rank joined?)")
                try:
                    rank, status, payload = results.get(timeout=min(left, 0.5))
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}") from None
                    continue
                got[rank] = (status, payload)
                if status == "error":
                    raise RuntimeError(f"rank {rank} of {world_size} failed:\n{payload}")
        finally:
            for p in procs:
                p.join(timeout=0.5 if len(got) == world_size else 0)
                if p.is_alive():
                    p.kill()
                    p.join()
            results.close()
    return [got[r][1] for r in range(world_size)]
