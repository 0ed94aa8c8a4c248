"""A headless Chromium for the playground's browser tests, and the playground started
for them.

The browser is Debian's `chromium` (the Makefile's test setup installs it:
scripts/install_chromium.sh), driven by Playwright for Python with ``executable_path``
set to it: `playwright install` downloads its own browser from a CDN, which these
machines cannot reach, and Playwright 1.65 drives the system's Chromium of the same
major version.

``python tests/e2e/playground_browser.py --screenshots docs/playground`` starts the
playground on the default model, walks the four views like a person would and writes
the screenshots that docs/playground.md shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
# Quiet on a machine with no network: no first-run, sync, component or QUIC traffic.
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
INSTALL_HINT = (
    "install it with `apt-get update && apt-get install -y --no-install-recommends "
    "chromium` (`make test` does it: scripts/install_chromium.sh)"
)


def chromium_path() -> str | None:
    """The system Chromium's binary, or None."""
    for path in CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("chromium") or shutil.which("chromium-browser")


def launch(playwright):
    """A headless Chromium (Playwright's Browser) on the system binary."""
    path = chromium_path()
    if path is None:
        raise RuntimeError(f"no Chromium on this machine: {INSTALL_HINT}")
    return playwright.chromium.launch(executable_path=path, headless=True, args=FLAGS)


class Playground:
    """`vllm-x86 playground --port P` on loopback with its own daemon folder, ready when
    constructed (``/api/health`` answers, 401 with a key); ``stop()`` ends it, its daemon and the
    model server."""

    def __init__(
        self, workdir: Path, env: dict[str, str], args: tuple[str, ...] = (), timeout: float = 120
    ):
        from vllm_x86.tools.ports import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.env = dict(env, VLLM_X86_DAEMON_DIR=str(workdir / "daemon"))
        self.log_path = workdir / "playground.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vllm_x86.tools.cli", "playground", "--port", str(self.port), *args],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True, cwd=ROOT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"playground exited ({self.proc.returncode}):\n{self.log()[-4000:]}"
                )
            try:
                # 401: up, with a key
                if httpx.get(f"{self.base}/api/health", timeout=2).status_code in (200, 401):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"playground not answering in {timeout} s:\n{self.log()[-4000:]}"
                )
            time.sleep(0.3)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def api(self, path: str, **kw):
        return httpx.get(f"{self.base}/api/{path}", timeout=30, **kw)

    def stop(self) -> None:
        from vllm_x86.tools.bench.server import stop_group

        stop_group(self.proc)
        # the daemon it started runs in a session of its own: stop it by its folder
        subprocess.run(
            [sys.executable, "-m", "vllm_x86.tools.cli", "daemon", "stop"],
            env=self.env, capture_output=True, timeout=120, cwd=ROOT,
        )  # fmt: skip


def screenshots(out: Path) -> None:
    """Start the playground on the default model, walk its views, write the PNGs."""
    import tempfile

    from playwright.sync_api import expect, sync_playwright

    from vllm_x86.tools.models.pull import pull

    default = pull()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="playground-shots-") as tmp:
        pg = Playground(Path(tmp), dict(os.environ))
        try:
            with sync_playwright() as p:
                browser = launch(p)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(pg.base + "/")
                row = page.locator(f'[data-testid="model-row"][data-id="{default.name}"]')
                row.get_by_test_id("load").click()
                expect(page.get_by_test_id("status")).to_contain_text("ready", timeout=600_000)
                page.screenshot(path=str(out / "models.png"))
                page.get_by_test_id("tab-chat").click()
                page.get_by_test_id("prompt").fill(
                    "Give me three tips for writing clear emails, as a list."
                )
                page.get_by_test_id("send").click()
                expect(page.get_by_test_id("answer").last).to_have_attribute(
                    "data-state", "done", timeout=120_000
                )
                page.get_by_test_id("copy-python").click()
                page.screenshot(path=str(out / "chat.png"), full_page=True)
                page.get_by_test_id("tab-structured").click()
                page.get_by_test_id("so-run").click()
                expect(page.get_by_test_id("so-verdict")).to_be_visible(timeout=120_000)
                page.screenshot(path=str(out / "structured.png"))
                page.get_by_test_id("tab-chat").click()
                page.get_by_test_id("prompt").fill("Write a long story about a lighthouse keeper.")
                page.get_by_test_id("send").click()
                page.get_by_test_id("tab-server").click()
                page.wait_for_timeout(9000)
                page.screenshot(path=str(out / "server.png"))
                browser.close()
        finally:
            pg.stop()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", type=Path, required=True, help="folder for the PNGs")
    screenshots(parser.parse_args().screenshots)
