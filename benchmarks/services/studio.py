"""Benchmark of the studio: render time of a trajectory page for a 20-turn rollout (goal: p95 < 300 ms).

    python benchmarks/services/studio.py [--turns 20] [--policy-tokens 64] [--obs-tokens 96] [--requests 200]

Builds a run folder in a temporary directory: a trainer folder whose rollout records are written by
the trainer's own writer (`trainer.records.RolloutRecords`, the tiny model's tokenizer) for one group
of `--group` rollouts of `--turns` turns each (per turn `--policy-tokens` policy tokens and
`--obs-tokens` observation tokens, judge labels and advantages, experience injected into half), plus
an experience-manager journal of `--experiences` experiences and `--history` earlier rollouts in the
index. Then starts `python -m studio --runs` on a free 127.0.0.1 port and GETs the flagged 20-turn
rollout's page `--requests` times after `--warmup` requests, one at a time over a keep-alive
connection. Prints one JSON line: latency percentiles (ms), page size, token count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO  # noqa: E402
from common.schemas import ChatMessage, Experience, Step, StepLabel, Trajectory  # noqa: E402
from engine.models import build_tiny_tokenizer  # noqa: E402
from judge.client import TrajectoryJudgment  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.records import RolloutRecords  # noqa: E402
from trainer.rollout import Rollout  # noqa: E402
from trainer.step_batch import StepBatch  # noqa: E402
from trainer.templates import Segment  # noqa: E402

WORDS = ("search_flight(origin='SFO', destination='JFK', date='2025-06-03') then book_ticket for the passenger "
         "whose id is P1001 on the cheapest direct flight with seats left, checking the order afterwards").split()


def _ids(tokenizer, n: int, salt: int) -> list[int]:
    text = " ".join(WORDS[(salt + i) % len(WORDS)] for i in range(n * 2))
    return tokenizer.encode(text, add_special_tokens=False)[:n]


def build_rollout(tokenizer, index: int, args: argparse.Namespace, group: str, flagged: bool
                  ) -> tuple[Rollout, TrajectoryJudgment]:
    prompt = _ids(tokenizer, 400, index)
    steps, response, mask, step_ids, messages = [], [], [], [], [ChatMessage(role="user", content="Book a seat.")]
    for turn in range(args.turns):
        action = _ids(tokenizer, args.policy_tokens, turn)
        observation = _ids(tokenizer, args.obs_tokens, turn + 7)
        response += action + observation
        mask += [1] * len(action) + [0] * len(observation)
        step_ids += [turn] * (len(action) + len(observation))
        act, obs = tokenizer.decode(action), tokenizer.decode(observation)
        steps.append(Step(index=turn, action=ChatMessage(role="assistant", content=act),
                          observation=ChatMessage(role="tool", content=obs), done=turn == args.turns - 1))
        messages += [steps[-1].action, steps[-1].observation]
    labels = [StepLabel(step=t, label="GOOD" if t % 3 else "BAD", reason=f"step {t}: the call moved the task on")
              for t in range(args.turns)]
    trajectory = Trajectory(trajectory_id=f"traj_bench{index:08d}", task_id="train-0001", group_id=group,
                            env_type="flights", messages=messages, steps=steps, outcome=float(index % 2),
                            prompt_ids=prompt, response_ids=response, loss_mask=mask, step_ids=step_ids,
                            experience_flag=flagged, experience_ids=["exp_bench0000", "exp_bench0001"] if flagged
                            else [])
    judgment = TrajectoryJudgment(trajectory_id=trajectory.trajectory_id, labels=labels)
    return Rollout(trajectory, [Segment(prompt, response, mask, step_ids)], seconds=1.0), judgment


def build_run(root: Path, args: argparse.Namespace) -> str:
    tokenizer = build_tiny_tokenizer()
    run = root / "bench"
    trainer = run / "trainer"
    records = RolloutRecords(trainer / "rollouts", tokenizer)
    for step in range(args.history // args.group):
        built = [build_rollout(tokenizer, step * args.group + i, args, f"grp_old{step}", i % 2 == 0)
                 for i in range(args.group)]
        group = [r for r, _ in built]
        records.write(step + 1, StepBatch([group], {j.trajectory_id: j for _, j in built},
                                          advantages=[[0.1] * len(r.trajectory.response_ids) for r in group]))
    (trainer / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rollout/reward_mean": 0.5}) + "\n"
                                                   for s in range(1, 11)))
    (trainer / "config.json").write_text(json.dumps({"experience": {"workspace": "default"}}))
    store = run / "experience_store"
    store.mkdir(parents=True)
    writes = [{"upsert": Experience(experience_id=f"exp_bench{i:04d}", when_to_use=f"When booking flight {i}",
                                    content="Search first, then book the cheapest flight with seats.")
               .model_dump(mode="json"), "vector": None} for i in range(args.experiences)]
    (store / "journal.jsonl").write_text(json.dumps({"t": "intent", "op_id": "x", "op": "import", "ws": "default",
                                                     "writes": writes}) + "\n")
    return "traj_bench00000000"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--policy-tokens", type=int, default=64)
    parser.add_argument("--obs-tokens", type=int, default=96)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--history", type=int, default=400, help="rollouts in the run's index")
    parser.add_argument("--experiences", type=int, default=200)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trajectory_id = build_run(root, args)
        env = {"PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
        with run_service("studio", ["--runs", str(root), "--log-level", "WARNING"], env=env, timeout=60,
                         log_dir=root) as studio:
            page = f"{studio.url}/runs/bench/rollouts/{trajectory_id}"
            times = []
            with httpx.Client(timeout=30) as client:
                for i in range(args.warmup + args.requests):
                    started = time.perf_counter()
                    response = client.get(page)
                    elapsed = time.perf_counter() - started
                    response.raise_for_status()
                    if i >= args.warmup:
                        times.append(elapsed * 1000)
            body = response.text
    times.sort()

    def pct(p: float) -> float:
        return round(times[min(len(times) - 1, int(p / 100 * len(times)))], 2)

    print(json.dumps({"benchmark": "studio_trajectory_page", "turns": args.turns,
                      # every token span on the page: prompt and response tokens, and the legend's two
                      "token_spans": body.count('class="t m'), "page_bytes": len(body.encode()),
                      "rollouts_in_index": args.history, "experiences": args.experiences,
                      "requests": args.requests, "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
                      "max_ms": round(times[-1], 2), "goal_p95_ms": 300, "cpu_count": os.cpu_count()}))


if __name__ == "__main__":
    main()
