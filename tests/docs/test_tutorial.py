"""docs/own-environment.md, run as a reader would: every code block in order, in an empty folder.

A block after `<!-- file: NAME -->` is saved as NAME in the current folder; a `bash` block runs. All of
them run as one bash script, so `cd` and variables carry over, with EVOLVER pointing at this checkout.
A `console` block is shown, not run: the scaffold's path, whose commands tests/env_service/test_scaffold.py
runs (the generated project's own tests, training included).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "own-environment.md"
BLOCK = re.compile(r"(?:<!-- file: (?P<file>[\w.-]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def tutorial_script(markdown: str) -> str:
    parts = ["set -euo pipefail"]
    for block in BLOCK.finditer(markdown):
        if block["file"]:
            parts.append(f"cat > {block['file']} <<'END_OF_TUTORIAL_FILE'\n{block['body']}END_OF_TUTORIAL_FILE")
        elif block["lang"] == "bash":
            parts.append(block["body"])
        elif block["lang"] == "console":
            continue
        else:
            raise AssertionError(f"a {block['lang'] or 'plain'} block that is neither a file nor bash: "
                                 f"{block['body'][:80]!r}")
    return "\n".join(parts) + "\n"


def test_tutorial_script_saves_files_and_runs_bash_blocks():
    page = ("text\n<!-- file: a.py -->\n```python\nprint(1)\n```\nmore\n```bash\npython a.py\n```\n"
            "```console\nshown only\n```\n")
    assert tutorial_script(page) == ("set -euo pipefail\ncat > a.py <<'END_OF_TUTORIAL_FILE'\nprint(1)\n"
                                     "END_OF_TUTORIAL_FILE\npython a.py\n\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_tutorial_runs_from_an_empty_folder_to_a_two_step_training_run(tmp_path):
    script = tmp_path / "tutorial.sh"
    script.write_text(tutorial_script(TUTORIAL.read_text()))
    env = {**os.environ, "EVOLVER": str(REPO), "PORT": str(free_port())}
    env.pop("PYTHONPATH", None)
    # Its own process group: whatever a failing block leaves running (the env_service it started) is killed.
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, output[-4000:]
    assert "1.0 True 1.0" in output, "the hand-played episode"
    assert "checks passed: CONFORMS" in output
    summary = json.loads((tmp_path / "echo-tutorial" / "runs" / "echo" / "trainer" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["rollouts"] == 16
    assert summary["training"]["steps_with_nonzero_grad"] >= 1, "the letters score gives GRPO mixed groups"
