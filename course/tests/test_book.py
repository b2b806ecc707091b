"""The book: assembly, the mdBook build and the link checker, on a fixture repository."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from course import book
from course.errors import CourseError

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
    "phase-01-architecture/01-deep-dive.md": "# Phase 01 — Deep dive\n",
    "upstream/README.md": "# not to be published\n",
    "upstream/vllm/x.py": "x = 1\n",
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
