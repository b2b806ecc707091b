"""The book: assembly, the mdBook build and the link checker, on a fixture repository."""

from __future__ import annotations

import html.parser
import pathlib
import shutil

import pytest

from course import book, cite
from course.errors import CourseError
from course.upstream import PIN

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAV = "[Course home](README.md)"

GOOD = {
    "README.md": """
        # vLLM Mastery

        Start with [phase 00](phase-00-foundations/00-guide.md), look up
        [the KV cache](GLOSSARY.md#kv-cache), read [the engine](mini_vllm/README.md).
        """,
    "SETUP.md": f"{NAV}\n\n# Setup\n\n```bash\npip install -e .\n```\n",
    "GLOSSARY.md": "# Glossary\n\n## KV cache\n\nKeys and values.\n",
    "mini_vllm/README.md": "# mini_vllm\n\nSee [the scheduler](scheduler.py).\n",
    "mini_vllm/scheduler.py": "class Scheduler:\n    pass\n",
    "phase-00-foundations/00-guide.md": """
        [Course home](../README.md) · [Next page →](labs/README.md)

        # Phase 00 — Foundations

        PagedAttention keeps the [KV cache](../GLOSSARY.md#kv-cache) in blocks.

        ```text
        +----+----+
        | b0 | b1 |
        +----+----+
        ```
        """,
    "phase-00-foundations/labs/README.md": """
        # Phase 00 labs

        Open [the starter](lab-01-kv/starter.py) of [lab 01](lab-01-kv/README.md).
        """,
    "phase-00-foundations/labs/lab-01-kv/README.md": """
        # Lab 00-01 — KV cache [CPU-OK]

        Back to [the labs](../README.md#phase-00-labs); picture: ![plot](plot.svg)
        """,
    "phase-00-foundations/labs/lab-01-kv/starter.py": "def f():\n    raise NotImplementedError\n",
    "phase-00-foundations/labs/lab-01-kv/plot.svg": "<svg xmlns='http://www.w3.org/2000/svg'/>\n",
    "phase-00-foundations/CHEATSHEET.md": "# Phase 00 cheatsheet\n",
    "phase-01-architecture/01-deep-dive.md": """
        # Phase 01 — Deep dive

        The pool starts at `vllm/x.py:1-2 Pool` and `vllm/x.py:2 Pool.take` hands out blocks.
        """,
    "upstream/README.md": "# not to be published\n",
    "upstream/vllm/x.py": "class Pool:\n    def take(self) -> list[int]:  # a < b & c\n",
    ".venv/lib/site.py": "x = 1\n",
    "mini_vllm/__pycache__/scheduler.cpython-311.pyc": "junk\n",
}


@pytest.fixture
def repo(tree, tmp_path):
    root = tree(GOOD, root=tmp_path / "repo")
    shutil.copyfile(ROOT / "book.toml", root / "book.toml")
    return root


def test_plan_orders_pages_and_takes_titles_from_first_headings(repo):
    plan = book.make_plan(repo)
    assert plan.pages() == [
        "README.md",
        "SETUP.md",
        "mini_vllm/README.md",
        "phase-00-foundations/00-guide.md",
        "phase-00-foundations/labs/README.md",
        "phase-00-foundations/labs/lab-01-kv/README.md",
        "phase-00-foundations/CHEATSHEET.md",
        "phase-01-architecture/01-deep-dive.md",
        "GLOSSARY.md",
    ]
    phases = plan.part("The course")
    assert [p.title for p in phases] == ["Phase 00 — Foundations", "Phase 01 — architecture"]
    assert phases[1].path is None  # no guide yet: a draft chapter holds its pages
    summary = book.summary_text(plan)
    assert (
        "    - [Lab 00-01 — KV cache \\[CPU-OK\\]](phase-00-foundations/labs/lab-01-kv/README.md)"
        in summary
    )


def test_good_fixture_builds_with_no_problems_and_publishes_nothing_private(repo, capsys):
    assert book.run(repo) == 0, capsys.readouterr().out
    out = repo / "build" / "book"
    assert (out / "index.html").is_file()
    assert (out / "phase-00-foundations/labs/lab-01-kv/starter.py").is_file()
    assert (out / "mini_vllm/scheduler.py").is_file()
    published = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert not [p for p in published if p.startswith(("upstream", ".venv")) or "__pycache__" in p]
    assert capsys.readouterr().out.splitlines()[-1] == "book OK"


def test_built_page_links_citations_to_github_with_the_cited_lines_as_title(repo, capsys):
    page = "phase-01-architecture/01-deep-dive.md"
    before = (repo / page).read_text()
    assert book.run(repo) == 0, capsys.readouterr().out
    assert "linked 2 upstream citations to GitHub at 0decac0, 2 showing the cited lines" in (
        capsys.readouterr().out.splitlines()
    )
    assert (repo / page).read_text() == before  # only the copy in build/book-src changes
    built = (repo / "build/book" / page).with_suffix(".html").read_text()
    assert (
        f'<a href="{BLOB}/vllm/x.py#L2" title="def take(self) -&gt; list[int]:  # a &lt; b &amp; c">'
        "<code>vllm/x.py:2 Pool.take</code></a>"
    ) in built
    anchors = AnchorParser()
    anchors.feed(built)
    assert (
        f"{BLOB}/vllm/x.py#L1-L2",
        "class Pool:\n    def take(self) -> list[int]:  # a < b & c",
        "vllm/x.py:1-2 Pool",
    ) in anchors.found
    index = next((repo / "build/book").glob("searchindex*.js")).read_text()
    assert "vllm/x.py:2 Pool.take" in index  # search still finds the citation's text


# ---- citations become links to GitHub at the pin ------------------------------------


class AnchorParser(html.parser.HTMLParser):
    """(href, title, text) of every ``<a>`` with a title, as a browser reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str, str]] = []
        self.open: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "a" and values.get("title") is not None:
            self.open = [values.get("href") or "", values["title"], ""]

    def handle_data(self, data):
        if self.open is not None:
            self.open[2] += data

    def handle_endtag(self, tag):
        if tag == "a" and self.open is not None:
            self.found.append((self.open[0], self.open[1], self.open[2]))
            self.open = None


BLOB = f"https://github.com/vllm-project/vllm/blob/{PIN.commit}"
LINE = "`vllm/v1/core/block_pool.py:333 BlockPool.get_new_blocks`"
RANGE = "`vllm/v1/core/sched/scheduler.py:390-392 Scheduler.schedule`"


def test_citation_becomes_a_github_link_at_the_pinned_commit_for_a_line_and_a_range():
    text, links, previews = book.link_citations(f"See {LINE} and {RANGE}.\n")
    assert text == (
        f"See [{LINE}]({BLOB}/vllm/v1/core/block_pool.py#L333) and "
        f"[{RANGE}]({BLOB}/vllm/v1/core/sched/scheduler.py#L390-L392).\n"
    )
    assert (links, previews) == (2, 0)
    assert PIN.commit == "0decac0d96c42b49572498019f0a0e3600f50398"


def test_citation_in_a_fence_a_heading_or_a_link_is_left_alone():
    text = (
        f"```text\n{LINE}\n```\n"
        f"## Where {LINE} lives\n"
        f"[{LINE}](https://example.com/already) and [see {RANGE} here][ref]\n"
        f'<a href="https://example.com">{LINE}</a>\n'
        f"``{LINE.strip('`')}`` is shown, `not/a/citation.py` is not; [aside {LINE}] [x](y.md)\n"
    )
    out, links, _ = book.link_citations(text)
    assert out.splitlines()[:6] == text.splitlines()[:6]
    assert out.splitlines()[6] == (
        f"[``{LINE.strip('`')}``]({BLOB}/vllm/v1/core/block_pool.py#L333) is shown, "
        f"`not/a/citation.py` is not; [aside [{LINE}]({BLOB}/vllm/v1/core/block_pool.py#L333)] "
        "[x](y.md)"
    )
    assert links == 2
    # cite and book agree on what is a citation outside fences
    assert len([c for c in cite.code_spans(text) if cite.CITATION_RE.match(c[1])]) == 6


def test_title_holds_the_first_cited_lines_html_escaped(tree, tmp_path):
    body = ["    def f(a, b):", '        """Say "a|b" & `x` <y>."""']
    body += [f"        line{i} = {i}" for i in range(3, 12)]
    upstream = tree({"vllm/m.py": "\n".join(body) + "\n"}, root=tmp_path / "upstream")
    text, links, previews = book.link_citations(
        "* `vllm/m.py:1-11 f` | `vllm/m.py:2 f` | `vllm/m.py:99 f`\n", cite.Upstream(upstream)
    )
    assert (links, previews) == (3, 2)
    first = (
        f'<a href="{BLOB}/vllm/m.py#L1-L11" title="def f(a, b):&#10;'
        "    &quot;&quot;&quot;Say &quot;a&#124;b&quot; &amp; &#96;x&#96; &lt;y&gt;.&quot;&quot;&quot;"
        "&#10;    line3 = 3&#10;    line4 = 4&#10;    line5 = 5&#10;    line6 = 6&#10;"
        '    line7 = 7&#10;    line8 = 8&#10;…">`vllm/m.py:1-11 f`</a>'
    )
    second = (
        f'<a href="{BLOB}/vllm/m.py#L2" title="&quot;&quot;&quot;Say &quot;a&#124;b&quot; '
        '&amp; &#96;x&#96; &lt;y&gt;.&quot;&quot;&quot;">`vllm/m.py:2 f`</a>'
    )
    # a line past the end of the file (cite reports it) still links, without a title
    third = f"[`vllm/m.py:99 f`]({BLOB}/vllm/m.py#L99)"
    assert text == f"* {first} | {second} | {third}\n"


def test_broken_link_anchor_and_upstream_link_are_reported(repo, capsys):
    guide = repo / "phase-00-foundations/00-guide.md"
    guide.write_text(
        guide.read_text()
        + "\nSee [missing](02-mini-build.md), [a term](../GLOSSARY.md#no-such-term) and "
        "[the source](../upstream/vllm/x.py).\n"
    )
    assert book.run(repo) == 1
    lines = capsys.readouterr().out.splitlines()
    page = "phase-00-foundations/00-guide.html"
    assert (
        f"{page}: 02-mini-build.html: no such page in the site (is the .md file part of the book?)"
        in lines
    )
    assert (
        f"{page}: ../GLOSSARY.html#no-such-term: no anchor #no-such-term in GLOSSARY.html" in lines
    )
    assert (
        f"{page}: ../upstream/vllm/x.py: points into upstream/, which is not published (cite it instead)"
        in lines
    )
    assert lines[-1] == "3 problems"


def test_unlabelled_and_mermaid_fences_are_reported(repo, capsys):
    (repo / "SETUP.md").write_text(
        f"{NAV}\n\n# Setup\n\n```\nplain\n```\n\n```mermaid\ngraph\n```\n"
    )
    assert book.run(repo) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "SETUP.md:5: code fence without a language (```text)" in lines
    assert any(ln.startswith("SETUP.md:9: mermaid is not rendered") for ln in lines)


def test_no_build_checks_an_existing_site_and_refuses_a_missing_one(repo, tmp_path):
    with pytest.raises(CourseError, match="run `python -m course book` first"):
        book.run(repo, do_build=False)
    assert book.run(repo) == 0
    assert book.run(repo, do_build=False) == 0


def test_out_folder_that_is_not_a_site_is_not_wiped(repo, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("do not delete\n")
    with pytest.raises(CourseError, match="mdBook would delete it"):
        book.run(repo, out=precious)
    assert (precious / "thesis.txt").is_file()


# ---- the link checker alone, on hand-written HTML ----------------------------------


def write_site(tree, tmp_path, pages: dict[str, str]) -> pathlib.Path:
    return tree(pages, root=tmp_path / "site")


def test_link_checker_catches_broken_links_and_anchors(tree, tmp_path):
    site = write_site(
        tree,
        tmp_path,
        {
            "index.html": '<h1 id="top">Home</h1><a href="a/page.html#sec">ok</a>'
            '<a href="#top">self</a><a href="https://example.com/x">external</a>',
            "a/page.html": '<h2 id="sec">S</h2><a href="../index.html#nope">bad anchor</a>'
            '<a href="gone.html">gone</a><img src="../img/p.svg">'
            '<a href="../../outside.html">out</a><a href="sub/">folder</a>'
            '<a href="#sec">self ok</a><a href="#missing">self bad</a>',
            "img/p.svg": "<svg/>",
            "a/sub/x.txt": "x",
        },
    )
    assert book.check_site(site) == [
        "a/page.html: ../index.html#nope: no anchor #nope in index.html",
        "a/page.html: gone.html: no such page in the site (is the .md file part of the book?)",
        "a/page.html: ../../outside.html: points outside the site (only the book's pages are published)",
        "a/page.html: sub/: a folder without index.html (link the page itself, e.g. README.md)",
        "a/page.html: #missing: no anchor #missing in a/page.html",
    ]


def test_link_checker_passes_a_good_site_and_honours_base_href(tree, tmp_path):
    site = write_site(
        tree,
        tmp_path,
        {
            "index.html": '<a href="a/page.html#sec">to a</a><a href="a/">a folder</a>',
            "a/index.html": '<a href="page.html">page</a>',
            "a/page.html": '<p id="sec">S</p><a href="../index.html">home</a>',
            "404.html": '<base href="/"><a href="a/page.html#sec">from 404</a>',
        },
    )
    assert book.check_site(site) == []


def test_the_search_index_size_advice_is_a_problem_only_above_the_courses_budget():
    from course.book import SEARCH_INDEX_BUDGET, _is_problem

    assert not _is_problem("2026 [WARN] (mdbook::search): search index is very large (11186341 bytes)")
    assert _is_problem(f"[WARN] search index is very large ({SEARCH_INDEX_BUDGET + 1} bytes)")
    assert _is_problem("[WARN] (mdbook): something else")
    assert _is_problem("[ERROR] search index is very large (10 bytes)")
    assert not _is_problem("[INFO] search index is very large (10 bytes)")
