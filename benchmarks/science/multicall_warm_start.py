"""The warm start on multi-call references (issue 51 part 2): flights v2 tier-2/3 validation by kind, zero-shot,
W (self-questioned references) and Env-W (the environment's train references at the same budget).

    .venv/bin/python benchmarks/science/multicall_warm_start.py --name NAME [--model smollm2] [--episodes 64]
        [--eval-tasks 40] [--phases zero_shot,W,Env-W] [--explorer random] [--out benchmarks/results/warm_start]

1. Starts an env service (`flights: {version: 2, tiers: [2, 3]}`) and a task manager that writes multi-call
   tasks only (`synthesis.kinds: [multicall]`, `lookup_kinds: train`, the ids and names forms: the kinds and
   forms the train queries use) and serves references; runs one synthesize job of `--episodes` explorations
   and keeps its funnel per kind (proposed, verified, kept, reasons).
2. `zero_shot`: the first `--eval-tasks` validation tasks, greedy, one episode each, no experience.
3. `W`: from the model's own weights again, the warm start (`trainer.warm_start`) on the task manager's trainable
   synthetic tasks, each its verified reference replayed in a fresh instance (the calls as `<tool_call>` blocks,
   the observations the environment's own, the closing reply) and rendered turn by turn as the rollout renders
   an episode; then the same evaluation. `Env-W`: the same on the environment's own train references, as many
   tasks as W trained on (the same budget: tasks, epochs, batch, learning rate).
Prints one JSON line and writes it to `<out>/<name>.json`: the funnel, each warm start's data, and `table`:
validation kind -> tasks and successes per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import yaml  # noqa: E402

from benchmarks.harness import add_probe_arguments, greedy_rollouts, run_and_write, write_result  # noqa: E402
from common.schemas import Task  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402

PHASES = ("zero_shot", "W", "Env-W")
SOURCES = {"W": "synthetic", "Env-W": "environment"}


def env_config(args: argparse.Namespace) -> dict[str, Any]:
    return {"version": 2, "tiers": [2, 3],
            "splits": {"train": args.train_tasks, "validation": args.validation_tasks, "test": args.test_tasks}}


def task_manager_section(env_url: str, store: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {"task_manager": {
        "env_url": env_url, "store_dir": str(store), "environments": ["flights"], "serve_training_references": True,
        "dedup": {"embeddings": args.embeddings},
        "explore": {"explorer": args.explorer, "breadth_steps": args.breadth_steps, "depth_steps": args.depth_steps},
        "synthesis": {"synthesizer": "hindsight", "kinds": ["multicall"], "query_forms": ["ids", "names"],
                      "lookup_kinds": "train", "max_multicall": args.max_multicall},
        "mixture": {"synthetic_ratio": 1.0, "use_original": False}}}


def rollout_config(args: argparse.Namespace) -> Any:
    from trainer.settings import RolloutConfig

    return RolloutConfig(env="flights", template="linear", max_turns=args.max_turns, max_context=args.max_context,
                         max_new_tokens=args.max_new_tokens, concurrency=args.max_batch, retries=1)


async def evaluate(model: Any, tokenizer: Any, env: EnvPeer, kinds: dict[str, str], tasks: list[Task],
                   args: argparse.Namespace) -> dict[str, Any]:
    """Greedy, no experience: successes per validation kind, and each episode's actions (cut short)."""
    from trainer.rollout import made_tool_call

    summary, episodes = await greedy_rollouts(model, tokenizer, env, tasks, rollout_config(args), args)
    by_kind: dict[str, dict[str, int]] = {}
    rows = []
    for rollout in episodes:
        trajectory = rollout.trajectory
        kind = kinds[trajectory.task_id]
        success = float(trajectory.outcome or 0.0) >= 1.0
        counts = by_kind.setdefault(kind, {"tasks": 0, "success": 0, "with_call": 0})
        counts["tasks"] += 1
        counts["success"] += success
        counts["with_call"] += made_tool_call(trajectory.steps)
        rows.append({"task_id": trajectory.task_id, "kind": kind, "success": success, "steps": len(trajectory.steps),
                     "actions": [step.action.text()[:160] for step in trajectory.steps]})
    return {"tasks": len(rows), "success": sum(r["success"] for r in rows), "by_kind": by_kind,
            "invalid_action_rate": round(summary.invalid_action_rate, 3), "episodes": rows}


async def warm_started(phase: str, env: EnvPeer, tm_url: str, budget: int | None, kind_of: dict[str, str],
                       args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """The model fine-tuned by the warm start from the phase's source, and what it trained on (`kinds`: its
    solved tasks by kind, a synthetic task's from the task manager, a train task's from the environment)."""
    import torch

    from engine.models import load_model
    from task_manager.client import TaskClient
    from trainer.settings import WarmStartConfig
    from trainer.warm_start import fine_tune, gather, training_data

    settings = WarmStartConfig(enabled=True, source=SOURCES[phase],  # type: ignore[arg-type]
                               max_tasks=budget, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size)
    async with TaskClient(tm_url, timeout=900) as tasks:
        solved, source_report = await gather(settings, "flights", env, tasks)
    model, tokenizer = load_model(args.model)
    samples, data = training_data(solved, tokenizer, rollout_config(args))
    if not samples:
        raise SystemExit(f"{phase}: no solved task to warm-start on ({source_report}); explore more (--episodes)")
    kinds: dict[str, int] = {}
    for task_id in data["task_ids"]:
        kinds[kind_of.get(task_id, "unknown")] = kinds.get(kind_of.get(task_id, "unknown"), 0) + 1
    started = time.monotonic()
    trained = await asyncio.to_thread(fine_tune, model, samples, settings, torch.device("cpu"), args.seed)
    return model, tokenizer, {"source": SOURCES[phase], "settings": settings.model_dump(), **data, "kinds": kinds,
                              **trained,
                              "fine_tune_s": round(time.monotonic() - started, 1), "source_report": source_report}


def table(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Validation kind -> its task count and each evaluated phase's successes."""
    rows: dict[str, dict[str, int]] = {}
    for phase in PHASES:
        evaluation = result.get(phase, {}).get("eval") if phase != "zero_shot" else result.get("zero_shot")
        for kind, counts in ((evaluation or {}).get("by_kind") or {}).items():
            rows.setdefault(kind, {"tasks": counts["tasks"]})[phase] = counts["success"]
    return dict(sorted(rows.items()))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine.models import load_model
    from task_manager.client import TaskClient

    torch.set_num_threads(args.threads)
    config = env_config(args)
    flights = FlightsEnvironment(config)
    phases = [p for p in args.phases.split(",") if p]  # none: the funnel alone
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"--phases: unknown {', '.join(unknown)}; phases are {', '.join(PHASES)}")
    result: dict[str, Any] = {"benchmark": "multicall_warm_start", "name": args.name, "env_config": config,
                              "split": "validation", "greedy": True, "experience": False, "args": vars(args),
                              "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env.yaml").write_text(yaml.safe_dump({"env_service": {"environments": {"flights": config}}}))
        with run_service("env_service", ["--conf", str(tmp / "env.yaml"), "--log-level", "WARNING"],
                         timeout=300) as env_service:
            (tmp / "tm.yaml").write_text(yaml.safe_dump(task_manager_section(env_service.url, tmp / "tm", args)))
            with run_service("task_manager", ["--conf", str(tmp / "tm.yaml"), "--log-level", "WARNING"],
                             timeout=300) as tm:
                async with TaskClient(tm.url, timeout=900) as tasks:
                    started = time.monotonic()
                    job = await tasks.wait_job((await tasks.submit_job("flights", episodes=args.episodes,
                                                                       seed=args.seed)).job_id, timeout=3600)
                    stats = await tasks.stats()
                    synthetic = (await tasks.list_tasks(env="flights", synthetic=True, limit=10_000)).tasks
                kind_of = {t.task_id: str(t.metadata.get("task")) for t in synthetic}
                kind_of.update({t: flights.task(t).kind for t in flights.task_ids("train")})
                result["funnel"] = {"status": job.status, "error": job.error, "progress": job.progress,
                                    "by_kind": stats["funnel_by_kind"], "s": round(time.monotonic() - started, 1)}
                _say("funnel", result["funnel"]["by_kind"])
                env = EnvPeer(env_service.url, timeout=600)
                try:
                    ids = (await env.task_ids("flights", "validation"))[: args.eval_tasks]
                    kinds = {t: flights.task(t).kind for t in ids}
                    eval_tasks = [Task(task_id=t, env_type="flights", split="validation") for t in ids]
                    budget = args.synthetic_tasks
                    if "W" not in phases and budget is None:  # Env-W alone: W's budget, every trainable task
                        budget = sum(k.get("trainable", 0) for k in stats["funnel_by_kind"].values())
                    for phase in phases:
                        if phase == "zero_shot":
                            model, tokenizer = load_model(args.model)
                            result["zero_shot"] = await evaluate(model, tokenizer, env, kinds, eval_tasks, args)
                        else:
                            model, tokenizer, report = await warm_started(phase, env, tm.url, budget, kind_of, args)
                            budget = report["tasks"] if phase == "W" else budget  # Env-W: as many tasks as W
                            result[phase] = {"warm_start": report}
                            result[phase]["eval"] = await evaluate(model, tokenizer, env, kinds, eval_tasks, args)
                        result["table"] = table(result)
                        _say(phase, result["table"])
                        write_result(args, result)  # what is done so far survives a run cut short
                finally:
                    await env.aclose()
    result["load_avg_end"] = os.getloadavg()
    return result


def _say(what: str, value: Any) -> None:
    print(f"multicall_warm_start: {what} {json.dumps(value)[:800]} (load {os.getloadavg()[0]:.1f})", file=sys.stderr,
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny (a check that it runs) or an HF directory")
    parser.add_argument("--episodes", type=int, default=64, help="explorations of the synthesize job")
    parser.add_argument("--explorer", default="random", choices=["random", "llm"])
    parser.add_argument("--breadth-steps", type=int, default=6)
    parser.add_argument("--depth-steps", type=int, default=10)
    parser.add_argument("--max-multicall", type=int, default=4, help="synthesis.max_multicall")
    parser.add_argument("--embeddings", action="store_true", help="dedup by MiniLM cosine too")
    parser.add_argument("--synthetic-tasks", type=int, default=None,
                        help="W trains on at most this many of the trainable synthetic tasks (default: all)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"in this order, of {', '.join(PHASES)}; empty: the synthesis funnel alone")
    parser.add_argument("--train-tasks", type=int, default=240)
    parser.add_argument("--validation-tasks", type=int, default=40)
    parser.add_argument("--test-tasks", type=int, default=80)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--batch-size", type=int, default=4)
    add_probe_arguments(parser, max_batch=40)
    # multi-call episodes are longer than the probes' single lookups
    parser.set_defaults(max_turns=8, max_new_tokens=96, max_context=2048)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "warm_start"))
    run_and_write(parser, run)


if __name__ == "__main__":
    main()
