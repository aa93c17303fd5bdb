"""The project's import graph, read from the source with `ast` (nothing is imported).

Every `import` and `from ... import` statement counts wherever it stands: at module level, inside a function
(a lazy import), or under `if TYPE_CHECKING:`. A circle that only closes at run time, or only for the type
checker, is still a circle to a reader. Imports by string (`importlib.import_module`) are plugin look-ups by
name and are not edges.

Parsing every file whole takes about 2 s on 2 shared cores, so one regular expression first cuts out each
import statement (skipping strings and comments, so an import written in a docstring is not one) and `ast`
parses just those. An import statement always starts its own line: ruff's E701/E702 forbid `if x: import y`
and `a; import b`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Top-level folders and modules that make up the project (tests/ is not part of it; examples/ and docker/
# hold no Python the project imports).
SOURCE_ROOTS = ("common", "engine", "env_service", "task_manager", "experience_manager", "estimators", "judge", "trainer",
                "llm_server", "evolver_launcher", "studio", "benchmarks", "launcher.py")


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the importing file
    imported: str  # dotted module name of the project module it imports
    path: Path  # the importing file
    line: int


# One pass over the source, left to right: an import statement at the start of a line, or a string or comment
# skipped whole (so a line inside a docstring never starts a statement), or a run of anything else.
_STATEMENTS = re.compile(
    "|".join((
        # An import statement: to the closing parenthesis of its name list, or to the end of its line
        # (backslash continuations included).
        r"(?P<statement>^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]*\([^)]*\)|(?:from|import)\b(?:[^\n\\]|\\.)*))",
        r'"""(?:[^"\\]|\\.|"(?!""))*"""',
        r"'''(?:[^'\\]|\\.|'(?!''))*'''",
        r'"(?:[^"\\\n]|\\.)*"',
        r"'(?:[^'\\\n]|\\.)*'",
        r"#[^\n]*",
        r"[^\"'#\n]+",
        r"\n",
    )),
    re.MULTILINE | re.DOTALL,
)


def import_statements(source: str) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, with its line number in the module."""
    for match in _STATEMENTS.finditer(source):
        text = match.group("statement")
        if text is None:
            continue
        line = source.count("\n", 0, match.start())
        for node in ast.parse(text.strip()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                node.lineno += line
                yield node


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the source roots."""
    files: dict[str, Path] = {}
    for entry in SOURCE_ROOTS:
        top = root / entry
        paths = [top] if top.is_file() else sorted(top.rglob("*.py")) if top.is_dir() else []
        for path in paths:
            files[module_name(path, root)] = path
    return files


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The deepest project module that `target` names (`a.b.c` where only `a.b` is a module: `a.b`)."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, importer: str, files: dict[str, Path]) -> Iterable[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = importer if _is_package(importer, files) else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    for alias in node.names:
        # `from pkg import sub` imports the submodule when there is one, else a name defined in pkg.
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base


def imports(root: Path = REPO) -> list[Import]:
    """Every import of a project module by a project module, once per statement."""
    files = project_files(root)
    found: list[Import] = []
    for importer, path in files.items():
        try:
            statements = list(import_statements(path.read_text(encoding="utf-8")))
        except SyntaxError as exc:
            raise SyntaxError(f"{path}: an import statement that does not parse alone: {exc}") from exc
        for node in statements:
            for target in _targets(node, importer, files):
                imported = _resolve(target, files)
                if imported is not None and imported != importer:
                    found.append(Import(importer, imported, path, node.lineno))
    return list(dict.fromkeys(found))  # `from m import a, b` is one import of m


def import_circles(edges: Iterable[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, largest first."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a long import chain cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components, key=lambda c: (-len(c), c))
