"""Real multi-process parallelism on the CPU: torch.distributed with the gloo backend."""
from mini_vllm.distributed.launch import run_in_processes

__all__ = ["run_in_processes"]
