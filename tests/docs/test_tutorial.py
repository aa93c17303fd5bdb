"""docs/own-environment.md, run as a reader would: every code block in order, in an empty folder.

A block after `<!-- file: NAME -->` is saved as NAME in the current folder; a `bash` block runs. All of
them run as one bash script, so `cd` and variables carry over, with EVOLVER pointing at this checkout.
A `console` block is shown, not run: the scaffold's path, whose commands tests/env_service/test_scaffold.py
runs (the generated project's own tests, training included). A `bash` block after `<!-- real model -->`
trains SmolLM2 for minutes: it runs only with EVOLVER_REAL_MODEL_TESTS=1 set (CI leaves it out, for time).
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
BLOCK = re.compile(r"(?:<!-- file: (?P<file>[\w.-]+) -->\n|(?P<real><!-- real model -->\n))?"
                   r"```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
REAL_MODEL = os.environ.get("EVOLVER_REAL_MODEL_TESTS") == "1"


def tutorial_script(markdown: str, real_model: bool = False) -> str:
    parts = ["set -euo pipefail"]
    for block in BLOCK.finditer(markdown):
        if block["file"]:
            parts.append(f"cat > {block['file']} <<'END_OF_TUTORIAL_FILE'\n{block['body']}END_OF_TUTORIAL_FILE")
        elif block["real"]:
            if real_model:
                parts.append(block["body"])
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
            "```console\nshown only\n```\n<!-- real model -->\n```bash\ntrain smollm2\n```\n")
    assert tutorial_script(page) == ("set -euo pipefail\ncat > a.py <<'END_OF_TUTORIAL_FILE'\nprint(1)\n"
                                     "END_OF_TUTORIAL_FILE\npython a.py\n\n")
    assert tutorial_script(page, real_model=True).endswith("python a.py\n\ntrain smollm2\n\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_tutorial(tmp_path: Path, real_model: bool, timeout_s: float) -> str:
    script = tmp_path / "tutorial.sh"
    script.write_text(tutorial_script(TUTORIAL.read_text(), real_model))
    env = {**os.environ, "EVOLVER": str(REPO), "PORT": str(free_port())}
    env.pop("PYTHONPATH", None)
    # Its own process group: whatever a failing block leaves running (the env_service it started) is killed.
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, output[-4000:]
    return output


@pytest.mark.slow
def test_the_tutorial_runs_from_an_empty_folder_to_a_two_step_training_run(tmp_path):
    output = run_tutorial(tmp_path, real_model=False, timeout_s=300)
    assert "1.0 True 1.0" in output, "the hand-played episode"
    (verdict,) = re.findall(r"It ends with `(\d+/\d+ checks passed: CONFORMS)`", TUTORIAL.read_text())
    assert verdict in output, "the page quotes the kit's count as it prints it"
    summary = json.loads((tmp_path / "echo-tutorial" / "runs" / "echo" / "trainer" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["rollouts"] == 16
    assert summary["training"]["steps_with_nonzero_grad"] >= 1, "the letters score gives GRPO mixed groups"


@pytest.mark.slow
@pytest.mark.skipif(not REAL_MODEL, reason="trains SmolLM2 for minutes: set EVOLVER_REAL_MODEL_TESTS=1 (not in CI)")
def test_the_tutorial_with_its_real_model_step_warm_starts_smollm2(tmp_path):
    run_tutorial(tmp_path, real_model=True, timeout_s=1800)
    summary = json.loads((tmp_path / "echo-tutorial" / "runs" / "echo-smollm2" / "trainer" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["warm_start"]["tasks"] == 16
    assert summary["training"]["steps_with_nonzero_grad"] >= 1, "after the warm start, groups differ"
