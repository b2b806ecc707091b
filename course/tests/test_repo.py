"""The course tools run over this repository itself.

The solutions are graded by the main test run itself (every lab's tests run on
``solution.py`` by default). What that run cannot see is the other half of the
lab contract: that the shipped starters fail, and fail by NotImplementedError.
``test_every_shipped_starter_fails_by_not_implemented_error`` runs all lab tests
once more with LAB_IMPL=starter in one subprocess. ``python -m course labs``
does both halves with a table, and CI runs it too.

Both judge the *shipped* starters, so they carry the ``contract`` marker and run
only with ``COURSE_CONTRACT=1`` (``.ci/run`` sets it): a learner who fills in
starters in place, and commits them, keeps a green ``pytest -m "not gpu"``.
"""

from __future__ import annotations

import pathlib
import tempfile

import pytest

from course import book, cite, labs

ROOT = pathlib.Path(__file__).resolve().parents[2]
LABS = labs.find_labs(ROOT)


@pytest.mark.contract
@pytest.mark.parametrize("lab", LABS, ids=[p.relative_to(ROOT).as_posix() for p in LABS])
def test_real_labs_static_contract(lab):
    """Files present, tag, same public API in starter and solution, no leaked solution."""
    assert labs.static_problems(lab) == []


@pytest.mark.upstream
def test_real_citations_resolve():
    report = cite.check(ROOT, ROOT / "upstream")
    broken = [f"{c.doc.relative_to(ROOT)}:{c.line}: {c.text}: {why}" for c, why in report.broken]
    assert broken == []


def test_real_book_builds_and_every_link_resolves(real_book):
    site, plan, problems = real_book  # built once per session (conftest.py), shared with the browser test
    assert (site / "index.html").is_file() and plan.pages()
    assert problems == [], "\n".join(problems[-40:])


@pytest.mark.contract
def test_every_shipped_starter_fails_by_not_implemented_error():
    runnable = [lab for lab in LABS if (lab / "test_lab.py").is_file()]
    halves = [runnable[0::2], runnable[1::2]]  # two processes: the machine has two cores
    cases = {}
    with tempfile.TemporaryDirectory(prefix="course-starters-") as tmp:
        procs = []
        for i, half in enumerate(h for h in halves if h):
            xml = pathlib.Path(tmp) / f"starter-{i}.xml"
            procs.append((labs.run_pytest(ROOT, half, "starter", xml), xml, half))
        for proc, xml, half in procs:
            output, _ = proc.communicate(timeout=labs.PYTEST_TIMEOUT_S)
            assert xml.is_file(), output[-2000:]
            run = labs.parse_junit(xml, ROOT, half)
            for lab in half:
                cases[lab] = run
    problems = []
    for lab in runnable:
        result = labs.LabResult(lab, "?")
        labs.judge_starter(result, cases[lab])
        problems += [f"{lab.relative_to(ROOT)}: {p}" for p in result.problems]
        assert cases[lab].cases[lab], f"{lab.relative_to(ROOT)}: no test ran on the starter"
    assert problems == []
