"""The package's layout: imports point one way (no cycles), and every module imports alone.

A cycle hidden in a function-level import still couples two modules both
ways (and breaks as soon as someone moves the import to the top), so the
graph counts every import of a ``beam_pipeline`` module, wherever it is.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "beam_pipeline"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """{dotted module name: file} for every module of the package (packages by their ``__init__``)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, module-level and function-level imports alike.

    A submodule also depends on its parent packages (Python runs their ``__init__`` first).
    """
    modules = module_names(package)
    root = package.name
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from . import x` names a module x; `from .x import y` names x (y is an attribute, or a submodule)
                targets.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                )
        for target in targets:
            # `import beam_pipeline.a.b` depends on the nearest module the name reaches
            while target and target not in modules and target.startswith(root):
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (also inside top-level ``if``/``try``): what others may import."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(), str(path)).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []), *getattr(node, "handlers", [])]
        elif isinstance(node, ast.ExceptHandler):
            body += node.body
    return names


def missing_imports(package: Path = PACKAGE) -> list[str]:
    """``from .x import y`` (anywhere, function bodies too) where x is none of the package's modules or defines no y.

    A function-level import runs only when its function does: after a move, a stale one fails at run time
    (on a worker), not when the module is imported.
    """
    modules = module_names(package)
    problems = []
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                if base not in modules:
                    problems.append(f"{name}:{node.lineno}: no module {base}")
                    continue
                defined = defined_names(modules[base])
                for alias in node.names:
                    if f"{base}.{alias.name}" not in modules and alias.name not in defined:
                        problems.append(f"{name}:{node.lineno}: {base} has no {alias.name}")
    return problems


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_sees_a_cycle_through_a_function_level_import(tmp_path):
    """The checker itself: a cycle made only by an import inside a function is found; a chain is not a cycle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub.b import f\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg", "pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg", "pkg.sub", "pkg.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("")
    assert find_cycle(import_graph(package)) is None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_missing_imports_sees_a_stale_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '1'\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("X, Y = 1, 2\nif True:\n    def f(): pass\n")
    (package / "sub" / "b.py").write_text(
        "from .. import __version__, a\nfrom ..a import X, Y, f\ndef g():\n    from . import a\n    from .c import z\n"
    )
    assert missing_imports(package) == ["pkg.sub.b:4: pkg.sub has no a", "pkg.sub.b:5: no module pkg.sub.c"]


def test_every_package_import_names_something_that_exists():
    assert missing_imports() == []


# Imports each module in a child forked from one interpreter that has loaded only third-party modules (Beam alone
# takes ~3 s to import): the packages the package names at module level, then every other module a whole import
# of the package loads besides its own (learned in a throwaway child). Each child starts with no module of the
# project loaded, as a fresh interpreter does, and the 70-odd imports take seconds instead of minutes.
_FORK_EACH = """
import gc, importlib, json, os, sys, traceback
package, modules = sys.argv[1], json.loads(sys.stdin.read())
ours = lambda name: name.split(".")[0] == package
for name in sys.argv[2:]:
    importlib.import_module(name)
read, write = os.pipe()
if os.fork() == 0:  # what importing the whole package loads besides it (submodules of those packages)
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException:
            pass
    os.write(write, json.dumps([m for m in sys.modules if not ours(m)]).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read, "rb") as pipe:
    also = json.loads(pipe.read())
os.wait()
for name in also:
    if name not in sys.modules:
        try:
            importlib.import_module(name)
        except BaseException:
            pass
assert not [m for m in sys.modules if ours(m)], "a third-party import loaded the package"
gc.freeze()  # the children's collections skip what is loaded: no copying of every page on write
results = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            message = ""
        except BaseException:
            message = traceback.format_exc()
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        results[module] = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if status and not results[module]:
        results[module] = f"the child ended with status {status}"
print(json.dumps(results))
"""


def third_party_imports(package: Path = PACKAGE) -> list[str]:
    """The non-standard-library modules the package imports at module level (top-level statements only)."""
    found = set()
    for path in module_names(package).values():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
    return sorted(
        name
        for name in found
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] not in (package.name, "__future__")
    )


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, str]:
    """{module: "" or the traceback of importing it alone}, for every module of the package."""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_EACH, PACKAGE.name, *third_party_imports()],
        input=json.dumps(sorted(module_names())),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_third_party_imports_are_found():
    assert "apache_beam" in third_party_imports() and "json" not in third_party_imports()


@pytest.mark.e2e
@pytest.mark.parametrize("module", sorted(module_names()))
def test_every_module_imports_alone_in_a_fresh_interpreter(module, imported_alone):
    """``import beam_pipeline.X`` with nothing of the package loaded: X and what it imports load in whatever
    order X starts."""
    assert imported_alone[module] == ""


def test_a_module_that_needs_another_loaded_first_fails_alone(tmp_path, monkeypatch):
    """The forked import sees what a fresh interpreter sees: a module that works only once a sibling is loaded
    (it reaches an attribute the sibling's import sets) fails."""
    package = tmp_path / "pkgx"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import pkgx\nVALUE = pkgx.b.X\n")
    (package / "b.py").write_text("X = 1\n")
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_EACH, "pkgx", "json"],
        input=json.dumps(["pkgx.b", "pkgx.a"]),
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    results = json.loads(proc.stdout.splitlines()[-1])
    assert results["pkgx.b"] == "" and "has no attribute 'b'" in results["pkgx.a"]
