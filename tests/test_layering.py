"""No import circles, and the layering rule of docs/development.md ("Layout and layering"), read from the source.

The rule, by layer, lowest first:

0. shared libraries: `common` (wire schemas, config, the service base, HTTP and LLM clients), `engine` (the
   inference engine and model loading), `estimators` (the advantage math). Every package may import
   any of their modules; they import only each other.
1. packages: the services (`env_service`, `task_manager`, `experience_manager`, `judge`,
   `llm_server`, `studio`) and the `trainer`. Of another package, a package imports only its public modules:
   `client` (how to call the service), `protocol`/`schemas` (wire types), `settings`/`config` (the settings
   models of its section of the run YAML). Services talk to each other over HTTP through those clients.
2. the launcher: `evolver_launcher` and `launcher.py`. Imports the packages' public modules, like a package.
3. the benchmarks: `benchmarks/` measures internals (as `tests/` does), so it may import any module.

Nothing imports a layer above its own. Imports inside a package are free, as long as they make no circle.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from tests.import_graph import REPO, Import, import_circles, import_statements, imports

SHARED = ("common", "engine", "estimators")
LAUNCHER = ("evolver_launcher", "launcher")
HARNESS = ("benchmarks",)
PUBLIC = ("client", "protocol", "schemas", "settings", "config")
# Imports the rule would refuse, each allowed for the reason given.
ALLOWED = {
    ("evolver_launcher.doctor", "env_service.registry"):
        "the doctor loads a run's environments in-process, as the service will, to report a missing data "
        "file or package before anything starts",
}
# Circles whose fix belongs to another change in flight: each must still exist (remove it once fixed).
KNOWN_CIRCLES: dict[tuple[str, ...], str] = {}

RULE = ("rule (docs/development.md, Layout and layering): of another package import only its public modules "
        f"({', '.join(PUBLIC)}) or a shared library ({', '.join(SHARED)}); nothing imports a layer above its own")


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def unit(module: str) -> str:
    """The package a module belongs to for the rule."""
    for prefix in SHARED + LAUNCHER:
        if _within(module, prefix):
            return "evolver_launcher" if prefix in LAUNCHER else prefix
    return module.split(".")[0]


def layer(unit_name: str) -> int:
    if unit_name in SHARED:
        return 0
    if unit_name == "evolver_launcher":
        return 2
    if unit_name in HARNESS:
        return 3
    return 1


def violation(edge: Import) -> str | None:
    """Why `edge` breaks the rule, or None."""
    importer, imported = unit(edge.importer), unit(edge.imported)
    if importer == imported or (edge.importer, edge.imported) in ALLOWED:
        return None
    if layer(imported) > layer(importer):
        return f"{importer} (layer {layer(importer)}) imports {imported}, a layer above it ({layer(imported)})"
    if layer(importer) == 3 or layer(imported) == 0:
        return None
    if edge.imported.rpartition(".")[2] in PUBLIC:
        return None
    return f"{edge.imported} is internal to {imported}"


def violations(edges: list[Import], root: Path) -> list[str]:
    return [f"{edge.path.relative_to(root)}:{edge.line} imports {edge.imported}: {why}"
            for edge in edges if (why := violation(edge)) is not None]


def circle_messages(edges: list[Import], root: Path, known: dict[tuple[str, ...], str]) -> list[str]:
    """A message per new circle (each of its imports, by file and line), and per known circle that is gone."""
    messages = []
    circles = import_circles(edges)
    for circle in circles:
        if tuple(circle) in known:
            continue
        members = set(circle)
        links = sorted({f"{e.path.relative_to(root)}:{e.line} imports {e.imported}" for e in edges
                        if e.importer in members and e.imported in members})
        messages.append(f"import circle among {', '.join(circle)}:\n    " + "\n    ".join(links))
    messages += [f"the known circle {', '.join(gone)} is gone: remove it from KNOWN_CIRCLES"
                 for gone in known if list(gone) not in circles]
    return messages


@cache
def project_imports() -> list[Import]:
    return imports(REPO)


def test_the_project_has_no_import_circle():
    problems = circle_messages(project_imports(), REPO, KNOWN_CIRCLES)
    assert not problems, "\n".join(problems) + "\nno circles, function-local and TYPE_CHECKING imports included: " \
                                               "move what both sides need into a third module, or pass it in"


def test_every_import_between_packages_follows_the_layering_rule():
    problems = violations(project_imports(), REPO)
    assert not problems, "\n".join(problems) + "\n" + RULE


def test_every_allowed_exception_is_still_needed():
    edges = {(e.importer, e.imported) for e in project_imports()}
    assert set(ALLOWED) <= edges, f"remove from ALLOWED: {set(ALLOWED) - edges}"


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_find_a_planted_circle_and_planted_violations(tmp_path):
    """A temporary tree: a circle closed by a TYPE_CHECKING import and a function-local relative one, an
    internal module imported inside a function, a shared library importing a service; an import written in a
    docstring and a public client import are not findings."""
    _write(tmp_path, {
        "common/__init__.py": "",
        "common/text.py": "def f():\n    import trainer.loop\n",
        "task_manager/__init__.py": "",
        "task_manager/client.py": "",
        "task_manager/store.py": "",
        "trainer/__init__.py": "",
        "trainer/loop.py": ('"""Not an import:\nfrom task_manager.store import TaskStore\n"""\n'
                            "from typing import TYPE_CHECKING\n\nfrom task_manager.client import TaskClient\n\n"
                            "if TYPE_CHECKING:\n    from trainer.summary import Record\n"),
        "trainer/summary.py": "def record():\n    from . import loop\n    from task_manager import (\n        store,\n    )\n",
        "benchmarks/probe.py": "from task_manager.store import TaskStore, \\\n    TaskRow  # a comment: 'quote\n",
    })
    for path in tmp_path.rglob("*.py"):  # the fast scan finds what a whole-file parse finds
        text = path.read_text()
        whole = [(n.lineno, ast.dump(n)) for n in ast.walk(ast.parse(text))
                 if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert [(n.lineno, ast.dump(n)) for n in import_statements(text)] == whole, path
    edges = imports(tmp_path)
    assert circle_messages(edges, tmp_path, {}) == [
        "import circle among trainer.loop, trainer.summary:\n"
        "    trainer/loop.py:9 imports trainer.summary\n    trainer/summary.py:2 imports trainer.loop"]
    assert violations(edges, tmp_path) == [
        "common/text.py:2 imports trainer.loop: common (layer 0) imports trainer, a layer above it (1)",
        "trainer/summary.py:3 imports task_manager.store: task_manager.store is internal to task_manager",
    ]
    assert circle_messages(edges, tmp_path, {("a", "b"): "fixed elsewhere"})[-1] == \
        "the known circle a, b is gone: remove it from KNOWN_CIRCLES"
