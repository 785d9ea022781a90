"""Model zoo on S3: the same guarantees against a real S3-compatible server (moto) on loopback, via s3fs."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from helpers import crash
from helpers.toy_models import MLP, make_mlp
from helpers.zoo_models import write_weights

from cann.model_zoo import (
    ZooConflictError,
    ZooIntegrityError,
    list_models,
    load_model,
    publish,
    pull,
    set_alias,
    show,
    verify,
)


@pytest.fixture(scope="session")
def s3():
    from helpers.zoo_s3 import LoopbackS3

    server = LoopbackS3()
    yield server
    server.close()


@pytest.fixture
def zoo(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_MODEL_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CANN_MODEL_ZOO_ALLOW_MODULES", "helpers")  # the test models' module (see test_hostile_zoo)
    return s3.new_zoo()


def test_s3_round_trip_immutability_aliases(zoo, s3, tmp_path):
    model = make_mlp()
    rec = publish(model=model, name="mlp", metadata={"license": "mit"}, zoo=zoo)
    assert (rec["version"], rec["existed"]) == ("1", False) and rec["zoo"].startswith("s3://zoo-tests/")
    assert publish(model=model, name="mlp", metadata={"license": "mit"}, zoo=zoo)["existed"]
    with pytest.raises(ZooConflictError):
        publish(model=MLP(), name="mlp", version="1", zoo=zoo)
    publish(model=str(write_weights(tmp_path / "w.safetensors", 0, n=12)), name="mlp", zoo=zoo,
            model_class="helpers.zoo_models:Wide", model_kwargs={"width": 12, "depth": 1})
    x = torch.randn(2, 12)
    with torch.no_grad():
        assert torch.allclose(load_model("mlp@1", zoo=zoo)(x), model.eval()(x))
    set_alias("mlp", "prod", "1", zoo=zoo)
    set_alias("mlp", "prod", "2", zoo=zoo)
    info = show("mlp", zoo=zoo)
    assert info["aliases"] == {"prod": "2"}
    assert [(h["previous"], h["version"]) for h in info["alias_history"]] == [(None, "1"), ("1", "2")]
    assert [r["versions"] for r in list_models(zoo=zoo)] == [["1", "2"]]
    assert verify("mlp", zoo=zoo)["ok"]
    # the layout: content-addressed blobs, a manifest per version, a write-once alias log
    prefix = zoo.split("?")[0][len("s3://"):]
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix.split("/", 1)[1])["Contents"]]
    rel = sorted(k.split("/", 1)[1] for k in keys)
    assert "models/mlp/1/manifest.json" in rel and "models/mlp/aliases/prod/00000002.json" in rel
    # README + weights per version; the refused publish uploaded nothing
    assert sum(k.startswith("blobs/sha256/") for k in rel) == 4
    out = pull("mlp@prod", tmp_path / "pulled", zoo=zoo)
    assert (tmp_path / "pulled" / "weights" / "model.safetensors").is_file() and out["version"] == "2"


def test_s3_tampered_blob_is_reported_and_not_loaded(zoo, s3, tmp_path):
    publish(model=make_mlp(), name="m", zoo=zoo)
    manifest = show("m", zoo=zoo)["manifest"]
    digest = manifest["files"]["weights/model.safetensors"]["sha256"]
    key = zoo.split("?")[0].split("/", 3)[3] + f"/blobs/sha256/{digest}"
    body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[-3] ^= 0xFF
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
    report = verify("m", zoo=zoo)
    assert not report["ok"] and "weights/model.safetensors: sha256 mismatch" in report["versions"][0]["problems"][0]
    with pytest.raises(ZooIntegrityError, match="weights/model.safetensors|blob"):
        load_model("m", zoo=zoo)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob(f"blobs/{digest}"))


def test_s3_sigkill_before_manifest_leaves_no_version(zoo, s3, tmp_path):
    """Killed with every blob uploaded and the manifest not yet created: no version is visible."""
    weights = write_weights(tmp_path / "w.safetensors", 5)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CANN_EXPORT_LOAD_PLUGINS="", CANN_MODEL_ZOO=zoo,
               PYTHONPATH=os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p))
    wide = {"model_class": "helpers.zoo_models:Wide", "model_kwargs": {"width": 64, "depth": 1}}
    marker = tmp_path / "reached"
    proc = crash.run("remote-staged", marker, ["zoo", "publish", str(weights), "--name", "k", "--model-class",
                                               wide["model_class"], "--model-kwargs", '{"width": 64, "depth": 1}'],
                     env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert crash.reached(marker, "remote-staged")
    assert list_models(zoo=zoo) == []
    rec = publish(model=str(weights), name="k", zoo=zoo, **wide)
    assert (rec["version"], rec["existed"]) == ("1", False)
    assert verify("k", zoo=zoo)["ok"]
