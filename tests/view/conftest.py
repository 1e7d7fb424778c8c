"""Browser fixtures for the viewer: Debian's chromium driven by playwright, one browser per
session; every page fails its test on a console error or a request to another host."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

FIXTURE = Path(__file__).parent / "fixture_run"
SHOTS = os.environ.get("AGENTRL_VIEW_SCREENSHOTS")  # a folder: the tests save each page there


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "no chromium on PATH: the viewer's browser tests need Debian's chromium "
        "(`make setup` installs it as root: apt-get install -y chromium)"
    )


# package scope: playwright's sync API holds an asyncio loop on this thread while it is
# open, and the anyio tests that run after tests/view could not start their own
@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise RuntimeError("playwright is not installed: run `make setup`") from e
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="package")
def fixture_server() -> Iterator[object]:
    from agentrl.view import serve_in_thread

    server = serve_in_thread(FIXTURE, 0, follow=False)
    yield server
    server.stop()


class Guard:
    """What a page did that a test must fail on."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.foreign: list[str] = []

    def check(self) -> None:
        assert not self.errors, f"console errors: {self.errors}"
        assert not self.foreign, f"requests to hosts other than 127.0.0.1: {self.foreign}"


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})  # type: ignore[attr-defined]
    guard = Guard()

    def on_route(route: object) -> None:
        url = route.request.url  # type: ignore[attr-defined]
        host = urlparse(url).hostname
        if url.startswith("data:") or host == "127.0.0.1":
            route.continue_()  # type: ignore[attr-defined]
        else:
            guard.foreign.append(url)
            route.abort()  # type: ignore[attr-defined]

    context.route("**/*", on_route)
    pg = context.new_page()
    pg.on("console", lambda m: guard.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: guard.errors.append(str(e)))
    pg.guard = guard  # type: ignore[attr-defined]
    yield pg
    context.close()
    guard.check()


def shot(page: object, name: str) -> None:
    """Save a screenshot for docs/view.md when AGENTRL_VIEW_SCREENSHOTS names a folder."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]
