"""A static call graph of cann_export: plain calls, calls through imported modules and names, and self.method
calls. Calls through registry objects (exporter.export) are not followed; name them as seeds."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / 'cann_export').rglob('*.py'):
        parts = list(path.relative_to(ROOT).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts = parts[:-1]
        found['.'.join(parts)] = path
    return found

def call_graph() -> dict[str, set[str]]:
    mods = modules()
    bodies = {}
    aliases = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        package = mod if path.name == '__init__.py' else mod.rpartition('.')[0]
        amap = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split('.')[: len(package.split('.')) - node.level + 1]
                    stem = '.'.join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ''
                for a in node.names:
                    amap[a.asname or a.name] = f'{stem}.{a.name}'
            elif isinstance(node, ast.Import):
                for a in node.names:
                    amap[a.asname or a.name.split('.')[0]] = a.name if a.asname else a.name.split('.')[0]
        aliases[mod] = amap
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bodies[f'{mod}.{node.name}'] = (mod, None, node)
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        bodies[f'{mod}.{node.name}.{sub.name}'] = (mod, node.name, sub)
    graph = {}
    for qual, (mod, cls, fn) in bodies.items():
        calls = set()
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            target = None
            if isinstance(f, ast.Name):
                if f'{mod}.{f.id}' in bodies:
                    target = f'{mod}.{f.id}'
                elif f.id in aliases[mod]:
                    target = aliases[mod][f.id]
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id == 'self' and cls:
                    target = f'{mod}.{cls}.{f.attr}'
                elif f.value.id in aliases[mod]:
                    target = f'{aliases[mod][f.value.id]}.{f.attr}'
            if target in bodies:
                calls.add(target)
            elif target and f'{target}.__init__' in bodies:
                calls.add(f'{target}.__init__')
        graph[qual] = calls
    return graph

def reach(graph: dict[str, set[str]], seeds: list[str]) -> set[str]:
    seen, todo = set(), list(seeds)
    while todo:
        q = todo.pop()
        if q in seen or q not in graph:
            continue
        seen.add(q)
        todo.extend(graph[q])
    return seen
