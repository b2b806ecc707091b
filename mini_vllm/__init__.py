"""mini_vllm: a small, readable reimplementation of vLLM v1's core."""
