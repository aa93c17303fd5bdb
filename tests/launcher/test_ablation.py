"""benchmarks/science/ablation.py end to end with the tiny model over the real launcher and services: the raw JSON,
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
import yaml

from benchmarks.science.ablation import ROWS, derive, load_protocol, paired, success_lengths
from benchmarks.science.ablation_common import ROWS_V2
from benchmarks.science.ablation_report import steps_to_target
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
    argv = [sys.executable, str(REPO / "benchmarks" / "science" / "ablation.py"), "--protocol", str(protocol),
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


def assert_refused(tmp_path: Path, text: str, match: str) -> None:
    """A protocol file with this text is refused by load_protocol with an error matching `match`."""
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(ValueError, match=match):
        load_protocol(tmp_path / "p.yaml")


def test_a_protocol_without_every_mechanism_is_refused(tmp_path):
    assert_refused(tmp_path, PROTOCOL.replace("advantage: {estimator: adca_grpo}", "advantage: {}"), "adca_grpo")
    assert_refused(tmp_path, PROTOCOL.replace("experience_ratio: 0.5}", "experience_ratio: 0.5, top_p: 0.9}"), "top_p")


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
def test_ablation_end_to_end_interrupted_and_resumed_with_a_shared_warm_start(tmp_path, capsys):
    """v2's rows base and w_qn (v1's rows run through the same Harness code; their derivation is tested above):
    the warm start computed once in the w row (trained first, for the seed) and loaded by w_qn, its synthetic tasks not made again, w_qn interrupted
    and continued from its last checkpoint, the strict metric, the report's criteria from the raw JSON."""
    from benchmarks.science.ablation import main
    from trainer.checkpoint import load_checkpoint
    from trainer.warm_start import weights_digest

    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(PROTOCOL_V2)
    assert main(["--protocol", str(protocol)]) == 2  # test split: the protocol must be committed
    assert "commit" in capsys.readouterr().err

    runs, results = tmp_path / "runs", tmp_path / "results"
    checkpoints = runs / "w_qn-seed0" / "trainer" / "checkpoints"
    first = harness(protocol, tmp_path, "--allow-uncommitted")
    try:
        deadline = time.monotonic() + 400
        while not (checkpoints / "step_000001.pt").exists():
            assert first.poll() is None, (tmp_path / "harness.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.1)
        first.send_signal(signal.SIGTERM)  # the harness stops its launcher, which stops the services
        assert first.wait(timeout=120) == 130
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert not (results / "w_qn-seed0.json").exists()
    interrupted_at = sorted(p.name for p in checkpoints.glob("step_*.pt"))[-1]
    assert interrupted_at != "step_000005.pt", "the run must be interrupted before its last step"
    assert (results / "base-seed0.json").is_file()  # the start evaluation is kept, not redone
    interrupted_for = float((runs / "w_qn-seed0.seconds").read_text())  # the interrupted invocation counts
    assert interrupted_for > 0

    second = harness(protocol, tmp_path, "--allow-uncommitted")
    assert second.wait(timeout=300) == 0, (tmp_path / "harness.log").read_text()[-4000:]
    w_log, log = (runs / "w-seed0.launcher.log").read_text(), (runs / "w_qn-seed0.launcher.log").read_text()
    assert f"resumed from {interrupted_at}" in log

    # The warm start: fine-tuned once, in the w row; w_qn loaded those weights (digest) and the same data.
    assert "warm start on" in w_log and "warm start on" not in log and "warm start loaded from" in log
    shared = runs / "w-seed0" / "trainer" / "checkpoints" / "step_000000.pt"
    w = json.loads((runs / "w-seed0" / "trainer" / "summary.json").read_text())
    run = json.loads((results / "w_qn-seed0.json").read_text())
    digest = weights_digest(load_checkpoint(shared)["model"])
    assert w["steps"] == 0 and w["warm_start"]["weights_sha256"] == digest and "from_checkpoint" not in w["warm_start"]
    assert run["warm_start"]["from_checkpoint"] == str(shared) and run["warm_start"]["weights_sha256"] == digest
    assert run["warm_start"]["task_ids"] == w["warm_start"]["task_ids"]
    # The synthetic tasks: w's store, not made again; the pool seeded from its held-apart share, once.
    assert "already in the store (resumed run)" in log and "exploring flights" not in log
    assert log.count("self-navigating seeded from self-questioning on flights") == 1
    assert "not seeded again from flights" in log
    assert run["train"]["mechanisms"]["self_navigating"]["injected_rollouts"] > 0

    base = json.loads((results / "base-seed0.json").read_text())
    assert run["git"]["commit"] and run["protocol"]["frozen"] is True and run["row"] == "w_qn"
    assert run["train"]["steps"] == 5 and run["train"]["resumes"] == 1
    assert run["train"]["wall_s"] > round(interrupted_for, 1)  # both invocations
    assert run["train"]["curve"] == [] and "curve_start" not in base  # curve.enabled: false
    assert len(run["train"]["signal"]["grad_norm_per_step"]) == 5
    # The rollout records (the interrupted launch may have written a step twice) agree with the trainer's counts.
    signal_, groups = run["train"]["signal"], run["rollouts"]["mixed_outcome_groups"]["all"]
    assert (groups["groups"], groups["mixed"]) == (signal_["groups"], signal_["mixed_outcome_groups"])
    assert run["rollouts"]["rollouts"] == 2 * signal_["groups"] and run["rollouts"]["steps"] == 5
    assert run["rollouts"]["room_to_act"] is None  # no judge in W+Q&N
    assert run["minutes"]["shared_warm_start"] > 0 and run["minutes"]["total"] > run["minutes"]["train"] > 0

    start, end = base["eval_start"], run["eval_end"]
    assert start["tasks"] == end["tasks"] == 2 and start["k"] == end["k"] == 2
    # Evaluated as it was at the start: the same prompts, no experience, the in-process policy (no grammar).
    assert start["prompts"] == end["prompts"] and start["argv"] == end["argv"]
    assert start["experience_rollouts"] == end["experience_rollouts"] == 0
    assert "endpoint" not in end["policy"] and end["policy"]["step"] == 5
    assert set(end["kinds"].values()) <= {"credit_lookup", "id_lookup", "fare_lookup"}
    # Paired per task, strict (a success needs a tool call), from the raw JSON alone.
    strict = {t: [float(s >= 1 and c) for s, c in zip(end["per_task"][t], end["per_task_called"][t], strict=True)]
              for t in end["per_task"]}
    before = {t: [float(s >= 1 and c) for s, c in zip(start["per_task"][t], start["per_task_called"][t], strict=True)]
              for t in start["per_task"]}
    by_hand = [sum(strict[t]) / 2 - sum(before[t]) / 2 for t in sorted(strict)]
    assert run["paired_vs_start"]["strict_avg"] == interval(by_hand, (-1.0, 1.0))

    assert main(["--report", "--results-dir", str(results)]) == 0
    printed = capsys.readouterr()
    line = json.loads(printed.out.strip().splitlines()[-1])
    assert line["rows"] == ["base", "w_qn"] and line["criteria"]["the loop"] == "missing"
    assert "[ablation] the loop: missing" in printed.err
    text = (results / "REPORT.md").read_text()
    assert "| self-questioning's references | W - base | - | - | - | **missing** |" in text and "| W+Q&N | 1 |" in text
    assert "| the loop | W+full - base | - | - | - | **missing** |" in text
    assert "7 comparisons, each at 95% with no correction" in text


def _raw(directory: Path, row: str, seed: int, per_task: dict[str, list[float]], curve: list[float] | None = None):
    """A raw result file as benchmarks/science/ablation.py writes it (only the fields the report reads)."""
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
    from benchmarks.science.ablation_report import summarize, write_report

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
    from benchmarks.science.ablation_report import summarize, write_report

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
    from benchmarks.science.ablation_report import summarize, write_report

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
    from benchmarks.science.ablation_report import single_value

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
    from benchmarks.science.ablation_report import flights_answers
    from env_service.environments.flights.env import FlightsEnvironment

    env = FlightsEnvironment({"tiers": [1]})
    ids = env.task_ids("test")[:3]
    runs = {"q": {0: {"config": {"env_service": {"environments": {"flights": {"tiers": [1]}}}},
                      "eval_end": {"per_task": {t: [1.0] for t in ids}}}}}
    assert flights_answers(runs) == {t: env.task(t).answer for t in ids}
    assert all(flights_answers(runs).values())


# ---------------------------------------------------------------------------------------------- v2

PROTOCOL_V2 = """
ablation:
  version: 2
  frozen: true
  seeds: [0]
  rows: [base, w_qn]               # w_qn trains the w row first (its warm start), unevaluated
  eval: {split: test, tasks: 2, k: 2, temperature: 1.0, concurrency: 8}
  curve: {enabled: false}
  run_timeout_min: 5
  eval_threads: 1
  without_warm_start: {trainer: {optim: {lr: 1.0e-3}}}
run:
  launcher:
    services: [llm_server, env_service, task_manager, experience_manager, judge]
    threads: {default: 1, trainer: 1}
    restart: {max_restarts: 0, trainer: false}
    ray: {enabled: false}
    synthesis: {episodes: 6, seed_experience: true}
  llm_server: {model: tiny}
  env_service: {environments: {flights: {version: 2, tiers: [1]}}}
  task_manager:
    environments: [flights]
    explore: {explorer: random}
    synthesis: {synthesizer: hindsight, kinds: [lookup], query_forms: [names]}
    mixture: {pool_share: 0.3}
    curriculum: {enabled: false}
    dedup: {embeddings: false}
  experience_manager: {summary: {mode: heuristic}}
  judge: {llm: {base_url: llm_server}, retries: 0}
  trainer:
    model: tiny
    steps: 5                       # room to interrupt w_qn between checkpoints (3 were done before a loaded
                                   # machine's SIGTERM landed)
    tasks_per_step: 1
    progress: false
    tensorboard: false
    plot: false
    rollout: {env: flights, n: 2, max_turns: 2, max_new_tokens: 8, max_context: 4096, experience_ratio: 0.5}
    optim: {lr: 1.0e-4, minibatches: 1, micro_batch_size: 2}
    advantage: {estimator: adca_grpo}
    warm_start: {enabled: true, epochs: 1, batch_size: 4, lr: 1.0e-3}
"""


def test_v2_rows_switch_on_what_their_table_says(tmp_path):
    (tmp_path / "p.yaml").write_text(PROTOCOL_V2)
    protocol = load_protocol(tmp_path / "p.yaml")
    shared = tmp_path / "w-seed3" / "trainer" / "checkpoints" / "step_000000.pt"
    configs = {row: derive(protocol.run, row, 3, protocol.ablation, tmp_path, shared) for row in ROWS_V2}

    def switched_on(c):
        t = c["trainer"]
        warm = t["warm_start"]
        return (warm["source"] if warm["enabled"] else None, "from w" if warm.get("from_checkpoint") else "-",
                t["steps"], "train" if t.get("train_split") == "train" else
                "synthetic" if t["tasks"]["synthetic_ratio"] == 1.0 == c["task_manager"]["mixture"]["synthetic_ratio"]
                else "?",
                t["rollout"]["experience_ratio"], c["launcher"]["synthesis"].get("seed_experience"),
                t["advantage"]["estimator"], t["optim"]["lr"], sorted(c["launcher"]["services"]))

    tm, em, judge = ["env_service", "task_manager"], ["experience_manager"], ["judge", "llm_server"]
    assert {row: switched_on(c) for row, c in configs.items()} == {  # checked by hand against the rows
        #         warm start     shared    RL  tasks        eta  seed pool  estimator    lr      services
        "w":      ("synthetic", "-",       0, "synthetic", 0.0, False, "grpo",      1e-4, sorted(tm)),
        "w_q":    ("synthetic", "from w",  5, "synthetic", 0.0, False, "grpo",      1e-4, sorted(tm)),
        "w_qn":   ("synthetic", "from w",  5, "synthetic", 0.5, True,  "grpo",      1e-4, sorted(tm + em)),
        "w_qa":   ("synthetic", "from w",  5, "synthetic", 0.0, False, "adca_grpo", 1e-4, sorted(tm + judge)),
        "w_full": ("synthetic", "from w",  5, "synthetic", 0.5, True,  "adca_grpo", 1e-4, sorted(tm + em + judge)),
        "full":   (None,        "-",       5, "synthetic", 0.5, True,  "adca_grpo", 1e-3, sorted(tm + em + judge)),
        "env_w":  ("environment", "-",     0, "train",     0.0, False, "grpo",      1e-4, ["env_service"]),
        "env_n":  (None,        "-",       5, "train",     0.5, False, "grpo",      1e-3,
                   ["env_service", "experience_manager"]),
    }
    assert configs["w_q"]["trainer"]["warm_start"]["from_checkpoint"] == str(shared)
    assert configs["env_n"]["launcher"]["synthesis"] == {"episodes": 0, "seed_experience": False}
    for c in configs.values():  # curve off: no in-run evaluation
        assert c["trainer"]["eval"]["every"] == 0 and c["trainer"]["eval"]["after"] is False
    assert_refused(tmp_path, PROTOCOL_V2.replace("rows: [base, w_qn]", "rows: [base, qn]"),
                   "not rows of ablation version 2")
    assert_refused(tmp_path, PROTOCOL_V2.replace("warm_start: {enabled: true,", "warm_start: {enabled: false,"),
                   "W\\+full row: enable the warm start")


def test_strict_metric_counts_a_success_without_a_tool_call_as_zero_by_hand():
    from benchmarks.science.ablation_common import per_task_metric as metric

    result = {"per_task": {"a": [1.0, 1.0, 0.0, 1.0], "b": [1.0, 0.0]},
              "per_task_called": {"a": [True, False, True, True], "b": [False, True]}}
    assert metric(result, "avg") == {"a": 0.75, "b": 0.5}
    assert metric(result, "avg", require_call=True) == {"a": 0.5, "b": 0.0}  # a's 2nd and b's 1st guessed
    assert metric(result, "best", require_call=True) == {"a": 1.0, "b": 0.0}
    with pytest.raises(ValueError, match="per_task_called"):
        metric({"per_task": result["per_task"]}, "avg", require_call=True)


def test_detectable_difference_and_verdicts_by_hand():
    from benchmarks.science.ablation_criteria import (
        SEEDS_PER_ROW,
        adds_verdict,
        close_verdict,
        detectable_difference,
        sample_sd,
    )

    assert sample_sd([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(5 / 3))
    # (z(0.975) + z(0.80)) * sd / sqrt(n) = (1.959964 + 0.841621) * 0.5 / 8
    assert detectable_difference(0.5, 64) == pytest.approx(2.801585 * 0.5 / 8, abs=1e-6)
    assert detectable_difference(0.5, 1) == math.inf
    assert adds_verdict({"mean": 0.2, "lo": 0.05, "seeds": [0, 1, 2]}, 2, 0.1) == "met"
    assert adds_verdict({"mean": 0.2, "lo": 0.05, "seeds": [0, 1, 2]}, 1, 0.1) == "not met"  # one of three positive
    assert adds_verdict({"mean": 0.2, "lo": 0.05, "seeds": [0]}, 1, 0.1, 2) == "too few seeds"  # a partial grid
    assert adds_verdict({"mean": 0.2, "lo": 0.05, "seeds": [0, 1]}, 1, 0.1, 1) == "too few seeds"  # seed 2 can be it
    assert adds_verdict({"mean": 0.2, "lo": 0.05, "seeds": [0, 1]}, 1, 0.1, 0) == "not met"  # seed 2 failed: settled
    assert adds_verdict({"mean": 0.2, "lo": 0.05, "seeds": [0, 1]}, 0, 0.1, 1) == "not met"  # 1 to run cannot make 2
    assert adds_verdict({"mean": 0.05, "lo": -0.02}, 2, 0.1) == "not detectable"
    assert adds_verdict({"mean": -0.3, "lo": -0.4}, 0, 0.1) == "not met"
    assert adds_verdict(None, 0, math.inf) == "missing"
    frozen = yaml.safe_load((REPO / "examples/ablation/flights_v2.yaml").read_text())
    assert len(frozen["ablation"]["seeds"]) == SEEDS_PER_ROW  # the seed rule's "of 3" is the protocol's count
    assert close_verdict({"mean": 0.0, "lo": -0.05}, 0.3) == "met"
    assert close_verdict({"mean": -0.3, "lo": -0.4}, 0.05) == "not met"
    assert close_verdict({"mean": -0.1, "lo": -0.4}, 0.2) == "not detectable"
    assert close_verdict(None, math.inf) == "missing"


def _raw_v2(directory: Path, row: str, seed: int, scores: dict[str, tuple[list[float], list[bool]]]):
    """A v2 raw result as benchmarks/science/ablation.py writes it (only the fields the report reads)."""
    evaluation = {"per_task": {t: s for t, (s, _) in scores.items()},
                  "per_task_called": {t: c for t, (_, c) in scores.items()},
                  "prompts": {t: f"p-{t}" for t in scores}, "tasks": len(scores), "k": 2, "seconds": 60.0,
                  "invalid_action_rate": 0.0, "kinds": {t: "credit" if t in "ab" else "fare" for t in scores}}
    data = {"benchmark": "ablation", "ablation_version": 2, "row": row, "seed": seed, "git": {"commit": "c0ffee"},
            "protocol": {"sha256": "abc"}, "explore": False, "target_delta": 0.10,
            "eval_protocol": {"split": "test", "k": 2, "temperature": 0.7}}
    if row == "base":
        data["eval_start"] = evaluation
    else:
        data["eval_end"] = evaluation
        data["train"] = {"steps": 0 if row == "w" else 4, "wall_s": 120.0, "curve": []}
        data["minutes"] = {"train": 2.0, "eval": 1.0, "total": 3.0, "shared_warm_start": None}
    (directory / f"{row}-seed{seed}.json").write_text(json.dumps(data))


def test_v2_criteria_by_hand_on_a_partial_grid_with_a_failed_run(tmp_path):
    from benchmarks.science.ablation_report import summarize, write_report

    yes, no = [True, True], [False, False]
    w = {"a": ([1.0, 1.0], yes), "b": ([1.0, 1.0], yes), "c": ([1.0, 1.0], [True, False]), "d": ([1.0, 0.0], yes)}
    for seed in (0, 1, 2):
        _raw_v2(tmp_path, "base", seed, {t: ([1.0, 0.0], no) for t in "abcd"})  # call-free guesses: strict 0
        _raw_v2(tmp_path, "w", seed, w)  # strict per task: a 1, b 1, c 0.5 (one guess), d 0.5
    _raw_v2(tmp_path, "w_q", 0, {**w, "a": ([1.0, 0.0], yes)})  # a 0.5: -0.5 on a
    _raw_v2(tmp_path, "w_q", 1, {**w, "d": ([1.0, 1.0], yes)})  # d 1.0: +0.5 on d
    (tmp_path / "w_q-seed2.json").write_text(json.dumps({"benchmark": "ablation", "row": "w_q", "seed": 2, "failed": {
        "reason": "collapsed", "signal": "invalid_action_rate", "step": 3, "message": "collapsed"}}))
    report = summarize(tmp_path)
    criteria = {c["name"]: c for c in report["criteria"]}
    # W - base per task: 1, 1, 0.5, 0.5 on every seed: mean 0.75, sd sqrt(0.25/3), n 4.
    sd = math.sqrt(0.25 / 3)
    w_base = criteria["self-questioning's references"]
    assert w_base["difference"]["mean"] == 0.75 and w_base["difference"]["positive_seeds"] == 3
    assert w_base["difference"]["lo"] == pytest.approx(0.75 - 1.959964 * sd / 2, abs=1e-6)
    assert w_base["difference"]["detectable"] == pytest.approx(2.801585 * sd / 2, abs=1e-6)
    assert w_base["verdict"] == "met"
    # W+Q - W over seeds 0 and 1 (seed 2 failed): per task -0.25, 0, 0, +0.25; seed means -0.125 and +0.125.
    rl = criteria["RL on synthetic tasks"]
    assert rl["difference"]["seeds"] == [0, 1] and rl["difference"]["mean"] == 0.0
    assert rl["difference"]["seed_means"] == {0: -0.125, 1: 0.125} and rl["difference"]["positive_seeds"] == 1
    assert rl["difference"]["detectable"] == pytest.approx(2.801585 * math.sqrt(0.125 / 3) / 2, abs=1e-6)
    assert rl["verdict"] == "not detectable" and rl["failed_runs"][0]["seed"] == 2
    assert criteria["the loop"]["verdict"] == "missing"
    assert criteria["self-questioning comes close to environment data"]["verdict"] == "missing"
    credit = report["per_kind"]["credit"]  # tasks a and b
    assert credit["tasks"] == 2 and credit["rows"]["w"]["mean"] == 1.0 and credit["rows"]["base"]["mean"] == 0.0
    assert report["per_kind"]["fare"]["criteria"]["self-questioning's references"]["mean"] == 0.5
    write_report(tmp_path)
    text = (tmp_path / "REPORT.md").read_text()
    assert "| self-questioning's references | W - base | +0.750 [" in text and "| 0, 1, 2 (3) |" in text
    assert "**not detectable**; W+Q seed 2 FAILED (invalid_action_rate)" in text
    assert "| the loop | W+full - base | - | - | - | **missing** |" in text
    assert "### Kind `credit` (2 tasks)" in text and "| W | 1.000 [1.000, 1.000] |" in text
    assert "| W+Q | 2 | " in text and "2.0 / 1.0 / 3.0" in text


def test_a_failed_run_settles_its_seed_for_the_seed_rule(tmp_path):
    from benchmarks.science.ablation_report import summarize

    yes, no = [True, True], [False, False]
    for seed in (0, 1, 2):
        _raw_v2(tmp_path, "base", seed, {t: ([0.0, 0.0], no) for t in "abcd"})
    _raw_v2(tmp_path, "w", 0, {t: ([1.0, 1.0], yes) for t in "abcd"})  # +1 on every task
    _raw_v2(tmp_path, "w", 1, {t: ([1.0, 1.0], no) for t in "abcd"})  # call-free guesses: strict 0, +0
    # W - base: per task (1 + 0) / 2 = 0.5, sd 0, so the CI is [0.5, 0.5]; 1 of 2 seeds positive.
    verdict = {c["name"]: c["verdict"] for c in summarize(tmp_path)["criteria"]}
    assert verdict["self-questioning's references"] == "too few seeds"  # seed 2 can still be the 2nd positive
    (tmp_path / "w-seed2.json").write_text(json.dumps({"benchmark": "ablation", "row": "w", "seed": 2, "failed": {
        "reason": "collapsed", "signal": "invalid_actions", "step": 3, "message": "collapsed"}}))
    verdict = {c["name"]: c["verdict"] for c in summarize(tmp_path)["criteria"]}
    assert verdict["self-questioning's references"] == "not met"  # seed 2 failed: never rerun, settled


@pytest.mark.slow
def test_env_n_pool_is_seeded_from_train_references_once_into_the_runs_store(tmp_path):
    from benchmarks.science.ablation import Harness

    (tmp_path / "p.yaml").write_text(PROTOCOL_V2.replace("  eval_threads: 1\n",
                                                         "  eval_threads: 1\n  env_pool: {per_kind: 1}\n"))
    harness_ = Harness(tmp_path / "p.yaml", load_protocol(tmp_path / "p.yaml"), tmp_path / "results",
                       tmp_path / "runs", explore=True)
    run_dir = harness_.run_dir("env_n", 0)
    try:
        report = harness_.seed_train_pool(run_dir)
    finally:
        harness_.close()
    # One train task of each tier-1 kind, replayed and summarized (probe 4's `--pool train`).
    assert report["kinds"] == {"credit_lookup": 1, "id_lookup": 1, "fare_lookup": 1} and report["sent"] == 3
    assert report["experiences_created"] > 0 and not report["errors"]
    assert harness_.seed_train_pool(run_dir) == report  # not seeded again (the launch resumes with it)

    assert any((run_dir / "experience_store").iterdir())  # the store the run's experience manager opens
