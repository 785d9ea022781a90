"""atc/customize_dtypes.fix.cfg: keep_dtype.cfg's lines as --customize_dtypes entries (the form Huawei's recipes
write): each input and output typed as the graph types it (float ones ``float``, a shape operand ``int64``), an
``OpType::`` line with its type's signature, after the user's own customize_dtypes entries, which win for a target
they name; every line parses back with the same checker a customize_dtypes hint goes through."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from cann_export.atc.customize import parse
from cann_export.atc.precision_cfg import FIX_CUSTOMIZE_HEAD, fix_customize


def _graph():
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 16])
    inits = [numpy_helper.from_array(np.ones((16, 16), np.float32), "w"),
             numpy_helper.from_array(np.array([4, 8], np.int64), "shape"),
             numpy_helper.from_array(np.array([4, 16], np.int64), "back")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Reshape", ["r", "shape"], ["s"], name="fold"),
             helper.make_node("Reshape", ["s", "back"], ["y"], name="unfold")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits))


def test_kept_nodes_read_and_write_float_and_shape_operands_keep_their_type():
    text = fix_customize(["mm", "fold", "OpType::Relu"], _graph())
    assert text.startswith(FIX_CUSTOMIZE_HEAD)
    body = text[len(FIX_CUSTOMIZE_HEAD):].splitlines()
    assert body == ["mm::InputDtype:float,float,OutputDtype:float",
                    "fold::InputDtype:float,int64,OutputDtype:float",
                    "OpType::Relu:InputDtype:float,OutputDtype:float"]
    assert [e.target for e in parse(text)] == ["mm", "fold", "OpType::Relu"]


def test_the_users_customize_entries_lead_and_win_for_the_targets_they_name():
    hint = "mm::InputDtype:float16,float16,OutputDtype:float\nOpType::MatMulV2:InputDtype:float,float,OutputDtype:float"
    entries = parse(fix_customize(["mm", "act"], _graph(), hint))
    assert [e.line() for e in entries] == ["mm::InputDtype:float16,float16,OutputDtype:float",
                                           "OpType::MatMulV2:InputDtype:float,float,OutputDtype:float",
                                           "act::InputDtype:float,OutputDtype:float"]
