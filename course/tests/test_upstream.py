"""``python -m course upstream`` against fixture archives and a local git repository."""

from __future__ import annotations

import hashlib
import io
import pathlib
import shutil
import subprocess
import tarfile

import pytest

from course import upstream
from course.errors import CourseError


def make_archive(path: pathlib.Path, version: str = "9.9.9", top: str | None = None) -> str:
    """A tiny vllm-like source archive; returns its sha256."""
    top = top or f"vllm-{version}"
    files = {
        f"{top}/PKG-INFO": f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n",
        f"{top}/vllm/__init__.py": "",
        f"{top}/vllm/_version.py": f"__version__ = version = '{version}'\n",
        f"{top}/vllm/v1/core/block_pool.py": "class BlockPool:\n    pass\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quiet(_line: str) -> None:
    pass


def test_good_archive_is_extracted_with_top_folder_stripped_and_is_idempotent(tmp_path):
    archive = tmp_path / "vllm-9.9.9.tar.gz"
    pin = upstream.Pin(version="9.9.9", sha256=make_archive(archive))
    dest = tmp_path / "upstream"
    summary = upstream.fetch(dest, archive=archive, pin=pin, log=quiet)
    assert summary == "upstream/ now holds vLLM 9.9.9 (from vllm-9.9.9.tar.gz, sha256 verified)"
    assert (dest / "vllm" / "v1" / "core" / "block_pool.py").is_file()
    assert upstream.read_marker(dest)["version"] == "9.9.9"
    # second run: nothing re-extracted (a local edit survives), same answer
    (dest / "vllm" / "__init__.py").write_text("# touched\n")
    again = upstream.fetch(dest, archive=archive, pin=pin, log=quiet)
    assert again.startswith("upstream/ already holds vLLM 9.9.9")
    assert (dest / "vllm" / "__init__.py").read_text() == "# touched\n"
    assert not list(tmp_path.glob(".upstream-*")), "temporary folder left behind"


def test_checksum_mismatch_is_a_clear_error_and_writes_nothing(tmp_path):
    archive = tmp_path / "vllm-9.9.9.tar.gz"
    make_archive(archive)
    pin = upstream.Pin(version="9.9.9", sha256="0" * 64)
    with pytest.raises(CourseError, match=r"checksum mismatch .*expected 0{64}"):
        upstream.fetch(tmp_path / "upstream", archive=archive, pin=pin, log=quiet)
    assert not (tmp_path / "upstream").exists()


def test_missing_archive_is_a_clear_error(tmp_path):
    with pytest.raises(CourseError, match="archive not found"):
        upstream.fetch(tmp_path / "upstream", archive=tmp_path / "nope.tar.gz", log=quiet)


def test_archive_of_another_version_is_refused(tmp_path):
    archive = tmp_path / "vllm-1.0.0.tar.gz"
    pin = upstream.Pin(version="9.9.9", sha256=make_archive(archive, version="1.0.0"))
    with pytest.raises(CourseError, match="holds vLLM 1.0.0, not the pinned 9.9.9"):
        upstream.fetch(tmp_path / "upstream", archive=archive, pin=pin, log=quiet)
    assert not (tmp_path / "upstream").exists()


def test_another_version_already_present_is_a_clear_error(tree):
    root = tree({"upstream/PKG-INFO": "Name: vllm\nVersion: 0.21.0\n"})
    with pytest.raises(CourseError, match="holds vLLM 0.21.0, not the pinned 0.22.1"):
        upstream.fetch(root / "upstream", log=quiet)


def test_marker_of_another_version_is_a_clear_error(tree):
    root = tree({"upstream/.vllm-mastery-pin": "version: 0.20.0\nsource: git\n"})
    with pytest.raises(CourseError, match="holds vLLM 0.20.0"):
        upstream.fetch(root / "upstream", log=quiet)


def test_hand_extracted_tree_of_the_pin_is_accepted_and_marked(tree):
    root = tree({"upstream/vllm/_version.py": "__version__ = version = '0.22.1'\n"})
    summary = upstream.fetch(root / "upstream", log=quiet)
    assert "already holds vLLM 0.22.1" in summary
    assert upstream.read_marker(root / "upstream")["version"] == "0.22.1"


def test_folder_that_is_not_vllm_is_refused(tree):
    root = tree({"upstream/notes.txt": "hello\n"})
    with pytest.raises(CourseError, match="not a vLLM source tree"):
        upstream.fetch(root / "upstream", log=quiet)


def test_archive_with_two_top_folders_is_refused(tmp_path):
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("a/x.py", "b/y.py"):
            info = tarfile.TarInfo(name)
            tar.addfile(info, io.BytesIO(b""))
    pin = upstream.Pin(sha256=hashlib.sha256(archive.read_bytes()).hexdigest())
    with pytest.raises(CourseError, match="does not hold one top folder"):
        upstream.fetch(tmp_path / "upstream", archive=archive, pin=pin, log=quiet)


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(*args: str, cwd: pathlib.Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture
def origin(tmp_path) -> tuple[pathlib.Path, str]:
    repo = tmp_path / "origin"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    (repo / "PKG-INFO").write_text("Version: 9.9.9\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-q", "-m", "v9.9.9", cwd=repo)
    _git("tag", "v9.9.9", cwd=repo)
    return repo, _git("rev-parse", "HEAD", cwd=repo)


@needs_git
def test_git_clone_verifies_the_commit_and_is_idempotent(tmp_path, origin):
    repo, commit = origin
    pin = upstream.Pin(version="9.9.9", tag="v9.9.9", commit=commit, git_url=repo.as_uri())
    dest = tmp_path / "upstream"
    summary = upstream.fetch(dest, pin=pin, log=quiet)
    assert summary.endswith(f"(git v9.9.9, commit {commit[:12]} verified)")
    assert upstream.fetch(dest, pin=pin, log=quiet).startswith("upstream/ already holds")
    status = _git("status", "--porcelain", cwd=dest)
    assert status == "", "the marker must not show up as an untracked file"


@needs_git
def test_git_clone_of_a_moved_tag_is_refused(tmp_path, origin):
    repo, _ = origin
    pin = upstream.Pin(version="9.9.9", tag="v9.9.9", commit="f" * 40, git_url=repo.as_uri())
    with pytest.raises(CourseError, match="the tag moved"):
        upstream.fetch(tmp_path / "upstream", pin=pin, log=quiet)
    assert not (tmp_path / "upstream").exists()


@needs_git
def test_unreachable_git_host_is_a_clear_error(tmp_path):
    pin = upstream.Pin(git_url=(tmp_path / "no-such-repo").as_uri())
    with pytest.raises(CourseError, match=r"git clone .* failed .*use --from-archive PATH"):
        upstream.fetch(tmp_path / "upstream", pin=pin, log=quiet)
