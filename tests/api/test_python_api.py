"""The Python API on hand-made models: stripping, both formats, manifest, parity, atomicity."""
import json

import numpy as np
import onnx
import pytest
import torch
from helpers.toy_models import ConvBnDropout, TwoInputs, make_mlp

import cann_export
from cann_export import errors


def op_types(path):
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_atc_ready_bundle_strips_training_structure_and_passes_parity(tmp_path, run_ort):
    torch.manual_seed(0)
    model = ConvBnDropout().train()  # exported in train mode on purpose: strip must switch to eval
    x = torch.randn(2, 3, 16, 16)
    result = cann_export.export(model, tmp_path / "bundle", "atc_ready", example_inputs=(x,))

    assert result.ok and result.parity["passed"]
    bundle = tmp_path / "bundle"
    names = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert {"model.onnx", "manifest.json", "parity.json", "atc/convert.sh",
            "parity/inputs.safetensors", "parity/expected.safetensors"} <= names
    ops = op_types(bundle / "model.onnx")
    assert "BatchNormalization" not in ops and "Dropout" not in ops and "Identity" not in ops
    assert ops.count("Conv") == 2

    model.eval()
    _, (out,) = run_ort(bundle / "model.onnx", {"x": x})
    np.testing.assert_allclose(out, model(x).detach().numpy(), atol=1e-4, rtol=1e-3)

    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["model"]["inputs"] == [{"name": "x", "shape": [2, 3, 16, 16], "dtype": "float"}]
    assert manifest["parity"]["passed"] and manifest["parity"]["input_sets"] == 5
    assert manifest["capture"]["exporter"] in ("dynamo", "torchscript")
    assert manifest["model"]["opset"] == result.onnx["opset"]
    for rel, entry in manifest["files"].items():
        assert len(entry["sha256"]) == 64 and entry["size"] == (bundle / rel).stat().st_size
    script = (bundle / "atc" / "convert.sh").read_text()
    assert "atc --framework=5 --model=model.onnx --output=model --soc_version=Ascend310P3" in script
    assert "--input_shape=x:2,3,16,16" in script and "--precision_mode=force_fp16" in script


def test_onnx_format_metadata_and_provenance(tmp_path):
    model = make_mlp()
    result = cann_export.export(model, tmp_path / "mlp.onnx", "onnx", example_inputs=torch.randn(3, 12),
                                metadata={"task": "regression", "owner": "ml-team"})
    assert result.files == [str(tmp_path / "mlp.onnx")]
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "mlp.onnx")).metadata_props}
    assert props["task"] == "regression" and props["owner"] == "ml-team"
    for key in ("tool", "torch", "onnx", "onnxruntime", "exporter", "opset", "created_utc"):
        assert props[f"cann_export.{key}"], key
    assert props["cann_export.source_kind"] == "module"
    assert list(tmp_path.iterdir()) == [tmp_path / "mlp.onnx"]  # no staging leftovers


def test_named_inputs_dict_outputs_and_token_ids(tmp_path, run_ort):
    torch.manual_seed(0)
    model = TwoInputs().eval()
    feeds = {"input_ids": torch.randint(0, 50, (2, 7)), "features": torch.randn(2, 7, 16)}
    result = cann_export.export(model, tmp_path / "b", example_inputs=feeds)
    assert [o["name"] for o in result.parity["outputs"]] == ["hidden", "pooled"]
    names, outs = run_ort(tmp_path / "b" / "model.onnx", feeds)
    ref = model(**feeds)
    for name, out in zip(names, outs, strict=False):
        np.testing.assert_allclose(out, ref[name].detach().numpy(), atol=1e-4)


def test_input_shapes_build_token_ids_below_vocab(tmp_path):
    result = cann_export.export(TwoInputs().eval(), tmp_path / "b", input_shapes=["input_ids:1,9", "features:1,9,16"])
    manifest = result.manifest
    dtypes = {i["name"]: i["dtype"] for i in manifest["model"]["inputs"]}
    assert dtypes == {"input_ids": "int64", "features": "float"}
    assert result.ok


class SignBranch(torch.nn.Module):
    """Data-dependent control flow: a traced export freezes the branch of the example input."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x * -3


def test_parity_failure_writes_bundle_with_failure_recorded(tmp_path):
    x = torch.tensor([[0.5, -0.4, 0.3, -0.2], [0.1, -0.1, 0.2, -0.3]])  # sum > 0; seeded variants take both branches
    result = cann_export.export(SignBranch(), tmp_path / "b", example_inputs=x)
    assert not result.ok and result.parity["passed"] is False
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["parity"]["passed"] is False
    parity = json.loads((tmp_path / "b" / "parity.json").read_text())
    assert parity["passed"] is False and parity["failing_sets"][0]["output"] == parity["outputs"][0]["name"]


def test_failed_stage_leaves_nothing_behind(tmp_path):
    class Broken(torch.nn.Module):
        def forward(self, x):
            return x.numpy()  # not traceable by any exporter

    with pytest.raises(errors.ExportError) as info:
        cann_export.export(Broken(), tmp_path / "out", example_inputs=torch.randn(2))
    assert info.value.stage in ("prepare", "capture")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_refused_then_overwritten(tmp_path):
    target = tmp_path / "b"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(errors.WriteError, match="overwrite=True"):
        cann_export.export(make_mlp(), target, example_inputs=torch.randn(1, 12), validate=False)
    assert (target / "keep.txt").exists()
    with pytest.raises(errors.WriteError, match="not written by cann-export"):  # a user's directory stays
        cann_export.export(make_mlp(), target, example_inputs=torch.randn(1, 12), validate=False, overwrite=True)
    assert (target / "keep.txt").read_text() == "x"
    (target / "keep.txt").unlink()
    target.rmdir()
    cann_export.export(make_mlp(), target, example_inputs=torch.randn(1, 12), validate=False)
    first = (target / "manifest.json").read_text()
    cann_export.export(make_mlp(), target, example_inputs=torch.randn(1, 12), validate=False, overwrite=True)
    assert (target / "model.onnx").exists() and (target / "manifest.json").read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_no_validate_skips_parity(tmp_path):
    result = cann_export.export(make_mlp(), tmp_path / "b", example_inputs=torch.randn(1, 12), validate=False)
    assert result.parity is None and result.ok
    assert not (tmp_path / "b" / "parity.json").exists()
    assert result.manifest["parity"]["validated"] is False


def test_external_data_when_over_threshold(tmp_path, run_ort):
    model = make_mlp()
    x = torch.randn(2, 12)
    result = cann_export.export(model, tmp_path / "big.onnx", "onnx", example_inputs=x,
                                external_data_threshold=1000)
    assert sorted(result.files) == sorted([str(tmp_path / "big.onnx"), str(tmp_path / "big.onnx.data")])
    assert result.parity["passed"]
    _, (out,) = run_ort(tmp_path / "big.onnx", {"x": x})
    np.testing.assert_allclose(out, model.eval()(x).detach().numpy(), atol=1e-5)


def test_missing_example_inputs_says_what_to_pass(tmp_path):
    # two inputs and no Conv/Linear/Embedding: nothing to infer a shape from (an MLP's is inferred, as in the CLI)
    with pytest.raises(errors.PrepareError, match="example_inputs"):
        cann_export.export(torch.nn.Bilinear(4, 4, 2), tmp_path / "b")


def test_unknown_option_is_refused(tmp_path):
    with pytest.raises(errors.OptionsError, match="unknown option"):
        cann_export.export(make_mlp(), tmp_path / "b", example_inputs=torch.randn(1, 12), opsett=17)


def test_exporter_choice_and_opset_recorded(tmp_path):
    result = cann_export.export(make_mlp(), tmp_path / "b", example_inputs=torch.randn(1, 12), exporter="torchscript",
                                opset=13)
    assert result.onnx == {"path": str(tmp_path / "b" / "model.onnx"), "opset": 13, "exporter": "torchscript"}
    assert onnx.load(str(tmp_path / "b" / "model.onnx")).opset_import[0].version == 13


def test_callers_module_is_not_modified(tmp_path):
    model = ConvBnDropout().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cann_export.export(model, tmp_path / "b", example_inputs=torch.randn(1, 3, 8, 8))
    assert model.training
    assert isinstance(model.drop, torch.nn.Dropout) and isinstance(model.stem[1], torch.nn.BatchNorm2d)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_include_optimizer_state_writes_safetensors_beside_weights(tmp_path):
    from cann_export.bundle.training_state import load_optimizer_state

    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 12)).sum().backward()
    opt.step()
    cann_export.export(model, tmp_path / "b", example_inputs=torch.randn(1, 12), include_optimizer_state=True,
                       optimizer=opt)
    training = tmp_path / "b" / "training"
    assert sorted(p.name for p in training.iterdir()) == ["optimizer.safetensors", "weights.safetensors"]
    fresh = torch.optim.AdamW(make_mlp().parameters(), lr=1e-3)
    fresh.load_state_dict(load_optimizer_state(training / "optimizer.safetensors"))
    for pid, entry in opt.state_dict()["state"].items():
        assert torch.equal(fresh.state_dict()["state"][pid]["exp_avg"], entry["exp_avg"])
    with pytest.raises(errors.OptionsError, match="optimizer="):
        cann_export.export(model, tmp_path / "c", example_inputs=torch.randn(1, 12), include_optimizer_state=True)


def test_opset_policy_records_or_enforces(tmp_path):
    loose = cann_export.export(ConvBnDropout(), tmp_path / "a", example_inputs=torch.randn(1, 3, 8, 8), opset=17)
    capture = loose.manifest["capture"]
    assert capture["opset_requested"] == 17 and capture["attempts"][0]["exporter"] == "dynamo"
    if loose.onnx["opset"] != 17:  # torch 2.13's dynamo exporter writes 18 when down-conversion fails
        assert "--strict-opset" in capture["warning"]
    strict = cann_export.export(ConvBnDropout(), tmp_path / "b", example_inputs=torch.randn(1, 3, 8, 8), opset=17,
                                strict_opset=True)
    assert strict.onnx["opset"] == 17 and strict.ok


def test_simplifier_that_changes_outputs_is_rejected(tmp_path, monkeypatch):
    import onnxsim
    from onnx import numpy_helper

    real = onnxsim.simplify

    def perturbing(model, *a, **k):  # a simplifier bug: one weight changes (in the graph it returns and writes)
        out, ok = real(model, *a, **k)
        init = out.graph.initializer[0]
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
        if k.get("output_path"):
            onnx.save(out, k["output_path"])
        return out, ok

    monkeypatch.setattr(onnxsim, "simplify", perturbing)
    result = cann_export.export(make_mlp(), tmp_path / "b", example_inputs=torch.randn(2, 12))
    assert result.ok and result.manifest["optimize"]["onnxsim"].startswith("rejected")

    def failing(model, *a, **k):
        raise RuntimeError("simplifier crashed")

    monkeypatch.setattr(onnxsim, "simplify", failing)
    result = cann_export.export(make_mlp(), tmp_path / "c", example_inputs=torch.randn(2, 12))
    assert result.ok and "simplifier crashed" in result.manifest["optimize"]["onnxsim"]


def test_a_decoder_with_its_cache_on_and_own_inputs_is_told_what_to_do(tmp_path):
    """A transformers decoder whose config has use_cache on, given its own keyword inputs and no past: its outputs
    hold a Cache object neither exporter takes; the error says so and names both fixes, and nothing is written."""
    from helpers.hf_models import tiny_decoder_gpt2

    model = tiny_decoder_gpt2()
    feed = {"input_ids": torch.randint(1, 96, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    with pytest.raises(errors.CaptureError) as raised:
        cann_export.export(model, tmp_path / "m.onnx", "onnx", example_inputs=feed)
    assert "use_cache" in raised.value.message and "export_multi" in raised.value.message, raised.value.message
    assert not (tmp_path / "m.onnx").exists()
    model.config.use_cache = False  # the first fix, as the message gives it
    assert cann_export.export(model, tmp_path / "m.onnx", "onnx", example_inputs=feed).ok
