#!/usr/bin/env bash
# The full self-evolving loop: questioning (task manager) + navigating (experience manager) +
# attributing (judge, ADCA-GRPO), all configured in examples/overall.yaml itself (unlike
# AgentEvolver's run_overall.sh, nothing extra is needed on the command line to get synthetic tasks).
# Extra arguments go to the launcher, e.g.
#   bash examples/run_overall.sh trainer.model=/models/Qwen2.5-7B-Instruct --with-bfcl
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" launcher.py --conf examples/overall.yaml "$@"
