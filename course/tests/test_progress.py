"""``python -m course progress`` on fixture labs: the four verdicts and the cache."""

from __future__ import annotations

import pytest

from course import progress
from course.errors import CourseError

from .test_labs import SOLUTION, STARTER, lab_files

HALF_DONE = STARTER.replace(
    '"""Recipe: add `by` to self.value and return it."""\n        raise NotImplementedError("Counter.bump")',
    "self.value += by\n        return self.value",
)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, write_files):
    """Four fixture labs and one progress run over them, shared by the tests below (each lab
    costs a pytest process); the cache test, which edits a starter, runs last."""
    root = tmp_path_factory.mktemp("progress")
    write_files(root, lab_files("lab-01-untouched"))
    write_files(root, lab_files("lab-02-finished", **{"starter.py": SOLUTION}))
    write_files(root, lab_files("lab-03-half", **{"starter.py": HALF_DONE}))
    write_files(root, lab_files("lab-04-typo", **{"starter.py": STARTER + "\nthis is not python\n"}))
    return root, progress.progress(root, [])


@pytest.fixture()
def root(first_run):
    return first_run[0]


def _verdicts(table):
    return {row.lab.split("/")[-1]: (row.verdict, row.passed, row.total)
            for _, rows in table for row in rows}


def test_each_lab_gets_its_verdict(first_run):
    _, (table, ran) = first_run
    assert ran == 4
    assert _verdicts(table) == {
        "lab-01-untouched": ("not started", 0, 2),
        "lab-02-finished": ("done", 2, 2),
        "lab-03-half": ("in progress", 1, 2),
        "lab-04-typo": ("broken", 0, 0),
    }


def test_report_totals_per_phase_and_overall(first_run):
    _, (table, _) = first_run
    lines = progress.format_report(table)
    assert "  1 of 4 labs done" in lines
    assert lines[-1] == "total: 1 of 4 labs done, 1 in progress, 1 not started, 1 broken"


def test_an_unknown_phase_is_a_one_line_error(root):
    with pytest.raises(CourseError, match="PHASE '07': no such phase"):
        progress.progress(root, ["07"])


def test_second_run_comes_from_the_cache_until_a_file_changes(root):
    table, ran = progress.progress(root, [])  # the module's first run filled the cache
    assert ran == 0 and _verdicts(table)["lab-01-untouched"][0] == "not started"
    starter = root / "phase-00-fixture/labs/lab-01-untouched/starter.py"
    starter.write_text(SOLUTION, encoding="utf-8")  # the learner finishes lab 01
    table, ran = progress.progress(root, [])
    assert ran == 1 and _verdicts(table)["lab-01-untouched"] == ("done", 2, 2)
