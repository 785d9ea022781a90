"""The same registry on an fsspec filesystem (S3 through s3fs; endpoint configurable).

    PREFIX/blobs/sha256/HEX                        every file, content-addressed (uploaded first)
    PREFIX/models/NAME/VERSION/manifest.json       the commit: created last, write-once (If-None-Match: *)
    PREFIX/models/NAME/aliases/ALIAS/SEQ.json      alias moves: a write-once log; the highest SEQ is current,
                                                   each entry carrying its (signed) alias record (aliases.py)

S3 has no rename, so blobs are content-addressed rather than staged under temp names: a killed publish
leaves at most complete blobs that no manifest names (reused by the next publish of the same bytes once
they hash right) and never a manifest. Fetched blobs are hashed while they stream and cached locally."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .clock import utc_now
from .zoo_errors import ZooConflictError, ZooError, ZooIntegrityError
from .file_copies import clean_stale, manifest_bytes, new_staging
from .location import remote_cache_dir
from .names import check_name, check_version, is_sha256

RETRIES = 50


class RemoteStore:
    remote = True

    def __init__(self, protocol: str, root: str, options: dict[str, Any], url: str):
        import fsspec

        options = dict(options)
        if protocol == "s3":
            options.setdefault("use_listings_cache", False)
            options.setdefault("skip_instance_cache", True)
        try:
            self.fs = fsspec.filesystem(protocol, **options)
        except (ImportError, ValueError) as e:
            hint = " (pip install 'cann-export[s3]')" if protocol == "s3" else ""
            raise ZooError(f"cannot open the model zoo at {url}: {e}{hint}") from e
        self.protocol, self.root, self.url = protocol, root.rstrip("/"), url
        self.cache = remote_cache_dir(url)
        self._raw: dict[tuple[str, str], bytes] = {}  # manifest bytes as read, for pull and manifest_sha256

    def _p(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, FileExistsError):
            raise
        except PermissionError as e:
            raise ZooError(f"access to the model zoo at {self.url} was denied ({e}); check the credentials") from e
        except OSError as e:
            raise ZooError(f"the model zoo at {self.url} is unreachable ({type(e).__name__}: {e}); check the URL "
                           "and the endpoint (CANN_MODEL_ZOO_ENDPOINT)") from e

    def _read_json(self, path: str) -> Any:
        return json.loads(self._call(self.fs.cat_file, path))

    def _create(self, path: str, data: dict[str, Any]) -> bool:
        """Create ``path`` only if absent; False if it already exists."""
        body = manifest_bytes(data)
        try:
            if self.protocol == "s3":
                self._call(self.fs.pipe_file, path, body, mode="create")
            else:  # no conditional write: best effort
                if self._call(self.fs.exists, path):
                    return False
                self._call(self.fs.pipe_file, path, body)
            return True
        except FileExistsError:
            return False
        except ZooError as e:
            if "PreconditionFailed" in e.message or "412" in e.message or "precondition" in e.message.lower():
                return False
            raise

    # ----------------------------------------------------------------------------------- publish
    def staging(self) -> Path:
        clean_stale(self.cache / ".tmp")
        return new_staging(self.cache / ".tmp")

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def commit(self, name: str, version: str | None, staging: Path, manifest: dict[str, Any],
               aliases: list[str], seal: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
               record: Callable[..., dict[str, Any]] | None = None) -> tuple[dict[str, Any], bool]:
        try:
            if version is not None:  # refuse a taken version before uploading anything
                try:
                    existing = self._read_json(self._p("models", name, version, "manifest.json"))
                except FileNotFoundError:
                    existing = None
                if existing is not None and (not isinstance(existing, dict)
                                             or existing.get("digest") != manifest["digest"]):
                    raise ZooConflictError(f"{name} version {version} already exists with different contents; "
                                           "versions are immutable: publish under a new version (or omit --version)")
            for rel, entry in sorted(manifest["files"].items()):
                self._upload_blob(staging / rel, rel, entry)
            for _ in range(RETRIES):
                rows = self.versions(name)
                same = [r for r in rows if r["digest"] == manifest["digest"] and version in (None, r["version"])]
                if same:
                    return same[-1], True
                taken = {r["version"] for r in rows}
                if version is not None and version in taken:
                    raise ZooConflictError(f"{name} version {version} already exists with different contents; "
                                           "versions are immutable: publish under a new version (or omit --version)")
                chosen = version or str(max([int(v) for v in taken if v.isdigit()] + [0]) + 1)
                full = {**manifest, "name": name, "version": chosen}
                if seal is not None:
                    full = seal(full)
                if self._create(self._p("models", name, chosen, "manifest.json"), full):
                    sha = hashlib.sha256(manifest_bytes(full)).hexdigest()
                    for alias in aliases:
                        self.set_alias(name, alias, chosen, manifest.get("created_by"), record, sha)
                    return _summary(full, self._p("models", name, chosen), manifest_bytes(full)), False
            raise ZooError(f"could not allocate a version of {name} after {RETRIES} attempts (heavy concurrent "
                           "publishing); retry")
        finally:
            self.discard(staging)

    def _upload_blob(self, local: Path, rel: str, entry: dict[str, Any]) -> None:
        """Upload a content-addressed blob, or reuse the one stored under its digest only after streaming it
        through sha256 (bounded by the size): a planted blob with the right name and other bytes is replaced."""
        from .blobs import stream_problem

        blob = self._p("blobs", "sha256", entry["sha256"])
        if self._call(self.fs.exists, blob):
            try:
                with self._call(self.fs.open, blob, "rb", block_size=8 << 20) as src:
                    if stream_problem(src, rel, entry) is None:
                        return
            except FileNotFoundError:
                pass
        self._call(self.fs.put_file, str(local), blob)

    # ------------------------------------------------------------------------------------ read
    def names(self) -> list[str]:
        try:
            entries = self._call(self.fs.ls, self._p("models"), detail=False)
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def versions(self, name: str) -> list[dict[str, Any]]:
        paths = self._call(self.fs.glob, self._p("models", name, "*", "manifest.json"))
        rows = []
        for path in paths:
            try:
                raw = self._call(self.fs.cat_file, path)
                m = json.loads(raw)
            except FileNotFoundError:
                continue
            except ValueError as e:
                raise ZooIntegrityError(f"{path}: manifest.json is not JSON; the store is damaged or forged") from e
            stored_as = path.rsplit("/", 2)[-2]
            if not isinstance(m, dict) or m.get("name") != name or m.get("version") != stored_as:
                raise ZooIntegrityError(f"{path}: the manifest stored there names another model or version "
                                        f"({str(m.get('name') if isinstance(m, dict) else m)[:80]} version "
                                        f"{str(m.get('version') if isinstance(m, dict) else '?')[:80]}); refused. "
                                        "The store was edited: restore the version or publish it again")
            check_version(stored_as)
            rows.append(_summary(m, path.rsplit("/", 1)[0], raw))
        # auto-numbered versions sort by number (start times of concurrent publishes interleave)
        return sorted(rows, key=lambda r: (0, int(r["version"]), "") if r["version"].isdigit()
                      else (1, 0, r["created_utc"]))

    def read_manifest(self, name: str, version: str) -> tuple[dict[str, Any], str]:
        """The checked manifest and the sha256 of its stored bytes."""
        from .schema import check_manifest

        check_name(name)
        check_version(version)
        try:
            raw = self._call(self.fs.cat_file, self._p("models", name, version, "manifest.json"))
        except FileNotFoundError as e:
            raise ZooError(f"{name} has no version {version}") from e
        try:
            manifest = json.loads(raw)
        except ValueError as e:
            raise ZooIntegrityError(f"{name} version {version}: manifest.json is not JSON; the store is damaged "
                                    "or forged") from e
        checked = check_manifest(manifest, f"{name} version {version}", None, name, version)
        self._raw[(name, version)] = raw
        return checked, hashlib.sha256(raw).hexdigest()

    def manifest(self, name: str, version: str) -> dict[str, Any]:
        return self.read_manifest(name, version)[0]

    def _history(self, name: str, alias: str) -> list[tuple[int, str]]:
        paths = self._call(self.fs.glob, self._p("models", name, "aliases", alias, "*.json"))
        return sorted((int(p.rsplit("/", 1)[-1][:-5]), p) for p in paths if p.rsplit("/", 1)[-1][:-5].isdigit())

    def aliases(self, name: str) -> dict[str, str]:
        out = {}
        for path in self._call(self.fs.glob, self._p("models", name, "aliases", "*")):
            alias = path.rstrip("/").rsplit("/", 1)[-1]
            hist = self._history(name, alias)
            if hist:
                out[alias] = self._read_json(hist[-1][1])["version"]
        return dict(sorted(out.items()))

    def alias_history(self, name: str) -> list[dict[str, Any]]:
        entries = []
        for path in self._call(self.fs.glob, self._p("models", name, "aliases", "*", "*.json")):
            entries.append(self._read_json(path))
        return sorted(entries, key=lambda e: (e["time_utc"], e["alias"]))

    def set_alias(self, name: str, alias: str, version: str, who: str | None,
                  record: Callable[..., dict[str, Any]] | None = None, manifest_sha: str | None = None
                  ) -> dict[str, Any]:
        path = self._p("models", name, version, "manifest.json")
        try:
            raw = self._call(self.fs.cat_file, path)
        except FileNotFoundError as e:
            raise ZooError(f"{name} has no version {version}; `cann-export zoo show {name}` lists them") from e
        manifest_sha = manifest_sha or hashlib.sha256(raw).hexdigest()
        for _ in range(RETRIES):
            hist = self._history(name, alias)
            last = self._read_json(hist[-1][1]) if hist else {}
            seq = (hist[-1][0] + 1) if hist else 1
            last_seq = (last.get("record") or {}).get("sequence") if isinstance(last, dict) else None
            record_seq = max(seq, last_seq + 1) if isinstance(last_seq, int) else seq  # past the last record too
            made = record(alias, version, manifest_sha, record_seq) if record is not None else None
            entry = {"alias": alias, "version": version, "previous": last.get("version") if hist else None,
                     "time_utc": utc_now(), "who": who, "record": made}
            if self._create(self._p("models", name, "aliases", alias, f"{seq:08d}.json"), entry):
                return {"name": name, **{k: entry[k] for k in ("alias", "version", "previous", "time_utc")},
                        "sequence": made["sequence"] if made else seq, "signed": bool(made and "signature" in made)}
        raise ZooError(f"could not move alias {alias} of {name} (concurrent moves); retry")

    def alias_record(self, name: str, alias: str) -> dict[str, Any] | None:
        """The record in the highest-numbered entry of the alias log (the current one)."""
        hist = self._history(name, alias)
        entry = self._read_json(hist[-1][1]) if hist else None
        return entry.get("record") if isinstance(entry, dict) and isinstance(entry.get("record"), dict) else None

    def alias_records(self, name: str, alias: str) -> list[dict[str, Any]]:
        """Every record in the alias log, oldest first (fetched concurrently)."""
        paths = [p for _, p in self._history(name, alias)]
        bodies = self._call(self.fs.cat, paths) if paths else {}
        out = []
        for path in paths:
            try:
                entry = json.loads(bodies[path]) if path in bodies else None
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("record"), dict):
                out.append(entry["record"])
        return out

    def raw_manifest(self, name: str, version: str) -> bytes:
        """The bytes ``read_manifest`` checked for this version."""
        return self._raw[(name, version)]

    # ------------------------------------------------------------------------------- fetch/verify
    def _blob(self, entry: dict[str, Any]) -> Path:
        """A verified local copy of a blob (downloaded to a temp name, checked, renamed into the cache)."""
        digest = entry["sha256"]
        if not is_sha256(digest):  # schema.check_manifest refused it already; never a path from a forged name
            raise ZooIntegrityError(f"refused a blob name that is not a sha256 ({str(digest)[:80]!r})")
        cached = self.cache / "blobs" / digest
        if cached.is_file():
            return cached
        cached.parent.mkdir(parents=True, exist_ok=True)
        from .blobs import copy_checked

        try:  # hashed while it streams, bounded by the recorded size; renamed into the cache only when it matched
            with self._call(self.fs.open, self._p("blobs", "sha256", digest), "rb", block_size=8 << 20) as src:
                copy_checked(src, cached, f"blob {digest[:12]}", entry)
        except FileNotFoundError as e:
            raise ZooIntegrityError(f"blob {digest} is missing from {self.url}") from e
        except ZooIntegrityError as e:
            raise ZooIntegrityError(f"{e.message} (downloaded from {self.url})") from e
        return cached

    def version_dir(self, name: str, version: str, manifest: dict[str, Any], only: list[str] | None = None) -> Path:
        """Materialise the version (or the ``only`` subtrees) in the local cache from verified blobs."""
        from .names import is_relpath
        from .verify import selected

        check_name(name)
        check_version(version)
        root = self.cache / "versions" / name / version
        for rel, entry in selected(manifest, only).items():
            if not is_relpath(rel):  # schema.check_manifest refused it already
                raise ZooIntegrityError(f"{name} version {version}: refused the file path {rel[:120]!r}")
            target = root / rel
            if target.is_file() and target.stat().st_size == entry["size"]:
                continue
            blob = self._blob(entry)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
            try:
                os.link(blob, tmp)
            except OSError:
                shutil.copyfile(blob, tmp)
            os.replace(tmp, target)
        (root / "manifest.json").write_bytes(self._raw.get((name, version)) or manifest_bytes(manifest))
        return root

    def forget_blobs(self, manifest: dict[str, Any], problems: list[str]) -> None:
        """Drop the cached blobs of the files named in ``problems`` (only names that are sha256 digests)."""
        for rel, entry in (manifest.get("files") or {}).items():
            digest = entry.get("sha256") if isinstance(entry, dict) else None
            if is_sha256(digest) and any(p.startswith(rel + ":") for p in problems):
                (self.cache / "blobs" / digest).unlink(missing_ok=True)

    def gc(self) -> list[str]:
        """Sweep the local cache: staging directories and partial downloads of dead processes."""
        removed = [f".tmp/{n}" for n in clean_stale(self.cache / ".tmp")]
        blobs = self.cache / "blobs"
        if blobs.is_dir():
            from .file_copies import pid_alive

            for part in blobs.glob(".*.part"):
                fields = part.name.split(".")
                if len(fields) >= 4 and fields[2].isdigit() and not pid_alive(int(fields[2])):
                    part.unlink(missing_ok=True)
                    removed.append(f"blobs/{part.name}")
        return removed

    def read_problems(self, name: str, version: str, manifest: dict[str, Any], only: list[str] | None) -> list[str]:
        """Check the stored blobs themselves: each exists remotely and hashes to its name."""
        from .verify import selected

        from .blobs import stream_problem

        problems = []
        for rel, entry in sorted(selected(manifest, only).items()):
            blob = self._p("blobs", "sha256", entry["sha256"])
            try:
                with self._call(self.fs.open, blob, "rb", block_size=8 << 20) as src:
                    problem = stream_problem(src, rel, entry)
            except FileNotFoundError:
                problem = f"{rel}: missing (blob {entry['sha256'][:12]})"
            if problem:
                problems.append(problem.replace("(file changed)", f"(blob {entry['sha256'][:12]} changed)"))
        return problems


def _summary(m: dict[str, Any], path: str, raw: bytes) -> dict[str, Any]:
    files = m.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(f, dict) and isinstance(f.get("size"), int)
                                              for f in files.values()):
        raise ZooIntegrityError(f"{path}: manifest.json has a malformed file table; the store is damaged or forged")
    return {"name": m["name"], "version": m["version"], "digest": m.get("digest"), "path": path,
            "manifest_sha256": hashlib.sha256(raw).hexdigest(),
            "created_utc": m["created_utc"], "created_by": m.get("created_by"),
            "size": sum(f["size"] for f in files.values()), "files": len(files), "kinds": m.get("kinds", []),
            "targets": sorted(m.get("artifacts") or {}), "metadata": m.get("metadata") or {}}
