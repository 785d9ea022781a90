"""The export's progress on stderr. On a terminal: a live line (rich) with the running stage, its elapsed
time and a bar where the work is countable; each finished stage stays as one line. Elsewhere (a pipe, a CI
log) or with --quiet / --json: one line per stage as it ends. The first line is out before torch is imported."""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click

from ..safe_text import terminal


def stage_line(event: Any) -> str:
    from ..progress import place

    return f"{place(event)}{event.stage} ... {event.status} ({event.seconds:.2f}s)"


class ProgressView:
    """A ``on_progress`` listener for api.export; a context manager, so the live line is closed however the
    export ends."""

    def __init__(self, live: bool) -> None:
        self.live = live and sys.stderr.isatty()
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> ProgressView:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                                TextColumn("{task.fields[count]}"), TimeElapsedColumn(), console=Console(stderr=True),
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task("starting", total=None, count="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def say(self, text: str) -> None:
        """One line on stderr; ``text`` is one line whose names are data: it passes the terminal escaper whole."""
        text = terminal(text)
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, markup=False)
        else:
            click.echo(text, err=True)

    def __call__(self, event: Any) -> None:
        # the event's text may come from the load sandbox's child (a hostile model's code): escaped first
        event = dataclasses.replace(event, stage=terminal(event.stage), status=terminal(event.status),
                                    what=terminal(event.what))
        if event.kind == "end":
            self.say(stage_line(event))
            if self.bar is not None:
                self.bar.update(self.task, description="", total=None, completed=0, count="")
            return
        if self.bar is None:
            return
        from ..progress import place

        label = f"{place(event)}{event.stage}"
        if event.kind == "start":
            self.bar.reset(self.task, description=label, total=None, count="")
        else:
            self.bar.update(self.task, description=f"{label}: {event.what}", total=event.total, completed=event.done,
                            count=f"{event.done}/{event.total}")
