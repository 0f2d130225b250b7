"""Fixtures for the headless-browser checks: Debian's chromium driven by playwright, and the
mermaid npm package's bundle. Each is skipped, with the reason, where something is missing.

.ci/setup installs them: ``apt-get install chromium`` and ``npm install mermaid`` into
.cache/node (git ignores .cache). TRACEML_CI_CHROMIUM and TRACEML_CI_MERMAID_JS point elsewhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MERMAID_JS = REPO / ".cache" / "node" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"


def _chromium() -> str | None:
    found = os.environ.get("TRACEML_CI_CHROMIUM")
    if found:
        return found
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless chromium (closed at the end of the session)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    """A page that can load file:// URLs only: any network request fails the test."""
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    pg = context.new_page()
    pg.requests_blocked = []  # type: ignore[attr-defined]
    pg.console_errors = []  # type: ignore[attr-defined]

    def block(route: Any) -> None:
        if route.request.url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            pg.requests_blocked.append(route.request.url)  # type: ignore[attr-defined]
            route.abort()

    pg.route("**/*", block)
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="session")
def mermaid_js() -> Path:
    path = Path(os.environ.get("TRACEML_CI_MERMAID_JS", MERMAID_JS))
    if not path.is_file():
        pytest.skip(
            f"mermaid's bundle is missing at {path} (npm install --prefix .cache/node mermaid)"
        )
    return path
