"""``cann-export golden BUNDLE -o DIR``: the bundle's parity inputs and reference outputs in the layout msprobe's
offline_model compare reads, with the exact command (bundle/golden.py)."""
from __future__ import annotations

from ..hooks.specs import hookimpl
from ..safe_text import terminal


@hookimpl
def register_commands(cli):
    import click

    from ..usage.examples import examples

    @cli.command("golden", epilog=examples("cann-export golden out/resnet_atc_ready -o resnet_golden",
                                           "sh resnet_golden/msprobe_compare.sh /path/to/resnet.om"))
    @click.argument("bundle", type=click.Path(path_type=str))
    @click.option("-o", "--output", type=click.Path(path_type=str), required=True,
                  help="A new directory outside the bundle for the golden inputs, outputs and msprobe_compare.sh.")
    @click.option("--set", "input_set", type=click.IntRange(min=0), default=0, show_default=True,
                  help="Which stored parity input set (0: the example).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
    def golden_cmd(bundle: str, output: str, input_set: int, as_json: bool) -> int:
        """Write an atc_ready / om bundle's parity inputs and reference outputs in the layout `msprobe compare -m
        offline_model` reads, and the exact command comparing the compiled .om against the bundle's graph."""
        from pathlib import Path

        from ..bundle.golden import write_golden

        result = write_golden(Path(bundle), Path(output), input_set)
        if as_json:
            from ..fs.jsonio import dumps

            click.echo(dumps(result))
        else:
            click.echo(terminal(f"wrote {result['output']}: {len(result['inputs'])} input(s), {len(result['outputs'])} "
                                f"reference output(s); on the device run:\n  sh {result['output']}/msprobe_compare.sh "
                                "MODEL.om"))
        return 0
