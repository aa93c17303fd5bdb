"""A validation probe of the self-evolving loop's setting (issue 14): does it give the trainer an outcome signal,
and does a short run move validation success without experience?

    .venv/bin/python benchmarks/science/loop_probe.py --name NAME [--version 1|2] [--tiers 1:3,2:1] [--seed-per-kind 4]
        [--demo-format python|tool_call] [--start-tasks 14 --start-n 4] [--steps 8 --tasks-per-step 4 --n 4
        --eta 0.5 --lr 1e-5 --temperature 1.0] [--eval-tasks 40] [--out benchmarks/results/ablation/flights/explore/probes]

1. Starts an env service (`flights: {tiers: ...}`) and an experience manager (heuristic summaries), and seeds
   the pool from **train-split** references: the first `--seed-per-kind` train tasks of every kind, their
   reference calls replayed over HTTP so the observations are real, closed by the reference reply, then
   summarized by the experience manager as it summarizes any rollout (it keeps the trajectory as the
   experience's demonstration). No validation or test task reaches the pool. `--demo-format` is how the
   calls are written in the replayed trajectory: `python` (`get_passenger(name='Ann')`, what the one-shot of
   issue 14 showed) or `tool_call` (the `<tool_call>` JSON blocks the task manager's seeding writes).
2. `start`: the first `--start-tasks` validation tasks, `--start-n` rollouts each at `--temperature`, every
   rollout given experience the way the trainer gives it (`inject: turns`, demonstrations fitted to the
   context): the success the trainer's experience-given rollouts start from, and the share of groups with
   mixed outcomes.
3. `train` (`--steps` > 0): `python -m trainer` against the same services: GRPO on the environment's own
   train split (the `grpo` row's task source), eta of each group given experience, checkpoint every step
   (a rerun resumes), greedy validation success **without experience** before and after on the first
   `--eval-tasks` validation tasks (`trainer.evaluate_policy`, as the ablation's curve).
Prints one JSON line and writes it to `<out>/<name>.json`; the trainer's own files stay in runs/probes/<name>.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, add_probe_arguments, emit, load_avg  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import yaml  # noqa: E402

from benchmarks.science.tiers import demonstration  # noqa: E402
from common.schemas import Task, Trajectory  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from tests.helpers import free_port, run_service  # noqa: E402
from trainer.peers import EnvPeer, ExperiencePeer  # noqa: E402


def tier_weights(text: str) -> dict[int, float]:
    """`1:3,2:1` -> {1: 3.0, 2: 1.0}; `1,2` -> equal shares."""
    weights = {}
    for part in text.split(","):
        tier, _, share = part.partition(":")
        weights[int(tier)] = float(share or 1)
    return weights


async def seed_pool(env: EnvPeer, flights: FlightsEnvironment, em_url: str, workspace: str, per_kind: int,
                    demo_format: str, obs_chars: int) -> dict[str, Any]:
    """Train-split references replayed and summarized into `workspace`; returns what was sent and made."""
    from experience_manager.client import ExperienceClient

    train_ids = await env.task_ids("flights", "train")
    chosen: dict[str, list[str]] = {}
    for task_id in train_ids:
        kind = flights.task(task_id).kind
        if len(chosen.setdefault(kind, [])) < per_kind:
            chosen[kind].append(task_id)
    trajectories = []
    for ids in chosen.values():
        for task_id in ids:
            assert task_id.startswith("train-"), task_id  # never a held-out task
            _, _, turns, messages = await demonstration(env, flights, task_id, obs_chars)
            if demo_format == "python":  # the replayed calls as the policy would write them
                messages = [messages[0], turns[0], *({"role": "assistant" if t["role"] == "assistant" else "tool",
                                                      "content": t["content"]} for t in turns[1:])]
            trajectories.append(Trajectory(task_id=task_id, env_type="flights", messages=messages, outcome=1.0,
                                           metadata={"query": flights.task(task_id).query,
                                                     "seeded_from": "train reference"}))
    async with ExperienceClient(em_url, timeout=600) as client:
        result = await client.summarize(workspace, trajectories, mode="heuristic")
        stats = await client.stats(workspace)
    return {"sent": len(trajectories), "kinds": {k: len(v) for k, v in chosen.items()},
            "experiences_created": len(result.created), "experiences_updated": len(result.updated),
            "errors": list(result.errors)[:5], "pool_active": stats.get("active")}


async def seed_pool_from_self_questioning(env_url: str, em_url: str, tmp: Path, workspace: str,
                                          flights: FlightsEnvironment, args: argparse.Namespace) -> dict[str, Any]:
    """The pool seeded as the product seeds it: a task manager explores the train split (`--pool-episodes`),
    synthesizes verified tasks, and sends their replayed references to the experience manager."""
    from collections import Counter

    from task_manager.client import TaskClient

    (tmp / "tm.yaml").write_text(yaml.safe_dump({"task_manager": {
        "env_url": env_url, "store_dir": str(tmp / "tm"), "environments": ["flights"], "experience_url": em_url,
        # The kinds and form the environment's own train tasks ask (never a held-out task's content).
        "synthesis": {"query_forms": args.query_forms.split(","), "kinds": ["lookup"], "lookup_kinds": "train"}}}))
    with run_service("task_manager", ["--conf", str(tmp / "tm.yaml"), "--log-level", "WARNING"], timeout=300) as tm:
        async with TaskClient(tm.url) as client:
            job = await client.submit_job("flights", episodes=args.pool_episodes, seed=args.seed)
            job = await client.wait_job(job.job_id, timeout=1200)
            seeding = await client.seed_experience("flights", workspace, limit=args.pool_limit)
            synthetic = (await client.list_tasks(env="flights", synthetic=True, limit=10_000)).tasks
    assert all(t.seed_task_id.startswith("train-") for t in synthetic)  # never a held-out task
    seeded = set(seeding.task_ids)
    task_kinds = {t.task_id: str(t.metadata.get("lookup") or t.metadata.get("kind")) for t in synthetic}
    kinds = Counter(task_kinds[t] for t in seeded if t in task_kinds)
    return {"source": "self-questioning", "synthesis": job.model_dump(mode="json", include={"status", "progress"}),
            "sent": seeding.sent, "kinds": dict(kinds), "seeding": seeding.model_dump(mode="json"),
            "task_kinds": task_kinds}


async def fit_report(env: EnvPeer, flights: FlightsEnvironment, args: argparse.Namespace) -> dict[str, Any]:
    """Per task kind: the first train task's replayed reference as a demonstration in front of the first
    validation task of that kind, and how it fits the context (SmolLM2's tokenizer, no model)."""
    from transformers import AutoTokenizer

    from engine.models import resolve_model_dir
    from trainer.templates import DemonstrationBudget, demonstration_turns, make_template

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir("smollm2")), local_files_only=True)
    first: dict[str, tuple[str, str]] = {}
    for split in ("train", "validation"):
        for task_id in await env.task_ids("flights", split):
            kind = flights.task(task_id).kind
            pair = first.setdefault(kind, ("", ""))
            if split == "train" and not pair[0]:
                first[kind] = (task_id, pair[1])
            elif split == "validation" and not pair[1]:
                first[kind] = (pair[0], task_id)
    report = {}
    for kind, (train_id, validation_id) in sorted(first.items()):
        _, _, turns, _ = await demonstration(env, flights, train_id, args.obs_chars)
        created = await env.create("flights", Task(task_id=validation_id, env_type="flights", split="validation"))
        await env.release(created.instance_id)
        chat = [{"role": m.role, "content": m.text()} for m in created.messages]
        budget = DemonstrationBudget(args.max_new_tokens, args.max_turns, args.obs_tokens)
        template = make_template("linear", tokenizer, args.max_context)
        template.start(chat, demonstration=turns)
        whole = len(template.generation_context())
        template = make_template("linear", tokenizer, args.max_context)
        template.start(chat, demonstration=turns, budget=budget)
        reserve = budget.reserve(demonstration_turns(turns), lambda text: len(tokenizer.encode(text)))
        report[kind] = {"prompt_tokens": len(template.prompt_plain), "with_demonstration_tokens": whole,
                        "reserve": reserve, "fit": template.demonstration_fit,
                        "shown_tokens": len(template.generation_context())}
    return report


def share_mixed(groups: list[list[float]]) -> float:
    return sum(len({o >= 1.0 for o in g}) > 1 for g in groups) / max(len(groups), 1)


async def start_phase(env: EnvPeer, flights: FlightsEnvironment, em_url: str, workspace: str,
                      args: argparse.Namespace) -> dict[str, Any]:
    """Validation tasks with experience on every rollout (the experience-given rollouts of the trainer)."""
    import torch

    from engine.models import load_model
    from trainer.policy import InProcessPolicy
    from trainer.rollout import GroupStats, collect_groups
    from trainer.settings import RolloutConfig

    ids = (await env.task_ids("flights", "validation"))[: args.start_tasks]
    tasks = [Task(task_id=t, env_type="flights", split="validation") for t in ids]
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2")
    policy = InProcessPolicy(model, tokenizer, max_batch=args.max_batch, threads=args.threads)
    config = RolloutConfig(env="flights", template="linear", n=args.start_n, max_turns=args.max_turns,
                           max_context=args.max_context, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, experience_ratio=1.0, concurrency=args.max_batch, retries=1)
    peer = ExperiencePeer(em_url, workspace)
    stats = GroupStats()
    started = time.monotonic()
    try:
        groups = await collect_groups(tasks, env, policy.generate, tokenizer, config, experience=peer, stats=stats,
                                      seed=args.seed, inject="turns",
                                      demonstration_observation_tokens=args.obs_tokens,
                                      on_rollout=lambda r: print(
                                          f"loop_probe: {r.trajectory.task_id} outcome {r.trajectory.outcome} "
                                          f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True))
    finally:
        await peer.aclose()
        await policy.aclose()
    outcomes = {g[0].trajectory.task_id: [float(r.trajectory.outcome or 0.0) for r in g] for g in groups}
    by_tier: dict[str, list[float]] = {}
    for task_id, values in outcomes.items():
        by_tier.setdefault(str(flights.task(task_id).tier), []).extend(v >= 1.0 for v in values)
    first = groups[0][0].trajectory if groups else None
    result = {"tasks": len(outcomes), "n": args.start_n, "temperature": args.temperature,
              "success": round(sum(v >= 1.0 for o in outcomes.values() for v in o)
                               / max(sum(map(len, outcomes.values())), 1), 3),
              "success_by_tier": {t: round(sum(v) / len(v), 3) for t, v in sorted(by_tier.items())},
              "mixed_group_share": round(share_mixed(list(outcomes.values())), 3),
              "turns_injected": stats.turns_injected, "demos_shortened": stats.demos_shortened,
              "demos_dropped": stats.demos_dropped, "text_fallbacks": stats.text_fallbacks,
              "retrievals": peer.counters.retrievals, "hits": peer.counters.hits,
              "seconds": round(time.monotonic() - started, 1),
              "example": {"query": flights.task(first.task_id).query if first else None,
                          "demonstrated": (groups[0][0].experience_demonstration or [{}])[0].get("content")
                          if first else None,
                          "actions": [s.action.text()[:160] for s in first.steps] if first else []}}
    del policy, model
    gc.collect()
    return result


def trainer_process(conf: Path, log_path: Path, timeout_s: float) -> tuple[int, float]:
    """`python -m trainer --conf CONF` as a child process logging to `log_path`: its exit code and seconds."""
    # MALLOC_ARENA_MAX: the trainer's peak resident memory on a shared machine (the OOM killer took 6.3 GB).
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
           "MALLOC_ARENA_MAX": "2"}
    started = time.monotonic()
    with log_path.open("ab") as log:
        code = subprocess.run([sys.executable, "-m", "trainer", "--conf", str(conf)], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
    return code, time.monotonic() - started


def train_phase(env_url: str, em_url: str, workspace: str, args: argparse.Namespace) -> dict[str, Any]:
    """`python -m trainer` (in-process, no Ray) against the running services; resumes from its checkpoint."""
    out = REPO / "runs" / "probes" / args.name
    conf = {"trainer": {
        "model": "smollm2", "seed": args.seed, "steps": args.steps, "tasks_per_step": args.tasks_per_step,
        "train_split": "train", "output_dir": str(out), "resume": True, "progress": False, "tensorboard": False,
        "plot": False, "torch_threads": args.threads,
        "policy": {"max_batch": args.max_batch},
        "rollout": {"env": "flights", "template": "linear", "n": args.n, "max_turns": args.max_turns,
                    "max_context": args.max_context, "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature, "experience_ratio": args.eta},
        "optim": {"lr": args.lr, "minibatches": args.minibatches, "micro_batch_size": args.micro_batch},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "clip_high_boosted": 0.6},
        "advantage": {"estimator": "grpo"},
        "experience": {"workspace": workspace, "inject": "turns", "summarize": args.summarize,
                       "feedback": True, "summarize_mode": "heuristic",
                       "demonstration_observation_tokens": args.obs_tokens},
        "eval": {"split": "validation", "tasks": args.eval_tasks, "k": 1, "greedy": True, "before": True,
                 "after": True, "every": 0},
        "checkpoint": {"every": 1, "keep": 1},
        "ray": {"enabled": False},
        "services": {"env_url": env_url, "experience_url": em_url if args.eta > 0 else None},
    }}
    out.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{args.name}.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    code, seconds = trainer_process(path, out.parent / f"{args.name}.log", args.train_timeout_min * 60)
    if code != 0 or not (out / "summary.json").is_file():
        failed = {"exit": code, "seconds": round(seconds, 1), "log": str(out.parent / f"{args.name}.log")}
        if (out / "summary.json").is_file():  # a collapse stop (exit 4) writes its summary: say which signal
            summary = json.loads((out / "summary.json").read_text())
            failed.update({k: summary.get(k) for k in ("status", "steps", "collapse")},
                          eval_before=(summary.get("eval") or {}).get("rows"))
        return failed
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {r["step"]: r for r in records if r.get("step", 0) > 0}
    keys = ("rollout/reward_mean", "train/grad_norm", "time/step_s")
    nav = (summary.get("mechanisms") or {}).get("self_navigating") or {}
    flights = FlightsEnvironment(env_config(args))
    return {"exit": code, "seconds": round(seconds, 1), "config": conf["trainer"], "eval": summary.get("eval"),
            "by_kind": by_kind(flights, (summary.get("eval") or {}).get("per_task") or {}),
            "training": summary.get("training"),
            "per_step": {s: {k: round(r[k], 4) for k in keys if k in r} for s, r in sorted(steps.items())},
            "self_navigating": {k: nav.get(k) for k in ("retrievals", "hits", "injected_rollouts", "turns_injected",
                                                         "text_fallbacks", "demonstrations_shortened",
                                                         "demonstrations_dropped")}}


async def demonstrations_shown(em_url: str, workspace: str, flights: FlightsEnvironment, run_dir: Path,
                               synthetic_kinds: dict[str, str]) -> dict[str, Any]:
    """Which demonstration kind every training rollout given experience was shown, against its task's kind."""
    from experience_manager.client import ExperienceClient

    async with ExperienceClient(em_url) as pool:
        experiences = await pool.list_experiences(workspace, limit=1000)

    def kind(task_id: str) -> str:  # a seeded synthetic task's kind is its lookup's (fare_lookup, ...)
        return synthetic_kinds[task_id] if task_id in synthetic_kinds else flights.task(task_id).kind
    provenance = {e.experience_id: sorted({kind(t) for t in e.provenance.task_ids}) for e in experiences}
    return count_demonstrations(run_dir / "rollouts" / "index.jsonl", flights, provenance)


def count_demonstrations(index: Path, flights: FlightsEnvironment,
                         provenance: dict[str, list[str]]) -> dict[str, Any]:
    """Counts per (task kind, shown kind) and the same-kind share. The shown demonstration is the index's
    `demonstration` (its kind label starts with the task kind); an older index without it names only the
    retrieved experiences, whose kinds are read from their provenance (an experience merged from several
    kinds is never same-kind)."""
    pairs: dict[str, int] = {}
    shown = same = 0
    for line in index.read_text().splitlines() if index.is_file() else []:
        entry = json.loads(line)
        if not entry["experience_flag"]:
            continue
        kind = flights.task(entry["task_id"]).kind
        if entry.get("demonstration"):
            demo = [str(entry["demonstration"]["kind"]).split(":")[0]]
        else:
            demo = [k for e in entry["experience_ids"][:1] for k in provenance.get(e, ["unknown"])]
        shown += 1
        same += int(demo == [kind])
        key = f"{kind} <- {'+'.join(demo) or 'none'}"
        pairs[key] = pairs.get(key, 0) + 1
    return {"rollouts_shown": shown, "same_kind": same, "same_kind_share": same / shown if shown else None,
            "pairs": dict(sorted(pairs.items()))}


def env_config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {"tiers": tier_weights(args.tiers)}
    if args.version != 1:
        config["version"] = args.version
    return config


def by_kind(flights: FlightsEnvironment, per_task: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Before and after per task kind: tasks solved (avg@k summed), episodes with a tool call, and the paired
    change with its 95% interval."""
    from trainer.summary import interval

    kinds: dict[str, dict[str, Any]] = {}
    before, after = (per_task.get(n, {}).get("outcomes", {}) for n in ("before", "after"))
    for task_id in sorted(set(before) | set(after)):
        row = kinds.setdefault(flights.task(task_id).kind, {"tasks": 0, "before": 0.0, "after": 0.0, "deltas": [],
                                                            "called_before": 0, "called_after": 0, "episodes": 0})
        row["tasks"] += 1
        rates = {n: sum(o >= 1.0 for o in v[task_id]) / len(v[task_id]) for n, v in (("before", before),
                                                                                    ("after", after)) if task_id in v}
        for name, rate in rates.items():
            row[name] += rate
            row[f"called_{name}"] += sum(per_task[name]["called"].get(task_id, []))
        row["episodes"] += len(after.get(task_id, before.get(task_id, [])))
        if len(rates) == 2:
            row["deltas"].append(rates["after"] - rates["before"])
    for row in kinds.values():
        row["delta"] = interval(row.pop("deltas"), (-1.0, 1.0))
    return kinds


async def run(args: argparse.Namespace) -> dict[str, Any]:
    flights = FlightsEnvironment(env_config(args))
    result: dict[str, Any] = {"benchmark": "loop_probe", "name": args.name, "split": "validation",
                              "env_config": {"tiers": args.tiers, "version": args.version}, "args": vars(args),
                              "load_avg_start": load_avg()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env.yaml").write_text(yaml.safe_dump({"env_service": {"environments": {"flights": env_config(args)}}}))
        (tmp / "em.yaml").write_text(yaml.safe_dump({"experience_manager": {"summary": {"mode": "heuristic"}}}))
        em_port = free_port()  # fixed first: the task manager seeds only the experience manager its config names
        with run_service("env_service", ["--conf", str(tmp / "env.yaml"), "--log-level", "WARNING"],
                         timeout=300) as env_service, \
                run_service("experience_manager", ["--store", str(tmp / "em"), "--conf", str(tmp / "em.yaml"),
                                                   "--log-level", "WARNING"], port=em_port, timeout=300) as em:
            env = EnvPeer(env_service.url)
            try:
                if args.pool == "synthetic":
                    result["seeding"] = await seed_pool_from_self_questioning(env_service.url, em.url, tmp, "probe",
                                                                              flights, args)
                else:
                    result["seeding"] = await seed_pool(env, flights, em.url, "probe", args.seed_per_kind,
                                                        args.demo_format, args.obs_chars)
                if args.fit_report:
                    result["fit"] = await fit_report(env, flights, args)
                if args.start_tasks:
                    result["start"] = await start_phase(env, flights, em.url, "probe", args)
                    print(f"loop_probe {args.name}: start {json.dumps(result['start'])[:400]}", file=sys.stderr,
                          flush=True)
            finally:
                await env.aclose()
            if args.steps:
                result["train"] = await asyncio.to_thread(train_phase, env_service.url, em.url, "probe", args)
                result["demonstrations_shown"] = await demonstrations_shown(
                    em.url, "probe", flights, REPO / "runs" / "probes" / args.name,
                    result["seeding"].get("task_kinds") or {})
    result["load_avg_end"] = load_avg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", type=int, default=1, choices=[1, 2], help="flights version (2: a world per task)")
    parser.add_argument("--tiers", default="1", help="flights tiers and shares, e.g. 1:3,2:1")
    parser.add_argument("--pool", choices=("train", "synthetic"), default="train",
                        help="seed the pool from train-split references, or from self-questioning's verified tasks")
    parser.add_argument("--pool-episodes", type=int, default=32, help="--pool synthetic: exploration episodes")
    parser.add_argument("--pool-limit", type=int, default=64, help="--pool synthetic: tasks seeded at most")
    parser.add_argument("--query-forms", default="names", help="--pool synthetic: the task manager's query forms")
    parser.add_argument("--seed-per-kind", type=int, default=4, help="train references per task kind in the pool")
    parser.add_argument("--demo-format", choices=("python", "tool_call"), default="python")
    parser.add_argument("--obs-chars", type=int, default=4000, help="characters of each replayed observation kept")
    parser.add_argument("--obs-tokens", type=int, default=96, help="demonstration_observation_tokens")
    parser.add_argument("--fit-report", action="store_true", help="how each kind's demonstration fits the context")
    parser.add_argument("--start-tasks", type=int, default=14)
    parser.add_argument("--start-n", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=2, help="samples per forward of the update (memory)")
    parser.add_argument("--summarize", action="store_true", help="also summarize the run's own rollouts into the pool")
    parser.add_argument("--temperature", type=float, default=1.0)
    add_probe_arguments(parser)
    parser.add_argument("--train-timeout-min", type=float, default=40)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ablation" / "flights" / "explore" /
                                             "probes"))
    args = parser.parse_args()
    # `timeout` or a SIGTERM unwinds the services' context managers instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    result = asyncio.run(run(args))
    emit(result, Path(args.out) / f"{args.name}.json")


if __name__ == "__main__":
    main()
