#!/usr/bin/env bash
# The local trainer's device check (benchmarks/speed/gpu_check.py: engine, log-probs, one GRPO step, one
# warm-start step, tokens/s, peak GPU memory) as one command for a GPU machine that has torch, transformers,
# accelerate, peft and httpx but none of evolver's other dependencies (no Ray, vLLM, FastAPI, Qdrant): the
# wheels in benchmarks/speed/wheels/ (listed with their sizes in gpu_check_wheels.txt) that this Python can
# use and lacks are unpacked into a temporary folder on PYTHONPATH first. Writes one JSON file under
# benchmarks/results/ (or --out) and prints it; about 5 minutes on one GPU, within the 8 it may take.
#
#   bash benchmarks/speed/gpu_check.sh --fetch-wheels     # where PyPI is reachable: download the listed wheels
#   bash benchmarks/speed/gpu_check.sh                    # on the GPU machine: both models, CPU and CUDA
#   bash benchmarks/speed/gpu_check.sh --device cpu --model tiny --out /tmp/check.json   # what CI runs
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=benchmarks/speed/wheels
LIST=benchmarks/speed/gpu_check_wheels.txt

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  $PY - "$LIST" "$WHEELS" <<'PY'
import subprocess
import sys
from pathlib import Path

listing, folder = Path(sys.argv[1]), Path(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
wanted = [line.split() for line in listing.read_text().splitlines() if line.strip() and not line.startswith("#")]
for name, size in wanted:
    dist, version, python, abi, platforms = name.removesuffix(".whl").split("-")
    target = ["--python-version", "3.12"]
    if platforms != "any":  # a compiled wheel: exactly this ABI and platform
        target += ["--implementation", "cp", "--abi", abi, *(x for p in platforms.split(".") for x in ("--platform", p))]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--dest", str(folder), *target, f"{dist}=={version}"], check=True)
    got = (folder / name).stat().st_size
    print(f"{name} {got} bytes" + ("" if got == int(size) else f" (the list says {size}: update it)"))
PY
  exit 0
fi

SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
$PY - "$WHEELS" "$SITE" <<'PY'
import importlib.util
import sys
import zipfile
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename

folder, site = Path(sys.argv[1]), Path(sys.argv[2])
supported = set(sys_tags())
unpacked = []
for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
    if not parse_wheel_filename(wheel.name)[3] & supported:
        continue  # another Python or platform
    with zipfile.ZipFile(wheel) as archive:
        tops = {n.split("/")[0] for n in archive.namelist()}
        modules = {t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data"))}
        if all(importlib.util.find_spec(m) is not None for m in modules):
            continue  # this Python has it already: never shadow an installed package
        archive.extractall(site)
        unpacked.append(wheel.name)
print(f"gpu_check: unpacked {len(unpacked)} carried wheel(s){': ' if unpacked else ''}{', '.join(unpacked)}",
      file=sys.stderr)
PY
PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE" $PY benchmarks/speed/gpu_check.py "$@"
