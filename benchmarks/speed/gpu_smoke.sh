#!/usr/bin/env bash
# GPU smoke test of the veRL backend: two training steps of a small model on the `signal`
# environment (two turns per episode), through our plugin end to end: evolver_env_agent rollouts on
# vLLM, evolver_sync's advantage step, the evolver_boosted loss with experience on half the rollouts.
# Prints one JSON line. Never run on the machines this project is built on (no GPU there).
#
#   SMOKE_MODEL_PATH=/models/Qwen2.5-0.5B-Instruct bash benchmarks/speed/gpu_smoke.sh
#   SMOKE_GPUS=2 bash benchmarks/speed/gpu_smoke.sh            # GPUs to use (default 1)
#   bash benchmarks/speed/gpu_smoke.sh --dry-run                # no GPU: services, data, overrides, veRL config only
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL=${SMOKE_MODEL_PATH:-/models/Qwen2.5-0.5B-Instruct}
GPUS=${SMOKE_GPUS:-1}
STEPS=${SMOKE_STEPS:-2}
RUN_DIR=${RUN_DIR:-runs/gpu_smoke}
PY=${PYTHON:-python}
DRY=()
if [[ "${1:-}" == "--dry-run" ]]; then DRY=(--dry-run); shift; fi
if [[ ${#DRY[@]} -eq 0 && ! -f "$MODEL/config.json" ]]; then
  echo "SMOKE_MODEL_PATH=$MODEL is not a local HF model directory (config.json missing)" >&2
  exit 2
fi
mkdir -p "$RUN_DIR"
read -r ENV_PORT EXP_PORT < <($PY -c "from tests.helpers import free_port; print(free_port(), free_port())" 2>/dev/null \
  || echo "18001 18003")

cat > "$RUN_DIR/smoke.yaml" <<YAML
env_service:
  port: $ENV_PORT
  environments:
    signal: {options: [north, south, east, west], fallback: first_char}
experience_manager:
  port: $EXP_PORT
trainer:
  seed: 0
  steps: $STEPS
  tasks_per_step: 4
  output_dir: $RUN_DIR/checkpoints
  services: {env_url: "http://127.0.0.1:$ENV_PORT", experience_url: "http://127.0.0.1:$EXP_PORT"}
  rollout: {env: signal, n: 4, max_turns: 3, max_context: 1024, max_new_tokens: 32, experience_ratio: 0.5}
  optim: {lr: 1.0e-6, minibatches: 1}
  loss: {clip_high_boosted: 0.6}
  advantage: {estimator: grpo}
verl:
  model_path: $MODEL
  n_gpus_per_node: $GPUS
  tensor_parallel: 1
  gpu_memory_utilization: 0.4
  prompt_length: 512
  response_length: 512
  max_tokens_per_gpu: 4096
  train_files: $RUN_DIR/data/train.parquet
  project: evolver
  experiment: gpu_smoke
  loggers: [console]
  experience_workspace: gpu_smoke
  extra_overrides: [trainer.val_before_train=false, actor_rollout_ref.rollout.enforce_eager=true]
YAML

start=$(date +%s)
status=ok
env CONF="$RUN_DIR/smoke.yaml" RUN_DIR="$RUN_DIR" PYTHON="$PY" bash examples/run_overall_gpu.sh "${DRY[@]}" "$@" \
  > "$RUN_DIR/run.log" 2>&1 || status=failed
seconds=$(( $(date +%s) - start ))
# veRL's console logger prints "step:N - ..." once per finished step.
finished=$(grep -oE "(^| )step:[0-9]+ " "$RUN_DIR/run.log" | grep -oE "[0-9]+" | sort -n | tail -1 || true)
if [[ $status == ok && ${#DRY[@]} -eq 0 && "${finished:-0}" -lt "$STEPS" ]]; then status=incomplete; fi
mode=train; [[ ${#DRY[@]} -gt 0 ]] && mode=dry_run
echo "{\"benchmark\": \"gpu_smoke\", \"mode\": \"$mode\", \"status\": \"$status\", \"steps_finished\": ${finished:-0}, \"steps_asked\": $STEPS, \"gpus\": $GPUS, \"seconds\": $seconds, \"log\": \"$RUN_DIR/run.log\"}"
[[ $status == ok ]]
