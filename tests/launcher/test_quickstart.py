"""examples/quickstart.yaml is the ablation v2 protocol's W+full row (examples/ablation/flights_v2.yaml `run`)
plus what only a user-facing run decides. No model, no services: both files are composed and compared."""

from __future__ import annotations

from pathlib import Path

from common.config import compose
from evolver_launcher.plan import build_plan
from tests.helpers import REPO, config_drift
from trainer.config import TrainerConfig

QUICKSTART = REPO / "examples" / "quickstart.yaml"
PROTOCOL = REPO / "examples" / "ablation" / "flights_v2.yaml"
# What the quickstart decides for itself. Everything else (services, synthesis, environment, task manager,
# experience manager, judge and its labeller, rollout, optimiser, loss, advantage, experience, tasks, the warm
# start, the collapse stop) must be the protocol's. Ray is the user's: the protocol runs the trainer in-process,
# the quickstart shows the Ray dashboard. Its size (steps, evaluated tasks) may be smaller, within the bounds
# checked below; the seed is the protocol's first (its harness sets one per run).
USER_FACING = (
    "launcher.experiment",
    "launcher.ray",
    "launcher.studio",
    "trainer.tensorboard", "trainer.plot", "trainer.progress",
    "trainer.eval",
    "trainer.seed",
    "trainer.steps",
)
# Issue #14 point 7: the quickstart's paired comparison uses at least this many real test-split tasks.
MIN_EVAL_TASKS = 32


def protocol_run() -> dict:
    return compose(PROTOCOL)["run"]


def test_the_quickstart_runs_the_protocols_w_full_row():
    drift = config_drift(compose(QUICKSTART), protocol_run(), USER_FACING)
    assert drift == [], (f"examples/quickstart.yaml differs from examples/ablation/flights_v2.yaml `run` at {drift}: "
                         "change both files (only these may differ: " + ", ".join(USER_FACING) + ")")
    trainer = protocol_run()["trainer"]  # the row it is: a warm start on synthetic references, then the full loop
    assert trainer["warm_start"]["enabled"] is True and trainer["warm_start"]["source"] == "synthetic"
    assert protocol_run()["judge"]["labeller"] == "reference_rule" and trainer["collapse"]["enabled"] is True


def test_the_quickstart_evaluates_as_the_protocol_does_and_shows_its_run():
    quickstart, ablation = compose(QUICKSTART), compose(PROTOCOL)["ablation"]
    trainer, protocol_eval = quickstart["trainer"], ablation["eval"]
    ev = trainer["eval"]
    assert (ev["split"], ev["k"]) == (protocol_eval["split"], protocol_eval["k"])
    # Small size: a prefix of the protocol's test tasks, and no more steps than the protocol trains.
    assert MIN_EVAL_TASKS <= ev["tasks"] <= protocol_eval["tasks"]
    assert 1 <= trainer["steps"] <= protocol_run()["trainer"]["steps"]
    assert ev["before"] is True and ev["after"] is True
    # The summary's three evaluations: before, after the warm start, after RL.
    planned = build_plan(compose(QUICKSTART), QUICKSTART, check_ports=False).data["trainer"]  # as the launcher runs it
    assert TrainerConfig.model_validate(planned).evaluates_after_warm_start
    # Sampled evaluation uses the rollout temperature: it must be the protocol's evaluation temperature.
    assert ev["greedy"] is False and trainer["rollout"]["temperature"] == protocol_eval["temperature"]
    assert trainer["seed"] == ablation["seeds"][0]
    launcher = quickstart["launcher"]
    assert launcher["experiment"] == "quickstart"
    assert launcher["ray"]["enabled"] is True
    assert launcher["ray"]["dashboard"] is True and launcher["ray"]["dashboard_port"] == 8265
    assert launcher["studio"]["enabled"] is True


def test_the_drift_check_fails_when_only_one_file_is_edited(tmp_path: Path):
    text = QUICKSTART.read_text()
    assert text.count("labeller: reference_rule") == 1 and text.count("kl_coef: 0.05") == 1
    edited = tmp_path / "quickstart.yaml"
    edited.write_text(text.replace("labeller: reference_rule", "labeller: llm").replace("kl_coef: 0.05", "kl_coef: 0.0"))
    assert config_drift(compose(edited), protocol_run(), USER_FACING) == ["judge.labeller", "trainer.loss.kl_coef"]

    run = protocol_run()
    run["task_manager"]["mixture"]["pool_share"] = 0.5           # the protocol changed, the quickstart did not
    run["launcher"]["synthesis"]["timeout_s"] = 600              # a key only the protocol sets
    del run["trainer"]["policy"]                                 # a key only the quickstart sets
    assert config_drift(compose(QUICKSTART), run, USER_FACING) == [
        "launcher.synthesis.timeout_s", "task_manager.mixture.pool_share", "trainer.policy.max_batch"]

    run = protocol_run()
    run["trainer"]["warm_start"]["enabled"] = False              # the row without W is not the quickstart's
    assert config_drift(compose(QUICKSTART), run, USER_FACING) == ["trainer.warm_start.enabled"]

    run = protocol_run()
    run["launcher"]["studio"] = {"enabled": False}               # user-facing: allowed to differ
    run["launcher"]["ray"] = {"enabled": True, "num_cpus": 16}
    run["trainer"]["eval"] = {"split": "validation"}
    assert config_drift(compose(QUICKSTART), run, USER_FACING) == []
