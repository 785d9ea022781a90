"""The embedded store: a directory of immutable version directories plus a SQLite index.

    ROOT/index.sqlite                 versions, aliases, alias_log (WAL, busy timeout, UNIQUE constraints)
    ROOT/models/NAME/VERSION/         manifest.json, README.md, weights/, architecture/, artifacts/TARGET/
    ROOT/.tmp/HOST-PID-TIME-RAND/     staging; removed by the next publish once its process is gone

Commit: blobs are staged and fsynced; then, inside one ``BEGIN IMMEDIATE`` transaction, the version is
chosen, manifest.json is written last (fsync + os.replace), the staging directory is renamed into place
and the index row inserted; COMMIT makes it visible. A directory under models/ without an index row is
the remains of a killed commit: invisible to readers and removed by the next publish of that name."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .clock import utc_now
from .zoo_errors import ZooConflictError, ZooError
from .file_copies import clean_stale, fsync_dir, new_staging, write_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL, version TEXT NOT NULL, seq INTEGER NOT NULL, digest TEXT NOT NULL,
    path TEXT NOT NULL, created_utc TEXT NOT NULL, created_by TEXT, size INTEGER NOT NULL,
    files INTEGER NOT NULL, kinds TEXT NOT NULL, targets TEXT NOT NULL, metadata TEXT NOT NULL,
    manifest_sha256 TEXT, UNIQUE (name, version), UNIQUE (name, seq));
CREATE TABLE IF NOT EXISTS aliases (
    name TEXT NOT NULL, alias TEXT NOT NULL, version TEXT NOT NULL, updated_utc TEXT NOT NULL, record TEXT,
    PRIMARY KEY (name, alias), FOREIGN KEY (name, version) REFERENCES versions (name, version));
CREATE TABLE IF NOT EXISTS alias_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, alias TEXT NOT NULL, version TEXT NOT NULL,
    previous TEXT, time_utc TEXT NOT NULL, who TEXT, sequence INTEGER, record TEXT);
"""
ADDED_COLUMNS = {"versions": ("manifest_sha256 TEXT",), "aliases": ("record TEXT",),  # indexes written before
                 "alias_log": ("sequence INTEGER", "record TEXT")}                 # these columns existed"""
BUSY_MS = 60_000
RETRIES = 20


def _is_busy(e: sqlite3.OperationalError) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


def _retrying(step: Callable[[], Any], failure: str, path: Path) -> Any:
    """The one retry policy on top of sqlite's busy_timeout: the few statements sqlite answers with BUSY
    without waiting (journal-mode switch, schema, BEGIN IMMEDIATE during WAL recovery) are retried with a
    linear back-off; any other error, or BUSY past RETRIES attempts, is a ZooError."""
    for attempt in range(RETRIES):
        try:
            return step()
        except sqlite3.OperationalError as e:
            if not _is_busy(e) or attempt == RETRIES - 1:
                raise ZooError(f"{failure} ({e}); retry later", path=path) from e
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


class LocalStore:
    remote = False

    def __init__(self, root: str):
        self.root = Path(root)
        self.url = str(self.root)
        self.models = self.root / "models"
        self.tmp = self.root / ".tmp"
        self._db: sqlite3.Connection | None = None
        self._raw: dict[tuple[str, str], bytes] = {}  # manifest bytes as read (pull writes exactly these)

    # ----------------------------------------------------------------------------------- index
    def _connect(self, create: bool) -> sqlite3.Connection | None:
        if self._db is not None:
            return self._db
        index = self.root / "index.sqlite"
        if not index.exists() and not create:
            return None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(index), timeout=BUSY_MS / 1000, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise ZooError(f"cannot open the model zoo index ({e}); check the directory is writable or pass "
                           "--zoo DIR", path=index) from e
        db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        db.row_factory = sqlite3.Row

        def prepare() -> None:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            for table, added in ADDED_COLUMNS.items():
                columns = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
                for column in added:
                    if column.split()[0] not in columns:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

        _retrying(prepare, "the model zoo index is unusable", index)
        self._db = db
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: the database write lock), retried while busy."""
        db = self._connect(create=True)
        _retrying(lambda: db.execute("BEGIN IMMEDIATE"), "the model zoo index stays locked", self.root)
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _rows(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        db = self._connect(create=False)
        return [] if db is None else db.execute(sql, args).fetchall()

    # ----------------------------------------------------------------------------------- publish
    def staging(self) -> Path:
        clean_stale(self.tmp)
        return new_staging(self.tmp)

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def commit(self, name: str, version: str | None, staging: Path, manifest: dict[str, Any],
               aliases: list[str], seal: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
               record: Callable[..., dict[str, Any]] | None = None) -> tuple[dict[str, Any], bool]:
        """Make the staged version visible; returns (row, existed). ``seal`` (signing) sees the final manifest
        (name and version chosen) just before it is written; ``record`` makes the aliases' records."""
        digest = manifest["digest"]
        with self._write() as db:
            rows = db.execute("SELECT * FROM versions WHERE name=? ORDER BY seq", (name,)).fetchall()
            same = [r for r in rows if r["digest"] == digest and (version is None or r["version"] == version)]
            if same:
                self.discard(staging)
                return _row(same[-1]), True
            taken = {r["version"] for r in rows}
            if version is not None and version in taken:
                raise ZooConflictError(f"{name} version {version} already exists with different contents; versions "
                                       "are immutable: publish under a new version (or omit --version)")
            if version is None:
                version = str(max([int(v) for v in taken if v.isdigit()] + [0]) + 1)
            seq = max([r["seq"] for r in rows] + [0]) + 1
            self._clean_orphans(name, taken)
            final = self.models / name / version
            manifest = {**manifest, "name": name, "version": version}
            if seal is not None:
                manifest = seal(manifest)
            manifest_sha = write_json(staging / "manifest.json", manifest)  # the manifest goes last
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, final)
            fsync_dir(final.parent)
            files = manifest["files"]
            db.execute("INSERT INTO versions (name, version, seq, digest, path, created_utc, created_by, size, files, "
                       "kinds, targets, metadata, manifest_sha256) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", (
                name, version, seq, digest, f"models/{name}/{version}", manifest["created_utc"],
                manifest.get("created_by"), sum(f["size"] for f in files.values()), len(files),
                json.dumps(manifest["kinds"]), json.dumps(sorted(manifest["artifacts"])),
                json.dumps(manifest["metadata"], default=str), manifest_sha))
            for alias in aliases:
                self._set_alias(db, name, alias, version, manifest.get("created_by"), record, manifest_sha)
        return self._get_row(name, version), False

    def _clean_orphans(self, name: str, taken: set[str]) -> list[str]:
        """Directories of killed commits (no index row); safe: we hold the write lock."""
        folder = self.models / name
        removed = []
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.name not in taken:
                    aside = self.tmp / f"orphan-{uuid.uuid4().hex[:8]}"
                    self.tmp.mkdir(parents=True, exist_ok=True)
                    os.rename(entry, aside)
                    shutil.rmtree(aside, ignore_errors=True)
                    removed.append(f"models/{name}/{entry.name}")
        return removed

    def gc(self) -> list[str]:
        """Sweep staging directories of dead publishers and the directories of killed commits."""
        removed = [f".tmp/{n}" for n in clean_stale(self.tmp)]
        if self._connect(create=False) is None or not self.models.is_dir():
            return removed
        with self._write() as db:
            for folder in sorted(p for p in self.models.iterdir() if p.is_dir()):
                taken = {r["version"] for r in db.execute("SELECT version FROM versions WHERE name=?", (folder.name,))}
                removed += self._clean_orphans(folder.name, taken)
        return removed

    # ------------------------------------------------------------------------------------ read
    def _get_row(self, name: str, version: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM versions WHERE name=? AND version=?", (name, version))
        return _row(rows[0]) if rows else None

    def names(self) -> list[str]:
        return [r["name"] for r in self._rows("SELECT DISTINCT name FROM versions ORDER BY name")]

    def versions(self, name: str) -> list[dict[str, Any]]:
        return [_row(r) for r in self._rows("SELECT * FROM versions WHERE name=? ORDER BY seq", (name,))]

    def aliases(self, name: str) -> dict[str, str]:
        return {r["alias"]: r["version"]
                for r in self._rows("SELECT * FROM aliases WHERE name=? ORDER BY alias", (name,))}

    def alias_history(self, name: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows("SELECT alias, version, previous, time_utc, who, sequence FROM alias_log "
                                            "WHERE name=? ORDER BY id", (name,))]

    def read_manifest(self, name: str, version: str) -> tuple[dict[str, Any], str]:
        """The checked manifest and the sha256 of its bytes (which must match the index's when recorded)."""
        from .zoo_errors import ZooIntegrityError
        from .names import check_name, check_version
        from .schema import check_manifest

        path = self.models / check_name(name) / check_version(version) / "manifest.json"  # index rows are data too
        try:
            raw = path.read_bytes()
            manifest = json.loads(raw)
        except (OSError, ValueError, RecursionError) as e:
            raise ZooError(f"{name} version {version}: manifest.json is unreadable ({type(e).__name__}); the store "
                           "is damaged, run `cann-export zoo verify`", path=path) from e
        rows = self._rows("SELECT digest, manifest_sha256 FROM versions WHERE name=? AND version=?", (name, version))
        where = f"{name} version {version}"
        sha = hashlib.sha256(raw).hexdigest()
        if rows and rows[0]["manifest_sha256"] and rows[0]["manifest_sha256"] != sha:
            raise ZooIntegrityError(f"{where}: manifest.json was changed after publish (not the file that was "
                                    "published: its sha256 differs from the index); nothing was loaded. Restore the "
                                    "version or publish it again",
                                    path=str(path))
        checked = check_manifest(manifest, where, rows[0]["digest"] if rows else None, name, version)
        self._raw[(name, version)] = raw
        return checked, sha

    def raw_manifest(self, name: str, version: str) -> bytes:
        """The bytes ``read_manifest`` checked for this version."""
        return self._raw[(name, version)]

    def manifest(self, name: str, version: str) -> dict[str, Any]:
        return self.read_manifest(name, version)[0]

    def version_dir(self, name: str, version: str, manifest: dict[str, Any], only: list[str] | None = None) -> Path:
        return self.models / name / version

    def read_problems(self, name: str, version: str, manifest: dict[str, Any], only: list[str] | None) -> list[str]:
        from .verify import check_dir

        return check_dir(self.models / name / version, manifest, only)

    # ----------------------------------------------------------------------------------- aliases
    def set_alias(self, name: str, alias: str, version: str, who: str | None,
                  record: Callable[..., dict[str, Any]] | None = None, manifest_sha: str | None = None
                  ) -> dict[str, Any]:
        with self._write() as db:
            if not db.execute("SELECT 1 FROM versions WHERE name=? AND version=?", (name, version)).fetchone():
                raise ZooError(f"{name} has no version {version}; `cann-export zoo show {name}` lists them")
            return self._set_alias(db, name, alias, version, who, record, manifest_sha)

    @staticmethod
    def _set_alias(db: sqlite3.Connection, name: str, alias: str, version: str, who: str | None,
                   record: Callable[..., dict[str, Any]] | None, manifest_sha: str | None) -> dict[str, Any]:
        """Move the alias and log the move; the record (signed or not) carries the next sequence number."""
        row = db.execute("SELECT version FROM aliases WHERE name=? AND alias=?", (name, alias)).fetchone()
        previous = row["version"] if row else None
        top = db.execute("SELECT MAX(COALESCE(sequence, 0)) FROM alias_log WHERE name=? AND alias=?",
                         (name, alias)).fetchone()[0]
        sequence = (top or 0) + 1
        if manifest_sha is None:
            manifest_sha = db.execute("SELECT manifest_sha256 FROM versions WHERE name=? AND version=?",
                                      (name, version)).fetchone()[0]
        made = record(alias, version, manifest_sha, sequence) if record is not None else None
        sequence = made["sequence"] if made is not None else sequence  # the signer may number it higher
        body = json.dumps(made) if made is not None else None
        now = utc_now()
        db.execute("INSERT INTO aliases (name, alias, version, updated_utc, record) VALUES (?,?,?,?,?) "
                   "ON CONFLICT (name, alias) DO UPDATE SET "
                   "version=excluded.version, updated_utc=excluded.updated_utc, record=excluded.record",
                   (name, alias, version, now, body))
        db.execute("INSERT INTO alias_log (name, alias, version, previous, time_utc, who, sequence, record) "
                   "VALUES (?,?,?,?,?,?,?,?)", (name, alias, version, previous, now, who, sequence, body))
        return {"name": name, "alias": alias, "version": version, "previous": previous, "time_utc": now,
                "sequence": sequence, "signed": body is not None and '"signature"' in body}

    def alias_record(self, name: str, alias: str) -> dict[str, Any] | None:
        """The current record of ``name@alias`` (None when unset or moved before records existed)."""
        rows = self._rows("SELECT record FROM aliases WHERE name=? AND alias=?", (name, alias))
        return _record(rows[0]["record"]) if rows else None

    def alias_records(self, name: str, alias: str) -> list[dict[str, Any]]:
        """Every record in the alias log of ``name@alias``, oldest first."""
        rows = self._rows("SELECT record FROM alias_log WHERE name=? AND alias=? ORDER BY id", (name, alias))
        return [r for r in (_record(row["record"]) for row in rows) if r is not None]


def _record(body: Any) -> dict[str, Any] | None:
    """A stored alias record (JSON text); None when absent, malformed records included (then refused)."""
    if not isinstance(body, str) or len(body) > 65536:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _row(r: sqlite3.Row) -> dict[str, Any]:
    d = dict(r)
    for key in ("kinds", "targets", "metadata"):
        d[key] = json.loads(d[key])
    d.pop("seq", None)
    return d
