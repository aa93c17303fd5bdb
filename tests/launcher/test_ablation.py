"""benchmarks/ablation.py end to end with the tiny model over the real launcher and services: the raw JSON,
paired statistics from it, a run interrupted and continued from its last checkpoint, the report, and an
evaluation that saw no experience and the same prompts before and after."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.ablation import ROWS, derive, load_protocol, paired, per_task_metric, success_lengths
from benchmarks.ablation_report import steps_to_target
from tests.helpers import REPO
from trainer.summary import interval

PROTOCOL = """
ablation:
  frozen: true
  seeds: [0]
  rows: [base, qn]
  eval: {split: test, tasks: 4, k: 2, temperature: 1.0, concurrency: 8}
  curve: {tasks: 2}
  run_timeout_min: 5
  eval_threads: 1
run:
  launcher:
    services: [llm_server, env_service, task_manager, experience_manager, judge]
    threads: {default: 1, trainer: 1}
    restart: {max_restarts: 0, trainer: false}
    ray: {enabled: false}
    synthesis: {episodes: 2, seed_experience: true}
  llm_server: {model: tiny}
  env_service: {environments: {flights: {}}}
  task_manager:
    environments: [flights]
    explore: {explorer: random}
    synthesis: {synthesizer: hindsight, max_goals: 2}
    dedup: {embeddings: false}
  experience_manager: {summary: {mode: heuristic}}
  judge: {llm: {base_url: llm_server}, retries: 0}
  trainer:
    model: tiny
    steps: 6                       # on a quiet machine a tiny step takes well under a second: room to interrupt
    tasks_per_step: 1
    progress: false
    tensorboard: false
    plot: false
    rollout: {env: flights, n: 2, max_turns: 2, max_new_tokens: 8, max_context: 1536, experience_ratio: 0.5}
    optim: {lr: 1.0e-4, minibatches: 1, micro_batch_size: 2}
    advantage: {estimator: adca_grpo}
"""


def harness(protocol: Path, tmp_path: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, str(REPO / "benchmarks" / "ablation.py"), "--protocol", str(protocol),
            "--results-dir", str(tmp_path / "results"), "--runs-dir", str(tmp_path / "runs"), *extra]
    log = (tmp_path / "harness.log").open("ab")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def test_rows_differ_only_in_their_mechanisms(tmp_path):
    (tmp_path / "p.yaml").write_text(PROTOCOL.replace("dedup: {embeddings: false}",
                                                      "dedup: {embeddings: false}\n    mixture: {pool_share: 0.3}"))
    protocol = load_protocol(tmp_path / "p.yaml")
    configs = {row: derive(protocol.run, row, 7, protocol.ablation, tmp_path) for row in ROWS if row != "base"}
    services = {row: set(c["launcher"]["services"]) for row, c in configs.items()}
    assert services["q"] == {"env_service", "task_manager"}
    assert services["qn"] == {"env_service", "task_manager", "experience_manager"}
    assert services["qa"] == {"env_service", "task_manager", "judge", "llm_server"}
    assert services["full"] == {"env_service", "task_manager", "experience_manager", "judge", "llm_server"}
    assert services["grpo"] == {"env_service"}
    for row in ("q", "qn", "qa", "full"):  # zero human data: synthetic tasks only
        # the pool's share is the same in every row, so they all train on the same synthetic tasks
        assert configs[row]["task_manager"]["mixture"] == {"synthetic_ratio": 1.0, "use_original": False,
                                                           "pool_share": 0.3}
    assert configs["grpo"]["trainer"]["train_split"] == "train" and configs["grpo"]["launcher"]["synthesis"] == {
        "episodes": 0, "seed_experience": False}
    # The pool is seeded from the synthetic tasks only where there is a pool.
    assert [configs[r]["launcher"]["synthesis"]["seed_experience"] for r in ("q", "qn", "qa", "full")] == [
        False, True, False, True]
    assert [configs[r]["trainer"]["advantage"]["estimator"] for r in ("q", "qn", "qa", "full", "grpo")] == [
        "grpo", "grpo", "adca_grpo", "adca_grpo", "grpo"]
    assert [configs[r]["trainer"]["rollout"]["experience_ratio"] for r in ("q", "qn", "qa", "full", "grpo")] == [
        0.0, 0.5, 0.0, 0.5, 0.0]
    for c in configs.values():  # the harness's fixed parts, the same in every row
        assert c["trainer"]["seed"] == 7 and c["trainer"]["checkpoint"]["every"] == 1 and c["launcher"]["resume"]
        assert c["trainer"]["eval"] == {"split": "validation", "tasks": 2, "k": 1, "greedy": True, "every": 1,
                                        "before": False, "after": True}
        assert c["trainer"]["optim"] == configs["full"]["trainer"]["optim"]


def test_a_protocol_without_every_mechanism_is_refused(tmp_path):
    (tmp_path / "p.yaml").write_text(PROTOCOL.replace("advantage: {estimator: adca_grpo}", "advantage: {}"))
    with pytest.raises(ValueError, match="adca_grpo"):
        load_protocol(tmp_path / "p.yaml")
    (tmp_path / "p.yaml").write_text(PROTOCOL.replace("experience_ratio: 0.5}", "experience_ratio: 0.5, top_p: 0.9}"))
    with pytest.raises(ValueError, match="top_p"):
        load_protocol(tmp_path / "p.yaml")


def test_paired_changes_and_steps_to_target_by_hand():
    before = {"per_task": {"a": [0.0, 0.0], "b": [1.0, 0.0], "c": [1.0, 1.0]}, "prompts": {"a": "1", "b": "2", "c": "3"}}
    after = {"per_task": {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0]}, "prompts": {"a": "1", "b": "2", "c": "3"}}
    assert paired(before, after, "avg") == [0.5, 0.5, -1.0]
    assert paired(before, after, "best") == [1.0, 0.0, -1.0]
    with pytest.raises(ValueError, match="prompts of 1 tasks differ"):
        paired(before, {**after, "prompts": {"a": "1", "b": "9", "c": "3"}}, "avg")
    curve = [{"step": 0, "avg@1": 0.25}, {"step": 1, "avg@1": 0.3}, {"step": 2, "avg@1": 0.35}, {"step": 3, "avg@1": 0.5}]
    assert steps_to_target({"train": {"curve": curve}}, 0.10) == 2
    assert steps_to_target({"train": {"curve": curve}}, 0.30) is None


@pytest.mark.slow
def test_ablation_end_to_end_interrupted_and_resumed(tmp_path, capsys):
    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(PROTOCOL)
    from benchmarks.ablation import main

    assert main(["--protocol", str(protocol)]) == 2  # test split: the protocol must be committed
    assert "commit" in capsys.readouterr().err

    checkpoints = tmp_path / "runs" / "qn-seed0" / "trainer" / "checkpoints"
    first = harness(protocol, tmp_path, "--allow-uncommitted")
    try:
        deadline = time.monotonic() + 240
        while not (checkpoints / "step_000001.pt").exists():
            assert first.poll() is None, (tmp_path / "harness.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.1)
        first.send_signal(signal.SIGTERM)  # the harness stops its launcher, which stops the services
        assert first.wait(timeout=120) == 130
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert not (tmp_path / "results" / "qn-seed0.json").exists()
    interrupted_at = sorted(p.name for p in checkpoints.glob("step_*.pt"))[-1]
    assert interrupted_at != "step_000006.pt", "the run must be interrupted before its last step"
    assert (tmp_path / "results" / "base-seed0.json").is_file()  # the start evaluation is kept, not redone

    second = harness(protocol, tmp_path, "--allow-uncommitted")
    assert second.wait(timeout=300) == 0, (tmp_path / "harness.log").read_text()[-4000:]
    launcher_log = (tmp_path / "runs" / "qn-seed0.launcher.log").read_text()
    assert f"resumed from {interrupted_at}" in launcher_log

    base = json.loads((tmp_path / "results" / "base-seed0.json").read_text())
    run = json.loads((tmp_path / "results" / "qn-seed0.json").read_text())
    assert run["git"]["commit"] and run["protocol"]["frozen"] is True and run["row"] == "qn"
    assert run["train"]["steps"] == 6 and run["train"]["resumes"] == 1
    assert [p["step"] for p in run["train"]["curve"]] == [0, 1, 2, 3, 4, 5, 6]
    assert run["train"]["curve"][0]["avg@1"] == base["curve_start"]["avg@1"]
    assert len(run["train"]["signal"]["grad_norm_per_step"]) == 6

    start, end = base["eval_start"], run["eval_end"]
    assert start["tasks"] == end["tasks"] == 4 and start["k"] == end["k"] == 2
    assert all(len(v) == 2 for v in end["per_task"].values())
    # Evaluated as it was at the start: the same prompts, no experience, the in-process policy (no grammar).
    assert start["prompts"] == end["prompts"] and len(set(end["prompts"])) == 4
    assert start["argv"] == end["argv"]
    assert start["experience_rollouts"] == end["experience_rollouts"] == 0
    # Training had experience: the pool seeded from the synthetic tasks (once: the resumed run does not seed
    # again), and injected rollouts.
    assert launcher_log.count("self-navigating seeded from self-questioning on flights") == 1
    assert "not seeded again from flights" in launcher_log
    assert run["train"]["mechanisms"]["self_navigating"]["injected_rollouts"] > 0
    assert "endpoint" not in end["policy"] and end["policy"]["step"] == 6
    # Paired per task, from the raw JSON alone.
    by_hand = [per_task_metric(end, "avg")[t] - per_task_metric(start, "avg")[t] for t in sorted(end["per_task"])]
    assert run["paired_vs_start"]["avg"] == interval(by_hand, (-1.0, 1.0))

    assert main(["--report", "--results-dir", str(tmp_path / "results")]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["rows"] == ["base", "qn"]
    text = (tmp_path / "results" / "REPORT.md").read_text()
    assert "| +Q&N | 1 |" in text and "| base | 1 |" in text
    assert "- base < +Q: not run" in text
    assert (tmp_path / "results" / "ablation.png").read_bytes()[:4] == b"\x89PNG"


def _raw(directory: Path, row: str, seed: int, per_task: dict[str, list[float]], curve: list[float] | None = None):
    """A raw result file as benchmarks/ablation.py writes it (only the fields the report reads)."""
    evaluation = {"per_task": per_task, "prompts": {t: f"p-{t}" for t in per_task}, "tasks": len(per_task), "k": 2}
    data = {"benchmark": "ablation", "row": row, "seed": seed, "git": {"commit": "c0ffee"},
            "protocol": {"sha256": "abc"}, "explore": False, "target_delta": 0.10,
            "eval_protocol": {"split": "test", "k": 2, "temperature": 0.7}}
    if row == "base":
        data["eval_start"] = evaluation
    else:
        data["eval_end"] = evaluation
        data["train"] = {"steps": len(curve) - 1, "wall_s": 600.0,
                         "curve": [{"step": i, "avg@1": v} for i, v in enumerate(curve)]}
    (directory / f"{row}-seed{seed}.json").write_text(json.dumps(data))


def test_report_pools_seeds_per_task_and_checks_the_ordering_by_hand(tmp_path):
    from benchmarks.ablation_report import summarize, write_report

    curve = [0.25, 0.3, 0.4]
    _raw(tmp_path, "base", 0, {"a": [0.0, 0.0], "b": [1.0, 0.0]})
    _raw(tmp_path, "base", 1, {"a": [0.0, 1.0], "b": [0.0, 0.0]})
    _raw(tmp_path, "q", 0, {"a": [1.0, 0.0], "b": [1.0, 1.0]}, curve)
    _raw(tmp_path, "q", 1, {"a": [1.0, 1.0], "b": [0.0, 0.0]}, curve)
    for row in ("qa", "full"):
        _raw(tmp_path, row, 0, {"a": [1.0, 1.0], "b": [1.0, 1.0]}, curve)
        _raw(tmp_path, row, 1, {"a": [0.0, 0.0], "b": [1.0, 1.0]}, curve)
    report = summarize(tmp_path)
    rows = {r["row"]: r for r in report["rows"]}
    # Seed means per task: base a 0.25 b 0.25; q a 0.75 b 0.5; full a 0.5 b 1.0.
    assert rows["base"]["avg_end"]["mean"] == 0.25 and rows["q"]["avg_end"]["mean"] == 0.625
    assert rows["full"]["avg_end"]["mean"] == 0.75
    half = 1.959964 * math.sqrt(((0.5 - 0.375) ** 2 + (0.25 - 0.375) ** 2) / 1) / math.sqrt(2)
    change = rows["q"]["avg_change"]  # per task +0.5 and +0.25
    assert change["mean"] == 0.375 and change["lo"] == pytest.approx(0.375 - half) and change["n"] == 2
    # best@2 seed means: base a 0.5 b 0.5; q a 1.0 b 0.5.
    assert rows["q"]["best_change"]["mean"] == 0.25
    assert rows["q"]["steps_to_target"] == {0: 2, 1: 2}  # 0.25 + 0.10 first reached at step 2 (0.4)
    ordering = {(o["lower"], o["higher"]): o for o in report["ordering"]}
    assert ordering[("base", "q")]["holds"] is True and ordering[("base", "q")]["ci_excludes_0"] is True
    assert ordering[("q", "qa")]["holds"] is True and ordering[("q", "qa")]["ci_excludes_0"] is False  # -0.25, +0.5
    assert ordering[("qa", "full")]["holds"] is False  # identical rows: difference 0
    assert ordering[("q", "qn")]["difference"] is None  # not run
    write_report(tmp_path)
    text = (tmp_path / "REPORT.md").read_text()
    assert "- +Q&A < full: difference +0.000 [+0.000, +0.000] (seeds both rows have: 0, 1): does NOT hold" in text
    assert "- +Q < +Q&N: not run" in text and "| +Q | 2 | 0.625" in text


def test_an_ordering_pairs_only_the_seeds_both_rows_have(tmp_path):
    from benchmarks.ablation_report import summarize, write_report

    curve = [0.0, 0.0]
    _raw(tmp_path, "base", 0, {"a": [0.0, 0.0], "b": [0.0, 0.0]})
    _raw(tmp_path, "base", 1, {"a": [0.0, 0.0], "b": [0.0, 0.0]})
    _raw(tmp_path, "qa", 0, {"a": [1.0, 1.0], "b": [0.0, 1.0]}, curve)  # seed means with seed 1: a 0.5, b 0.25
    _raw(tmp_path, "qa", 1, {"a": [0.0, 0.0], "b": [0.0, 0.0]}, curve)
    _raw(tmp_path, "full", 0, {"a": [0.0, 0.0], "b": [0.0, 0.0]}, curve)  # full has seed 0 only
    report = summarize(tmp_path)
    ordering = {(o["lower"], o["higher"]): o for o in report["ordering"]}
    # Against seed 0 of +Q&A alone (a 1.0, b 0.5), not its two-seed mean (a 0.5, b 0.25).
    difference = ordering[("qa", "full")]["difference"]
    assert difference["seeds"] == [0] and difference["mean"] == -0.75 and difference["n"] == 2
    write_report(tmp_path)
    assert "- +Q&A < full: difference -0.750" in (tmp_path / "REPORT.md").read_text()
    assert "(seeds both rows have: 0): does NOT hold" in (tmp_path / "REPORT.md").read_text()


def test_a_run_recorded_as_failed_is_listed_and_kept_out_of_the_numbers(tmp_path):
    from benchmarks.ablation_report import summarize, write_report

    _raw(tmp_path, "base", 0, {"a": [0.0, 0.0], "b": [0.0, 0.0]})
    _raw(tmp_path, "full", 0, {"a": [1.0, 0.0], "b": [0.0, 0.0]}, [0.0, 0.0])
    failed = {"benchmark": "ablation", "row": "full", "seed": 1,
              "failed": {"reason": "collapsed", "signal": "short_replies", "step": 7, "message": "collapsed: ..."}}
    (tmp_path / "full-seed1.json").write_text(json.dumps(failed))
    report = summarize(tmp_path)
    assert next(r for r in report["rows"] if r["row"] == "full")["seeds"] == [0]
    assert report["failed"] == [{"row": "full", "seed": 1, **failed["failed"]}]
    write_report(tmp_path)
    assert "- full seed 1: collapsed (short_replies at step 7)" in (tmp_path / "REPORT.md").read_text()


def test_successes_are_counted_by_episode_length():
    result = {"per_task": {"a": [1.0, 0.0, 1.0], "b": [0.0, 1.0, 1.0]},
              "per_task_steps": {"a": [1, 4, 2], "b": [3, 2, 2]}}
    assert success_lengths(result) == {"1": 1, "2": 3}  # a: lengths 1 and 2; b: 2 and 2
    assert success_lengths({"per_task": {"a": [1.0]}}) is None  # recorded before lengths existed


def test_single_value_regrading_rejects_hedges_by_hand():
    from benchmarks.ablation_report import single_value

    answers = {"test-t1-0000": "2500", "test-t1-0001": "P1003"}
    result = {"per_task": {"test-t1-0000": [1.0, 1.0, 0.0, 1.0], "test-t1-0001": [1.0, 0.0]},
              "replies": {"test-t1-0000": ["Grace has 2,500 USD.", "Hiro has 2, that is 2, 2,500.", "2,500",
                                           "$2500.00 of credit"],
                          "test-t1-0001": ["It is P1003 or P1004.", "P1003"]}}
    # Task 0: samples 1 and 4 state 2500 alone, sample 2 hedges, sample 3 failed in the environment: 2/4.
    # Task 1: sample 1 hedges, sample 2 failed in the environment: 0/2. Mean over tasks (0.5 + 0) / 2.
    assert single_value(result, answers) == 0.25
    assert single_value({"per_task": result["per_task"]}, answers) is None  # recorded before replies existed
    assert single_value({**result, "per_task": {**result["per_task"], "test-0000": [1.0]}}, answers) is None


def test_the_report_regrades_flights_replies_against_the_environments_answers(tmp_path):
    from benchmarks.ablation_report import flights_answers
    from env_service.environments.flights.env import FlightsEnvironment

    env = FlightsEnvironment({"tiers": [1]})
    ids = env.task_ids("test")[:3]
    runs = {"q": {0: {"config": {"env_service": {"environments": {"flights": {"tiers": [1]}}}},
                      "eval_end": {"per_task": {t: [1.0] for t in ids}}}}}
    assert flights_answers(runs) == {t: env.task(t).answer for t in ids}
    assert all(flights_answers(runs).values())
