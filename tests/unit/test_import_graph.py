"""No import circles among our modules: a module that two others need sits below both (a circle once hid in
lazy imports inside functions, which this reads as well: every ``import`` statement counts)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"ascend_engine": "engine", "ascend_operator": "operator", "ascend_cluster": "cluster",
            "ascend_train": "cli"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in (ROOT / folder / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imports(name: str, is_package: bool, node: ast.AST, modules: dict) -> set[str]:
    """Our modules that one import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - node.level + 1] if node.level else []
        prefix = ".".join(base + ([node.module] if node.module else []))
        targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                   for alias in node.names]
    out = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):  # its own package's __init__
            out.add(target)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted(component + [v]))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_itself_through_others():
    modules = _modules()
    graph = {}
    for name, (path, is_package) in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.module != "__future__"):
                graph[name] |= _imports(name, is_package, node, modules)
    assert "ascend_engine.models.gpt" in graph["ascend_engine.train.loop"]  # an import inside a function counts
    assert _circles(graph) == []
