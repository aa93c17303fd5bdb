"""The supervisor's restart rule for the trainer: a crash (or SIGKILL) restarts it with the resume
override, up to `max_restarts`; exit 2 (configuration), exit 3 (gave up on a peer), exit 4 (the run collapsed) and
exit 5 (the disk is full) do not."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from evolver_launcher.plan import ChildSpec
from evolver_launcher.settings import RestartPolicy
from evolver_launcher.supervisor import Supervisor

# The "trainer": crashes (exit 1, or SIGKILLs itself) until it is given the resume override, then finishes.
SCRIPT = """
import os, signal, sys
if "trainer.resume=true" in sys.argv:
    print("resumed"); sys.exit(0)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[1]))
"""


def run_trainer(tmp_path: Path, how: str, max_restarts: int = 2) -> tuple[int, str, str]:
    spec = ChildSpec(name="trainer", argv=[sys.executable, "-c", SCRIPT, how], log_path=tmp_path / "trainer.log",
                     foreground=True, restartable=RestartPolicy().trainer, restart_argv_extra=["trainer.resume=true"])
    out = io.StringIO()
    supervisor = Supervisor([spec], restart=RestartPolicy(max_restarts=max_restarts, backoff_s=0.05),
                            health_timeout_s=10, stop_timeout_s=2, out=out)
    code = supervisor.run()
    return code, out.getvalue(), spec.log_path.read_text()


def test_a_crashed_or_killed_trainer_is_restarted_with_resume(tmp_path):
    for how in ("1", "kill"):
        (tmp_path / how).mkdir()
        code, out, log = run_trainer(tmp_path / how, how)
        assert code == 0, out
        assert "restart 1/2" in out and "trainer finished" in out
        assert "trainer.resume=true" in log and "resumed" in log


def test_a_trainer_that_gave_up_was_misconfigured_or_found_the_disk_full_is_not_restarted(tmp_path):
    # The launcher exits with the trainer's own verdicts (3 gave up, 5 disk full, as docs/launcher.md says), else 1.
    for exit_code, why, launcher_code in ((3, "gave up on a peer", 3), (2, "a configuration error", 1),
                                          (5, "the disk is full", 5)):
        (tmp_path / str(exit_code)).mkdir()
        code, out, _ = run_trainer(tmp_path / str(exit_code), str(exit_code))
        assert code == launcher_code, out
        assert f"exited with code {exit_code}" in out and why in out and "restart 1/" not in out


def test_a_restarted_trainer_stops_the_actor_its_killed_driver_left_behind(tmp_path):
    """Ray reaps a dead driver's actor only asynchronously; the next trainer on the same output folder
    finds it by name in the folder's namespace and stops it before training there."""
    import os

    import ray

    from trainer.__main__ import ACTOR_NAME, _namespace, _stop_leftover_actor

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    namespace = _namespace(str(tmp_path / "out"))
    assert namespace == _namespace(str(tmp_path / "out" / ".." / "out"))  # one folder, one namespace
    assert namespace != _namespace(str(tmp_path / "other"))
    ray.init(address="local", namespace=namespace, num_cpus=1, include_dashboard=False)
    try:
        @ray.remote(num_cpus=0)
        class Leftover:
            def ping(self) -> str:
                return "alive"

        # Detached: it outlives its creator, as the earlier driver's actor outlives that driver for a while.
        leftover = Leftover.options(name=ACTOR_NAME, lifetime="detached").remote()
        assert ray.get(leftover.ping.remote()) == "alive"
        assert _stop_leftover_actor(ray, ACTOR_NAME) is True
        try:
            ray.get_actor(ACTOR_NAME)
            raise AssertionError("the leftover actor is still registered")
        except ValueError:
            pass
        assert _stop_leftover_actor(ray, ACTOR_NAME) is False  # nothing left: nothing to do
    finally:
        ray.shutdown()


def test_a_trainer_that_stopped_a_collapsed_run_is_not_restarted_and_its_exit_code_is_passed_on(tmp_path):
    from evolver_launcher.supervisor import COLLAPSED_EXIT
    from trainer.collapse import COLLAPSED_EXIT as TRAINER_COLLAPSED_EXIT

    assert COLLAPSED_EXIT == TRAINER_COLLAPSED_EXIT == 4
    code, out, _ = run_trainer(tmp_path, "4")
    assert code == 4, out  # the launcher exits 4 too (other failures: 1)
    assert "trainer failed: exited with code 4 (the run collapsed" in out and "restart 1/" not in out
