"""Signed aliases, TUF's rule for targets/snapshots: every alias move writes a record {name, alias, version,
manifest_sha256, sequence, time_utc}, signed with the zoo's key when the version is signed; the sequence
grows by one per name+alias with every move. A consumer that requires a signature (``verify_signature=``,
``--key``) refuses ``name@alias`` when the record is unsigned or badly signed, does not match the version
and manifest it loads, is not newer than every other record in the store's own alias log, or is older
than the newest record this client has accepted (trust.py)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .clock import utc_now
from .zoo_errors import ZooError, ZooIntegrityError

SCHEMA = "cann-export/zoo-alias/1"
Recorder = Callable[[str, str, str, int], dict[str, Any]]


def recorder(name: str, signer: Any = None, store_url: str | None = None) -> Recorder:
    """The function a store calls, inside its alias move, with (alias, version, manifest_sha256, the store's
    next sequence). A signed record's sequence also passes the newest this machine's trusted state accepted
    for the alias (``store_url``), so a store whose log was cut back never makes the signer reuse a number."""

    from .trust import seen_sequence, trust_path

    state = trust_path() if signer is not None and store_url is not None else None
    if state is not None:
        seen_sequence(state, store_url, "")  # a damaged state file is reported now, not inside a store's commit

    def make(alias: str, version: str, manifest_sha: str, sequence: int) -> dict[str, Any]:
        if state is not None:
            sequence = max(sequence, seen_sequence(state, store_url, f"{name}@{alias}") + 1)
        record = {"schema": SCHEMA, "name": name, "alias": alias, "version": version,
                  "manifest_sha256": manifest_sha, "sequence": sequence, "time_utc": utc_now()}
        return signer.sign_record(record) if signer is not None else record

    return make


def check_signer(manifest: dict[str, Any], signer: Any, alias: str) -> None:
    """Moving an alias onto a signed version needs a key, and the key signs only a version it signed itself
    (so a forged manifest planted in the store never gets a signed alias)."""
    sig = manifest.get("signature")
    where = f"{manifest['name']} version {manifest['version']}"
    if isinstance(sig, dict) and signer is None:
        raise ZooError(f"{where} is signed (key {str(sig.get('key_id'))[:32]}), so moving alias {alias} onto it "
                       "writes a signed alias record: pass --sign KEY (sign=) with that key; nothing was changed")
    if isinstance(sig, dict):
        from .signing import check

        check(manifest, signer.public, where)


def _refuse(where: str, what: str, todo: str) -> ZooIntegrityError:
    return ZooIntegrityError(f"{where}: {what}; nothing was loaded. {todo}")


def verify_alias(store: Any, name: str, alias: str, version: str, manifest_sha: str, public: Any,
                 trust_state: Any = None) -> dict[str, Any]:
    """Check the alias record of ``name@alias`` (pointing at ``version`` whose manifest bytes hash to
    ``manifest_sha``) against ``public`` and the sequence rule; records it in the client's trusted state."""
    from .signing import check_record
    from .trust import accept, trust_path

    where = f"{name}@{alias}"
    move = f"Move it again with the key: `cann-export zoo alias {name} {alias} VERSION --sign KEY`"
    record = store.alias_record(name, alias)
    if not isinstance(record, dict):
        raise _refuse(f"{where} -> version {version}", "there is no alias record (the alias was moved before "
                      "aliases were signed, or the record was removed)", move)
    kid = check_record(record, public, f"{where} (alias record)")
    if record.get("schema") != SCHEMA or (record.get("name"), record.get("alias")) != (name, alias):
        raise _refuse(where, f"the signed alias record is for {str(record.get('name'))[:80]}@"
                             f"{str(record.get('alias'))[:80]}, not this alias", move)
    if record.get("version") != version or record.get("manifest_sha256") != manifest_sha:
        raise _refuse(where, f"the store points the alias at version {version} (manifest sha256 {manifest_sha[:16]}) "
                             f"but its signed record says version {str(record.get('version'))[:80]} (manifest sha256 "
                             f"{str(record.get('manifest_sha256'))[:16]}): the pointer was edited", move)
    seq = record.get("sequence")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise _refuse(where, f"the alias record's sequence {str(seq)[:40]!r} is not a positive integer", move)
    others = [r for r in store.alias_records(name, alias) if isinstance(r, dict) and r != record]
    newer = [r for r in others if isinstance(r.get("sequence"), int) and r["sequence"] >= seq]
    if newer:
        top = max(newer, key=lambda r: r["sequence"])
        raise _refuse(where, f"the current alias record has sequence {seq} (-> version {version}) but the store's "
                             f"alias log already holds sequence {top['sequence']} (-> version "
                             f"{str(top.get('version'))[:80]}): a rollback to an older record", move.replace(
                                 "Move it again", "Move it forward"))
    seen = accept(trust_path(trust_state), store.url, record, kid)
    return {"alias": alias, "version": version, "sequence": seq, "signed_by": kid, **seen}


def describe(store: Any, name: str) -> dict[str, dict[str, Any]]:
    """Per alias: its version, its record's sequence and whether the record is signed (and by which key)."""
    out = {}
    for alias, version in store.aliases(name).items():
        record = store.alias_record(name, alias)
        record = record if isinstance(record, dict) else {}
        sig = record.get("signature")
        out[alias] = {"version": version, "sequence": record.get("sequence"), "signed": isinstance(sig, dict),
                      "key_id": sig.get("key_id") if isinstance(sig, dict) else None,
                      "time_utc": record.get("time_utc")}
    return out


def resolve_checked(store: Any, name: str, ref: str | None, key: Any = None,
                    trust_state: Any = None) -> tuple[str, dict[str, Any], str, dict[str, Any] | None]:
    """(version, its digest-checked manifest, the manifest's sha256, the alias check) for ``name@ref``; with
    ``key`` the version must be signed by it and an alias must pass ``verify_alias``."""
    from .resolve import resolve_ref

    chosen, _, alias = resolve_ref(store, name, ref)
    manifest, manifest_sha = store.read_manifest(name, chosen)
    checked = None
    if key is not None:
        from .signing import check

        check(manifest, key, f"{name} version {chosen}")
        if alias is not None:
            checked = verify_alias(store, name, alias, chosen, manifest_sha, key, trust_state)
    return chosen, manifest, manifest_sha, checked
