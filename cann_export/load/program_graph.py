"""What a torch.export archive's model JSON may say (models/<m>.json, the torch 2.7 serialized program).

torch builds code from it when it loads: symbolic shape strings go through ``sympy.sympify`` (``eval``), node
targets are resolved by attribute lookup from ``torch`` / ``operator`` / ``math``, and ``guards_code`` is
``exec()``'d (torch/export/_unlift.py). ``graph_problem`` allows plain arithmetic over symbols, only the fields a
plain ``torch.export.save`` writes, and node targets from an allow-list: operators of side-effect-free namespaces
(``torch.ops.aten`` / ``prims`` / ``higher_order`` / quantization, learned from the programs real models export),
``_operator`` arithmetic, ``math`` functions and torch's symbolic-shape helpers. Inside those namespaces, operators
that do file, IO, process or network work (``aten::from_file``, ``aten::save``, ...) and higher-order operators
that run code the graph does not hold are refused by name; any other target (another namespace, an extension
operator, an arbitrary ``torch`` attribute) is refused naming it.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .guards import guards_problem

_SAFE_OPERATOR = frozenset(["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
                            "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "inv",
                            "getitem", "lshift", "rshift", "matmul", "truth"])
_SAFE_TORCH_CALLABLES = ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum",
                         "sym_sqrt", "_sym_sqrt", "sym_fresh_size", "_check", "_check_is_size",
                         "sym_constrain_range", "sym_constrain_range_for_size", "_assert", "_assert_async")
_SAFE_TORCH_TARGETS = frozenset(f"torch.{n}" for n in _SAFE_TORCH_CALLABLES)
_SYMPY_NAMES = frozenset(["Integer", "Rational", "Float", "Symbol", "oo", "zoo", "nan", "true", "false", "True",
                          "False", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan",
                          "LessThan", "GreaterThan", "Unequality", "Equality", "And", "Or", "Not", "Xor", "Piecewise",
                          "ITE", "Abs", "floor", "ceiling", "sqrt", "Max", "Min", "Add", "Mul", "Pow", "Mod"])
# torch writes expressions in sympy's srepr form: Mul(Integer(2), Symbol('s77', positive=True, integer=True))
_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<str>'[A-Za-z_][A-Za-z0-9_]*'|\"[A-Za-z_][A-Za-z0-9_]*\"|'[-+0-9.eE]+'|\"[-+0-9.eE]+\")"
                    r"|(?P<op>\*\*|//|<=|>=|==|!=|[-+*/%()<>,&|~^=]))")
_SYMBOL = re.compile(r"^[a-z]+\d+$")
# The top-level fields of models/<m>.json that torch 2.13's torch.export.save writes (schema.ExportedProgram).
# guards_code is exec()'d by torch/export/_unlift.py when the module is built: it must hold plain shape checks
# only (guards.py); any field this version does not know must be empty (a later torch may run it).
_MODEL_FIELDS = frozenset(["graph_module", "opset_version", "range_constraints", "schema_version", "verifiers",
                           "torch_version", "guards_code"])
_MUST_BE_EMPTY = frozenset(["guards_code"])
# Operators that read or write files, print, or talk to other processes / the network, refused by name
# (ns::op; "ns::*" for a whole namespace). Higher-order operators that run code the graph does not hold.
_IO_OPS = frozenset(["aten::from_file", "aten::save", "aten::_print", "aten::warn", "prim::Print",
                     "prim::rpc_async", "prim::rpc_remote", "prim::rpc_sync", "debugprims::*", "c10d::*",
                     "_c10d_functional::*", "c10d_functional::*", "_c10d_functional_autograd::*", "symm_mem::*",
                     "_dtensor::*"])
_CODE_HOPS = frozenset(["print", "aoti_call_delegate", "inductor_compiled_code", "inline_asm_elementwise",
                        "invoke_leaf_function", "flat_apply", "executorch_call_delegate"])
_IO_NAME = re.compile(r"from_file|_file$|^(save|load)(_|$)")
# torch.ops namespaces whose operators compute on tensors and nothing else
OP_NAMESPACES = frozenset(["aten", "prims", "higher_order", "quantized_decomposed", "quantized", "torchao"])


def import_libraries() -> None:
    """Import what ``graph_problem`` reads (torch's operators, its sympy functions), for a caller that imports them
    ahead of a fork whose child needs them too (pipeline/sandboxed_file.py)."""
    import torch.utils._sympy.functions  # noqa: F401


def _sym_problem(expr: str) -> str | None:
    import torch.utils._sympy.functions as sympy_functions
    from sympy.core.assumptions import _assume_defined  # keyword names: Symbol('s0', positive=True)

    allowed = _SYMPY_NAMES | set(getattr(sympy_functions, "__all__", ())) | set(_assume_defined)
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            if expr[pos:].strip() == "":
                break
            return f"symbolic expression {expr[:80]!r} holds {expr[pos:pos + 20]!r}, which is not arithmetic"
        name = m.group("name")
        if name and name not in allowed and not _SYMBOL.match(name):
            return f"symbolic expression {expr[:80]!r} names {name!r}, which is neither a symbol nor a sympy function"
        pos = m.end()
    return None


def _target_problem(target: str) -> str | None:
    """torch resolves a node target by getattr from torch / operator / math (deserialize_operator); only
    allow-listed forms are resolved here, and nothing outside OP_NAMESPACES is ever looked up."""
    import math

    if target.startswith("_operator."):
        name = target[len("_operator."):]
        return None if name in _SAFE_OPERATOR else f"node target {target!r} is not an arithmetic operator"
    if target.startswith("math."):
        obj = getattr(math, target[len("math."):], None)
        return (None if type(obj).__name__ == "builtin_function_or_method"
                else f"node target {target!r} is not a math function")
    if target in _SAFE_TORCH_TARGETS:
        return None
    parts = target.split(".")
    if parts[:2] != ["torch", "ops"] or len(parts) < 4:
        return (f"node target {target[:120]!r} is neither an operator of an allowed namespace "
                f"(torch.ops.{{{', '.join(sorted(OP_NAMESPACES))}}}) nor arithmetic")
    if parts[2] not in OP_NAMESPACES:
        return (f"node target {target[:120]!r} is an operator of the namespace {parts[2]!r}, which is not one "
                f"known to be free of side effects ({', '.join(sorted(OP_NAMESPACES))})")
    return _op_problem(target, parts)


def _op_problem(target: str, parts: list[str]) -> str | None:
    import torch

    obj: Any = torch.ops
    try:
        for part in parts[2:]:
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return None  # no such operator here: torch.export.load fails on it, running nothing
    if isinstance(obj, torch._ops.HigherOrderOperator):
        name = str(getattr(obj, "__name__", "") or getattr(obj, "_name", ""))
        return (f"node target {target!r} is the higher-order operator {name!r}, which runs code the graph does "
                "not hold" if name in _CODE_HOPS else None)
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _io_op_problem(target, obj)
    return f"node target {target!r} resolves to {type(obj).__name__}, not an operator"


def _io_op_problem(target: str, op: Any) -> str | None:
    """An operator that does file, IO, process or network work (by its schema's qualified name)."""
    schema = getattr(op, "_schema", None)
    qualified = str(getattr(schema, "name", "") or getattr(op, "_qualified_op_name", ""))
    namespace, _, name = qualified.partition("::")
    if qualified in _IO_OPS or f"{namespace}::*" in _IO_OPS or (
            namespace in ("aten", "prims", "prim") and _IO_NAME.search(name)):
        return (f"node target {target!r} is {qualified}, an operator that reads or writes files or talks to "
                "other processes, which an exported model has no business running")
    return None


def _model_fields_problem(root: Any) -> str | None:
    """Only the fields a plain torch.export.save writes; guards_code (exec()'d by torch) holds shape checks
    only, and unknown fields are empty."""
    if not isinstance(root, dict):
        return None
    for key, value in root.items():
        if value in (None, "", [], {}):
            continue
        if key in _MUST_BE_EMPTY:
            if (why := guards_problem(value)) is None:
                continue  # plain shape checks, as torch.export.save writes for shared dynamic dimensions
            return (f"field {key!r} holds Python source that torch.export.load would exec() when the module is "
                    f"built, and {why}")
        if key not in _MODEL_FIELDS:
            return (f"field {str(key)[:40]!r} is not one torch.export.save writes (known: "
                    f"{', '.join(sorted(_MODEL_FIELDS))}) and is not empty")
    return None


def graph_problem(data: bytes) -> str | None:
    """Why a .pt2's model JSON would make torch run something beyond arithmetic and operators, or None."""
    try:
        root = json.loads(data)
    except (ValueError, RecursionError):
        return None  # torch.export.load fails on it before evaluating anything
    if why := _model_fields_problem(root):
        return why
    stack = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            expr = item.get("expr_str")
            if isinstance(expr, str) and (why := _sym_problem(expr)):
                return why
            target = item.get("target")
            if isinstance(target, str) and (why := _target_problem(target)):  # only Node has "target"
                return why
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
