"""The tensor files a user names (``--example-inputs``, ``--parity-data``, ``--calibration-data``): regular
files only, refused before any byte is read (fs.regular), and read within bounds. A safetensors file is
bounded by its own size (the library checks every tensor against it); an .npz is a zip whose members inflate,
so its directory is checked first (load.archives: names, declared sizes against the archive's size) and each
array's header must fit the bytes its member declares before the array is allocated."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ..errors import ExportError, LoadError, OptionsError, PrepareError
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


def read_example_inputs(path: str | Path, flag: str = "--example-inputs") -> dict[str, Any]:
    """Load named tensors from a safetensors file or an .npz (a regular file, see check_input_file; no pickle;
    an .npz read within bounds: its zip directory, then each array's header against its member)."""
    path = check_input_file(path, flag, LoadError)
    if path.suffix == ".npz":
        tensors = read_npz_tensors(path, flag, LoadError)
    else:
        try:
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise LoadError(
                f"cannot read {flag} as safetensors ({type(e).__name__}: {e}); write the tensors with "
                "safetensors.torch.save_file({name: tensor}) or numpy.savez(path, name=array)",
                path=path,
            ) from e
    if not tensors:
        raise LoadError(f"the {flag} file holds no tensors", path=path)
    return dict(tensors)


def read_npz(path: Path, flag: str = "--parity-data", error: type[ExportError] = PrepareError,
             max_elements: int | None = None) -> dict[str, Any]:
    """The arrays of an .npz (no pickle), each read only after its header was found to fit its member (and to
    hold at most ``max_elements`` elements, when given)."""
    from .archives import ArchiveError, open_checked

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
            size = archive.infos[name].file_size
            _check_header(io.BytesIO(_head(archive, name, path, flag, error)), size, name, path, flag, error,
                          max_elements)
            data = archive.read(name)
            arrays[name[:-len(".npy")]] = _array(io.BytesIO(data), len(data), name, path, flag, error, max_elements)
    return arrays


_HEAD_BYTES = 64 << 10  # an .npy header (numpy writes at most a few hundred bytes; it reads at most 10000)


def _head(archive: Any, name: str, path: Path, flag: str, error: type[ExportError]) -> bytes:
    """The first bytes of a member (its .npy header), read without inflating the rest."""
    from .archives import ZIP_READ_ERRORS

    try:
        with archive.zf.open(name) as member:
            return member.read(min(_HEAD_BYTES, archive.infos[name].file_size))
    except ZIP_READ_ERRORS as e:
        raise error(f"{flag}: member {name[:80]!r} is unreadable ({type(e).__name__})", path=path) from e


def read_npz_tensors(path: Path, flag: str, error: type[ExportError] = PrepareError,
                     max_elements: int | None = None) -> dict[str, Any]:
    """``read_npz`` as torch tensors; an array torch has no dtype for (strings, dates, records) is refused."""
    import torch

    tensors = {}
    for name, array in read_npz(path, flag, error, max_elements).items():
        try:
            native = array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
            tensors[name] = torch.from_numpy(native)
        except (TypeError, ValueError) as e:
            raise error(f"{flag}: array {name[:80]!r} has dtype {array.dtype}, which torch cannot hold ({e}); "
                        "store numbers (float32, int64, bool, ...)", path=path) from e
    return tensors


def _array(stream: io.BytesIO, size: int, name: str, path: Path, flag: str,
           error: type[ExportError] = PrepareError, max_elements: int | None = None) -> Any:
    import numpy as np

    _check_header(stream, size, name, path, flag, error, max_elements)
    stream.seek(0)
    return np.load(stream, allow_pickle=False)


def _check_header(stream: io.BytesIO, size: int, name: str, path: Path, flag: str, error: type[ExportError],
                  max_elements: int | None) -> None:
    """Refuse an array whose header declares pickled objects, more elements than ``max_elements`` or more
    bytes than its member's ``size`` holds."""
    import numpy as np
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(stream)
        shape, _, dtype = (npy.read_array_header_1_0(stream) if version == (1, 0)
                           else npy.read_array_header_2_0(stream))
    except (ValueError, OSError) as e:
        raise error(f"{flag}: member {name[:80]!r} is not a readable .npy array ({e})", path=path) from e
    elements = int(np.prod(shape, dtype=object))
    needed = elements * dtype.itemsize
    if dtype.hasobject or needed > size - stream.tell():
        why = "holds Python objects (pickle)" if dtype.hasobject else (
            f"declares {list(shape)} {dtype} ({needed} bytes) in {size - stream.tell()} bytes")
        raise error(f"{flag}: member {name[:80]!r} {why}; refusing it before allocating anything", path=path)
    if max_elements is not None and elements > max_elements:
        raise error(f"{flag}: member {name[:80]!r} declares {list(shape)[:8]} ({elements} elements), more than the "
                    f"{max_elements} {flag} takes; refusing it before allocating anything", path=path)
