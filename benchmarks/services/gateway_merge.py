"""How often the `openai` SDK example's multi-call episodes merge into one trajectory through the gateway.

    python benchmarks/services/gateway_merge.py [--model smollm2] [--tasks 8] [--k 2] [--max-turns 3]

Starts `python -m llm_server` and `python -m env_service` (flights v2, tier 1) on free 127.0.0.1 ports, runs
`examples/agents/openai_flights.py` unchanged through the agent runner on the first `--tasks` test tasks, `--k`
episodes each, every turn a forced tool call (`tool_choice: required`: SmolLM2 zero-shot calls no tool), and
prints the runner's counters as one JSON line: episodes with one call, multi-call episodes merged into one
trajectory or split into transitions, and the merge rate.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.services.gateway import _free_port, _start  # noqa: E402
from examples.agents import openai_flights  # noqa: E402
from llm_server.client import LLMServerClient  # noqa: E402
from trainer.agents import AgentRunner  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402
from trainer.settings import AgentConfig  # noqa: E402


def _start_flights() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    conf = Path(tempfile.mkdtemp()) / "env.yaml"
    conf.write_text(f"env_service:\n  port: {port}\n  environments:\n    flights: {{version: 2, tiers: [1]}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--conf", str(conf)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit("env_service did not become healthy")


async def measure(llm_url: str, env_url: str, tasks: int, k: int, max_turns: int) -> dict:
    config = AgentConfig(callable="examples.agents.openai_flights:agent", tasks="-", env="flights", concurrency=8)
    agent = functools.partial(openai_flights.agent, tool_choice="required", max_turns=max_turns, max_tokens=64)
    env = EnvPeer(env_url)
    try:
        async with LLMServerClient(llm_url) as gateway:
            runner = AgentRunner(config, gateway, agent, env=env, env_url=env_url)
            await runner.collect([{"task_id": f"test-t1-{i:04d}"} for i in range(tasks)], k)
    finally:
        await env.aclose()
    counters = runner.stats.summary()
    return {"benchmark": "gateway_merge_rate", "agent": "examples/agents/openai_flights.py", "tasks": tasks, "k": k,
            "max_turns": max_turns, **{key: counters[key] for key in (
                "episodes", "failed_episodes", "single_call", "merged", "transitions", "calls", "merge_rate")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=3)
    args = parser.parse_args()
    llm, llm_url = _start(args.model)
    env, env_url = _start_flights()
    try:
        result = asyncio.run(measure(llm_url, env_url, args.tasks, args.k, args.max_turns))
        print(json.dumps({"model": args.model, **result}))
    finally:
        for proc in (llm, env):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
