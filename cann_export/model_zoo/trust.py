"""The client's trusted alias state (TUF's trusted metadata): for each zoo, model and alias, the highest
alias-record sequence this client has accepted, so a store rolled back to an older signed record is
refused even when the store's own log was rewritten too.

Where: ``trust_state=PATH`` (API), else ``$CANN_MODEL_ZOO_TRUST``, else
``$XDG_CACHE_HOME/cann-export/zoo-trust.json`` (``~/.cache/cann-export/zoo-trust.json``). Read and updated
under a lock beside the file, written atomically (temp name, fsync, rename)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .zoo_errors import ZooError, ZooIntegrityError

ENV_TRUST = "CANN_MODEL_ZOO_TRUST"
SCHEMA = "cann-export/zoo-trust/1"
MAX_BYTES = 16 << 20


def trust_path(explicit: str | os.PathLike | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    if os.environ.get(ENV_TRUST):
        return Path(os.environ[ENV_TRUST])
    from .location import user_cache_dir

    return user_cache_dir() / "zoo-trust.json"


def _read(path: Path) -> dict[str, Any]:
    """The state; a damaged file is an error, never silently reset (that would forget every sequence)."""
    hint = (f"fix or remove {path} (removing it forgets the alias sequences this client has seen, so a "
            "rollback is then caught only by the store's own log)")
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ZooError(f"the zoo's trusted alias state is over {MAX_BYTES} bytes; {hint}", path=path)
        state = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {"schema": SCHEMA, "zoos": {}}
    except (OSError, ValueError) as e:
        raise ZooError(f"the zoo's trusted alias state is unreadable ({type(e).__name__}); {hint}", path=path) from e
    if not isinstance(state, dict) or state.get("schema") != SCHEMA or not isinstance(state.get("zoos"), dict):
        raise ZooError(f"the zoo's trusted alias state is not a {SCHEMA} file; {hint}", path=path)
    return state


def _compare(seen: dict[str, Any], record: dict[str, Any], where: str, url: str, path: Path) -> None:
    seq, seen_seq = record["sequence"], seen.get("sequence")
    if not isinstance(seen_seq, int):
        return
    fix = (f"Move the alias forward with `cann-export zoo alias NAME ALIAS VERSION --sign KEY`; if the reset was "
           f"intended, delete the entry {where!r} under {url!r} from {path}")
    if seq < seen_seq:
        raise ZooIntegrityError(
            f"{where}: the store's alias record has sequence {seq} (-> version {record['version']}) but this client "
            f"already accepted sequence {seen_seq} (-> version {seen.get('version')}); refusing a rollback (someone "
            f"who can write to {url} pointed the alias back at an older signed record); nothing was loaded. {fix}")
    if seq == seen_seq and (seen.get("version"), seen.get("manifest_sha256")) != (record["version"],
                                                                                  record["manifest_sha256"]):
        raise ZooIntegrityError(
            f"{where}: the store's alias record has sequence {seq} -> version {record['version']}, but this client "
            f"accepted sequence {seen_seq} -> version {seen.get('version')} (two different records with one "
            f"sequence: the signing key signed both, or the state was edited); nothing was loaded. {fix}")


def accept(path: Path, url: str, record: dict[str, Any], key_id: str) -> dict[str, Any]:
    """Refuse ``record`` (already signature-checked) if its sequence is lower than the one this client accepted
    for the same zoo/name/alias (or equal with another target); otherwise remember it. Returns what was seen."""
    from ..fs import atomic

    where = f"{record['name']}@{record['alias']}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.target_lock(path):
        state = _read(path)
        entries = state["zoos"].setdefault(url, {})
        seen = entries.get(where) if isinstance(entries.get(where), dict) else {}
        _compare(seen, record, where, url, path)
        if seen.get("sequence") != record["sequence"]:
            entries[where] = {"sequence": record["sequence"], "version": record["version"],
                              "manifest_sha256": record["manifest_sha256"], "key_id": key_id,
                              "time_utc": record.get("time_utc")}
            atomic.write_text(path, json.dumps(state, indent=2, sort_keys=True) + "\n")
    return {"trust_state": str(path), "previously_seen": seen.get("sequence")}


def seen_sequence(path: Path, url: str, where: str) -> int:
    """The highest sequence accepted for ``where`` (NAME@ALIAS) in zoo ``url``; 0 when none."""
    entry = _read(path)["zoos"].get(url, {}).get(where)
    seq = entry.get("sequence") if isinstance(entry, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
