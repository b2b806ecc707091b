"""The command line: every bad input is one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest


def course(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "course", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("python -m course")
    for word in words:
        assert word in lines[0], lines[0]


def test_unknown_subcommand(tmp_path):
    assert_one_line_error(course("frobnicate"), "invalid choice: 'frobnicate'", "upstream")


def test_no_subcommand():
    assert_one_line_error(course(), "choose a command")


@pytest.mark.parametrize(
    "args, words",
    [
        (["cite", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["labs", "--lab"], ["--lab", "expected one argument"]),
        (["book", "--out"], ["--out", "expected one argument"]),
        (["upstream", "--from-archive"], ["--from-archive", "expected one argument"]),
    ],
)
def test_bad_options(args, words):
    assert_one_line_error(course(*args), *words)


def test_missing_archive(tmp_path):
    proc = course(
        "upstream",
        "--from-archive",
        str(tmp_path / "vllm.tar.gz"),
        "--dest",
        str(tmp_path / "upstream"),
    )
    assert_one_line_error(proc, "python -m course upstream: error: archive not found")


def test_cite_without_upstream(tmp_path):
    assert_one_line_error(
        course("cite", "--root", str(tmp_path)), "run `python -m course upstream`"
    )


def test_cite_missing_file_and_missing_root(tmp_path):
    (tmp_path / "upstream").mkdir()
    assert_one_line_error(
        course("cite", "--root", str(tmp_path), str(tmp_path / "nope.md")), "no such markdown file"
    )
    assert_one_line_error(course("cite", "--root", str(tmp_path / "nope")), "no such folder")


def test_labs_missing_lab_folder(tmp_path):
    assert_one_line_error(course("labs", "--lab", str(tmp_path / "nope")), "no such folder")


def test_book_no_build_without_a_site(tmp_path):
    assert_one_line_error(
        course("book", "--root", str(tmp_path), "--no-build"), "run `python -m course book` first"
    )


def test_cite_reports_a_broken_citation_with_its_location_and_exits_1(tree):
    root = tree(
        {
            "upstream/vllm/a.py": "def f():\n    return 1\n",
            "docs/notes.md": "# Notes\n\nGood `vllm/a.py:1 f`, bad `vllm/a.py:2 g`.\n",
        }
    )
    proc = course("cite", "--root", str(root))
    assert proc.returncode == 1
    assert (
        proc.stdout.splitlines()[0]
        == "docs/notes.md:3: vllm/a.py:2 g: g does not appear on lines 1-2"
    )
