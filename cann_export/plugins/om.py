"""Built-in om format (an atc_ready bundle compiled by ATC, or an om-stub without CANN) and ``convert``."""
from __future__ import annotations

import json

from ..bundle.om_format import OmFormat, convert
from ..hooks.specs import hookimpl
from ..safe_text import terminal


@hookimpl
def register_formats(register):
    register(OmFormat())


@hookimpl
def register_commands(cli):
    import click

    from ..usage.examples import examples
    from ..usage.spellings import model_option, one_model

    @cli.command("convert", epilog=examples("cann-export convert model.om -o deploy/model.om",
                                            "cann-export convert resnet_bundle --soc-version Ascend910B1",
                                            "cann-export convert --model resnet_bundle --output resnet.om"))
    @click.argument("artifact", type=click.Path(path_type=str), required=False)
    @model_option("ARTIFACT")
    @click.option("--soc-version", default=None,
                  help="ATC --soc_version (default: the one the bundle was exported for).")
    @click.option("-o", "--output", type=click.Path(path_type=str), default=None,
                  help="The .om to write (default: beside the input, <name>.om).")
    @click.option("--overwrite", is_flag=True, help="Replace an existing output.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON result object on stdout.")
    def convert_cmd(artifact: str | None, model_opt: str | None, soc_version: str | None, output: str | None,
                    overwrite: bool, as_json: bool) -> None:
        """Compile an atc_ready/om bundle or an om-stub into a real .om with CANN's ATC (an int8 Q/DQ graph
        through AMCT's convert_qat_model first). `convert --model b.pth --output b.om` is the articles'
        `atc convert ...` line (atc itself has no convert subcommand)."""
        artifact = one_model(artifact, model_opt, "ARTIFACT")
        click.echo(terminal(f"converting {artifact} with atc ..."), err=True)
        result = convert(artifact, output, soc_version, overwrite)
        if as_json:
            click.echo(json.dumps(result))
        else:
            amct = result.get("amct")
            first = (f"; AMCT {amct['version'] or '(version unknown)'} converted the Q/DQ graph first, log "
                     f"{amct['log']}" if amct else "")
            click.echo(terminal(f"wrote {result['output']} (soc_version {result['soc_version']}; log {result['log']}"
                                f"{first})"))
