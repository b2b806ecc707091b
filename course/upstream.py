"""``python -m course upstream``: put the real vLLM source, at the pin, in ``upstream/``.

Two sources, one result:

* ``git clone --depth 1 --branch v0.22.1`` from GitHub, then the checked-out
  commit is compared with the pinned SHA;
* ``--from-archive PATH``: the vllm 0.22.1 source archive (the PyPI sdist, whose
  files match the tag line for line), verified by its sha256 and unpacked with
  its top folder ``vllm-0.22.1/`` stripped. This is the way on machines that
  cannot reach git hosting.

Either way the command leaves a small marker file, ``upstream/.vllm-mastery-pin``,
recording version, source and checksum, so that running it again is a no-op and a
tree at another version is refused with a clear message instead of being mixed
with the pinned one. A tree that was unpacked by hand (no marker) is accepted when
its ``PKG-INFO`` or ``vllm/_version.py`` says it is the pinned version.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from course.errors import CourseError

MARKER_NAME = ".vllm-mastery-pin"


@dataclass(frozen=True)
class Pin:
    """What ``upstream/`` must hold. Tests build their own with fixture values."""

    version: str = "0.22.1"
    tag: str = "v0.22.1"
    commit: str = "0decac0d96c42b49572498019f0a0e3600f50398"
    sha256: str = "cd34902729f3767e3dfbb391956b2986bc638a54be9893e78bda9cc55669f15c"
    git_url: str = "https://github.com/vllm-project/vllm.git"


PIN = Pin()


# ---------------------------------------------------------------------------
# What is in a folder already
# ---------------------------------------------------------------------------


def read_marker(dest: pathlib.Path) -> dict[str, str] | None:
    """The ``key: value`` pairs of the marker file, or None when there is none."""
    path = dest / MARKER_NAME
    if not path.is_file():
        return None
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def write_marker(dest: pathlib.Path, pin: Pin, source: str) -> None:
    lines = [
        "# written by `python -m course upstream`; do not edit",
        f"version: {pin.version}",
        f"tag: {pin.tag}",
        f"commit: {pin.commit}",
        f"sha256: {pin.sha256}",
        f"source: {source}",
    ]
    (dest / MARKER_NAME).write_text("\n".join(lines) + "\n", encoding="utf-8")
    exclude = dest / ".git" / "info" / "exclude"
    if exclude.parent.is_dir():
        text = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
        if MARKER_NAME not in text.split():
            exclude.write_text(text + f"\n{MARKER_NAME}\n", encoding="utf-8")


def _git_head(dest: pathlib.Path) -> str | None:
    if not shutil.which("git"):
        return None
    proc = subprocess.run(
        ["git", "-C", str(dest), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def source_version(dest: pathlib.Path) -> str | None:
    """The vLLM version a source tree declares (PKG-INFO, then vllm/_version.py)."""
    pkg_info = dest / "PKG-INFO"
    if pkg_info.is_file():
        for line in pkg_info.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    version_py = dest / "vllm" / "_version.py"
    if version_py.is_file():
        text = version_py.read_text(encoding="utf-8", errors="replace")
        match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        if match:
            return match.group(1)
    return None


def check_existing(dest: pathlib.Path, pin: Pin) -> str:
    """Accept a tree that already holds the pin (writing the marker if missing).

    Returns a one-line description; raises CourseError for anything else.
    """
    label = dest.name + "/"
    marker = read_marker(dest)
    if marker is not None:
        version = marker.get("version", "?")
        if version != pin.version:
            raise CourseError(
                f"{label} holds vLLM {version} ({marker.get('source', 'unknown source')}), "
                f"not the pinned {pin.version}: move it away and run this command again"
            )
        return f"{label} already holds vLLM {pin.version} ({marker.get('source', '?')})"

    if (dest / ".git").exists():
        head = _git_head(dest)
        if head != pin.commit:
            raise CourseError(
                f"{label} is a git checkout at {head or 'an unreadable commit'}, not "
                f"{pin.tag} ({pin.commit}): move it away and run this command again"
            )
        write_marker(dest, pin, "git (found in place)")
        return f"{label} already holds vLLM {pin.version} (git checkout at {pin.commit[:12]})"

    version = source_version(dest)
    if version is None:
        raise CourseError(
            f"{label} exists but is not a vLLM source tree (no marker, PKG-INFO, "
            "vllm/_version.py or .git): remove it and run this command again"
        )
    if version != pin.version:
        raise CourseError(
            f"{label} holds vLLM {version}, not the pinned {pin.version}: "
            "move it away and run this command again"
        )
    write_marker(dest, pin, "found in place, version read from the tree")
    return f"{label} already holds vLLM {pin.version} (found in place; marker written)"


# ---------------------------------------------------------------------------
# Fetching
# ---------------------------------------------------------------------------


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _safe_members(tar: tarfile.TarFile, archive: pathlib.Path) -> tuple[str, list[tarfile.TarInfo]]:
    members = tar.getmembers()
    tops = {m.name.split("/", 1)[0] for m in members if m.name not in ("", ".")}
    if len(tops) != 1:
        raise CourseError(
            f"{archive} does not hold one top folder (found {len(tops)}): "
            "expected a vllm-X.Y.Z/ source archive"
        )
    top = tops.pop()
    for m in members:
        name = pathlib.PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts:
            raise CourseError(f"{archive} holds an unsafe path {m.name!r}: refusing to unpack")
    return top, members


def extract_archive(archive: pathlib.Path, dest: pathlib.Path, pin: Pin) -> None:
    """Unpack ``archive`` (top folder stripped) into ``dest``, which must not exist."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=".upstream-", dir=dest.parent))
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                top, members = _safe_members(tar, archive)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(work, members=members, filter="data")
                else:  # Python < 3.12 without the backported filters
                    tar.extractall(work, members=members)  # paths checked above
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise CourseError(f"cannot unpack {archive}: {exc}") from None
        tree = work / top
        if not tree.is_dir():
            raise CourseError(f"{archive}: top entry {top!r} is not a folder")
        version = source_version(tree)
        if version is not None and version != pin.version:
            raise CourseError(f"{archive} holds vLLM {version}, not the pinned {pin.version}")
        tree.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def clone(dest: pathlib.Path, pin: Pin, timeout: float = 1800) -> None:
    """Shallow-clone the pinned tag into ``dest`` and check the commit."""
    if not shutil.which("git"):
        raise CourseError("git is not installed: install it, or use --from-archive PATH")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=".upstream-", dir=dest.parent))
    target = work / "vllm"
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    try:
        try:
            proc = subprocess.run(
                [
                    "git",
                    "clone",
                    "--quiet",
                    "--depth",
                    "1",
                    "--branch",
                    pin.tag,
                    pin.git_url,
                    str(target),
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise CourseError(
                f"git clone of {pin.git_url} timed out after {timeout:.0f} s: "
                "offline? use --from-archive PATH (the vllm source archive)"
            ) from None
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise CourseError(
                f"git clone of {pin.git_url} at {pin.tag} failed ({why}): "
                "offline? use --from-archive PATH (the vllm source archive)"
            )
        head = _git_head(target)
        if head != pin.commit:
            raise CourseError(
                f"{pin.tag} of {pin.git_url} is commit {head}, not the pinned {pin.commit}: "
                "the tag moved; refusing to use it"
            )
        target.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch(
    dest: str | os.PathLike[str],
    archive: str | os.PathLike[str] | None = None,
    pin: Pin = PIN,
    log: Callable[[str], None] = print,
) -> str:
    """Make ``dest`` hold vLLM at ``pin``; idempotent. Returns a one-line summary."""
    dest = pathlib.Path(dest).absolute()
    archive_path = pathlib.Path(archive).resolve() if archive is not None else None
    if archive_path is not None and not archive_path.is_file():
        raise CourseError(f"archive not found: {archive} (expected vllm-{pin.version}.tar.gz)")

    if dest.exists() and not dest.is_dir():
        raise CourseError(f"{dest} exists and is not a folder: remove it and run again")
    if dest.is_dir() and any(dest.iterdir()):
        return check_existing(dest, pin)
    if dest.is_dir():
        dest.rmdir()

    if archive_path is not None:
        log(f"verifying sha256 of {archive_path} ...")
        got = sha256_of(archive_path)
        if got != pin.sha256:
            raise CourseError(
                f"checksum mismatch for {archive}: sha256 {got}, expected {pin.sha256} "
                f"(not the vllm {pin.version} source archive)"
            )
        log(f"unpacking into {dest} ...")
        extract_archive(archive_path, dest, pin)
        write_marker(dest, pin, f"archive {archive_path.name} (sha256 verified)")
        return (
            f"{dest.name}/ now holds vLLM {pin.version} (from {archive_path.name}, sha256 verified)"
        )

    log(f"cloning {pin.git_url} at {pin.tag} into {dest} ...")
    clone(dest, pin)
    write_marker(dest, pin, f"git clone {pin.git_url} {pin.tag}")
    return f"{dest.name}/ now holds vLLM {pin.version} (git {pin.tag}, commit {pin.commit[:12]} verified)"
