"""Launcher overhead: seconds from `python launcher.py` to every service healthy, and from SIGINT to all gone.

    .venv/bin/python benchmarks/services/launcher.py [--ray] [--model tiny|smollm2]

Starts the five services (and a Ray head with --ray) with no trainer, on free ports, in a temporary
run folder; prints one JSON line: time to plan (config validated), to each service healthy, to all
healthy, teardown time after SIGINT, and how many processes the launcher had started.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO  # noqa: E402

CONFIG = """
launcher:
  experiment: bench
  runs_dir: {runs}
  services: [llm_server, env_service, task_manager, experience_manager, judge]
  ports: {{llm_server: auto, env_service: auto, task_manager: auto, experience_manager: auto, judge: auto}}
  trainer: false
  threads: {{default: 1}}
  ray: {{enabled: {ray}, dashboard_port: auto}}
llm_server: {{model: {model}}}
env_service: {{environments: [flights]}}
task_manager: {{environments: [flights]}}
experience_manager: {{summary: {{mode: heuristic}}}}
judge: {{llm: {{base_url: llm_server}}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray", action="store_true", help="also start a Ray head (as a training run does)")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="launcher-bench-"))
    conf = tmp / "run.yaml"
    conf.write_text(CONFIG.format(runs=tmp / "runs", ray=str(args.ray).lower(), model=args.model))
    out = tmp / "launcher.out"
    started = time.monotonic()
    with out.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)
    marks: dict[str, float] = {}
    while time.monotonic() - started < 600 and proc.poll() is None:
        text = out.read_text(errors="replace")
        if "plan" not in marks and "processes, in start order" in text:
            marks["plan"] = time.monotonic() - started
        for name in re.findall(r"\] (\w+) is healthy", text):
            marks.setdefault(name, time.monotonic() - started)
        if "all services healthy" in text:
            marks["all_healthy"] = time.monotonic() - started
            break
        time.sleep(0.1)
    if "all_healthy" not in marks:
        os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(f"services did not come up:\n{out.read_text()[-3000:]}")
    tree = psutil.Process(proc.pid).children(recursive=True)
    stop = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=120)
    teardown = time.monotonic() - stop
    left = [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({
        "benchmark": "launcher", "ray": args.ray, "model": args.model, "exit_code": code,
        "seconds_to_plan": round(marks["plan"], 2),
        "seconds_to_healthy": {k: round(v, 2) for k, v in marks.items() if k not in ("plan", "all_healthy")},
        "seconds_to_all_healthy": round(marks["all_healthy"], 2),
        "teardown_s": round(teardown, 2), "processes_started": len(tree), "processes_left": len(left),
    }))


if __name__ == "__main__":
    main()
