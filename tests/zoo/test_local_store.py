"""Model zoo, local store: publish/load round trips, immutability, integrity, safety, aliases, the card."""
from __future__ import annotations

import json
import sqlite3

import pytest
import torch
from helpers.toy_models import MLP, make_mlp
from helpers.zoo_models import TiedLM, write_weights

from cann.model_zoo import (
    ZooConflictError,
    ZooError,
    ZooIntegrityError,
    list_models,
    load_model,
    publish,
    pull,
    set_alias,
    show,
    verify,
)

WIDE = {"model_class": "helpers.zoo_models:Wide", "model_kwargs": {"width": 64, "depth": 1}}


@pytest.fixture
def zoo(tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_MODEL_ZOO_USER", "tester@ci")
    monkeypatch.setenv("CANN_MODEL_ZOO_ALLOW_MODULES", "helpers")  # the test models' module (see test_hostile_zoo)
    return str(tmp_path / "zoo")


def _same(a, b, *inputs):
    with torch.no_grad():
        return torch.allclose(a.eval()(*inputs), b(*inputs))


def test_module_round_trip_and_idempotent_republish(zoo):
    model = make_mlp()
    meta = {"license": "apache-2.0", "task": "regression", "base_model": "none", "tags": "tiny,mlp",
            "metrics": '{"mse": 0.01}', "owner": "team-a"}
    first = publish(model=model, name="mlp", metadata=meta, zoo=zoo)
    assert (first["version"], first["existed"]) == ("1", False)
    again = publish(model=model, name="mlp", metadata=meta, zoo=zoo)
    assert (again["version"], again["existed"], again["digest"]) == ("1", True, first["digest"])
    same_version = publish(model=model, name="mlp", version="1", metadata=meta, zoo=zoo)
    assert same_version["existed"] and same_version["version"] == "1"

    loaded = load_model("mlp", zoo=zoo)
    assert isinstance(loaded, torch.nn.Module) and not loaded.training
    assert _same(model, loaded, torch.randn(3, 12))

    m = show("mlp", zoo=zoo)["manifest"]
    assert m["architecture"] == {"kind": "callable", "callable": "helpers.toy_models:MLP", "kwargs": {},
                                 "inferred": True}
    assert m["created_by"] == "tester@ci" and m["tools"]["torch"] == torch.__version__
    assert set(m["files"]) == {"README.md", "weights/model.safetensors"}
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in m["files"].values())
    readme = (load_model.__globals__["open_store"](zoo).root / "models/mlp/1/README.md").read_text()
    front = readme.split("---\n")[1]
    assert 'license: "apache-2.0"' in front and 'task: "regression"' in front and 'base_model: "none"' in front
    assert 'tags:\n  - "tiny"\n  - "mlp"' in front and "metrics:\n  mse: 0.01" in front
    assert m["card"]["tags"] == ["tiny", "mlp"] and m["metadata"]["owner"] == "team-a"


def test_explicit_version_is_write_once(zoo):
    publish(model=make_mlp(), name="mlp", version="1.0", zoo=zoo)
    other = MLP()
    with pytest.raises(ZooConflictError, match="already exists with different contents"):
        publish(model=other, name="mlp", version="1.0", zoo=zoo)
    assert publish(model=other, name="mlp", zoo=zoo)["version"] == "1"  # auto numbering is separate
    assert [r["version"] for r in show("mlp", zoo=zoo)["versions"]] == ["1.0", "1"]


def test_tied_weights_round_trip(zoo):
    torch.manual_seed(1)
    model = TiedLM()
    rec = publish(model=model, name="tied-lm", model_class="helpers.zoo_models:TiedLM", zoo=zoo)
    m = show("tied-lm", zoo=zoo)["manifest"]
    assert m["weights"]["tied"] == {"head.weight": "embed.weight"}
    loaded = load_model("tied-lm", version=rec["version"], zoo=zoo)
    assert loaded.head.weight is loaded.embed.weight
    assert _same(model, loaded, torch.randint(0, 40, (2, 5)))


def test_checkpoint_file_with_model_class_and_weights_only(zoo, tmp_path):
    model = make_mlp(hidden=16)
    ckpt = tmp_path / "ckpt.pth"
    torch.save({"model": model.state_dict(), "epoch": 3, "optimizer": {"lr": 0.1}}, ckpt)
    publish(model=str(ckpt), name="ckpt", model_class="helpers.toy_models:MLP", model_kwargs={"hidden": 16}, zoo=zoo)
    m = show("ckpt", zoo=zoo)["manifest"]
    assert m["weights"]["converted_from"].startswith("torch.save state_dict")
    assert m["architecture"]["kwargs"] == {"hidden": 16}
    assert _same(model, load_model("ckpt", zoo=zoo), torch.randn(1, 12))
    with pytest.raises(ZooError, match="do not fit helpers.toy_models:MLP"):
        publish(model=str(ckpt), name="ckpt", model_class="helpers.toy_models:MLP", zoo=zoo)
    # weights without an architecture are refused at publish time, with the fix
    with pytest.raises(ZooError, match="refused: these are weights .* no architecture.*model_class="):
        publish(model=str(ckpt), name="bare", zoo=zoo)
    assert [r["name"] for r in list_models(zoo=zoo)] == ["ckpt"]
    # the consumer may still name the class itself
    assert _same(model, load_model("ckpt", zoo=zoo, model_class="helpers.toy_models:MLP",
                                   model_kwargs={"hidden": 16}), torch.randn(1, 12))


def test_pickled_module_refused_unless_trusted(zoo, tmp_path):
    model = make_mlp()
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    with pytest.raises(ZooError, match="refused.*helpers.toy_models.MLP.*trust_pickle=True"):
        publish(model=str(path), name="pickled", zoo=zoo)
    assert list_models(zoo=zoo) == []
    publish(model=str(path), name="pickled", trust_pickle=True, zoo=zoo)
    m = show("pickled", zoo=zoo)["manifest"]
    assert m["weights"]["converted_from"] == "pickle" and m["weights"]["file"].endswith(".safetensors")
    assert not any(f.endswith((".pt", ".pth", ".pkl")) for f in m["files"])
    assert _same(model, load_model("pickled", zoo=zoo), torch.randn(2, 12))


def test_module_that_cannot_be_rebuilt_is_refused_and_export_archive_works(zoo):
    class Local(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x)

    model = Local()
    with pytest.raises(ZooError, match="cannot record how to rebuild.*model_class=.*example_inputs="):
        publish(model=model, name="local", zoo=zoo)
    publish(model=model, name="local", example_inputs=(torch.randn(1, 4),), zoo=zoo)
    m = show("local", zoo=zoo)["manifest"]
    assert m["architecture"] == {"kind": "torch.export", "file": "architecture/program.pt2"}
    assert _same(model, load_model("local", zoo=zoo), torch.randn(1, 4))


@pytest.mark.parametrize("bad", ["../evil", "a/b", "a\\b", "", "x" * 129, ".hidden", "a..b"])
def test_names_are_validated(zoo, bad):
    with pytest.raises(ZooError, match="invalid model name|name is required"):
        publish(model=make_mlp(), name=bad, zoo=zoo)


def test_bad_versions_and_aliases(zoo):
    with pytest.raises(ZooError, match="invalid version"):
        publish(model=make_mlp(), name="m", version="../1", zoo=zoo)
    publish(model=make_mlp(), name="m", zoo=zoo)
    with pytest.raises(ZooError, match="'latest' is reserved"):
        set_alias("m", "latest", "1", zoo=zoo)
    with pytest.raises(ZooError, match="has no version or alias '7'"):
        set_alias("m", "prod", "7", zoo=zoo)
    with pytest.raises(ZooError, match="no model named 'nope'.*models here: m"):
        load_model("nope", zoo=zoo)


def test_alias_history_is_logged(zoo):
    publish(model=make_mlp(), name="m", zoo=zoo)
    publish(model=MLP(hidden=8), name="m", alias="staging", model_class="helpers.toy_models:MLP",
            model_kwargs={"hidden": 8}, zoo=zoo)
    first = set_alias("m", "prod", "1", zoo=zoo)
    second = set_alias("m", "prod", "2", zoo=zoo)
    assert (first["previous"], second["previous"]) == (None, "1")
    info = show("m", zoo=zoo)
    assert info["aliases"] == {"prod": "2", "staging": "2"}
    hist = [(h["alias"], h["previous"], h["version"]) for h in info["alias_history"]]
    assert hist == [("staging", None, "2"), ("prod", None, "1"), ("prod", "1", "2")]
    assert all(h["time_utc"] and h["who"] == "tester@ci" for h in info["alias_history"])
    assert load_model("m@prod", zoo=zoo).net[0].out_features == 8
    assert load_model("m", version="1", zoo=zoo).net[0].out_features == 32
    assert show("m@prod", zoo=zoo)["version"] == "2"


def test_tamper_is_detected_and_nothing_loads(zoo):
    rec = publish(model=make_mlp(), name="m", zoo=zoo)
    weights = __import__("pathlib").Path(rec["path"]) / "weights/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # a flipped bit in a tensor, not in the header: safetensors itself would not notice
    weights.write_bytes(bytes(data))
    with pytest.raises(ZooIntegrityError, match=r"nothing was loaded: weights/model\.safetensors: sha256 mismatch"):
        load_model("m", zoo=zoo)
    report = verify("m", zoo=zoo)
    assert not report["ok"] and report["versions"][0]["problems"] == [
        "weights/model.safetensors: sha256 mismatch (file changed)"]
    with pytest.raises(ZooIntegrityError):
        pull("m", __import__("pathlib").Path(zoo).parent / "out", zoo=zoo)
    assert not (__import__("pathlib").Path(zoo).parent / "out").exists()


def test_default_location_honours_xdg_cache_home(tmp_path, monkeypatch):
    from cann_export.model_zoo.location import default_zoo

    monkeypatch.delenv("CANN_MODEL_ZOO", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_zoo() == str(tmp_path / "cache" / "cann-export" / "zoo")
    rec = publish(model=str(write_weights(tmp_path / "w.safetensors", 0)), name="w", **WIDE)
    assert rec["path"].startswith(str(tmp_path / "cache" / "cann-export" / "zoo"))
    monkeypatch.setenv("CANN_MODEL_ZOO", str(tmp_path / "elsewhere"))
    assert list_models() == []


def test_index_schema_constraints(zoo, tmp_path):
    publish(model=str(write_weights(tmp_path / "w.safetensors", 0)), name="w", zoo=zoo, **WIDE)
    db = sqlite3.connect(f"{zoo}/index.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    row = db.execute("SELECT * FROM versions").fetchone()
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO versions SELECT * FROM versions")
    assert json.loads(row[9]) == ["pytorch"]
