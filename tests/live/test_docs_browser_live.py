"""The documentation site and the `eval` HTML report, opened in a real browser.

Debian's `chromium` (apt-get; `/usr/bin/chromium`) driven by Playwright, launched with that
binary, headless, no sandbox (CI runs as root), and background networking, component updates
and sync off: the network here is closed, and Playwright's own browsers are never downloaded.
A browser that cannot be launched fails these tests; they never skip.

- The site is built with `mkdocs build --strict` and served on localhost. Every page is
  visited: no console error and no page error, every image loaded (``naturalWidth > 0``), every
  same-site link answers 200 from the server, and every link's fragment names an element of
  its page.
- The report is a real `typevet-async eval` over a slice of the shipped set against the real
  llama.cpp server (Gemma 3 270M), served the same way: no console error, and every figure
  `report.json` says was drawn is an ``<img>`` that loaded with a nonzero size.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

pytestmark = [pytest.mark.live]

REPOSITORY = Path(__file__).parent.parent.parent
SHIPPED = REPOSITORY / "examples" / "eval"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
REPORT_RECORDS = 24  # tickets of the shipped set: 72 reads, a few seconds on the toy model

# What every page reports once loaded: its images, its links and the ids its fragments can name.
PAGE_FACTS = """() => ({
    images: Array.from(document.images).map(image => ({
        src: image.currentSrc || image.src,
        complete: image.complete,
        width: image.naturalWidth,
        height: image.naturalHeight,
    })),
    links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
    ids: Array.from(document.querySelectorAll("[id]")).map(element => element.id),
})"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@functools.cache
def _quiet_handler(directory: str) -> type[http.server.SimpleHTTPRequestHandler]:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=directory, **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            # A browser asks every server for /favicon.ico on its own; neither the site (its
            # pages name their icon) nor the report (a file) has one there, so answer "nothing"
            # rather than log a 404 that no page of ours asked for.
            if self.path == "/favicon.ico":
                self.send_response(204)
                self.end_headers()
                return
            super().do_GET()

    return Handler


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on a free localhost port in a thread; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(directory)))
    thread = threading.Thread(target=server.serve_forever, name="docs http.server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Visit:
    """One page opened in the browser: what it logged as errors, and the facts of PAGE_FACTS."""

    def __init__(self, page: Page, url: str) -> None:
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        page.on(
            "requestfailed",
            lambda request: self.errors.append(f"request failed: {request.url}"),
        )
        response = page.goto(url, wait_until="load")
        self.status = response.status if response is not None else None
        page.wait_for_load_state("networkidle")
        self.facts: dict[str, Any] = page.evaluate(PAGE_FACTS)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console error: {message.text} ({message.location})")


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


# The documentation site ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return built


@pytest.mark.timeout(600)
def test_every_page_of_the_site_loads_clean_with_its_images_and_links(
    site: Path, browser: Browser
) -> None:
    pages = sorted(path.relative_to(site).as_posix() for path in site.rglob("*.html"))
    assert "index.html" in pages
    assert "api/sessions.html" in pages
    assert "benchmarks/index.html" in pages
    assert len(pages) >= 40, pages  # the guide, the API reference, every benchmark page

    ids: dict[str, set[str]] = {}
    links: dict[str, set[str]] = {}  # same-site URL without fragment -> the pages linking to it
    fragments: list[tuple[str, str, str]] = []  # (page, target, fragment)
    problems: list[str] = []
    images_seen = 0
    with serve(site) as base:
        context = browser.new_context()
        try:
            for name in pages:
                page = context.new_page()
                visit = Visit(page, base + name)
                page.close()
                if visit.status != 200:
                    problems.append(f"{name}: HTTP {visit.status}")
                problems += [f"{name}: {error}" for error in visit.errors]
                ids[name] = set(visit.facts["ids"])
                for image in visit.facts["images"]:
                    images_seen += 1
                    if not image["complete"] or image["width"] <= 0 or image["height"] <= 0:
                        problems.append(f"{name}: image not loaded: {image['src']}")
                for href in visit.facts["links"]:
                    if not href.startswith(base):
                        continue  # another site: not ours to check offline
                    target, _, fragment = href.partition("#")
                    links.setdefault(target, set()).add(name)
                    if fragment:
                        fragments.append((name, target, urllib.parse.unquote(fragment)))
        finally:
            context.close()
        for target, sources in sorted(links.items()):
            status = status_of(target)
            if status != 200:
                problems.append(f"link to {target} answered {status} (from {sorted(sources)[:3]})")
        for name, target, fragment in fragments:
            path = target.removeprefix(base) or "index.html"
            if path.endswith("/"):
                path += "index.html"
            if path in ids and fragment not in ids[path]:
                problems.append(f"{name}: link to {path}#{fragment}: no such id")

    assert not problems, "\n".join(problems[:50])
    # The README's figures are shown where it showed them: the guide's two pages hold them.
    assert images_seen >= 3
    assert len(links) >= len(pages) - 1  # every page but the 404 page is linked from another


# The eval HTML report -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report(gemma3_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eval")
    records = folder / "tickets.jsonl"
    lines = (SHIPPED / "tickets.jsonl").read_text().splitlines()[:REPORT_RECORDS]
    records.write_text("\n".join(lines) + "\n")
    out = folder / "report"
    done = subprocess.run(
        [
            sys.executable, "-m", "typevet_async._apps.cli", "eval", str(records),
            "--questions", str(SHIPPED / "questions.json"), "--out", str(out),
            "--resamples", "50", "--no-progress", "--base-url", gemma3_url,
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.timeout(900)
def test_the_eval_report_renders_every_figure_without_errors(
    report: Path, browser: Browser
) -> None:
    facts = json.loads((report / "report.json").read_text())
    assert facts["facts"]["records"] == REPORT_RECORDS
    assert not facts.get("figures_not_drawn"), facts.get("figures_not_drawn")
    drawn = sorted(path.name for path in report.glob("*.png"))
    questions = set(facts["questions"])
    assert drawn == sorted(
        f"{question}-{kind}.png" for question in questions for kind in ("reliability", "confidence")
    )

    with serve(report) as base:
        page = browser.new_page()
        try:
            visit = Visit(page, base + "report.html")
            headings = page.locator("h2").all_inner_texts()
            figures = page.locator("figure img").count()
        finally:
            page.close()
    assert visit.status == 200
    assert not visit.errors, visit.errors
    shown = {image["src"].rsplit("/", 1)[-1]: image for image in visit.facts["images"]}
    assert sorted(shown) == drawn  # every figure drawn is on the page, and nothing else
    assert figures == len(drawn)
    for name, image in shown.items():
        assert image["complete"], name
        assert image["width"] > 100, (name, image)
        assert image["height"] > 100, (name, image)
    assert all(any(question in heading for heading in headings) for question in questions), headings
