"""What the fuzzer puts into an artifact: pickles that would run a command creating the marker file, native
code, Python source, and bytes that lie about their own size (a huge safetensors header, 1 MiB of zeros)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from .files import evil_bytes, rewrite

KINDS = ("pickle-protocol0", "pickle-protocol1", "pickle-protocol2", "torch.save-legacy", "torch.save-zip", "elf",
         "python", "json-junk", "empty", "zeros", "safetensors-huge-header", "safetensors-bad-offsets")


def python_code(marker: Path) -> str:
    """A Python expression that creates ``marker`` (what sympy or guards_code evaluation would run)."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch() is None"


def safetensors_bytes(header: bytes, declared: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header


class Context:
    """The marker the payloads would create and the archives they come in (built once, then cached)."""

    def __init__(self, marker: Path, good_pt2: Path):
        self.marker = marker
        self.good_pt2 = good_pt2
        self._cache: dict[str, bytes] = {}

    def payload(self, kind: str) -> bytes:
        if kind not in self._cache:
            self._cache[kind] = self._make(kind)
        return self._cache[kind]

    def _make(self, kind: str) -> bytes:
        if kind.startswith("pickle-"):
            return evil_bytes(self.marker, kind.removeprefix("pickle-"))
        if kind.startswith("torch.save-"):
            return evil_bytes(self.marker, "torch.save zip" if kind.endswith("zip") else "legacy torch.save")
        if kind == "elf":
            return b"\x7fELF\x02\x01\x01" + bytes(57)
        if kind == "python":
            return python_code(self.marker).encode()
        if kind == "json-junk":
            return b'{"config": {"w": {"path_name": "../../x", "use_pickle": true'
        if kind == "zeros":
            return bytes(1 << 20)
        if kind == "safetensors-huge-header":
            return safetensors_bytes(b"{}", declared=1 << 62)
        if kind == "safetensors-bad-offsets":
            header = {"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 1 << 40]}}
            return safetensors_bytes(json.dumps(header).encode())
        return b""

    def evil_archive(self) -> bytes:
        """A .pt2 whose sample inputs are a pickle payload (the M of an M + Z concatenation)."""
        if "evil_archive" not in self._cache:
            dst = self.marker.parent / "evil-archive.pt2"
            rewrite(self.good_pt2, dst, {"sample_inputs/model.pt": self.payload("pickle-protocol2")})
            self._cache["evil_archive"] = dst.read_bytes()
        return self._cache["evil_archive"]
