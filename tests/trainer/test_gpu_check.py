"""`benchmarks/speed/gpu_check.sh --device cpu --model tiny`: the GPU machine's prepared check runs here too, with
every installed package the GPU machine lacks hidden, so an import it cannot satisfy fails here first.

The GPU machine has torch, transformers, accelerate, peft and httpx (and what they require); the check carries
the wheels in `gpu_check_wheels.txt`. Everything else installed here (Ray, FastAPI, Qdrant's client, OmegaConf,
vLLM where present...) is hidden as if absent: `find_spec` answers None for it, as on that machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from tests.helpers import REPO

ON_THE_GPU_MACHINE = ("torch", "transformers", "accelerate", "peft", "httpx")
WHEEL_LIST = REPO / "benchmarks" / "speed" / "gpu_check_wheels.txt"

HIDER = """
import json, os, sys
HIDDEN = frozenset(json.loads(os.environ["GPU_CHECK_HIDDEN"]))

class Absent:
    '''Wraps a finder: the hidden top-level modules are not found, as where they are not installed.'''
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None
    def __getattr__(self, attr):
        return getattr(self.inner, attr)

sys.meta_path[:] = [Absent(finder) for finder in sys.meta_path]
"""


def with_requirements(names: tuple[str, ...] | list[str]) -> set[str]:
    """The distributions `names` and everything they require (no extras), installed here."""
    environment = {**default_environment(), "extra": ""}
    found: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(canonicalize_name(requirement.name))
    return found


def carried() -> set[str]:
    lines = [line.split()[0] for line in WHEEL_LIST.read_text().splitlines() if line and not line.startswith("#")]
    return {canonicalize_name(parse_wheel_filename(name)[0]) for name in lines}


def hidden_modules() -> set[str]:
    """Top-level modules installed here whose distributions the GPU machine neither has nor gets carried."""
    allowed = with_requirements(ON_THE_GPU_MACHINE) | carried() | {"evolver"}  # evolver: the tree itself
    return {module for module, dists in metadata.packages_distributions().items()
            if not any(canonicalize_name(d) in allowed for d in dists)}


def test_carried_wheels_cover_what_the_trainer_needs_beyond_the_gpu_machine():
    names = carried()
    assert {"pydantic", "pydantic-core", "loguru"} <= names
    sizes = [int(line.split()[1]) for line in WHEEL_LIST.read_text().splitlines() if line and line[0] != "#"]
    assert sum(sizes) <= 30 * 2**20


def test_gpu_check_runs_on_cpu_with_the_tiny_model_where_only_the_gpu_machines_packages_exist(tmp_path):
    hidden = hidden_modules()
    assert {"ray", "fastapi", "uvicorn", "qdrant_client", "omegaconf"} <= hidden  # installed here, not there
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDER)
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
           "GPU_CHECK_HIDDEN": json.dumps(sorted(hidden)), "OMP_NUM_THREADS": "1"}
    probe = subprocess.run([sys.executable, "-c", "import fastapi"], env=env, capture_output=True, text=True)
    assert "No module named 'fastapi'" in probe.stderr  # the hiding works
    done = subprocess.run(["bash", "benchmarks/speed/gpu_check.sh", "--device", "cpu", "--model", "tiny",
                           "--rows", "8", "--new-tokens", "16", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result
    cpu = result["models"]["tiny"]["cpu"]
    assert result["ok"] and set(cpu) == {"rollout_fp32", "score_fp32", "engine_vs_update_logprobs_fp32",
                                         "logprobs_vs_cpu_fp32_bfloat16", "grpo_step", "warm_start_step"}
    assert cpu["rollout_fp32"]["tokens"] == 8 * 16  # EOS ignored: every row generates its full length
    assert cpu["engine_vs_update_logprobs_fp32"]["max_abs_delta"] < 1e-4  # the engine's numerics are the update's
    assert 0 < cpu["logprobs_vs_cpu_fp32_bfloat16"]["mean_abs_delta"] < 0.1
    step = cpu["grpo_step"]
    assert step["metrics_finite"] and step["max_weight_change"] > 0 and step["optimizer_steps"] == 1
    assert step["policy_version_after_push"] == 1 and step["generated_after_push"]
    assert cpu["warm_start_step"]["loss_finite"]
    assert re.search(r"unpacked \d+ carried wheel", done.stderr)
