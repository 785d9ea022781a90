"""What a torch.export archive would make torch execute, decided from the archive's layout, not its bytes.

torch.export.load (torch/export/pt2_archive/_package.py, torch/_export/serde/serialize.py) unpickles:
sample inputs (``data/sample_inputs/<m>.pt``, weights-only first, then a *full* unpickling fallback),
legacy weight / constant files (``data/weights/<m>.pt``, ``data/constants/<m>.pt``), weights and tensor
constants marked ``use_pickle`` in their JSON config (``torch.load(weights_only=False)``), torchbind objects
(``custom_obj_*``) and opaque objects (``opaque_obj_*``, plain ``pickle.loads``); the torch 2.7 layout
(a top-level ``version`` member) unpickles ``serialized_*.pt``. The graph JSON is code too: symbolic shape
strings go through ``sympy.sympify`` (``eval``) and node targets are resolved by attribute lookup from
``torch`` / ``operator`` / ``math``.

``check_export_archive`` walks exactly those members (mirroring torch's record naming) and refuses, naming
the member, any pickle that torch's weights-only unpickler rejects, any object constant, any symbolic
expression that is not plain arithmetic over symbols, any node target that is not an operator or is one that
does file, IO, process or network work (``aten::from_file``, ``aten::save``, ... by name), any non-empty
``guards_code`` (torch/export/_unlift.py exec()s it) or unknown model field, and any AOTInductor member or
shared object (torch extracts and dlopen()s them). The zip layout itself is checked by archives.open_checked.
``load_exported_program`` then loads with every ``torch.load`` forced to weights-only
(``TORCH_FORCE_WEIGHTS_ONLY_LOAD``), with torch's logging and warnings silenced, so the fallback to full
unpickling can never run even if the walk missed a member. ``trust_pickle`` skips both.
"""
from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import LoadError
from .archives import ArchiveError, CheckedZip, open_checked
from .program_graph import graph_problem

_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_NO_FORCE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_LEGACY_27 = ("serialized_state_dict.pt", "serialized_constants.pt", "serialized_example_inputs.pt",
              "serialized_state_dict.json", "serialized_constants.json")
# native code torch.export.load extracts and dlopen()s (AOTInductor), or any shared object
_AOTI_DIR = "data/aotinductor/"
_NATIVE = re.compile(r"\.(so|dylib|dll|pyd)(\.\d+)*$", re.IGNORECASE)


def _why_pickle_refused(data: bytes) -> str | None:
    """None when torch's weights-only unpickler accepts ``data``, else what it would need (torch's own
    listing of the globals it references that weights-only loading does not allow)."""
    import pickle

    import torch

    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return None
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, TypeError, AttributeError,
            ImportError, KeyError, IndexError, OverflowError, MemoryError, UnicodeDecodeError) as e:
        unsafe = unsafe_globals(data)
        if unsafe:
            return "references " + ", ".join(unsafe[:5]) + (f" (+{len(unsafe) - 5} more)" if len(unsafe) > 5 else "")
        return f"weights-only loading rejects it ({type(e).__name__}: {' '.join(str(e).split())[:120]})"


def unsafe_globals(data: bytes) -> list[str]:
    """The globals a torch.save stream (zip or legacy) references beyond what weights-only loading allows,
    listed statically (nothing is imported or run): torch's own listing
    (get_unsafe_globals_in_checkpoint) for zip files; for a legacy stream, each of its pickles (magic,
    protocol, sys info, payload) read with torch's opcode reader, or pickletools for protocol 0/1 opcodes
    that reader does not know. [] when nothing can be listed; the weights-only verdict stands either way."""
    import torch
    from torch import _weights_only_unpickler as wou

    if data[:4] == b"PK\x03\x04":
        try:
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data)))
        except Exception:  # noqa: BLE001 - not a torch.save zip: nothing to list
            return []
    safe = set(wou._get_allowed_globals().keys()) | set(wou._get_user_allowed_globals().keys())
    found: set[str] = set()
    stream = io.BytesIO(data)
    for _ in range(4):
        start = stream.tell()
        if start >= len(data):
            break
        try:
            found |= wou.get_globals_in_pkl(stream)
        except Exception:  # noqa: BLE001 - an opcode torch's reader does not list: disassemble instead
            stream.seek(start)
            found |= _pickletools_globals(stream)
    return sorted(found - safe)


def _pickletools_globals(stream: io.BytesIO) -> set[str]:
    import pickletools

    found, strings = set(), []
    try:
        for op, arg, _ in pickletools.genops(stream):
            if op.name in ("GLOBAL", "INST"):
                found.add(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.add(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:  # noqa: BLE001 - stop at the first byte that is not an opcode
        stream.seek(len(stream.getbuffer()))
    return found


def _records(archive: CheckedZip) -> dict[str, str]:
    """torch's record names (PyTorchFileReader: the first entry's top directory is the archive root)."""
    names = archive.names
    if not names or "/" not in names[0]:
        return {}
    root = names[0].split("/", 1)[0] + "/"
    return {n[len(root):]: n for n in names if n.startswith(root)}


def _config(archive: CheckedZip, member: str) -> dict[str, Any]:
    try:
        value = json.loads(archive.read(member))
        entries = value.get("config", {}) if isinstance(value, dict) else {}
        return {k: v for k, v in entries.items() if isinstance(v, dict)} if isinstance(entries, dict) else {}
    except (ValueError, RecursionError):
        return {}  # torch fails on it before unpickling anything


def risky_members(archive: CheckedZip) -> Iterator[tuple[str, str]]:
    """(zip member, how torch would use it) for every member torch.export.load would unpickle or evaluate:
    'pickle', 'object' (torchbind / plain pickle.loads) or 'graph'."""
    from torch.export.pt2_archive import constants as c

    records = _records(archive)
    prefix, suffix = c.MODELS_FILENAME_FORMAT.split("{}")
    for rec in list(records):
        if not rec.startswith(prefix):
            continue
        model = rec[len(prefix):-len(suffix)] if suffix else rec[len(prefix):]
        yield records[rec], "graph"
        if (sample := c.SAMPLE_INPUTS_FILENAME_FORMAT.format(model)) in records:
            yield records[sample], "pickle"
        for legacy, cfg_name, directory in (
                (f"{c.WEIGHTS_DIR}{model}.pt", c.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model), c.WEIGHTS_DIR),
                (f"{c.CONSTANTS_DIR}{model}.pt", c.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model), c.CONSTANTS_DIR)):
            if legacy in records:
                yield records[legacy], "pickle"
                continue
            if cfg_name not in records:
                continue
            for payload in _config(archive, records[cfg_name]).values():
                path_name = str(payload.get("path_name", ""))
                member = records.get(posixpath.join(directory, path_name))
                if member is None:
                    continue
                if directory == c.CONSTANTS_DIR and path_name.startswith((c.CUSTOM_OBJ_FILENAME_PREFIX,
                                                                           c.OPAQUE_OBJ_FILENAME_PREFIX)):
                    yield member, "object"
                elif payload.get("use_pickle") and (directory == c.WEIGHTS_DIR
                                                    or path_name.startswith(c.TENSOR_CONSTANT_FILENAME_PREFIX)):
                    yield member, "pickle"
    if "version" in archive.infos:  # torch 2.7 layout, tried when the current one fails
        for name in _LEGACY_27:
            if name in archive.infos:
                yield name, "pickle"
        if "serialized_exported_program.json" in archive.infos:
            yield "serialized_exported_program.json", "graph"


def check_export_archive(path: Path | str, trust_pickle: bool) -> None:
    """Refuse a .pt2 that would make torch.export.load run anything beyond weights-only unpickling; the
    archive's directory is bounds-checked (archives.open_checked) even when ``trust_pickle`` is set."""
    path = Path(path)
    with open_checked(path) as archive, quiet_torch():
        if trust_pickle:
            return
        for member in archive.names:
            if member.startswith(_AOTI_DIR) or f"/{_AOTI_DIR}" in member or _NATIVE.search(member):
                raise LoadError(
                    f"refused to load: torch.export archive member {member!r} is native code (AOTInductor or a "
                    "shared object) that torch.export.load would extract and dlopen(), running it. Export the "
                    "model without AOTInductor packaging, or pass --trust-pickle (trust_pickle=True) only for "
                    "archives you trust", path=path)
        seen: set[str] = set()
        for member, use in risky_members(archive):
            if member in seen:
                continue
            seen.add(member)
            if use == "object":
                why = "a Python object constant, which torch restores with full unpickling"
            elif use == "graph":
                why = graph_problem(archive.read(member))
            else:
                data = archive.read(member)
                why = _nested_zip_problem(data, member) or (_why_pickle_refused(data) if data else None)
            if why:
                raise LoadError(
                    f"refused to load: torch.export archive member {member!r} would be unpickled or evaluated "
                    f"by torch.export.load and weights-only loading cannot vouch for it: {why}. Unpickling can run "
                    "arbitrary code; pass --trust-pickle (trust_pickle=True) only for archives you trust", path=path)


def _nested_zip_problem(data: bytes, member: str) -> str | None:
    """torch.load reads a zip inside a member with its own reader: bound that directory too."""
    if data[:4] != b"PK\x03\x04":
        return None
    try:
        open_checked(data, label=member).close()
    except ArchiveError as e:
        return "its inner zip is unsafe: " + e.message
    return None


@contextmanager
def weights_only_unpickling() -> Iterator[None]:
    """Every torch.load inside runs with weights_only=True, whatever its caller passed (torch honours
    TORCH_FORCE_WEIGHTS_ONLY_LOAD over an explicit weights_only=False). Process-wide while it lasts."""
    saved = {k: os.environ.get(k) for k in (_FORCE, _NO_FORCE)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_NO_FORCE, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def quiet_torch() -> Iterator[None]:
    """No torch log records or warnings (tracebacks of its fallbacks) reach the user's stderr."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


# Libraries whose output classes (transformers' ModelOutput, diffusers' BaseOutput) join torch's pytree when
# their module is imported: a program returning one names it, and only these packages are imported for it.
OUTPUT_LIBRARIES = ("transformers", "diffusers")
_MAX_OUTPUT_MODULES = 4
_UNREGISTERED = re.compile(r"Deserializing ([A-Za-z_][\w.]*)\.[A-Za-z_]\w* in pytree is not registered")


def import_output_module(error: BaseException) -> bool:
    """For torch.export.load's "Deserializing pkg.mod.Class in pytree is not registered": import ``pkg.mod``
    when ``pkg`` is one of OUTPUT_LIBRARIES and installed, and say whether it did. The file names the
    module, so nothing outside those installed libraries is ever imported."""
    import importlib
    import importlib.util
    import sys

    match = _UNREGISTERED.search(str(error))
    if match is None:
        return False
    module = match.group(1)
    if module.split(".")[0] not in OUTPUT_LIBRARIES or module in sys.modules:
        return False
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return False
        with quiet_torch():
            importlib.import_module(module)
    except Exception:  # noqa: BLE001 - not importable here: the load fails with torch's own message
        return False
    return True


def load_exported_program(path: Path | str, trust_pickle: bool) -> Any:
    """check_export_archive, then torch.export.load with weights-only forced (unless trusted) and quiet;
    any failure is a LoadError naming the file."""
    import torch

    path = Path(path)
    check_export_archive(path, trust_pickle)
    failure: Exception
    for _ in range(_MAX_OUTPUT_MODULES + 1):
        try:
            with quiet_torch():
                if trust_pickle:
                    return torch.export.load(str(path))
                with weights_only_unpickling():
                    return torch.export.load(str(path))
        except Exception as e:
            failure = e
        # outside the except block, so the real cause is not chained to torch's generic error
        cause = _logged_cause(path, trust_pickle) if "warnings above" in str(failure) else failure
        if not import_output_module(cause):
            break
    raise LoadError("torch.export.load failed: the archive may be truncated, crafted, or written by an "
                    "incompatible torch version", path=path) from cause  # the CLI shows the cause


def _logged_cause(path: Path, trust_pickle: bool) -> BaseException:
    """torch.export.load logs the real error and raises a generic one ("check the warnings above"); the
    warnings are silenced, so the current-layout loader is run again to get the real error."""
    from torch.export.pt2_archive._package import load_pt2

    try:
        with quiet_torch():
            if trust_pickle:
                load_pt2(str(path))
            else:
                with weights_only_unpickling():
                    load_pt2(str(path))
    except Exception as inner:  # noqa: BLE001 - whatever torch raised is the answer
        return inner
    return RuntimeError("torch.export.load could not deserialize the archive")
