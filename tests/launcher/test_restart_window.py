"""The restart budget is per time window: crashes spread over a long run are all survived, past the
`max_restarts` a lifetime count would allow, while a child crashing in a tight loop still stops the run
with a message naming the budget. Real child processes under the real supervisor; the window and
back-off are scaled down so the test takes seconds."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from evolver_launcher.plan import ChildSpec
from evolver_launcher.settings import RestartPolicy
from evolver_launcher.supervisor import Supervisor

# Counts its starts in a file; SIGKILLs itself after `alive_s` until it has been started `starts` times.
SCRIPT = """
import os, signal, sys, time
counter, starts, alive_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
count = (int(open(counter).read()) if os.path.exists(counter) else 0) + 1
open(counter, "w").write(str(count))
time.sleep(alive_s)
if count < starts:
    os.kill(os.getpid(), signal.SIGKILL)
print("done after", count, "starts")
"""


def supervise(tmp_path: Path, *, starts: int, alive_s: float, window_s: float, foreground: bool) -> tuple[int, str, int]:
    counter = tmp_path / "starts"
    spec = ChildSpec(name="worker", argv=[sys.executable, "-c", SCRIPT, str(counter), str(starts), str(alive_s)],
                     log_path=tmp_path / "worker.log", foreground=foreground)
    out = io.StringIO()
    policy = RestartPolicy(max_restarts=2, window_s=window_s, backoff_s=0.05, backoff_max_s=0.05)
    code = Supervisor([spec], restart=policy, health_timeout_s=10, stop_timeout_s=2, out=out).run()
    return code, out.getvalue(), int(counter.read_text())


def test_crashes_spread_wider_than_the_window_are_all_restarted(tmp_path):
    # Each start lives 0.4 s, longer than the 0.3 s window: every crash finds the window empty again.
    code, out, starts = supervise(tmp_path, starts=5, alive_s=0.4, window_s=0.3, foreground=True)
    assert code == 0, out
    assert starts == 5, "four crashes, twice the two restarts a lifetime budget would have allowed"
    assert out.count("worker exited with code -9; restart 1/2") == 4
    assert "(4 in all)" in out and "worker finished" in out


def test_a_crash_loop_inside_the_window_stops_the_run_naming_the_budget(tmp_path):
    code, out, starts = supervise(tmp_path, starts=100, alive_s=0.0, window_s=60, foreground=False)
    assert code == 1, out
    assert starts == 3, "the first start and two restarts, then the run stops"
    assert "restart 1/2" in out and "restart 2/2" in out
    assert ("worker failed: exited with code -9 after 2 restart(s) within 60s: a crash loop (the budget is "
            "launcher.restart.max_restarts=2 per launcher.restart.window_s=60s)") in out
