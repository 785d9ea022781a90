"""Pickles hidden inside torch.export archives: torch.export.load retries a refused weights-only load
with full unpickling (torch/_export/serde/serialize.py), so a crafted .pt2 could run code. Every pickled
member is checked with weights_only=True first; only ``trust_pickle`` lets torch load the rest."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

from .errors import LoadError


def check_export_archive(path: Path, trust_pickle: bool) -> None:
    """Refuse a .pt2 whose pickled members (sample inputs, constants) need more than weights-only loading."""
    if trust_pickle:
        return
    import pickle

    import torch

    refused = []
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            with z.open(name) as f:
                head = f.read(4)
            if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
                continue  # raw tensor bytes and JSON are not pickles
            try:
                torch.load(io.BytesIO(z.read(name)), map_location="cpu", weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as e:
                refused.append(f"{name} ({type(e).__name__})")
    if refused:
        raise LoadError(
            f"refused to load: the torch.export archive holds pickles that weights-only loading rejects "
            f"({', '.join(refused[:3])}); torch.export.load would unpickle them with full Python, which can run "
            "code. Pass --trust-pickle (trust_pickle=True) only for archives you trust", path=path)
