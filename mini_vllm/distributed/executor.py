"""MultiprocExecutor: N forked worker processes, one pipe each, every call sent to all.

The engine process keeps the scheduler and the KV block manager; it never holds
a weight. Each step it sends the same ``ModelInput`` to every worker
(``collective_rpc("execute_model", ...)``), the workers run their shards in
lockstep (the all-reduces inside the forward pass are where they meet), and
only the output rank's reply carries data: rank 0's full logits
(``unique_reply_rank=0``). The other ranks answer with a bare "done", which
lets the parent see a failure on any rank at once.

Failures never hang the engine: a worker that raises sends its traceback and
the parent raises ``RuntimeError`` with it; a worker that dies or a call that
does not finish within ``timeout_s`` (a rank stuck in a collective its peers
never join) is reported the same way. In every case all workers are killed and
the executor is closed. ``shutdown()`` (also run at interpreter exit, through
``weakref.finalize``) asks the workers to leave, then kills any that linger.

Workers are forked, not spawned: a fork costs a fraction of a second here,
a fresh interpreter importing torch several seconds; each worker runs torch
on one thread. On GPUs, upstream spawns (CUDA cannot be forked once
initialised; the parent here never touches CUDA) and uses NCCL.

upstream: vllm/v1/executor/multiproc_executor.py:102 MultiprocExecutor
upstream: vllm/v1/executor/multiproc_executor.py:339 collective_rpc
upstream: vllm/v1/executor/multiproc_executor.py:480 _get_output_rank
upstream: vllm/v1/executor/multiproc_executor.py:944 worker_busy_loop
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import shutil
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

_SHUTDOWN = "__shutdown__"


def _worker_main(rank: int, world_size: int, init_method: str, backend: str, make_worker: Callable,
                 conn, inherited: list, parent_pid: int) -> None:
    """A worker process: join the group, build the worker, then serve calls until shutdown."""
    for other in inherited:  # the parent's ends of the earlier workers' pipes: not ours to hold
        other.close()
    try:
        import torch

        from mini_vllm.distributed.parallel_state import (
            init_distributed_environment,
            initialize_model_parallel,
        )

        torch.set_num_threads(1)
        init_distributed_environment(world_size, rank, init_method, backend)
        initialize_model_parallel(world_size)
        worker = make_worker(rank, world_size)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", f"rank {rank} failed to start:\n{traceback.format_exc()}"))
        os._exit(1)
    worker_busy_loop(worker, conn, rank, parent_pid)
    os._exit(0)  # no destroy_process_group: a peer may already be gone


def worker_busy_loop(worker, conn, rank: int, parent_pid: int) -> None:
    """Receive ``(method, args, kwargs, reply_rank)``, run it, answer; leave on shutdown or orphaning."""
    while True:
        while not conn.poll(1.0):
            if os.getppid() != parent_pid:  # the engine died without a word: do not linger
                return
        try:
            method, args, kwargs, reply_rank = conn.recv()
        except EOFError:
            return
        if method == _SHUTDOWN:
            return
        try:
            result = getattr(worker, method)(*args, **kwargs)
            conn.send(("ok", result if reply_rank is None or reply_rank == rank else None))
        except BaseException:  # noqa: BLE001
            conn.send(("error", f"rank {rank} failed in {method}:\n{traceback.format_exc()}"))


def _shutdown_workers(procs: list, conns: list, tmpdir: str, grace_s: float = 2.0) -> None:
    """Ask every worker to leave, give them ``grace_s`` seconds, kill the rest."""
    for conn in conns:
        try:
            conn.send((_SHUTDOWN, (), {}, None))
        except (OSError, ValueError):
            pass  # already closed, or the worker is gone
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    for conn in conns:
        conn.close()
    shutil.rmtree(tmpdir, ignore_errors=True)


class MultiprocExecutor:
    """``world_size`` forked workers; ``make_worker(rank, world_size)`` builds each rank's state
    after its process group is up. Raises ``RuntimeError`` if any rank fails to start."""

    def __init__(self, world_size: int, make_worker: Callable[[int, int], Any], timeout_s: float = 60.0,
                 backend: str = "gloo") -> None:
        self.world_size, self.timeout_s = world_size, timeout_s
        self.output_rank = 0  # TP rank 0 of the last pipeline stage; PP = 1 here
        ctx = mp.get_context("fork")
        tmpdir = tempfile.mkdtemp(prefix="mini_vllm_tp_")
        init_method = f"file://{os.path.join(tmpdir, 'rendezvous')}"
        self._procs, self._conns = [], []
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, name=f"mini_vllm-TP{rank}", daemon=True,
                               args=(rank, world_size, init_method, backend, make_worker, child_end,
                                     list(self._conns) + [parent_end], os.getpid()))
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
        self._finalizer = weakref.finalize(self, _shutdown_workers, self._procs, self._conns, tmpdir)
        self._collect("start-up")

    @property
    def is_alive(self) -> bool:
        return self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None,
                       unique_reply_rank: int | None = None, timeout: float | None = None) -> Any:
        """Run ``worker.method(*args, **kwargs)`` on every rank; the list of results in rank
        order, or only rank ``unique_reply_rank``'s result (the others send none)."""
        if not self.is_alive:
            raise RuntimeError("the executor is shut down (a worker failed, or shutdown() was called)")
        message = (method, args, kwargs or {}, unique_reply_rank)
        for conn in self._conns:
            try:
                conn.send(message)
            except (OSError, ValueError) as e:  # a worker's pipe is gone
                self._fail(f"could not send {method!r} to a worker: {e}")
        results = self._collect(method, timeout)
        return results if unique_reply_rank is None else results[unique_reply_rank]

    def _collect(self, what: str, timeout: float | None = None) -> list:
        timeout = self.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        results: list[Any] = [None] * self.world_size
        pending = dict(enumerate(self._conns))
        while pending:
            sentinels = {self._procs[r].sentinel: r for r in pending}
            ready = mpc.wait(list(pending.values()) + list(sentinels), max(0.0, deadline - time.monotonic()))
            if not ready:
                self._fail(f"ranks {sorted(pending)} of {self.world_size} did not finish {what!r} within "
                           f"{timeout} s (a collective that not every rank joined?)")
            for obj in ready:
                rank = sentinels.get(obj)
                if rank is not None:  # a worker exited: fatal unless its answer is still waiting
                    if rank in pending and not self._conns[rank].poll():
                        self._procs[rank].join(0.1)
                        self._fail(f"worker rank {rank} died during {what!r} "
                                   f"(exit code {self._procs[rank].exitcode})")
                    continue
                rank = next(r for r, c in pending.items() if c is obj)
                try:
                    status, payload = obj.recv()
                except EOFError:
                    status, payload = "error", "its pipe closed without an answer"
                if status == "error":
                    self._fail(f"worker rank {rank} raised during {what!r}:\n{payload}")
                results[rank] = payload
                pending.pop(rank)
        return results

    def _fail(self, message: str) -> None:
        """Kill every worker at once (a peer may be stuck in a collective) and raise."""
        detached = self._finalizer.detach()
        if detached is not None:
            _, func, args, _ = detached
            func(*args, grace_s=0.0)
        raise RuntimeError(message)

    def shutdown(self) -> None:
        """Stop every worker (idempotent); later calls raise ``RuntimeError``."""
        self._finalizer()


class TensorParallelModel:
    """The model interface (``init_kv_cache``, ``execute``, ...) over a ``MultiprocExecutor``:
    what ``LLMEngine`` holds instead of a model when ``tensor_parallel_size > 1``.

    The parent builds the float32 reference model once (numpy, no KV cache), checks
    that it splits ``tensor_parallel_size`` ways, and forks the workers, which inherit
    its weights and each cut out their shard; the parent keeps only the config and
    tokenizer. ``kv_cache_bytes_per_rank()`` asks every worker; ``kv_cache_bytes`` is
    rank 0's. ``last_num_collectives`` is the last step's all-reduces and gathers.
    """

    def __init__(self, name: str, tensor_parallel_size: int, seed: int = 0, max_model_len: int | None = None,
                 device: str = "cpu", timeout_s: float = 60.0) -> None:
        from mini_vllm.distributed.sharding import check_tp_size
        from mini_vllm.distributed.worker import Worker
        from mini_vllm.models import get_model

        reference = get_model(name, seed=seed, max_model_len=max_model_len)
        if getattr(reference, "config", None) is None or reference.config.is_moe:
            raise ValueError(f"tensor_parallel_size > 1 runs dense transformers only, not {name!r}")
        check_tp_size(reference.config, tensor_parallel_size)
        self.config, self.tokenizer, self.name = reference.config, reference.tokenizer, reference.name
        self.vocab_size, self.eos_token_id = reference.vocab_size, reference.eos_token_id
        self.max_model_len, self.tensor_parallel_size = reference.max_model_len, tensor_parallel_size
        self.attn_platform = "cuda" if device == "cuda" else "torch"
        self.attn_backend = None
        self.last_num_collectives = 0
        self.executor = MultiprocExecutor(
            tensor_parallel_size, lambda rank, world: Worker(reference, rank, world, device), timeout_s,
            backend="nccl" if device == "cuda" else "gloo")

    def init_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.executor.collective_rpc("init_kv_cache", (num_blocks, block_size))

    def set_attn_backend(self, backend_cls: type) -> None:
        self.executor.collective_rpc("set_attn_backend", (backend_cls,))
        self.attn_backend = backend_cls()  # the parent's copy carries rank 0's kv_rows_read

    def kv_cache_bytes_per_rank(self) -> list[int]:
        return self.executor.collective_rpc("kv_cache_bytes")

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_cache_bytes_per_rank()[0]

    def execute(self, model_input) -> np.ndarray:
        out = self.executor.collective_rpc("execute_model", (model_input,),
                                           unique_reply_rank=self.executor.output_rank)
        self.last_num_collectives = out["num_collectives"]
        if self.attn_backend is not None:
            self.attn_backend.kv_rows_read = out["kv_rows_read"]
        return out["logits"]

    def shutdown(self) -> None:
        self.executor.shutdown()
