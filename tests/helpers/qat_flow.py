"""One corpus architecture through the articles' QAT flow: ``cann.torch.config(quantization_aware_training=True,
...)``, the unchanged loop, ``model.eval()``, ``cann.torch.export(..., export_format="atc_ready")`` with default
options; plus the float model (the trained weights without fake quantization) exported as plain ONNX, whose
graph says what the model computes. Used by tests/qat/test_corpus.py and tests/helpers/qat_corpus_stats.py."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import qat_checks as qc
from .qat_corpus import CORPUS, QatCase

QUANT_CONFIG = {"weight_bits": 8, "activation_bits": 8}
FRESH_SEED = 777


@dataclass
class Flow:
    name: str
    case: QatCase
    model: Any  # the trained fake-quant model, eval mode, as it was before the export (a copy)
    float_model: Any
    user_model: Any  # the user's model object, after the export
    changed_by_export: float = 0.0  # the user's model's largest output change across the export (fresh input)
    result: Any = None  # cann.torch.export's result (None when it raised)
    error: str | None = None  # the export's exception, as "Type: message"
    qat_dir: Path | None = None
    float_graph: Any = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def graph_path(self) -> Path | None:
        path = self.qat_dir / "model.onnx" if self.qat_dir else None
        return path if path is not None and path.exists() else None


def run(name: str, root: Path, float_export: bool = True) -> Flow:
    """Train ``CORPUS[name]`` with the articles' loop and export it; an export that raises is recorded, not
    raised (the corpus reports what fails and how)."""
    import onnx

    import cann.torch
    import cann_export

    seconds = {}
    start = time.perf_counter()
    torch.manual_seed(0)
    case = CORPUS[name]()
    cann.torch.config(quantization_aware_training=True, quant_config=dict(QUANT_CONFIG))
    try:
        qc.train(case)
        seconds["train"] = time.perf_counter() - start
        case.model.eval()
        flow = Flow(name, case, copy.deepcopy(case.model), qc.float_copy(case.model), case.model)
        before = qc.torch_outputs(case.model, case.inputs(FRESH_SEED))
        flow.qat_dir = root / f"{name}_qat"
        start = time.perf_counter()
        try:
            flow.result = cann.torch.export(model=case.model, output_path=flow.qat_dir, export_format="atc_ready",
                                            example_inputs=case.example_inputs)
        except Exception as e:  # noqa: BLE001 - recorded: the corpus reports every failure with its message
            flow.error = f"{type(e).__name__}: {e}"
        seconds["qat_export"] = time.perf_counter() - start
        after = qc.torch_outputs(case.model, case.inputs(FRESH_SEED))
        flow.changed_by_export = max(float(abs(a - b).max()) for a, b in zip(before, after, strict=True))
    finally:
        cann.torch.config(quantization_aware_training=False, quant_config={})
    if float_export:
        start = time.perf_counter()
        written = cann_export.export(flow.float_model, root / f"{name}_float.onnx", "onnx",
                                     example_inputs=case.example_inputs, validate=False)
        flow.float_graph = onnx.load(written.output)
        seconds["float_export"] = time.perf_counter() - start
    flow.seconds = seconds
    return flow


def fresh_check(flow: Flow, seed: int = FRESH_SEED) -> dict[str, Any]:
    """The written graph against the fake-quant model (and the float model) on inputs neither export saw."""
    inputs = flow.case.inputs(seed)
    got = qc.run_graph(flow.graph_path, inputs)
    vs_fq = qc.compare(got, qc.torch_outputs(flow.model, inputs))
    vs_float = qc.compare(got, qc.torch_outputs(flow.float_model, inputs))
    return {"vs_fake_quant": vs_fq, "vs_float": vs_float}
