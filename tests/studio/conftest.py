"""A real run folder (a short `tiny` launcher run with every mechanism on, the studio as its child) and a
real headless Chromium, driven by Playwright through Debian's `chromium` binary (install.sh installs it).

A missing browser fails these tests; it never skips them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO, stop_group

HERE = Path(__file__).resolve().parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STUDIO_LINE = re.compile(r"\[launcher\] studio \(.*\): (http://\S+)/runs/(\S+)")


def chromium_path() -> str:
    for candidate in (os.environ.get("EVOLVER_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("no chromium binary: the studio's browser tests need Debian's `chromium` package "
                "(bash install.sh installs it as root; or apt-get install chromium; or set EVOLVER_CHROMIUM)")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("EVOLVER_TEST_ARTIFACTS", REPO / "runs" / "test-artifacts")) / "studio"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    # Module scope, not session: Playwright's sync API keeps an event loop running in the main thread
    # until it stops, and every later test calling asyncio.run() would fail while it is open.
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class LaunchedRun:
    proc: subprocess.Popen
    log: Path
    runs_dir: Path
    name: str
    studio_url: str  # the launcher's studio child: up while the run is live

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.name

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the launcher did not finish within {timeout}s:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGTERM, 30)


@pytest.fixture(scope="session")
def launched_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedRun]:
    """`python launcher.py --conf tests/studio/run.yaml`: yields once the studio's URL is printed."""
    root = tmp_path_factory.mktemp("studio_run")
    runs_dir = root / "runs"
    conf = root / "run.yaml"
    conf.write_text((HERE / "run.yaml").read_text().replace("RUNS_DIR", str(runs_dir)))
    log = root / "launcher.out"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    match = None
    while match is None:
        text = log.read_text(errors="replace")
        match = STUDIO_LINE.search(text)
        if match is None and (proc.poll() is not None or time.monotonic() > deadline):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the launcher never printed the studio's URL:\n{text[-4000:]}")
        time.sleep(0.3)
    run = LaunchedRun(proc, log, runs_dir, match.group(2), match.group(1))
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="session")
def finished_run(launched_run: LaunchedRun) -> LaunchedRun:
    code = launched_run.wait(timeout=420)
    assert code == 0, launched_run.output()[-4000:]
    return launched_run
