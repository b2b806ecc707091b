"""The website in a real browser: headless Chromium against the built site.

Builds the repository's book into the test's tmp dir, serves it on 127.0.0.1,
and checks with Chromium (no Python browser driver: ``--dump-dom`` after a
virtual-time budget runs the page's JavaScript) that the home page renders, the
sidebar lists every phase that has pages, and mdBook's search, driven through its
``?search=`` URL parameter, finds "PagedAttention". Leaves a screenshot PNG.
"""

from __future__ import annotations

import contextlib
import functools
import html
import html.parser
import http.server
import pathlib
import re
import shutil
import subprocess
import threading

import pytest

from course import book

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
    "--window-size=1280,900",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@contextlib.contextmanager
def serve(directory: pathlib.Path):
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chromium(profile: pathlib.Path, *args: str) -> str:
    proc = subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def dump_dom(profile: pathlib.Path, url: str) -> str:
    return chromium(profile, "--virtual-time-budget=5000", "--dump-dom", url)


class _Anchors(html.parser.HTMLParser):
    """(href, text) of the links inside one element, found by tag name."""

    def __init__(self, container: str):
        super().__init__(convert_charrefs=True)
        self.container = container
        self.depth = 0
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == self.container:
            self.depth += 1
        if self.depth and tag == "a":
            self._href, self._text = dict(attrs).get("href") or "", []

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None
        if tag == self.container and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)


def links_in(dom: str, container: str) -> list[tuple[str, str]]:
    parser = _Anchors(container)
    parser.feed(dom)
    return parser.links


@pytest.fixture(scope="module")
def site(real_book) -> tuple[pathlib.Path, book.Plan]:
    out, plan, problems = real_book  # the session's one build of the real book (conftest.py)
    assert problems == [], problems
    return out, plan


def test_home_page_renders_with_a_sidebar_listing_every_phase(site, tmp_path):
    out, plan = site
    phases = plan.part("The course")
    assert phases, "the course has no phase with pages"
    shot = tmp_path / "home.png"
    with serve(out) as base:  # one launch: Chromium prints the DOM and writes the screenshot
        dom = chromium(tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom",
                       f"--screenshot={shot}", f"{base}/index.html")
    assert "<title>" in dom and "vLLM Mastery" in dom
    assert 'id="mdbook-content"' in dom
    sidebar = links_in(dom, "mdbook-sidebar-scrollbox")
    # Strip a section number ("4.1. ") in case the sidebar shows them.
    titles = {re.sub(r"^\d+(\.\d+)*\.\s+", "", html.unescape(text)) for _, text in sidebar}
    hrefs = {href for href, _ in sidebar}
    for phase in phases:
        assert phase.title in titles, f"sidebar lacks {phase.title!r}"
        if phase.path:
            assert phase.path.removesuffix(".md") + ".html" in hrefs
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    print(f"screenshot: {shot}")


def test_search_for_pagedattention_returns_a_result(site, tmp_path):
    out, _ = site
    with serve(out) as base:
        dom = dump_dom(tmp_path / "profile", f"{base}/index.html?search=PagedAttention")
    results = links_in(dom, "ul")
    hits = [href for href, _ in results if "highlight=PagedAttention" in href]
    assert hits, "search for PagedAttention found nothing"
