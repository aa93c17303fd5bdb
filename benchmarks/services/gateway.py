"""The gateway's overhead per call over `llm_server` alone, in the same run: one JSON line.

    python benchmarks/services/gateway.py [--model tiny] [--episodes 20] [--calls 4] [--url URL]

Starts `python -m llm_server` on a free 127.0.0.1 port (unless --url is given). Each round plays one agent
episode of `--calls` calls whose history grows by the reply and one more turn per call (the case where the gateway
recognises its earlier replies and splices their sampled ids back; a one-token reply is never a tool call, so
the reply goes back as text and a user turn follows), twice: through an episode
(`/v1/episodes/{id}/chat/completions`, recorded) and through the plain route with the same messages. Every call
is greedy and generates one token, so the difference is the gateway's own work (rendering, splicing,
recording), not sampling. The two kinds alternate call by call so a drifting machine load hits both alike.
Reported: the median and p90 latency of each, the median of the paired differences (the overhead) and how
many episode calls continued an earlier one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers import ServiceProcess, run_service  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the catalogue",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                          "required": ["q"], "additionalProperties": False}}}]


def start_llm_server(model: str) -> AbstractContextManager[ServiceProcess]:
    """`python -m llm_server --model model` on a free 127.0.0.1 port, offline; healthy on entering, stopped on
    leaving."""
    return run_service("llm_server", ["--model", model], env={"HF_HUB_OFFLINE": "1"}, timeout=300)


def _timed(http: httpx.Client, path: str, body: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    response = http.post(path, json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json()


def measure(url: str, model: str, episodes: int, calls: int) -> dict:
    plain, recorded, differences = [], [], []
    with httpx.Client(base_url=url, timeout=120) as http:
        for round_ in range(episodes + 1):  # round 0 warms both paths up and is not counted
            episode = http.post("/v1/episodes", json={}).json()["episode_id"]
            messages = [{"role": "system", "content": "You look things up."},
                        {"role": "user", "content": f"Find item {round_}."}]
            for call in range(calls):
                body = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 1, "temperature": 0}
                t_recorded, answer = _timed(http, f"/v1/episodes/{episode}/chat/completions", body)
                t_plain, _ = _timed(http, "/v1/chat/completions", body)
                if round_:
                    plain.append(t_plain)
                    recorded.append(t_recorded)
                    differences.append(t_recorded - t_plain)
                # The agent's next turn: the gateway's reply sent back as it came, then the user's answer.
                reply = answer["choices"][0]["message"]
                messages = [*messages, {"role": "assistant", "content": reply.get("content") or ""},
                            {"role": "user", "content": f"result {call}"}]
            http.post(f"/v1/episodes/{episode}/end")
        gateway = http.get("/v1/stats").json()["gateway"]

    def ms(values: list[float], q: float) -> float:
        return round(1000 * statistics.quantiles(values, n=10)[8] if q == 0.9 else 1000 * statistics.median(values), 3)

    return {"benchmark": "gateway_overhead", "model": model, "episodes": episodes, "calls_per_episode": calls,
            "llm_server_median_ms": ms(plain, 0.5), "llm_server_p90_ms": ms(plain, 0.9),
            "gateway_median_ms": ms(recorded, 0.5), "gateway_p90_ms": ms(recorded, 0.9),
            "overhead_median_ms": ms(differences, 0.5), "overhead_p90_ms": ms(differences, 0.9),
            "continued_calls": gateway["continued_calls"], "recorded_calls": gateway["calls"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (default), smollm2 or a local HF directory")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--url", default=None, help="an llm_server already running (its model is --model)")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.url or stack.enter_context(start_llm_server(args.model)).url
        print(json.dumps(measure(url, args.model, args.episodes, args.calls)))


if __name__ == "__main__":
    main()
