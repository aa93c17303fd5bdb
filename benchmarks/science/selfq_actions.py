"""Self-questioning on environments without tool docs: what the task manager proposes, verifies and keeps.

    .venv/bin/python benchmarks/science/selfq_actions.py [--episodes 8] [--only textworld]

Starts env_service (FrozenLake and the KeyDoor plugin through the gym adapter, a two-room TextWorld
game generated offline) and a task manager with the random explorer and hindsight synthesis, over real
HTTP on 127.0.0.1. The gym envs are explored through their action schema (the profile's action words);
the text game through the commands its state lists as `valid_actions`. One synthesis job per
environment; prints one JSON line: per environment the job's funnel (episodes, steps, states reached,
proposed / parsed / verified / kept, rejected and dropped by reason) and three kept queries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from env_service.client import EnvClient  # noqa: E402
from task_manager.client import TaskClient  # noqa: E402
from tests.helpers import run_service  # noqa: E402

KEYDOOR = "EvolverTest/KeyDoor-v0"
TEXTWORLD_GAME = "custom-R2-O2-Q2"
FUNNEL = ("episodes_total", "episodes_done", "episode_errors", "steps", "states_reached", "proposed", "parsed",
          "verified", "kept", "rejected", "dropped")


def config(workdir: Path, episodes: int, breadth: int, depth: int) -> str:
    return f"""
env_service:
  plugins: {{keydoor: tests.env_service.keydoor_plugin}}
  environments:
    gym: {{envs: [FrozenLake-v1, {KEYDOOR}], splits: {{train: {episodes}, validation: 1, test: 1}}}}
    textworld: {{envs: [{TEXTWORLD_GAME}], pregenerate: true, games_dir: {workdir / 'games'},
                splits: {{train: {episodes}, validation: 0, test: 0}}}}
task_manager:
  environments: [gym, textworld]
  store_dir: {workdir / 'tm'}
  explore: {{explorer: random, breadth_steps: {breadth}, depth_steps: {depth}}}
  synthesis: {{synthesizer: hindsight, max_goals: 2}}
  dedup: {{embeddings: false}}
"""


async def job(client: TaskClient, env: str, episodes: int, seeds: list[str]) -> dict[str, Any]:
    submitted = await client.submit_job(env, episodes=episodes, seed=1, seed_tasks=seeds)
    done = await client.wait_job(submitted.job_id, timeout=1800)
    tasks = await client.list_tasks(env=env, synthetic=True, limit=500)
    queries = [t.query for t in tasks.tasks if t.seed_task_id in seeds]
    return {"status": done.status, "funnel": {k: done.progress.get(k) for k in FUNNEL}, "examples": queries[:3]}


async def measure(env_url: str, url: str, episodes: int, only: list[str]) -> dict[str, Any]:
    async with EnvClient(env_url) as envs:
        gym_ids = await envs.task_ids("gym", "train")
        text_ids = await envs.task_ids("textworld", "train")
    async with TaskClient(url) as client:
        wanted = {"FrozenLake-v1": ("gym", [t for t in gym_ids if t.startswith("FrozenLake-v1/")]),
                  KEYDOOR: ("gym", [t for t in gym_ids if t.startswith(f"{KEYDOOR}/")]),
                  f"textworld {TEXTWORLD_GAME}": ("textworld", text_ids)}
        return {name: await job(client, env, episodes, seeds) for name, (env, seeds) in wanted.items()
                if not only or any(o in name for o in only)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--breadth", type=int, default=4)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--only", action="append", default=[], help="measure only environments naming this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        conf = workdir / "run.yaml"
        conf.write_text(config(workdir, args.episodes, args.breadth, args.depth))
        with run_service("env_service", ["--conf", str(conf)], timeout=600) as env, \
                run_service("task_manager", ["--conf", str(conf), "--env-url", env.url]) as tm:
            environments = asyncio.run(measure(env.url, tm.url, args.episodes, args.only))
    print(json.dumps({"command": f"task_manager synthesis job per environment, {args.episodes} episodes, explore "
                                 f"breadth {args.breadth} + depth {args.depth}, hindsight max_goals 2, dedup "
                                 "embeddings off", "environments": environments}))


if __name__ == "__main__":
    main()
