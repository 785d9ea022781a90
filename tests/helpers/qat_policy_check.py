"""The tool's own int8 parity verdict on broken lowerings (tests/helpers/qat_broken.py) of one corpus
architecture, from what its bundle stores (parity inputs, fake-quant reference outputs, labels and the
reference's rounding noise), exactly as ``cann-export validate`` re-runs it: a broken variant must fail.
Used by tests/qat/test_corpus.py; ``python tests/helpers/qat_policy_check.py [names...]`` prints the table."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import qat_broken, qat_checks as qc  # noqa: E402


def stored(bundle: Path) -> dict[str, Any]:
    import json

    from cann_export.inputs.parity_data import read_bundle_int8_noise, read_bundle_labels, read_bundle_parity
    from cann_export.options import Tolerance

    manifest = json.loads((bundle / "manifest.json").read_text())
    feeds, expected, _ = read_bundle_parity(bundle, manifest)
    return {"feeds": feeds, "expected": expected, "labels": read_bundle_labels(bundle, len(feeds)),
            "noise": read_bundle_int8_noise(bundle, len(feeds)), "tolerance": Tolerance()}


def graph_verdict(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    from cann_export.validators.parity import parity_report

    return parity_report(path, data["feeds"], data["expected"], data["tolerance"], quantized=True,
                         labels=data["labels"], quant_noise=data["noise"])


def outputs_verdict(actual: list[list[np.ndarray]], data: dict[str, Any]) -> bool:
    """compare_quantized on the verdict sets, every output, with the stored noise: whether all pass."""
    from cann_export.parity_metrics import compare_quantized

    noise = data["noise"] or [None] * len(actual)
    sets = [s for s, label in enumerate(data["labels"] or []) if label["role"] == "verdict"] or range(len(actual))
    return all(compare_quantized(actual[s][k], data["expected"][s][k], data["tolerance"],
                                 noise=noise[s][k] if noise[s] else None)["passed"]
               for s in sets for k in range(len(data["expected"][s])))


def broken_verdicts(model: Any, bundle: Path, root: Path, use_noise: bool = True) -> dict[str, bool]:
    """Every applicable broken variant -> whether the tool's int8 parity passes it (it must not)."""
    import onnx
    import torch

    data = stored(bundle)
    if not use_noise:
        data["noise"] = None
    graph = onnx.load(str(bundle / "model.onnx"))
    out: dict[str, bool] = {}
    for label, breaker in qat_broken.GRAPH_BROKEN.items():
        made = breaker(graph)
        if made is not None:
            path = root / f"{label.replace('@', '_')}.onnx"
            onnx.save(made[0], str(path))
            out[label] = bool(graph_verdict(path, data)["passed"])
    for label, breaker in qat_broken.TORCH_BROKEN.items():
        made = breaker(model)
        if made is not None:
            bad = made[0].eval()
            actual = [qc.torch_outputs(bad, {n: torch.from_numpy(v) for n, v in feed.items()})
                      for feed in data["feeds"]]
            out[label] = outputs_verdict(actual, data)
    return out


def main() -> None:
    import tempfile

    import torch

    torch.set_num_threads(1)
    from helpers import qat_flow
    from helpers.qat_corpus import CORPUS

    for name in sys.argv[1:] or list(CORPUS):
        with tempfile.TemporaryDirectory() as tmp:
            flow = qat_flow.run(name, Path(tmp), float_export=False)
            if flow.error:
                print(f"{name:20s} export raised {flow.error[:100]}", flush=True)
                continue
            for use_noise in (True, False):
                verdicts = broken_verdicts(flow.model, flow.qat_dir, Path(tmp), use_noise)
                passed = [k for k, v in verdicts.items() if v]
                print(f"{name:20s} noise={use_noise} ok={flow.result.ok} {len(verdicts) - len(passed)}/"
                      f"{len(verdicts)} broken rejected; passed: {passed}", flush=True)
            print("   noise", qc.rounded(stored(flow.qat_dir)["noise"][0]), flush=True)


if __name__ == "__main__":
    main()
