"""``python -m course nav``: the reading order of a phase, and the footer links it implies.

A phase is read as: guide, deep-dive, mini-build, the labs' README, each lab in the
*recommended* order, then exercises, interview and cheatsheet; the last page of a
phase leads to the next phase's guide. The recommended order of the labs is the one
line of ``labs/README.md`` under its "Recommended order" heading that reads like
``Do them in this order: 01 → 02 → 05 → 06 → 03 → 04.`` (two-digit lab numbers
joined by arrows; every lab exactly once). Without such a line, folder order.

That one line is the single source: the book's sidebar (``course/book.py``), the
footer of every phase page (``[← Previous page](…) · [Course home](…) · [Next page →](…)``)
and its header, when the page opens with the same line, all follow it.
``python -m course nav`` rewrites the nav lines that disagree;
``--check`` only lists them (exit 1), and the test suite runs the check.
"""

from __future__ import annotations

import dataclasses
import pathlib
import posixpath
import re

from course.errors import CourseError

PHASE_RE = re.compile(r"^phase-(\d\d)-[\w-]+$")
LAB_RE = re.compile(r"^lab-(\d\d)-[\w-]+$")
ORDER_HEADING_RE = re.compile(r"^#+\s+Recommended order\s*$", re.IGNORECASE)
ORDER_LINE_RE = re.compile(r"\b(\d\d(?:\s*→\s*\d\d)+)\b")
FOOTER_RE = re.compile(
    r"^(?:\[← Previous page\]\([^)]*\) · )?\[Course home\]\([^)]*\)(?: · \[Next page →\]\([^)]*\))?\s*$"
)
PHASE_HEAD = ("00-guide.md", "01-deep-dive.md", "02-mini-build.md")
PHASE_TAIL = ("EXERCISES.md", "INTERVIEW.md", "CHEATSHEET.md")


def phases(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.glob("phase-*") if p.is_dir() and PHASE_RE.match(p.name))


def lab_dirs(phase: pathlib.Path) -> list[pathlib.Path]:
    """The phase's lab folders in folder order."""
    labs = phase / "labs"
    if not labs.is_dir():
        return []
    return sorted(p for p in labs.iterdir() if p.is_dir() and LAB_RE.match(p.name))


def recommended_numbers(readme: pathlib.Path) -> list[str] | None:
    """The lab numbers of the "Recommended order" line of a labs README, or None."""
    if not readme.is_file():
        return None
    under_heading = False
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            under_heading = bool(ORDER_HEADING_RE.match(line))
            continue
        if under_heading:
            match = ORDER_LINE_RE.search(line)
            if match:
                return re.findall(r"\d\d", match.group(1))
    return None


def lab_order(phase: pathlib.Path) -> list[pathlib.Path]:
    """The phase's labs in the recommended order (folder order when none is given)."""
    labs = lab_dirs(phase)
    numbers = recommended_numbers(phase / "labs" / "README.md")
    if numbers is None:
        return labs
    by_number = {LAB_RE.match(p.name).group(1): p for p in labs}  # type: ignore[union-attr]
    where = f"{phase.name}/labs/README.md"
    if sorted(numbers) != sorted(by_number) or len(set(numbers)) != len(numbers):
        raise CourseError(
            f"{where}: the recommended order {' → '.join(numbers)} must name every lab "
            f"({', '.join(sorted(by_number))}) exactly once"
        )
    return [by_number[n] for n in numbers]


def phase_pages(root: pathlib.Path, phase: pathlib.Path) -> list[str]:
    """Repo-relative paths of the phase's pages, in reading order (existing pages only)."""
    rel = phase.relative_to(root).as_posix()
    names = [f"{rel}/{name}" for name in PHASE_HEAD]
    names.append(f"{rel}/labs/README.md")
    names += [f"{rel}/labs/{lab.name}/README.md" for lab in lab_order(phase)]
    names += [f"{rel}/{name}" for name in PHASE_TAIL]
    return [n for n in names if (root / n).is_file()]


def course_pages(root: pathlib.Path) -> list[str]:
    return [page for phase in phases(root) for page in phase_pages(root, phase)]


def _rel(page: str, target: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page) or ".")


def footer(page: str, prev: str | None, nxt: str | None) -> str:
    """The footer line of ``page`` (repo-relative) given its neighbours."""
    parts = []
    if prev:
        parts.append(f"[← Previous page]({_rel(page, prev)})")
    parts.append(f"[Course home]({_rel(page, 'README.md')})")
    if nxt:
        parts.append(f"[Next page →]({_rel(page, nxt)})")
    return " · ".join(parts)


@dataclasses.dataclass
class FooterProblem:
    page: str
    found: str | None  # the current nav line (header or footer), None when the page has none
    wanted: str
    where: str = "footer"  # or "header": the page's first line, when it is a nav line


def footer_problems(root: pathlib.Path) -> list[FooterProblem]:
    """Every nav line (a page's footer, and its header when it has one) that is out of order."""
    pages = course_pages(root)
    problems = []
    for i, page in enumerate(pages):
        prev = pages[i - 1] if i > 0 else None
        nxt = pages[i + 1] if i + 1 < len(pages) else None
        wanted = footer(page, prev, nxt)
        header, found = _nav_lines(root / page)
        if header is not None and header != wanted:
            problems.append(FooterProblem(page, header, wanted, "header"))
        if found != wanted:
            problems.append(FooterProblem(page, found, wanted))
    return problems


def _nav_lines(path: pathlib.Path) -> tuple[str | None, str | None]:
    """(header, footer): the first and last non-empty lines, where they are nav lines."""
    lines = [line.rstrip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        return None, None
    header = lines[0] if FOOTER_RE.match(lines[0]) else None
    footer_line = lines[-1] if FOOTER_RE.match(lines[-1]) and len(lines) > 1 else None
    return header, footer_line


def fix(root: pathlib.Path, problem: FooterProblem) -> None:
    path = root / problem.page
    lines = path.read_text(encoding="utf-8").splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if problem.where == "header":
        lines[filled[0]] = problem.wanted
    elif problem.found is None:
        lines += ["", problem.wanted]
    else:
        lines[filled[-1]] = problem.wanted
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(root: pathlib.Path, check: bool) -> int:
    problems = footer_problems(root)
    for p in problems:
        if check:
            print(f"{p.page}: {p.where} should be: {p.wanted}")
        else:
            fix(root, p)
            print(f"{p.page}: {p.where} rewritten")
    n = len(course_pages(root))
    if check and problems:
        print(f"{len(problems)} nav lines of {n} pages are out of reading order "
              f"(python -m course nav rewrites them)")
        return 1
    print(f"{n} pages checked, {len(problems)} nav line{'s' if len(problems) != 1 else ''} "
          f"{'to fix' if check else 'rewritten'}")
    return 0
