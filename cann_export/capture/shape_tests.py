"""Tracer warnings that a value probe cannot move: literal constants and tests of sizes.

The trace gate judges a trace that warned on the sets prepare built (the example, random draws, each dynamic range's
ends and middle) and on four *path probes*: copies of the example with their float inputs sign-flipped and scaled
(inputs/path_probes.py), which reach branches that depend on input values. Two kinds of warning cannot be moved by
such a probe:

- **A literal constant** (``torch.tensor([], dtype=...)``, ``torch.tensor(1.0) - mask``): tracing registers the
  result as a constant, and eager builds the same constant for every input. It specialises nothing: no gate.
- **A test of sizes** (``is_causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal",
  True)``): every operand is a size (``.shape``, ``.size()``, ``.dim()``, ``.numel()``, ``len()``), a literal, an
  ``is None`` test, or a name or attribute that holds a plain Python scalar where it warned (read without running
  code: ``inspect.getattr_static``). A Python scalar that came from a tensor's value passed a conversion that warned
  on its own line, which is judged on its own. Such a test decides the same for every input of the same sizes when
  no size in the graph depends on input values (``sizes_from_shapes_only``: no NonZero, no Reshape to a shape
  computed from values, ...). Its trace is still gated, at the ranges' ends and middle, but the probes, which keep
  the example's sizes, are not built.

Anything else (a name holding a tensor, a call, a subscript of a tensor) may depend on values: probed as before.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any

from .trace_taint import Trace


_SIZE_ATTRIBUTES = {"shape", "ndim"}
_SIZE_METHODS = {"size", "dim", "ndimension", "numel", "nelement"}
_SCALAR_BUILTINS = {"len", "int", "bool", "float", "abs", "min", "max"}
_SCALARS = (bool, int, float, str, type(None))


def classify(frame: Any, lineno: int, index: Any, constant: bool, trace: Any = None) -> str | None:
    """``"constant"``, ``"sizes"`` or None (may depend on values) for the warning at ``lineno`` of ``frame``'s code;
    ``index``: the file's parsed index (trace_guards._Index), None when unreadable; ``constant``: the warning says a
    ``torch.tensor`` result was registered as a constant (any other warning is a conversion); ``trace``: the
    running trace's marks (capture/trace_taint.py), kept between its warnings."""
    statement = _statement(index, lineno) if index is not None else None
    if statement is None:
        return None
    if constant:
        return "constant" if _literal_constants(statement) else None
    tested = _tested(statement, lineno)
    trace = trace if trace is not None else Trace()
    if tested is not None and _sizes_only(tested, _Scope(frame, index, lineno, trace=trace, tested=tested)) \
            and trace.sizes_from_shapes():
        return "sizes"
    return None


def _statement(index: Any, lineno: int) -> ast.stmt | None:
    """The one simple statement, or compound statement's header, on ``lineno`` (None when the line holds more)."""
    found = [s for s in index.statements if s.lineno <= lineno <= (s.end_lineno or s.lineno)
             and not _in_body(s, lineno)]
    return found[0] if len(found) == 1 else None


def _in_body(node: ast.stmt, lineno: int) -> bool:
    """Whether ``lineno`` falls in one of the bodies of a compound statement (not its header)."""
    for field in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(node, field, None) or []
        if block and block[0].lineno <= lineno <= (block[-1].end_lineno or block[-1].lineno):
            return True
    return False


def _tested(statement: ast.stmt, lineno: int) -> ast.expr | None:
    """What the warning converted on that line: an ``if`` / ``while`` / ``assert`` test, or an assignment's value."""
    if isinstance(statement, (ast.If, ast.While, ast.Assert)):
        return statement.test
    if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Expr)) and statement.value is not None:
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        if all(isinstance(t, (ast.Name, ast.Attribute, type(None))) for t in targets):
            return statement.value
    return None


def _literal_constants(statement: ast.stmt) -> bool:
    """Whether the statement's line calls tensor constructors only (``torch.tensor``, ``as_tensor``, ``new_tensor``
    ...; one at least), each building its tensor from a literal (``torch.tensor([], dtype=..., device=...)``), so
    each constant the tracer registered is the same for every input."""
    scope = _tested(statement, 0) if isinstance(statement, (ast.If, ast.While, ast.Assert)) else statement
    calls = [n for n in ast.walk(scope) if isinstance(n, ast.Call)] if scope else []
    tensors = [c for c in calls if _is_tensor_call(c)]
    if not tensors or len(tensors) != len(calls):  # another call may be a constructor by another name (an alias)
        return False
    for call in tensors:
        if len(call.args) != 1 or any(k.arg not in ("dtype", "device", "requires_grad") for k in call.keywords):
            return False
        try:
            ast.literal_eval(call.args[0])
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            return False
    return True


_CONSTRUCTORS = {"tensor", "as_tensor", "asarray", "new_tensor", "from_numpy", "Tensor", "FloatTensor", "LongTensor",
                 "IntTensor", "BoolTensor", "ByteTensor", "DoubleTensor", "HalfTensor"}


def _is_tensor_call(call: ast.Call) -> bool:
    func = call.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in _CONSTRUCTORS


def _sizes_only(expr: ast.expr, frame: Any) -> bool:
    """Whether every operand of ``expr`` is a size, a literal, an ``is None`` test or a plain Python scalar."""
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, ast.NamedExpr):  # (padding := kv_length - mask.shape[-1]) > 0
        return _sizes_only(expr.value, frame)
    if isinstance(expr, ast.Compare):
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in expr.ops):
            return all(isinstance(e, (ast.Name, ast.Attribute, ast.Constant)) for e in [expr.left, *expr.comparators])
        return all(_sizes_only(e, frame) for e in [expr.left, *expr.comparators])
    if isinstance(expr, ast.BoolOp):
        return all(_sizes_only(e, frame) for e in expr.values)
    if isinstance(expr, ast.UnaryOp):
        return _sizes_only(expr.operand, frame)
    if isinstance(expr, ast.BinOp):
        return _sizes_only(expr.left, frame) and _sizes_only(expr.right, frame)
    if isinstance(expr, ast.Attribute) and expr.attr in _SIZE_ATTRIBUTES:
        return True
    if isinstance(expr, ast.Subscript):  # x.shape[-1], x.shape[1:]; input_shape[-1] of a tuple of sizes
        return (_is_shape(expr.value) or _sizes_tuple(expr.value, frame)) and _index_ok(expr.slice, frame)
    if isinstance(expr, ast.Call):
        return _size_call(expr, frame)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        value = _static_value(expr, frame) if _root_name(expr) not in frame.rebound else _UNKNOWN
        return isinstance(value, _SCALARS) or _traced_size(value, frame) or isinstance(expr, ast.Name) \
            and _bound_to_sizes(expr.id, frame)
    return False


def _sizes_tuple(expr: ast.expr, scope: _Scope) -> bool:
    """A name holding, where it warned, a tuple (a ``torch.Size`` too) of plain scalars and sizes the trace computed
    from shapes alone: transformers' ``input_shape = (batch_size, query_length)`` in ``to_causal_4d``, its caller's
    sizes passed in."""
    if not isinstance(expr, ast.Name) or expr.id in scope.rebound:
        return False
    value = _static_value(expr, scope)
    return isinstance(value, tuple) and bool(value) and all(
        isinstance(item, _SCALARS) or _traced_size(item, scope) for item in value)


def _root_name(expr: ast.expr) -> str | None:
    """The name an attribute chain starts from (``self`` of ``self.size``)."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _traced_size(value: Any, scope: _Scope) -> bool:
    """A 0-dim tensor the running trace computed from sizes alone (a parameter ``kv_length`` its caller computed
    from ``.shape``): capture/trace_taint.py reads what the trace made it from."""
    return scope.trace is not None and getattr(value, "dim", None) is not None and scope.trace.computed_size(value)


class _Scope:
    """Where a test is read: the warning's frame (its locals), the file's index and the test's line; ``depth``: how
    many assignments deep a name was followed."""

    def __init__(self, frame: Any, index: Any, lineno: int, depth: int = 0, trace: Any = None,
                 tested: ast.expr | None = None) -> None:
        self.f_locals = frame.f_locals if frame is not None else {}
        self.index, self.lineno, self.depth, self.trace = index, lineno, depth, trace
        # names the test itself rebinds (``(n := ...)``): the frame holds the new value, the test may read the old
        self.rebound = {n.target.id for n in ast.walk(tested) if isinstance(n, ast.NamedExpr)
                        and isinstance(n.target, ast.Name)} if tested is not None else set()
        code = getattr(frame, "f_code", None)
        self.shared = set(getattr(code, "co_cellvars", ())) | set(getattr(code, "co_freevars", ()))


def _bound_to_sizes(name: str, scope: _Scope) -> bool:
    """Whether every assignment to ``name`` in the function around the test assigns sizes (``q_length =
    query.shape[2]``; ``bsz, q_len = x.shape[:2]``), the name being no parameter, no variable a nested function
    shares (it may rebind it, ``nonlocal``), nor bound any other way; followed three assignments deep."""
    function = _function_at(scope.index, scope.lineno)
    if function is None or scope.depth >= 3 or name in scope.shared or name in {
            a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}:
        return False
    inner = _Scope(None, scope.index, scope.lineno, scope.depth + 1)
    inner.shared = scope.shared
    values = []
    for node in _own_nodes(function):
        if name in _other_bindings(node):
            return False
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                values.append(node.value)
    return bool(values) and all(v is not None and _sizes_only(v, inner) for v in values)


def _other_bindings(node: ast.AST) -> set[str]:
    """The names ``node`` binds other than by assignment: a loop or ``with`` target, an ``except ... as``, an import,
    a ``match`` capture, ``global`` / ``nonlocal`` / ``del``."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        targets: list[Any] = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    else:
        targets = []
    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        names.update(node.names)
    elif isinstance(node, ast.alias):
        names.add((node.asname or node.name).split(".")[0])
    elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        names.add(node.name)
    elif isinstance(node, ast.MatchMapping) and node.rest:
        names.add(node.rest)
    return names


def _function_at(index: Any, lineno: int) -> ast.AST | None:
    spans = [s for s in index.statements if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
             and s.lineno <= lineno <= (s.end_lineno or s.lineno)]
    return min(spans, key=lambda s: (s.end_lineno or s.lineno) - s.lineno) if spans else None


def _own_nodes(function: ast.AST) -> Any:
    """The nodes of ``function``'s own scope (not its nested functions, classes or lambdas)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _is_shape(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Attribute) and expr.attr == "shape" or isinstance(expr, ast.Call) and isinstance(
        expr.func, ast.Attribute) and expr.func.attr == "size" and not expr.args


def _index_ok(index: ast.expr, frame: Any) -> bool:
    if isinstance(index, ast.Slice):
        return all(part is None or _sizes_only(part, frame) for part in (index.lower, index.upper, index.step))
    return _sizes_only(index, frame)


def _size_call(call: ast.Call, frame: Any) -> bool:
    """``x.size(1)``, ``x.dim()``, ``len(x)`` (a size whatever ``x`` is), ``int(...)`` / ``min(...)`` / ``.item()`` of
    sizes, and ``getattr(obj, "name", literal)`` of a plain scalar attribute."""
    func, args = call.func, call.args
    if call.keywords or any(isinstance(a, ast.Starred) for a in args):
        return False
    if isinstance(func, ast.Attribute) and func.attr in _SIZE_METHODS:
        return all(_sizes_only(a, frame) for a in args)
    if isinstance(func, ast.Attribute) and func.attr == "item" and not args:  # sdpa's is_causal.item() of a size test
        return _sizes_only(func.value, frame)
    if not isinstance(func, ast.Name):
        return False
    if func.id == "len" and len(args) == 1:
        return True
    if func.id == "getattr" and len(args) in (2, 3) and isinstance(args[1], ast.Constant) \
            and isinstance(args[1].value, str) and all(isinstance(a, ast.Constant) for a in args[2:]):
        owner = _static_value(args[0], frame)
        value = _attribute(owner, args[1].value) if owner is not _UNKNOWN else _UNKNOWN
        return isinstance(value, _SCALARS) or value is _MISSING and len(args) == 3
    return func.id in _SCALAR_BUILTINS and bool(args) and all(_sizes_only(a, frame) for a in args)


_UNKNOWN, _MISSING = object(), object()


def _static_value(expr: ast.expr, frame: Any) -> Any:
    """The value of a name or attribute chain in ``frame``, read without running code (no property, no
    ``__getattr__``), or ``_UNKNOWN``."""
    if isinstance(expr, ast.Name):
        return frame.f_locals.get(expr.id, _UNKNOWN) if frame is not None else _UNKNOWN
    if isinstance(expr, ast.Attribute):
        owner = _static_value(expr.value, frame)
        value = _attribute(owner, expr.attr) if owner is not _UNKNOWN else _UNKNOWN
        return _UNKNOWN if value is _MISSING else value
    return _UNKNOWN


def _attribute(owner: Any, name: str) -> Any:
    """``owner.name`` from its instance ``__dict__`` or class, never a descriptor's code; ``_MISSING`` where the
    lookup fails (a module's parameter, buffer or submodule is found as ``nn.Module.__getattr__`` finds it; another
    class's own ``__getattr__`` leaves it ``_UNKNOWN``)."""
    try:
        value = inspect.getattr_static(owner, name)
    except AttributeError:
        return _module_member(owner, name)
    return value if isinstance(value, _SCALARS) or not hasattr(value, "__get__") else _UNKNOWN


def _module_member(owner: Any, name: str) -> Any:
    import torch

    if isinstance(owner, torch.nn.Module) and type(owner).__getattr__ is torch.nn.Module.__getattr__:
        members = vars(owner)
        for table in ("_parameters", "_buffers", "_modules"):
            if name in (members.get(table) or {}):
                return members[table][name]
        return _MISSING
    try:
        inspect.getattr_static(owner, "__getattr__")
    except AttributeError:
        return _MISSING
    return _UNKNOWN


# ops whose output sizes follow from their inputs' sizes and attributes alone; _SIZE_OPERANDS lists the ops whose
# named inputs' values set their output sizes; any other op is taken to size its outputs from its inputs' values
_SIZED_BY_SHAPES = frozenset((
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "AveragePool",
    "BatchNormalization", "BitShift", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "Constant", "Conv",
    "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "DequantizeLinear", "Div", "Dropout", "Einsum", "Elu",
    "Equal", "Erf", "Exp", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm",
    "GlobalAveragePool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "GroupNormalization", "HardSigmoid",
    "HardSwish", "Hardmax", "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu",
    "Less", "LessOrEqual", "Log", "LogSoftmax", "LpNormalization", "MatMul", "Max", "MaxPool", "Mean", "Min", "Mish",
    "Mod", "Mul", "Neg", "Not", "Or", "PRelu", "Pow", "QuantizeLinear", "Reciprocal", "Relu", "Round",
    "ScatterElements", "ScatterND", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus",
    "Softsign", "SpaceToDepth", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Transpose", "Trilu", "Where",
    "Xor",
))
_SIZE_OPERANDS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "OneHot": (1,), "Resize": (1, 2, 3), "Upsample": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "TopK": (1,), "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL2": (1,), "ReduceSumSquare": (1,), "ReduceLogSumExp": (1,),
}
_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto.GRAPH, GRAPHS: If, Loop, Scan bodies


def sizes_from_shapes_only(model: Any) -> bool:
    """Whether every size in ``model``'s graph follows from its inputs' sizes, never their values: no op whose output
    sizes depend on values (NonZero, Unique, If, an op of another domain, any op not listed) and no size operand
    (Reshape's shape, Slice's ends ...) computed from input values; ``Shape`` / ``Size`` then carry no value. A
    warning that tests sizes decides the same for every input of the same sizes on such a graph."""
    graph = model.graph
    values = {i.name for i in graph.input} - {t.name for t in graph.initializer}  # depend on input values
    for node in graph.node:  # a valid graph lists its nodes in topological order
        if node.domain not in ("", "ai.onnx") or any(a.type in _GRAPH_ATTRIBUTES for a in node.attribute):
            return False
        if node.op_type in ("Shape", "Size"):
            continue
        operands = _SIZE_OPERANDS.get(node.op_type, () if node.op_type in _SIZED_BY_SHAPES else None)
        if operands is None or any(k < len(node.input) and node.input[k] in values for k in operands):
            return False
        if any(n in values for n in node.input if n):
            values.update(o for o in node.output if o)
    return True
