"""Output formats: a single ``.onnx`` file, the ``atc_ready`` directory bundle, and ``onnx_bundle`` (the graph with
its manifest and parity data, no ATC files)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atc.command import render as render_atc
from ..fs import atomic
from ..options import ATC_OPSETS
from .manifest_build import build_manifest, dumps, write_manifest
from .parity_store import write_parity_data
from .single_file import ARCHIVE_SUFFIXES, commit_archive

if TYPE_CHECKING:
    from ..context import ExportContext


def _external(ctx: ExportContext) -> bool:
    from ..graph.onnx_helpers import weights_bytes

    mode = ctx.options.external_data
    return mode == "always" or (mode == "auto" and weights_bytes(ctx.onnx_model) > ctx.options.external_data_threshold)


def _save(ctx: ExportContext, path: Path) -> list[Path]:
    from ..capture import large_graph
    from ..graph import onnx_stream
    from ..graph.onnx_helpers import save_model

    if large_graph.state(ctx) is not None:  # the captured graph's data file moves in; nothing is re-encoded
        return large_graph.save(ctx.onnx_model, path, ctx)
    placed: dict[str, tuple[int, int]] = {}
    files = save_model(ctx.onnx_model, path, _external(ctx), placed)  # onnx's external save slims the graph itself
    if placed and not _quantized(ctx):  # the stages after write keep the structure, the weights read from the file
        ctx.onnx_model = onnx_stream.referring_to(ctx.onnx_model, path, placed)
    return files


def _quantized(ctx: ExportContext) -> bool:
    """A Q/DQ graph (or one becoming it): its analyses after write (AMCT's, the int8 emulation) read its weights
    from the graph in memory, so it stays whole."""
    decisions = ctx.decisions
    return (decisions is None or decisions.quantized or decisions.fake_quantized or bool(ctx.quant_table)
            or any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in ctx.onnx_model.graph.node))


def _finalize_parity(ctx: ExportContext, staging: Path) -> None:
    """After validate (whose verdict decides what is stored: parity_store.py): the parity data, then parity.json."""
    if ctx.options.validate and ctx.input_sets and not (staging / "parity").exists():
        write_parity_data(ctx, staging / "parity")
    if ctx.reports.parity is not None:
        atomic.write_text(staging / "parity.json", dumps(ctx.reports.parity.to_dict()))


MODEL_FILES = ("model.onnx", "model.onnx.data")  # the graph, and its weights past external_data_threshold
PARITY_FILES = ("parity.json", "parity/inputs.safetensors", "parity/expected.safetensors")
ATC_FILES = ("atc/convert.sh", "atc/keep_dtype.cfg", "atc/fusion_switch.cfg", "atc/aipp.cfg",
             "atc/modify_mixlist.json", "atc/customize_dtypes.cfg",
             "atc/customize_dtypes.fix.cfg")
TRAINING_FILES = ("training/weights.safetensors", "training/optimizer.safetensors")


def _write_training_state(ctx: ExportContext, directory: Path, prefix: str) -> list[Path]:
    from .training_state import save_optimizer_state, save_weights

    if not ctx.options.include_optimizer_state:
        return []
    weights, optim = directory / f"{prefix}weights.safetensors", directory / f"{prefix}optimizer.safetensors"
    save_weights(ctx.model, weights)
    save_optimizer_state(ctx.options.optimizer, optim)
    return [weights, optim]


class OnnxFormat:
    name = "onnx"
    description = ("one .onnx file (weights in <name>.onnx.data past 1 GB of weights); a model of several graphs "
                   "(a decoder with past): a directory of onnx_bundle components")
    is_directory = False
    atc_opsets = None  # any opset onnx supports
    device_parity = False
    lint = False

    def targets(self, output: Path) -> list[Path]:
        """The paths an export to ``output`` creates: ``-o m.onnx`` is that file, any other name gets ``.onnx``."""
        return [output if output.suffix == ".onnx" else output.with_name(output.name + ".onnx")]

    def writes(self, output: Path) -> tuple[str, ...]:
        """``m.onnx``, its external data ``m.onnx.data`` and ``--include-optimizer-state``'s ``m.*.safetensors``:
        the only files ``commit`` moves beside the output."""
        from glob import escape  # the output's own name, not a pattern: m[1].onnx is that file only

        name = self.targets(output)[0].name
        stem = escape(Path(name).stem)
        return escape(name), f"{escape(name)}.data", f"{stem}.weights.safetensors", f"{stem}.optimizer.safetensors"

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]:
        name = ctx.output_path.name if ctx.output_path.suffix == ".onnx" else ctx.output_path.name + ".onnx"
        ctx.output_path = ctx.output_path.with_name(name)
        files = _save(ctx, staging / name)
        ctx.onnx_path = files[0]
        return files + _write_training_state(ctx, staging, f"{ctx.output_path.stem}.")

    def finalize(self, ctx: ExportContext, staging: Path) -> None:
        ctx.manifest = build_manifest(ctx, None)

    def component_format(self) -> str:
        """Several graphs in this format: one directory of ``onnx_bundle`` components (validate re-derives them)."""
        return OnnxBundleFormat.name

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]:
        from .staged import matches

        ours = self.writes(ctx.output_path)  # what the staging holds beyond them was refused before commit
        names = sorted((p.name for p in staging.iterdir() if matches(p.name, ours)),
                       key=lambda n: n == ctx.output_path.name)
        from ..fs.targets import our_external_data

        return atomic.commit_files(staging, names, ctx.output_path.parent, ctx.options.overwrite,
                                   old_companions=our_external_data)


class AtcReadyFormat:
    name = "atc_ready"
    writes_program = True  # torch/program.pt2 (bundle/torch_program.py)
    description = ("directory: model.onnx, manifest.json, parity.json, parity data and atc/convert.sh; "
                   "-o NAME.zip / NAME.pth writes the same bundle as one zip file")
    is_directory = True
    atc_opsets = ATC_OPSETS
    device_parity = True
    lint = True
    writes_beside: tuple[str, ...] = ()  # what a format built on this one stages beyond the bundle (om: model.om)

    def targets(self, output: Path) -> list[Path]:
        if output.suffix == ".om":
            from ..errors import OptionsError

            raise OptionsError(f"{self.name} writes a directory or a single-file bundle "
                               f"({', '.join(ARCHIVE_SUFFIXES)}), not an .om; pass --format om for NAME.om",
                               path=output)
        return [output]

    def writes(self, output: Path) -> tuple[str, ...]:
        from .staged import carried_names
        from .torch_program import PROGRAM_FILE

        return ("manifest.json", *MODEL_FILES, *PARITY_FILES, "report.html", *ATC_FILES, PROGRAM_FILE,
                *TRAINING_FILES, *carried_names(), *self.writes_beside)

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]:
        files = _save(ctx, staging / "model.onnx")
        ctx.onnx_path = files[0]
        files += render_atc(ctx, staging)
        from .torch_program import write_program  # the zoo loads the model back from this program

        files += write_program(ctx, staging)
        files += write_carried(ctx, staging)
        training = staging / "training"
        if ctx.options.include_optimizer_state:
            training.mkdir()
        return files + _write_training_state(ctx, training, "")

    def finalize(self, ctx: ExportContext, staging: Path) -> None:
        _finalize_parity(ctx, staging)
        if ctx.reports.precision_fix is not None and ctx.reports.precision_fix.kept:
            render_atc(ctx, staging)  # keep_dtype.cfg now holds what --fix-precision kept
        from ..report.write_report import write_into

        write_into(ctx, staging)  # before the manifest, whose file table then lists it
        write_manifest(ctx, staging)

    def manifest_problems(self, manifest: dict[str, Any]) -> list[str]:
        """An ATC bundle's manifest must hold its ATC options (their shape is checked with every manifest's)."""
        from .manifest_schema import atc_problems, has_atc

        return [] if has_atc(manifest) else atc_problems(manifest.get("atc"))

    def component_format(self) -> str:
        return self.name

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]:
        if ctx.output_path.suffix in ARCHIVE_SUFFIXES:  # a file path is a file: the bundle as one zip
            ctx.final_onnx = f"{ctx.output_path}!/{ctx.onnx_path.name}"
            return commit_archive(staging, ctx.output_path, ctx.options.overwrite)
        atomic.commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(p for p in ctx.output_path.rglob("*") if p.is_file())


class OnnxBundleFormat:
    """The ONNX graph as a bundle ``validate`` re-derives, with nothing of ATC: what each graph of a
    ``--format onnx`` multi-graph export is written as."""

    name = "onnx_bundle"
    description = ("directory: model.onnx, manifest.json, parity.json and parity data (validate re-runs parity); "
                   "no ATC files. Each graph of a --format onnx multi-graph export")
    is_directory = True
    atc_opsets = None
    device_parity = False
    lint = False

    def writes(self, output: Path) -> tuple[str, ...]:
        from .staged import carried_names

        return ("manifest.json", *MODEL_FILES, *PARITY_FILES, *carried_names())

    def write(self, ctx: ExportContext, staging: Path) -> list[Path]:
        files = _save(ctx, staging / "model.onnx")
        ctx.onnx_path = files[0]
        files += write_carried(ctx, staging)
        return files

    def finalize(self, ctx: ExportContext, staging: Path) -> None:
        _finalize_parity(ctx, staging)
        write_manifest(ctx, staging)

    def component_format(self) -> str:
        return self.name

    def commit(self, ctx: ExportContext, staging: Path) -> list[Path]:
        atomic.commit_dir(staging, ctx.output_path, ctx.options.overwrite)
        return sorted(p for p in ctx.output_path.rglob("*") if p.is_file())


MAX_CARRIED_BYTES = 64 << 20


def write_carried(ctx: ExportContext, staging: Path) -> list[Path]:
    """The files the loader read to carry along (``LoadedModel.extras["bundle_files"]``, ``{relative path:
    bytes}``: a model directory's config and tokenizer files), written under ``staging``; the manifest's file
    table lists them like every other file. Each path must be a plain relative path of at most two parts."""
    import re

    from ..errors import WriteError

    carried = ctx.loaded.extras.get("bundle_files") if ctx.loaded is not None else None
    if not carried:
        return []
    part = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
    written, total = [], 0
    for rel, data in carried.items():
        parts = str(rel).split("/")
        if not (1 <= len(parts) <= 2 and all(part.fullmatch(p) and ".." not in p for p in parts)
                and isinstance(data, bytes)) or rel in ("manifest.json", "model.onnx", "parity.json"):
            raise WriteError(f"a loader asked to carry {str(rel)[:80]!r}, not a plain relative file name; refused")
        total += len(data)
        if total > MAX_CARRIED_BYTES:
            raise WriteError(f"the files to carry into the bundle pass {MAX_CARRIED_BYTES >> 20} MB; refused at {rel}")
        target = staging.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(target, data)
        written.append(target)
    return written


