"""A static call graph of cann_export: plain calls, calls through imported modules and names, and
``self.method`` calls. Calls through registry objects (``exporter.export``) are not followed: name them as
seeds. ``modules`` is also the module walk of tests/test_architecture.py."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(packages: tuple[str, ...] = ("cann_export",)) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages``."""
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _aliases(tree: ast.Module, package: str) -> dict[str, str]:
    """Every name a module binds by import (at any depth) -> the dotted thing it names."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for a in node.names:
                names[a.asname or a.name] = f"{stem}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return names


def _functions(tree: ast.Module, mod: str) -> dict[str, tuple[str | None, ast.AST]]:
    """``mod.func`` and ``mod.Class.method`` -> (the class or None, the function's node)."""
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[f"{mod}.{node.name}"] = (None, node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{mod}.{node.name}.{sub.name}"] = (node.name, sub)
    return found


def _callee(call: ast.Call, mod: str, cls: str | None, names: dict[str, str], bodies: dict) -> str | None:
    f = call.func
    target = None
    if isinstance(f, ast.Name):
        target = f"{mod}.{f.id}" if f"{mod}.{f.id}" in bodies else names.get(f.id)
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        if f.value.id == "self" and cls:
            target = f"{mod}.{cls}.{f.attr}"
        elif f.value.id in names:
            target = f"{names[f.value.id]}.{f.attr}"
    if target in bodies:
        return target
    return f"{target}.__init__" if target and f"{target}.__init__" in bodies else None


def call_graph() -> dict[str, set[str]]:
    """Function -> the functions it calls, for every function and method of cann_export."""
    bodies, owners = {}, {}
    for mod, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        names = _aliases(tree, package)
        for qual, (cls, node) in _functions(tree, mod).items():
            bodies[qual] = node
            owners[qual] = (mod, cls, names)
    graph = {}
    for qual, node in bodies.items():
        mod, cls, names = owners[qual]
        graph[qual] = {c for call in ast.walk(node) if isinstance(call, ast.Call)
                       if (c := _callee(call, mod, cls, names, bodies))}
    return graph


def reach(graph: dict[str, set[str]], seeds: list[str]) -> set[str]:
    """Every function reachable from ``seeds``."""
    seen, todo = set(), list(seeds)
    while todo:
        q = todo.pop()
        if q in seen or q not in graph:
            continue
        seen.add(q)
        todo.extend(graph[q])
    return seen
