"""``cann-export golden BUNDLE -o DIR``: a bundle's parity inputs in the layout ``msprobe compare -m offline_model``
reads, so a user with a device compares the real .om against the same graph and inputs the bundle was judged on.

msprobe's offline_model compare takes the golden model (``-gp model.onnx``, which it runs in onnxruntime itself),
the target (``-tp model.om``) and ``--input_data``: one raw ``.bin`` (or ``.npy``) file per model input, in the
graph's input order, comma separated; ``--input_shape "name:d0,d1;..."`` for a static graph. DIR gets::

    input_0.bin  input_0.npy ...   one input set (the example by default), C order, the graph's input dtype
    expected/output_0.npy ...      the PyTorch reference outputs on that set (what parity.json judged against)
    msprobe_compare.sh             the exact command (the .om path: its first argument, default BUNDLE/model.om)
    golden.json                    what is where: inputs and outputs with names, dtypes, shapes, files, the bundle's
                                   manifest sha256 and the command
The bundle is checked like ``validate`` checks it first; DIR is written whole or not at all (staged, renamed).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ..errors import OptionsError, ValidateError
from ..fs import atomic

COMMAND_FILE = "msprobe_compare.sh"


def write_golden(bundle: str | Path, output: str | Path, input_set: int = 0) -> dict[str, Any]:
    """Write the golden data of ``bundle`` (a bundle directory) into the new directory ``output``."""
    from ..inputs.parity_data import read_bundle_parity
    from .read import manifest_sha256
    from .rederive import check_bundle

    bundle, output = Path(bundle), Path(output)
    if not (bundle / "manifest.json").is_file():
        raise OptionsError("not a bundle directory (no manifest.json); pass the atc_ready / om bundle directory",
                           path=bundle, stage="golden")
    if output.exists() or output.is_symlink():
        raise OptionsError("-o: the output exists; golden data goes to a new directory", path=output, stage="golden")
    root = bundle.resolve()
    if output.resolve() == root or root in output.resolve().parents:
        raise OptionsError("-o: inside the bundle, whose file table would no longer match; pass a path outside it",
                           path=output, stage="golden")
    checked = check_bundle(bundle, stage="golden")
    feeds, expected, _tol = read_bundle_parity(bundle, checked.manifest)
    if not 0 <= input_set < len(feeds):
        raise OptionsError(f"--set {input_set}: the bundle stores {len(feeds)} input set(s) (0..{len(feeds) - 1})",
                           path=bundle, stage="golden")
    graph_inputs = [v["name"] for v in checked.manifest["model"]["inputs"]]
    graph_outputs = [v["name"] for v in checked.manifest["model"]["outputs"]]
    feed = feeds[input_set]
    missing = [n for n in graph_inputs if n not in feed]
    if missing:
        raise ValidateError(f"the parity data lacks input(s) {', '.join(missing)}; export the bundle again",
                            path=bundle, stage="golden")
    staging = atomic.staging_dir(output)
    try:
        inputs, outputs = _write_arrays(staging, feed, expected[input_set], graph_inputs, graph_outputs)
        command = msprobe_command(bundle, output, checked.manifest, inputs)
        atomic.write_text(staging / COMMAND_FILE, command)
        (staging / COMMAND_FILE).chmod(0o755)
        info = {"bundle": str(bundle), "manifest_sha256": manifest_sha256(bundle), "input_set": input_set,
                "inputs": inputs, "outputs": outputs, "command": command.strip().splitlines()[-1],
                "reads": "msprobe compare -m offline_model (--input_data: one .bin per input, graph order)"}
        atomic.write_text(staging / "golden.json", json.dumps(info, indent=2) + "\n")
        atomic.commit_dir(staging, output, overwrite=False)
    except BaseException:
        atomic.discard(staging)
        raise
    return {**info, "output": str(output)}


def _write_arrays(staging: Path, feed: dict[str, Any], expected: list[Any], graph_inputs: list[str],
                  graph_outputs: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """input_N.bin / .npy per graph input (graph order) and expected/output_N.npy per output; what each is."""
    import numpy as np

    inputs = []
    for i, name in enumerate(graph_inputs):
        arr = np.ascontiguousarray(feed[name])
        (staging / f"input_{i}.bin").write_bytes(arr.tobytes())
        np.save(staging / f"input_{i}.npy", arr, allow_pickle=False)
        inputs.append({"name": name, "dtype": str(arr.dtype), "shape": list(arr.shape),
                       "bin": f"input_{i}.bin", "npy": f"input_{i}.npy"})
    (staging / "expected").mkdir()
    outputs = []
    for k, name in enumerate(graph_outputs):
        arr = np.ascontiguousarray(expected[k])
        np.save(staging / "expected" / f"output_{k}.npy", arr, allow_pickle=False)
        outputs.append({"name": name, "dtype": str(arr.dtype), "shape": list(arr.shape),
                        "npy": f"expected/output_{k}.npy"})
    return inputs, outputs


def msprobe_command(bundle: Path, output: Path, manifest: dict[str, Any], inputs: list[dict[str, Any]]) -> str:
    """The shell script running msprobe's offline_model compare of the .om (``$1``, default the bundle's
    model.om) against the bundle's ONNX graph on the golden inputs; every path and name shell-quoted."""
    here = output.resolve()
    onnx_path = (bundle.resolve() / manifest["model"]["file"]).as_posix()
    data = ",".join((here / i["bin"]).as_posix() for i in inputs)
    static = all(isinstance(d, int) for i in manifest["model"]["inputs"] for d in i["shape"])
    shape = ";".join(f"{i['name']}:{','.join(str(d) for d in i['shape'])}" for i in inputs)
    om = '"${1:-' + _om(bundle) + '}"'  # the .om: the script's first argument, else the bundle's model.om
    args = ["msprobe", "compare", "-m", "offline_model", "-gp", shlex.quote(onnx_path), "-tp", om,
            "--input_data", shlex.quote(data), "-o", shlex.quote((here / "msprobe_out").as_posix())]
    if static:
        args += ["--input_shape", shlex.quote(shape)]
    else:  # dynamic: the stored set's shapes, as msprobe's --dym_shape_range takes one
        args += ["--dym_shape_range", shlex.quote(shape)]
    header = ("#!/bin/sh\n# msprobe's offline_model compare of the compiled .om ($1) against this bundle's graph,\n"
              "# on the input set the bundle was judged on (written by cann-export golden)\nset -e\n")
    return header + " ".join(args) + "\n"


def _om(bundle: Path) -> str:
    """The default .om path, double-quote safe (a path with a quote or $ falls back to ./model.om)."""
    path = (bundle.resolve() / "model.om").as_posix()
    return path if not any(c in path for c in '"$`\\') else "./model.om"
