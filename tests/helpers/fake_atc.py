"""A stand-in for Huawei's ATC on PATH (it records its arguments and writes a fake .om, or fails the way ATC
does), and a PATH without any real ``atc``."""
from __future__ import annotations

import os
from pathlib import Path

ERROR_LINE = "E19010: No parser is registered for Op Foo"


def path_without_atc() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "atc").exists())


def fake_atc(directory: Path, argv_file: Path, fail: bool = False) -> Path:
    """A shell `atc` that records its arguments and writes <--output>.om (or fails like ATC does, or when its
    --model file does not exist)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "atc"
    body = [
        "#!/bin/sh",
        f"printf '%s\\n' \"$@\" > '{argv_file}'",
        'out=model',
        'for a in "$@"; do case "$a" in --output=*) out="${a#--output=}";; esac; done',
        # as ATC does, refuse a --model that is not there (AMCT's deploy model must exist before atc runs)
        'for a in "$@"; do case "$a" in --model=*) [ -f "${a#--model=}" ] || '
        '{ echo "E10001: --model ${a#--model=} does not exist" >&2; exit 1; };; esac; done',
        'echo "ATC start working now, please wait for a moment."',
    ]
    if fail:
        body += ['echo "ATC run failed, Please check the detail log, Try \'atc --help\' for more information"',
                 f'echo "{ERROR_LINE}" >&2',
                 'echo "        Solution: Check the version of the installation package." >&2',
                 "exit 1"]
    else:
        body += ['printf "FAKE-OM %s" "$*" > "$out.om"', 'echo "ATC run success, welcome to the next use."']
    script.write_text("\n".join(body) + "\n")
    script.chmod(0o755)
    return directory


def two_inputs_bundle(root):
    """An atc_ready bundle of toy_models.TwoInputs (two inputs sharing a free batch dimension, a dict of two
    outputs) at ``root / "good"``, exported where no ``atc`` is on PATH."""
    import pytest
    import torch
    from helpers.toy_models import TwoInputs

    import cann_export

    torch.manual_seed(0)
    inputs = {"input_ids": torch.randint(0, 50, (2, 9)), "features": torch.randn(2, 9, 16)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        assert cann_export.export(TwoInputs().eval(), root / "good", "atc_ready", example_inputs=inputs).ok
    return root / "good"
