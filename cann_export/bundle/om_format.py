"""The ``om`` format (an atc_ready bundle plus ``model.om``) and ``cann-export convert``.

With CANN's ``atc`` on PATH, ``model.om`` is the real offline model ATC compiles from the bundle's rendered
command; a graph holding Q/DQ (int8 QAT) goes through AMCT's convert_qat_model first (``atc.amct_run``). Without
them, ``model.om`` is an om-stub (see ``cann_export.bundle.om_stub``): an om header over a zip of the bundle, which
``cann-export convert`` later turns into the real model on a machine with CANN (and AMCT), the manifest saying why.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atc import amct_run
from ..errors import EXIT_STAGE_FAILED, ExportError, ValidateError, WriteError
from ..fs import atomic, digests
from ..hooks.contracts import CheckedBundle, ResultInfo
from .format_writers import AtcReadyFormat
from .manifest_build import build_manifest, dumps
from .om_stub import extract_stub, is_om_file, read_header, read_stub, write_stub  # noqa: F401 - the module API

if TYPE_CHECKING:
    from ..context import ExportContext

OM_FILE = "model.om"
ATC_LOG = "atc/atc.log"
AMCT_LOG = f"{amct_run.AMCT_DIR}/amct.log"
INSTALL_HINT = ("install CANN's toolkit and source set_env.sh (e.g. `source "
                "/usr/local/Ascend/ascend-toolkit/set_env.sh`) so that `atc` is on PATH")
_ERROR_CODE = re.compile(r"\b(E[0-9A-Z]\d{4}|EZ\d{4})\b")  # E19010, EZ9999, EE1001 ...
_NOISE = ("ATC start working now", "please wait for a moment")


class AtcError(WriteError):
    """ATC refused a valid bundle: a stage failure (exit 3), carrying ATC's own error text."""

    exit_code = EXIT_STAGE_FAILED


def find_atc() -> str | None:
    return shutil.which("atc")


def atc_error_text(output: str, limit: int = 800) -> str:
    """The gist of a failed ATC run: its error-code lines (``E19010: ...``) and the line after each, else its last."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()
             and not any(n in line for n in _NOISE)]
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _ERROR_CODE.search(line) and not line.lstrip().startswith("TraceBack"):
            picked.append(line.strip())
            if i + 1 < len(lines) and lines[i + 1].lstrip().startswith("Solution"):
                picked.append(lines[i + 1].strip())
    if not picked:
        picked = [line.strip() for line in lines[-5:]]
    text = " | ".join(dict.fromkeys(picked)) or "(ATC printed nothing)"
    return text if len(text) <= limit else text[:limit] + " ..."


def run_atc(args: list[str], cwd: Path, log_path: Path, atc: str | None = None) -> tuple[int, str]:
    """Run ``atc`` with exactly ``args`` (argv[0] is "atc") in ``cwd``; stdout and stderr go to
    ``log_path``. Returns ``(exit code, ATC's output)``."""
    exe = atc or find_atc()
    if exe is None:
        raise ExportError(f"`atc` is not on PATH; {INSTALL_HINT}", stage="convert")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(list(args), executable=exe, cwd=str(cwd), stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT, check=False)
        except OSError as e:
            raise AtcError(f"could not run {exe}: {e}; {INSTALL_HINT}", path=exe) from None
    return proc.returncode, log_path.read_text(encoding="utf-8", errors="replace")


def missing_tools(atc: str | None, quantized: bool) -> tuple[str, str] | None:
    """Why no real model.om can be compiled here, and what to install: None when nothing is missing."""
    missing = [] if atc else [("no `atc` on PATH", INSTALL_HINT)]
    if quantized and amct_run.find_amct() is None:
        missing.append((amct_run.MISSING, amct_run.INSTALL_HINT))
    if not missing:
        return None
    return "; and ".join(m[0] for m in missing), "; and ".join(m[1] for m in missing)


def _output_stem(args: list[str]) -> str:
    for a in args:
        if a.startswith("--output="):
            return a.split("=", 1)[1]
    return "model"


class OmFormat(AtcReadyFormat):
    name = "om"
    description = ("directory: the atc_ready bundle plus model.om (compiled by ATC when `atc` is on PATH, "
                   "else an om-stub for `cann-export convert`); -o NAME.om writes the file NAME.om with the "
                   "bundle beside it in NAME_bundle/")
    is_directory = True
    writes_beside = (OM_FILE, f".cann-tmp-om/{OM_FILE}", ATC_LOG, f"{amct_run.AMCT_DIR}/**")  # -o NAME.om: aside
    component_format = staticmethod(lambda: None)  # several graphs: --format atc_ready, then `cann-export convert`

    def targets(self, output: Path) -> list[Path]:
        return [bundle_beside(output), output] if output.suffix == ".om" else super().targets(output)

    # ------------------------------------------------ what validate, inspect and the result ask of the om

    def unpack(self, path: Path, directory: Path) -> dict[str, Any] | None:
        """An om-stub carries its bundle: extract it, return the stub's header (a real om is refused)."""
        if not is_om_file(path):
            return None
        header = read_header(path)
        extract_stub(path, directory)
        return header

    def check_artifact(self, checked: CheckedBundle) -> list[str]:
        """The stub the bundle came in, or the model.om stub it carries, checked like one given directly;
        its header must name the SoC the validated ATC options do."""
        diffs: list[str] = []
        mine = checked.container is not None and checked.container.format == self.name
        header = checked.container.header if mine else None
        om = _om_record(checked.manifest)
        inner = checked.directory / OM_FILE
        if om.get("kind") == "stub" and om.get("file") == OM_FILE and inner.is_file():
            try:
                header = header or read_header(inner)
            except ValidateError as e:
                diffs.append(f"{OM_FILE}: {e.message}")
        if header is not None and checked.options is not None:
            soc = checked.options.soc_version[:19]
            if header.get("platform_version") != soc:
                diffs.append(f"om header platform_version {header.get('platform_version')!r} differs from the "
                             f"bundle's soc_version {soc!r}")
        return diffs

    def describe(self, checked: CheckedBundle) -> dict[str, Any]:
        if checked.container is None or checked.container.format != self.name:
            return {}
        header = checked.container.header
        reason = _om_record(checked.manifest).get("reason")
        return {"kind": "om-stub", "om": {**header, "kind": "stub"},
                "notes": ["om-stub (not a compiled model; `cann-export convert` compiles it) header: "
                          + ", ".join(f"{k}={v}" for k, v in header.items() if k != "kind")]
                + ([f"an om-stub because {reason}"] if isinstance(reason, str) else [])}

    def result_info(self, manifest: dict[str, Any], output: Path) -> ResultInfo:
        om = _om_record(manifest)
        if not om:
            return ResultInfo()
        extras = {"om": {k: om[k] for k in ("kind", "file", "sha256", "size", "reason") if k in om}}
        if om.get("kind") != "stub":
            return ResultInfo(extras)
        amct = " and AMCT" if "amct" in (manifest.get("atc") or {}) else ""
        return ResultInfo(extras, label="om-stub", notes=[
            f"  an om-stub, not a compiled model: {om.get('reason') or 'no `atc` on PATH'}; run `cann-export convert "
            f"{output}` on a machine with CANN{amct} (or export with --require-atc)"])

    def runs_programs(self, options: Any) -> str | None:
        atc = find_atc()
        return f"--format om runs ATC ({atc}), which the load sandbox would stop" if atc else None

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]:
        files = super().write(ctx, staging)
        atc = find_atc()
        missing = missing_tools(atc, "amct" in ctx.reports.atc)
        if missing is not None:
            reason, hint = missing
            if ctx.options.require_atc:
                raise AtcError(f"--require-atc: {reason}, so no real model.om can be compiled; {hint}, or drop "
                               "--require-atc to write an om-stub", path=_source(ctx), stage="write")
            ctx.reports.atc.update({"ran": False, "exit_code": None,
                                    "om": {"file": OM_FILE, "kind": "stub", "reason": reason}})
            return files
        return files + self._compile(ctx, staging, atc)

    def _compile(self, ctx: ExportContext, staging: Path, atc: str) -> list[Path]:
        report = ctx.reports.atc
        args = list(report["command"])
        if "amct" in report:
            self._amct(ctx, staging)
        try:
            code, output = run_atc(args, staging, staging / ATC_LOG, atc)
        finally:
            amct_run.drop_models(staging)
        report.update({"ran": True, "exit_code": code, "atc": atc, "log": ATC_LOG, "ran_command": args})
        om = staging / f"{_output_stem(args)}.om"
        if code != 0:
            raise AtcError(f"ATC failed (exit {code}): {atc_error_text(output)}. Fix the model or the ATC hints "
                           "(--atc-hint), or export --format atc_ready and convert on the device host",
                           path=_source(ctx))
        if not om.is_file():
            raise AtcError(f"ATC exited 0 but wrote no {om.name}: {atc_error_text(output)}", path=_source(ctx))
        report["om"] = {"file": om.name, "kind": "atc", "sha256": digests.sha256_file(om), "size": om.stat().st_size}
        kept = staging / amct_run.AMCT_DIR
        return [om, staging / ATC_LOG, *(sorted(p for p in kept.rglob("*") if p.is_file()) if kept.is_dir() else [])]

    def _amct(self, ctx: ExportContext, staging: Path) -> None:
        """AMCT's convert_qat_model on the staged graph: amct/model_deploy_model.onnx for atc, its version and
        exit code in the manifest's ``atc.amct``."""
        amct = ctx.reports.atc["amct"]
        found = amct_run.find_amct() or {}
        _, code, output = amct_run.run_amct(amct["model"], staging, staging / AMCT_LOG)
        amct.update({"ran": True, "exit_code": code, "version": found.get("version"), "log": AMCT_LOG})
        log_dir, kept = staging / "amct_log", staging / amct_run.AMCT_DIR / "amct_log"  # AMCT logs to its cwd
        if log_dir.is_dir() and not log_dir.is_symlink():
            if kept.is_dir():
                shutil.rmtree(kept)  # a second run (finalize recompiles): its log replaces the first one's
            os.replace(log_dir, kept)
        try:
            amct_run.deploy_model(staging, code, output, AMCT_LOG)
        except amct_run.AmctError as e:
            amct_run.drop_models(staging)
            e.path = _source(ctx)
            raise

    def finalize(self, ctx: ExportContext, staging: Path) -> None:
        report = ctx.reports.atc
        single = ctx.output_path.suffix == ".om"
        aside = staging / ".cann-tmp-om" / OM_FILE  # left out of the file table and the stub's payload
        if report.get("ran"):
            if report.get("ran_command") != report.get("command"):  # a later stage changed the ATC options
                self._compile(ctx, staging, report["atc"])
            report.pop("ran_command", None)
            if single:
                aside.parent.mkdir()
                os.replace(staging / report["om"]["file"], aside)
                report["om"]["file"] = f"../{ctx.output_path.name}"
            super().finalize(ctx, staging)
            return
        super().finalize(ctx, staging)  # the bundle the stub carries, manifest.json included
        om = aside if single else staging / OM_FILE
        om.parent.mkdir(exist_ok=True)
        header = write_stub(om, staging, _model_name(ctx))
        reason = (report.get("om") or {}).get("reason")
        report["om"] = {"file": f"../{ctx.output_path.name}" if single else OM_FILE, "kind": "stub",
                        "sha256": digests.sha256_file(om), "size": om.stat().st_size,
                        "payload_sha256": header["checksum"], **({"reason": reason} if reason else {})}
        ctx.manifest = build_manifest(ctx, staging)  # now listing model.om too (in the directory form)
        atomic.write_text(staging / "manifest.json", dumps(ctx.manifest))

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]:
        if ctx.output_path.suffix != ".om":
            return super().commit(ctx, staging)
        target, bundle_dir = ctx.output_path, bundle_beside(ctx.output_path)
        om_staging = atomic.staging_dir(target)
        try:
            os.replace(staging / ".cann-tmp-om" / OM_FILE, om_staging / target.name)
            (staging / ".cann-tmp-om").rmdir()
            atomic.commit_dir(staging, bundle_dir, ctx.options.overwrite)
            placed = atomic.commit_files(om_staging, [target.name], target.parent, ctx.options.overwrite)
        finally:
            atomic.discard(om_staging)
        ctx.final_onnx = bundle_dir / ctx.onnx_path.name
        return sorted(p for p in bundle_dir.rglob("*") if p.is_file()) + placed


def _om_record(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's record of model.om (``atc.om``), or {}."""
    atc = manifest.get("atc")
    om = atc.get("om") if isinstance(atc, dict) else None
    return om if isinstance(om, dict) else {}


def bundle_beside(om_path: Path) -> Path:
    """Where ``-o NAME.om`` puts the bundle the om was made from: ``NAME_bundle/`` beside it."""
    return om_path.with_name(f"{om_path.stem}_bundle")


def _source(ctx: ExportContext) -> str | None:
    return ctx.loaded.source_path if ctx.loaded else None


def _model_name(ctx: ExportContext) -> str:
    src = _source(ctx)
    if src:
        return Path(src).stem
    return type(ctx.model).__name__ if ctx.model is not None else ctx.output_path.name


# ---------------------------------------------------------------- convert


def _default_output(path: Path) -> Path:
    target = path.parent / f"{path.name if path.is_dir() else path.stem}.om"
    if target.resolve() == path.resolve():  # never replace the stub we read from
        target = path.with_name(f"{path.stem}.converted.om")
    return target


def _stage_inputs(bundle: Path, checked: CheckedBundle, work: Path) -> None:
    """The graph and its external data (validated paths, listed in the file table) as symlinks in ``work``:
    ATC only reads them. Nothing else of the bundle reaches ATC; atc/ is rendered into ``work``."""
    from .read import external_data_files

    model_file = checked.manifest["model"]["file"]
    for rel in [model_file, *external_data_files(checked.model)]:
        src, dst = bundle / rel, work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.symlink(src.resolve(), dst)
        except OSError:
            shutil.copy2(src, dst)


def convert(artifact: str | Path, output: str | Path | None = None, soc_version: str | None = None,
            overwrite: bool = False) -> dict[str, Any]:
    """Compile a bundle (see ``convert_one``); a multi-graph bundle (a directory or a zip) gets one ATC run per
    graph, every ``.om`` in one output directory (``bundle.multi_check.convert_multi``)."""
    from .multi_check import convert_multi, opened_multi
    with opened_multi(Path(artifact)) as directory:
        if directory is not None:
            return convert_multi(directory, output, soc_version, overwrite, convert_one, Path(artifact))
    return convert_one(artifact, output, soc_version, overwrite)


def convert_one(artifact: str | Path, output: str | Path | None = None, soc_version: str | None = None,
                overwrite: bool = False) -> dict[str, Any]:
    """Compile an atc_ready/om bundle (a directory or a single-file bundle) or an om-stub into a real ``.om``
    with ATC (the CI/CD deploy step).

    The bundle is checked against its manifest first (files, graph, ATC options; see bundle_check). ATC runs
    the command cann-export renders itself from the validated options (``soc_version`` from the bundle or the
    argument, matching an Ascend SoC pattern; ``--model``/``--output`` fixed to the work directory), never a
    command read from the manifest. A graph holding Q/DQ goes through AMCT's convert_qat_model first, with the
    fixed command (``atc.amct_run``), and ATC converts its deploy model. The ``.om`` is renamed into place and
    ATC's log kept beside it as ``<name>.atc.log`` (AMCT's as ``<name>.amct.log``)."""
    from . import rederive
    from .read import open_bundle

    path = Path(artifact)
    if not path.exists():
        raise ValidateError("not found; pass an atc_ready/om bundle directory or an om-stub", path=path,
                            stage="convert")
    if soc_version is not None:
        rederive.check_soc(soc_version)
    with open_bundle(path) as (bundle, container):
        try:
            checked = rederive.check_bundle(bundle, container=container, stage="convert")
        except ValidateError as e:
            e.stage = "convert"
            raise
        if checked.options is None:
            raise ValidateError("the bundle holds no ATC options; export with --format atc_ready or om",
                                path=path, stage="convert")
        quantized = amct_run.is_quantized(checked.model)
        atc, found = _convert_tools(quantized)
        out = Path(output) if output else _default_output(path)
        atomic.check_target(out, overwrite)
        log_target = out.with_name(f"{out.stem}.atc.log")
        work = atomic.staging_dir(out)
        amct: dict[str, Any] = {}
        try:
            _stage_inputs(bundle, checked, work)
            args = rederive.render(checked, work, soc_version)["command"]
            soc = checked.options.soc_version if soc_version is None else soc_version
            if quantized:
                amct = _convert_amct(checked, work, out, path, (found or {}).get("version"))
            code, text = run_atc(args, work, work / "atc.log", atc)
            os.replace(work / "atc.log", log_target)
            if code != 0:
                raise AtcError(f"ATC failed (exit {code}): {atc_error_text(text)}. Full log: {log_target}",
                               path=path, stage="convert")
            om = work / f"{rederive.OUTPUT_STEM}.om"
            if not om.is_file():
                raise AtcError(f"ATC exited 0 but wrote no {om.name}; see {log_target}", path=path, stage="convert")
            digest, size = digests.sha256_file(om), om.stat().st_size
            atomic.check_target(out, overwrite)
            os.replace(om, out)
        finally:
            atomic.discard(work)
    return {"ok": True, "input": str(path), "output": str(out), "log": str(log_target), "soc_version": soc,
            "command": args, "exit_code": 0, "om": {"kind": "atc", "sha256": digest, "size": size},
            **({"amct": amct} if amct else {})}


def _convert_tools(quantized: bool) -> tuple[str, dict[str, Any] | None]:
    """``atc``, and AMCT for a quantized graph; refuses (exit 2) naming what to install when one is missing."""
    atc = find_atc()
    found = amct_run.find_amct() if quantized else None
    missing = [] if atc else [f"`atc` is not on PATH; {INSTALL_HINT}"]
    if quantized and found is None:
        missing.append(f"{amct_run.MISSING}; {amct_run.INSTALL_HINT}")
    if missing or atc is None:
        raise ExportError("; and ".join(missing) + ", then run convert again", stage="convert")
    return atc, found


def _convert_amct(checked: CheckedBundle, work: Path, out: Path, path: Path, version: str | None) -> dict[str, Any]:
    """AMCT's step of ``convert`` in ``work``; its log is kept beside ``out`` as ``<name>.amct.log``."""
    log_target = out.with_name(f"{out.stem}.amct.log")
    command, code, text = amct_run.run_amct(checked.manifest["model"]["file"], work, work / "amct.log")
    os.replace(work / "amct.log", log_target)
    try:
        amct_run.deploy_model(work, code, text, str(log_target))
    except amct_run.AmctError as e:
        e.path, e.stage = str(path), "convert"
        raise
    return {"version": version, "command": command, "exit_code": code, "log": str(log_target)}
