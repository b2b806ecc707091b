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
