"""The TorchScript capture hands torch.onnx's shape inference no large floating-point weight by value
(capture/lean_shape_inference.py: each pass copied every weight per node that reads it), and the graphs it
writes are the same as with every weight handed over."""
import contextlib

import onnx
import torch
from helpers import hf_dirs

import cann_export
from cann_export.capture.lean_shape_inference import VALUE_LIMIT


@contextlib.contextmanager
def _largest_float_weight_seen(seen: list[int]):
    """Record, per shape-inference pass torch.onnx runs, the largest floating-point parameter it is handed."""
    from torch import _C

    inner = _C._jit_pass_onnx_graph_shape_type_inference

    def recording(graph, params_dict, opset):
        sizes = [v.numel() for v in params_dict.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        seen.append(max(sizes, default=0))
        return inner(graph, params_dict, opset)

    _C._jit_pass_onnx_graph_shape_type_inference = recording
    try:
        yield
    finally:
        _C._jit_pass_onnx_graph_shape_type_inference = inner


def _graphs(bundle):
    """Each component's graph, without the metadata that names when it was written."""
    graphs = {}
    for name in ("prefill", "decode"):
        model = onnx.load(str(bundle / "components" / name / "model.onnx"))
        del model.metadata_props[:]
        graphs[name] = model.SerializeToString()
    return graphs


def test_a_decoder_with_past_capture_hands_shape_inference_no_large_weight_and_writes_the_same_graphs(
        tmp_path, monkeypatch):
    directory = hf_dirs.save("gpt2", tmp_path / "gpt2")  # wte: 100 x 32 floats, past VALUE_LIMIT
    seen: list[int] = []
    with _largest_float_weight_seen(seen):  # in this process: the sandbox's child would record it out of sight
        result = cann_export.export(str(directory), tmp_path / "lean", export_format="onnx",
                                    task="text-generation-with-past", sandbox="off")
    assert result.ok and set(result.components) == {"prefill", "decode"}, result
    assert all(c["passed"] for c in result.components.values())
    assert len(seen) == 4, seen  # two passes per graph, both graphs traced
    assert max(seen) <= VALUE_LIMIT, seen
    from cann_export.capture import lean_shape_inference

    monkeypatch.setattr(lean_shape_inference, "VALUE_LIMIT", 10**12)  # every weight handed over, as torch does
    assert cann_export.export(str(directory), tmp_path / "full", export_format="onnx",
                              task="text-generation-with-past", sandbox="off").ok
    lean, full = _graphs(tmp_path / "lean"), _graphs(tmp_path / "full")
    assert lean == full


def test_overlapping_exports_put_torchs_own_pass_back_once_both_end():
    """Two exports in threads of one process overlap as A enters, B enters, A exits, B exits: torch's own pass is
    back after B, never A's lean one left installed."""
    import threading

    from torch import _C

    from cann_export.capture.lean_shape_inference import lean_shape_inference

    original = _C._jit_pass_onnx_graph_shape_type_inference
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    b_lean = []

    def a():
        with lean_shape_inference():
            a_in.set()
            b_in.wait()
        a_out.set()

    def b():
        a_in.wait()
        with lean_shape_inference():
            b_in.set()
            a_out.wait()
            b_lean.append(_C._jit_pass_onnx_graph_shape_type_inference is not original)  # B still runs lean

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b_lean == [True] and _C._jit_pass_onnx_graph_shape_type_inference is original
