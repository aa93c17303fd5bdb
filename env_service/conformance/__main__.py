"""`python -m env_service.conformance --url URL --env NAME [--episodes N]`: exit 0 when the server conforms."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from .kit import ConformanceKit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env_service.conformance",
                                     description="Check an env server (/v1 and/or AgentEvolver routes) for one environment.")
    parser.add_argument("--url", required=True, help="base URL of the env server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--env", required=True, help="the environment to check (its env_type)")
    parser.add_argument("--episodes", type=int, default=5, help="random-agent episodes (default 5)")
    parser.add_argument("--concurrency", type=int, default=8, help="instances live at once in the concurrency check")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds any call may take (default 10)")
    parser.add_argument("--max-steps", type=int, default=20, help="steps per episode at most (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = parser.parse_args(argv)
    for name in ("episodes", "concurrency", "max_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    kit = ConformanceKit(args.url, args.env, episodes=args.episodes, concurrency=args.concurrency,
                         timeout_s=args.timeout, max_steps=args.max_steps, seed=args.seed,
                         token=os.environ.get("EVOLVER_API_TOKEN"))
    report = asyncio.run(kit.run())
    if args.json:
        print(json.dumps({"url": report.url, "env": report.env, "ok": report.ok, "failed": report.failed,
                          "checks": {n: {"ok": c.ok, "detail": c.detail, **({} if c.ok else {"fix": c.fix()})}
                                     for n, c in report.checks.items()}}))
    else:
        print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
