"""Exported artifacts in a version: each under ``artifacts/TARGET`` (format, soc_version, precision mode),
with its lineage; an atc_ready bundle's torch.export program becomes the version's architecture."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .zoo_errors import ZooError
from .layout import BUNDLE_PROGRAM, PIPELINE_ARCH, PIPELINE_KIND, PROGRAM


def target_key(fmt: str, soc: str | None, precision: str | None) -> str:
    parts = [str(p) for p in (fmt, soc, precision) if p]
    bad = [p for p in parts if not re.fullmatch(r"[A-Za-z0-9._+]+", p) or p in (".", "..")]
    if bad:
        raise ZooError(f"the artifact's target fields {bad} are not plain names (format, soc_version, precision "
                       "mode); the bundle's manifest is damaged or forged")
    return "-".join(parts)


def stage_artifact(staged: Any, path: Path) -> None:
    """Stage an exported artifact (bundle directory, single-file bundle, om-stub or .onnx) under its target key;
    a bundle's torch.export program becomes the version's architecture."""
    from ..bundle.read import open_bundle, read_bundle, verify_files
    from ..errors import ValidateError

    if path.suffix == ".onnx" and path.is_file():
        return _stage_onnx(staged, path)
    from ..bundle.multi_check import opened_multi

    with opened_multi(path) as directory:  # a directory, or one file (x.zip): the zoo keeps the directory form
        if directory is not None:
            return _stage_multi(staged, directory, path)
    try:
        with open_bundle(path) as (bundle, container):
            manifest = read_bundle(bundle)
            verify_files(bundle, manifest)
            _check_as_validate(bundle, container, path)
            atc = manifest.get("atc") or {}
            fmt = manifest.get("format") or "atc_ready"
            key = target_key(fmt, atc.get("soc_version"), atc.get("precision_mode"))
            if key in staged.artifacts:
                raise ZooError(f"two artifacts for target {key}; publish them as separate versions", path=path)
            base = f"artifacts/{key}"
            if path.is_dir():
                for rel in sorted(manifest.get("files") or {}) + ["manifest.json"]:
                    staged.copy(path / rel, f"{base}/{rel}")
            else:  # a single-file artifact (om-stub, archive): the bundle travels inside it
                staged.copy(path, f"{base}/{path.name}")
            if BUNDLE_PROGRAM in (manifest.get("files") or {}) and staged.architecture is None:
                _stage_bundle_program(staged, Path(bundle) / BUNDLE_PROGRAM, key)
    except ValidateError as e:
        raise ZooError(f"refused to publish a damaged artifact: {e.message}", path=path) from e
    files = manifest.get("files") or {}
    model = manifest.get("model") or {}
    onnx_file = model.get("file") or "model.onnx"
    om = atc.get("om") or {}
    prov = manifest.get("provenance") or {}
    staged.artifacts[key] = {
        "format": fmt, "soc_version": atc.get("soc_version"), "precision_mode": atc.get("precision_mode"),
        "path": base, "model_file": onnx_file if path.is_dir() else path.name, "bundle": path.is_dir(),
        "opset": model.get("opset"), "exporter": model.get("exporter"), "parity": manifest.get("parity"),
    }
    staged.lineage.append({
        "target": key,
        "source": prov.get("source"), "source_weights_sha256": prov.get("source_sha256"),
        "onnx_sha256": (files.get(onnx_file) or {}).get("sha256"), "exporter": model.get("exporter"),
        "opset": model.get("opset"),
        "om_sha256": om.get("sha256") if path.is_dir() else staged.known[f"{base}/{path.name}"]["sha256"],
        "om_kind": om.get("kind"), "atc_command": " ".join(atc.get("command") or []) or None,
    })
    staged.tools.update({f"export.{k}": v for k, v in prov.items() if k in ("tool", "torch", "onnx", "onnxruntime")})


def _check_as_validate(directory: Path, container: Any, shown: Path) -> None:
    """Every check ``cann-export validate`` makes of a bundle but re-running parity: the file table, the torch
    program (checked, never loaded), the graph against the manifest, the ATC options and files, the lint and
    what the bundle's Format checks."""
    from ..bundle.rederive import check_bundle

    diffs = check_bundle(directory, container=container, raise_on_difference=False).differences
    if diffs:
        shown_diffs = "; ".join(diffs[:10]) + (f"; ... {len(diffs) - 10} more" if len(diffs) > 10 else "")
        raise ZooError(f"refused to publish a damaged artifact: the bundle does not match its manifest "
                       f"({shown_diffs}); `cann-export validate` refuses it too", path=shown)


def _stage_bundle_program(staged: Any, program: Path, key: str) -> None:
    """The bundle's torch.export program becomes the version's architecture (checked weights-only now, and
    again at every load), so load_model(framework="pytorch") needs no model_class."""
    from ..errors import LoadError
    from ..load.archive_safety import check_export_archive

    try:
        check_export_archive(program, trust_pickle=False)
    except LoadError as e:
        raise ZooError(f"refused the artifact's torch.export program: {e.message}", path=str(program)) from e
    staged.copy(program, PROGRAM)
    staged.architecture = {"kind": "torch.export", "file": PROGRAM, "from_artifact": key}


def _stage_onnx(staged: Any, path: Path) -> None:
    """A plain .onnx file (and its external-data file beside it) under the target ``onnx``."""
    key = "onnx"
    rels = [path.name] + ([path.name + ".data"] if path.with_name(path.name + ".data").is_file() else [])
    entry = {"format": "onnx", "soc_version": None, "precision_mode": None, "path": f"artifacts/{key}",
             "model_file": path.name}
    if key in staged.artifacts:
        raise ZooError(f"two artifacts for target {key}; publish them as separate versions", path=path)
    for rel in rels:
        staged.copy(path.parent / rel, f"artifacts/{key}/{rel}")
    staged.artifacts[key] = entry
    staged.lineage.append({"target": key, "onnx_sha256": staged.known[f"artifacts/{key}/{path.name}"]["sha256"]})


def _stage_multi(staged: Any, path: Path, shown: Path) -> None:
    """A multi-graph bundle (components/<name>/ sub-bundles) in ``path`` (``shown``: the bundle the user named):
    the top-level manifest, every component's manifest digest and files, and every component's graph and ATC
    options checked before anything is copied."""
    from ..bundle.rederive import check_bundle
    from ..bundle.multi_check import check_multi
    from ..errors import ValidateError

    try:
        manifest, diffs = check_multi(path)
        for c in manifest["components"] if not diffs else []:
            checked = check_bundle(path / c["path"], raise_on_difference=False)
            diffs += [f"{c['path']}: {d}" for d in checked.differences]
    except ValidateError as e:
        raise ZooError(f"refused to publish a damaged multi-graph bundle: {e.message}", path=shown) from e
    if diffs:
        raise ZooError("refused to publish a damaged multi-graph bundle: " + "; ".join(diffs[:10]), path=shown)
    first = (manifest["components"][0]["path"]) + "/manifest.json"
    from ..bundle.read import load_manifest_file

    atc = load_manifest_file(path / first).get("atc") or {}
    fmt = str(manifest.get("format") or "atc_ready")  # checked by check_multi: a format of multi-graph bundles
    key = target_key(fmt, atc.get("soc_version"), atc.get("precision_mode"))
    if key in staged.artifacts:
        raise ZooError(f"two artifacts for target {key}; publish them as separate versions", path=shown)
    base = f"artifacts/{key}"
    for rel in sorted(manifest["files"]) + ["manifest.json"]:
        staged.copy(path / rel, f"{base}/{rel}")
    staged.artifacts[key] = {
        "format": fmt, "soc_version": atc.get("soc_version"), "precision_mode": atc.get("precision_mode"),
        "path": base, "model_file": "manifest.json", "bundle": True, "multi_graph": manifest.get("kind"),
        "components": [c["name"] for c in manifest["components"]], "parity": manifest.get("parity"),
    }
    if manifest.get("kind") == PIPELINE_KIND and staged.architecture is None and any(
            rel.startswith("pipeline/") and rel.endswith(".safetensors") for rel in manifest["files"]):
        # the source pipeline's safetensors (diffusion/source_weights.py): load_model(framework="pytorch") rebuilds it
        staged.architecture = {"kind": PIPELINE_ARCH, "file": f"{base}/pipeline/model_index.json",
                               "from_artifact": key}
    staged.lineage.append({"target": key, "components": {
        c["name"]: {"manifest_sha256": c["manifest_sha256"],
                    "onnx_sha256": (manifest["files"].get(f"{c['path']}/model.onnx") or {}).get("sha256")}
        for c in manifest["components"]}})
