"""The built documentation site, checked in a real browser: headless Chromium opens the home page, an
API page and the search, and saves a screenshot of each::

    make site && python tools/browse.py site --out site-check/

Needs ``pip install -e ".[browse]"`` (Playwright) and a Chromium: the OS's (``apt install chromium``,
found at ``/usr/bin/chromium``) or Playwright's own (``playwright install chromium``). Exits 1 naming
each check that failed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def check_site(site: Path, out: Path, query: str = "ELECTRA", chromium: str | None = None) -> list[str]:
    """The failures of the browser checks (empty when the site renders, its API page shows the
    evaluation contract and its search finds ``query``)."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    server, base = _serve(site)
    executable = chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))

            page.goto(f"{base}/", wait_until="networkidle")
            page.screenshot(path=str(out / "home.png"))
            if "pretrainlab" not in page.title() or not page.locator("h1").first.inner_text().strip():
                failures.append(f"home page: title {page.title()!r}, no heading")
            if page.locator("table").count() == 0:
                failures.append("home page: no table (the headline result)")

            page.goto(f"{base}/api/evaluations/", wait_until="networkidle")
            page.screenshot(path=str(out / "api.png"))
            contract = page.locator("[id='pretrainlab.evaluation.base.Evaluation']")
            if contract.count() == 0 or not contract.first.is_visible():
                failures.append("API page: the Evaluation class is not shown")

            page.goto(f"{base}/", wait_until="networkidle")
            page.keyboard.press("/")  # the theme's search shortcut, at any viewport width
            page.locator("input[data-md-component='search-query']").press_sequentially(query, delay=50)
            results = page.locator(".md-search-result__item")
            try:
                results.first.wait_for(timeout=10_000)
            except Exception:
                pass
            page.screenshot(path=str(out / "search.png"))
            if results.count() == 0:
                failures.append(f"search: no result for {query!r}")
            failures += [f"JavaScript error: {e}" for e in errors]
            browser.close()
    finally:
        server.shutdown()
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/browse.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site (make site writes site/)")
    parser.add_argument("--out", type=Path, default=Path("site-check"), help="where the screenshots go")
    parser.add_argument("--query", default="ELECTRA", help="what to search for")
    parser.add_argument("--chromium", help="the browser's executable (default: chromium on the PATH)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"error: {args.site} has no index.html: build the site first (make site)", file=sys.stderr)
        return 2
    failures = check_site(args.site, args.out, args.query, args.chromium)
    for f in failures:
        print(f"FAILED {f}")
    if not failures:
        print(f"home page, API page and search render; screenshots in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
