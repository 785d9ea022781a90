"""Which ``guards_code`` strings of a .pt2 are plain shape checks. torch/export/_unlift.py ``exec()``s each
one as ``torch._assert(<guard>, "Guard failed: <guard>")`` when the module is built, and torch.export.save
writes them for any program whose inputs share a dynamic dimension (``L['ids'].size()[0] ==
L['mask'].size()[0]``). A guard passes only when it parses as one expression built from integer constants,
arithmetic, comparisons, and/or/not, and size/stride lookups of the inputs (``L['name'].size()[i]``, names
plain identifiers, so nothing can leave the string torch embeds it in)."""
from __future__ import annotations

import ast
import re

MAX_GUARDS = 10_000
MAX_GUARD_CHARS = 2_000
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_METHODS = frozenset(["size", "stride"])


def _is_input(node: ast.AST) -> bool:
    """``L['name']``, ``L['name'][0]``, ``L['kwargs']['name']``: an input of the guard function."""
    while isinstance(node, ast.Subscript):
        key = node.slice
        if not isinstance(key, ast.Constant) or isinstance(key.value, bool) or not (
                (isinstance(key.value, str) and _IDENT.match(key.value)) or isinstance(key.value, int)):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"


def _is_term(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_term(node.operand)
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _ARITH) and _is_term(node.left) and _is_term(node.right)
    if isinstance(node, ast.Subscript):  # L['x'].size()[0]
        index, call = node.slice, node.value
        return (isinstance(index, ast.Constant) and type(index.value) is int and isinstance(call, ast.Call)
                and not call.args and not call.keywords and isinstance(call.func, ast.Attribute)
                and call.func.attr in _METHODS and _is_input(call.func.value))
    return False


def _is_condition(node: ast.AST) -> bool:
    if isinstance(node, ast.BoolOp):
        return all(_is_condition(v) for v in node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _is_condition(node.operand)
    if isinstance(node, ast.Compare):
        return all(isinstance(op, _COMPARE) for op in node.ops) and all(
            _is_term(t) for t in (node.left, *node.comparators))
    return False


def guard_problem(guard: object) -> str | None:
    """Why one guards_code entry is more than a shape check, or None."""
    if not isinstance(guard, str):
        return f"an entry is a {type(guard).__name__}, not a string"
    shown = repr(guard[:80] + ("..." if len(guard) > 80 else ""))
    if len(guard) > MAX_GUARD_CHARS or not guard.isprintable():
        return f"the entry {shown} is over {MAX_GUARD_CHARS} characters or holds control characters"
    try:
        tree = ast.parse(guard, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return f"the entry {shown} is not one Python expression"
    if not _is_condition(tree.body):
        return (f"the entry {shown} is not a plain shape check (integer arithmetic and comparisons of "
                "L['input'].size()[i])")
    return None


def guards_problem(guards: object) -> str | None:
    """Why a guards_code list would make torch exec() more than shape checks, or None."""
    if not isinstance(guards, list):
        return "it is not a list of strings"
    if len(guards) > MAX_GUARDS:
        return f"it holds {len(guards)} entries, more than {MAX_GUARDS}"
    for guard in guards:
        if why := guard_problem(guard):
            return why
    return None
