"""Judge benchmark: raw parse rate and fallback rate of a real judge LLM served by `llm_server`.

    python benchmarks/judge.py [--model smollm2] [--trajectories 8] [--llm-url URL]

Starts `llm_server` (unless --llm-url is given) and the judge service on free 127.0.0.1 ports,
judges a fixed set of flight-booking trajectories whose steps are plainly useful or useless, and
prints one JSON line: parse and fallback rates, agreement of the labels with the intended ones
(on LLM-parsed labels only), token usage and wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from advantage.client import JudgeClient, JudgeStep, JudgeTrajectory  # noqa: E402

# (query, [(action, observation, intended label)], outcome)
SCENARIOS: list[tuple[str, list[tuple[str, str, str]], float]] = [
    ("Book the cheapest flight from Boston to Denver on May 3.", [
        ("search_flight(origin='BOS', destination='DEN', date='2025-05-03')",
         "3 flights: UA12 $240, DL40 $199, AA7 $310", "GOOD"),
        ("book_ticket(flight='DL40')", "Booked DL40, order #5521, $199", "GOOD"),
    ], 1.0),
    ("Book the cheapest flight from Boston to Denver on May 3.", [
        ("search_flight(origin='BOS', destination='DEN', date='2025-05-03')",
         "3 flights: UA12 $240, DL40 $199, AA7 $310", "GOOD"),
        ("get_weather(city='Denver')", "Sunny, 21C", "BAD"),
        ("book_ticket(flight='AA7')", "Booked AA7, order #5522, $310", "BAD"),
    ], 0.0),
    ("Cancel order #881 and tell the user the refund amount.", [
        ("cancel_order(order_id='881')", "Order 881 cancelled; refund $420", "GOOD"),
        ("reply('Your order is cancelled and $420 will be refunded.')", "conversation ended", "GOOD"),
    ], 1.0),
    ("Cancel order #881 and tell the user the refund amount.", [
        ("cancel_order(order_id='818')", "Error: order 818 not found", "BAD"),
        ("reply('Done, your order is cancelled.')", "conversation ended", "BAD"),
    ], 0.0),
    ("Find a flight from Paris to Rome on June 9 under $150 and book it.", [
        ("search_flight(origin='CDG', destination='FCO', date='2025-06-09')", "AF1 $180, FR22 $95", "GOOD"),
        ("book_ticket(flight='FR22')", "Booked FR22, order #77, $95", "GOOD"),
    ], 1.0),
    ("Find a flight from Paris to Rome on June 9 under $150 and book it.", [
        ("search_flight(origin='CDG', destination='FCO', date='2025-09-06')", "AF3 $210", "BAD"),
        ("book_ticket(flight='AF3')", "Booked AF3, order #78, $210", "BAD"),
    ], 0.0),
    ("Book a window seat on flight UA12.", [
        ("book_ticket(flight='UA12')", "Error: a seat preference is required", "BAD"),
        ("book_ticket(flight='UA12', seat='window')", "Booked UA12 seat 14A, order #90", "GOOD"),
    ], 1.0),
    ("Book a window seat on flight UA12.", [
        ("book_ticket(flight='UA12')", "Error: a seat preference is required", "BAD"),
        ("book_ticket(flight='UA12')", "Error: a seat preference is required", "BAD"),
    ], 0.0),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def service(module: str, args: list[str], log: Path, timeout: float = 600):
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port), *args], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{module} exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{module} not healthy after {timeout}s")
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def items(count: int) -> tuple[list[JudgeTrajectory], list[list[str]]]:
    trajs, intended = [], []
    for i in range(count):
        query, steps, outcome = SCENARIOS[i % len(SCENARIOS)]
        trajs.append(JudgeTrajectory(trajectory_id=f"bench{i}", query=query, outcome=outcome,
                                     steps=[JudgeStep(action=a, observation=o) for a, o, _ in steps]))
        intended.append([label for _, _, label in steps])
    return trajs, intended


async def judge_all(url: str, trajs: list[JudgeTrajectory], timeout: float):
    async with JudgeClient(url, timeout=timeout) as client:
        response = await client.judge(trajs)
        return response, await client.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="llm_server model (smollm2 or tiny)")
    parser.add_argument("--llm-url", default=None, help="use a running OpenAI-compatible server (…/v1)")
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--max-tokens-per-step", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one LLM call may take")
    args = parser.parse_args()
    # A SIGTERM unwinds through the `finally` blocks, so the services started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(tempfile.mkdtemp(prefix="judge-bench-"))
    with ExitStack() as stack:
        llm_url = args.llm_url or stack.enter_context(
            service("llm_server", ["--model", args.model], work / "llm_server.log")) + "/v1"
        conf = work / "run.yaml"
        conf.write_text(json.dumps({"judge": {
            "llm": {"base_url": llm_url, "model": args.model, "max_retries": 0, "timeout": args.timeout},
            "max_tokens_per_step": args.max_tokens_per_step, "audit_log": str(work / "audit.jsonl")}}))
        judge_url = stack.enter_context(service("advantage.judge", ["--conf", str(conf)], work / "judge.log"))
        trajs, intended = items(args.trajectories)
        start = time.perf_counter()
        response, stats = asyncio.run(judge_all(judge_url, trajs, 3 * args.timeout))
        wall = time.perf_counter() - start

    parsed_agree = parsed_total = 0
    for judgment, want in zip(response.judgments, intended, strict=True):
        filled = set(judgment.filled_steps)
        for label, target in zip(judgment.labels, want, strict=True):
            if label.step not in filled:
                parsed_total += 1
                parsed_agree += int(label.label == target)
    steps = sum(len(t.steps) for t in trajs)
    print(json.dumps({
        "benchmark": "judge", "model": args.model, "trajectories": len(trajs), "steps": steps,
        "max_tokens_per_step": args.max_tokens_per_step,
        "raw_parse_rate": round(response.raw_parse_rate, 4),
        "fallback_rate": round(response.fallback_count / len(trajs), 4),
        "filled_steps": sum(len(j.filled_steps) for j in response.judgments),
        "agreement_with_intended_on_parsed": round(parsed_agree / parsed_total, 4) if parsed_total else None,
        "llm_calls": response.usage.llm_calls, "prompt_tokens": response.usage.prompt_tokens,
        "completion_tokens": response.usage.completion_tokens,
        "good_rate_successful": round(stats.successful.good_rate, 4),
        "good_rate_failed": round(stats.failed.good_rate, 4),
        "wall_s": round(wall, 1), "audit_log": str(work / "audit.jsonl"),
    }))


if __name__ == "__main__":
    main()
