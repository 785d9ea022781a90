"""Rendering the ATC command line for an exported graph (``atc/convert.sh``)."""
from __future__ import annotations

import shlex
from typing import Any

# Hints passed through verbatim as ``--key=value`` (validated in detail by the ATC hints plugin).
PASSTHROUGH = ("op_select_implmode", "optypelist_for_implmode", "input_format", "dynamic_batch_size",
               "out_nodes", "log", "precision_mode_v2", "keep_dtype", "fusion_switch_file", "insert_op_conf")
ADVISORY = ("insert_teacache", "memory_layout")  # kept in the manifest only


def input_shape_arg(inputs: list[dict[str, Any]]) -> str:
    return ";".join(f"{i['name']}:{','.join(str(d) if isinstance(d, int) and d > 0 else '-1' for d in i['shape'])}"
                    for i in inputs)


def atc_arguments(model_file: str, output_stem: str, inputs: list[dict[str, Any]], soc_version: str,
                  precision_mode: str, hints: dict[str, Any]) -> list[str]:
    """The ``atc`` argument vector, in the order ATC documents them."""
    args = ["atc", "--framework=5", f"--model={model_file}", f"--output={output_stem}",
            f"--soc_version={hints.get('soc_version', soc_version)}"]
    shape = hints.get("input_shape") or input_shape_arg(inputs)
    if shape:
        args.append(f"--input_shape={shape}")
    if "precision_mode_v2" not in hints:
        args.append(f"--precision_mode={hints.get('precision_mode', precision_mode)}")
    for key in PASSTHROUGH:
        if key in hints:
            value = hints[key]
            value = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            args.append(f"--{key}={value}")
    return args


def convert_script(args: list[str]) -> str:
    return ("#!/usr/bin/env bash\n"
            "# Converts model.onnx to an Ascend offline model (.om). Run on a machine with CANN installed.\n"
            "set -euo pipefail\n"
            'cd "$(dirname "$0")/.."\n'
            + " ".join(shlex.quote(a) for a in args) + ' "$@"\n')
