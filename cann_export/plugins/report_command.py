"""``cann-export report BUNDLE``: report.html of a finished bundle, its per-layer curve re-derived from the
bundle's stored inputs (report/write_report.py)."""
from __future__ import annotations

from pathlib import Path

from ..hooks.specs import hookimpl
from ..safe_text import terminal


@hookimpl
def register_commands(cli):
    import click

    from ..usage.examples import examples

    @cli.command("report", epilog=examples("cann-export report out/resnet_atc_ready -o resnet.html",
                                           "# a multi-graph bundle: one page, every graph",
                                           "cann-export report whisper_atc_ready",
                                           "cann-export report model.pth --json"))
    @click.argument("bundle", type=click.Path(path_type=str))
    @click.option("-o", "--output", type=click.Path(path_type=str), default=None,
                  help="Where to write the page, outside the bundle (default: BUNDLE.report.html beside the bundle; "
                       "for BUNDLE/components/NAME, BUNDLE.NAME.report.html beside BUNDLE). The bundle's own "
                       "report.html is covered by its manifest's digests and stays as exported.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
    def report_cmd(bundle: str, output: str | None, as_json: bool) -> int:
        """Write report.html for an atc_ready / om bundle: the verdict, metrics per output and shape, the
        per-layer precision curve (re-derived), lint findings, the ATC command and the capture attempts. A
        multi-graph bundle gives one page, a section per component."""
        from ..report.write_report import regenerate

        result = regenerate(Path(bundle), Path(output) if output else None)
        if as_json:
            from ..fs.jsonio import dumps

            click.echo(dumps(result))
        else:
            click.echo(terminal(f"wrote {result['report']} ({result['layers']} values on the per-layer curve; verdict "
                                f"{'passed' if result['passed'] else 'FAILED'})"))
        return 0
