#!/usr/bin/env bash
# Plain multi-turn GRPO (no self-evolution) through the launcher.
# Extra arguments go to the launcher: key.path=value overrides and flags, e.g.
#   bash examples/run_basic.sh trainer.steps=50 --with-reme
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" launcher.py --conf examples/basic.yaml "$@"
