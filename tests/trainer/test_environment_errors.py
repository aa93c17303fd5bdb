"""Environment errors are counted apart from invalid actions, and a step the environment failed entirely
is no training step: a real tiny-model trainer on an environment whose every step raises collects the
step again, then exits 3 with the environment's own error text."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.env_service.failing_plugin import CRASH
from tests.helpers import REPO, run_env_service, write_trainer_conf
from trainer.rollout import EpisodeResult, environment_error, is_invalid_action, summarize_episodes

CRASHING = ("env_service:\n  environments: {crashing: {}}\n"
            "  plugins: {crashing: 'tests.env_service.failing_plugin:CrashingEnvironment'}\n")


def test_an_environment_error_is_no_invalid_action():
    failed = {"error": {"code": "environment_error", "message": "RuntimeError: boom"}}
    assert environment_error(failed) == "RuntimeError: boom" and not is_invalid_action(failed)
    assert environment_error({"error": "unknown tool"}) is None and is_invalid_action({"error": "unknown tool"})
    assert not is_invalid_action({}) and environment_error({}) is None


def test_a_run_whose_environment_crashes_exits_3_with_its_error_and_where_its_traceback_is(tmp_path):
    out, logs = tmp_path / "out", tmp_path / "logs"
    with run_env_service(CRASHING, tmp_path) as env:
        logs.mkdir()
        (logs / "env_service.log").symlink_to(env.log_path)  # where the launcher would have logged it
        conf = write_trainer_conf(
            tmp_path / "trainer.yaml", steps=2, output_dir=str(out), empty_step_retries=1,
            rollout={"env": "crashing", "n": 2, "max_turns": 2, "max_new_tokens": 2, "max_context": 256, "retries": 0},
            services={"env_url": env.url, "logs_dir": str(logs)})
        done = subprocess.run([sys.executable, "-m", "trainer", "--conf", str(conf)], cwd=REPO, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = done.stdout + done.stderr
    assert done.returncode == 3, text[-3000:]
    assert "every rollout ended in an environment error in 2 attempts" in text
    assert f"RuntimeError: {CRASH} (at failing_plugin.py:22 in step)" in text, "the raising line, named"
    assert text.count("collecting it again") == 1
    assert re.search(rf'its traceback is in {logs}/env_service.log, last frame: \S*failing_plugin.py, line 22, in step',
                     text), text[-3000:]
    assert not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip()


def test_an_evaluation_reports_environment_errors_beside_invalid_actions():
    episodes = [EpisodeResult("t1", 0.0, 1, 0, "", False, environment_error=True),
                EpisodeResult("t1", 1.0, 2, 1, "done", True), EpisodeResult("t2", 0.0, 1, 0, "", False),
                EpisodeResult("t2", 0.0, 1, 0, "", False, environment_error=True)]
    summary = summarize_episodes(episodes, k=2)
    assert summary.environment_error_rate == 0.5 and summary.invalid_action_rate == 0.2
    assert list(summary.metrics())[:4] == ["eval/avg@2", "eval/best@2", "eval/invalid_action_rate",
                                           "eval/environment_error_rate"]
