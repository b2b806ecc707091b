"""``python -m course cite``: check every citation of the real vLLM source.

The one citation syntax of the course is a single inline code span holding a
path relative to ``upstream/``, a colon, a line or a line range, one space, and
a symbol::

    `vllm/v1/core/block_pool.py:333 BlockPool.get_new_blocks`
    `vllm/v1/core/sched/scheduler.py:390-392 Scheduler.schedule`

A citation is good when the file exists in ``upstream/``, the cited lines exist,
and the last dotted part of the symbol (``get_new_blocks``) appears as a whole
word on the cited lines widened by ``SLACK`` lines on each side. A bare one-word
symbol (``logger``, ``running``, ``Python``) must also be *defined* there (``class``,
``def``, an upper-case constant, a markdown heading, a config key) or be rare in the
file (at most ``RARE_WORD_MAX`` times): otherwise a stale line number would still find
it nearby, so qualify it (``Scheduler.running``) or cite a more specific identifier. A code span with
a path and a line but no symbol is broken ("no symbol"). Citations inside fenced
code blocks are not checked, and neither is a span that starts with a backtick
(write ``` `` `path:1 Name` `` ``` to show the syntax itself).

Python files of ``mini_vllm/``, ``benchmarks/`` and the phases cite the same way in
their docstrings and comments, after the word ``upstream:``::

    upstream: vllm/v1/core/block_pool.py:333 BlockPool.get_new_blocks

Broken citations print as ``doc.md:LINE: path:line Symbol: why``; the command
exits 1 when there is any, and ends with a table of citations per deep-dive.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from course.errors import CourseError

SLACK = 3
EXTENSIONS = "py|cu|cuh|cpp|h|hpp|c|md|txt|toml|yaml|yml|json|sh|rs"
CITATION_RE = re.compile(rf"^([\w./-]+\.(?:{EXTENSIONS})):(\d+)(?:-(\d+))?\s+(\S+)$")
NO_SYMBOL_RE = re.compile(rf"^([\w./-]+\.(?:{EXTENSIONS})):(\d+)(?:-(\d+))?$")
LOOSE_RE = re.compile(rf"^([\w./-]+\.(?:{EXTENSIONS})):(\d+)(?:-(\d+))?\s+\S.*$")
CODE_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})")
IDENT_RE = re.compile(r"^[A-Za-z_]\w*$")
# A bare one-word symbol (``logger``, ``backend``, ``Python``, ``AI``): so common that
# it appears near almost any line, so a stale line number would go unnoticed.
PLAIN_WORD_RE = re.compile(r"^(?:[a-z]+|[A-Z][a-z]+|[A-Z]+)$")
RARE_WORD_MAX = 2  # a plain word found at most this often in the whole file is specific enough

# Folders never scanned for markdown: the cited tree itself, environments, outputs.
SKIP_DIRS = {"upstream", ".venv", "venv", "build", "book", "node_modules", "__pycache__"}
DEEP_DIVE = "01-deep-dive.md"


@dataclass(frozen=True)
class Citation:
    doc: pathlib.Path  # the markdown file
    line: int  # line in the markdown file (1-based)
    text: str  # the code span's content, as written
    path: str  # cited path, relative to upstream/
    start: int
    end: int
    symbol: str | None
    problem: str | None = None  # set when the span is malformed


def iter_markdown(root: pathlib.Path) -> Iterator[pathlib.Path]:
    """Every ``*.md`` under ``root``, skipping SKIP_DIRS and hidden folders, sorted."""
    found: list[pathlib.Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        found.extend(pathlib.Path(dirpath, f) for f in filenames if f.endswith(".md"))
    yield from sorted(found)


def fenced(lines: Iterable[str]) -> Iterator[bool]:
    """For each line, whether it belongs to a fenced code block (its fences included)."""
    fence: str | None = None
    for line in lines:
        match = FENCE_RE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
            yield fence is not None
            continue
        if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
            if not line.strip()[len(match.group(1)) :].strip():
                fence = None
        yield True


def span_content(span: re.Match[str]) -> str:
    """The content of a CODE_SPAN_RE match, one padding space dropped as CommonMark does."""
    content = span.group(2)
    if len(span.group(1)) > 1 and content.startswith(" ") and content.endswith(" "):
        content = content[1:-1]
    return content


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """(line number, content) of every single-line inline code span outside fences."""
    lines = text.splitlines()
    for number, (line, in_fence) in enumerate(zip(lines, fenced(lines), strict=True), start=1):
        if not in_fence:
            for span in CODE_SPAN_RE.finditer(line):
                yield number, span_content(span)


def find_citations(doc: pathlib.Path) -> Iterator[Citation]:
    text = doc.read_text(encoding="utf-8", errors="replace")
    for number, content in code_spans(text):
        content = content.strip()
        match = CITATION_RE.match(content)
        if match:
            path, start, end, symbol = match.groups()
            problem = None
        else:
            match = NO_SYMBOL_RE.match(content)
            problem = "no symbol (write `path:line Symbol`)"
            if not match:
                match = LOOSE_RE.match(content)
                problem = "more than one word after the line (write `path:line Symbol`)"
            if not match:
                continue
            (path, start, end), symbol = match.groups()[:3], None
        start_i = int(start)
        end_i = int(end) if end else start_i
        yield Citation(doc, number, content, path, start_i, end_i, symbol, problem)


PY_CITATION_RE = re.compile(
    rf"""(?<![\w.])upstream:\s+([\w./-]+\.(?:{EXTENSIONS})):(\d+)(?:-(\d+))?(?:\s+([A-Za-z_][^\s,;)"'`]*))?"""
)
PY_DIRS = ("mini_vllm", "benchmarks")  # plus every phase-*/ folder; course/ holds examples


def iter_python(root: pathlib.Path) -> Iterator[pathlib.Path]:
    """The ``.py`` files whose ``upstream: path:line Symbol`` references are checked."""
    tops = [root / d for d in PY_DIRS] + sorted(root.glob("phase-*"))
    found: list[pathlib.Path] = []
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
            found.extend(pathlib.Path(dirpath, f) for f in filenames if f.endswith(".py"))
    yield from sorted(found)


def find_py_citations(path: pathlib.Path) -> Iterator[Citation]:
    """``upstream: vllm/x.py:12 Name`` references in a Python file's docstrings and comments."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        for match in PY_CITATION_RE.finditer(line):
            rel, start, end, symbol = match.groups()
            symbol = symbol.rstrip(".:") if symbol else None
            content = match.group(0).split(None, 1)[1]
            problem = None if symbol else "no symbol (write `upstream: path:line Symbol`)"
            start_i = int(start)
            yield Citation(path, number, content, rel, start_i, int(end) if end else start_i,
                           symbol, problem)


class Upstream:
    """Reads cited files from ``upstream/`` once each."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._lines: dict[str, list[str] | None] = {}

    def lines(self, rel: str) -> list[str] | None:
        if rel not in self._lines:
            path = (self.root / rel).resolve()
            inside = path.is_relative_to(self.root.resolve())
            self._lines[rel] = (
                path.read_text(encoding="utf-8", errors="replace").splitlines()
                if inside and path.is_file()
                else None
            )
        return self._lines[rel]


def symbol_name(symbol: str) -> str:
    """The part that must appear in the source: the last dotted part, without ``()``."""
    name = symbol.rsplit(".", 1)[-1]
    return name[:-2] if name.endswith("()") else name


def verify(citation: Citation, upstream: Upstream) -> str | None:
    """None when the citation is good, else why it is broken."""
    if citation.problem is not None or citation.symbol is None:
        return citation.problem or "no symbol (write `path:line Symbol`)"
    lines = upstream.lines(citation.path)
    if lines is None:
        if citation.path.startswith("upstream/"):
            return "path must be relative to upstream/ (drop the leading upstream/)"
        return "no such file in upstream/"
    if citation.start < 1 or citation.end < citation.start:
        return f"bad line range {citation.start}-{citation.end}"
    if citation.end > len(lines):
        return f"line {citation.end} is past the end of the file ({len(lines)} lines)"
    name = symbol_name(citation.symbol)
    if not IDENT_RE.match(name):
        return f"symbol part {name!r} is not an identifier"
    low = max(1, citation.start - SLACK)
    high = min(len(lines), citation.end + SLACK)
    window = "\n".join(lines[low - 1 : high])
    if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", window):
        return f"{name} does not appear on lines {low}-{high}"
    if (
        PLAIN_WORD_RE.match(citation.symbol)
        and not _defines(window, name, citation.path)
        and _occurrences(lines, name) > RARE_WORD_MAX
    ):
        return (
            f"{citation.symbol!r} is a plain word found {_occurrences(lines, name)} times in the "
            f"file, so drift would go unnoticed: qualify it (Class.{name}), cite the line that "
            f"defines it (class, def, CONSTANT =, a heading, a key) or a rarer identifier"
        )
    return None


def _occurrences(lines: list[str], name: str) -> int:
    pattern = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")
    return sum(len(pattern.findall(line)) for line in lines)


def _defines(window: str, name: str, path: str) -> bool:
    """Whether the lines define ``name``: a class, a function, or an upper-case constant
    (in a markdown file: a heading that holds the word; in a config file: a key)."""
    word = re.escape(name)
    if path.endswith(".md"):
        return bool(re.search(rf"^#+\s.*(?<!\w){word}(?!\w)", window, re.MULTILINE))
    if path.endswith((".toml", ".yaml", ".yml", ".json")):  # a key
        return bool(re.search(rf"^\s*\"?{word}\"?\s*[:=]", window, re.MULTILINE))
    if re.search(rf"^\s*(?:async\s+def|def|class)\s+{word}\b", window, re.MULTILINE):
        return True
    return name.isupper() and bool(re.search(rf"^\s*{word}\s*[:=]", window, re.MULTILINE))


@dataclass
class Report:
    checked: int
    broken: list[tuple[Citation, str]]
    per_deep_dive: dict[pathlib.Path, tuple[int, int]]  # doc -> (citations, broken)
    files: int


def check(
    root: pathlib.Path,
    upstream_dir: pathlib.Path,
    files: Iterable[pathlib.Path] | None = None,
) -> Report:
    root = root.resolve()
    if not upstream_dir.is_dir():
        raise CourseError(
            f"upstream/ not found at {upstream_dir}: run `python -m course upstream` first"
        )
    docs = sorted(files) if files is not None else [*iter_markdown(root), *iter_python(root)]
    for doc in docs:
        if not doc.is_file():
            raise CourseError(f"no such markdown file: {doc}")
    upstream = Upstream(upstream_dir)
    checked = 0
    broken: list[tuple[Citation, str]] = []
    per_deep_dive: dict[pathlib.Path, tuple[int, int]] = {}
    for doc in docs:
        count = bad = 0
        found = find_py_citations(doc) if doc.suffix == ".py" else find_citations(doc)
        for citation in found:
            count += 1
            why = verify(citation, upstream)
            if why is not None:
                bad += 1
                broken.append((citation, why))
        checked += count
        if doc.name == DEEP_DIVE:
            per_deep_dive[doc] = (count, bad)
    return Report(checked, broken, per_deep_dive, len(docs))


def _rel(path: pathlib.Path, root: pathlib.Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def format_report(report: Report, root: pathlib.Path) -> list[str]:
    out = [f"{_rel(c.doc, root)}:{c.line}: {c.text}: {why}" for c, why in report.broken]
    if report.per_deep_dive:
        width = max(len(_rel(d, root)) for d in report.per_deep_dive)
        out.append("")
        out.append(f"{'deep-dive':<{width}}  citations  broken")
        for doc, (count, bad) in sorted(report.per_deep_dive.items()):
            out.append(f"{_rel(doc, root):<{width}}  {count:>9}  {bad:>6}")
    out.append("")
    out.append(
        f"{report.checked} citations in {report.files} "
        f"{'file' if report.files == 1 else 'files'}; {len(report.broken)} broken"
    )
    return out


def main(root: pathlib.Path, upstream_dir: pathlib.Path | None, files: list[str]) -> int:
    upstream_dir = upstream_dir if upstream_dir is not None else root / "upstream"
    paths = [pathlib.Path(f) for f in files] if files else None
    report = check(root, upstream_dir, paths)
    for line in format_report(report, root):
        print(line)
    return 1 if report.broken else 0
