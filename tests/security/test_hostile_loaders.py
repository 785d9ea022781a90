"""Hostile model files: each variant of a pickle torch.export.load (or torch.load) would run, code hidden in
the graph JSON, zip bombs and escaping names. Each must be refused cleanly (exit 2, the member named, no
traceback), run nothing (the payload would create a marker file) and leave nothing at the output path.
And the other direction: healthy archives, whose raw tensor bytes may start with 0x80, load untrusted."""
import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import files
from helpers.files import evil_bytes, rewrite

from cann_export.cli.main import _register_plugin_commands, cli
from cann_export.errors import LoadError
from cann_export.load.archive_safety import check_export_archive, load_exported_program
from cann_export.load.archives import ArchiveError, open_checked

_register_plugin_commands()


def weights_config(pt2: Path, mark_first: bool = True) -> tuple[bytes, str]:
    with zipfile.ZipFile(pt2) as z:
        name = next(n for n in z.namelist() if n.endswith("model_weights_config.json"))
        cfg = json.loads(z.read(name))
    fqn = next(iter(cfg["config"]))
    if mark_first:
        cfg["config"][fqn]["use_pickle"] = True
    return json.dumps(cfg).encode(), cfg["config"][fqn]["path_name"]


def constants_config(path_name: str) -> bytes:
    return json.dumps({"config": {"c0": {"path_name": path_name, "is_param": False, "use_pickle": True,
                                         "tensor_meta": None}}}).encode()


def graph_with(pt2: Path, edit) -> bytes:
    with zipfile.ZipFile(pt2) as z:
        name = next(n for n in z.namelist() if n.endswith("models/model.json"))
        graph = json.loads(z.read(name))
    edit(graph)
    return json.dumps(graph).encode()


def first_node(graph):
    return graph["graph_module"]["graph"]["nodes"][0]


PICKLE_KINDS = ["protocol0", "protocol1", "protocol2", "legacy torch.save", "torch.save zip"]


def variants(tmp: Path, marker: Path):
    """(label, crafted archive, member the refusal must name)."""
    good = files.pt2(tmp)
    out = []
    for kind in PICKLE_KINDS:
        tag = kind.replace(" ", "_").replace(".", "")
        out.append((f"sample inputs, {kind}", rewrite(good, tmp / f"si_{tag}.pt2",
                                                      {"sample_inputs/model.pt": evil_bytes(marker, kind)}),
                    "data/sample_inputs/model.pt"))
    cfg, weight = weights_config(good)
    for kind in ("protocol1", "legacy torch.save"):
        tag = kind.replace(" ", "_").replace(".", "")
        out.append((f"use_pickle weight, {kind}",
                    rewrite(good, tmp / f"w_{tag}.pt2", {"model_weights_config.json": cfg,
                                                         f"data/weights/{weight}": evil_bytes(marker, kind)}),
                    f"data/weights/{weight}"))
    out.append(("legacy weights file", rewrite(good, tmp / "lw.pt2", {}, {
        "{root}/data/weights/model.pt": evil_bytes(marker, "protocol1")}), "data/weights/model.pt"))
    out.append(("legacy constants file", rewrite(good, tmp / "lc.pt2", {}, {
        "{root}/data/constants/model.pt": evil_bytes(marker, "protocol0")}), "data/constants/model.pt"))
    out.append(("use_pickle tensor constant", rewrite(
        good, tmp / "tc.pt2", {"model_constants_config.json": constants_config("tensor_0")},
        {"{root}/data/constants/tensor_0": evil_bytes(marker, "protocol2")}), "data/constants/tensor_0"))
    out.append(("opaque object constant", rewrite(
        good, tmp / "oc.pt2", {"model_constants_config.json": constants_config("opaque_obj_0")},
        {"{root}/data/constants/opaque_obj_0": evil_bytes(marker, "protocol2")}), "data/constants/opaque_obj_0"))

    def sym(graph):
        first_node(graph)["metadata"]["evil"] = {"expr_str": f"__import__('os').system('touch {marker}')"}

    def target(graph):
        first_node(graph)["target"] = "torch.os.system"

    out.append(("sympy expression in the graph", rewrite(good, tmp / "sym.pt2", {"models/model.json": graph_with(
        good, sym)}), "models/model.json"))
    out.append(("node target outside torch.ops", rewrite(good, tmp / "tgt.pt2", {"models/model.json": graph_with(
        good, target)}), "models/model.json"))
    out.append(("torch 2.7 layout", rewrite(good, tmp / "v27.pt2", {}, {
        "version": b"8.0", "serialized_example_inputs.pt": evil_bytes(marker, "protocol1")}),
        "serialized_example_inputs.pt"))
    return out


def assert_refused(result, member: str, marker: Path, out: Path | None = None):
    assert result.exit_code == 2, result.output
    assert member in result.stderr, result.stderr
    assert "Traceback" not in result.output and "WARNING" not in result.output
    assert not marker.exists(), "the payload ran"
    if out is not None:
        assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))


def test_every_pickle_variant_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    cases = variants(tmp_path, marker)
    for label, path, member in cases:
        out = tmp_path / f"out_{path.stem}"
        result = CliRunner().invoke(cli, [str(path), "-o", str(out)])
        assert_refused(result, member, marker, out)
        assert "refused" in result.stderr, (label, result.stderr)
    # the same check guards `zoo publish`
    for label, path, member in cases[::3]:
        result = CliRunner().invoke(cli, ["zoo", "publish", str(path), "--name", "evil", "--zoo",
                                          str(tmp_path / "zoo")])
        assert_refused(result, member, marker)
        assert not list((tmp_path / "zoo").rglob("*.pt2")), label


def test_the_crafted_archives_would_run_code_without_the_check(tmp_path):
    """The variants are real attacks: torch.export.load unpickles the payload when it is not forced to be
    weights-only (run for the two cases that need no graph edit, so the test proves its own premise)."""
    marker = tmp_path / "pwned"
    cases = {label: path for label, path, _ in variants(tmp_path, marker)}
    with pytest.raises(Exception):  # noqa: B017 - whatever torch makes of the payload afterwards
        torch.export.load(str(cases["sample inputs, protocol1"]))
    assert marker.exists()
    marker.unlink()
    # forced weights-only: refused, not run, even with the layout walk switched off
    with pytest.raises(LoadError, match="torch.export.load failed"), pytest.MonkeyPatch.context() as mp:
        mp.setattr("cann_export.load.archive_safety.check_export_archive", lambda *a: None)
        load_exported_program(cases["use_pickle weight, protocol1"], trust_pickle=False)
    assert not marker.exists()


def test_trust_pickle_is_the_only_way_through(tmp_path):
    marker = tmp_path / "pwned"
    _, path, _ = variants(tmp_path, marker)[1]
    check_export_archive(path, trust_pickle=True)  # bounded, then torch is trusted
    with pytest.raises(LoadError, match="sample_inputs/model.pt"):
        check_export_archive(path, trust_pickle=False)
    assert not marker.exists()


def test_hostile_torch_save_files_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    for kind in PICKLE_KINDS:
        path = tmp_path / f"evil_{kind.replace(' ', '_')}.pth"
        path.write_bytes(evil_bytes(marker, kind))
        out = tmp_path / "o"
        result = CliRunner().invoke(cli, [str(path), "-o", str(out), "--model-class", files.MLP_CLASS,
                                          "--input-shape", "x:2,12"])
        assert result.exit_code == 2, (kind, result.output)
        assert "posix.system" in result.stderr or "os.system" in result.stderr, (kind, result.stderr)
        assert not marker.exists() and not out.exists()


def bomb(tmp: Path, declared: int) -> Path:
    """A healthy .pt2 plus one stored member whose central directory declares ``declared`` bytes."""
    path = rewrite(files.pt2(tmp), tmp / "bomb.pt2", {}, {"{root}/extra/big": b"z" * 64})
    raw = bytearray(path.read_bytes())
    cd = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"extra/big") + 1)
    struct.pack_into("<I", raw, cd + 24, declared)  # uncompressed size in the central directory
    path.write_bytes(bytes(raw))
    return path


def test_zip_bombs_are_refused_before_reading(tmp_path):
    import resource

    path = bomb(tmp_path, 3 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "extra/big" in result.stderr and "zip bomb" in result.stderr, result.output
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: < 200 MiB grown
    # a genuinely deflated bomb: 300 MB of zeros in a few hundred KB
    real = tmp_path / "real_bomb.pt2"
    with zipfile.ZipFile(files.pt2(tmp_path)) as zin, zipfile.ZipFile(real, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
        root = zin.namelist()[0].split("/")[0]
        info = zipfile.ZipInfo(f"{root}/data/sample_inputs/zeros")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zout.open(info, "w", force_zip64=True) as f:
            f.write(bytes(300 << 20))
    assert real.stat().st_size < 2 << 20
    with pytest.raises(ArchiveError, match="zip bomb"):
        open_checked(real)
    with pytest.raises(ArchiveError, match="above the cap"):
        open_checked(files.pt2(tmp_path), cap=10)


@pytest.mark.parametrize("name,why", [("../../escape", "'..' component"), ("/abs/path", "absolute path"),
                                      ("a\\..\\b", "backslash"), ("C:/x", "absolute path")])
def test_escaping_member_names_are_refused(tmp_path, name, why):
    for maker in (files.pt2, files.torchscript, files.state_dict):
        src = maker(tmp_path)
        path = rewrite(src, tmp_path / f"esc{src.suffix}", {}, {name: b"x"})
        result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o"), "--model-class", files.MLP_CLASS,
                                          "--input-shape", "x:2,12"])
        assert result.exit_code == 2 and why in result.stderr, result.output
        assert "Traceback" not in result.output and not (tmp_path / "o").exists()


def test_duplicate_members_are_refused(tmp_path):
    import warnings

    src = files.pt2(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is told to write
        path = rewrite(src, tmp_path / "dup.pt2", {}, {"{root}/data/sample_inputs/model.pt": b"\x80\x02N."})
    with pytest.raises(ArchiveError, match="appears twice"):
        check_export_archive(path, trust_pickle=False)


# ------------------------------------------------------------------------------------ no false refusals


def starts_with_0x80(model: torch.nn.Module) -> torch.nn.Module:
    """Make the first float of every float32 parameter and buffer start (little-endian) with byte 0x80."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.dtype == torch.float32 and t.numel():
                raw = bytearray(struct.pack("<f", float(t.view(-1)[0])))
                raw[0] = 0x80
                t.view(-1)[0] = struct.unpack("<f", bytes(raw))[0]
    return model


def test_tensors_whose_bytes_start_with_0x80_load_untrusted(tmp_path):
    model = starts_with_0x80(files.make_mlp().eval())
    path = tmp_path / "m80.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 12),)), str(path))
    with zipfile.ZipFile(path) as z:
        weights = [n for n in z.namelist() if "/data/weights/weight_" in n]
        assert weights and all(z.read(n)[:1] == b"\x80" for n in weights)
    out = tmp_path / "bundle"
    result = CliRunner().invoke(cli, [str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def _hf_vit():
    from helpers.hf_models import tiny_vit

    return tiny_vit(), (torch.randn(1, 3, 32, 32),)


def _hf_gpt2():
    from helpers.hf_models import tiny_gpt2, token_inputs

    return tiny_gpt2(), (token_inputs()["input_ids"],)


def _hf_bert():
    from helpers.hf_models import tiny_bert, token_inputs

    inputs = token_inputs()
    return tiny_bert(), (inputs["input_ids"], inputs["attention_mask"])


def _hf_resnet():
    from helpers.hf_models import tiny_resnet

    return tiny_resnet(), (torch.randn(1, 3, 32, 32),)


@pytest.mark.parametrize("build", [_hf_vit, _hf_gpt2, _hf_bert, _hf_resnet])
def test_real_architectures_load_without_trust_pickle(build, tmp_path):
    model, args = build()
    starts_with_0x80(model)
    path = tmp_path / "real.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    ep = load_exported_program(path, trust_pickle=False)
    expected = model(*args)
    got = ep.module()(*args)
    torch.testing.assert_close(_first_tensor(got), _first_tensor(expected))


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    return next(iter(out.values())) if isinstance(out, dict) else out[0]


def test_a_broken_archive_names_the_member_without_torch_chatter(tmp_path):
    src = files.pt2(tmp_path)
    path = tmp_path / "missing.pt2"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w") as zout:
        for item in zin.infolist():
            if not item.filename.endswith("data/weights/weight_0"):
                zout.writestr(item, zin.read(item.filename))
    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "data/weights/weight_0" in result.stderr, result.output
    assert "warnings above" not in result.stderr and "Traceback" not in result.output


class _Dynamic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        b = x.shape[0]
        return self.lin(x).reshape(b * 2, 2) * (b % 3 + 1) + b // 2


def test_dynamic_shapes_graph_loads_untrusted(tmp_path):
    """Symbolic shapes are written in sympy's srepr form (Symbol('s77', positive=True, integer=True)) and
    SymInt arithmetic uses _operator targets: both must pass the graph check."""
    path = tmp_path / "dyn.pt2"
    ep = torch.export.export(_Dynamic(), (torch.randn(6, 8),), dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    torch.export.save(ep, str(path))
    assert b"Symbol(" in zipfile.ZipFile(path).read(next(n for n in zipfile.ZipFile(path).namelist()
                                                        if n.endswith("models/model.json")))
    assert load_exported_program(path, trust_pickle=False).module()(torch.randn(10, 8)).shape == (20, 2)


def test_program_returning_a_transformers_output_loads_in_a_fresh_process(tmp_path):
    """A .pt2 of a transformers model (return_dict=True) names its ModelOutput class in the pytree spec; a
    fresh CLI process imports that transformers module for it and exports."""
    import os
    import subprocess
    import sys

    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32)).eval()
    archive = tmp_path / "bert.pt2"
    torch.export.save(torch.export.export(model, (torch.randint(0, 64, (1, 6)),), strict=False), archive)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "CANN_EXPORT_LOAD_PLUGINS": ""}
    proc = subprocess.run([sys.executable, "-m", "cann_export", str(archive), "--format", "onnx",
                           "-o", str(tmp_path / "bert.onnx")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bert.onnx").is_file() and "pooler_output" in proc.stdout


def test_only_output_libraries_are_imported_for_a_pytree_name(tmp_path, monkeypatch):
    import sys

    from cann_export.load.archive_safety import import_output_module

    (tmp_path / "planted_outputs_mod.py").write_text("import sys\nsys.modules[__name__].RAN = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("planted_outputs_mod.Out", "os.path.Out", "transformers_x.y.Out", "transformers.nope_mod.Out"):
        assert not import_output_module(NotImplementedError(f"Deserializing {name} in pytree is not registered."))
    assert "planted_outputs_mod" not in sys.modules
    assert not import_output_module(ValueError("something else"))
