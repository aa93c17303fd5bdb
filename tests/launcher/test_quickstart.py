"""examples/quickstart.yaml is the ablation protocol's `full` row (examples/ablation/flights.yaml `run`) plus
what only a user-facing run decides. No model, no services: both files are composed and compared."""

from __future__ import annotations

from pathlib import Path

from common.config import compose
from tests.helpers import REPO, config_drift

QUICKSTART = REPO / "examples" / "quickstart.yaml"
PROTOCOL = REPO / "examples" / "ablation" / "flights.yaml"
# What the quickstart decides for itself. Everything else (services, synthesis, environment tiers, task
# manager, experience manager, judge, rollout, optimiser, loss, advantage, experience, tasks) must be the
# protocol's. Its size (steps, evaluated tasks) may be smaller, within the bounds checked below; the seed is
# the protocol's first (its harness sets one per run).
USER_FACING = (
    "launcher.experiment",
    "launcher.ray.dashboard", "launcher.ray.dashboard_port",
    "launcher.studio",
    "trainer.tensorboard", "trainer.progress",
    "trainer.eval",
    "trainer.seed",
    "trainer.steps",
)
# Issue #14 point 7: the quickstart's paired comparison uses at least this many real test-split tasks.
MIN_EVAL_TASKS = 32


def protocol_run() -> dict:
    return compose(PROTOCOL)["run"]


def test_the_quickstart_runs_the_protocols_full_row():
    drift = config_drift(compose(QUICKSTART), protocol_run(), USER_FACING)
    assert drift == [], (f"examples/quickstart.yaml differs from examples/ablation/flights.yaml `run` at {drift}: "
                         "change both files (only these may differ: " + ", ".join(USER_FACING) + ")")


def test_the_quickstart_evaluates_as_the_protocol_does_and_shows_its_run():
    quickstart, ablation = compose(QUICKSTART), compose(PROTOCOL)["ablation"]
    trainer, protocol_eval = quickstart["trainer"], ablation["eval"]
    ev = trainer["eval"]
    assert (ev["split"], ev["k"]) == (protocol_eval["split"], protocol_eval["k"])
    # Small size: a prefix of the protocol's test tasks, and no more steps than the protocol trains.
    assert MIN_EVAL_TASKS <= ev["tasks"] <= protocol_eval["tasks"]
    assert 1 <= trainer["steps"] <= protocol_run()["trainer"]["steps"]
    assert ev["before"] is True and ev["after"] is True
    # Sampled evaluation uses the rollout temperature: it must be the protocol's evaluation temperature.
    assert ev["greedy"] is False and trainer["rollout"]["temperature"] == protocol_eval["temperature"]
    assert trainer["seed"] == ablation["seeds"][0]
    launcher = quickstart["launcher"]
    assert launcher["experiment"] == "quickstart"
    assert launcher["ray"]["dashboard"] is True and launcher["ray"]["dashboard_port"] == 8265
    assert launcher["studio"]["enabled"] is True


def test_the_drift_check_fails_when_only_one_file_is_edited(tmp_path: Path):
    text = QUICKSTART.read_text()
    assert text.count("lr: 1.0e-4") == 1
    edited = tmp_path / "quickstart.yaml"
    edited.write_text(text.replace("lr: 1.0e-4", "lr: 3.0e-5"))
    assert config_drift(compose(edited), protocol_run(), USER_FACING) == ["trainer.optim.lr"]

    run = protocol_run()
    run["task_manager"]["mixture"]["pool_share"] = 0.5           # the protocol changed, the quickstart did not
    run["launcher"]["synthesis"]["timeout_s"] = 600              # a key only the protocol sets
    del run["trainer"]["policy"]                                 # a key only the quickstart sets
    assert config_drift(compose(QUICKSTART), run, USER_FACING) == [
        "launcher.synthesis.timeout_s", "task_manager.mixture.pool_share", "trainer.policy.max_batch"]

    run = protocol_run()
    run["launcher"]["studio"] = {"enabled": False}               # user-facing: allowed to differ
    run["trainer"]["eval"] = {"split": "validation"}
    assert config_drift(compose(QUICKSTART), run, USER_FACING) == []
