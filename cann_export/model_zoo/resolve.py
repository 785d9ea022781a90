"""Finding a version: the store for a location, a reference (version, alias, latest) resolved, the target
artifact picked, and a version's files verified before anything reads them."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .zoo_errors import ZooError, ZooIntegrityError
from .names import LATEST, check_name, split_ref


def open_store(zoo: Any = None) -> Any:
    """The store for ``zoo`` (a directory, ``file://``, ``s3://bucket/prefix``; default CANN_MODEL_ZOO or the
    user cache). A store object is passed through."""
    if hasattr(zoo, "commit") and hasattr(zoo, "versions"):
        return zoo
    from .location import parse

    protocol, root, options = parse(zoo)
    if protocol == "file":
        from .local import LocalStore

        return LocalStore(root)
    from .remote import RemoteStore

    return RemoteStore(protocol, root, options, f"{protocol}://{root}")


def resolve(store: Any, name: str, ref: str | None) -> tuple[str, list[dict[str, Any]]]:
    chosen, rows, _ = resolve_ref(store, name, ref)
    return chosen, rows


def resolve_ref(store: Any, name: str, ref: str | None) -> tuple[str, list[dict[str, Any]], str | None]:
    """(version, the name's version rows, the alias ``ref`` named or None)."""
    rows = store.versions(check_name(name))
    if not rows:
        known = store.names()
        hint = f"; models here: {', '.join(known[:20])}" if known else "; the zoo is empty"
        raise ZooError(f"no model named {name!r} in the zoo at {store.url}{hint}")
    if ref is None or ref == LATEST:
        return rows[-1]["version"], rows, None
    ref = str(ref)
    if any(r["version"] == ref for r in rows):
        return ref, rows, None
    aliases = store.aliases(name)
    if ref in aliases:
        return aliases[ref], rows, ref
    raise ZooError(f"{name} has no version or alias {ref!r}; versions: {', '.join(r['version'] for r in rows)}"
                   + (f"; aliases: {', '.join(f'{a}->{v}' for a, v in aliases.items())}" if aliases else ""))


def parse_ref(name: str, version: Any) -> tuple[str, str | None]:
    if version is None and isinstance(name, str) and "@" in name:
        return split_ref(name)
    return check_name(name), (str(version) if version is not None else None)


def pick_target(name: str, version: str, manifest: dict[str, Any], target: str | None,
                 required: bool) -> str | None:
    arts = manifest.get("artifacts") or {}
    if target is None:
        if not required:
            return None
        if not arts:
            raise ZooError(f"{name} version {version} holds no exported artifact (only PyTorch weights); use "
                           "framework='pytorch', or publish an exported bundle")
        if len(arts) > 1:
            raise ZooError(f"{name} version {version} holds several targets ({', '.join(sorted(arts))}); pass "
                           "target= (--target) with one of them or its soc_version")
        return next(iter(arts))
    matches = [k for k, a in arts.items() if target in (k, a.get("soc_version"))]
    if not matches:
        built = ", ".join(f"{k} (soc_version {a.get('soc_version') or 'any'})" for k, a in sorted(arts.items()))
        raise ZooError(f"{name} version {version} has no artifact built for {target}; targets: "
                       f"{built or 'none (no exported artifact was published)'}. Export for {target} "
                       "(--soc-version) and publish it")
    if len(matches) > 1:
        raise ZooError(f"{name} version {version} has several artifacts for {target}: {', '.join(sorted(matches))}; "
                       "pass the full target key")
    return matches[0]


def verified_dir(store: Any, name: str, version: str, manifest: dict[str, Any], only: list[str] | None) -> Path:
    """The version's directory after the sha256 of every file needed was checked; raises naming the files."""
    from .verify import check_dir

    return _checked_once_more(store, name, version, manifest, only, lambda root: check_dir(root, manifest, only))


def _checked_once_more(store: Any, name: str, version: str, manifest: dict[str, Any], only: list[str] | None,
                       check: Any) -> Path:
    """The version's directory after ``check(root)`` found no problems; a remote store's damaged cache is
    fetched again once from the verified blobs. Raises naming the problems."""
    root = store.version_dir(name, version, manifest, only)
    problems = check(root)
    if problems and store.remote:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        store.forget_blobs(manifest, problems)
        root = store.version_dir(name, version, manifest, only)
        problems = check(root)
    if problems:
        raise _refused(name, version, problems, root)
    return root


def _refused(name: str, version: str, problems: list[str], where: Any) -> ZooIntegrityError:
    return ZooIntegrityError(f"{name} version {version} failed its integrity check, nothing was loaded: "
                             + "; ".join(problems) + ". Restore the file or publish the model again", path=str(where))


def copy_verified(store: Any, name: str, version: str, manifest: dict[str, Any], only: list[str] | None,
                  dest: Path) -> None:
    """Copy the version's files (those under ``only``) into ``dest``, each hashed while it streams (bounded by
    its recorded size) and renamed into place only when it matches the manifest; raises naming the files.
    A remote store's damaged cache is fetched again once from the blobs."""
    from .blobs import copy_tree_checked
    from .verify import selected

    files = selected(manifest, only)
    _checked_once_more(store, name, version, manifest, only, lambda root: copy_tree_checked(root, files, dest))


@contextmanager
def private_copy(store: Any, name: str, version: str, manifest: dict[str, Any],
                 only: list[str] | None) -> Iterator[Path]:
    """A private temporary directory (under $TMPDIR, mode 0700) holding verified copies of the files a load
    reads: whoever can write the store cannot change them between the check and the load."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cann-zoo-load-") as tmp:
        copy_verified(store, name, version, manifest, only, Path(tmp))
        yield Path(tmp)
