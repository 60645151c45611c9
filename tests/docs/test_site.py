"""The documentation site builds with `mkdocs build --strict` (a broken link, anchor or page left out of the nav
fails it) and works in headless Chromium: every page renders with its navigation and no script error, typing
into the search box finds pages, and a screenshot of the home page is kept (the path is printed; pytest keeps
the last three runs' temporary folders)."""

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.support.browser import Browser, chromium

REPO = Path(__file__).resolve().parents[2]


def nav_pages() -> list[tuple[str, str]]:
    """`(title, page)` of every page in mkdocs.yml's nav."""
    def walk(items):
        for item in items:
            for title, value in item.items():
                yield from walk(value) if isinstance(value, list) else [(title, value)]

    return list(walk(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-4000:]
    return out / "site"


@pytest.fixture(scope="module")
def url(site):
    handler = functools.partial(Quiet, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    chromium()  # skip, or fail under CI, before anything starts
    with Browser(tmp_path_factory.mktemp("chromium")) as browser:
        yield browser


def test_every_page_of_the_nav_is_built(site):
    pages = nav_pages()
    assert len(pages) >= 20
    missing = [page for _, page in pages if not (site / page.replace(".md", ".html")).is_file()]
    assert not missing


def test_every_page_renders_with_its_navigation(url, page):
    pages = nav_pages()
    for title, source in pages:
        page.open(f"{url}/{source.replace('.md', '.html')}")
        errors = [e for e in page.events if e.get("method") == "Runtime.exceptionThrown"]
        assert not errors, f"{source}: {errors[0]['params']['exceptionDetails']}"
        assert page.evaluate("document.querySelector('.md-content h1') !== null"), f"{source}: no heading"
        links = page.evaluate("Array.from(document.querySelectorAll('.md-nav--primary a.md-nav__link[href]'))"
                              ".map(a => a.getAttribute('href'))")
        assert len(links) >= len(pages), f"{source}: the navigation shows {len(links)} links for {len(pages)} pages"
        active = page.evaluate("document.querySelector('.md-nav--primary .md-nav__link--active').textContent.trim()")
        assert active == title, f"{source}: the navigation marks {active!r} as the page, not {title!r}"


def test_search_finds_pages_and_the_home_page_is_kept_as_a_screenshot(url, page, tmp_path_factory):
    from PIL import Image

    page.open(f"{url}/index.html")
    shot = page.screenshot(tmp_path_factory.mktemp("screenshots") / "home.png")
    print(f"home page screenshot: {shot}")
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900) and len(image.getcolors(1 << 20)) > 50  # drawn, not a blank page

    page.evaluate("document.querySelector('[data-md-component=search-query]').focus()")
    page.type("parity")
    page.wait_for("document.querySelectorAll('.md-search-result__item').length > 0")
    found = page.evaluate("Array.from(document.querySelectorAll('.md-search-result__item a'))"
                          ".map(a => new URL(a.href).pathname)")
    assert "/reward-models/export.html" in found, found
