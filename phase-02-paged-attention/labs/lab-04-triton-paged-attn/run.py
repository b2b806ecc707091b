"""Lab 02-04 — the GPU run: correctness on fp16, then achieved bandwidth.

    python phase-02-paged-attention/labs/lab-04-triton-paged-attn/run.py
    LAB_IMPL=starter python phase-02-paged-attention/labs/lab-04-triton-paged-attn/run.py --seq-len 4096

Needs a CUDA device, torch and triton (``pip install -e '.[triton]'``). Never run
in CI; the test marked ``gpu`` in test_lab.py calls the same ``benchmark``.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repo root, for `course`

from course import load_impl  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=64, help="sequences in the batch")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--peak", type=float, default=None,
                        help="peak bytes/s of your card, if its name is not in PEAK_BANDWIDTH")
    args = parser.parse_args(argv)

    impl = load_impl(__file__)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("run.py needs a CUDA device; the CPU path is `pytest` (interpreter)")
    print("device:", torch.cuda.get_device_name())
    result = impl.benchmark(args.seqs, args.seq_len, args.heads, args.kv_heads, args.head_dim,
                            args.block_size, args.iters, args.peak)
    moved = result["bytes_moved"]
    print(f"max |triton - torch| = {result['max_abs_err']:.2e}  (fp16 inputs, fp32 accumulation)")
    print(f"bytes moved per call = {moved:,}")
    print(f"time per call        = {result['seconds'] * 1e3:.3f} ms")
    print(f"achieved bandwidth   = {result['achieved_bytes_per_s'] / 1e12:.3f} TB/s"
          f" = {result['fraction_of_peak']:.1%} of peak")


if __name__ == "__main__":
    main()
