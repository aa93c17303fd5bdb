#!/usr/bin/env bash
# End-to-end check of docker/: runs docker/quickstart.sh (base image, build, up, train) on a
# fresh-clone copy of the repo under its own compose project and free host ports, checks every
# service's /healthz from inside the compose network and on 127.0.0.1, asserts from the trainer's
# summary.json that the run trained at least E2E_STEPS steps with every self-evolving mechanism (synthetic
# tasks sampled, the pool seeded from them, rollouts with injected experience, judge labels, ADCA-GRPO), prints each container's peak memory
# against its limit, and tears everything down (containers, network, volumes; also on failure or
# Ctrl-C). The image stays (docker/README.md says how to remove it).
#
#   bash docker/e2e.sh
#
# Environment (besides quickstart.sh's, e.g. EVOLVER_BASE_IMAGE, EVOLVER_TORCH_INDEX, EVOLVER_TORCH_WHEELS):
#   E2E_MODEL     policy and llm-server model (default smollm2, the real one; tiny starts in seconds)
#   E2E_STEPS     training steps (default 2)
#   E2E_HOST_CA=1 install this host's /usr/local/share/ca-certificates/*.crt in the image
#   E2E_TRAIN=0   stop after the health checks
#   E2E_PROJECT   compose project (default evolver-e2e)
#
# Not started here: `qdrant` (needs the qdrant/qdrant image from Docker Hub), `vllm` (a GPU and its
# image) and `tensorboard`; `docker compose config` still checks their definitions.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=docker/lib.sh
. "$ROOT/docker/lib.sh"
SERVICES=(ray-head llm-server env-service task-manager experience-manager judge studio)
declare -A PORTS=([ray-head]=8265 [llm-server]=8001 [env-service]=8080 [task-manager]=8030
                  [experience-manager]=8003 [judge]=8005 [studio]=8090)
declare -A PORT_VARS=([ray-head]=RAY_DASHBOARD_PORT [llm-server]=LLM_SERVER_PORT [env-service]=ENV_SERVICE_PORT
                      [task-manager]=TASK_MANAGER_PORT [experience-manager]=EXPERIENCE_MANAGER_PORT
                      [judge]=JUDGE_PORT [studio]=STUDIO_PORT)
STEPS=${E2E_STEPS:-2}
RUN_NAME=e2e-$(date -u +%Y%m%d-%H%M%S)

command -v docker >/dev/null || die "no docker CLI (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd or set DOCKER_HOST)"
find_compose "$ROOT"
# quickstart.sh runs from the copy below, which has no .venv: hand it the Compose found here.
[ "${#COMPOSE_BIN[@]}" = 1 ] && export EVOLVER_COMPOSE_BIN=${COMPOSE_BIN[0]}

# A fresh clone's files only (no .venv, no runs/, no staged wheels): the build context.
CONTEXT=$(mktemp -d)
git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
    | (cd "$ROOT" && xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) | tar -C "$CONTEXT" -xf -
export COMPOSE_PROJECT_NAME=${E2E_PROJECT:-evolver-e2e}
export EVOLVER_BUILD_CONTEXT=$CONTEXT EVOLVER_COMPOSE_FILE=$CONTEXT/docker/docker-compose.yml
export EVOLVER_HOST_CA=${E2E_HOST_CA:-0} EVOLVER_TRAIN=${E2E_TRAIN:-1} EVOLVER_RUN_NAME=$RUN_NAME
export EVOLVER_LLM_MODEL=${E2E_MODEL:-smollm2} EVOLVER_POLICY_MODEL=${E2E_MODEL:-smollm2}
export JUDGE_MODEL=${E2E_MODEL:-smollm2} EVOLVER_TRAIN_STEPS=$STEPS
# The services listen off loopback inside compose and require a token: the check's own, unless one is given.
export EVOLVER_API_TOKEN=${EVOLVER_API_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')}
# Host ports that cannot collide with anything else on this machine.
for svc in "${SERVICES[@]}"; do
    export "${PORT_VARS[$svc]}=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
done

COMPOSE=("${COMPOSE_BIN[@]}" -f "$EVOLVER_COMPOSE_FILE")
teardown() {
    code=$?
    say "e2e: tearing down project $COMPOSE_PROJECT_NAME (containers, network, volumes)"
    "${COMPOSE[@]}" --profile train --profile tensorboard down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
    rm -rf "$CONTEXT"
    exit $code
}
trap teardown EXIT INT TERM

say "e2e: docker compose config, every profile"
"${COMPOSE[@]}" --profile train --profile tensorboard --profile qdrant --profile vllm config -q

bash "$CONTEXT/docker/quickstart.sh"

say "e2e: /healthz of every service by its compose name, from inside the network"
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

say "e2e: the published ports on 127.0.0.1"
for svc in "${SERVICES[@]}"; do
    var=${PORT_VARS[$svc]}
    path=/healthz; [ "$svc" = ray-head ] && path=/api/version
    python3 -c "import urllib.request, sys; print(sys.argv[1], urllib.request.urlopen(sys.argv[1], timeout=5).status)" \
        "http://127.0.0.1:${!var}$path"
done

if [ "$EVOLVER_TRAIN" = 1 ]; then
    say "e2e: the run's summary.json says it trained $STEPS steps of $EVOLVER_POLICY_MODEL with every mechanism"
    "${COMPOSE[@]}" exec -T studio python -c "
import json, sys
path = '/data/runs/$RUN_NAME/trainer/summary.json'
summary = json.load(open(path))
config = json.load(open('/data/runs/$RUN_NAME/trainer/config.json'))
print(path, {k: summary[k] for k in ('steps', 'rollouts', 'dropped_groups', 'run_id')}, 'model', config['model'])
assert summary['steps'] >= $STEPS, f'trained {summary[\"steps\"]} steps, expected $STEPS'
assert summary['rollouts'] > 0, 'no rollouts'
assert config['model'] == '$EVOLVER_POLICY_MODEL', config['model']
# The self-evolving mechanisms ran, not plain GRPO: every one of them left counts in the summary.
m = summary['mechanisms']
sq, sn, sa = m['self_questioning'], m['self_navigating'], m['self_attributing']
print('self-questioning', {k: sq[k] for k in ('tasks_sampled', 'synthetic_sampled', 'tasks_proposed', 'tasks_kept')})
print('self-navigating', {k: sn[k] for k in ('seeded_trajectories', 'seeded_experiences', 'retrievals', 'hits',
                                               'injected_rollouts', 'experiences_created')})
print('self-attributing', {k: sa[k] for k in ('steps_labelled', 'parsed_labels', 'good', 'bad', 'fallbacks')})
print('advantage estimator', config['advantage']['estimator'])
assert config['advantage']['estimator'] == 'adca_grpo', config['advantage']
assert sq['synthetic_sampled'] > 0, 'no synthetic task was sampled'
# The pool was seeded from the held-apart synthetic tasks before training (launcher.synthesis.seed_experience).
assert sn['seeded_trajectories'] > 0 and sn['seeded_experiences'] > 0, 'the pool was not seeded from self-questioning'
assert sn['injected_rollouts'] > 0, 'no rollout got injected experience'
assert sa['steps_labelled'] > 0, 'the judge labelled no step'
# A random-initialized tiny judge need not write a label that parses (those steps take the outcome's sign).
assert '$EVOLVER_LLM_MODEL' == 'tiny' or sa['parsed_labels'] > 0, 'no label was read from the judge model'
"
    say "e2e: the studio lists the run"
    "${COMPOSE[@]}" exec -T studio python -c "
import urllib.request
page = urllib.request.urlopen('http://127.0.0.1:8090/runs/$RUN_NAME', timeout=10)
assert page.status == 200 and '$RUN_NAME' in page.read().decode(), 'run page'
print('studio: /runs/$RUN_NAME 200')"
fi

say "e2e: peak memory of each container (cgroup, page cache included) against its limit"
for id in $("${COMPOSE[@]}" ps -q); do
    name=$(docker inspect --format '{{.Name}}' "$id"); limit=$(docker inspect --format '{{.HostConfig.Memory}}' "$id")
    full=$(docker inspect --format '{{.Id}}' "$id")
    peak=""
    for f in /sys/fs/cgroup/memory/docker/"$full"/memory.max_usage_in_bytes \
             /sys/fs/cgroup/system.slice/docker-"$full".scope/memory.peak /sys/fs/cgroup/docker/"$full"/memory.peak; do
        [ -r "$f" ] && peak=$(cat "$f") && break
    done
    awk -v n="${name#/}" -v p="${peak:-0}" -v l="$limit" \
        'BEGIN { if (p == 0) printf "    %-40s peak unknown (no cgroup file), limit %.1f GiB\n", n, l/2^30;
                 else printf "    %-40s peak %.2f GiB, limit %.1f GiB\n", n, p/2^30, l/2^30 }'
done
say "e2e: passed"
