"""The reading order: the labs README's recommended order drives sidebar and footers."""

from __future__ import annotations

import pathlib

import pytest

from course import book, nav
from course.errors import CourseError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _phase(tmp_path: pathlib.Path, order_line: str | None, labs=("01", "02", "03")):
    phase = tmp_path / "phase-00-demo"
    for name in ("00-guide.md", "01-deep-dive.md", "02-mini-build.md", "EXERCISES.md"):
        (phase / name).parent.mkdir(parents=True, exist_ok=True)
        (phase / name).write_text(f"# {name}\n\ntext\n", encoding="utf-8")
    readme = "# Labs\n\n## Recommended order\n\n" + (order_line or "Any order.") + "\n"
    (phase / "labs").mkdir()
    (phase / "labs" / "README.md").write_text(readme, encoding="utf-8")
    for n in labs:
        lab = phase / "labs" / f"lab-{n}-x{n}"
        lab.mkdir()
        (lab / "README.md").write_text(f"# Lab {n}\n\nbody\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("# Home\n", encoding="utf-8")
    return phase


def test_recommended_order_line_orders_the_labs(tmp_path):
    phase = _phase(tmp_path, "Do them in this order: 01 → 03 → 02.")
    assert [p.name for p in nav.lab_order(phase)] == ["lab-01-x01", "lab-03-x03", "lab-02-x02"]


def test_without_an_order_line_labs_follow_folder_order(tmp_path):
    phase = _phase(tmp_path, None)
    assert [p.name for p in nav.lab_order(phase)] == ["lab-01-x01", "lab-02-x02", "lab-03-x03"]


@pytest.mark.parametrize("line", ["Order: 01 → 02.", "Order: 01 → 02 → 02 → 03.",
                                  "Order: 01 → 02 → 04."])
def test_an_order_that_misses_or_repeats_a_lab_is_an_error(tmp_path, line):
    phase = _phase(tmp_path, line)
    with pytest.raises(CourseError, match="exactly once"):
        nav.lab_order(phase)


def test_footers_are_rewritten_to_the_reading_order_and_then_check_clean(tmp_path, capsys):
    _phase(tmp_path, "Do them in this order: 01 → 03 → 02.")
    assert nav.main(tmp_path, check=True) == 1
    assert nav.main(tmp_path, check=False) == 0
    assert nav.main(tmp_path, check=True) == 0
    lab3 = (tmp_path / "phase-00-demo/labs/lab-03-x03/README.md").read_text(encoding="utf-8")
    assert lab3.rstrip().splitlines()[-1] == (
        "[← Previous page](../lab-01-x01/README.md) · [Course home](../../../README.md)"
        " · [Next page →](../lab-02-x02/README.md)"
    )
    ex = (tmp_path / "phase-00-demo/EXERCISES.md").read_text(encoding="utf-8")
    assert ex.rstrip().splitlines()[-1] == (
        "[← Previous page](labs/lab-02-x02/README.md) · [Course home](../README.md)"
    )


def test_a_header_nav_line_is_rewritten_with_the_footer(tmp_path):
    _phase(tmp_path, "Do them in this order: 01 → 03 → 02.")
    lab3 = tmp_path / "phase-00-demo/labs/lab-03-x03/README.md"
    lab3.write_text("[Course home](../../../README.md)\n\n# Lab 03\n\nbody\n", encoding="utf-8")
    problems = nav.footer_problems(tmp_path)
    assert {(p.page.split("/")[-2], p.where) for p in problems} >= {
        ("lab-03-x03", "header"), ("lab-03-x03", "footer")}
    nav.main(tmp_path, check=False)
    lines = lab3.read_text(encoding="utf-8").strip().splitlines()
    assert lines[0] == lines[-1] == (
        "[← Previous page](../lab-01-x01/README.md) · [Course home](../../../README.md)"
        " · [Next page →](../lab-02-x02/README.md)"
    )


def test_sidebar_lists_labs_in_the_recommended_order(tmp_path):
    _phase(tmp_path, "Do them in this order: 02 → 01 → 03.")
    plan = book.make_plan(tmp_path)
    labs = [p for p in plan.pages() if "/lab-" in p]
    assert [p.split("/")[2] for p in labs] == ["lab-02-x02", "lab-01-x01", "lab-03-x03"]


def test_real_footers_follow_the_recommended_order():
    assert [p.page for p in nav.footer_problems(ROOT)] == []


def test_real_phase_02_and_03_orders_are_not_folder_order():
    """The two phases whose READMEs recommend a non-sequential order actually get it."""
    order = {p.name: [lab.name[4:6] for lab in nav.lab_order(p)] for p in nav.phases(ROOT)}
    assert order["phase-02-paged-attention"] == ["01", "02", "05", "06", "03", "04"]
    assert order["phase-03-continuous-batching-scheduler"] == ["01", "02", "05", "04", "06", "03", "07"]
