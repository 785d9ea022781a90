"""What the export command says about warnings that did not stop it: a torchvision left out, a --soc-version the tool
does not know, a dynamic axis exported static, and third-party chatter (torch, transformers, ...) the stages kept
out of the terminal, counted in one line or, with --verbose, shown. Every line is escaped for the terminal."""
from __future__ import annotations

import os
from typing import Any

import click

from ..safe_text import terminal


def quiet_progress_bars(verbose: bool) -> None:
    """Hugging Face's progress bars ("Loading weights: 100%|...") off unless --verbose or the user set the variable;
    before transformers is imported, which reads it once."""
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def print_warnings(manifest: dict[str, Any], verbose: bool) -> None:
    from ..pipeline.chatter import hidden_line

    warnings = manifest.get("warnings") or {}
    if warnings.get("environment"):  # a torchvision that does not import beside this torch (load/torchvision_pair.py)
        click.echo(f"warning: {terminal(warnings['environment'])}", err=True)
    if warnings.get("soc"):
        click.echo(f"warning: {terminal(warnings['soc'])}", err=True)
    for note in warnings.get("dynamic") or []:
        click.echo(f"warning: {terminal(note)}", err=True)
    heard = [str(r) for r in warnings.get("third_party") or []]
    if verbose:
        for record in heard:
            click.echo(f"  {terminal(record)}", err=True)
    elif line := hidden_line(heard):
        click.echo(terminal(line), err=True)
