"""What the benchmark scripts share: the repository root, the machine's load, best-of timing, the JSON line out,
and the flights probes' common flags.

A script run as a file (`python benchmarks/<area>/<name>.py`) puts the repository root on `sys.path` first,
`sys.path.insert(0, str(Path(__file__).resolve().parents[2]))`, and then imports from here; run as a module
(`python -m benchmarks.<area>.<name>`) it needs nothing. Free ports and services come from `tests.helpers`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def load_1m() -> float:
    """The 1-minute load average: the machine may be shared, so a timing is only as quiet as this."""
    return round(os.getloadavg()[0], 2)


def load_avg() -> list[float]:
    """The 1-, 5- and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def best_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` calls of `run`: noise from other processes only ever adds time."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best


def emit(result: dict[str, Any], out: Path | str | None = None) -> str:
    """Print `result` as one JSON line and, given `out`, write the same line there (its folder made)."""
    line = json.dumps(result)
    print(line)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n")
    return line


def add_probe_arguments(parser: argparse.ArgumentParser, *, max_batch: int = 8) -> None:
    """The rollout and evaluation flags the flights probes share, with one set of defaults so that their
    numbers compare (40 evaluation tasks, 4 turns, 64 new tokens, a 1536-token context)."""
    parser.add_argument("--eval-tasks", type=int, default=40)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=1536)
    parser.add_argument("--max-batch", type=int, default=max_batch, help="rows the engine decodes at once")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
