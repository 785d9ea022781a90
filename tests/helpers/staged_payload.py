"""A model file whose unpickling (only with --trust-pickle: it is code) turns the export against its own output.

``Plant(kind)`` unpickles by calling ``install(kind)``, which wraps the format's ``finalize`` in the process that
loads it (the sandboxed child, or the exporting process with --no-sandbox): once the format has finalized its staged
artifact, the wrapper changes it as code running there can, then re-hashes the manifest's file table (and the ATC
section) so the bundle agrees with itself. It returns the toy MLP, so the export goes on. ``kind``:

- ``extra``: a ``p4-planted.sh`` beside the artifact's files (listed in the file table);
- ``symlink``: ``passwd``, a symbolic link to /etc/passwd;
- ``hardlink``: ``linked.onnx``, a second name of the staged graph;
- ``convert``: ``touch MARK`` appended to atc/convert.sh;
- ``cfg``: atc/fusion_switch.cfg rewritten (export with a fusion_switch hint so there is one);
- ``soc``: another SoC in the manifest's ATC section, the command and convert.sh, all consistent;
- ``folder``: an empty directory ``hooks/``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .toy_models import make_mlp


def _rehash(staging: Path) -> None:
    import hashlib

    manifest_path = staging / "manifest.json"
    if not manifest_path.is_file():
        return
    manifest = json.loads(manifest_path.read_text())
    for path in sorted(staging.rglob("*")):
        rel = path.relative_to(staging).as_posix()
        if rel != "manifest.json" and path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest_path.write_text(json.dumps(manifest, indent=2))


def plant(kind: str, staging: Path) -> None:
    if kind == "extra":
        (staging / "p4-planted.sh").write_text("#!/bin/sh\ntouch MARK\n")
    elif kind == "symlink":
        os.symlink("/etc/passwd", staging / "passwd")
    elif kind == "hardlink":
        graph = next(p for p in sorted(staging.iterdir()) if p.suffix == ".onnx")
        os.link(graph, staging / "linked.onnx")
    elif kind == "convert":
        with open(staging / "atc" / "convert.sh", "a") as f:
            f.write("\ntouch MARK\n")
    elif kind == "cfg":
        (staging / "atc" / "fusion_switch.cfg").write_text('{"Switch": {"GraphFusion": {"ALL": "off"}}}')
    elif kind == "soc":
        manifest = json.loads((staging / "manifest.json").read_text())
        old, new = manifest["atc"]["soc_version"], "Ascend910B"
        manifest["atc"]["soc_version"] = new
        manifest["atc"]["command"] = [a.replace(old, new) for a in manifest["atc"]["command"]]
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
        script = staging / "atc" / "convert.sh"
        script.write_text(script.read_text().replace(old, new))
    elif kind == "folder":
        (staging / "hooks").mkdir()
    _rehash(staging)


def install(kind: str):
    from cann_export.bundle import format_writers as formats

    originals = {cls: cls.__dict__["finalize"] for cls in (formats.OnnxFormat, formats.AtcReadyFormat)}

    def restore() -> None:  # once: an in-process (--no-sandbox) export leaves the classes as they were
        for cls, original in originals.items():
            cls.finalize = original

    for cls, original in originals.items():
        def finalize(self, ctx, staging, _original=original):
            restore()
            _original(self, ctx, staging)
            plant(kind, Path(staging))

        cls.finalize = finalize
    return make_mlp().eval()


class Plant:
    def __init__(self, kind: str):
        self.kind = kind

    def __reduce__(self):
        return (install, (self.kind,))
