"""Which surface a call came through, the ``cann-export`` command or the Python API, so that an error names what
the user typed: ``--input-shape`` on the command line, ``input_shapes=`` in Python. Library code writes its
messages with the flags; the API's entry points respell them (``respell``) unless the command line is running
(``as_cli``, a context variable: a forked sandbox child inherits it)."""
from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from typing import Any

_CLI: contextvars.ContextVar[bool] = contextvars.ContextVar("cann_export_cli", default=False)
# flags whose keyword argument is not the flag's own name ("--soc-version" -> "soc_version=")
RENAMED = {"--input-shape": "input_shapes=", "--example-inputs": "example_inputs_file=", "--format": "export_format=",
           "--atc-hint": "atc_hints=", "--no-validate": "validate=False", "--qat": "quantize='qat'",
           "--ptq": "quantize='ptq'", "--no-sandbox": "sandbox='off'", "--require-sandbox": "sandbox='require'",
           "--no-simplify": "simplify=False"}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")


@contextlib.contextmanager
def as_cli() -> Iterator[None]:
    """While the command line runs: errors keep their flags."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


def from_cli() -> bool:
    return _CLI.get()


def api_spelling(text: str, keywords: dict[str, Any]) -> str:
    """``text`` with each flag that is one of ``keywords`` (export()'s keyword arguments and their defaults)
    written as that argument (a flag of a False default as ``NAME=True``); other flags (a subcommand's, ATC's
    underscored options) are kept."""
    def spelled(match: re.Match[str]) -> str:
        flag = match.group()
        if flag in RENAMED:
            return RENAMED[flag]
        keyword = flag[2:].replace("-", "_")
        if keyword not in keywords:
            return flag
        return f"{keyword}=True" if keywords[keyword] is False else f"{keyword}="

    return _FLAG.sub(spelled, text)


def respell(error: Any, keywords: dict[str, Any]) -> None:
    """An ExportError raised through the Python API: its message in the API's spelling (in place)."""
    if from_cli():
        return
    error.message = api_spelling(error.message, keywords)
    error.args = (error.message,)
