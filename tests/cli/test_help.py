"""Issue 21 item 5: every command in the real click tree (plugin commands included) shows a description and
an example in its --help, and every option has help text."""
import click
from click.testing import CliRunner

from cann_export.cli.main import _register_plugin_commands, cli


def _walk(command, path):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _walk(sub, [*path, name])


def test_every_command_has_a_description_an_example_and_helped_options():
    _register_plugin_commands()
    found = list(_walk(cli, []))
    assert {"export", "validate", "inspect", "lint", "convert", "zoo publish", "gc"} <= {" ".join(p) for p, _ in found}
    runner = CliRunner()
    for path, command in found:
        module = getattr(command.callback, "__module__", "") or ""
        if path and not module.startswith(("cann_export", "cann.")):
            continue  # a test plugin's command other tests registered in this process (test_cli's "house")
        where = "cann-export " + " ".join(path)
        for param in command.params:
            if isinstance(param, click.Option):
                assert (param.help or "").strip(), f"{where} {'/'.join(param.opts)} has no help text"
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (where, result.output)
        description = (command.help or "").strip()
        first = " ".join(description.split("\n\n")[0].split())
        assert first and first in " ".join(result.output.split()), f"{where} shows no description"
        example = result.output.split("Examples:", 1)
        assert len(example) == 2 and "cann-export " + " ".join(path) in example[1], f"{where} shows no example"
