"""benchmarks/services/environments.py's episode loop against a real env service and a real llm_server (the tiny
random model): every task is played once, in task order, concurrently; a spent budget starts none; a run
resumed from its episode log plays only the missing episodes; the counts in the summary and the README
table add up."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from benchmarks.services.environments import (
    EpisodeLog,
    Policy,
    markdown_table,
    parse_tasks_for,
    play_all,
    summarize,
)
from llm_server.client import LLMServerClient
from tests.helpers import run_env_service, run_service

ENV_YAML = """
env_service:
  environments:
    gym: {envs: [{id: FrozenLake-v1, max_steps: 3}], splits: {train: 0, validation: 0, test: 5}}
"""


def test_play_all_plays_each_task_in_order_and_respects_the_budget(tmp_path: Path) -> None:
    with run_service("llm_server", ["--model", "tiny", "--max-batch", "4", "--threads", "1"], timeout=300) as llm, \
            run_env_service(ENV_YAML, tmp_path) as env:

        log_path, settings = tmp_path / "episodes.jsonl", {"max_turns": 3}

        async def scenario() -> tuple[list[str], list[dict], list[dict], list[dict], list[dict], int]:
            async with LLMServerClient(llm.url) as client, httpx.AsyncClient(base_url=env.url, timeout=120) as http:
                policy = Policy(client, max_new_tokens=4, history=1, obs_chars=200, model="tiny")
                ids = (await http.get("/v1/environments/gym/tasks", params={"split": "test"})).json()["task_ids"]
                played = await play_all(http, policy, "gym", ids, max_turns=3, concurrency=3, budget_s=0)
                spent = await play_all(http, policy, "gym", ids, max_turns=3, concurrency=3, budget_s=1e-9)
                # A run stopped after two episodes, then started again with the same log.
                first = await play_all(http, policy, "gym", ids[:2], 3, 3, 0, EpisodeLog(log_path, settings))
                resumed = await play_all(http, policy, "gym", ids, 3, 3, 0, EpisodeLog(log_path, settings))
                live = len((await http.get("/v1/instances")).json()["instances"])
                return ids, played, spent, first, resumed, live

        ids, played, spent, first, resumed, live = asyncio.run(scenario())
    assert len(ids) == 5
    assert [e["task_id"] for e in played] == ids
    assert all(1 <= e["turns"] <= 3 and len(e["step_ms"]) == e["turns"] for e in played)
    assert spent == []  # the budget was over before the first episode could start
    assert live == 0  # every instance was released
    logged = [json.loads(line) for line in log_path.read_text().splitlines()]
    # Episodes are logged as they finish, and concurrent ones finish in any order.
    assert sorted(r["task_id"] for r in logged[:2]) == ids[:2] and sorted(r["task_id"] for r in logged[2:]) == ids[2:]
    assert [e["task_id"] for e in resumed] == ids and resumed[:2] == first  # 2 from the log, 3 played
    with pytest.raises(ValueError, match="episodes.jsonl:1 was played with"):
        EpisodeLog(log_path, {"max_turns": 20})
    summary = summarize(played)
    turns = sum(e["turns"] for e in played)
    assert summary["tasks"] == 5 and summary["successes"] == sum(e["success"] for e in played)
    assert summary["mean_episode_length"] == turns / 5
    assert summary["invalid_action_rate"] == sum(e["invalid"] for e in played) / turns

    result = tmp_path / "result.jsonl"
    result.write_text(json.dumps({"suite": "gym", "package": "gymnasium", "version": "1.4.0",
                                  "env_ids": {"FrozenLake-v1": {**summary, "tasks_available": 64}}}) + "\n")
    table = markdown_table([result]).splitlines()
    assert len(table) == 3
    assert table[2].startswith(f"| `gym` (gymnasium 1.4.0) | `FrozenLake-v1` | 5 (of 64) | "
                               f"{summary['success']:.2f} ({summary['successes']}/5) |")


def test_tasks_for_names_a_known_suite_and_a_count() -> None:
    assert parse_tasks_for("gym=16,babyai=8", ["gym", "babyai", "gem"], 64) == {"gym": 16, "babyai": 8, "gem": 64}
    for bad in ("nowhere=3", "gym=0", "gym=lots"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            parse_tasks_for(bad, ["gym"], 64)
