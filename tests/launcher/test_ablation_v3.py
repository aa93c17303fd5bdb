"""The v3 ablation protocol (examples/ablation/flights_v3.yaml): its rows, the per-run numbers read from a run's
rollout records (mixed-outcome groups and A's room to act, per kind), the forgetting evaluation on tier 1, and
the pilot's go/no-go through the harness's command line."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.science.ablation import Harness, derive, load_protocol
from benchmarks.science.ablation_common import ROWS_V3
from benchmarks.science.ablation_rollouts import rollout_stats
from tests.helpers import REPO

PROTOCOL_V3 = """
ablation:
  version: 3
  seeds: [0]
  rows: [base, w, w_q, w_qa, w_qg, w_qn, w_full]
  eval: {split: test, tasks: 3, k: 2, temperature: 1.0, concurrency: 8}
  curve: {enabled: false}
  run_timeout_min: 5
  eval_threads: 1
  forgetting: {tiers: [1], tasks: 2}
run:
  launcher:
    services: [llm_server, env_service, task_manager, experience_manager, judge]
    threads: {default: 1, trainer: 1}
    restart: {max_restarts: 0, trainer: false}
    ray: {enabled: false}
    synthesis: {episodes: 8, seed_experience: true}
  llm_server: {model: tiny}
  env_service: {environments: {flights: {version: 2, tiers: [2, 3]}}}
  task_manager:
    environments: [flights]
    explore: {explorer: random}
    synthesis: {synthesizer: hindsight, kinds: [multicall], lookup_kinds: train, query_forms: [ids, names]}
    dedup: {embeddings: false}
  experience_manager: {summary: {mode: heuristic}}
  judge: {labeller: reference_rule, llm: {base_url: llm_server}, retries: 0}
  trainer:
    model: tiny
    steps: 2
    tasks_per_step: 2
    progress: false
    tensorboard: false
    plot: false
    rollout: {env: flights, n: 2, max_turns: 3, max_new_tokens: 8, max_context: 4096, experience_ratio: 0.5}
    optim: {lr: 1.0e-4, minibatches: 1, micro_batch_size: 2}
    advantage: {estimator: adca_grpo}
    warm_start: {enabled: true, epochs: 1, batch_size: 4, lr: 1.0e-3}
"""


def test_v3_rows_of_the_committed_protocol_switch_on_what_their_table_says(tmp_path):
    protocol = load_protocol(REPO / "examples" / "ablation" / "flights_v3.yaml")
    assert protocol.ablation.version == 3 and not protocol.ablation.frozen and protocol.ablation.seeds == [0, 1, 2]
    assert protocol.ablation.forgetting.tiers == [1]
    shared = tmp_path / "w-seed0" / "trainer" / "checkpoints" / "step_000000.pt"
    configs = {row: derive(protocol.run, row, 0, protocol.ablation, tmp_path, shared) for row in ROWS_V3}

    def switched_on(c):
        t = c["trainer"]
        return (t["steps"], "from w" if t["warm_start"].get("from_checkpoint") else "-",
                t["rollout"]["experience_ratio"], t["advantage"]["estimator"], sorted(c["launcher"]["services"]))

    tm, em, judge = ["env_service", "task_manager"], ["experience_manager"], ["judge", "llm_server"]
    assert {row: switched_on(c) for row, c in configs.items()} == {  # checked by hand against the rows
        "w":      (0, "-",      0.0, "grpo",      sorted(tm)),
        "w_q":    (8, "from w", 0.0, "grpo",      sorted(tm)),
        "w_qa":   (8, "from w", 0.0, "adca_grpo", sorted(tm + judge)),
        "w_qg":   (8, "from w", 0.0, "gigpo",     sorted(tm)),  # judge-free step credit: no judge, no LLM
        "w_qn":   (8, "from w", 0.5, "grpo",      sorted(tm + em)),
        "w_full": (8, "from w", 0.5, "adca_grpo", sorted(tm + em + judge)),
    }
    for c in configs.values():  # multi-call tasks and rollouts long enough for them, in every row
        assert c["env_service"]["environments"]["flights"] == {"version": 2, "tiers": [2, 3]}
        assert c["task_manager"]["synthesis"]["kinds"] == ["multicall"]
        rollout = c["trainer"]["rollout"]
        assert (rollout["max_turns"], rollout["max_new_tokens"], rollout["max_context"]) == (8, 96, 2048)
    (tmp_path / "v2.yaml").write_text(PROTOCOL_V3.replace("version: 3", "version: 2").replace(
        "rows: [base, w, w_q, w_qa, w_qg, w_qn, w_full]", "rows: [base, w, w_q]"))
    with pytest.raises(ValueError, match="forgetting: only for ablation version 3"):
        load_protocol(tmp_path / "v2.yaml")


def _record(step: int, group: str, kind: str, outcome: float, labels: list[str] | None) -> dict:
    """A rollout record with the fields `trainer.records.rollout_record` writes that the counts read."""
    return {"step": step, "trajectory_id": f"{group}-{outcome}-{labels}", "group_id": group, "outcome": outcome,
            "task_kind": kind, "labels": None if labels is None else [
                {"step": i, "label": label, "reason": ""} for i, label in enumerate(labels)]}


def test_mixed_groups_and_room_to_act_per_kind_by_hand(tmp_path):
    cancel, book = "cancel_by_id:list_orders(passenger_id) > cancel_order(order_id):ids", "book_by_id:x:ids"
    shards = {
        "shard-000001.jsonl": [
            _record(1, "g1", cancel, 1.0, ["GOOD", "BAD"]),  # a BAD step in a success: against the outcome
            _record(1, "g1", cancel, 0.0, ["GOOD", "BAD"]),  # a GOOD step in a failure: against
            _record(1, "g2", book, 0.0, ["BAD"]),
            _record(1, "g2", book, 0.0, ["BAD", "BAD"]),
            _record(2, "g3", cancel, 1.0, ["GOOD"]),  # step 2's first writing, before an interruption: not kept
        ],
        "shard-000002.jsonl": [
            _record(2, "g3", cancel, 0.0, ["GOOD"]),
            _record(2, "g4", cancel, 1.0, ["GOOD"]),  # step 2 written again after the resume
            _record(2, "g4", cancel, 1.0, None),  # not labelled: counts for the groups, not for the room
        ],
    }
    for name, records in shards.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))

    stats = rollout_stats(tmp_path, {1: 2, 2: 1})
    assert stats["rollouts"] == 6 and stats["steps"] == 2 and stats["success_share"] == 3 / 6
    assert stats["groups_in_metrics"] == 3
    assert stats["mixed_outcome_groups"] == {
        "all": {"groups": 3, "mixed": 1, "share": 1 / 3},
        "book_by_id": {"groups": 1, "mixed": 0, "share": 0.0},
        "cancel_by_id": {"groups": 2, "mixed": 1, "share": 0.5}}
    assert stats["room_to_act"] == {  # labelled steps: g1 4, g2 3, g4 1
        "all": {"steps": 8, "against_outcome": 2, "share": 0.25},
        "book_by_id": {"steps": 3, "against_outcome": 0, "share": 0.0},
        "cancel_by_id": {"steps": 5, "against_outcome": 2, "share": 0.4}}
    # Without the step's group count both writings of step 2 count (g3 is mixed).
    assert rollout_stats(tmp_path)["mixed_outcome_groups"]["all"] == {"groups": 4, "mixed": 2, "share": 0.5}


def _evaluation(per_task: dict[str, tuple[list[float], list[bool]]], kinds: dict[str, str]) -> dict:
    return {"per_task": {t: s for t, (s, _) in per_task.items()}, "per_task_called": {t: c for t, (_, c) in
            per_task.items()}, "prompts": {t: f"p-{t}" for t in per_task}, "kinds": kinds, "tasks": len(per_task),
            "k": 2}


def test_pilot_go_no_go_by_hand_through_the_command_line(tmp_path, capsys):
    """The pilot's rows already written (the harness finds them and trains nothing): pilot.json and its lines."""
    kinds = {"t1": "cancel_by_id", "t2": "cancel_by_id", "t3": "book_by_id", "t4": "book_by_id", "t5": "rebook"}
    yes, no = [True, True], [False, False]
    w = {"t1": ([1.0, 1.0], yes), "t2": ([1.0, 0.0], yes), "t3": ([0.0, 0.0], yes),
         "t4": ([1.0, 1.0], [False, True]), "t5": ([0.0, 0.0], no)}  # strict: 1, .5, 0, .5 (one guess), 0
    w_q = {**w, "t2": ([1.0, 1.0], yes)}  # W+Q - W per task: 0, .5, 0, 0, 0
    results = tmp_path / "results"
    results.mkdir()
    raw = {
        "w": {"eval_end": _evaluation(w, kinds), "minutes": {"total": 10.0}},
        "w_q": {"eval_end": _evaluation(w_q, kinds), "minutes": {"total": 20.0}, "train": {"step_s": [60.0, 120.0]},
                "rollouts": {"mixed_outcome_groups": {"all": {"groups": 10, "mixed": 4, "share": 0.4},
                                                      "cancel_by_id": {"groups": 5, "mixed": 3, "share": 0.6},
                                                      "book_by_id": {"groups": 5, "mixed": 1, "share": 0.2}}}},
        "w_qa": {"eval_end": _evaluation(w_q, kinds), "minutes": {"total": 30.0},
                 "rollouts": {"room_to_act": {"all": {"share": 0.2}, "cancel_by_id": {"share": 0.4},
                                              "book_by_id": {"share": 0.05}}}},
    }
    for row, data in raw.items():
        unchanged = {"avg": {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 5}}  # printed by the harness, not read here
        (results / f"{row}-seed0.json").write_text(json.dumps({"row": row, "seed": 0, "paired_vs_start": unchanged,
                                                               **data}))
    protocol = tmp_path / "p.yaml"
    protocol.write_text(PROTOCOL_V3.replace("tasks: 3, k: 2", "tasks: 80, k: 2"))

    from benchmarks.science.ablation import main

    assert main(["--protocol", str(protocol), "--results-dir", str(results), "--runs-dir", str(tmp_path / "runs"),
                 "--pilot", "--rows", "w,w_q,w_qa"]) == 0
    printed = capsys.readouterr()
    pilot = json.loads((results / "pilot.json").read_text())
    assert json.loads(printed.out.strip().splitlines()[-1])["pilot"] == str(results / "pilot.json")
    assert pilot["explore"] is True and pilot["seed"] == 0 and pilot["rows"] == ["w", "w_q", "w_qa"]
    verdicts = {kind: (v["w_success"], v["mixed_share"], v["room_to_act"], v["verdict"])
                for kind, v in pilot["per_kind"].items()}
    assert verdicts == {
        "all": (0.4, 0.4, 0.2, "go"),
        "book_by_id": (0.25, 0.2, 0.05, "no-go"),  # too few mixed groups
        "cancel_by_id": (0.75, 0.6, 0.4, "go"),
        "rebook": (0.0, 0.0, None, "no-go"),  # W never succeeds and W+Q never trained on it
    }
    assert pilot["go_kinds"] == ["cancel_by_id"]
    sd = math.sqrt(0.05)  # differences 0, .5, 0, 0, 0: mean .1
    paired = pilot["w_q_minus_w"]
    assert paired["mean"] == pytest.approx(0.1) and paired["sd"] == pytest.approx(sd)
    assert paired["detectable"] == pytest.approx(2.801585 * sd / math.sqrt(5), abs=1e-6)
    assert paired["detectable_at_test_size"] == pytest.approx(2.801585 * sd / math.sqrt(80), abs=1e-6)
    assert pilot["minutes_per_step"] == 1.5
    assert pilot["minutes_per_seed_floor"] == 10.0 + 5 * 20.0  # W, then five RL rows at W+Q's minutes at least
    assert "book_by_id: 0.25 of 2 tasks, 0.20 of 5 groups, room 0.05 (no room) -> no-go" in printed.err
    assert "minutes: 1.50 per W+Q step" in printed.err and "minutes: at least 110.0 per seed" in printed.err

    # Before any evaluation: W+Q's training alone gives the mixed groups; W's success is still pending.
    from benchmarks.science.ablation_pilot import pilot_summary

    early = pilot_summary({}, 0, 80, ["base", "w", "w_q"], trained={
        "w_q": {"rollouts": raw["w_q"]["rollouts"], "step_s": [60.0]}})
    assert early["per_kind"]["cancel_by_id"] == {"w_success": None, "w_tasks": 0, "mixed_share": 0.6,
                                                 "mixed_groups": 5, "room_to_act": None, "verdict": "pending"}
    assert early["trained_only"] == ["w_q"] and early["minutes_per_step"] == 1.0 and early["w_q_minus_w"] is None


def test_the_pilot_is_v3s(tmp_path, capsys):
    from benchmarks.science.ablation import main

    (tmp_path / "v2.yaml").write_text(PROTOCOL_V3.replace("version: 3", "version: 2").replace(
        "rows: [base, w, w_q, w_qa, w_qg, w_qn, w_full]", "rows: [base, w, w_q]").replace(
        "  forgetting: {tiers: [1], tasks: 2}\n", ""))
    assert main(["--protocol", str(tmp_path / "v2.yaml"), "--pilot"]) == 2
    assert "--pilot is v3's go/no-go" in capsys.readouterr().err


@pytest.mark.slow
def test_the_forgetting_evaluation_runs_the_same_evaluation_on_tier_1(tmp_path):
    """The base row's evaluations with the tiny model: tiers 2-3 and, against an env service of its own, tier 1,
    with the same settings."""
    (tmp_path / "p.yaml").write_text(PROTOCOL_V3)
    harness = Harness(tmp_path / "p.yaml", load_protocol(tmp_path / "p.yaml"), tmp_path / "results",
                      tmp_path / "runs", explore=True)
    try:
        base = harness.base(0)
    finally:
        harness.close()
    start, forgetting = base["eval_start"], base["forgetting_start"]
    assert start["argv"] == forgetting["argv"][:5] + ["3"] + forgetting["argv"][6:]  # only --tasks differs
    assert start["tasks"] == 3 and forgetting["tasks"] == 2 and forgetting["k"] == 2
    assert set(start["kinds"].values()) <= {"book_by_id", "cancel_by_id", "book_cheapest", "book_constrained",
                                            "cancel", "rebook"}
    assert set(forgetting["kinds"].values()) <= {"credit_lookup", "id_lookup", "fare_lookup"}
    assert all(t.startswith("validation-t1-") for t in forgetting["per_task"])
    assert json.loads((tmp_path / "results" / "base-seed0.json").read_text())["forgetting_start"] == forgetting


def _raw_v3(directory, row: str, seed: int, values: dict[str, float], room: tuple[int, int] | None = None,
            forgetting: dict | None = None) -> None:
    """A v3 raw result as benchmarks/science/ablation.py writes it (only the fields the report reads); `values`:
    each task's strict avg@2 (every sample made a call), `room`: (labelled steps, against the outcome)."""
    scores = {t: [1.0] * round(2 * v) + [0.0] * (2 - round(2 * v)) for t, v in values.items()}
    evaluation = {"per_task": scores, "per_task_called": {t: [True, True] for t in scores},
                  "prompts": {t: f"p-{t}" for t in scores}, "tasks": len(scores), "k": 2, "seconds": 60.0,
                  "invalid_action_rate": 0.0, "kinds": {t: "cancel" if t in "ab" else "book" for t in scores}}
    data = {"benchmark": "ablation", "ablation_version": 3, "row": row, "seed": seed, "git": {"commit": "c0ffee"},
            "protocol": {"sha256": "abc"}, "explore": False, "target_delta": 0.10,
            "eval_protocol": {"split": "test", "k": 2, "temperature": 0.7}}
    if row == "base":
        data["eval_start"] = evaluation
    else:
        data["eval_end"] = evaluation
        data["train"] = {"steps": 0 if row == "w" else 8, "wall_s": 120.0, "curve": []}
        data["minutes"] = {"train": 2.0, "eval": 1.0, "total": 3.0, "shared_warm_start": None}
        data["rollouts"] = {"mixed_outcome_groups": {"all": {"groups": 16, "mixed": 8, "share": 0.5}},
                            "room_to_act": None if room is None else {
                                "all": {"steps": room[0], "against_outcome": room[1], "share": room[1] / room[0]}}}
        if forgetting is not None:
            data["forgetting"] = forgetting
    (directory / f"{row}-seed{seed}.json").write_text(json.dumps(data))


def test_v3_criteria_by_hand_with_the_better_of_a_and_n_and_no_room(tmp_path):
    from benchmarks.science.ablation_report import summarize, write_report

    tier1 = {"strict_avg": 0.5, "paired_vs_start": {"strict_avg": {"mean": -0.25, "lo": -0.5, "hi": 0.0, "n": 4}}}
    for seed in (0, 1, 2):
        _raw_v3(tmp_path, "base", seed, dict.fromkeys("abcd", 0.0))
        _raw_v3(tmp_path, "w_q", seed, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0})
        _raw_v3(tmp_path, "w_qg", seed, {"a": 0.5, "b": 0.5, "c": 0.0, "d": 0.0})
        _raw_v3(tmp_path, "w_qa", seed, {"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.0}, room=(100, 20), forgetting=tier1)
        _raw_v3(tmp_path, "w_qn", seed, {"a": 1.0, "b": 0.5, "c": 0.0, "d": 0.0})
        _raw_v3(tmp_path, "w_full", seed, {"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.5}, room=(100, 5))
    criteria = {c["name"]: c for c in summarize(tmp_path)["criteria"]}
    sd = 0.25  # A - Q per task .5, .5, .5, 0 and N - Q .5, 0, 0, 0: both sd sqrt(.1875 / 3)
    a_q = criteria["A (reference-rule attribution) over GRPO"]
    assert a_q["difference"]["mean"] == 0.375 and a_q["difference"]["sd"] == pytest.approx(sd)
    assert a_q["difference"]["lo"] == pytest.approx(0.375 - 1.959964 * sd / 2, abs=1e-6)
    assert (a_q["verdict"], a_q["room_to_act"]) == ("met", 0.2)
    assert criteria["A over G"]["verdict"] == "met"
    assert criteria["G (GiGPO's judge-free step credit) over GRPO"]["difference"]["mean"] == 0.0
    assert criteria["G (GiGPO's judge-free step credit) over GRPO"]["verdict"] == "not met"  # sd 0: detectable 0
    n_q = criteria["N (same-kind demonstrations) over GRPO"]
    assert n_q["difference"]["mean"] == 0.125 and n_q["verdict"] == "not detectable"  # under 2.80 * .25 / 2
    full = criteria["full over the better of A and N"]
    assert full["low"] == "w_qa"  # W+Q&A .625 beats W+Q&N .375
    assert full["difference"]["mean"] == 0.125 and (full["verdict"], full["room_to_act"]) == ("no room", 0.05)

    write_report(tmp_path)
    text = (tmp_path / "REPORT.md").read_text()
    assert "5 comparisons, each at 95% with no correction" in text
    assert "| full over the better of A and N | W+full - W+Q&A | +0.125 [" in text and "**no room** (room to act 0.05)" in text
    assert "| W+Q&G (GiGPO) | 3 |" in text  # v3's own row is in the tables
    assert "| W+Q&A | 0.50, 0.50, 0.50 | 0.20, 0.20, 0.20 | 0.500, -0.250 [-0.500, +0.000]; " in text
    assert "| W+Q | 0.50, 0.50, 0.50 | -, -, - | - |" in text
