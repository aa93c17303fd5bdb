"""`python -m env_service.new`: every kind it writes passes its own conformance test (the kit over HTTP),
and the plugin project's own training test passes: run.yaml trains 2 steps with self-questioning through
launcher.py, as generated, with a non-zero gradient (the tiny model's rewards differ within a group)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from env_service.new import check_name, main, project_files
from tests.helpers import REPO

pytestmark = pytest.mark.slow
KINDS = ("plugin", "remote", "gym")


def run(argv: list[str], cwd, timeout: float) -> subprocess.CompletedProcess:
    # PYTHONPATH: this checkout, as a user's clone would be found (the generated code imports evolver).
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_each_kind_passes_its_own_conformance_test_and_the_plugin_trains_2_steps_with_a_gradient(tmp_path):
    for kind in KINDS:
        done = run([sys.executable, "-m", "env_service.new", f"my_{kind}", "--kind", kind,
                    "--dir", str(tmp_path / kind)], REPO, 30)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / kind / f"test_my_{kind}.py").exists()

    # The projects' own tests: env_service (and, for remote, the user's server) started from their files, the
    # conformance kit over HTTP against it; the plugin's also trains (each kind's training test is the same
    # launcher run, so one of them is enough here). One pytest: the files are independent.
    tests = [str(tmp_path / kind / f"test_my_{kind}.py") for kind in KINDS]
    done = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
                "-k", "conforms or test_my_plugin"], tmp_path, 660)
    assert done.returncode == 0 and "4 passed" in done.stdout, done.stdout[-6000:]


def test_the_cli_refuses_a_bad_name_or_a_folder_in_use_and_writes_nothing(tmp_path, capsys):
    assert "lowercase" in check_name("My-Env") and "taken" in check_name("gym") and check_name("shelves") is None
    with pytest.raises(SystemExit) as exit_info:
        main(["My-Env", "--kind", "plugin", "--dir", str(tmp_path / "a")])
    assert exit_info.value.code == 2 and not (tmp_path / "a").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit):
        main(["shelves", "--kind", "plugin", "--dir", str(tmp_path / "used")])
    assert "not an empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["mine.txt"]


def test_every_slot_is_filled_and_the_generated_python_passes_ruff(tmp_path):
    for kind in KINDS:
        for path, text in project_files("shelves", kind).items():
            assert "{{" not in text, f"{kind} {path} keeps an unfilled slot"
            (tmp_path / kind).mkdir(exist_ok=True)
            (tmp_path / kind / path).write_text(text)
    ruff = REPO / ".venv" / "bin" / "ruff"
    if not ruff.exists():
        pytest.skip("no ruff in .venv")
    # Our own rules but import order, which depends on the name (the world module sorts among the others).
    done = subprocess.run([str(ruff), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"),
                           "--select", "E,F,W,B,UP", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
