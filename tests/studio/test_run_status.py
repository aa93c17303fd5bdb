"""A launched run's status while its manifest has no result: live while the pid in its lock file runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from studio.runs import Run


def _launched_run(runs: Path, lock_text: str) -> Run:
    (runs / "r1").mkdir()
    (runs / "r1" / "manifest.json").write_text(json.dumps({"config": {}}))  # no `result`: not finished
    (runs / ".r1.lock").write_text(lock_text)
    return Run("r1", runs / "r1")


def test_live_while_the_launcher_in_the_lock_runs(tmp_path: Path) -> None:
    launcher = subprocess.Popen(["sleep", "60"])
    try:
        run = _launched_run(tmp_path, f"{launcher.pid}\n")
        assert run.status == "live"
    finally:
        launcher.kill()
        launcher.wait()
    assert run.status == "crashed"


def test_a_lock_naming_no_process_reads_crashed(tmp_path: Path) -> None:
    # pid 0 would make a bare os.kill(0, 0) signal the studio's own group and "succeed".
    assert _launched_run(tmp_path, "0").status == "crashed"
