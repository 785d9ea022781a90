"""Tracer warnings from input checks, which specialise nothing.

``if num_channels != self.num_channels: raise ValueError(...)`` (ViT, ResNet, ConvNeXt, Swin, ...) turns a tensor into
a Python bool while tracing, so the tracer warns. But the trace completed, so it took the branch that does not
raise, and every input the model accepts takes that branch too: the graph is not specialised by it. Such a warning
is a *guard*; a trace whose warnings are all guards needs neither the trace gate nor specialisation probes.

A warning is a guard when its line lies in the test of an ``if`` one of whose branches is a lone ``raise`` (or of an
``assert``), the test binds no name (``:=``: its value could be used later), and no frame of the model's code between
the forward and the warning runs inside a ``try`` with a handler that may catch what the check raises (a caller that
catches it may take another path: that is data-dependent control flow; transformers' ``check_model_inputs`` catches
only TypeError around every forward, which a ``raise ValueError`` check passes). Only builtin exception classes are
told apart; any other class, or a handler naming one, counts as caught. Frames of torch and of this package are not
the model's code; the walk outward stops at this package's first frame (the exporter's call). Unreadable source is
never a guard.
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


def recorder(records: list[Any]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that appends a ``warnings.WarningMessage`` with ``stack``: the (file, line) of the
    model's frames from the warning outward to this package's first frame."""
    import warnings

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        entry = warnings.WarningMessage(message, category, filename, lineno, file, line)
        entry.stack = list(_model_frames(sys._getframe(1)))  # type: ignore[attr-defined]
        records.append(entry)

    return show


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
    """Parsed source files, each read once per capture (bounded; None when unreadable)."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module | None] = {}

    def tree(self, filename: str) -> ast.Module | None:
        if filename not in self._trees:
            self._trees[filename] = _parse(filename)
        return self._trees[filename]


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
    check = _check(sources.tree(filename), lineno)
    if check is None:
        return False
    return not any(_caught(sources.tree(name), line, check) for name, line in stack)


def _check(tree: ast.Module | None, lineno: int) -> ast.stmt | None:
    """The ``raise`` or ``assert`` of the input check whose test holds ``lineno``, or None."""
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            fails = next((b[0] for b in (node.body, node.orelse) if len(b) == 1 and isinstance(b[0], ast.Raise)), None)
        else:
            fails = node if isinstance(node, ast.Assert) else None
        test = getattr(node, "test", None)
        if fails is not None and test.lineno <= lineno <= (test.end_lineno or test.lineno) \
                and not any(isinstance(n, ast.NamedExpr) for n in ast.walk(test)):
            return fails
    return None


def _raised(fails: ast.stmt) -> type | None:
    """The builtin exception class the check raises, or None (another class, or not known from the source)."""
    if isinstance(fails, ast.Assert):
        return AssertionError
    exc = getattr(fails, "exc", None)
    name = exc.func if isinstance(exc, ast.Call) else exc
    found = getattr(builtins, name.id, None) if isinstance(name, ast.Name) else None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _caught(tree: ast.Module | None, lineno: int, fails: ast.stmt) -> bool:
    """Whether ``lineno`` runs in the body of a ``try`` with a handler that may catch what ``fails`` raises
    (unreadable source: assumed so)."""
    if tree is None:
        return True
    raised = _raised(fails)
    try_nodes = (ast.Try, ast.TryStar) if hasattr(ast, "TryStar") else (ast.Try,)
    for node in ast.walk(tree):
        if isinstance(node, try_nodes) and node.body \
                and node.body[0].lineno <= lineno <= (node.body[-1].end_lineno or node.body[-1].lineno) \
                and any(_may_catch(handler, raised) for handler in node.handlers):
            return True
    return False


def _may_catch(handler: ast.ExceptHandler, raised: type | None) -> bool:
    """Unless every class it names is a builtin exception that ``raised`` (a builtin) is not a subclass of."""
    if handler.type is None or raised is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for name in names:
        cls = getattr(builtins, name.id, None) if isinstance(name, ast.Name) else None
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or issubclass(raised, cls):
            return True
    return False
