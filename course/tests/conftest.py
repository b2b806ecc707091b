"""Shared helpers for the tests of the course tooling: small trees in tmp_path."""

from __future__ import annotations

import pathlib
import textwrap

import pytest


def write_tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """Write ``{relative path: text}`` under ``root`` (text is dedented)."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


@pytest.fixture
def tree(tmp_path):
    """``tree({path: text})`` writes files under tmp_path and returns tmp_path."""
    return lambda files, root=None: write_tree(root or tmp_path, files)


@pytest.fixture(scope="session")
def write_files():
    """``write_tree`` itself, for module-scoped fixtures."""
    return write_tree


@pytest.fixture(scope="session")
def real_book(tmp_path_factory):
    """The repository's own book, assembled and built once per session: (site, plan, problems).

    ``problems`` are what ``python -m course book`` would print: code fences, mdBook's
    warnings and broken links. The link test and the browser test share this one build.
    """
    from course import book

    root = pathlib.Path(__file__).resolve().parents[2]
    tmp = tmp_path_factory.mktemp("real-book")
    src, out = tmp / "src", tmp / "site"
    plan = book.assemble(root, src)
    # the steps of book.run, kept apart so the plan comes back too
    problems = book.check_fences(root, plan.pages()) + book.build(root, src, out)
    problems += book.check_site(out) if (out / "index.html").is_file() else [f"{out}: no index.html"]
    return out, plan, problems
