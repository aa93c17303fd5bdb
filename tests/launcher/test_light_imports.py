"""The launcher validates a whole run without importing torch (it starts in a second, and on a machine
without the training stack it still plans the services). Checked in a fresh interpreter each time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "verl")

REPORT = f"import sys; print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"


def heavy_modules(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code + "\n" + REPORT], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def test_import_launcher_imports_no_torch():
    assert heavy_modules("import launcher") == ""


def test_dry_run_of_a_run_with_adca_imports_no_torch(tmp_path):
    # overall.yaml selects adca_grpo, whose needs (step labels -> a judge) the config reads from the catalog.
    code = (
        "import contextlib, io, launcher\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    code = launcher.main(['--conf', 'examples/overall.yaml', '--dry-run', 'launcher.runs_dir={tmp_path}',"
        " 'launcher.ray.dashboard_port=auto'])\n"
        "assert code == 0 and 'dry run: nothing was started' in out.getvalue(), out.getvalue()\n"
        "from trainer.config import TrainerConfig  # the run's trainer section, validated\n"
    )
    assert heavy_modules(code) == ""


def test_estimator_names_and_needs_come_from_the_catalog_without_torch():
    code = (
        "from estimators import AdvantageConfig, catalog\n"
        "assert {'grpo', 'adca_grpo', 'gigpo'} <= set(catalog.names())\n"
        "assert AdvantageConfig(estimator='adca_grpo').needs_step_labels\n"
        "assert not AdvantageConfig(estimator='gigpo').needs_step_labels\n"
        "assert catalog.verl_name('gigpo') == 'evolver_gigpo' and catalog.from_verl_name('evolver_grpo') == 'grpo'\n"
    )
    assert heavy_modules(code) == ""
