"""Device-precision parity: fp16 emulation checked against torch fp16, localisation, --fix-precision."""
import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import cann_export
from cann_export.validators.precision import emulate, emulation_for, run


class Energy(nn.Module):
    def forward(self, h):
        return (h * h).sum(-1, keepdim=True)  # a sum of squares over a long axis: past 65504 in fp16


class Overflowing(nn.Module):
    def __init__(self, width=1300):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(width, width)
        self.energy = Energy()
        self.head = nn.Linear(1, 4)

    def forward(self, x):
        return self.head(torch.sqrt(self.energy(self.proj(x))) / 100)


def big_input():
    return torch.randn(2, 1300, generator=torch.Generator().manual_seed(3)) * 30


def _onnx(model, x, tmp_path):
    result = cann_export.export(model, tmp_path / "plain.onnx", "onnx", example_inputs=(x,))
    return onnx.load(result.onnx["path"])


def test_emulation_matches_torch_fp16_overflow(tmp_path):
    model, x = Overflowing().eval(), big_input()
    graph = _onnx(model, x, tmp_path)
    emulated = run(emulate(graph, emulation_for("force_fp16"), set()), [{"x": x.numpy()}])[0][0]
    with torch.no_grad():
        energy_fp16 = Energy()(model.half().proj(x.half()))
    assert torch.isinf(energy_fp16).all()  # torch fp16 overflows ...
    assert not np.isfinite(emulated).any()  # ... and so does the emulation
    fp32 = run(emulate(graph, emulation_for("force_fp32"), set()), [{"x": x.numpy()}])[0][0]
    assert np.isfinite(fp32).all()


def test_emulation_tracks_torch_fp16_on_a_benign_model(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 16)).eval()
    x = torch.randn(8, 64)
    graph = _onnx(model, x, tmp_path)
    feed = [{graph.graph.input[0].name: x.numpy()}]
    emulated = run(emulate(graph, emulation_for("force_fp16"), set()), feed)[0][0]
    with torch.no_grad():
        ref16 = model.half()(x.half()).float().numpy()
        ref32 = model.float()(x).numpy()
    assert np.abs(emulated - ref16).max() < 2e-3  # the emulation sits next to torch fp16 ...
    assert np.abs(emulated - ref32).max() > 1e-5  # ... and visibly off the fp32 result


def test_overflow_fails_under_force_fp16_and_names_the_module(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),))
    parity = result.parity
    assert not result.ok and parity["graph_fp32_passed"] is True
    assert parity["precision"]["mode"] == "force_fp16"
    first = parity["first_divergence"]
    assert first["module"] == "energy" and first["overflow"]
    assert first["message"].startswith("first divergence: energy (")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["parity"]["first_divergence"]["module"] == "energy"


def test_overflow_passes_under_must_keep_origin_dtype(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),),
                                precision_mode="must_keep_origin_dtype")
    assert result.ok and result.parity["precision"]["emulated"].startswith("none")


def test_fix_precision_keeps_the_offending_nodes(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),), fix_precision=True)
    assert result.ok, result.parity
    kept = result.parity["fixed_by_keep_dtype"]
    assert kept
    cfg = (tmp_path / "b" / "atc" / "keep_dtype.cfg").read_text().split()
    assert set(kept) <= set(cfg)
    assert "--keep_dtype=atc/keep_dtype.cfg" in (tmp_path / "b" / "atc" / "convert.sh").read_text()
    assert result.manifest["atc"]["keep_dtype"]["nodes"] == cfg


def test_keep_dtype_hint_by_module_path_fixes_it_too(tmp_path):
    result = cann_export.export(Overflowing(), tmp_path / "b", example_inputs=(big_input(),),
                                atc_hints={"keep_dtype": ["energy"]})
    assert result.ok, result.parity


@pytest.mark.parametrize("mode", ["allow_mix_precision", "cube_fp16in_fp32out", "allow_fp32_to_bf16"])
def test_other_modes_are_emulated_and_reported(mode, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    result = cann_export.export(model, tmp_path / "b", example_inputs=torch.randn(2, 16), precision_mode=mode)
    assert result.ok and result.parity["precision"]["mode"] == mode


def test_cli_prints_the_first_divergence(tmp_path):
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(Overflowing().eval(), (big_input(),)), str(path))
    from cann_export.cli import cli

    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "first divergence: energy" in result.stdout and "fp16 overflow" in result.stdout


def test_validate_reruns_device_precision(tmp_path):
    from cann_export.cli import cli

    cann_export.export(Overflowing(), tmp_path / "fixed", example_inputs=(big_input(),), fix_precision=True)
    cann_export.export(Overflowing(), tmp_path / "broken", example_inputs=(big_input(),))
    ok = CliRunner().invoke(cli, ["validate", str(tmp_path / "fixed"), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["parity"]["precision"]["mode"] == "force_fp16"
    bad = CliRunner().invoke(cli, ["validate", str(tmp_path / "broken"), "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["parity"]["first_divergence"]["module"] == "energy"
