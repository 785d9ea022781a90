"""Tracer warnings from input checks, which specialise nothing.

``if num_channels != self.num_channels: raise ValueError(...)`` (ViT, ResNet, ConvNeXt, Swin, ...) turns a tensor into
a Python bool while tracing, so the tracer warns. But the trace completed, so it took the branch that does not
raise, and every input the model accepts takes that branch too: the graph is not specialised by it. Such a warning
is a *guard*; a trace whose warnings are all guards needs neither the trace gate nor specialisation probes.

A warning is a guard when:

- its line holds only the test of an ``if`` one of whose branches is a lone ``raise`` of a builtin error (ValueError,
  TypeError, RuntimeError, ArithmeticError), or of an ``assert``; never StopIteration, AttributeError or LookupError,
  which callers take as signals (a loop's end, getattr's default), nor a class the source does not show;
- the test binds no name (``:=``) and calls only pure builtins (``len``, ``isinstance``, ``int`` ...) and tensor
  queries (``dim``, ``size``, ``all`` ...): another call could store the value the tracer froze;
- no frame of the model's code between the forward and the warning runs in the body of a ``try`` whose handler may
  catch what the check raises or whose ``finally`` returns, breaks or continues, nor of a ``with`` (its context
  manager may suppress it). A caller that catches the error may take another path: data-dependent control flow.
  Builtin classes are told apart (transformers' ``check_model_inputs`` catches only TypeError around every forward,
  which a ``raise ValueError`` check passes); a handler naming any other class counts as catching it.

Frames of torch and of this package are not the model's code; the walk outward stops at this package's first frame
(the exporter's call). Unreadable source is never a guard.
"""
from __future__ import annotations

import ast
import builtins
import linecache
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

_MAX_SOURCE = 4 << 20  # characters of one source file parsed; a larger file is not read (never a guard)


def recorder(records: list[Any], trace: Any = None) -> Callable[..., None]:
    """A ``warnings.showwarning`` that appends a ``warnings.WarningMessage`` with ``stack``: the (file, line) of the
    model's frames from the warning outward to this package's first frame; and ``tested``: what the warned line
    does (capture/shape_tests.py: a literal constant, a test of sizes, or None), read in the warning's frame."""
    import warnings

    from .shape_tests import classify
    from .trace_taint import Trace

    sources, trace = Sources(), trace if trace is not None else Trace()

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        entry = warnings.WarningMessage(message, category, filename, lineno, file, line)
        caller = sys._getframe(1)
        entry.stack = list(_model_frames(caller))  # type: ignore[attr-defined]
        entry.tested = None  # type: ignore[attr-defined]
        try:  # raised here, it would end the model's forward: then the warning may depend on values
            frame = _frame_at(caller, filename, lineno)
            if frame is not None:
                entry.tested = classify(frame, lineno, sources.index(filename, lineno), "registered as constants" in
                                        str(message), trace)
        except Exception:  # noqa: BLE001 - an object of the model's that resists being read
            entry.tested = None
        records.append(entry)

    return show


def _frame_at(frame: Any, filename: str, lineno: int) -> Any:
    """The frame running ``filename:lineno`` (the warning's), outward from ``frame``; None when there is none."""
    while frame is not None:
        if frame.f_code.co_filename == filename and frame.f_lineno == lineno:
            return frame
        frame = frame.f_back
    return None


def _model_frames(frame: Any) -> Iterator[tuple[str, int]]:
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    skipped = _skipped_roots()
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(own):
            return
        if not name.startswith(skipped):
            yield name, frame.f_lineno
        frame = frame.f_back


def _skipped_roots() -> tuple[str, ...]:
    """torch's own frames (they re-raise what the model raises) and the warnings machinery's."""
    import warnings

    import torch

    return os.path.dirname(torch.__file__) + os.sep, os.path.abspath(warnings.__file__)


class Sources:
    """Parsed source files, each read and indexed once per capture (bounded; None when unreadable)."""

    def __init__(self) -> None:
        self._files: dict[str, _File | None] = {}

    def index(self, filename: str, lineno: int | None = None) -> _Index | None:
        """The index of the top-level statement (a class or function) of ``filename`` that holds ``lineno``: every
        question asked of it is about that line (the whole file's when ``lineno`` is None or at module level)."""
        if filename not in self._files:
            self._files[filename] = _shared_file(filename)
        found = self._files[filename]
        return None if found is None else found.index_at(lineno)


_FILES: dict[tuple[str, int, int], _File | None] = {}  # (file, mtime, size): the graphs of one model share it
_MAX_FILES = 64


def _shared_file(filename: str) -> _File | None:
    """The file, parsed once per process while it is unchanged (a decoder's two graphs, an encoder-decoder's three,
    a pipeline's six warn in the same transformers and diffusers files)."""
    try:
        stat = os.stat(filename)
    except (OSError, ValueError):
        return None
    key = (filename, stat.st_mtime_ns, stat.st_size)
    if key not in _FILES:
        if len(_FILES) >= _MAX_FILES:
            _FILES.pop(next(iter(_FILES)))
        tree = _parse(filename)
        _FILES[key] = None if tree is None else _File(tree)
    return _FILES[key]


class _File:
    """A parsed file whose top-level statements are indexed when a warning first falls in them: walking the whole
    tree of diffusers' attention_processor.py or resnet.py for one check cost a pipeline's capture 0.35 s."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parts: dict[int, _Index] = {}

    def index_at(self, lineno: int | None) -> _Index:
        for k, node in enumerate(self.tree.body):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            if lineno is not None and first <= lineno <= (node.end_lineno or node.lineno) \
                    and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if k not in self.parts:
                    self.parts[k] = _Index(node)
                return self.parts[k]
        if -1 not in self.parts:
            self.parts[-1] = _Index(self.tree)
        return self.parts[-1]


class _Index:
    """One file's (or one top-level statement's) checks, ``try`` / ``with`` blocks and statements, in ``ast.walk``
    order, from one walk: a model's trace warns dozens of times in one large file (GPT-2: 54 warnings), and a walk
    of the whole tree per warning and per frame cost more than a second."""

    def __init__(self, tree: ast.AST) -> None:
        self.checks: list[tuple[ast.stmt, ast.stmt]] = []  # (if / assert, its lone raise / itself)
        self.blocks: list[ast.stmt] = []
        self.statements: list[ast.stmt] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.stmt):
                self.statements.append(node)
            if isinstance(node, ast.If):
                fails = next((b[0] for b in (node.body, node.orelse) if len(b) == 1 and isinstance(b[0], ast.Raise)),
                             None)
                if fails is not None:
                    self.checks.append((node, fails))
            elif isinstance(node, ast.Assert):
                self.checks.append((node, node))
            elif isinstance(node, _BLOCKS) and node.body:
                self.blocks.append(node)


_BLOCKS = (ast.Try, ast.TryStar, ast.With, ast.AsyncWith) if hasattr(ast, "TryStar") else (ast.Try, ast.With,
                                                                                               ast.AsyncWith)


def _parse(filename: str) -> ast.Module | None:
    lines = linecache.getlines(filename)
    if not lines or sum(len(line) for line in lines) > _MAX_SOURCE:
        return None
    try:
        return ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        return None


def is_guard(filename: str, lineno: int, stack: list[tuple[str, int]] | None, sources: Sources) -> bool:
    """Whether the warning at ``filename:lineno`` (raised with ``stack``) comes from an input check (module doc)."""
    if stack is None:
        return False
    raised = _check(sources.index(filename, lineno), lineno)
    if raised is None:
        return False
    return not any(_caught(sources.index(name, line), line, raised) for name, line in stack)


# what an input check may raise: errors a caller does not take as a signal (not StopIteration, which ends a loop,
# AttributeError, which getattr / hasattr / __getattr__ turn into a default, nor LookupError, which ends an old-style
# iteration or a .get)
_CHECK_ERRORS = (ValueError, TypeError, RuntimeError, AssertionError, ArithmeticError)
_SIGNALS = (StopIteration, StopAsyncIteration, AttributeError, LookupError)
# calls an input check's test may make: builtins and tensor queries that store nothing
_PURE_FUNCTIONS = {"len", "isinstance", "int", "float", "bool", "all", "any", "min", "max", "abs", "tuple", "list"}
_PURE_METHODS = {"dim", "ndimension", "size", "numel", "nelement", "all", "any", "is_floating_point", "is_complex",
                 "isnan", "isinf", "isfinite", "item", "equal", "sum", "min", "max", "get_device"}


def _check(index: _Index | None, lineno: int) -> type | None:
    """The builtin error class the input check whose test holds ``lineno`` raises, or None when there is none: the
    line must hold that test alone (no other statement on it, as after a ``;``), the test bind no name and call
    nothing but pure builtins and tensor queries (a call could store the value the tracer froze)."""
    if index is None:
        return None
    for node, fails in index.checks:
        if not node.test.lineno <= lineno <= (node.test.end_lineno or node.test.lineno):
            continue
        raised = _raised(fails)
        if raised is None or not _pure(node.test) or _shares_line(index, node, fails, lineno):
            return None
        return raised
    return None


def _raised(fails: ast.stmt) -> type | None:
    """The builtin error class the check raises when it is one an input check raises (``_CHECK_ERRORS``), else None
    (another class, one a caller may take as a signal, or not known from the source)."""
    if isinstance(fails, ast.Assert):
        return AssertionError
    exc = getattr(fails, "exc", None)
    name = exc.func if isinstance(exc, ast.Call) else exc
    found = getattr(builtins, name.id, None) if isinstance(name, ast.Name) else None
    if isinstance(found, type) and issubclass(found, _CHECK_ERRORS) and not issubclass(found, _SIGNALS):
        return found
    return None


def _pure(test: ast.expr) -> bool:
    for node in ast.walk(test):
        if isinstance(node, (ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            if not (isinstance(func, ast.Name) and func.id in _PURE_FUNCTIONS
                    or isinstance(func, ast.Attribute) and func.attr in _PURE_METHODS):
                return False
    return True


def _shares_line(index: _Index, check: ast.stmt, fails: ast.stmt, lineno: int) -> bool:
    """Whether a statement other than the check, its raise and the blocks around it spans ``lineno``."""
    for node in index.statements:
        if node is not check and node is not fails \
                and node.lineno <= lineno <= (node.end_lineno or node.lineno) and not _within(check, node):
            return True
    return False


def _within(inner: ast.AST, outer: ast.AST) -> bool:
    return outer is not inner and any(child is inner for child in ast.walk(outer))


_DROPS = (ast.Return, ast.Break, ast.Continue)  # in a ``finally``: the exception in flight is dropped


def _caught(index: _Index | None, lineno: int, raised: type) -> bool:
    """Whether ``lineno`` runs where what the check raises may not reach the caller: the body of a ``try`` with a
    handler that may catch it or a ``finally`` that returns, breaks or continues (which drops it), or of a ``with``
    (its context manager may suppress it). Unreadable source: assumed so."""
    if index is None:
        return True
    for node in index.blocks:
        if not node.body[0].lineno <= lineno <= (node.body[-1].end_lineno or node.body[-1].lineno):
            continue
        if isinstance(node, (ast.With, ast.AsyncWith)) or any(_may_catch(h, raised) for h in node.handlers) \
                or any(isinstance(n, _DROPS) for f in node.finalbody for n in ast.walk(f)):
            return True
    return False


def _may_catch(handler: ast.ExceptHandler, raised: type) -> bool:
    """Unless every class it names is a builtin exception that ``raised`` is not a subclass of."""
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for name in names:
        cls = getattr(builtins, name.id, None) if isinstance(name, ast.Name) else None
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or issubclass(raised, cls):
            return True
    return False
