"""Every shell script in the repository parses (`bash -n`) and passes shellcheck.

The scripts are found, never listed: every `*.sh` git knows about (tracked, or new and not ignored) and
every other file whose first line is a shell shebang (`.ci/run`), so a script added tomorrow is checked
without anyone touching this file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

# Warnings too, not only errors: they include assignments a command never sees (SC2097/SC2098) and
# similar bugs that parse fine. SC1073 "couldn't parse" (a quote opened inside ${...:-...}) is an error.
SHELLCHECK_SEVERITY = "warning"
SHELL_SHEBANG = re.compile(rb"#!\s*(/usr/bin/env\s+)?(/\S*/)?(bash|sh|dash)\b")


def shell_scripts(root: Path) -> list[Path]:
    """Every shell script git sees under `root`: `*.sh`, and any file starting with a shell shebang."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    scripts = []
    for name in filter(None, listed):
        path = root / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        with path.open("rb") as f:
            head = f.read(128)
        if name.endswith(".sh") or SHELL_SHEBANG.match(head):
            scripts.append(path)
    return sorted(scripts)


def parse_errors(script: Path) -> str:
    """`bash -n` (or `sh -n` for a POSIX sh script): '' when it parses, else the shell's message."""
    first = script.read_bytes().split(b"\n", 1)[0]
    match = SHELL_SHEBANG.match(first)
    shell = "sh" if match and match.group(3) in ("sh", "dash") else "bash"
    done = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, timeout=30)
    return "" if done.returncode == 0 else done.stderr.strip() or f"{shell} -n exited {done.returncode}"


def shellcheck_findings(scripts: list[Path], cwd: Path) -> str:
    """shellcheck's findings at SHELLCHECK_SEVERITY and above ('' when none). `-x` follows `source`d
    files; `source=` directives are relative to `cwd` (the repo root)."""
    done = subprocess.run([shellcheck_binary(), "-x", "-S", SHELLCHECK_SEVERITY, "-f", "gcc",
                           *(str(s.relative_to(cwd)) for s in scripts)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)
    if done.returncode not in (0, 1):  # 1: findings; anything else: shellcheck itself failed
        pytest.fail(f"shellcheck exited {done.returncode}: {done.stderr}")
    return done.stdout.strip()


def shellcheck_binary() -> str:
    """Debian's shellcheck: installed with apt when missing and root (as install.sh does), else a clear failure."""
    found = shutil.which("shellcheck")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "shellcheck"]
        if subprocess.run(install, capture_output=True, env=env, timeout=300).returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=300)
            subprocess.run(install, capture_output=True, env=env, timeout=300)
        found = shutil.which("shellcheck")
    if not found:
        pytest.fail("shellcheck is not installed and could not be installed here: run `bash install.sh` as root, "
                    "or `sudo apt-get install shellcheck` (Debian/Ubuntu), then run the tests again")
    return found


def test_every_shell_script_in_the_repository_parses_and_passes_shellcheck():
    scripts = shell_scripts(REPO)
    names = {str(s.relative_to(REPO)) for s in scripts}
    # What the discovery must find today (a lower bound: anything added later is found the same way).
    assert {"install.sh", ".ci/run", "docker/quickstart.sh", "docker/e2e.sh", "docker/lib.sh"} <= names, names
    unparsable = {str(s.relative_to(REPO)): err for s in scripts if (err := parse_errors(s))}
    assert unparsable == {}, f"scripts that do not parse: {unparsable}"
    findings = shellcheck_findings(scripts, REPO)
    assert findings == "", f"shellcheck -S {SHELLCHECK_SEVERITY} on {len(scripts)} scripts:\n{findings}"


def test_a_new_script_is_found_and_an_unclosed_quote_in_a_default_fails_both_checks(tmp_path):
    """Discovery on a scratch repository: a committed `.sh`, an untracked one, an extensionless bash
    script; not Python, not an ignored file. And the two checks catch the apostrophe that broke
    docker/quickstart.sh (`"${STEPS:-the quickstart's}"`)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    good = '#!/usr/bin/env bash\nset -euo pipefail\necho "${STEPS:-two} steps"\n'
    broken = '#!/usr/bin/env bash\necho "training ${STEPS:-the quickstart\'s} steps"\n'
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "run").write_text(good)
    (tmp_path / "setup.sh").write_text(good)
    (tmp_path / "tool.py").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    (tmp_path / ".gitignore").write_text("ignored.sh\n")
    (tmp_path / "ignored.sh").write_text(broken)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    (tmp_path / "new.sh").write_text(broken)  # untracked: a script being written counts already
    found = [str(p.relative_to(tmp_path)) for p in shell_scripts(tmp_path)]
    assert found == ["ci/run", "new.sh", "setup.sh"]

    assert parse_errors(tmp_path / "setup.sh") == "" and shellcheck_findings([tmp_path / "setup.sh"], tmp_path) == ""
    assert "unexpected EOF" in parse_errors(tmp_path / "new.sh")
    assert "new.sh:2:" in shellcheck_findings([tmp_path / "new.sh"], tmp_path)
