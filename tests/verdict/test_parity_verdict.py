"""The parity verdict on models a kind check lets through, strict machine-readable output, error chains."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers import hf_models, parity_models
from safetensors.torch import save_file

from cann_export import api
from cann_export.cli.main import cli
from cann_export.errors import CaptureError, PrepareError, gist
from cann_export.fs.jsonio import dumps, loads_strict
from cann_export.inputs.tensors import random_variants, tensors_from_specs
from cann_export.options import InputSpec

BRANCH_LINE = "parity_models.py:15"


def invoke(args, env=None):
    return CliRunner().invoke(cli, args, catch_exceptions=False, env=env)


@pytest.fixture
def branchy_files(tmp_path):
    torch.manual_seed(0)
    model_file = tmp_path / "branchy.pth"
    torch.save(parity_models.Branchy().state_dict(), model_file)
    inputs = tmp_path / "x.safetensors"
    save_file({"x": torch.randn(2, 8) + 3}, str(inputs))  # positive: every random variant takes the same branch
    return [str(model_file), "--model-class", "helpers.parity_models:Branchy", "--example-inputs", str(inputs)]


def test_traced_branch_fails_without_the_option_and_names_the_line(tmp_path, branchy_files):
    out = tmp_path / "b.onnx"
    result = invoke([*branchy_files, "--format", "onnx", "-o", str(out), "--json"])
    assert result.exit_code == 1, result.output
    payload = loads_strict(result.stdout)
    assert payload["ok"] is False and payload["onnx"]["exporter"] == "torchscript"
    assert payload["onnx"]["specialized_to_traced_path"] is True
    parity = payload["parity"]
    assert parity["fp32"]["passed"] is True  # the five ordinary input sets all took the traced branch
    assert BRANCH_LINE in parity["reason"] and "--accept-trace-specialization" in parity["reason"]
    spec = parity["trace_specialized"]
    assert spec["accepted"] is False and spec["warnings"][0]["code"] == (
        "if x.sum() > 0:  # the traced branch for positive examples")
    assert spec["warnings"][0]["kind"] == "bool"
    assert spec["other_paths"]["passed"] is False and spec["other_paths"]["outputs"][0]["max_abs"] > 1.0


def test_traced_branch_with_the_option_passes_but_is_marked(tmp_path, branchy_files):
    out = tmp_path / "b"
    result = invoke([*branchy_files, "-o", str(out), "--accept-trace-specialization"])
    assert result.exit_code == 0, result.output
    assert "specialised to the example's path at 1 place(s)" in result.stdout and "accepted unchecked" in result.stdout
    assert BRANCH_LINE in result.stdout
    manifest = loads_strict((out / "manifest.json").read_text())
    assert manifest["capture"]["specialized"]["accepted"] is True
    assert manifest["capture"]["specialized"]["warnings"][0]["line"] == 15
    assert manifest["parity"]["passed"] is True and manifest["parity"]["trace_specialized"]["accepted"] is True


def test_traced_branch_without_validation_is_refused(tmp_path, branchy_files):
    result = invoke([*branchy_files, "--format", "onnx", "-o", str(tmp_path / "b.onnx"), "--no-validate", "--json"])
    assert result.exit_code == CaptureError.exit_code, result.output
    error = loads_strict(result.stdout)["error"]
    assert error["stage"] == "capture" and BRANCH_LINE in error["message"]
    assert not (tmp_path / "b.onnx").exists()


@pytest.mark.parametrize(("make", "kind", "needle"), [
    (parity_models.nan_weights, "non_finite", "NaN/inf in every element"),
    (parity_models.constant_output, "constant", "constant 0.5"),
])
def test_meaningless_reference_fails_with_its_own_message(tmp_path, make, kind, needle):
    result = api.export(make(), tmp_path / "m.onnx", "onnx", example_inputs=(torch.randn(2, 8),))
    assert result.ok is False
    out = result.parity["outputs"][0]
    assert out["passed"] is False and out["reference"] == kind and needle in out["reason"]
    assert needle in result.parity["reason"]
    loads_strict(dumps(result.to_dict()))


def test_masks_have_padding_ids_span_the_vocabulary_rows_differ():
    example = tensors_from_specs([InputSpec("input_ids", (3, 16)), InputSpec("attention_mask", (3, 16))],
                                 hf_models.tiny_bert(), seed=0)
    mask = example["attention_mask"]
    lengths = [int(r.sum()) for r in mask]
    assert lengths[0] == 16 and all(n < 16 for n in lengths[1:])  # the first row whole, every later one padded
    assert all(torch.equal(r, r.sort(descending=True).values) for r in mask)  # the padding at the end
    assert len(set(lengths)) == len(lengths), lengths  # each row keeps a different number of tokens (seeded)
    variants = random_variants(example, 4, seed=1, vocab={"input_ids": 100})
    end, middle = variants[0]["attention_mask"], variants[1]["attention_mask"]
    assert (end[:, -1] == 0).all() and (end[:, 0] == 1).all()
    assert (middle[:, 0] == 1).all() and (middle[:, -1] == 1).all() and (middle == 0).any(dim=1).all()
    ids = torch.stack([v["input_ids"] for v in variants])
    assert int(ids.min()) == 0 and int(ids.max()) == 99 and not torch.equal(ids[0, 0], ids[0, 1])
    floats = random_variants({"x": torch.randn(4, 256)}, 4, seed=1)
    kurtosis = [float(((v["x"] - v["x"].mean()) ** 4).mean() / v["x"].var() ** 2) for v in floats]
    assert kurtosis[1] < 2.2 and kurtosis[2] > 4.0  # uniform and Laplace: more than one distribution


def test_bert_parity_with_padded_masks(tmp_path):
    result = api.export(hf_models.tiny_bert(), tmp_path / "bert.onnx", "onnx",
                        input_shapes=["input_ids:2,12", "attention_mask:2,12"])
    assert result.ok, result.parity
    assert result.parity["input_sets_from"] == {"example": 1, "random": 4, "parity_data": 0}


@pytest.mark.parametrize("layout", ["npz_leading", "safetensors_keys", "npz_rows"])
def test_parity_data_many_samples(tmp_path, layout):
    torch.manual_seed(0)
    model = parity_models.MLP()
    model_file = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model.eval(), (torch.randn(2, 8),)), str(model_file))
    samples = torch.randn(20, 2, 8) * 5
    if layout == "npz_leading":
        data = tmp_path / "data.npz"
        np.savez(data, x=samples.numpy())
    elif layout == "npz_rows":
        data = tmp_path / "data.npz"
        np.savez(data, x=samples.reshape(40, 8).numpy())
    else:
        data = tmp_path / "data.safetensors"
        save_file({f"{i}/x": samples[i].contiguous() for i in range(20)}, str(data))
    result = invoke([str(model_file), "--format", "onnx", "-o", str(tmp_path / "m.onnx"), "--parity-data", str(data),
                     "--json"])
    assert result.exit_code == 0, result.output
    parity = loads_strict(result.stdout)["parity"]
    assert parity["input_sets"] == 25 and parity["input_sets_from"]["parity_data"] == 20
    assert parity["outputs"][0]["failed_sets"] == 0


def test_parity_data_with_the_wrong_shape_is_a_clear_error(tmp_path):
    model_file = tmp_path / "mlp.pt2"
    model = parity_models.MLP().eval()
    torch.export.save(torch.export.export(model, (torch.randn(2, 8),)), str(model_file))
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((5, 7), dtype=np.float32))
    result = invoke([str(model_file), "--format", "onnx", "-o", str(tmp_path / "m.onnx"), "--parity-data", str(data)])
    assert result.exit_code == 2 and "[N, 2, 8]" in result.stderr


def test_fp16_overflow_export_writes_strict_json_without_ansi(tmp_path):
    torch.manual_seed(0)
    model_file = tmp_path / "ovf.pth"
    torch.save(parity_models.Overflow().state_dict(), model_file)
    inputs = tmp_path / "x.safetensors"
    save_file({"x": torch.randn(2, 8) + 2}, str(inputs))
    bundle = tmp_path / "ovf"
    result = invoke([str(model_file), "--model-class", "helpers.parity_models:Overflow", "--example-inputs",
                     str(inputs), "-o", str(bundle), "--json", "--soc-version", "Ascend910B1"])  # inf: Inf/NaN mode
    assert result.exit_code == 1, result.output
    texts = {"--json": result.stdout, "manifest.json": (bundle / "manifest.json").read_text(),
             "parity.json": (bundle / "parity.json").read_text()}
    texts["validate --json"] = invoke(["validate", str(bundle), "--json"]).stdout
    texts["inspect --json"] = invoke(["inspect", str(bundle), "--json"]).stdout
    for name, text in texts.items():
        assert "\x1b" not in text, name
        loads_strict(text)  # raises on NaN / Infinity
    payload = loads_strict(texts["--json"])["parity"]
    assert payload["fp32"]["passed"] is True and payload["device"]["passed"] is False
    assert set(payload["fp32"]["tolerance"]) == {"atol", "rtol", "min_cosine"}
    assert "min_cosine" in payload["device"]["tolerance"] and payload["device"]["mode"] == "force_fp16"
    device_out = payload["device"]["outputs"][0]
    # fp16's inf is named as an overflow, and the device verdict's metrics stay finite numbers (a
    # non-finite value would be null plus a flag: the encoder's own test below covers that)
    assert "overflow" in device_out["reason"] and device_out["cosine"] == 0.0, device_out
    assert all(isinstance(device_out[k], float) for k in ("max_abs", "max_rel", "cosine")), device_out


def test_strict_encoder():
    text = dumps({"a": float("nan"), "b": [1.0, float("-inf")], "c": "\x1b[31mred\x1b[0m", "d": np.float32(2.5)})
    assert loads_strict(text) == {"a": None, "b": [1.0, None], "c": "red", "d": 2.5, "non_finite": {"a": "nan"}}
    with pytest.raises(ValueError, match="RFC 8259"):
        loads_strict('{"x": NaN}')


def test_errors_keep_the_innermost_cause():
    try:
        try:
            raise ValueError("Cannot view a tensor with shape [1, 49, 96] and strides \x1b[1m[4704, 1, 49]\x1b[0m")
        except ValueError as e:
            raise RuntimeError("Failed to convert the exported program to an ONNX model. " + "detail " * 200) from e
    except RuntimeError as e:
        line = gist(e, 300)
    assert "ValueError: Cannot view a tensor with shape [1, 49, 96]" in line and "\x1b" not in line
    assert "\n" not in line and len(line) < 500


class _ViewFails(torch.nn.Module):
    def forward(self, x):
        try:
            return x.t().view(-1)
        except RuntimeError as e:
            raise ValueError("Cannot view a tensor with shape [8, 2]") from e


def test_cli_error_shows_the_cause_and_debug_prints_the_chain(tmp_path):
    with pytest.raises(PrepareError) as info:
        api.export(_ViewFails(), tmp_path / "v.onnx", "onnx", example_inputs=(torch.randn(2, 8),))
    assert "ValueError: Cannot view a tensor with shape [8, 2]" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)  # the chain is kept, not cut with `from None`
    assert "(cause: RuntimeError: view size is not compatible" in str(info.value)  # the innermost, in one line
    assert "\n" not in str(info.value)
    json.loads(dumps(info.value.to_dict()))


def test_debug_prints_the_whole_chain_of_an_export_error(tmp_path):
    model_file = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(parity_models.MLP().eval(), (torch.randn(2, 8),)), str(model_file))
    data = tmp_path / "broken.npz"
    data.write_bytes(b"PK\x03\x04 not really a zip")
    args = [str(model_file), "--format", "onnx", "-o", str(tmp_path / "m.onnx"), "--parity-data", str(data), "--json"]
    plain = invoke(args, env={"CANN_EXPORT_DEBUG": ""})
    assert plain.exit_code == 2 and "Traceback" not in plain.stderr
    error = loads_strict(plain.stdout)["error"]
    assert error["stage"] == "prepare" and "--parity-data: not a readable zip archive" in error["message"]
    debug = invoke(args, env={"CANN_EXPORT_DEBUG": "1"})
    assert debug.exit_code == 2
    assert "Traceback" in debug.stderr and "The above exception was the direct cause" in debug.stderr
    assert "PrepareError" in debug.stderr and "not a readable zip archive" in debug.stderr.splitlines()[-1]


def test_reference_problem_is_judged_over_every_set_without_a_joined_copy():
    """The verdict on a meaningless reference, decided array by array (no float64 concatenation of every set's
    logits): constant only when every element of every set is finite and equal; non-finite only when none is."""
    import numpy as np

    from cann_export.parity_metrics import reference_problem

    half = np.full((2, 3), 0.5, np.float32)
    assert reference_problem([half, half.copy()])["reference"] == "constant"
    assert "constant 0.5" in reference_problem([half, half.copy()])["reason"]
    assert reference_problem([half, np.full((1, 3), 0.25, np.float32)]) is None  # equal within each set only
    assert reference_problem([half, np.array([0.5, np.nan], np.float32)]) is None  # a NaN: not "constant"
    nan = np.full((2, 2), np.nan, np.float32)
    assert reference_problem([nan, np.full(3, np.inf, np.float16)])["reference"] == "non_finite"
    assert reference_problem([nan, np.array([1.0], np.float32)]) is None
    assert reference_problem([np.zeros(0, np.float32)]) is None
    assert reference_problem([np.float32(2.0)]) is None  # one element cannot be "constant"
