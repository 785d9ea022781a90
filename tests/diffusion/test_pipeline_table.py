"""What a pipeline row relies on, without an export: a UNet's added conditioning read from its own config (SDXL's
``text_time``, an LCM UNet's guidance embedding), one conditioned on what no exported graph gives refused by name;
and an output dim the tracer named after an input's dimension, though the reference's sizes there differ, renamed
so the graph claims no wrong size."""
from types import SimpleNamespace

import numpy as np
import pytest

from cann_export.errors import OptionsError


def test_unet_added_inputs_come_from_its_config_and_unknown_conditioning_is_refused():
    from cann_export.diffusion.graphs import added_inputs

    assert added_inputs(SimpleNamespace(addition_embed_type=None, time_cond_proj_dim=None)) == ()
    assert added_inputs(SimpleNamespace(addition_embed_type="text_time", time_cond_proj_dim=None)) == (
        "text_embeds", "time_ids")
    assert added_inputs(SimpleNamespace(addition_embed_type=None, time_cond_proj_dim=256)) == ("timestep_cond",)
    with pytest.raises(OptionsError, match="addition_embed_type='image'.*pipe.unet"):
        added_inputs(SimpleNamespace(addition_embed_type="image", time_cond_proj_dim=None))
    with pytest.raises(OptionsError, match="class_embed_type='timestep'"):
        added_inputs(SimpleNamespace(addition_embed_type=None, class_embed_type="timestep", time_cond_proj_dim=None))


def _graph(output_dims):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("latent", TensorProto.FLOAT, ["batch_size", 4, "height", "width"])
    y = helper.make_tensor_value_info("image", TensorProto.FLOAT, output_dims)
    node = helper.make_node("Identity", ["latent"], ["image"])
    return helper.make_model(helper.make_graph([node], "g", [x], [y]))


def test_an_output_dim_named_after_an_input_dim_it_does_not_follow_is_renamed():
    from cann_export.capture.dynamic_dims import unname_contradicted

    ctx = SimpleNamespace(output_names=["image"],
                          input_sets=[{"latent": np.zeros((2, 4, 8, 8))}, {"latent": np.zeros((1, 4, 8, 16))}],
                          reference_outputs=[[np.zeros((2, 3, 16, 16))], [np.zeros((1, 3, 16, 32))]])
    wrong = _graph(["batch_size", 3, "batch_size", "width"])  # the tracer's name for the image height
    assert unname_contradicted(wrong, ctx)
    dims = [d.dim_param or d.dim_value for d in wrong.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch_size", 3, "image_dim_2", "image_dim_3"]  # width doubles too: not the latent's width
    right = _graph(["batch_size", 3, "height_out", "width_out"])
    assert not unname_contradicted(right, ctx)
    same = SimpleNamespace(**{**vars(ctx), "reference_outputs": [[np.zeros((2, 3, 8, 8))], [np.zeros((1, 3, 8, 16))]]})
    kept = _graph(["batch_size", 3, "height", "width"])
    assert not unname_contradicted(kept, same)  # a dim that follows the input's keeps its name
