"""Issue 41, finding 1: a .pt2's names reach the Python source torch generates and runs (keyword-input names in
forward_arg_names / the in_spec, placeholder names, parameter paths, pytree contexts that import modules). Each
path of torch 2.13 gets a real hostile file (tests/helpers/codegen_names.py): torch runs its payload, the .pt2
checker refuses it by name (trusted or not) before torch sees it, and the export, `zoo publish`,
model_zoo.publish, validate and load_model all refuse it with exit 2 and no marker. Finding 2: publish no longer
loads a program in the user's process and runs every check validate runs on a bundle but parity."""
from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.codegen_names import PATHS, hostile, keyword_program, marker_module, run_in_torch, source_payload

from cann_export.cli.main import _register_plugin_commands, cli
from cann_export.errors import LoadError
from cann_export.load.archive_safety import check_export_archive, load_exported_program
from cann_export.load.program_names import MAX_NAME_CHARS, identifier, names_problem, treespec_problem

_register_plugin_commands()


@pytest.fixture
def good(tmp_path) -> Path:
    return keyword_program(tmp_path)


@pytest.fixture
def importable(tmp_path, monkeypatch) -> Path:
    """A directory on sys.path (where the import payloads' module lives); their module is never kept imported."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        if name.startswith("codegen_marker_"):
            del sys.modules[name]


def _hostile(path: str, good: Path, tmp: Path, importable: Path) -> tuple[Path, Path]:
    marker = tmp / f"marker-{path.replace(' ', '-')}"
    return hostile(path, good, tmp / "evil.pt2", marker, marker_module(importable, marker)), marker


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def refused(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize("path", list(PATHS))
def test_torch_runs_the_name(path, good, tmp_path, importable):
    """The premise, per path: torch 2.13 itself runs what the name holds (at load, at .module() or at the call)."""
    evil, marker = _hostile(path, good, tmp_path, importable)
    try:
        run_in_torch(evil, torch.randn(2, 4))
    except Exception:  # noqa: BLE001 - the payload has run by the time torch trips over what it left behind
        pass
    assert marker.exists()


@pytest.mark.parametrize("trust_pickle", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
def test_the_checker_refuses_each_path_by_name(path, trust_pickle, good, tmp_path, importable):
    evil, marker = _hostile(path, good, tmp_path, importable)
    with pytest.raises(LoadError) as caught:
        load_exported_program(evil, trust_pickle)
    message = caught.value.message
    assert "models/model.json" in message and PATHS[path][1] in message, message
    assert "identifier" in message or "imports" in message or "import" in message, message
    assert not marker.exists(), "torch saw the program"


def test_export_refuses_the_keyword_name_with_and_without_the_sandbox(good, tmp_path, importable):
    for flags in (["--no-sandbox"], []):
        evil, marker = _hostile("forward_arg_names", good, tmp_path, importable)
        out = tmp_path / f"out{len(flags)}"
        refused(run(evil, "-o", out, "--format", "onnx", *flags), "forward_arg_names", "not a plain Python identifier")
        assert not marker.exists() and not out.exists()


def test_zoo_publish_refuses_the_keyword_name(good, tmp_path, importable):
    from cann.model_zoo import ZooError, publish

    evil, marker = _hostile("in_spec kwargs key", good, tmp_path, importable)
    zoo = tmp_path / "zoo"
    refused(run("zoo", "publish", evil, "--name", "kw", "--zoo", zoo), "in_spec", "evil.pt2")
    with pytest.raises(ZooError, match="in_spec"):
        publish(model=str(evil), name="kw", zoo=str(zoo))
    assert not marker.exists() and not list(zoo.rglob("*.pt2"))


def test_zoo_publish_of_a_program_loads_nothing_and_keeps_its_weights(good, tmp_path, monkeypatch):
    """Publishing a .pt2 reads its weights with torch's weights reader; the program is not deserialized (no
    torch.export.load), and load_model gives back the same module."""
    from cann.model_zoo import load_model, publish
    from safetensors.torch import load_file

    calls = []
    real = torch.export.load
    with monkeypatch.context() as patched:
        patched.setattr(torch.export, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
        publish(model=str(good), name="kw", zoo=str(tmp_path / "zoo"))
    assert calls == []
    stored = load_file(next((tmp_path / "zoo").rglob("*.safetensors")))
    expected = torch.export.load(str(good)).state_dict
    assert sorted(stored) == sorted(expected)
    assert all(torch.equal(stored[k], expected[k]) for k in stored)
    module = load_model("kw", zoo=str(tmp_path / "zoo"), framework="pytorch")
    assert isinstance(module, torch.nn.Module)


def _bundle(good: Path, tmp: Path) -> Path:
    bundle = tmp / "bundle"
    result = run(good, "-o", bundle)
    assert result.exit_code == 0, result.output
    return bundle


def _swap_program(bundle: Path, program: Path, dst: Path) -> Path:
    """The bundle with torch/program.pt2 replaced and its file table re-hashed (manifest.json is not in it)."""
    shutil.copytree(bundle, dst)
    shutil.copy(program, dst / "torch" / "program.pt2")
    manifest = json.loads((dst / "manifest.json").read_text())
    data = (dst / "torch" / "program.pt2").read_bytes()
    manifest["files"]["torch/program.pt2"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dst


def test_a_bundle_with_a_hostile_program_is_refused_by_validate_publish_and_load_model(good, tmp_path, importable):
    from cann.model_zoo import ZooError, load_model, publish

    evil, marker = _hostile("forward_arg_names", good, tmp_path, importable)
    bundle = _bundle(good, tmp_path)
    tampered = _swap_program(bundle, evil, tmp_path / "tampered")
    zoo = tmp_path / "zoo"
    refused(run("validate", tampered), "torch/program.pt2", "forward_arg_names")
    refused(run("zoo", "publish", tampered, "--name", "tampered", "--zoo", zoo), "torch/program.pt2",
            "forward_arg_names")
    # the consumer: a genuine version whose stored program an attacker with write access swaps afterwards
    publish(model=str(bundle), name="genuine", zoo=str(zoo))
    version = zoo / "models" / "genuine" / "1"
    stored = version / "architecture" / "program.pt2"
    shutil.copy(evil, stored)
    _forge_file_table(zoo, "genuine", "1", "architecture/program.pt2", stored.read_bytes())
    with pytest.raises(ZooError, match="forward_arg_names"):
        load_model("genuine", zoo=str(zoo), framework="pytorch")
    assert not marker.exists()


def _forge_file_table(zoo: Path, name: str, version: str, rel: str, data: bytes) -> None:
    from cann_export.model_zoo.file_copies import manifest_bytes, manifest_digest

    path = zoo / "models" / name / version / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"][rel].update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    manifest["digest"] = manifest_digest(manifest)
    body = manifest_bytes(manifest)
    path.write_bytes(body)
    db = sqlite3.connect(str(zoo / "index.sqlite"))
    with db:
        db.execute("UPDATE versions SET digest=?, manifest_sha256=? WHERE name=? AND version=?",
                   (manifest["digest"], hashlib.sha256(body).hexdigest(), name, version))
    db.close()


def test_publish_runs_the_checks_validate_runs(good, tmp_path):
    """A bundle whose manifest no longer matches its graph (validate refuses it) is refused by publish too."""
    bundle = _bundle(good, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["model"]["inputs"][0]["name"] = "y"
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
    refused(run("validate", bundle), "does not match its manifest")
    refused(run("zoo", "publish", bundle, "--name", "b", "--zoo", tmp_path / "zoo"), "does not match its manifest")
    assert not list((tmp_path / "zoo").rglob("*.onnx"))


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
        self.register_buffer("scale", torch.ones(2), persistent=False)
        self.shared = torch.nn.Linear(2, 2)

    def forward(self, input, *, mask=None):
        y = self.shared(self.shared(self.layers(input) * self.scale))
        y = torch.cond(y.sum() > 0, lambda t: t + 1, lambda t: t - 1, (y,))
        return {"out": y, "parts": [y, y * mask[:, None]]}


def test_genuine_programs_pass(tmp_path):
    """What torch.export.save writes passes: numbered submodules, a repeated submodule call, keyword-only
    inputs, a dynamic dimension, a cond subgraph, dict and list outputs, and a transformers model by keyword."""
    from helpers.hf_models import tiny_bert

    batch = torch.export.Dim("batch", min=2, max=64)
    ids = torch.randint(0, 100, (2, 8))
    cases = {
        "branchy": torch.export.export(Branchy().eval(), (), {"input": torch.randn(3, 4), "mask": torch.ones(3)},
                                       dynamic_shapes={"input": {0: batch}, "mask": {0: batch}}),
        "bert": torch.export.export(tiny_bert().eval(), (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}),
    }
    for name, program in cases.items():
        path = tmp_path / f"{name}.pt2"
        torch.export.save(program, str(path))
        check_export_archive(path, trust_pickle=False)
        check_export_archive(path, trust_pickle=True)
        assert load_exported_program(path, trust_pickle=False).module() is not None


@pytest.mark.parametrize("name, ok", [
    ("x", True), ("input_ids", True), ("_1", True), ("a" * MAX_NAME_CHARS, True),
    ("a" * (MAX_NAME_CHARS + 1), False), ("class", False), ("1x", False), ("x y", False), ("größe", False),
    ("x\n", False), ("x\u202e", False), ("", False), (7, False)])
def test_identifier_grammar(name, ok):
    assert (identifier(name) is None) is ok


def _doc(**module) -> dict:
    return {"graph_module": {"graph": {"nodes": []}, **module}}


@pytest.mark.parametrize("doc, needle", [
    ({"graph_module": {"graph": {"nodes": [{"name": "n", "target": "torch.ops.higher_order.cond", "outputs": [],
                                            "inputs": [{"name": "a=1)#", "arg": {"as_int": 1}, "kind": 2}]}]}}},
     "operator argument name"),
    ({"graph_module": {"graph": {"nodes": [{"name": "x = 1", "inputs": [], "outputs": []}]}}}, "node name"),
    ({"graph_module": {"graph": {"nodes": [], "inputs": [
        {"as_graph": {"name": "g", "graph": {"nodes": [], "tensor_values": {"a b": {}}}}}]}}}, "subgraph value name"),
    (_doc(module_call_graph=[{"fqn": "a.b\"c", "signature": None}]), "module path"),
    (_doc(signature={"input_specs": [], "output_specs": [
        {"buffer_mutation": {"arg": {"name": "b"}, "buffer_name": "x.y)"}}]}), "buffer_name"),
    (_doc(treespec_namedtuple_fields={"m.P": {"field_names": ["a", "b c"]}}), "namedtuple"),
])
def test_more_names_torch_writes_are_checked(doc, needle):
    assert needle in (names_problem(doc) or ""), names_problem(doc)


def test_what_torch_writes_for_module_paths_and_specs_passes():
    doc = _doc(module_call_graph=[{"fqn": "", "signature": None}, {"fqn": "layers.0@1", "signature": None}],
               signature={"input_specs": [{"parameter": {"arg": {"name": "p_layers_0_weight"},
                                                         "parameter_name": "layers.0.weight"}}], "output_specs": []})
    assert names_problem(doc) is None
    ok = json.dumps([1, {"type": "builtins.dict", "context": json.dumps(["a", 1]), "children_spec": []}])
    assert treespec_problem(ok) is None
    builtin = json.dumps([1, {"type": "collections.defaultdict", "children_spec": [], "context": {
        "default_factory_module": "builtins", "default_factory_name": "list", "dict_context": ["a"]}}])
    assert treespec_problem(builtin) is None
    enum = json.dumps([{"__enum__": True, "fqn": "os:X", "name": "Y"}])
    assert "enum" in treespec_problem(json.dumps([1, {"type": "builtins.dict", "children_spec": [], "context": enum}]))


def test_a_payload_name_is_what_reaches_source():
    """The payload is a real source fragment: compiled where torch writes it, it is a default value that runs."""
    name = source_payload(Path("/nonexistent/marker"))
    source = f"def forward(self, {name}):\n    x, = f(([], {{'x':{name}}}), self._in_spec)\n    return x\n"
    compile(source, "<fx>", "exec")
