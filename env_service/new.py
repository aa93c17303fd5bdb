"""`python -m env_service.new NAME --kind remote|plugin|gym [--dir DIR]`: start a new environment project.

Writes a runnable environment (tools, train/validation/test tasks, an evaluator, `state`), a `run.yaml`
that trains on it for 2 steps with the tiny model (with self-questioning where the task manager can explore
it), a pytest file that runs the conformance kit against it and checks that run.yaml's 2 steps have a
non-zero gradient, and a README saying how to run each.

- `plugin`: an `Environment` subclass that env_service imports and serves in-process;
- `remote`: a FastAPI server of its own (you start it) speaking the /v1 protocol, reached through `remote`;
- `gym`: a `gymnasium.Env` registered by importing its module, played as text by the `gym` environment.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from pathlib import Path

KINDS = ("plugin", "remote", "gym")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
# Names the generated modules would shadow, or that env_service already serves.
TAKEN = {"common", "engine", "estimators", "judge", "env_service", "task_manager", "experience_manager", "llm_server", "studio",
         "trainer", "evolver_launcher", "launcher", "benchmarks", "gym", "gymnasium", "remote", "test", "tests"}


def template(name: str) -> str:
    return resources.files("env_service.scaffold").joinpath(name).read_text()


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def project_files(name: str, kind: str) -> dict[str, str]:
    """The files of a new `kind` project for environment `name`: relative path -> text."""
    if kind not in KINDS:
        raise ValueError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    trainer = template("trainer.yaml.txt")
    task_manager = template("task_manager.yaml.txt")
    if kind == "plugin":
        files = {f"{name}_world.py": template("world.py.txt"), f"{name}_env.py": template("plugin_env.py.txt"),
                 "run.yaml": template("run_plugin.yaml.txt")}
        served = name
    elif kind == "remote":
        files = {f"{name}_world.py": template("world.py.txt"), f"{name}_server.py": template("remote_server.py.txt"),
                 "run.yaml": template("run_remote.yaml.txt")}
        served = "remote"
    else:
        files = {f"{name}_gym.py": template("gym_env.py.txt"), "run.yaml": template("run_gym.yaml.txt")}
        served = "gym"
    files[f"test_{name}.py"] = template("test_header.py.txt") + template(f"test_{kind}.py.txt")
    files["README.md"] = template(f"readme_{kind}.md.txt")
    files["pytest.ini"] = template("pytest.ini.txt")
    # The world's read-only tool has a `lookups` profile section: questions about what it read (not gym's).
    lookups = kind in ("plugin", "remote")
    values = {"TASK_MANAGER": task_manager, "TRAINER": trainer, "KINDS": "[goal, lookup]" if lookups else "[goal]",
              "LOOKUP_NOTE": "; lookup: questions about what a read-only tool returned" if lookups else "", "ROLLOUT_ENV": served, "SERVED_ENV": served,
              "GYM_ID": f"{class_name(name)}-v0", "name": name, "Class": class_name(name)}
    rendered = {}
    for path, text in files.items():
        for key, value in values.items():  # outer slots first: the YAML pieces hold {{name}} themselves
            text = text.replace("{{" + key + "}}", value)
        rendered[path] = text
    return rendered


def check_name(name: str) -> str | None:
    """Why `name` cannot name an environment, or None."""
    if not NAME_PATTERN.match(name):
        return (f"NAME must be lowercase letters, digits and _, starting with a letter (at most 40), "
                f"got {name!r}: it becomes a Python module name and the environment's name in the YAML")
    if name in TAKEN:
        return f"NAME {name!r} is taken (it would shadow a module or a built-in environment); pick another"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env_service.new", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("name", help="the environment's name (lowercase, e.g. shelves)")
    parser.add_argument("--kind", required=True, choices=KINDS, help="how evolver reaches it")
    parser.add_argument("--dir", default=None, help="the folder to create (default: ./NAME); must not exist or be empty")
    args = parser.parse_args(argv)
    problem = check_name(args.name)
    if problem:
        parser.error(problem)
    folder = Path(args.dir or args.name)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        parser.error(f"--dir {folder} exists and is not an empty folder: pick a new one, nothing was written")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in project_files(args.name, args.kind).items():
        (folder / path).write_text(text)
    print(f"wrote a {args.kind} environment {args.name!r} in {folder}/: {', '.join(sorted(project_files(args.name, args.kind)))}")
    print(f"next: see {folder / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
