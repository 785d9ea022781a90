"""ATC hints: accepted by ATC's names, rendered into convert.sh and cfg files, refused in bad combinations."""
import json

import pytest
import torch
from helpers.toy_models import ConvBnDropout, TwoInputs

import cann_export
from cann_export import errors


def export(tmp_path, hints, model=None, **kw):
    model = model or TwoInputs()
    feeds = {"input_ids": torch.randint(0, 50, (1, 6)), "features": torch.randn(1, 6, 16)}
    return cann_export.export(model, tmp_path / "b", example_inputs=feeds, atc_hints=hints, **kw)


@pytest.mark.parametrize("hints,a,b", [
    ({"precision_mode": "force_fp32", "precision_mode_v2": "fp16"}, "precision_mode", "precision_mode_v2"),
    ({"dynamic_batch_size": "1,2,4", "dynamic_image_size": "224,224;448,448"},
     "dynamic_batch_size", "dynamic_image_size"),
    ({"dynamic_batch_size": "1,2", "dynamic_dims": "1,2;3,4"}, "dynamic_batch_size", "dynamic_dims"),
    ({"dynamic_batch_size": "1,2", "input_shape_range": "x:[1~4,3]"}, "dynamic_batch_size", "input_shape_range"),
    ({"aipp": {"input_format": "RGB888_U8"}, "dynamic_dims": "1,2;3,4"}, "aipp", "dynamic_dims"),
])
def test_refused_combinations_name_both_options(hints, a, b, tmp_path):
    with pytest.raises(errors.OptionsError) as info:
        export(tmp_path, hints)
    assert a in str(info.value) and b in str(info.value)
    assert not (tmp_path / "b").exists()


def test_cli_precision_mode_with_v2_hint_is_refused(tmp_path):
    with pytest.raises(errors.OptionsError, match="precision_mode_v2"):
        export(tmp_path, {"precision_mode_v2": "fp16"}, precision_mode="allow_mix_precision")


def test_unknown_hint_lists_known_ones(tmp_path):
    with pytest.raises(errors.OptionsError) as info:
        export(tmp_path, {"presicion_mode": "force_fp16"})
    assert "presicion_mode" in str(info.value) and "keep_dtype" in str(info.value)


def test_bad_value_lists_accepted_values(tmp_path):
    with pytest.raises(errors.OptionsError, match="must_keep_origin_dtype"):
        export(tmp_path, {"precision_mode": "fp64"})
    with pytest.raises(errors.OptionsError, match="on or off"):
        export(tmp_path, {"fusion_switch": {"ConvToFullyConnectionFusionPass": "maybe"}})


def test_hints_render_into_convert_sh_and_cfg_files(tmp_path):
    result = export(tmp_path, {
        "keep_dtype": ["norm", "OpType::Softmax"],
        "fusion_switch": "ConvToFullyConnectionFusionPass:off",
        "op_select_implmode": "high_precision", "optypelist_for_implmode": "Gelu,LayerNorm",
        "log": "error", "insert_teacache": ["proj"], "memory_layout": "nhwc_optimized",
        "precision_mode": "allow_mix_precision",
    })
    bundle = tmp_path / "b"
    script = (bundle / "atc" / "convert.sh").read_text()
    for arg in ("--precision_mode=allow_mix_precision", "--keep_dtype=atc/keep_dtype.cfg",
                "--fusion_switch_file=atc/fusion_switch.cfg", "--op_select_implmode=high_precision",
                "--optypelist_for_implmode=Gelu,LayerNorm", "--log=error"):
        assert arg in script, arg
    keep = (bundle / "atc" / "keep_dtype.cfg").read_text().split()
    atc = result.manifest["atc"]
    norm_nodes = atc["keep_dtype"]["module_paths"]["norm"]
    assert norm_nodes and set(norm_nodes) <= set(keep)
    # ATC matches Ascend IR types: the ONNX spelling is written as SoftmaxV2, with a warning saying so
    assert "OpType::SoftmaxV2" in keep and "OpType::Softmax" not in keep
    assert any("OpType::Softmax names an ONNX op type" in w for w in result.manifest["warnings"]["atc_hints"])
    fusion = json.loads((bundle / "atc" / "fusion_switch.cfg").read_text())
    assert fusion == {"Switch": {"GraphFusion": {"ConvToFullyConnectionFusionPass": "off"}}}
    assert atc["advisory"] == {"insert_teacache": ["proj"], "memory_layout": "nhwc_optimized"}
    assert atc["insert_teacache_nodes"]["proj"]
    assert atc["command"][0] == "atc" and atc["hints"]["log"] == "error"


def test_aipp_prototxt(tmp_path):
    model = ConvBnDropout()
    cann_export.export(model, tmp_path / "a", example_inputs=torch.randn(1, 3, 32, 32),
                       atc_hints={"aipp": {"input_format": "RGB888_U8", "src_image_size_w": 32,
                                           "csc_switch": False, "mean_chn_0": 104}})
    text = (tmp_path / "a" / "atc" / "aipp.cfg").read_text()
    assert text == ("aipp_op {\n    aipp_mode: static\n    input_format: RGB888_U8\n    src_image_size_w: 32\n"
                    "    csc_switch: false\n    mean_chn_0: 104\n}\n")
    assert "--insert_op_conf=atc/aipp.cfg" in (tmp_path / "a" / "atc" / "convert.sh").read_text()


def test_keep_dtype_under_origin_precision_warns(tmp_path):
    result = export(tmp_path, {"keep_dtype": "OpType::Softmax"}, precision_mode="must_keep_origin_dtype")
    assert "no effect" in result.manifest["warnings"]["atc_hints"][0]


def test_unknown_keep_dtype_module_is_refused(tmp_path):
    with pytest.raises(errors.WriteError, match="no_such_module"):
        export(tmp_path, {"keep_dtype": ["no_such_module"]})
    assert not (tmp_path / "b").exists()
