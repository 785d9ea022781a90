"""When a checkable trace comes first for a float-input model, the trace gate's sign-flipped / scaled copies of the
example (its specialisation probes) are built once the trace warned on a value (capture/shape_tests.py): one eager
forward per input set and none for a trace that warned at input checks, literal constants or tests of sizes only. A
data-dependent branch the trace kept is still rejected on them, and dynamo runs. Pixel models are traced first by
default, as text models are (hf/loader.py ``EXPORTER_ORDER``: measured, the trace saves more than the probes cost)."""
import pytest
import torch
from helpers import hf_dirs

import cann_export
from cann_export import LoadedModel, hookimpl


def _eager_forwards(name: str):
    """Counters of the float32 eager forwards of modules whose class is ``name`` (not under tracing or dynamo): the
    reference's, and the shape budget's size estimates (run under its op-recording dispatch mode,
    inputs/activations.py ``op_sizes``)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    calls, estimates = [], []

    def hook(module, args, kwargs, output):
        if type(module).__name__ != name or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return
        from torch._subclasses.fake_tensor import FakeTensor

        tensors = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
        if tensors and not any(isinstance(t, FakeTensor) for t in tensors) and tensors[0].dtype != torch.float64:
            (estimates if _get_current_dispatch_mode() is not None else calls).append(1)

    return calls, estimates, torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)


def _shared_forwards(reuse: dict) -> int:
    """The forwards the batch sizes' row reuse saved (inputs/row_reuse.py): its sizes' sets ran as one forward of
    the fresh rows (none where the example sets held enough) and the proof's own run at the smallest size."""
    if not reuse.get("used"):
        return 0
    fresh = 1 if reuse["eager_rows"] > reuse["proof"]["size"] else 0
    return len(reuse["sizes"]) - fresh - 1


@pytest.mark.parametrize("case", ["vit", "convnext"])
def test_a_pixel_model_traced_first_runs_no_forward_beyond_the_prepared_sets(tmp_path, case):
    from cann_export.hf import loader

    directory = hf_dirs.save(case, tmp_path / case)
    extras = loader.HfDirectoryLoader().load(directory, cann_export.ExportOptions()).extras
    assert extras["exporter_order"] == ["torchscript", "dynamo"]  # by default, as for text
    calls, estimates, handle = _eager_forwards("TaskModule")  # the task's graph (hf/model.py)
    try:
        result = cann_export.export(str(directory), tmp_path / "m.onnx", export_format="onnx",
                                    sandbox="off")  # the forwards in this process, where the hook counts
    finally:
        handle.remove()
    assert result.ok and result.onnx["exporter"] == "torchscript", result.onnx
    parity = result.parity
    assert parity["input_sets_from"] == {"example": 1, "random": 2, "parity_data": 0,
                                         **({"shapes": parity["input_sets_from"]["shapes"]}
                                            if "shapes" in parity["input_sets_from"] else {})}
    # one forward per set and no probe (the trace warned at input checks or tests of sizes: transformers 4.5x / 5.x),
    # fewer where the batch sizes share rows, and the budget's estimate at the example and at each dynamic
    # dimension's low end (inputs/shape_budget.py)
    shared = _shared_forwards((result.manifest.get("parity") or {}).get("reference_reuse") or {})
    assert len(calls) == parity["input_sets"] - shared, (len(calls), parity["input_sets"], shared)
    assert 1 <= len(estimates) <= 4, len(estimates)  # batch, and height / width where they are dynamic
    assert parity["passed"] and not parity.get("probes")
    checked = parity.get("trace_specialized", {}).get("checked")
    assert checked is None or checked["path_variants"] == 0


class MeanBranch(torch.nn.Module):
    """`if x.mean() > 0`: a trace keeps the branch of the (positive) example."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.mean() > 0:
            return self.proj(x) * 2.0
        return self.proj(x) - 3.0


def test_a_data_dependent_branch_is_rejected_by_the_gate_on_the_prepared_probes(plugin, tmp_path):
    @hookimpl
    def register_loaders(register):
        class Loader:
            name = "mean-branch"
            priority = 500

            def matches(self, path):
                return path.suffix == ".meanbranch"

            def load(self, path, options):
                torch.manual_seed(0)
                return LoadedModel(MeanBranch().eval(), "module", example_inputs={"x": torch.randn(2, 8) + 3},
                                   source_sha256="0" * 64, extras={"exporter_order": ["torchscript", "dynamo"]})

        register(Loader())

    plugin({"register_loaders": register_loaders}, "mean-branch")
    (tmp_path / "m.meanbranch").write_text("")
    result = cann_export.export(str(tmp_path / "m.meanbranch"), tmp_path / "m.onnx", export_format="onnx")
    attempts = result.manifest["capture"]["attempts"]
    assert result.parity["input_sets_from"] == {"example": 1, "random": 2, "parity_data": 0}
    assert attempts[0]["exporter"] == "torchscript"  # judged on the sign-flipped copy built for it, and not kept
    assert "traced graph not kept" in attempts[0]["note"] and "example x -1" in attempts[0]["note"], attempts
    assert attempts[1]["exporter"] == "dynamo"  # which refuses the data-dependent branch: no graph passes
    assert not result.ok and not result.parity["passed"]


def test_a_pixel_model_is_traced_first_unless_the_gate_cannot_check_it(tmp_path):
    """ViT by default: TorchScript first, kept by the gate. With --no-validate too (the gate builds a set at the
    batch range's ends and middle, and no probe: ViT's warnings test sizes only): dynamo was the slower path."""
    directory = hf_dirs.save("vit", tmp_path / "vit")
    result = cann_export.export(str(directory), tmp_path / "m.onnx", export_format="onnx", sandbox="off")
    assert result.ok and result.onnx["exporter"] == "torchscript", result.onnx
    assert "trace_path" not in result.parity["input_sets_from"] and result.parity["input_sets_from"]["random"] == 2
    unchecked = cann_export.export(str(directory), tmp_path / "n.onnx", export_format="onnx", sandbox="off",
                                   validate=False)
    assert unchecked.onnx["exporter"] == "torchscript", unchecked.onnx
    capture = unchecked.manifest["capture"]
    if "specialized" not in capture:  # transformers 4.5x: ViT warns at its input checks only (capture/trace_guards.py)
        assert [g["code"] for g in capture["guards"]] and unchecked.manifest["parity"]["validated"] is False
        return
    checked = capture["specialized"]["checked"]
    assert checked["path_variants"] == 0 and unchecked.manifest["parity"]["validated"] is False, checked
    assert "tests sizes only" in capture["specialized"]["probes"]
    assert sorted(s["batch_size"] for s in checked["shapes"]) == [1, 2, 8, 16], checked["shapes"]
