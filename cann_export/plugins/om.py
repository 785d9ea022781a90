"""The ``om`` format (an atc_ready bundle plus ``model.om``) and ``cann-export convert``.

With CANN's ``atc`` on PATH, ``model.om`` is the real offline model ATC compiles from the bundle's rendered
command. Without it, ``model.om`` is an om-stub (see ``cann_export.om_stub``): an om header over a zip of
the bundle, which ``cann-export convert`` later turns into the real model on a machine with CANN.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .. import atomic
from ..errors import EXIT_STAGE_FAILED, ExportError, ValidateError, WriteError
from ..hookspecs import hookimpl
from ..manifest import build_manifest, dumps
from ..om_stub import extract_stub, read_header, read_stub, write_stub  # noqa: F401 - the module API
from .formats import AtcReadyFormat

OM_FILE = "model.om"
ATC_LOG = "atc/atc.log"
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
    """The gist of a failed ATC run: its error-code lines (``E19010: ...``) with the line that follows
    each, or else its last meaningful lines."""
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


def _output_stem(args: list[str]) -> str:
    for a in args:
        if a.startswith("--output="):
            return a.split("=", 1)[1]
    return "model"


class OmFormat(AtcReadyFormat):
    name = "om"
    description = ("directory: the atc_ready bundle plus model.om (compiled by ATC when `atc` is on PATH, "
                   "else an om-stub for `cann-export convert`)")
    is_directory = True

    def write(self, ctx: Any, staging: Path) -> list[Path]:
        files = super().write(ctx, staging)
        atc = find_atc()
        if atc is None:
            ctx.reports["atc"].update({"ran": False, "exit_code": None, "om": {"file": OM_FILE, "kind": "stub"}})
            return files
        return files + self._compile(ctx, staging, atc)

    def _compile(self, ctx: Any, staging: Path, atc: str) -> list[Path]:
        report = ctx.reports["atc"]
        args = list(report["command"])
        code, output = run_atc(args, staging, staging / ATC_LOG, atc)
        report.update({"ran": True, "exit_code": code, "atc": atc, "log": ATC_LOG, "ran_command": args})
        om = staging / f"{_output_stem(args)}.om"
        if code != 0:
            raise AtcError(f"ATC failed (exit {code}): {atc_error_text(output)}. Fix the model or the ATC hints "
                           "(--atc-hint), or export --format atc_ready and convert on the device host",
                           path=_source(ctx))
        if not om.is_file():
            raise AtcError(f"ATC exited 0 but wrote no {om.name}: {atc_error_text(output)}", path=_source(ctx))
        report["om"] = {"file": om.name, "kind": "atc", "sha256": atomic.sha256_file(om), "size": om.stat().st_size}
        return [om, staging / ATC_LOG]

    def finalize(self, ctx: Any, staging: Path) -> None:
        report = ctx.reports["atc"]
        if report.get("ran"):
            if report.get("ran_command") != report.get("command"):  # a later stage changed the ATC options
                self._compile(ctx, staging, report["atc"])
            report.pop("ran_command", None)
            super().finalize(ctx, staging)
            return
        super().finalize(ctx, staging)  # the bundle the stub carries, manifest.json included
        header = write_stub(staging / OM_FILE, staging, _model_name(ctx))
        om = staging / OM_FILE
        report["om"] = {"file": OM_FILE, "kind": "stub", "sha256": atomic.sha256_file(om),
                        "size": om.stat().st_size, "payload_sha256": header["checksum"]}
        ctx.manifest = build_manifest(ctx, staging)  # now listing model.om too
        atomic.write_text(staging / "manifest.json", dumps(ctx.manifest))


def _source(ctx: Any) -> str | None:
    return ctx.loaded.source_path if getattr(ctx, "loaded", None) else None


def _model_name(ctx: Any) -> str:
    src = _source(ctx)
    if src:
        return Path(src).stem
    model = getattr(ctx, "model", None)
    return type(model).__name__ if model is not None else ctx.output_path.name


# ---------------------------------------------------------------- convert


def _with_soc(args: list[str], soc_version: str | None) -> list[str]:
    if not soc_version:
        return list(args)
    flag = f"--soc_version={soc_version}"
    out = [flag if a.startswith("--soc_version=") else a for a in args]
    return out if flag in out else [*out, flag]


def _default_output(path: Path, soc: str) -> Path:
    target = path.parent / f"{path.name if path.is_dir() else path.stem}.om"
    if target.resolve() == path.resolve():  # never replace the stub we read from
        target = path.with_name(f"{path.stem}.{soc}.om")
    return target


def _stage_inputs(bundle: Path, manifest: dict[str, Any], work: Path, om_name: str) -> None:
    """Make the bundle's files visible in ``work`` for ATC: the graph (and its external data) as symlinks,
    since ATC only reads them; the rest as copies, so nothing ATC writes can reach the input."""
    model_file = (manifest.get("model") or {}).get("file") or "model.onnx"
    for rel in manifest.get("files") or {}:
        if rel.startswith("training/") or rel in (om_name, ATC_LOG):
            continue
        src, dst = bundle / rel, work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.startswith(model_file):
            try:
                os.symlink(src.resolve(), dst)
                continue
            except OSError:
                pass
        shutil.copy2(src, dst)


def convert(artifact: str | Path, output: str | Path | None = None, soc_version: str | None = None,
            overwrite: bool = False) -> dict[str, Any]:
    """Compile an atc_ready/om bundle or an om-stub into a real ``.om`` with ATC (the CI/CD deploy step).

    The bundle is checked against its manifest first. ATC runs with the bundle's rendered command
    (``--soc_version`` replaced when given) in a work directory beside the output; the ``.om`` is renamed
    into place and ATC's log kept beside it as ``<name>.atc.log``."""
    from ..bundle import open_artifact, read_bundle, verify_files

    path = Path(artifact)
    if not path.exists():
        raise ValidateError("not found; pass an atc_ready/om bundle directory or an om-stub", path=path,
                            stage="convert")
    with open_artifact(path) as bundle:
        manifest = read_bundle(bundle)
        verify_files(bundle, manifest)
        command = (manifest.get("atc") or {}).get("command")
        if not command:
            raise ValidateError("the manifest holds no ATC command; export with --format atc_ready or om",
                                path=path, stage="convert")
        atc = find_atc()
        if atc is None:
            raise ExportError(f"`atc` is not on PATH; {INSTALL_HINT}, then run convert again", stage="convert")
        args = _with_soc(command, soc_version)
        soc = next(a.split("=", 1)[1] for a in args if a.startswith("--soc_version="))
        out = Path(output) if output else _default_output(path, soc)
        atomic.check_target(out, overwrite)
        log_target = out.with_name(f"{out.stem}.atc.log")
        om_name = f"{_output_stem(args)}.om"
        work = atomic.staging_dir(out)
        try:
            _stage_inputs(bundle, manifest, work, om_name)
            code, text = run_atc(args, work, work / "atc.log", atc)
            os.replace(work / "atc.log", log_target)
            if code != 0:
                raise AtcError(f"ATC failed (exit {code}): {atc_error_text(text)}. Full log: {log_target}",
                               path=path, stage="convert")
            om = work / om_name
            if not om.is_file():
                raise AtcError(f"ATC exited 0 but wrote no {om_name}; see {log_target}", path=path, stage="convert")
            digest, size = atomic.sha256_file(om), om.stat().st_size
            atomic.check_target(out, overwrite)
            os.replace(om, out)
        finally:
            atomic.discard(work)
    return {"ok": True, "input": str(path), "output": str(out), "log": str(log_target), "soc_version": soc,
            "command": args, "exit_code": 0, "om": {"sha256": digest, "size": size}}


@hookimpl
def register_formats(register):
    register(OmFormat())


@hookimpl
def register_commands(cli):
    import json

    import click

    @cli.command("convert")
    @click.argument("artifact", type=click.Path(path_type=str))
    @click.option("--soc-version", default=None, help="ATC --soc_version (default: the one the bundle was exported for).")
    @click.option("-o", "--output", type=click.Path(path_type=str), default=None,
                  help="The .om to write (default: beside the input, <name>.om).")
    @click.option("--overwrite", is_flag=True, help="Replace an existing output.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON result object on stdout.")
    def convert_cmd(artifact: str, soc_version: str | None, output: str | None, overwrite: bool,
                    as_json: bool) -> None:
        """Compile an atc_ready/om bundle or an om-stub into a real .om with CANN's ATC."""
        from ..cli import run_guarded

        def body() -> int:
            click.echo(f"converting {artifact} with atc ...", err=True)
            result = convert(artifact, output, soc_version, overwrite)
            if as_json:
                click.echo(json.dumps(result))
            else:
                click.echo(f"wrote {result['output']} (soc_version {result['soc_version']}; log {result['log']})")
            return 0

        run_guarded(as_json, body)
