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
KEYWORD_OF = {"--input-shape": "input_shapes", "--example-inputs": "example_inputs_file", "--format": "export_format",
              "--atc-hint": "atc_hints"}
# flags that stand for a keyword and its value
RENAMED = {"--no-validate": "validate=False", "--qat": "quantize='qat'", "--ptq": "quantize='ptq'",
           "--no-sandbox": "sandbox='off'", "--require-sandbox": "sandbox='require'", "--no-simplify": "simplify=False"}
_FLAG = re.compile(r"(?<![\w-])(?P<flag>--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?![\w-])"
                   r"(?: (?P<value>'[^']*'|-?\d[\w.+-]*|-?inf\b|nan\b|[a-z][a-z0-9_.-]*))?")
_NUMBER_OR_QUOTED = re.compile(r"'[^']*'|-?\d[\w.+-]*|-?inf|nan")
_WORDS = {"a", "an", "and", "as", "at", "between", "for", "in", "is", "of", "on", "or", "the", "to", "with", "when"}


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
        flag, value = match["flag"], match["value"]
        keyword = KEYWORD_OF.get(flag) or flag[2:].replace("-", "_")
        after = f" {value}" if value else ""
        if flag in RENAMED:
            return RENAMED[flag] + after
        if keyword not in keywords:
            return match.group()
        if keywords[keyword] is False:
            return f"{keyword}=True{after}"
        if value and _NUMBER_OR_QUOTED.fullmatch(value):  # --atol nan -> atol=nan; a list's item in a list
            return f"{keyword}=[{value}]" if isinstance(keywords[keyword], list) else f"{keyword}={value}"
        if value and isinstance(keywords[keyword], str) and value not in _WORDS:
            return f"{keyword}={value!r}"  # --lint warn -> lint='warn'
        return f"{keyword}={after}"

    return _FLAG.sub(spelled, text)


def respell(error: Any, keywords: dict[str, Any]) -> None:
    """An ExportError raised through the Python API: its message in the API's spelling (in place)."""
    if from_cli():
        return
    error.message = api_spelling(error.message, keywords)
    error.args = (error.message,)
