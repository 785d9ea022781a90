"""Model files of every supported kind, written into a test's tmp_path."""
from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import torch

from .toy_models import make_mlp

MLP_CLASS = "helpers.toy_models:make_mlp"


def pt2(tmp: Path) -> Path:
    model = make_mlp().eval()
    path = tmp / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 12),)), str(path))
    return path


def torchscript(tmp: Path) -> Path:
    path = tmp / "mlp_ts.pt"
    torch.jit.save(torch.jit.script(make_mlp().eval()), str(path))
    return path


def state_dict(tmp: Path) -> Path:
    path = tmp / "mlp_sd.pth"
    torch.save(make_mlp().state_dict(), str(path))
    return path


def checkpoint(tmp: Path) -> Path:
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 12)).sum().backward()
    opt.step()
    path = tmp / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 7}, str(path))
    return path


def safetensors_weights(tmp: Path) -> Path:
    from safetensors.torch import save_model

    path = tmp / "mlp.safetensors"
    save_model(make_mlp(), str(path))
    return path


def pickled_module(tmp: Path) -> Path:
    path = tmp / "whole.pth"
    torch.save(make_mlp(), str(path))
    return path


class Evil:
    """Unpickling this would run a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def rewrite(src: Path, dst: Path, replace: dict[str, bytes] | None = None, add: dict[str, bytes] | None = None) -> Path:
    """Copy a zip, replacing members whose name ends with a key of ``replace`` and appending ``add``
    (``{root}`` in an added name is the archive's top directory)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/")[0]
        for item in zin.infolist():
            data = zin.read(item.filename)
            for suffix, new in (replace or {}).items():
                if item.filename.endswith(suffix):
                    data = new
            zout.writestr(item, data)
        for name, data in (add or {}).items():
            zout.writestr(zipfile.ZipInfo(name.replace("{root}", root)), data)
    return dst


def evil_bytes(marker: Path, how: str) -> bytes:
    """A pickle whose loading creates ``marker``: ``protocolN`` (plain pickle) or a torch.save file."""
    payload = {"x": Evil(marker)}
    if how.startswith("protocol"):
        return pickle.dumps(payload, protocol=int(how[-1]))
    buf = io.BytesIO()
    torch.save(payload, buf, _use_new_zipfile_serialization=(how == "torch.save zip"))
    return buf.getvalue()


def malicious_pickle(tmp: Path, marker: Path, zipped: bool) -> Path:
    path = tmp / ("evil_zip.pth" if zipped else "evil_raw.pth")
    if zipped:
        torch.save({"weights": torch.ones(2), "payload": Evil(marker)}, str(path))
    else:
        path.write_bytes(pickle.dumps(Evil(marker)))
    return path
