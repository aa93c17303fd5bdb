"""Issue 46's learning acceptance: does the `openai` SDK agent, trained through the gateway with zero human data,
beat its own zero-shot start on held-out flights v2 tier-1 test tasks, and how does it compare with the in-loop
W+Q row on the same steps, seeds and tasks?

    .venv/bin/python benchmarks/science/gateway_learning.py                  # seeds 0,1,2 with SmolLM2 (hours)
    .venv/bin/python benchmarks/science/gateway_learning.py --eval-tasks 64  # reuses the committed W+Q rows
    .venv/bin/python benchmarks/science/gateway_learning.py --smoke          # the tiny model, 1 step (minutes)

Per seed:
- the gateway run: examples/agents/flights_openai.yaml through the launcher (a child process), its agent
  `examples/agents/openai_flights.py` unchanged, with RL on the kept synthetic tasks only
  (`agent.questioning.train_on_tasks: false`: the tasks file only seeds the exploration, no human label grades an
  RL episode), no experience (W+Q has none; `--with-experience` keeps the YAML's), `--steps` steps of
  `--tasks-per-step` tasks, and `trainer.eval` before and after training on the
  first `--eval-tasks` tasks of the test split (default all), k episodes each, every call sampled at
  `--temperature` (the gateway forces it on the agent's calls);
- the in-loop W+Q row: benchmarks/science/ablation.py's harness on its v2 protocol (examples/ablation/flights_v2.yaml:
  warm start on synthetic references, GRPO on synthetic tasks), with the same steps, tasks per step, seeds and
  evaluation (steps, tasks per step, k and temperature default to the protocol's). When these equal the frozen
  protocol's, the harness is the one `ablation.py --rows base,w_q` runs, so its committed results
  (benchmarks/results/ablation/flights_v2) are reused; otherwise a protocol derived from it is written beside the
  runs and its rows run there.

Then, paired per task on strict avg@k (a success needs a tool call whose result came back to the model), each task
the mean over the seeds, a 95% interval over tasks (`ablation_criteria.compare`): the gateway after training minus
its zero-shot start (the acceptance: interval above 0; the ablation's "adds" verdict beside it), the gateway minus
the in-loop W+Q row, W+Q minus its base model, and the two zero-shot starts. The raw JSON (every evaluation's
per-task outcomes) goes to `--out` after each seed, the same numbers as one JSON line at the end.
`--smoke`: the tiny model, one seed, 1 step, 2 tasks, k 2 (RL also on the tasks file, as a random model reaches no
synthetic task); it checks the pipeline, never the science.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, load_avg  # noqa: E402
from benchmarks.science.ablation import Harness, deep_merge, load_protocol, run_launcher  # noqa: E402
from benchmarks.science.ablation_common import per_task_metric, summary_evaluation  # noqa: E402
from benchmarks.science.ablation_criteria import adds_verdict, compare  # noqa: E402
from common.config import compose  # noqa: E402
from evolver_launcher.manifest import git_state  # noqa: E402
from trainer.summary import interval  # noqa: E402

AGENT_CONF = REPO / "examples" / "agents" / "flights_openai.yaml"
PROTOCOL = REPO / "examples" / "ablation" / "flights_v2.yaml"
FROZEN_RESULTS = REPO / "benchmarks" / "results" / "ablation" / "flights_v2"
FROZEN_RUNS = REPO / "runs" / "ablation" / "flights_v2"
IN_LOOP_ROW = "w_q"

# --smoke: the tiny model everywhere, short episodes, one thread per service.
SMOKE_GATEWAY: dict[str, Any] = {
    "launcher": {"threads": {"default": 1, "trainer": 1}, "restart": {"max_restarts": 0}},
    "llm_server": {"model": "tiny"},
    "task_manager": {"dedup": {"embeddings": False}},
    "trainer": {"model": "tiny", "rollout": {"n": 2}, "warm_start": {"epochs": 1},
                "agent": {"timeout_s": 120, "questioning": {"explore_tasks": 1, "explore_episodes": 1, "max_tasks": 2,
                                                            "train_on_tasks": True}}}}
SMOKE_IN_LOOP: dict[str, Any] = {
    "ablation": {"eval": {"concurrency": 8}, "curve": {"enabled": False}, "run_timeout_min": 10, "eval_threads": 1},
    "run": {"launcher": {"threads": {"default": 1, "trainer": 1}, "restart": {"max_restarts": 0},
                         "synthesis": {"episodes": 6}},
            "llm_server": {"model": "tiny"},
            "task_manager": {"curriculum": {"enabled": False}, "dedup": {"embeddings": False}},
            "trainer": {"model": "tiny", "rollout": {"n": 2, "max_turns": 2, "max_new_tokens": 8, "max_context": 4096},
                        "optim": {"lr": 1.0e-4, "minibatches": 1, "micro_batch_size": 2},
                        "warm_start": {"epochs": 1, "lr": 1.0e-3}}}}


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    frozen = load_protocol(PROTOCOL)
    trainer, evaluation = frozen.run["trainer"], frozen.ablation.eval
    parser = argparse.ArgumentParser(prog="benchmarks/science/gateway_learning.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; --smoke: 0)")
    parser.add_argument("--steps", type=int, default=None, help=f"RL steps of both rows (default {trainer['steps']})")
    parser.add_argument("--tasks-per-step", type=int, default=None,
                        help=f"tasks per step of both rows (default {trainer['tasks_per_step']})")
    parser.add_argument("--eval-tasks", type=int, default=None,
                        help=f"the first N test tasks (default all; {evaluation.tasks} reuses the committed W+Q rows)")
    parser.add_argument("--k", type=int, default=None, help=f"episodes per task (default {evaluation.k})")
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"the evaluations' sampling temperature (default {evaluation.temperature})")
    parser.add_argument("--with-experience", action="store_true", help=(
        "keep the agent YAML's experience for half of each group (default: none, as in the W+Q row)"))
    parser.add_argument("--after-warm-start", action="store_true",
                        help="also evaluate the gateway run between its warm start and RL (splits the change)")
    parser.add_argument("--run-timeout-min", type=float, default=360.0, help="one gateway run, evaluations included")
    parser.add_argument("--runs-dir", type=Path, default=None, help="default runs/gateway_learning[/smoke]")
    parser.add_argument("--out", type=Path, default=None, help=(
        "the raw JSON (default benchmarks/results/gateway_learning/flights_v2.json; --smoke: in --runs-dir)"))
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 1 step, 2 tasks, k 2, seed 0")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.seeds = [int(s) for s in (args.seeds or ("0" if smoke else "0,1,2")).split(",")]
    args.steps = args.steps or (1 if smoke else int(trainer["steps"]))
    args.tasks_per_step = args.tasks_per_step or (1 if smoke else int(trainer["tasks_per_step"]))
    args.k = args.k or (2 if smoke else evaluation.k)
    args.temperature = args.temperature if args.temperature is not None else evaluation.temperature
    args.eval_tasks = args.eval_tasks or (2 if smoke else len(test_task_ids()))
    args.runs_dir = (args.runs_dir or REPO / "runs" / "gateway_learning" / ("smoke" if smoke else "flights_v2")).resolve()
    args.out = args.out or (args.runs_dir / "result.json" if smoke else
                            REPO / "benchmarks" / "results" / "gateway_learning" / "flights_v2.json")
    return args


def test_task_ids() -> list[str]:
    """The test split of the environment the agent's YAML serves (flights v2, tier 1)."""
    from env_service.environments.flights.env import FlightsEnvironment

    flights = compose(AGENT_CONF)["env_service"]["environments"]["flights"]
    return FlightsEnvironment(flights).task_ids("test")


# ---------------------------------------------------------------------------------------------- the gateway run


def gateway_config(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """examples/agents/flights_openai.yaml with the seed, the steps, zero human data and the held-out evaluation."""
    cfg = compose(AGENT_CONF)
    if args.smoke:
        cfg = deep_merge(cfg, SMOKE_GATEWAY)
    launcher, trainer = cfg["launcher"], cfg["trainer"]
    launcher.update(experiment=f"gateway-seed{seed}", runs_dir=str(args.runs_dir))
    launcher.setdefault("studio", {})["enabled"] = False
    trainer.update(seed=seed, steps=args.steps, tasks_per_step=args.tasks_per_step)
    if not args.smoke:
        trainer["agent"]["questioning"]["train_on_tasks"] = False
    if not args.with_experience:  # W+Q's mechanisms: no experience (N) to compare with
        trainer["rollout"]["experience_ratio"] = 0.0
    # In an agent run rollout.temperature is the sampled evaluation's only: the agent samples its training
    # episodes as it asks (openai_flights asks for none: the server's default, 1.0).
    trainer["rollout"]["temperature"] = args.temperature
    trainer["eval"] = {"split": "test", "tasks": args.eval_tasks, "k": args.k, "greedy": False, "before": True,
                       "after": True, "after_warm_start": args.after_warm_start}
    return cfg


def gateway_run(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One gateway run through the launcher (a finished one is read again, not rerun) and its evaluations."""
    cfg = gateway_config(args, seed)
    run_dir = args.runs_dir / f"gateway-seed{seed}"
    out = run_dir / "trainer"
    conf, log = args.runs_dir / f"gateway-seed{seed}.yaml", args.runs_dir / f"gateway-seed{seed}.launcher.log"
    wall = None
    if not (out / "summary.json").is_file() or json.loads(conf.read_text() if conf.is_file() else "null") != cfg:
        shutil.rmtree(run_dir, ignore_errors=True)  # an agent run has no checkpoint to resume from: start again
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        conf.write_text(json.dumps(cfg, indent=1))  # JSON is YAML: the launcher reads it as the run's config
        started = time.monotonic()
        code = run_launcher(conf, log, args.run_timeout_min * 60)
        wall = round(time.monotonic() - started, 1)
        if code != 0 or not (out / "summary.json").is_file():
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            raise SystemExit(f"gateway_learning: the gateway run of seed {seed} ended with {code}; log {log}:\n{tail}")
    summary = json.loads((out / "summary.json").read_text())
    evaluations = {label: summary_evaluation(summary, label) for label in ("before", "warm_start", "after")
                   if label in (summary["eval"].get("per_task") or {})}
    agent = summary["agent"]
    return {"config": cfg, "summary": str(out / "summary.json"), "wall_s": wall,
            "eval_start": evaluations["before"], "eval_end": evaluations["after"],
            **({"eval_warm_start": evaluations["warm_start"]} if "warm_start" in evaluations else {}),
            "eval_report": agent.get("eval"), "table": summary["eval"]["rows"],
            "episodes": {k: agent.get(k) for k in ("episodes", "failed_episodes", "merged", "transitions",
                                                   "single_call", "merge_rate", "errors")},
            "questioning": ((summary.get("mechanisms") or {}).get("self_questioning") or {}).get("agent"),
            "warm_start": summary.get("warm_start"), "training": summary.get("training")}


# ---------------------------------------------------------------------------------------------- the in-loop row


def in_loop_harness(args: argparse.Namespace) -> Harness:
    """The ablation harness for the W+Q row on these steps, seeds and evaluation: the frozen protocol's own
    (reusing its committed results) when nothing differs, else one derived from it, written beside the runs."""
    raw = compose(PROTOCOL)
    derived = copy.deepcopy(raw)
    if args.smoke:
        derived = deep_merge(derived, SMOKE_IN_LOOP)
    derived["ablation"].update(seeds=args.seeds, rows=["base", IN_LOOP_ROW])
    derived["ablation"]["eval"].update(split="test", tasks=args.eval_tasks, k=args.k, temperature=args.temperature)
    derived["run"]["trainer"].update(steps=args.steps, tasks_per_step=args.tasks_per_step)
    same = derived["run"] == raw["run"] and all(
        derived["ablation"][key] == raw["ablation"][key] for key in raw["ablation"] if key not in ("seeds", "rows"))
    if same and set(args.seeds) <= set(raw["ablation"]["seeds"]):
        return Harness(PROTOCOL, load_protocol(PROTOCOL), FROZEN_RESULTS, FROZEN_RUNS, explore=False)
    path = args.runs_dir / "in_loop" / "protocol.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Derived by benchmarks/science/gateway_learning.py from {PROTOCOL.relative_to(REPO)}: the "
                    "W+Q row on the gateway run's steps, seeds and evaluation.\n" + yaml.safe_dump(derived, sort_keys=False))
    return Harness(path, load_protocol(path), args.runs_dir / "in_loop" / "results", args.runs_dir / "in_loop",
                   explore=False)


# ---------------------------------------------------------------------------------------------- the comparisons


def strict_level(evaluations: list[dict[str, Any]]) -> dict[str, float]:
    """Strict avg@k of one row: each task's mean over the seeds, a 95% interval over tasks."""
    per_seed = [per_task_metric(e, "avg", require_call=True) for e in evaluations]
    tasks = sorted(set.intersection(*(set(p) for p in per_seed)))
    return interval([sum(p[t] for p in per_seed) / len(per_seed) for t in tasks], (0.0, 1.0))


def comparisons(gateway: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
                in_loop: dict[int, dict[str, Any]], seeds_planned: int) -> dict[str, Any]:
    """The paired differences (`ablation_criteria.compare`, strict avg@k) and each row's level."""
    runs = {"gateway_start": {s: {"eval_end": g["eval_start"]} for s, g in gateway.items()},
            "gateway": {s: {"eval_end": g["eval_end"]} for s, g in gateway.items()},
            "base": base, IN_LOOP_ROW: {s: p for s, p in in_loop.items() if "failed" not in p}}
    acceptance = compare(runs, "gateway_start", "gateway")
    verdict = (adds_verdict(acceptance, acceptance["positive_seeds"], acceptance["detectable"],
                            max(0, seeds_planned - len(acceptance["seeds"]))) if acceptance else "missing")
    levels = {"gateway_start": [g["eval_start"] for g in gateway.values()],
              "gateway": [g["eval_end"] for g in gateway.values()],
              "base": [p["eval_start"] for p in base.values()],
              IN_LOOP_ROW: [p["eval_end"] for p in runs[IN_LOOP_ROW].values()]}
    return {
        "levels": {row: strict_level(evals) for row, evals in levels.items() if evals},
        # The acceptance: the gateway's agent after training minus its own zero-shot start (same prompts).
        "gateway_vs_its_start": {**(acceptance or {}), "ci_above_zero": bool(acceptance and acceptance["lo"] > 0),
                                 "verdict": verdict},
        # The two agents show a task in prompts of their own: paired by task, not by prompt.
        "gateway_vs_in_loop": compare(runs, IN_LOOP_ROW, "gateway", same_prompts=False),
        "in_loop_vs_base": compare(runs, "base", IN_LOOP_ROW),
        "zero_shot_gateway_vs_base": compare(runs, "base", "gateway_start", same_prompts=False),
        "failed_in_loop_runs": [{"seed": s, **p["failed"]} for s, p in in_loop.items() if "failed" in p]}


def _cell(d: dict[str, Any] | None) -> str:
    return "-" if not d or not d.get("n") else f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] (n {d['n']})"


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    harness = in_loop_harness(args)
    result: dict[str, Any] = {
        "benchmark": "gateway_learning", "smoke": args.smoke, "git": git_state(REPO), "load_avg_start": load_avg(),
        "settings": {"seeds": args.seeds, "steps": args.steps, "tasks_per_step": args.tasks_per_step,
                     "gateway_experience": args.with_experience,
                     "eval": {"split": "test", "tasks": args.eval_tasks, "k": args.k, "temperature": args.temperature},
                     "metric": f"strict avg@{args.k}: a success needs a tool call",
                     "in_loop_protocol": str(harness.protocol_path), "in_loop_results": str(harness.results_dir)},
        "seeds": {}}
    gateway: dict[int, dict[str, Any]] = {}
    base: dict[int, dict[str, Any]] = {}
    in_loop: dict[int, dict[str, Any]] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for seed in args.seeds:
            gateway[seed] = gateway_run(args, seed)
            base[seed] = harness.base(seed)
            in_loop[seed] = harness.row(IN_LOOP_ROW, seed)
            result["seeds"][str(seed)] = {"gateway": gateway[seed],
                                          "in_loop": str(harness.result_path(IN_LOOP_ROW, seed)),
                                          "base": str(harness.result_path("base", seed))}
            result["comparisons"] = comparisons(gateway, base, in_loop, len(args.seeds))
            result["load_avg_now"] = load_avg()
            args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")  # a stopped run keeps its seeds
            c = result["comparisons"]
            print(f"[gateway_learning] seed {seed}: gateway - its start {_cell(c['gateway_vs_its_start'])}; "
                  f"gateway - W+Q {_cell(c['gateway_vs_in_loop'])}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("gateway_learning: interrupted; the seeds done are in the raw JSON", file=sys.stderr)
        return 130
    finally:
        harness.close()
    c = result["comparisons"]
    print(json.dumps({"benchmark": "gateway_learning", "out": str(args.out), "smoke": args.smoke, "seeds": args.seeds,
                      "levels": c["levels"], "gateway_vs_its_start": {k: c["gateway_vs_its_start"].get(k) for k in (
                          "mean", "lo", "hi", "n", "seed_means", "ci_above_zero", "verdict")},
                      "gateway_vs_in_loop": {k: (c["gateway_vs_in_loop"] or {}).get(k) for k in (
                          "mean", "lo", "hi", "n", "seed_means")}}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
