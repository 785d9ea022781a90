"""The model zoo's Python API: publish, load_model, pull, list_models, show, set_alias, verify."""
from __future__ import annotations

import datetime as _dt
import getpass
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from . import content
from .errors import ZooError, ZooIntegrityError
from .names import LATEST, check_alias, check_name, check_version, split_ref

MANIFEST_SCHEMA = "cann-export/zoo-version/1"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def who() -> str:
    user = os.environ.get("CANN_MODEL_ZOO_USER")
    if user:
        return user
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


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


# ------------------------------------------------------------------------------------------- publish


def publish(model: Any = None, name: str | None = None, version: str | int | None = None,
            metadata: dict[str, Any] | None = None, card: Any = None, *, zoo: Any = None,
            alias: str | list[str] | None = None, model_class: str | None = None,
            model_kwargs: dict[str, Any] | None = None, example_inputs: Any = None, trust_pickle: bool = False,
            artifacts: list[Any] | None = None) -> dict[str, Any]:
    """Publish ``model`` (an nn.Module, a weights/checkpoint file, or an exported atc_ready/om/onnx artifact)
    as ``name`` (default: the file's stem). ``version`` None numbers it; an explicit taken version is refused
    unless the contents are identical (then it is a no-op returning the existing version).

    Returns ``{"name", "version", "digest", "existed", "zoo", "path", ...}``."""
    name = check_name(name if name is not None else _default_name(model))
    version = check_version(version) if version is not None else None
    aliases = [check_alias(a) for a in ([alias] if isinstance(alias, str) else list(alias or []))]
    metadata = {str(k): v for k, v in (metadata or {}).items()}
    store = open_store(zoo)
    staging = store.staging()
    try:
        staged = content.Staged(staging)
        content.stage(staged, model, model_class=model_class, model_kwargs=model_kwargs,
                      example_inputs=example_inputs, trust_pickle=trust_pickle, artifacts=list(artifacts or []))
        fields = content.write_card(staged, name, metadata, card)
        from . import faults
        from .files import file_table, manifest_digest

        files = file_table(staging, staged.known)
        faults.point("staged")
        kinds = (["pytorch"] if staged.weights else []) + sorted({a["format"] for a in staged.artifacts.values()})
        manifest: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA, "name": name, "version": version,
            "kinds": kinds, "weights": staged.weights, "architecture": staged.architecture,
            "artifacts": staged.artifacts, "card": fields, "metadata": metadata, "lineage": staged.lineage,
            "files": files,
        }
        manifest["digest"] = manifest_digest(manifest)
        manifest.update({"created_utc": utc_now(), "created_by": who(), "source": staged.source,
                         "tools": _tool_versions(staged.tools)})
        row, existed = store.commit(name, version, staging, manifest, aliases)
    except BaseException:
        store.discard(staging)
        raise
    if existed and aliases:
        for a in aliases:
            store.set_alias(name, a, row["version"], who())
    return {"name": row["name"], "version": row["version"], "digest": row["digest"], "existed": existed,
            "zoo": store.url, "path": _where(store, row), "files": row["files"], "size": row["size"],
            "kinds": row["kinds"], "targets": row["targets"], "aliases": aliases}


def _default_name(model: Any) -> str:
    if isinstance(model, (str, os.PathLike)):
        p = Path(model)
        return (p.name if p.is_dir() else p.stem) or "model"
    raise ZooError("name= is required when publishing an in-memory module")


def _where(store: Any, row: dict[str, Any]) -> str:
    return str(store.root / row["path"]) if not store.remote else f"{store.protocol}://{row['path']}"


def _tool_versions(extra: dict[str, str]) -> dict[str, str]:
    from .. import __version__

    tools = {"cann-export": __version__, "python": platform.python_version()}
    if "torch" in sys.modules:
        tools["torch"] = sys.modules["torch"].__version__
    tools.update(extra)
    return tools


# --------------------------------------------------------------------------------------------- read


def _resolve(store: Any, name: str, ref: str | None) -> tuple[str, list[dict[str, Any]]]:
    rows = store.versions(check_name(name))
    if not rows:
        known = store.names()
        hint = f"; models here: {', '.join(known[:20])}" if known else "; the zoo is empty"
        raise ZooError(f"no model named {name!r} in the zoo at {store.url}{hint}")
    if ref is None or ref == LATEST:
        return rows[-1]["version"], rows
    ref = str(ref)
    if any(r["version"] == ref for r in rows):
        return ref, rows
    aliases = store.aliases(name)
    if ref in aliases:
        return aliases[ref], rows
    raise ZooError(f"{name} has no version or alias {ref!r}; versions: {', '.join(r['version'] for r in rows)}"
                   + (f"; aliases: {', '.join(f'{a}->{v}' for a, v in aliases.items())}" if aliases else ""))


def _parse(name: str, version: Any) -> tuple[str, str | None]:
    if version is None and isinstance(name, str) and "@" in name:
        return split_ref(name)
    return check_name(name), (str(version) if version is not None else None)


def list_models(zoo: Any = None) -> list[dict[str, Any]]:
    """One row per model: name, versions, latest version, aliases, kinds and targets of the latest."""
    store = open_store(zoo)
    out = []
    for name in store.names():
        rows = store.versions(name)
        if not rows:
            continue
        latest = rows[-1]
        out.append({"name": name, "versions": [r["version"] for r in rows], "latest": latest["version"],
                    "aliases": store.aliases(name), "kinds": latest["kinds"], "targets": latest["targets"],
                    "created_utc": latest["created_utc"], "metadata": latest["metadata"]})
    return out


def show(name: str, version: str | None = None, zoo: Any = None) -> dict[str, Any]:
    """A model's versions, aliases (with their logged history) and the manifest of one version (latest)."""
    store = open_store(zoo)
    name, ref = _parse(name, version)
    chosen, rows = _resolve(store, name, ref)
    return {"name": name, "version": chosen, "versions": rows, "aliases": store.aliases(name),
            "alias_history": store.alias_history(name), "manifest": store.manifest(name, chosen)}


def set_alias(name: str, alias: str, version: str | int, zoo: Any = None) -> dict[str, Any]:
    """Point ``alias`` at ``version`` (the only thing that ever moves); the move is logged."""
    store = open_store(zoo)
    check_name(name)
    alias = check_alias(alias)
    resolved, _ = _resolve(store, name, str(version))
    return store.set_alias(name, alias, resolved, who())


def verify(name: str, version: str | None = None, zoo: Any = None) -> dict[str, Any]:
    """Check the sha256 and size of every stored file of one version (or all versions) of ``name``."""
    store = open_store(zoo)
    name, ref = _parse(name, version)
    chosen, rows = _resolve(store, name, ref)
    wanted = [r["version"] for r in rows] if ref is None else [chosen]
    results = []
    for v in wanted:
        try:
            manifest = store.manifest(name, v)
            problems = store.read_problems(name, v, manifest, None)
            count = len(manifest.get("files") or {})
        except ZooError as e:
            problems, count = [e.message], 0
        results.append({"version": v, "ok": not problems, "files": count, "problems": problems})
    return {"ok": all(r["ok"] for r in results), "name": name, "zoo": store.url, "versions": results}


# --------------------------------------------------------------------------------------------- load


def _pick_target(name: str, version: str, manifest: dict[str, Any], target: str | None,
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


def _verified_dir(store: Any, name: str, version: str, manifest: dict[str, Any], only: list[str] | None) -> Path:
    """The version's directory after the sha256 of every file needed was checked; raises naming the files."""
    from .verify import check_dir

    root = store.version_dir(name, version, manifest, only)
    problems = check_dir(root, manifest, only)
    if problems and store.remote:  # a damaged cache: fetch again once from the verified blobs
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        for rel, entry in (manifest.get("files") or {}).items():
            if any(p.startswith(rel + ":") for p in problems):
                (store.cache / "blobs" / entry["sha256"]).unlink(missing_ok=True)
        root = store.version_dir(name, version, manifest, only)
        problems = check_dir(root, manifest, only)
    if problems:
        raise ZooIntegrityError(f"{name} version {version} failed its integrity check, nothing was loaded: "
                                + "; ".join(problems) + ". Restore the file or publish the model again",
                                path=str(root))
    return root


def load_model(name: str, version: str | int | None = None, framework: str = "pytorch", target: str | None = None,
               *, zoo: Any = None, model_class: str | None = None, model_kwargs: dict[str, Any] | None = None) -> Any:
    """``framework="pytorch"``: the nn.Module rebuilt from the recorded architecture with verified weights.
    ``framework="onnx"``: the path of the verified ONNX file or bundle for ``target`` (a soc_version or a
    target key). ``version`` is a version, an alias or None (the latest); ``name@ref`` works too."""
    store = open_store(zoo)
    name, ref = _parse(name, version)
    chosen, _ = _resolve(store, name, ref)
    manifest = store.manifest(name, chosen)
    if framework == "onnx":
        key = _pick_target(name, chosen, manifest, target, required=True)
        art = manifest["artifacts"][key]
        root = _verified_dir(store, name, chosen, manifest, [art["path"]])
        base = root / art["path"]
        if art.get("bundle"):
            return str(base)
        return str(base / art["model_file"])
    if framework != "pytorch":
        raise ZooError(f"unknown framework {framework!r}; use 'pytorch' (an nn.Module) or 'onnx' (the artifact path)")
    if target is not None:
        _pick_target(name, chosen, manifest, target, required=False)
    from .loading import rebuild

    return rebuild(store, name, chosen, manifest, model_class, model_kwargs)


def pull(ref: str, output: str | os.PathLike, version: str | None = None, target: str | None = None,
         overwrite: bool = False, zoo: Any = None) -> dict[str, Any]:
    """Copy a verified version (only ``target``'s artifact when given) into ``output``, atomically."""
    import shutil

    from .. import atomic

    store = open_store(zoo)
    name, ref_v = _parse(ref, version)
    chosen, _ = _resolve(store, name, ref_v)
    manifest = store.manifest(name, chosen)
    only = None
    if target is not None:
        key = _pick_target(name, chosen, manifest, target, required=True)
        only = [p for p in manifest["files"] if not p.startswith("artifacts/")] + [manifest["artifacts"][key]["path"]]
    out = Path(output).resolve()
    if out == Path.cwd() or out in Path.cwd().parents or out.parent == out:
        raise ZooError("refusing to replace the current directory or one of its parents; pull into a new "
                       "directory, e.g. -o ./model", path=output)
    if out.exists() and not overwrite:
        raise ZooError("output already exists; pass --overwrite or choose another directory", path=out)
    root = _verified_dir(store, name, chosen, manifest, only)
    from .verify import selected

    staging = atomic.staging_dir(out)
    try:
        for rel in selected(manifest, only):
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, dst)
        shutil.copyfile(root / "manifest.json", staging / "manifest.json")
        atomic.commit_dir(staging, out, overwrite)
    except BaseException:
        atomic.discard(staging)
        raise
    files = sorted(selected(manifest, only))
    return {"ok": True, "name": name, "version": chosen, "digest": manifest["digest"], "output": str(out),
            "files": files, "target": only and key}
