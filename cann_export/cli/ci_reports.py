"""``--summary`` / ``--junit`` and GitHub annotations for ``export`` and ``validate``: the verdict's manifests
rendered (bundle/summaries.py) and written atomically, also when the verdict fails; a refused run (an error
before any verdict) still writes a JUnit file with one failing test case and a summary naming the error."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ..safe_text import terminal

SUMMARY_HELP = ("Write a Markdown summary of the verdicts (per output / component / gear) and the ATC command to "
                "FILE; also appended to $GITHUB_STEP_SUMMARY when that is set.")
JUNIT_HELP = ("Write JUnit XML to FILE: one test case per output (x gear, x component); a refused run writes one "
              "failing test case naming the error.")


def ci_options(command: Callable[..., Any]) -> Callable[..., Any]:
    file = click.Path(dir_okay=False, path_type=str)
    command = click.option("--junit", "junit_file", type=file, default=None, metavar="FILE", help=JUNIT_HELP)(command)
    return click.option("--summary", "summary_file", type=file, default=None, metavar="FILE",
                        help=SUMMARY_HELP)(command)


class CiReports:
    """What one ``export`` / ``validate`` run leaves for CI (nothing when no option or variable asks)."""

    def __init__(self, command: str, path: str, summary: str | None, junit: str | None, as_json: bool) -> None:
        self.command, self.path, self.summary, self.junit, self.as_json = command, path, summary, junit, as_json
        self.step_summary = os.environ.get("GITHUB_STEP_SUMMARY") or None
        self.actions = os.environ.get("GITHUB_ACTIONS") == "true"
        self.started = time.monotonic()
        from ..fs.report_paths import check_report_path

        for flag, file in (("--summary", summary), ("--junit", junit)):
            if file:  # before the export runs: a report found unwritable after commit is too late
                check_report_path(file, flag)

    @contextlib.contextmanager
    def refusal(self) -> Iterator[None]:
        """Around the work: an error before any verdict still leaves the JUnit file and summary, then goes on
        to the CLI's error guard as always."""
        try:
            yield
        except Exception as e:
            self.refused(e)
            raise

    def refused(self, err: Exception) -> None:
        from ..bundle import summaries
        from ..errors import ExportError, gist

        error = err.to_dict() if isinstance(err, ExportError) else {"stage": "internal",
                                                                    "message": f"{type(err).__name__}: {gist(err)}"}
        self._write(self.junit, lambda: summaries.refused_junit(self.command, self.path, error))
        self._write(self.summary, lambda: summaries.refused_markdown(self.command, self.path, error))
        self._append_step_summary(lambda: summaries.refused_markdown(self.command, self.path, error))
        if self.actions:
            self._annotate([summaries.refused_annotation(self.command, error)])

    @property
    def active(self) -> bool:
        return bool(self.summary or self.junit or self.step_summary or self.actions)

    def emit(self, read_graphs: Callable[[], dict[Any, dict[str, Any]]]) -> None:
        """The verdict of ``read_graphs()`` ({component or None: manifest}; read only when something is asked
        for) as summary, JUnit and annotations."""
        from ..bundle import summaries

        if not self.active:
            return
        graphs = read_graphs()
        seconds = time.monotonic() - self.started
        workspace = os.environ.get("GITHUB_WORKSPACE") or os.environ.get("CI_PROJECT_DIR") or os.getcwd()
        self._write(self.junit, lambda: summaries.junit(self.command, self.path, graphs, seconds, workspace))
        self._write(self.summary, lambda: summaries.markdown(self.command, self.path, graphs))
        self._append_step_summary(lambda: summaries.markdown(self.command, self.path, graphs))
        if self.actions:
            self._annotate(summaries.annotations(self.command, graphs, workspace))

    def _write(self, file: str | None, render: Callable[[], str]) -> None:
        if not file:
            return
        from ..errors import WriteError
        from ..fs import atomic

        target = Path(file)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(target, render())
        except OSError as e:
            raise WriteError(f"cannot write the CI report ({e.strerror or e}); pass a writable file", path=file) from e

    def _append_step_summary(self, render: Callable[[], str]) -> None:
        """GitHub's job summary file is appended to (as GitHub documents), in one write."""
        if not self.step_summary:
            return
        try:
            with open(self.step_summary, "a", encoding="utf-8") as f:
                f.write(render() + "\n")
        except OSError as e:  # the runner's file; a failure here must not change the verdict's exit code
            click.echo(f"warning: $GITHUB_STEP_SUMMARY {terminal(self.step_summary)}: not written "
                       f"({terminal(e.strerror or e)})", err=True)

    def _annotate(self, lines: list[str]) -> None:
        for line in lines:  # stdout, as GitHub reads workflow commands; stderr under --json (stdout is JSON)
            click.echo(line, err=self.as_json)


def bundle_manifest(bundle: str) -> dict[str, Any]:
    """The manifest of an (already validated) bundle: a directory, a single-file bundle or an om-stub."""
    from ..bundle.read import open_bundle
    from ..fs.jsonio import loads_strict

    with open_bundle(Path(bundle)) as (directory, _):
        return loads_strict((Path(directory) / "manifest.json").read_text(encoding="utf-8"))


def component_manifests(bundle: str | Path) -> dict[str, dict[str, Any]]:
    """``{component: its manifest}`` of a written multi-graph bundle (a directory or a zip), in the bundle's
    order."""
    from ..bundle.multi_check import opened_multi
    from ..fs.jsonio import loads_strict

    with opened_multi(Path(bundle)) as directory:
        if directory is None:  # not readable as a multi-graph bundle: validate says why; no per-graph report
            return {}
        root = Path(directory)
        top = loads_strict((root / "manifest.json").read_text(encoding="utf-8"))
        return {c["name"]: loads_strict((root / c["path"] / "manifest.json").read_text(encoding="utf-8"))
                for c in top["components"]}
