"""The ``export`` command's options, generated from ``ExportOptions`` (and ``Tolerance``): the dataclass is
the single source of names, defaults and types; this table adds only what a command line needs (the flag's
spelling, its help, how a string becomes the field's value). Choices come from the options' constants or,
for formats, exporters and backends, from the plugin registries at run time."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from .. import options as opts_mod


@dataclass(frozen=True)
class Flag:
    help: str
    decls: tuple[str, ...] = ()  # default: --field-name
    choices: Any = None  # a tuple, or a click ParamType (registry choices)
    multiple: bool = False
    path: bool = False
    parse: Callable[[Any], Any] | None = None  # CLI value -> field value
    variants: tuple[tuple[str, Any, str], ...] = ()  # (flag, flag_value, help): several flags, one field


def _key_values(flag: str) -> Callable[[Any], Any]:
    return lambda pairs: opts_mod.parse_key_values(pairs, flag)


class Registered(click.Choice):
    """A choice among the names a registry holds now (formats, exporters, backends), plus fixed ``extra``
    values: plugins' names are accepted and listed in --help exactly like the built-ins'."""

    def __init__(self, registry_name: str, extra: tuple[str, ...] = ()) -> None:
        self.registry_name, self.extra = registry_name, extra
        super().__init__([])

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from ..hooks.manager import registry

        found = getattr(registry(), self.registry_name)()
        names = list(found) if isinstance(found, dict) else [obj.name for obj in found]
        return (*self.extra, *sorted(names))

    @choices.setter
    def choices(self, value: Any) -> None:  # click.Choice.__init__ assigns it
        pass


def _mib(raw: Any) -> int | str | None:
    """``--stored-parity-mib``: 'auto' (sized to the graph), whole MiB >= 0, or 'all' (None: no cap)."""
    text = str(raw).strip().lower()
    if text == "all":
        return None
    if text == "auto":
        return "auto"
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise opts_mod.OptionsError(f"--stored-parity-mib {raw!r} is not a whole number of MiB; pass e.g. "
                                    "auto, 64, 0 or 'all'")
    return int(text)


def _whole(flag: str) -> Callable[[Any], Any]:
    """A flag's whole number, read as text so a non-number is the options' refusal (exit 2, named), not click's;
    its range is ExportOptions.check's."""
    def parse(raw: Any) -> Any:
        text = str(raw).strip()
        if not re.fullmatch(r"-?[0-9]{1,9}", text):
            raise opts_mod.OptionsError(f"{flag} {raw!r} is not a whole number")
        return int(text)

    return parse


def _registered(name: str, extra: tuple[str, ...] = ()) -> Any:
    return Registered(name, extra)


def _model_flags() -> dict[str, Flag]:
    """A model directory's task, remote code and a decoder's cache form."""
    return {
        "task": Flag("A Hugging Face model directory's task, in Optimum's names (text-classification, "
                     "feature-extraction, ...); default: detected from config.json's architectures."),
        "kv_cache": Flag("A decoder's KV cache, exported as prefill + decode graphs: 'dynamic' (a growing cache, "
                         "symbolic lengths) or 'static:N[,batch=B]' (N fixed slots, B fixed rows, default 1: every "
                         "shape static, for ATC's static path). Implies --task text-generation-with-past.",
                         decls=("--kv-cache",)),
        "decode_tokens": Flag("New tokens the decode graph takes per step (a decoder's decode, an encoder-decoder's "
                              "decoder_with_past): 1, or N for chunked prefill or speculative decoding's drafts "
                              "(input_ids, position_ids and the mask sized for N; parity checks it at N).",
                              parse=_whole("--decode-tokens")),
        "parity_full_ranges": Flag("Run parity at the dynamic dimensions' full range ends (a multi-graph component's "
                                   "or a single graph's) even where one input set there passes the element budget "
                                   "(a third of the weights; the shapes left out are listed in "
                                   "parity.shape_budget). Slower, more memory."),
        "trust_remote_code": Flag("Allow a model directory whose config.json has an auto_map (its own Python "
                                  "classes, which run on load; inside the load sandbox)."),
    }


def _parity_flags() -> dict[str, Flag]:
    """Parity: whether it runs, on what, what the bundle keeps of it, a trace accepted unchecked."""
    return {
        "validate": Flag("Run the numeric parity checks.", decls=("--validate/--no-validate",)),
        "parity_data": Flag("safetensors or .npz of real input samples for parity (NAME of shape [N, ...] or keys "
                            "N/NAME); metrics over all samples.", path=True),
        "stored_parity_mib": Flag("Parity sets the bundle keeps for `validate`: 'auto' (default) sizes them to the "
                                  "graph (2..64 MiB; the example always kept), N keeps every set at the example's "
                                  "shape and N MiB of the other shapes (whole shapes, smallest first); the "
                                  "manifest's parity.stored lists the rest; a failed export keeps every set; 'all' "
                                  "keeps every set.",
                                  parse=_mib),
        "parity_coverage": Flag("Which dynamic shapes parity runs at: 'axes' (default: each dynamic axis at its gears, "
                                "or its range's ends and middle, the others at the example's size) or 'full' (also "
                                "every combination of the gears ATC builds, or of the range ends; a multi-graph "
                                "component also past the element budget). The verdict and inspect say what parity "
                                "covered of what ATC builds.", decls=("--parity",), choices=("axes", "full")),
        "accept_trace_specialization": Flag("Accept a traced graph (TorchScript fallback) that tracing specialised "
                                            "to the example's path."),
    }


def _precision_file_flags() -> dict[str, Flag]:
    return {
        "modify_mixlist": Flag("JSON file of edits to the SoC's mixed-precision lists in Ascend IR op types "
                               "({\"black-list\": {\"to-add\": [...], \"to-remove\": [...]}, \"white-list\": ...}), "
                               "rendered as ATC's --modify_mixlist and emulated by device parity.", path=True),
        "customize_dtypes": Flag("ATC --customize_dtypes cfg file (Opname::InputDtype:...,OutputDtype:... or "
                                 "OpType::<Ascend IR type>:InputDtype:...,OutputDtype:...), rendered into atc/ and "
                                 "emulated by device parity.", path=True),
    }


def _fix_flags() -> dict[str, Flag]:
    """The fixes an export may apply to what it writes."""
    return {
        "fix_lint": Flag("Apply the ATC lint's mechanical, value-preserving fixes to the graph (an empty Slice feeding "
                         "Concat, a whole-input AveragePool over 255, a rank-5 reflect Pad); parity judges the fixed "
                         "graph and the manifest records each fix (lint.atc-lint.fixes)."),
    }


def flags() -> dict[str, Flag]:
    return {**_model_flags(), **_parity_flags(), **_precision_file_flags(), **_fix_flags(),
        "export_format": Flag("atc_ready (directory bundle for ATC; a file name such as x.pth writes it as one zip), "
                              "om (the bundle plus model.om: real with atc on PATH, else an om-stub) or onnx (one "
                              ".onnx file).", decls=("-f", "--format"), choices=_registered("formats")),
        "model_class": Flag("pkg.module:Callable that builds the module for a state_dict / safetensors file."),
        "model_kwargs": Flag("JSON object of keyword arguments for --model-class.", parse=opts_mod.parse_model_kwargs),
        "trust_pickle": Flag("Allow unpickling a whole nn.Module (runs code from the file: only for files you "
                             "trust)."),
        "sandbox": Flag("", variants=(("--require-sandbox", "require", "Fail when the model file cannot load in the "
                                                                       "sandbox (Landlock + seccomp); for CI."),
                                      ("--no-sandbox", "off", "Load the model file in this process, unconfined."))),
        "input_shapes": Flag("NAME:D1,D2,...[:DTYPE]; repeatable.", decls=("--input-shape",), multiple=True,
                             parse=list),
        "dynamic": Flag("NAME:AXIS=[DIM][:LO..HI|:G1,G2,...][,AXIS=...], e.g. input_ids:0=batch:1..16,1=seq:1..512, "
                        "x:0=batch:1,2,4,8; or by dimension name, every axis of that name: DIM=LO..HI|G1,G2,..., "
                        "e.g. batch_size=1..8 (multi-graph: [COMP:]DIM=...). Gears on one dimension leave the "
                        "dimensions not asked for static; repeatable.", multiple=True, parse=list),
        "static_shapes": Flag("Export every input at the example's shape: no dynamic axes from a .pt2's Dims or a "
                              "Hugging Face task's axes."),
        "example_inputs_file": Flag("safetensors or .npz file of inputs named after the forward parameters.",
                                    decls=("--example-inputs",), path=True),
        "opset": Flag("ONNX opset (a format headed for ATC: the opsets it declares, 11..18 for atc_ready/om)."),
        "strict_opset": Flag("Require exactly --opset (by default another opset the format accepts is kept and "
                             "recorded)."),
        "cann_version": Flag("Target CANN release for the ATC lint."),
        "lint": Flag("ATC lint errors fail the export (error) or are only reported (warn).",
                     choices=opts_mod.LINT_MODES),
        "fix_precision": Flag("Keep the nodes (or whole modules) where device precision diverges in fp32 until "
                              "parity passes; says so when it cannot."),
        "soc_version": Flag("ATC --soc_version, e.g. Ascend310P3 or Ascend910B1; its float overflow mode (saturation, "
                            "or Inf/NaN on 910B*/910_93*) is the one device-precision parity emulates."),
        "allow_unknown_soc": Flag("Export for a --soc-version outside the tool's list of ATC's SoC names (one newer "
                                  "than this release): a warning, recorded in the manifest, instead of a refusal."),
        "precision_mode": Flag("ATC --precision_mode (its values are checked, with the list, before any work)."),
        "metadata": Flag("KEY=VALUE stored in the ONNX metadata and the manifest; repeatable.", multiple=True,
                         parse=_key_values("--metadata")),
        "atc_hints": Flag("[COMPONENT:]KEY=VALUE ATC option kept in the manifest and convert.sh; repeatable.",
                          decls=("--atc-hint",), multiple=True, parse=_key_values("--atc-hint")),
        "exporter": Flag("ONNX exporter (auto: each in priority order until one gives a valid graph).",
                         choices=_registered("exporters", ("auto",))),
        "external_data": Flag("Weights in a .data file beside the graph (auto: past 1 GB of weights).",
                              choices=opts_mod.EXTERNAL_DATA),
        "simplify": Flag("Run onnxsim (kept only when outputs are unchanged).", decls=("--simplify/--no-simplify",)),
        "quantize": Flag("", variants=(("--qat", "qat", "Quantization-aware training to int8 (needs "
                                                        "--calibration-data)."),
                                       ("--ptq", "ptq", "Post-training int8 quantization: calibration only."))),
        "calibration_data": Flag("safetensors or .npz file of input batches for calibration / QAT.", path=True),
        "qat_steps": Flag("QAT fine-tuning steps."),
        "qat_lr": Flag("QAT learning rate."),
        "backend": Flag("Device the model runs on for QAT and the reference (auto: the highest-priority available "
                        "backend that allows auto: the real NPU, else the CPU).",
                        choices=_registered("backends", ("auto",))),
        "publish": Flag("Publish the artifact to the model zoo under this name."),
        "zoo": Flag("Model zoo location (directory or s3://bucket/prefix; default $CANN_MODEL_ZOO or the user "
                    "cache)."),
        "require_atc": Flag("--format om: fail (exit 3) when `atc` is not on PATH instead of writing an om-stub."),
        "overwrite": Flag("Replace an existing output (only an artifact cann-export wrote)."),
    }


TOLERANCE_FLAGS = {
    "atol": "Parity absolute tolerance (default {default}).",
    "rtol": "Parity relative tolerance (default {default}).",
    "min_cosine": "Parity minimum cosine similarity (default {default}).",
}


def _option(name: str, field: dataclasses.Field, flag: Flag) -> list[Callable[[Any], Any]]:
    default = field.default if field.default is not dataclasses.MISSING else None
    decls = flag.decls or (f"--{name.replace('_', '-')}",)
    if flag.variants:
        first = True
        out = []
        for spelling, value, text in flag.variants:
            extra = {"default": default} if first else {}
            out.append(click.option(spelling, name, flag_value=value, help=text, **extra))
            first = False
        return out
    kwargs: dict[str, Any] = {"help": flag.help}
    if "/" in decls[-1]:
        kwargs.update(default=default, show_default=True)
    elif isinstance(default, bool):
        kwargs["is_flag"] = True
    elif flag.multiple:
        kwargs["multiple"] = True
    else:
        kwargs["default"] = default
        kwargs["show_default"] = default is not None
        if flag.choices is not None:
            kwargs["type"] = flag.choices if isinstance(flag.choices, click.ParamType) else click.Choice(flag.choices)
        elif flag.path:
            kwargs["type"] = click.Path(path_type=str)
        elif flag.parse is not None:
            kwargs["type"] = click.STRING
        elif default is not None:
            kwargs["type"] = type(default)
    return [click.option(*decls, name, **kwargs)]


def export_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``command`` with one click option per ExportOptions field that has a Flag, plus the parity
    tolerances (None: the tool's policy)."""
    table = flags()
    fields = {f.name: f for f in dataclasses.fields(opts_mod.ExportOptions)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise RuntimeError(f"CLI flags for unknown ExportOptions fields: {unknown}")
    decorators: list[Callable[[Any], Any]] = []
    for name, flag in table.items():
        decorators += _option(name, fields[name], flag)
    for f in dataclasses.fields(opts_mod.Tolerance):
        if f.name in TOLERANCE_FLAGS:
            decorators.append(click.option(f"--{f.name.replace('_', '-')}", f.name, type=float, default=None,
                                           help=TOLERANCE_FLAGS[f.name].format(default=f.default)))
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def to_api_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """Click's values -> ``api.export`` keyword arguments (each parsed into its field's type)."""
    table = flags()
    out = {}
    for name, value in values.items():
        flag = table.get(name)
        out[name] = flag.parse(value) if flag is not None and flag.parse is not None else value
    return out
