"""`trainer.warm_start` measured (issue 35 part 7): SmolLM2 on flights tier-1 validation, greedy, no experience,
zero-shot and after a warm start from each source.

    .venv/bin/python benchmarks/science/warm_start.py --name NAME [--version 2] [--episodes 48] [--env-tasks 90] [--eval-tasks 40]
        [--phases zero_shot,synthetic,environment] [--lookup-kinds profile|train] [--out benchmarks/results/warm_start]

1. Starts an env service (`flights: {tiers: [1], version: V}`) and a task manager configured like the quickstart's
   (random explorer, hindsight lookups in the ids and names forms, `pool_share` 0.3) that serves references,
   and runs one synthesize job of `--episodes` explorations.
2. `zero_shot`: the first `--eval-tasks` validation tasks, greedy, one episode each (`trainer.evaluate_policy`,
   as the trainer's evaluation).
3. For each source, from SmolLM2's own weights again: the warm start's data (`synthetic`: the task manager's
   trainable synthetic tasks over POST /v1/references; `environment`: the first `--env-tasks` train tasks'
   references over the env service), rendered by the linear template, fine-tuned with the warm start's
   defaults (AdamW, lr 3e-5 cosine, batch 4, 2 epochs), then the same evaluation.
Per evaluation: success by task kind, and the share of episodes that made at least one tool call (and of
successes that did). Prints one JSON line and writes it to `<out>/<name>.json`.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import (  # noqa: E402
    REPO,
    add_probe_arguments,
    greedy_rollouts,
    load_1m,
    load_avg,
    run_and_write,
    write_result,
)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import yaml  # noqa: E402

from common.schemas import Task  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402


def task_manager_section(env_url: str, store: Path, lookup_kinds: str = "profile") -> dict[str, Any]:
    return {"task_manager": {
        "env_url": env_url, "store_dir": str(store), "environments": ["flights"], "serve_training_references": True,
        "explore": {"explorer": "random", "breadth_steps": 6, "depth_steps": 8},
        "synthesis": {"synthesizer": "hindsight", "kinds": ["lookup"], "query_forms": ["ids", "names"],
                      "lookup_kinds": lookup_kinds},
        "mixture": {"synthetic_ratio": 1.0, "use_original": False, "pool_share": 0.3},
        "curriculum": {"by_kind": True}}}


async def evaluate(model: Any, tokenizer: Any, env: EnvPeer, flights: FlightsEnvironment, tasks: list[Task],
                   args: argparse.Namespace) -> dict[str, Any]:
    """Greedy, no experience: success by kind and the share of episodes with a tool call."""
    from trainer.rollout import made_tool_call
    from trainer.settings import RolloutConfig

    config = RolloutConfig(env="flights", template="linear", max_turns=args.max_turns, max_context=args.max_context,
                           max_new_tokens=args.max_new_tokens, concurrency=args.max_batch, retries=1)
    summary, episodes = await greedy_rollouts(model, tokenizer, env, tasks, config, args)
    by_kind: dict[str, dict[str, int]] = {}
    rows = []
    for rollout in episodes:
        trajectory = rollout.trajectory
        kind = flights.task(trajectory.task_id).kind
        called = made_tool_call(trajectory.steps)
        success = float(trajectory.outcome or 0.0) >= 1.0
        counts = by_kind.setdefault(kind, {"tasks": 0, "success": 0, "with_call": 0, "success_with_call": 0})
        counts["tasks"] += 1
        counts["success"] += success
        counts["with_call"] += called
        counts["success_with_call"] += success and called
        rows.append({"task_id": trajectory.task_id, "kind": kind, "success": success, "called": called,
                     "steps": len(trajectory.steps),
                     "actions": [step.action.text()[:200] for step in trajectory.steps]})
    total = {key: sum(c[key] for c in by_kind.values()) for key in ("tasks", "success", "with_call",
                                                                       "success_with_call")}
    return {"tasks": total["tasks"], "success": total["success"], "success_with_call": total["success_with_call"],
            "tool_call_share": round(total["with_call"] / max(total["tasks"], 1), 3), "by_kind": by_kind,
            "invalid_action_rate": round(summary.invalid_action_rate, 3), "episodes": rows}


async def warm_started(source: str, env: EnvPeer, tm_url: str, args: argparse.Namespace
                       ) -> tuple[Any, Any, dict[str, Any]]:
    """SmolLM2 fine-tuned by the warm start from `source`, and its report."""
    import torch

    from engine.models import load_model
    from task_manager.client import TaskClient
    from trainer.settings import RolloutConfig, WarmStartConfig
    from trainer.warm_start import fine_tune, gather, training_data

    settings = WarmStartConfig(enabled=True, source=source,  # type: ignore[arg-type]
                               max_tasks=args.env_tasks if source == "environment" else args.synthetic_tasks)
    rollout = RolloutConfig(env="flights", template="linear", max_turns=args.max_turns, max_context=args.max_context,
                            max_new_tokens=args.max_new_tokens)
    async with TaskClient(tm_url, timeout=900) as tasks:
        solved, source_report = await gather(settings, "flights", env, tasks)
    model, tokenizer = load_model("smollm2")
    samples, data = training_data(solved, tokenizer, rollout)
    _say(args, f"{source} data", {**data, "source_report": source_report})
    started = time.monotonic()
    trained = await asyncio.to_thread(fine_tune, model, samples, settings, torch.device("cpu"), args.seed)
    kinds: dict[str, int] = {}
    for task in solved:
        if task.task_id in data["task_ids"]:
            kind = _kind_of(task)
            kinds[kind] = kinds.get(kind, 0) + 1
    report = {"source": source, "settings": settings.model_dump(), **data, "kinds": kinds, **trained,
              "fine_tune_s": round(time.monotonic() - started, 1), "source_report": source_report}
    return model, tokenizer, report


def _kind_of(task: Any) -> str:
    """The data's kind by the tool its first call names (a synthetic task has no flights kind)."""
    first = task.steps[0][0] if task.steps else ""
    for name in ("get_passenger", "search_flight", "list_orders", "book_ticket", "cancel_order"):
        if name in first:
            return name
    return "no_call"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine.models import load_model
    from task_manager.client import TaskClient

    torch.set_num_threads(args.threads)
    env_config = {"tiers": [1], "version": args.version}
    flights = FlightsEnvironment(env_config)
    result: dict[str, Any] = {"benchmark": "warm_start", "name": args.name, "env_config": env_config, "split": "validation", "greedy": True,
                              "experience": False, "args": vars(args), "load_avg_start": load_avg()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env.yaml").write_text(yaml.safe_dump({"env_service": {"environments": {"flights": env_config}}}))
        with run_service("env_service", ["--conf", str(tmp / "env.yaml"), "--log-level", "WARNING"],
                         timeout=300) as env_service:
            (tmp / "tm.yaml").write_text(yaml.safe_dump(task_manager_section(env_service.url, tmp / "tm", args.lookup_kinds)))
            with run_service("task_manager", ["--conf", str(tmp / "tm.yaml"), "--log-level", "WARNING"],
                             timeout=300) as tm:
                async with TaskClient(tm.url, timeout=900) as tasks:
                    job = await tasks.wait_job((await tasks.submit_job("flights", episodes=args.episodes,
                                                                       seed=args.seed)).job_id, timeout=3600)
                    result["synthesis"] = {"status": job.status, "progress": job.progress,
                                           "stats": (await tasks.stats())["environments"]["flights"]}
                env = EnvPeer(env_service.url, timeout=600)
                try:
                    ids = (await env.task_ids("flights", "validation"))[: args.eval_tasks]
                    eval_tasks = [Task(task_id=t, env_type="flights", split="validation") for t in ids]
                    for phase in args.phases.split(","):
                        if phase == "zero_shot":
                            model, tokenizer = load_model("smollm2")
                            result["zero_shot"] = await evaluate(model, tokenizer, env, flights, eval_tasks, args)
                            _say(args, "zero_shot", result["zero_shot"])
                        else:
                            model, tokenizer, report = await warm_started(phase, env, tm.url, args)
                            _say(args, f"{phase} data", report)
                            result[phase] = {"warm_start": report}
                            write_result(args, result)
                            result[phase]["eval"] = await evaluate(model, tokenizer, env, flights, eval_tasks, args)
                            _say(args, phase, result[phase]["eval"])
                        write_result(args, result)  # what is done so far survives a run cut short
                finally:
                    await env.aclose()
    result["load_avg_end"] = load_avg()
    return result


def _say(args: argparse.Namespace, what: str, value: dict[str, Any]) -> None:
    short = {k: v for k, v in value.items() if k not in ("episodes", "task_ids")}
    print(f"warm_start {args.name}: {what} {json.dumps(short)[:600]} (load {load_1m():.1f})",
          file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", type=int, default=2, choices=[1, 2], help="flights version (2: a world per task)")
    parser.add_argument("--episodes", type=int, default=48, help="explorations of the synthesize job")
    parser.add_argument("--env-tasks", type=int, default=90, help="train references of the environment source")
    parser.add_argument("--synthetic-tasks", type=int, default=None,
                        help="at most this many of the trainable synthetic tasks (default: all)")
    parser.add_argument("--phases", default="zero_shot,synthetic,environment",
                        help="in this order: zero_shot, and the warm start sources (synthetic, environment)")
    parser.add_argument("--lookup-kinds", default="profile", choices=["profile", "train"],
                        help="synthesis.lookup_kinds (train: only the kinds and query forms the train tasks ask)")
    add_probe_arguments(parser, max_batch=40)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "warm_start"))
    run_and_write(parser, run)


if __name__ == "__main__":
    main()
