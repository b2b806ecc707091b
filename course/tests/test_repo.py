"""The course tools run over this repository itself (cheap parts only).

The full lab contract (running every lab with the solution and the starter) is
`python -m course labs`, a CI step; here only its static part runs.
"""

from __future__ import annotations

import pathlib

import pytest

from course import book, cite, labs

ROOT = pathlib.Path(__file__).resolve().parents[2]
LABS = labs.find_labs(ROOT)


@pytest.mark.parametrize("lab", LABS, ids=[p.relative_to(ROOT).as_posix() for p in LABS])
def test_real_labs_static_contract(lab):
    """Files present, tag, same public API in starter and solution, no leaked solution."""
    assert labs.static_problems(lab) == []


@pytest.mark.upstream
def test_real_citations_resolve():
    report = cite.check(ROOT, ROOT / "upstream")
    broken = [f"{c.doc.relative_to(ROOT)}:{c.line}: {c.text}: {why}" for c, why in report.broken]
    assert broken == []


def test_real_book_builds_and_every_link_resolves(tmp_path, capsys):
    status = book.run(ROOT, out=tmp_path / "site", src=tmp_path / "src")
    assert status == 0, "\n".join(capsys.readouterr().out.splitlines()[-40:])
