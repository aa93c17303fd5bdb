#!/usr/bin/env bash
# The full self-evolving recipe through veRL 0.9.1 on one node x 8 GPUs (Qwen2.5-7B-Instruct):
# starts the services of the run YAML (env_service; task_manager, experience_manager and judge when the
# YAML has their sections), lets the task manager synthesize tasks first (SYNTH_EPISODES, when it is
# configured; training batches then come from it step by step), writes the task parquets (validation,
# and train for a run without a task manager), translates the YAML into veRL's Hydra overrides and runs
# `python -m verl.trainer.main_ppo`. Services stop when the run ends.
#
#   bash examples/run_overall_gpu.sh                         # examples/overall_gpu.yaml
#   EVOLVER_MODEL_PATH=/data/Qwen2.5-7B-Instruct bash examples/run_overall_gpu.sh trainer.total_training_steps=50
#   bash examples/run_overall_gpu.sh --dry-run               # everything but training: veRL prints its config
#
# Environment: CONF (run YAML), RUN_DIR (logs, data), PYTHON. Extra arguments are veRL Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."

CONF=${CONF:-examples/overall_gpu.yaml}
RUN_DIR=${RUN_DIR:-runs/overall_gpu}
PY=${PYTHON:-python}
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}   # Ray 2.60 otherwise answers 401 on its dashboard
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/data"

# veRL's Ray workers load our estimators, loss, trainer and agent loop through this entry point.
$PY - <<'PY'
import sys
from importlib.metadata import entry_points
if not any(ep.value == "trainer.verl_plugin" for ep in entry_points(group="verl.plugins")):
    sys.exit("the evolver veRL plugin is not installed in this environment: pip install -e '.[gpu]'")
PY

# What the YAML asks for: services to start, their URLs, the environment.
read -r SERVICES ENV_NAME ENV_URL < <($PY - "$CONF" <<'PY'
import sys
from common.config import compose
run = compose(sys.argv[1])
services = ["env_service"] + [s for s in ("task_manager", "experience_manager", "judge") if s in run]
print(",".join(services), run["trainer"]["rollout"]["env"], run["trainer"]["services"]["env_url"])
PY
)

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
IFS=, read -r -a SERVICE_LIST <<< "$SERVICES"
for service in "${SERVICE_LIST[@]}"; do
  module=$service; [[ $service == judge ]] && module=judge
  args=(--conf "$CONF"); [[ $service == experience_manager ]] && args+=(--store "$RUN_DIR/experience")
  [[ $service == task_manager ]] && args+=(--store-dir "$RUN_DIR/tasks")
  $PY -m "$module" "${args[@]}" > "$RUN_DIR/logs/$service.log" 2>&1 &
  PIDS+=($!)
  echo "started $service (pid $!, log $RUN_DIR/logs/$service.log)"
done

# Wait for every service's /healthz (URLs from trainer.services).
$PY - "$CONF" <<'PY'
import sys, time
import httpx
from common.config import compose
urls = [u for u in compose(sys.argv[1])["trainer"]["services"].values() if isinstance(u, str)]
deadline = time.monotonic() + 300
for url in urls:
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"{url}/healthz not ready after 300 s: see the logs in the run folder")
        time.sleep(1)
    print(f"healthy: {url}")
PY

# Self-questioning before training (AgentEvolver does it first too): one synthesis job on the task manager.
if [[ ",$SERVICES," == *",task_manager,"* && ${SYNTH_EPISODES:-32} -gt 0 && $DRY_RUN -eq 0 ]]; then
  $PY - "$CONF" "$ENV_NAME" "${SYNTH_EPISODES:-32}" <<'PY'
import sys
from common.config import compose
from evolver_launcher.synthesis import SynthesisGate
import time
url = compose(sys.argv[1])["trainer"]["services"]["task_url"]
gate = SynthesisGate(url, [sys.argv[2]], int(sys.argv[3]), timeout_s=3600, say=print)
while not gate():
    time.sleep(2)
PY
fi

# One parquet row per task (veRL's dataloader feeds them to the evolver_env_agent loop), then the Hydra
# overrides: what `python -m trainer.verl_plugin dataset` (twice) and `... overrides` write, in one process
# (each of those imports veRL with our plugin again, ~7 s of CPU).
$PY - "$CONF" "$ENV_URL" "$ENV_NAME" "$RUN_DIR" <<'PY'
import asyncio
import sys
from pathlib import Path

from common.config import ConfigError, compose
from trainer.verl_plugin.dataset import env_tasks, write_parquet
from trainer.verl_plugin.overrides import translate

conf, env_url, env, run_dir = sys.argv[1:]
data = Path(run_dir) / "data"
try:
    for split in ("train", "validation"):
        tasks = asyncio.run(env_tasks(env_url, env, split))
        print(f"wrote {len(tasks)} tasks of {env}/{split} to {write_parquet(tasks, data / f'{split}.parquet')}")
    run = compose(conf, [f"verl.train_files={data}/train.parquet", f"verl.val_files={data}/validation.parquet"])
    (Path(run_dir) / "overrides.txt").write_text("".join(f"{line}\n" for line in translate(run)))
except (ConfigError, ValueError) as exc:
    sys.exit(f"error: {exc}")
PY
mapfile -t OVERRIDES < "$RUN_DIR/overrides.txt"
echo "veRL overrides: $RUN_DIR/overrides.txt (${#OVERRIDES[@]} lines)"

if (( DRY_RUN )); then
  # Hydra's --cfg job: veRL composes and prints its config with our overrides, and trains nothing.
  $PY -m verl.trainer.main_ppo --cfg job "${OVERRIDES[@]}" "$@" > "$RUN_DIR/verl_config.yaml"
  echo "dry run: veRL accepted the overrides; its config is in $RUN_DIR/verl_config.yaml"
  exit 0
fi
$PY -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@" 2>&1 | tee "$RUN_DIR/logs/verl.log"
