"""The design's import contract (../shared/DESIGN.md, "Layers and the one rule between them"): imports point
downward only, cli -> search -> perfmodel -> hardware_db, and no modules import each other in a circle,
whether at the top of a file or inside a function (a circle through a deferred import is still one)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Package -> folder, as pyproject.toml's package-dir maps them; the layer of each, lowest first.
PACKAGES = {"perfmodel.hardware_db": "hardware_db", "perfmodel": "perfmodel", "perfmodel.search": "search",
            "perfmodel.cli": "cli"}
LAYERS = ("perfmodel.hardware_db", "perfmodel", "perfmodel.search", "perfmodel.cli")


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _imports(name: str, path: Path, known) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (``from x import y`` counts x, and x.y
    when y is a module)."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(base[:len(base) - node.level + 1] + ([module] if module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def _layer(module: str) -> int:
    """The layer of the innermost package holding ``module``."""
    holders = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return LAYERS.index(max(holders, key=len))


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_imports_point_downward_only():
    graph = _graph()
    upward = [f"{a} imports {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
              if _layer(b) > _layer(a)]
    assert not upward


def test_no_modules_import_each_other_in_a_circle():
    assert not _circles(_graph())


def test_the_checks_see_a_circle_and_an_upward_import():
    """The checks themselves: a made-up circle and a made-up upward import are found."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("perfmodel.search.train") > _layer("perfmodel.training") > _layer("perfmodel.hardware_db.files")
    graph = _graph()
    assert "perfmodel.search.train" in graph["perfmodel.search.api"]      # the graph reads deferred imports too
    assert "perfmodel.hardware_db.limits" in graph["perfmodel.hardware_db.files"]


def test_no_module_is_longer_than_a_reader_takes_in():
    """Issue 31's house rule: no module above 700 lines outside tests and data."""
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 700}
    assert not long
