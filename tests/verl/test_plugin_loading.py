"""The plugin reaches veRL's registries on a bare `import verl` (fresh interpreters), and nothing broken
in or beside it ever breaks `import verl`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="veRL is installed by the `verl` extra")

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
state = {
    "estimators": {k: f"{v.__module__}.{v.__name__}" for k, v in ADV_ESTIMATOR_REGISTRY.items() if "evolver" in k},
    "losses": {k: v.__module__ for k, v in POLICY_LOSS_REGISTRY.items() if "evolver" in k},
    "trainers": {k: v.__module__ for k, v in TRAINER_REGISTRY.items() if "evolver" in k},
    "agent_loops": {k: v["_target_"] for k, v in _agent_loop_registry.items() if "evolver" in k},
    "verl_grpo": ADV_ESTIMATOR_REGISTRY["grpo"].__module__,
}
import sys
plugin = sys.modules.get("trainer.verl_plugin.registration")
state["failed"] = dict(plugin.FAILED) if plugin else None
print("STATE=" + json.dumps(state))
"""

EXPECTED = {
    "estimators": {"evolver_grpo", "evolver_adca_grpo", "evolver_gigpo"},
    "losses": {"evolver_boosted"},
    "trainers": {"evolver_sync"},
    "agent_loops": {"evolver_env_agent"},
}


def probe(env: dict[str, str], extra_path: Path | None = None) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    path = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    full.update({"PYTHONPATH": os.pathsep.join(path), "RAY_AUTH_MODE": "disabled", **env})
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"import verl failed:\n{proc.stderr[-4000:]}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATE="))
    return json.loads(line.removeprefix("STATE=")), proc.stderr


def assert_all_registered(state: dict) -> None:
    for kind, names in EXPECTED.items():
        assert set(state[kind]) == names, f"{kind}: {state[kind]}"
    assert all(v.startswith("trainer.verl_plugin.estimators.") for v in state["estimators"].values())
    assert state["losses"]["evolver_boosted"] == "trainer.verl_plugin.loss"
    assert state["agent_loops"]["evolver_env_agent"] == "trainer.verl_plugin.agent_loop.EvolverEnvAgentLoop"
    assert state["verl_grpo"] == "verl.trainer.ppo.core_algos"  # veRL's own grpo untouched
    assert state["failed"] == {}


def write_dist_info(root: Path, dist: str, entry_points_text: str) -> None:
    """A minimal installed-distribution record, so importlib.metadata sees its entry points."""
    info = root / f"{dist}-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(entry_points_text)


def test_external_modules_variable_registers_everything():
    state, _ = probe({"VERL_USE_EXTERNAL_MODULES": "trainer.verl_plugin", "VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert_all_registered(state)


def test_verl_plugins_entry_point_registers_everything_and_a_broken_plugin_is_harmless(tmp_path):
    # The same mechanism as pyproject's stanza, declared by throwaway metadata: a working entry point
    # to our plugin and one to a module that raises on import.
    write_dist_info(tmp_path, "evolver_probe", "[verl.plugins]\nevolver_probe = trainer.verl_plugin\n")
    write_dist_info(tmp_path, "broken_probe", "[verl.plugins]\nbroken_probe = tests.verl.broken_plugin\n")
    state, _ = probe({}, extra_path=tmp_path)
    assert_all_registered(state)


def test_without_the_plugin_nothing_is_registered():
    state, _ = probe({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert state["estimators"] == {} and state["losses"] == {} and state["failed"] is None


def test_a_failing_registration_is_logged_and_the_rest_still_register():
    state, stderr = probe({"VERL_USE_EXTERNAL_MODULES": "tests.verl.sabotage,trainer.verl_plugin",
                           "VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert set(state["failed"]) == {"adv_estimator:evolver_grpo", "agent_loop:evolver_env_agent"}
    assert "already been registered" in state["failed"]["adv_estimator:evolver_grpo"]
    assert state["estimators"]["evolver_grpo"].endswith("someone_elses_grpo")  # the other one stays
    assert {"evolver_adca_grpo", "evolver_gigpo"} <= set(state["estimators"])
    assert set(state["losses"]) == {"evolver_boosted"} and set(state["trainers"]) == {"evolver_sync"}
    assert state["agent_loops"] == {}
    assert "registering adv_estimator:evolver_grpo failed" in stderr
    assert "registering agent_loop:evolver_env_agent failed" in stderr


def test_the_installed_package_declares_the_verl_plugins_entry_point():
    """What veRL's workers load: the entry point's mechanism itself is tested above with throwaway metadata."""
    ours = [ep for ep in entry_points(group="verl.plugins") if ep.value == "trainer.verl_plugin"]
    assert ours, ('no installed `verl.plugins` entry point points at trainer.verl_plugin: add\n'
                  '  [project.entry-points."verl.plugins"]\n  evolver = "trainer.verl_plugin"\n'
                  'to pyproject.toml and run `pip install -e .`; without it veRL\'s Ray workers never load the plugin')
