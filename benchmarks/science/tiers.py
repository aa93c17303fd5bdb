"""Where can SmolLM2 learn on flights? Its starting success per tier, zero-shot and with one demonstration.

    .venv/bin/python benchmarks/science/tiers.py [--version 1|2] [--tiers 1,2,3] [--tasks 0] [--max-turns 4] [--max-new-tokens 64]
        [--conditions zero_shot,one_case,one_demo] [--k 1 --temperature 0] [--out benchmarks/results/tiers-smollm2.json]

Starts `python -m env_service` with `flights: {version: ..., tiers: [...]}` and evaluates SmolLM2-135M-Instruct on the
validation split (the first `--tasks` ids, 0: all) through the trainer's own path (`trainer.rollout`:
context template, prompts, env create/step/evaluate over HTTP), without grammar. Conditions:
- `zero_shot`: `evaluate_policy`, no experience (what the trainer's evaluation does); greedy, or avg@k and
  best@k sampled at `--temperature`;
- `pool_turns` (greedy): the real self-navigating path in `inject: turns` mode. A task manager synthesizes
  tasks from its own exploration of the train split (`--pool-episodes`, `--query-forms`, `--synthesis-kinds`:
  `goal` hindsight goals, `lookup` questions answered in text), seeds an experience manager's pool from their
  replayed references (`POST /v1/seed_experience`), and each validation episode gets what the experience
  manager's retrieve route returns for its query: the top hit's demonstration as earlier chat turns (text
  when no hit has one, counted), eta = 1. Reported with it: which synthetic kind and form each validation
  task was shown, and how many successes had a demonstration stating the validation task's own answer (the
  train and held-out tasks share one world in v1, so a demonstration about the same passenger or route can
  carry it; in v2 every task has its own world);
- `one_case` / `one_demo` (greedy): the same episodes with one experience injected the way training injects
  it (`collect_groups`, eta = 1), made from a solved *train-split* task of the same kind, its reference
  calls replayed against the environment over HTTP so the observations are real (never a validation or
  test task). `one_case` is what the experience manager's heuristic summary stores for that trajectory
  (what pool seeding puts in the pool); `one_demo` is the trajectory itself as text, observations included.
Rollout sizes default to `examples/quickstart.yaml` (4 turns, 64 new tokens, 1536 tokens of context).
Prints one JSON line: success per tier and kind per condition, tool-call rate, the load average.
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
from benchmarks.harness import emit, load_1m  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import yaml  # noqa: E402

from common.schemas import ChatMessage, Task  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from env_service.environments.flights.tasks import ORDER_REF  # noqa: E402
from experience_manager.render import render_experiences  # noqa: E402
from experience_manager.summarize import heuristic_case  # noqa: E402
from experience_manager.trajectories import build_view  # noqa: E402
from tests.helpers import free_port, run_service  # noqa: E402
from trainer.peers import EnvPeer, ExperiencePeer  # noqa: E402
from trainer.policy import Sampling  # noqa: E402
from trainer.rollout import collect_groups, evaluate_policy  # noqa: E402
from trainer.settings import RolloutConfig  # noqa: E402


def python_call(name: str, arguments: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


async def demonstration(env: EnvPeer, flights: FlightsEnvironment, task_id: str,
                        max_obs_chars: int) -> tuple[str, str, list[dict[str, str]], list[dict[str, Any]]]:
    """A solved train task as (example text, the experience manager's case of it, turns, the replayed messages).

    The example text: its query, its reference calls and the real observations they got, and the closing
    reply. The case: what the experience manager's heuristic summary stores for the same replayed
    trajectory (what pool seeding puts into the pool), rendered as retrieval renders it. The turns: the
    same exchange as earlier chat turns (observations as user turns, as the trainer's template renders them)."""
    task = flights.task(task_id)
    created = await env.create("flights", Task(task_id=task_id, env_type="flights", split="train"))
    messages: list[dict[str, Any]] = [m.model_dump(exclude_none=True) for m in created.messages]
    turns = [{"role": "user", "content": task.query}]
    # Not a chat transcript ("User:", "Tool:" lines): SmolLM2 goes on writing such a transcript, tool
    # results included, instead of making one call.
    lines = [f"A solved example of a similar request: \"{task.query}\""]
    try:
        orders: list[dict[str, Any]] = []
        for name, arguments in task.reference:
            resolved = dict(arguments)
            for key, value in arguments.items():
                if isinstance(value, str) and value.startswith(ORDER_REF):  # the order id this run generated
                    passenger, flight = value[len(ORDER_REF):].split(":")
                    resolved[key] = next(o["order_id"] for o in orders if o["passenger_id"] == passenger
                                         and o["flight_id"] == flight and o["status"] == "active")
            call = python_call(name, resolved)
            result = await env.step(created.instance_id, call)
            observation = result.observation.text()
            # The trajectory the case is made from carries the calls as the task manager's references do
            # (<tool_call> blocks): the experience manager reads no python-style calls.
            block = "<tool_call>" + json.dumps({"name": name, "arguments": resolved}) + "</tool_call>"
            messages += [{"role": "assistant", "content": block}, {"role": "tool", "content": observation}]
            if name == "list_orders":
                orders = json.loads(observation)
            lines.append(f"Step {len(lines)}: called {call}, which returned {observation[:max_obs_chars]}")
            turns += [{"role": "assistant", "content": call}, {"role": "user", "content": observation[:max_obs_chars]}]
        closing = f"The answer is {task.answer}." if task.answer is not None else "Done."
        lines.append(f"Final reply: {closing}")
        lines.append("Handle the request below the same way: call one tool per message, then reply in plain text.")
        await env.step(created.instance_id, closing)  # a text reply ends the episode (and is a tier-1 answer)
        messages.append({"role": "assistant", "content": closing})
        turns.append({"role": "assistant", "content": closing})
        score = (await env.evaluate(created.instance_id)).score
        if score != 1.0:
            raise RuntimeError(f"the reference of {task_id} did not solve it (score {score})")
    finally:
        await env.release(created.instance_id)
    view = build_view(messages=messages, reward=score, success_threshold=1.0, trajectory_id=None, task_id=task_id,
                      query=task.query)
    case = heuristic_case([view])
    return "\n".join(lines), render_experiences([(case.when_to_use, case.content)]), turns, messages


class DemoTurnsEnv:
    """The env peer with a solved train task of the same kind put before the query as earlier chat turns
    (the one-shot of issue 14); not how training injects experience, a reference point for it."""

    def __init__(self, env: EnvPeer, flights: FlightsEnvironment, turns: dict[str, list[dict[str, str]]]) -> None:
        self.env, self.flights, self.turns = env, flights, turns

    async def create(self, env: str, task: Task) -> Any:
        created = await self.env.create(env, task)
        demo = [ChatMessage(role=t["role"], content=t["content"]) for t in self.turns[self.flights.task(task.task_id).kind]]
        created.messages = [created.messages[0], *demo, *created.messages[1:]]
        return created

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


class Demonstrations:
    """An experience source that returns, for a validation query, the demonstration of its kind."""

    def __init__(self, by_query: dict[str, str]) -> None:
        self.by_query = by_query
        self.served = 0

    async def retrieve(self, query: str) -> tuple[str, list[str]] | None:
        text = self.by_query.get(query)
        self.served += text is not None
        return (text, ["demo"]) if text is not None else None


def table(flights: FlightsEnvironment, per_task: dict[str, list[float]], answers: dict[str, str],
          per_task_called: dict[str, list[bool]] | None = None) -> dict[str, Any]:
    by_tier: dict[str, list[float]] = {}
    by_kind: dict[str, list[float]] = {}
    called: dict[str, list[float]] = {}
    for task_id, outcomes in per_task.items():
        task = flights.task(task_id)
        success = sum(o >= 1.0 for o in outcomes) / len(outcomes)  # avg@k
        by_tier.setdefault(str(task.tier), []).append(success)
        by_kind.setdefault(task.kind, []).append(success)
    for task_id, answer in answers.items():
        called.setdefault(str(flights.task(task_id).tier), []).append(
            float("(" in answer and any(n in answer for n in ("search_flight", "get_passenger", "book_ticket",
                                                              "cancel_order", "list_orders", "tool_call"))))
    def rate(values: dict[str, list[float]]) -> dict[str, Any]:
        return {k: {"success": round(sum(v) / len(v), 3), "solved": round(sum(v), 2), "tasks": len(v)}
                for k, v in sorted(values.items())}
    out = {"by_tier": rate(by_tier), "by_kind": rate(by_kind),
           "last_action_is_call_by_tier": {k: round(sum(v) / len(v), 3) for k, v in sorted(called.items())}}
    if per_task_called:  # episodes that made a valid tool call, and successes that did
        episodes: dict[str, list[bool]] = {}
        successes: dict[str, list[bool]] = {}
        for task_id, flags in per_task_called.items():
            kind = flights.task(task_id).kind
            episodes.setdefault(kind, []).extend(flags)
            successes.setdefault(kind, []).extend(f for f, o in zip(flags, per_task[task_id], strict=False) if o >= 1.0)
        out["episodes_with_tool_call_by_kind"] = {k: round(sum(v) / len(v), 3) for k, v in sorted(episodes.items())}
        out["successes_with_tool_call_by_kind"] = {k: round(sum(v) / len(v), 3) if v else None
                                                   for k, v in sorted(successes.items())}
    return out


async def with_experience(tasks: list[Task], env: EnvPeer, policy: Any, tokenizer: Any, config: RolloutConfig,
                          source: Demonstrations, flights: FlightsEnvironment) -> dict[str, Any]:
    """The evaluation episodes, each given its experience the way training injects it (eta = 1, greedy)."""
    demo_config = config.model_copy(update={"experience_ratio": 1.0})
    greedy = Sampling(max_tokens=config.max_new_tokens, temperature=0.0, top_p=1.0)
    groups = await collect_groups(tasks, env, policy.generate, tokenizer, demo_config, experience=source,
                                  sampling=greedy, n=1)
    per_task = {g[0].trajectory.task_id: [float(g[0].trajectory.outcome or 0.0)] for g in groups}
    answers = {g[0].trajectory.task_id: g[0].trajectory.steps[-1].action.text() for g in groups if g[0].trajectory.steps}
    solved = sum(v[0] >= 1.0 for v in per_task.values())
    return {"success": round(solved / max(len(per_task), 1), 3), "experience_given": source.served,
            **table(flights, per_task, answers), "examples": {t: answers.get(t, "")[:200] for t in list(answers)[:6]}}


async def seeded_pool(env_url: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Config files for a task manager and an experience manager wired together (the EM's port is fixed
    first: the task manager seeds only the experience manager its config names)."""
    em_port = free_port()
    tm_conf = tmp / "tm.yaml"
    tm_conf.write_text(yaml.safe_dump({"task_manager": {
        "env_url": env_url, "store_dir": str(tmp / "tm"), "environments": ["flights"],
        "experience_url": f"http://127.0.0.1:{em_port}",
        "synthesis": {"query_forms": args.query_forms.split(","), "kinds": args.synthesis_kinds.split(",")}}}))
    em_conf = tmp / "em.yaml"
    em_conf.write_text(yaml.safe_dump({"experience_manager": {"summary": {"mode": "heuristic"}}}))
    return {"em_port": em_port, "tm_conf": tm_conf, "em_conf": em_conf}


async def with_pool(tasks: list[Task], env: EnvPeer, policy: Any, tokenizer: Any, config: RolloutConfig,
                    flights: FlightsEnvironment, env_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Synthesize, seed the pool from the references, then the validation episodes with experience
    retrieved over HTTP and injected as turns (eta = 1, greedy)."""
    from task_manager.client import TaskClient
    from trainer.rollout import GroupStats

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        wiring = await seeded_pool(env_url, tmp, args)
        with run_service("experience_manager", ["--store", str(tmp / "em"), "--conf", str(wiring["em_conf"]),
                                                "--log-level", "WARNING"], port=wiring["em_port"], timeout=300) as em, \
                run_service("task_manager", ["--conf", str(wiring["tm_conf"]), "--log-level", "WARNING"],
                            timeout=300) as tm:
            async with TaskClient(tm.url) as client:
                job = await client.submit_job("flights", episodes=args.pool_episodes, seed=args.seed)
                job = await client.wait_job(job.job_id, timeout=600)
                seeding = await client.seed_experience("flights", "pool", limit=args.pool_limit)
                synthetic = (await client.list_tasks(env="flights", synthetic=True, limit=10_000)).tasks
            peer = ExperiencePeer(em.url, "pool")
            stats = GroupStats()
            try:
                demo_config = config.model_copy(update={"experience_ratio": 1.0})
                greedy = Sampling(max_tokens=config.max_new_tokens, temperature=0.0, top_p=1.0)
                groups = await collect_groups(tasks, env, policy.generate, tokenizer, demo_config, experience=peer,
                                              sampling=greedy, n=1, stats=stats, inject="turns")
                pool = (await peer.client.stats("pool"))
            finally:
                await peer.aclose()
    per_task = {g[0].trajectory.task_id: [float(g[0].trajectory.outcome or 0.0)] for g in groups}
    answers = {g[0].trajectory.task_id: g[0].trajectory.steps[-1].action.text() for g in groups if g[0].trajectory.steps}
    demos = {g[0].trajectory.task_id: g[0].experience_demonstration or [] for g in groups}
    shown = {t: (d or [{}])[0].get("content") for t, d in demos.items()}
    solved = sum(v[0] >= 1.0 for v in per_task.values())
    return {"success": round(solved / max(len(per_task), 1), 3), "solved": solved, "tasks": len(per_task),
            "synthesis_kinds": args.synthesis_kinds, "query_forms": args.query_forms,
            "pool_tasks": _pool_counts(synthetic, seeding.task_ids),
            "shown": _shown(flights, per_task, demos, synthetic),
            "truncated": sum(bool(g[0].trajectory.truncated) for g in groups),
            # Episodes whose first action calls a tool (the demonstration's first move), and their successes.
            "first_action_calls": sum(_calls(g[0].trajectory.steps[0].action.text()) for g in groups
                                      if g[0].trajectory.steps),
            "first_action_calls_solved": sum(_calls(g[0].trajectory.steps[0].action.text()) and
                                             (g[0].trajectory.outcome or 0.0) >= 1.0 for g in groups
                                             if g[0].trajectory.steps),
            "synthesis": job.model_dump(mode="json", include={"status", "progress"}),
            "seeding": seeding.model_dump(mode="json"), "pool_active": pool.get("active"),
            "retrievals": peer.counters.retrievals, "hits": peer.counters.hits,
            "turns_injected": stats.turns_injected, "text_fallbacks": stats.text_fallbacks,
            **table(flights, per_task, answers),
            "demonstrated_query": {t: shown.get(t) for t in list(per_task)[:6]},
            "examples": {t: answers.get(t, "")[:200] for t in list(answers)[:6]}}


def _calls(action: str) -> bool:
    return "<tool_call>" in action or any(f"{name}(" in action for name in
                                          ("search_flight", "get_passenger", "book_ticket", "cancel_order", "list_orders"))


def _pool_counts(synthetic: list[Task], seeded: list[str]) -> dict[str, int]:
    """Synthetic tasks kept and seeded, by kind (a lookup by its lookup kind) and query form."""
    counts: dict[str, int] = {}
    for task in synthetic:
        name = f"{task.metadata.get('lookup') or task.metadata.get('kind', 'goal')}/{task.metadata.get('query_form')}"
        counts[name] = counts.get(name, 0) + 1
        if task.task_id in seeded:
            counts["seeded"] = counts.get("seeded", 0) + 1
    return dict(sorted(counts.items()))


def _shown(flights: FlightsEnvironment, per_task: dict[str, list[float]], demos: dict[str, list[dict[str, Any]]],
           synthetic: list[Task]) -> dict[str, Any]:
    """Per validation kind, which synthetic kind/form its demonstration came from and the successes with each;
    and the successes whose demonstration's closing reply already stated this task's answer."""
    from common.answers import answer_correct

    by_query = {t.query: t for t in synthetic}
    table: dict[str, dict[str, list[int]]] = {}
    states_answer = [0, 0]  # [tasks, successes] whose demonstration states this task's own answer
    for task_id, outcomes in per_task.items():
        task = flights.task(task_id)
        demo = demos.get(task_id) or []
        source = by_query.get(demo[0].get("content")) if demo else None
        name = "none" if not demo else "unknown" if source is None else \
            f"{source.metadata.get('lookup') or source.metadata.get('kind', 'goal')}/{source.metadata.get('query_form')}"
        cell = table.setdefault(task.kind, {}).setdefault(name, [0, 0])
        cell[0] += 1
        cell[1] += int(outcomes[0] >= 1.0)
        replies = [m.get("content") or "" for m in demo if m.get("role") == "assistant"]
        if task.answer is not None and replies and answer_correct(replies[-1], task.answer):
            states_answer[0] += 1
            states_answer[1] += int(outcomes[0] >= 1.0)
    return {"by_kind": {k: {n: {"tasks": c[0], "solved": c[1]} for n, c in sorted(v.items())}
                        for k, v in sorted(table.items())},
            "demo_states_answer": {"tasks": states_answer[0], "solved": states_answer[1]}}


CONDITIONS = ("zero_shot", "one_case", "one_demo", "demo_turns", "pool_turns")


def checkpoint(out: str | None, result: dict[str, Any]) -> None:
    """The conditions measured so far, so that a run stopped early keeps them (`"partial": true`)."""
    print(f"tiers: {', '.join(k for k in result if k in CONDITIONS)} done",
          file=sys.stderr,
          flush=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({**result, "partial": True}) + "\n")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine.models import load_model
    from trainer.policy import InProcessPolicy

    tiers = [int(t) for t in args.tiers.split(",")]
    env_config: dict[str, Any] = {"tiers": tiers}
    if args.version != 1:
        env_config["version"] = args.version
    if args.prompt_example:
        env_config["prompt_example"] = True
    flights = FlightsEnvironment(env_config)
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "env.yaml"
        conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": env_config}}}))
        with run_service("env_service", ["--conf", str(conf), "--log-level", "WARNING"], timeout=300) as service:
            env = EnvPeer(service.url)
            ids = await env.task_ids("flights", "validation")
            ids = ids[: args.tasks] if args.tasks else ids
            tasks = [Task(task_id=t, env_type="flights", split="validation") for t in ids]
            # One demonstration per kind: the first train task of that kind.
            train_ids = await env.task_ids("flights", "train")
            first_of_kind: dict[str, str] = {}
            for task_id in train_ids:
                first_of_kind.setdefault(flights.task(task_id).kind, task_id)
            demos = {kind: await demonstration(env, flights, tid, args.obs_chars) for kind, tid in first_of_kind.items()}

            torch.set_num_threads(args.threads)
            model, tokenizer = load_model("smollm2")
            policy = InProcessPolicy(model, tokenizer, threads=args.threads)
            config = RolloutConfig(env="flights", template="linear", max_turns=args.max_turns,
                                   max_context=args.max_context, max_new_tokens=args.max_new_tokens,
                                   temperature=0.0, concurrency=args.concurrency, retries=1)
            result: dict[str, Any] = {"benchmark": "tiers", "model": "smollm2", "split": "validation",
                                      "tasks": len(ids), "env_config": env_config, "greedy": True,
                                      "rollout": config.model_dump(include={"template", "max_turns", "max_context",
                                                                            "max_new_tokens"}),
                                      "demonstrations": first_of_kind, "load_avg_start": load_1m()}
            started = time.monotonic()
            conditions = set(args.conditions.split(","))
            try:
                if "zero_shot" in conditions:
                    zero = await evaluate_policy(tasks, env, policy.generate, tokenizer,
                                                 config.model_copy(update={"temperature": args.temperature}),
                                                 k=args.k, greedy=args.temperature == 0, seed=args.seed)
                    result["zero_shot"] = {"success": round(zero.avg_at_k, 3), "k": args.k,
                                           "temperature": args.temperature, f"avg@{args.k}": round(zero.avg_at_k, 3),
                                           f"best@{args.k}": round(zero.best_at_k, 3),
                                           **table(flights, zero.per_task, zero.per_task_answer,
                                                   zero.per_task_called),
                                           "examples": {t: zero.per_task_answer.get(t, "")[:200] for t in ids[:6]}}
                    result["zero_shot_seconds"] = round(time.monotonic() - started, 1)
                    checkpoint(args.out, result)
                for name, which in (("one_case", 1), ("one_demo", 0)):
                    if name not in conditions:
                        continue
                    started = time.monotonic()
                    source = Demonstrations({flights.task(t).query: demos[flights.task(t).kind][which] for t in ids})
                    result[name] = await with_experience(tasks, env, policy, tokenizer, config, source, flights)
                    result[f"{name}_seconds"] = round(time.monotonic() - started, 1)
                    checkpoint(args.out, result)
                if "demo_turns" in conditions:
                    started = time.monotonic()
                    turns_env = DemoTurnsEnv(env, flights, {kind: d[2] for kind, d in demos.items()})
                    shown = await evaluate_policy(tasks, turns_env, policy.generate, tokenizer, config, k=1, greedy=True)
                    result["demo_turns"] = {"success": round(shown.avg_at_k, 3),
                                            **table(flights, shown.per_task, shown.per_task_answer,
                                                    shown.per_task_called),
                                            "examples": {t: shown.per_task_answer.get(t, "")[:200] for t in ids[:6]}}
                    result["demo_turns_seconds"] = round(time.monotonic() - started, 1)
                    checkpoint(args.out, result)
                if "pool_turns" in conditions:
                    started = time.monotonic()
                    result["pool_turns"] = await with_pool(tasks, env, policy, tokenizer, config, flights,
                                                           service.url, args)
                    result["pool_turns_seconds"] = round(time.monotonic() - started, 1)
                    checkpoint(args.out, result)
                result["experience_texts"] = {kind: {"one_case": d[1], "one_demo": d[0]}
                                              for kind, d in demos.items() if kind in ("fare_lookup", "book_by_id")}
            finally:
                await policy.aclose()
                await env.aclose()
    result["load_avg_end"] = load_1m()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, default=1, choices=[1, 2], help="flights version (2: a world per task)")
    parser.add_argument("--tiers", default="1,2,3")
    parser.add_argument("--tasks", type=int, default=0, help="first N validation ids (0: all)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=1536)
    parser.add_argument("--obs-chars", type=int, default=700, help="characters of each observation in a demo")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-example", action="store_true", help="flights prompt_example: true")
    parser.add_argument("--k", type=int, default=1, help="zero_shot: samples per task (avg@k, best@k)")
    parser.add_argument("--temperature", type=float, default=0.0, help="zero_shot: 0 is greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--conditions", default="zero_shot,one_case,one_demo",
                        help="comma-separated: zero_shot, one_case, one_demo, demo_turns (a solved train task of "
                             "the same kind as earlier chat turns; not the training path), pool_turns (experience from a pool seeded by "
                             "self-questioning, through the retrieve route, as turns)")
    parser.add_argument("--pool-episodes", type=int, default=12, help="pool_turns: exploration episodes")
    parser.add_argument("--pool-limit", type=int, default=64, help="pool_turns: synthetic tasks seeded at most")
    parser.add_argument("--query-forms", default="ids,names", help="pool_turns: the task manager's query forms")
    parser.add_argument("--synthesis-kinds", default="goal,lookup",
                        help="pool_turns: what the task manager synthesizes (goal, lookup)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    emit(result, args.out)


if __name__ == "__main__":
    main()
