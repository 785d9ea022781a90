"""The tensor files a user names (``--example-inputs``, ``--parity-data``, ``--calibration-data``): regular
files only, refused before any byte is read (fs.regular), and read within bounds. A safetensors file is
bounded by its own size (the library checks every tensor against it); an .npz is a zip whose members inflate,
so its directory is checked first (load.archives: names, declared sizes against the archive's size) and each
array's header must fit the bytes its member declares before the array is allocated."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ..errors import ExportError, OptionsError, PrepareError
from ..fs.regular import check_regular_file

HINTS = {
    "--example-inputs": "Pass a .safetensors or .npz file of tensors named after the forward parameters",
    "example_inputs": "Pass a .safetensors or .npz file of tensors named after the forward parameters",
    "--parity-data": "Pass a .safetensors or .npz file of input samples named after the forward parameters",
    "--calibration-data": "Pass a .safetensors or .npz file of input batches named after the forward parameters",
}


def check_input_file(path: str | Path, flag: str, error: type[ExportError] = OptionsError) -> Path:
    """``path`` when it is a regular file, else ``error`` naming ``flag`` and the file (nothing is opened)."""
    check_regular_file(path, f"{flag} file", HINTS.get(flag, "Pass a regular file"), error)
    return Path(path)


def read_npz(path: Path, flag: str = "--parity-data", error: type[ExportError] = PrepareError) -> dict[str, Any]:
    """The arrays of an .npz (no pickle), each read only after its header was found to fit its member."""
    from ..load.archives import ArchiveError, open_checked

    try:
        archive = open_checked(path, label=f"the {flag} file")
    except ArchiveError as e:
        raise error(f"{flag}: {e.message}", path=path) from e
    arrays = {}
    with archive:
        for name in archive.names:
            if not name.endswith(".npy"):
                raise error(f"{flag}: member {name[:80]!r} is not an .npy array; write the file with "
                            "numpy.savez", path=path)
            data = archive.read(name)
            arrays[name[:-len(".npy")]] = _array(io.BytesIO(data), len(data), name, path, flag, error)
    return arrays


def read_npz_tensors(path: Path, flag: str, error: type[ExportError] = PrepareError) -> dict[str, Any]:
    """``read_npz`` as torch tensors; an array torch has no dtype for (strings, dates, records) is refused."""
    import torch

    tensors = {}
    for name, array in read_npz(path, flag, error).items():
        try:
            native = array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
            tensors[name] = torch.from_numpy(native)
        except (TypeError, ValueError) as e:
            raise error(f"{flag}: array {name[:80]!r} has dtype {array.dtype}, which torch cannot hold ({e}); "
                        "store numbers (float32, int64, bool, ...)", path=path) from e
    return tensors


def _array(stream: io.BytesIO, size: int, name: str, path: Path, flag: str,
           error: type[ExportError] = PrepareError) -> Any:
    import numpy as np
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(stream)
        shape, _, dtype = (npy.read_array_header_1_0(stream) if version == (1, 0)
                           else npy.read_array_header_2_0(stream))
    except (ValueError, OSError) as e:
        raise error(f"{flag}: member {name[:80]!r} is not a readable .npy array ({e})", path=path) from e
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if dtype.hasobject or needed > size - stream.tell():
        why = "holds Python objects (pickle)" if dtype.hasobject else (
            f"declares {list(shape)} {dtype} ({needed} bytes) in {size - stream.tell()} bytes")
        raise error(f"{flag}: member {name[:80]!r} {why}; refusing it before allocating anything", path=path)
    stream.seek(0)
    return np.load(stream, allow_pickle=False)
