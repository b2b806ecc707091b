"""The learner's loop: filling in starters in place never turns the suite red,
while CI (COURSE_CONTRACT=1) still fails when a shipped starter passes or leaks.

Both halves run the real root conftest.py, pyproject.toml and test_repo.py in a
small copy of the repository holding one lab, once as a learner who finished it
(starter.py == solution.py, committed or not) and once as CI would run it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB = "phase-00-foundations/labs/lab-02-kv-memory-calculator"


@pytest.fixture(scope="module")
def finished_repo(tmp_path_factory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("learner") / "repo"
    (repo / "course" / "tests").mkdir(parents=True)
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copy(ROOT / "course/tests/test_repo.py", repo / "course/tests/test_repo.py")
    shutil.copytree(ROOT / LAB, repo / LAB, ignore=shutil.ignore_patterns("__pycache__", "mutants"))
    shutil.copy(repo / LAB / "solution.py", repo / LAB / "starter.py")  # the learner is done
    return repo


def _pytest(repo: pathlib.Path, contract: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_CONTRACT", "LAB_IMPL",
                                                             "LAB_IMPL_FILE")}
    if contract:
        env["COURSE_CONTRACT"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "not gpu", "-k",
         "static_contract or shipped_starter", "course/tests/test_repo.py"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    )


def test_a_learners_finished_starter_keeps_the_suite_green(finished_repo):
    run = _pytest(finished_repo, contract=False)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "judges the shipped starters, not yours" in run.stdout


def test_ci_fails_when_a_shipped_starter_passes_or_leaks_the_solution(finished_repo):
    run = _pytest(finished_repo, contract=True)
    assert run.returncode == 1, run.stdout[-3000:]
    # both halves of the contract catch it: the static leak check and the starter run
    assert "test_real_labs_static_contract" in run.stdout
    assert "test_every_shipped_starter_fails_by_not_implemented_error" in run.stdout
    assert "2 failed" in run.stdout
