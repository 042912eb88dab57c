"""Lower layers never import upper ones: every import of a raytrainer module, at module level or inside a
function, goes to a module of its own layer or of a layer below it. And no module imports itself back through
others (no cycle), within a layer too.

The layers are the table under "Layers: lower never imports upper" in docs/design.md (its first two columns:
the layer, and its modules in backticks, a folder written `name/`): the page is the one source, so the page
and this test cannot disagree. Every module of the package must be in exactly one layer.

Plain file reading with `ast`: no Ray, no torch, a few milliseconds.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from tests.support import ROOT

while not os.path.isfile(os.path.join(ROOT, "pyproject.toml")) and os.path.dirname(ROOT) != ROOT:
    ROOT = os.path.dirname(ROOT)  # the tests may move into sub-folders: find the repository root

PACKAGE = "raytrainer"
DESIGN = os.path.join(ROOT, "docs", "design.md")
TABLE_HEADING = "## Layers: lower never imports upper"

# Upward imports that are known and being removed, each as (importing module, imported module), with the issue
# that removes it. Empty: none is allowed. An entry whose import is gone fails the test until it is removed.
KNOWN_EXCEPTIONS: set = set()


@pytest.fixture(autouse=True)
def no_leaked_process_group():
    """Replaces the suite's guard of the same name (tests/conftest.py): no process group here, and the guard's
    import of raytrainer (torch, Ray) would cost seconds."""
    yield


def read_layers() -> list[tuple[str, list[str]]]:
    """[(layer, [module or folder name, ...])] from the design page's table, top layer first."""
    with open(DESIGN, encoding="utf-8") as f:
        text = f.read()
    assert TABLE_HEADING in text, f"{DESIGN} has no heading {TABLE_HEADING!r}: the layers table is read from it"
    rows = []
    for line in text.split(TABLE_HEADING, 1)[1].lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= set("-: ") or cells[0].startswith("layer"):
            continue  # the header and its separator
        rows.append((cells[0], [n.rstrip("/") for n in re.findall(r"`([^`]+)`", cells[1])]))
    assert rows, f"no layers table under {TABLE_HEADING!r} in {DESIGN}"
    return rows


def package_modules() -> dict[str, str]:
    """Dotted module name -> file path, for every .py file of the package."""
    out = {}
    base = os.path.join(ROOT, PACKAGE)
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = [PACKAGE, *os.path.relpath(path, base)[:-3].split(os.sep)]
                if parts[-1] == "__init__" and len(parts) > 2:
                    parts.pop()
                out[".".join(parts)] = path
    return out


def layer_index(module: str, layers) -> int | None:
    """The layer of a module: its top-level name under raytrainer (a file or a folder), `__init__` for the
    package itself."""
    key = module.split(".")[1] if "." in module else "__init__"
    for index, (_, names) in enumerate(layers):
        if key in names:
            return index
    return None


def _type_checking_only(tree: ast.AST) -> set:
    """The nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports that no process runs."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (getattr(node.test, "id", None) == "TYPE_CHECKING"
                                         or getattr(node.test, "attr", None) == "TYPE_CHECKING"):
            for child in node.body:
                out.update(id(n) for n in ast.walk(child))
    return out


def imports(path: str, module: str, modules: dict, type_checking: bool = True) -> list[tuple[int, str]]:
    """(line, imported raytrainer module) for every import in the file, wherever it stands. `from . import x`
    counts as importing the module x when x is one, else the package. `type_checking=False` leaves out the
    imports under `if TYPE_CHECKING:`."""
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    skipped = set() if type_checking else _type_checking_only(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                out.append((node.lineno, submodule if submodule in modules else target))
    return sorted((line, name) for line, name in out if name == PACKAGE or name.startswith(PACKAGE + "."))


def import_cycles(graph: dict) -> list[list[str]]:
    """Every group of modules that import each other, directly or through others (the strongly connected
    components of more than one module, Tarjan's algorithm), each as one cycle through it: [a, b, ..., a]."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(set(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, group) for group in groups]


def _one_cycle(graph: dict, group: set) -> list[str]:
    """A shortest path from the group's first module back to itself, through the group (breadth first)."""
    start = min(group)
    paths = {nxt: [start, nxt] for nxt in sorted(graph[start] & group)}
    queue = list(paths)
    while queue:
        node = queue.pop(0)
        if node == start:
            return paths[node]
        for nxt in sorted(graph[node] & group):
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return sorted(group)  # unreachable for a strongly connected group


def test_the_table_names_every_module_once():
    layers = read_layers()
    seen: dict = {}
    for layer, names in layers:
        for name in names:
            assert name not in seen, f"{name!r} is in two layers of {DESIGN}: {seen[name]!r} and {layer!r}"
            seen[name] = layer
    modules = package_modules()
    missing = sorted({m.split(".")[1] if "." in m else "__init__" for m in modules
                      if layer_index(m, layers) is None})
    assert not missing, (f"modules in no layer of the table in {DESIGN}: {', '.join(missing)}. Add each to the "
                         "layer it belongs to.")
    tops = {m.split(".")[1] if "." in m else "__init__" for m in modules}
    stale = sorted(set(seen) - tops)
    assert not stale, f"the table in {DESIGN} names modules that do not exist: {', '.join(stale)}"


def test_no_module_imports_a_higher_layer():
    layers = read_layers()
    modules = package_modules()
    found, used = [], set()
    for module, path in sorted(modules.items()):
        here = layer_index(module, layers)
        for line, target in imports(path, module, modules):
            there = layer_index(target, layers)
            if here is None or there is None or there >= here:
                continue  # same or lower layer (the table is top first); unknown: the other test names it
            if (module, target) in KNOWN_EXCEPTIONS:
                used.add((module, target))
                continue
            found.append(f"{os.path.relpath(path, ROOT)}:{line}: {module} (layer {layers[here][0]!r}) imports "
                         f"{target} (layer {layers[there][0]!r}, above it)")
    assert not found, "upward imports (see the layers in docs/design.md):\n" + "\n".join(found)
    stale = sorted(KNOWN_EXCEPTIONS - used)
    assert not stale, f"KNOWN_EXCEPTIONS lists imports that are gone; remove them: {stale}"


def test_no_import_cycle():
    """No module imports itself back, directly or through others, also through imports inside functions: a
    cycle makes the import order decide what exists, and a lazy import inside a function is how one hides. An
    import under `if TYPE_CHECKING:` runs in no process and is left out."""
    modules = package_modules()
    graph = {module: {target for _, target in imports(path, module, modules, type_checking=False)} - {module}
             for module, path in modules.items()}
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (break each by moving what both need into a module both import):\n" + \
        "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The check itself: a -> b at module level and b -> a inside a function is a cycle; a -> c alone is not;
    a TYPE_CHECKING import back is not."""
    package = tmp_path / PACKAGE / "pkg"
    package.mkdir(parents=True)
    (package / "a.py").write_text("from . import b\nfrom .c import thing\n")
    (package / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n")
    modules = {f"{PACKAGE}.pkg.{name}": str(package / f"{name}.py") for name in "abc"}
    graph = {m: {t for _, t in imports(p, m, modules, type_checking=False)} for m, p in modules.items()}
    assert import_cycles(graph) == [[f"{PACKAGE}.pkg.a", f"{PACKAGE}.pkg.b", f"{PACKAGE}.pkg.a"]]
    graph[f"{PACKAGE}.pkg.b"] = set()
    assert import_cycles(graph) == []


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The parser itself: module level and function level, `from . import x`, `from ..x import y`."""
    source = ("from . import storage\nfrom ..worker_context import WorkerContext\n\n\ndef f():\n"
              "    from ..coordinator.jobs import JobBoard\n    import raytrainer.trainer\n")
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {"raytrainer.storage": "", "raytrainer.coordinator.jobs": ""}
    found = imports(str(path), "raytrainer.callbacks.mod", modules)
    assert found == [(1, "raytrainer.callbacks"), (2, "raytrainer.worker_context"),
                     (6, "raytrainer.coordinator.jobs"), (7, "raytrainer.trainer")]
