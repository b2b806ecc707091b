"""The lab loader (course.loader) and the LAB_IMPL switch of the root conftest."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from course import load_impl
from course.loader import LabImplError, selected_impl

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def two_labs(tree):
    return tree(
        {
            "phase-00-a/labs/lab-01-x/solution.py": "WHO = 'solution of lab 01'\n",
            "phase-00-a/labs/lab-01-x/starter.py": "WHO = 'starter of lab 01'\n",
            "phase-00-a/labs/lab-02-y/solution.py": "WHO = 'solution of lab 02'\n",
            "phase-00-a/labs/lab-02-y/starter.py": "WHO = 'starter of lab 02'\n",
        }
    )


def test_default_is_the_solution(two_labs, monkeypatch):
    monkeypatch.delenv("LAB_IMPL", raising=False)
    impl = load_impl(two_labs / "phase-00-a/labs/lab-01-x/test_lab.py")
    assert impl.WHO == "solution of lab 01"


def test_lab_impl_starter_loads_the_starter(two_labs, monkeypatch):
    monkeypatch.setenv("LAB_IMPL", "starter")
    assert selected_impl() == "starter"
    impl = load_impl(two_labs / "phase-00-a/labs/lab-01-x/test_lab.py")
    assert impl.WHO == "starter of lab 01"


def test_explicit_impl_overrides_the_environment(two_labs, monkeypatch):
    monkeypatch.setenv("LAB_IMPL", "starter")
    impl = load_impl(two_labs / "phase-00-a/labs/lab-02-y/test_lab.py", impl="solution")
    assert impl.WHO == "solution of lab 02"


def test_bad_value_names_the_allowed_values(monkeypatch):
    monkeypatch.setenv("LAB_IMPL", "answer")
    with pytest.raises(LabImplError, match="'answer'.*solution, starter"):
        selected_impl()
    with pytest.raises(LabImplError, match="solution, starter"):
        load_impl(__file__, impl="both")


def test_two_labs_with_the_same_file_names_do_not_collide(two_labs, monkeypatch):
    monkeypatch.delenv("LAB_IMPL", raising=False)
    first = load_impl(two_labs / "phase-00-a/labs/lab-01-x/test_lab.py")
    second = load_impl(two_labs / "phase-00-a/labs/lab-02-y/test_lab.py")
    assert (first.WHO, second.WHO) == ("solution of lab 01", "solution of lab 02")
    assert first.__name__ != second.__name__
    assert sys.modules[first.__name__] is first


def test_pytest_refuses_a_bad_lab_impl_with_a_message(tmp_path):
    """The root conftest stops the session (exit 4, usage error) and names the values."""
    env = dict(os.environ, LAB_IMPL="bogus")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", str(pathlib.Path(__file__))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "LAB_IMPL='bogus' is not allowed: use one of solution, starter" in proc.stderr
