"""Running AMCT's ``convert_qat_model`` before ``atc`` on a graph that holds QuantizeLinear/DequantizeLinear.

ATC takes an int8 QAT graph only as AMCT's deploy model (AscendQuant/AscendDequant; docs/research/amct.md,
sections 1 and 3). convert.sh, the om format and ``cann-export convert`` run the same fixed command: a fixed
Python script given the bundle's validated model file name and fixed output paths under ``amct/``, never a
command read from a manifest. AMCT runs in a child process: importing ``amct_onnx`` loads its custom-op
library (a segfault on mismatched ONNX Runtime headers) and writes ``./amct_log``.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import EXIT_STAGE_FAILED, WriteError

MODULE = "amct_onnx"
DISTRIBUTION = "amct-onnx"  # the wheel's distribution name (pip: "Successfully installed amct-onnx-<version>")
AMCT_DIR = "amct"
SAVE_PREFIX = f"{AMCT_DIR}/model"  # AMCT writes <prefix>_deploy_model.onnx and <prefix>_fake_quant_model.onnx
DEPLOY_MODEL = f"{SAVE_PREFIX}_deploy_model.onnx"
FAKE_QUANT_MODEL = f"{SAVE_PREFIX}_fake_quant_model.onnx"
RECORD_FILE = f"{AMCT_DIR}/record.txt"
KEPT = ("amct.log", "record.txt", "amct_log")  # in a bundle, AMCT's models are dropped once atc has read them
SCRIPT = ("import sys, amct_onnx as amct; "
          "amct.convert_qat_model(sys.argv[1], sys.argv[2], record_file=sys.argv[3])")
INSTALL_HINT = ("install AMCT from CANN's Ascend-cann-amct package: `pip3 install "
                "amct_onnx/amct_onnx-<version>-py3-none-linux_<arch>.whl`, then build its custom ops (`tar -xzf "
                "amct_onnx/amct_onnx_op.tar.gz && cd amct_onnx_op && python3 setup.py build`, with ONNX Runtime "
                "headers matching the installed onnxruntime)")
MISSING = ("the graph is int8 QuantizeLinear/DequantizeLinear, which ATC converts only after AMCT's "
           "convert_qat_model, and AMCT (the Python module amct_onnx) is not installed")


class AmctError(WriteError):
    """AMCT's convert_qat_model refused the graph or wrote no deploy model: a stage failure (exit 3)."""

    exit_code = EXIT_STAGE_FAILED


def is_quantized(model: Any) -> bool:
    """Whether the graph (If/Loop/Scan bodies included) holds ai.onnx QuantizeLinear/DequantizeLinear."""
    from .findings import DEFAULT_DOMAINS, QDQ, _nodes

    return any(n.op_type in QDQ and n.domain in DEFAULT_DOMAINS for n in _nodes(model.graph))


def command(model_file: str, python: str = "python3") -> list[str]:
    """The AMCT step, run from the bundle root: the fixed script, the model file, the fixed output paths."""
    return [python, "-c", SCRIPT, model_file, SAVE_PREFIX, RECORD_FILE]


def find_amct() -> dict[str, Any] | None:
    """AMCT's presence (``find_spec``, which does not import it) and version (the distribution's metadata;
    None when the module is there without it), or None when the module is not installed."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):  # a broken parent package, or a module object without a spec
        spec = None
    if spec is None:
        return None
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    return {"module": MODULE, "version": version, "origin": spec.origin}


def run_amct(model_file: str, cwd: Path, log_path: Path) -> tuple[list[str], int, str]:
    """Run the AMCT step with this interpreter in ``cwd`` (the bundle root); stdout and stderr go to
    ``log_path``. Returns ``(argv as convert.sh writes it, exit code, AMCT's output)``."""
    (cwd / AMCT_DIR).mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = command(model_file, sys.executable)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(argv, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, check=False)
        except OSError as e:
            raise AmctError(f"could not run AMCT with {sys.executable}: {e}") from None
    return command(model_file), proc.returncode, log_path.read_text(encoding="utf-8", errors="replace")


def error_text(output: str, limit: int = 600) -> str:
    """The gist of a failed AMCT run: the exception line of a traceback, else its last lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return "(AMCT printed nothing)"
    tail = lines[-1] if any(line.startswith("Traceback") for line in lines) else " | ".join(lines[-3:])
    return tail if len(tail) <= limit else tail[:limit] + " ..."


def deploy_model(cwd: Path, code: int, output: str, log: str) -> Path:
    """The deploy model a finished AMCT run wrote in ``cwd``; raises AmctError naming the log otherwise."""
    if code != 0:
        raise AmctError(f"AMCT's convert_qat_model failed (exit {code}): {error_text(output)}. Fix what AMCT names "
                        f"(`cann-export lint` checks its rules); full log: {log}")
    path = cwd / DEPLOY_MODEL
    if not path.is_file():
        raise AmctError(f"AMCT's convert_qat_model exited 0 but wrote no {DEPLOY_MODEL}; see {log}")
    return path


def drop_models(root: Path) -> None:
    """Remove AMCT's intermediate models under ``root/amct`` (atc has read the deploy model); keep its logs and
    quantization record."""
    directory = root / AMCT_DIR
    if not directory.is_dir() or directory.is_symlink():
        return
    for path in directory.iterdir():
        if path.name in KEPT:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
