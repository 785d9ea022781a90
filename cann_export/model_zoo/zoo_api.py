"""The model zoo's Python API: publish, load_model, pull, list_models, show, set_alias, verify, gc."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from ..safe_text import check_printable
from . import content
from .clock import utc_now, who
from .zoo_errors import ZooError
from .names import check_alias, check_name, check_version
from .pull import pull
from .resolve import open_store, parse_ref, pick_target, resolve, verified_dir

MANIFEST_SCHEMA = "cann-export/zoo-version/1"
__all__ = ["MANIFEST_SCHEMA", "gc", "list_models", "load_model", "open_store", "publish", "pull", "set_alias",
           "show", "utc_now", "verify", "who"]


# ------------------------------------------------------------------------------------------- publish


def publish(model: Any = None, name: str | None = None, version: str | int | None = None,
            metadata: dict[str, Any] | None = None, card: Any = None, *, zoo: Any = None,
            alias: str | list[str] | None = None, model_class: str | None = None,
            model_kwargs: dict[str, Any] | None = None, example_inputs: Any = None, trust_pickle: bool = False,
            artifacts: list[Any] | None = None, sign: Any = None) -> dict[str, Any]:
    """Publish ``model`` (an nn.Module, a weights/checkpoint file, or an exported atc_ready/om/onnx artifact)
    as ``name`` (default: the file's stem). ``version`` None numbers it; an explicit taken version is refused
    unless the contents are identical (then it is a no-op returning the existing version). ``sign``: an
    ed25519 private key (PEM path, bytes or key object) that signs the manifest digest with name and version.

    Returns ``{"name", "version", "digest", "manifest_sha256", "existed", "zoo", "path", ...}``."""
    name = check_name(name if name is not None else _default_name(model))
    version = check_version(version) if version is not None else None
    aliases = [check_alias(a) for a in ([alias] if isinstance(alias, str) else list(alias or []))]
    metadata = {str(k): v for k, v in (metadata or {}).items()}
    for key, value in metadata.items():  # as `zoo publish --metadata` refuses them: every sink would show them escaped
        check_printable(key, value if isinstance(value, str) else "", "metadata=")
    seal = None
    if sign is not None:
        from .signing import sealer

        seal = sealer(sign)
    from .aliases import recorder
    store = open_store(zoo)
    staging = store.staging()
    try:
        staged = content.Staged(staging)
        content.stage(staged, model, model_class=model_class, model_kwargs=model_kwargs,
                      example_inputs=example_inputs, trust_pickle=trust_pickle, artifacts=list(artifacts or []))
        fields = content.write_card(staged, name, metadata, card)
        from .file_copies import file_table, manifest_digest

        files = file_table(staging, staged.known)
        runnable = staged.weights or (staged.architecture or {}).get("kind") in ("torch.export", "diffusers-pipeline")
        kinds = (["pytorch"] if runnable else []) + sorted({a["format"] for a in staged.artifacts.values()})
        manifest: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA, "name": name, "version": version,
            "kinds": kinds, "weights": staged.weights, "architecture": staged.architecture,
            "artifacts": staged.artifacts, "card": fields, "metadata": metadata, "lineage": staged.lineage,
            "files": files,
        }
        manifest["digest"] = manifest_digest(manifest)
        manifest.update({"created_utc": utc_now(), "created_by": who(), "source": staged.source,
                         "tools": _tool_versions(staged.tools)})
        row, existed = store.commit(name, version, staging, manifest, aliases, seal, recorder(name, seal, store.url))
    except BaseException:
        store.discard(staging)
        raise
    stored, manifest_sha = store.read_manifest(row["name"], row["version"])
    if existed and seal is not None and not isinstance(stored.get("signature"), dict):
        raise ZooError(f"{name} version {row['version']} already exists with identical contents but unsigned; "
                       "versions are immutable, so it cannot be signed now: publish under a new version")
    for a in aliases if existed else []:
        _move_alias(store, name, a, stored, manifest_sha, seal)
    return {"name": row["name"], "version": row["version"], "digest": row["digest"],
            "manifest_sha256": manifest_sha, "signed": isinstance(stored.get("signature"), dict), "existed": existed,
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
    name, ref = parse_ref(name, version)
    chosen, rows = resolve(store, name, ref)
    manifest, manifest_sha = store.read_manifest(name, chosen)
    from .aliases import describe

    records = describe(store, name)
    return {"name": name, "version": chosen, "manifest_sha256": manifest_sha, "versions": rows,
            "aliases": store.aliases(name), "alias_records": records,
            "aliases_signed": all(r["signed"] for r in records.values()) if records else None,
            "alias_history": store.alias_history(name), "manifest": manifest}


def set_alias(name: str, alias: str, version: str | int, zoo: Any = None, sign: Any = None) -> dict[str, Any]:
    """Point ``alias`` at ``version`` (the only thing that ever moves); the move is logged with a record
    {name, alias, version, manifest_sha256, sequence, time_utc}. ``sign``: the ed25519 private key (as for
    publish), required when the version is signed; it signs the record."""
    store = open_store(zoo)
    check_name(name)
    alias = check_alias(alias)
    resolved, _ = resolve(store, name, str(version))
    manifest, manifest_sha = store.read_manifest(name, resolved)
    signer = None
    if sign is not None:
        from .signing import sealer

        signer = sealer(sign)
    return _move_alias(store, name, alias, manifest, manifest_sha, signer)


def _move_alias(store: Any, name: str, alias: str, manifest: dict[str, Any], manifest_sha: str,
                signer: Any) -> dict[str, Any]:
    from .aliases import check_signer, recorder

    check_signer(manifest, signer, alias)
    return store.set_alias(name, alias, manifest["version"], who(), recorder(name, signer, store.url), manifest_sha)


def verify(name: str, version: str | None = None, zoo: Any = None, key: Any = None,
           trust_state: Any = None) -> dict[str, Any]:
    """Check the sha256 and size of every stored file of one version (or all versions) of ``name``; with
    ``key`` (an ed25519 public key) also that each version is signed by it, and for ``name@alias`` that the
    alias record is signed, matches and is not a rollback (aliases.verify_alias)."""
    from .resolve import resolve_ref

    store = open_store(zoo)
    name, ref = parse_ref(name, version)
    chosen, rows, alias = resolve_ref(store, name, ref)
    wanted = [r["version"] for r in rows] if ref is None else [chosen]
    results = []
    for v in wanted:
        manifest_sha, signed_by, alias_check = None, None, None
        try:
            manifest, manifest_sha = store.read_manifest(name, v)
            count = len(manifest.get("files") or {})
            if key is not None:
                from .aliases import verify_alias
                from .signing import check

                signed_by = check(manifest, key, f"{name} version {v}")
                if alias is not None:
                    alias_check = verify_alias(store, name, alias, v, manifest_sha, key, trust_state)
            problems = store.read_problems(name, v, manifest, None)
        except ZooError as e:
            problems, count = [e.message], 0
        results.append({"version": v, "ok": not problems, "files": count, "problems": problems,
                        "manifest_sha256": manifest_sha, **({"signed_by": signed_by} if key is not None else {}),
                        **({"alias": alias_check} if alias_check else {})})
    return {"ok": all(r["ok"] for r in results), "name": name, "zoo": store.url, "versions": results}


def gc(zoo: Any = None) -> dict[str, Any]:
    """Sweep the zoo's staging area: directories of dead publishers, killed commits, partial downloads."""
    store = open_store(zoo)
    return {"ok": True, "zoo": store.url, "removed": store.gc()}


# --------------------------------------------------------------------------------------------- load


def load_model(name: str, version: str | int | None = None, framework: str = "pytorch", target: str | None = None,
               *, zoo: Any = None, model_class: str | None = None, model_kwargs: dict[str, Any] | None = None,
               allow_modules: list[str] | tuple[str, ...] | None = None, verify_signature: Any = None,
               trust_state: str | os.PathLike | None = None) -> Any:
    """``framework="pytorch"``: the module, from the stored torch.export program (loaded weights-only) or
    rebuilt from ``model_class`` with verified weights; a pipeline bundle's entry gives the diffusers pipeline,
    rebuilt from its model_index.json, configs and safetensors (classes allow-listed, never pickle). A callable
    architecture recorded in the manifest is imported only when its module is allowed (``allow_modules=`` or
    CANN_MODEL_ZOO_ALLOW_MODULES); the manifest alone never names code to run. ``framework="onnx"``: for
    ``target`` (a soc_version or a target key), a bundle's runner in onnxruntime (``cann_export.load`` of the
    verified bundle: a graph called with its input names, a multi-graph bundle's components by name, a pipeline
    called like the pipeline; a graph's runner is also the bundle's path, ``os.fspath(runner)``), or the path of
    a published ONNX file or om-stub. ``version`` is a version, an alias or None (the latest); ``name@ref``
    works too. ``verify_signature``: an ed25519 public key the version must be signed with (unsigned or
    otherwise signed versions are refused); ``name@alias`` then also needs a signed alias record that matches
    and is not older than the newest this client saw (kept in ``trust_state``, default $CANN_MODEL_ZOO_TRUST or
    ~/.cache/cann-export/zoo-trust.json)."""
    from .aliases import resolve_checked

    store = open_store(zoo)
    name, ref = parse_ref(name, version)
    chosen, manifest, _, _ = resolve_checked(store, name, ref, verify_signature, trust_state)
    if framework == "onnx":
        key = pick_target(name, chosen, manifest, target, required=True)
        art = manifest["artifacts"][key]
        root = verified_dir(store, name, chosen, manifest, [art["path"]])
        base = root / art["path"]
        if art.get("bundle"):  # run back (bundle/graph_runner.py): a graph's runner, path-like, or a pipeline
            from ..bundle.graph_runner import load

            return load(base)
        return str(base / art["model_file"])
    if framework != "pytorch":
        raise ZooError(f"unknown framework {framework!r}; use 'pytorch' (an nn.Module) or 'onnx' (the artifact path)")
    if target is not None:
        pick_target(name, chosen, manifest, target, required=False)
    from .loading import rebuild

    return rebuild(store, name, chosen, manifest, model_class, model_kwargs, allow_modules)
