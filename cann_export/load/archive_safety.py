"""What a torch.export archive would make torch execute, decided from the archive's layout, not its bytes.

torch.export.load never sees the user's file: ``load_exported_program`` re-packs it (load/repack.py: only
the members on torch.export.save's allow-list, load/allowlist.py, so legacy weight files, torch 2.7
``serialized_*.pt`` pickles, torchbind / opaque object constants and AOTInductor shared objects are refused by
name), checks the copy and hands that copy to torch. In the copy torch.export.load (torch/export/pt2_archive/
_package.py) unpickles sample inputs (``data/sample_inputs/<m>.pt``, weights-only first, then a *full*
unpickling fallback) and weights and tensor constants marked ``use_pickle`` in their JSON config
(``torch.load(weights_only=False)``). The graph JSON is code too: symbolic shape strings go through
``sympy.sympify`` (``eval``), node targets are resolved by attribute lookup from ``torch`` / ``operator`` /
``math`` and ``guards_code`` is exec()'d (load/program_graph.py).

``check_export_archive`` walks exactly those members (mirroring torch's record naming) and refuses, naming
the member, any pickle that torch's weights-only unpickler rejects, any graph ``program_graph`` refuses and
any name torch would write into the source it generates that is not a plain identifier (``program_names``).
The load then runs with every ``torch.load`` forced to weights-only (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``), with
torch's logging and warnings silenced, so the fallback to full unpickling can never run even if the walk
missed a member. ``trust_pickle`` skips all of it but the bounds of the zip layout (archives.open_checked)
and the names: torch then loads the user's file itself.
"""
from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import LoadError
from .allowlist import PT2, PT2_LAYOUT
from .archives import ArchiveError, CheckedZip, max_inspected_bytes, open_checked, read_member
from .program_graph import graph_problem
from .program_names import names_problem
from .repack import Canonical, canonical_copy

_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_NO_FORCE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


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
    """(zip member, how torch would use it) for every member torch.export.load would unpickle ('pickle') or
    evaluate ('graph'); the allow-list has already refused every other kind of member."""
    c = PT2_LAYOUT

    records = _records(archive)
    prefix, suffix = c.MODELS_FILENAME_FORMAT.split("{}")
    for rec in list(records):
        if not rec.startswith(prefix):
            continue
        model = rec[len(prefix):-len(suffix)] if suffix else rec[len(prefix):]
        yield records[rec], "graph"
        if (sample := c.SAMPLE_INPUTS_FILENAME_FORMAT.format(model)) in records:
            yield records[sample], "pickle"
        for cfg_name, directory in ((c.WEIGHTS_CONFIG_FILENAME_FORMAT.format(model), c.WEIGHTS_DIR),
                                    (c.CONSTANTS_CONFIG_FILENAME_FORMAT.format(model), c.CONSTANTS_DIR)):
            if cfg_name not in records:
                continue
            for payload in _config(archive, records[cfg_name]).values():
                member = records.get(posixpath.join(directory, str(payload.get("path_name", ""))))
                if member is not None and payload.get("use_pickle"):
                    yield member, "pickle"


def check_export_archive(path: Path | str, trust_pickle: bool, canonical: Canonical | None = None) -> None:
    """Refuse a .pt2 that would make torch.export.load run anything beyond weights-only unpickling: its
    re-packed copy (``canonical``, or one made here) is what is checked. With ``trust_pickle`` only the
    archive's directory is bounds-checked (archives.open_checked) and its program's names checked."""
    path = Path(path)
    if trust_pickle:
        with open_checked(path) as archive:
            check_program_names(archive, path)
        return
    if canonical is None:
        with canonical_copy(path, PT2) as canon:
            check_export_archive(path, trust_pickle, canon)
        return
    with canonical.checked() as archive, quiet_torch():
        seen: set[str] = set()
        for member, use in risky_members(archive):
            if member in seen:
                continue
            seen.add(member)
            data = archive.read(member)
            if use == "graph":
                _refuse_names(data, member, path)
                why = graph_problem(data)
            else:
                why = _nested_zip_problem(data, member) or (_why_pickle_refused(data) if data else None)
            if why:
                raise LoadError(
                    f"refused to load: torch.export archive member {member!r} would be unpickled or evaluated "
                    f"by torch.export.load and weights-only loading cannot vouch for it: {why}. Unpickling can run "
                    "arbitrary code; pass --trust-pickle (trust_pickle=True) only for archives you trust", path=path)


def check_program_names(archive: CheckedZip, path: Path) -> None:
    """Refuse an archive whose program names hold anything torch would write into source as code (the
    check runs even for a trusted file: torch.export.save never writes such a name)."""
    c = PT2_LAYOUT

    prefix, suffix = c.MODELS_FILENAME_FORMAT.split("{}")
    for record, member in _records(archive).items():
        if record.startswith(prefix) and record.endswith(suffix):
            _refuse_names(read_member(archive, member, cap=max_inspected_bytes()), member, path)


def _refuse_names(data: bytes, member: str, path: Path) -> None:
    try:
        root = json.loads(data)
    except (ValueError, RecursionError):
        return  # torch.export.load fails on it before building anything
    if why := names_problem(root):
        raise LoadError(
            f"refused to load: in torch.export archive member {member!r}, {why}. torch writes this name into the "
            "Python source of the module it builds (torch.export.load, ExportedProgram.module()) and runs that "
            "source, so such a name can run code; torch.export.save never writes one. Re-export the model with "
            "torch.export and plain identifiers as input names", path=path)


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
    """torch.export.load of the checked, re-packed copy with weights-only forced and torch quiet (trusted:
    of the file itself, its layout bounds-checked and its names checked); any failure is a LoadError naming
    the file."""
    path = Path(path)
    if trust_pickle:
        check_export_archive(path, trust_pickle)  # the bounds of its layout, and the names torch writes as code
        return _torch_load(path, lambda: str(path), trust_pickle)
    with canonical_copy(path, PT2) as canon:
        check_export_archive(path, trust_pickle, canon)
        return _torch_load(path, canon.view, trust_pickle)


def _torch_load(path: Path, source: Callable[[], Any], trust_pickle: bool) -> Any:
    import torch

    failure: Exception
    for _ in range(_MAX_OUTPUT_MODULES + 1):
        try:
            with quiet_torch():
                if trust_pickle:
                    return torch.export.load(source())
                with weights_only_unpickling():
                    return torch.export.load(source())
        except Exception as e:
            failure = e
        # outside the except block, so the real cause is not chained to torch's generic error
        cause = _logged_cause(source, trust_pickle) if "warnings above" in str(failure) else failure
        if not import_output_module(cause):
            break
    raise LoadError("torch.export.load failed: the archive may be truncated, crafted, or written by an "
                    "incompatible torch version", path=path) from cause  # the CLI shows the cause


def _logged_cause(source: Callable[[], Any], trust_pickle: bool) -> BaseException:
    """torch.export.load logs the real error and raises a generic one ("check the warnings above"); the
    warnings are silenced, so the current-layout loader is run again to get the real error."""
    from torch.export.pt2_archive._package import load_pt2

    try:
        with quiet_torch():
            if trust_pickle:
                load_pt2(source())
            else:
                with weights_only_unpickling():
                    load_pt2(source())
    except Exception as inner:  # noqa: BLE001 - whatever torch raised is the answer
        return inner
    return RuntimeError("torch.export.load could not deserialize the archive")
