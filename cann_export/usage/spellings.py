"""The articles' command-line spellings, where they can mean something real.

* ``cann-export --model m.pth --format atc_ready`` (and the console script ``cann.torch.export``, the
  articles' CI line): ``--model`` is the positional MODEL;
* ``cann-export convert --model b.pth --output b.om``: the article's ``atc convert --model ... --output``
  (Huawei's atc has no ``convert`` subcommand; ours runs atc with the bundle's own options).
"""
from __future__ import annotations

import click

MODEL_OPTION_HELP = "{what} as an option, the articles' spelling (`--model model.pth`)."


def model_option(what: str):
    """``--model PATH``, an alternative to the positional argument (stored as ``model_opt``)."""
    return click.option("--model", "model_opt", type=click.Path(dir_okay=True, path_type=str), default=None,
                        help=MODEL_OPTION_HELP.format(what=what))


def one_model(positional: str | None, option: str | None, name: str = "MODEL") -> str:
    """The model path given as the argument or as ``--model``, exactly once."""
    if positional and option and positional != option:
        raise click.UsageError(f"two models given: {positional} and --model {option}; pass one")
    if not (positional or option):
        raise click.UsageError(f"Missing argument '{name}' (or --model {name})")
    return positional or option
