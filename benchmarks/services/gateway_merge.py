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
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.services.gateway import start_llm_server  # noqa: E402
from examples.agents import openai_flights  # noqa: E402
from llm_server.client import LLMServerClient  # noqa: E402
from tests.helpers import ServiceProcess, run_service  # noqa: E402
from trainer.agents import AgentRunner  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402
from trainer.settings import AgentConfig  # noqa: E402


def start_flights(workdir: Path) -> AbstractContextManager[ServiceProcess]:
    """`python -m env_service` serving flights v2, tier 1, on a free 127.0.0.1 port."""
    conf = workdir / "env.yaml"
    conf.write_text("env_service:\n  environments:\n    flights: {version: 2, tiers: [1]}\n")
    return run_service("env_service", ["--conf", str(conf)], timeout=120)


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
    with start_llm_server(args.model) as llm, start_flights(Path(tempfile.mkdtemp())) as env:
        result = asyncio.run(measure(llm.url, env.url, args.tasks, args.k, args.max_turns))
        print(json.dumps({"model": args.model, **result}))


if __name__ == "__main__":
    main()
