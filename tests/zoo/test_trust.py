"""A zoo a deploy step can trust end to end, against someone who can write to the store (the local
directory + SQLite index, or the S3 bucket on a moto server): signed alias records with sequence numbers
refuse rollbacks and forged pointers, publish never reuses a planted blob, and every blob a load reads is
verified (bounded) before use, from a private copy."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
import torch
from helpers.zoo_models import Wide, write_weights

from cann.model_zoo import ZooError, ZooIntegrityError, load_model, publish, pull, set_alias, show, verify
from cann_export.model_zoo.signing import keygen, sealer

WIDE = {"model_class": "helpers.zoo_models:Wide", "model_kwargs": {"width": 16, "depth": 1}}


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_MODEL_ZOO_TRUST", str(tmp_path / "trust.json"))  # this client's trusted state
    monkeypatch.setenv("CANN_MODEL_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CANN_MODEL_ZOO_ALLOW_MODULES", "helpers")
    monkeypatch.setenv("CANN_MODEL_ZOO_USER", "tester@ci")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {w: (Path(keygen(d / w)["private_key"]), d / f"{w}.pub") for w in ("a", "b")}


@pytest.fixture(scope="module")
def s3():
    from helpers.zoo_s3 import LoopbackS3

    server = LoopbackS3()
    yield server
    server.close()


def _two_signed_versions(zoo, tmp_path, key):
    """v1 (prod -> 1, sequence 1) and v2, then prod -> 2 (sequence 2); returns the weights of both."""
    w1, w2 = (write_weights(tmp_path / f"w{i}.safetensors", i, n=16) for i in (1, 2))
    assert publish(model=str(w1), name="m", zoo=zoo, alias="prod", sign=str(key), **WIDE)["signed"]
    publish(model=str(w2), name="m", zoo=zoo, sign=str(key), **WIDE)
    moved = set_alias("m", "prod", "2", zoo=zoo, sign=str(key))
    assert (moved["sequence"], moved["signed"], moved["previous"]) == (2, True, "1")
    return w1, w2


def _bias(module):
    return module.layers[0].bias.detach()


def _expected_bias(weights):
    from safetensors.torch import load_file

    return load_file(str(weights))["layers.0.bias"]


# --------------------------------------------------------------------------------- local store


def _db(zoo):
    return sqlite3.connect(str(Path(zoo) / "index.sqlite"), isolation_level=None)


def test_local_signed_aliases_refuse_rollbacks_and_forgeries(tmp_path, keys):
    zoo = str(tmp_path / "zoo")
    (a_key, a_pub), (b_key, _) = keys["a"], keys["b"]
    _, w2 = _two_signed_versions(zoo, tmp_path, a_key)
    model = load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))  # the happy path, signatures checked
    assert torch.equal(_bias(model), _expected_bias(w2))
    seen = json.loads((tmp_path / "trust.json").read_text())["zoos"]
    assert [(k, e["sequence"], e["version"]) for k, e in next(iter(seen.values())).items()] == [("m@prod", 2, "2")]
    info = show("m", zoo=zoo)
    assert info["aliases_signed"] and info["alias_records"]["prod"]["sequence"] == 2
    with pytest.raises(ZooError, match="is signed .* pass --sign KEY"):
        set_alias("m", "prod", "1", zoo=zoo)  # a signed version's alias needs the key
    with pytest.raises(ZooIntegrityError, match="not by the required key"):
        set_alias("m", "canary", "1", zoo=zoo, sign=str(b_key))  # another key never signs a version it did not
    db = _db(zoo)
    old, current = [r[0] for r in db.execute("SELECT record FROM alias_log WHERE alias='prod' ORDER BY id")]

    # 1. the pointer moved back to the older (validly signed) version, the record left alone
    db.execute("UPDATE aliases SET version='1' WHERE alias='prod'")
    with pytest.raises(ZooIntegrityError, match=r"m@prod: the store points the alias at version 1 .* says version 2"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    # 2. ... and the record replaced by the older signed record (sequence 1): the store's log knows sequence 2
    db.execute("UPDATE aliases SET record=? WHERE alias='prod'", (old,))
    with pytest.raises(ZooIntegrityError, match="sequence 1 .* alias log already holds sequence 2"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    # 3. ... and the log rewritten too: this client has accepted sequence 2 already
    db.execute("DELETE FROM alias_log WHERE alias='prod' AND record=?", (current,))
    with pytest.raises(ZooIntegrityError, match="sequence 1 .* already accepted sequence 2 .* refusing a rollback"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    with pytest.raises(ZooIntegrityError, match="already accepted sequence 2"):
        pull("m@prod", tmp_path / "out", zoo=zoo, verify_signature=str(a_pub))
    assert not (tmp_path / "out").exists()
    report = verify("m@prod", zoo=zoo, key=str(a_pub))
    assert not report["ok"] and "rollback" in report["versions"][0]["problems"][0]
    # a client that never saw sequence 2 cannot tell (TUF's limit without expiring metadata)
    fresh = load_model("m@prod", zoo=zoo, verify_signature=str(a_pub), trust_state=tmp_path / "fresh.json")
    assert torch.equal(_bias(fresh), _expected_bias(tmp_path / "w1.safetensors"))

    # a forged record (the version edited, the signature kept) and one signed by another key
    forged = dict(json.loads(current), version="1", manifest_sha256=json.loads(old)["manifest_sha256"])
    db.execute("UPDATE aliases SET record=? WHERE alias='prod'", (json.dumps(forged),))
    with pytest.raises(ZooIntegrityError, match="alias record.*signature does not match"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    resigned = sealer(str(b_key)).sign_record(dict(forged, sequence=9))
    db.execute("UPDATE aliases SET record=? WHERE alias='prod'", (json.dumps(resigned),))
    with pytest.raises(ZooIntegrityError, match="alias record.* not by the required key"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    db.execute("UPDATE aliases SET record=NULL WHERE alias='prod'")  # moved by an old client: no record at all
    with pytest.raises(ZooIntegrityError, match="m@prod -> version 1: there is no alias record .* --sign KEY"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    # moving it forward with the key repairs it: the store's log says 1, this machine has seen 2, so 3
    assert set_alias("m", "prod", "2", zoo=zoo, sign=str(a_key))["sequence"] == 3
    for state in (None, tmp_path / "fresh.json"):
        assert torch.equal(_bias(load_model("m@prod", zoo=zoo, verify_signature=str(a_pub), trust_state=state)),
                           _expected_bias(w2))
    db.close()


def test_unsigned_zoo_keeps_working_and_says_so(tmp_path, keys):
    zoo = str(tmp_path / "zoo")
    publish(model=str(write_weights(tmp_path / "w.safetensors", 3, n=16)), name="u", zoo=zoo, alias="prod", **WIDE)
    assert set_alias("u", "prod", "1", zoo=zoo)["signed"] is False
    load_model("u@prod", zoo=zoo)  # no verify_signature: no alias checks
    info = show("u", zoo=zoo)
    assert info["aliases_signed"] is False and info["alias_records"]["prod"] == {
        **info["alias_records"]["prod"], "signed": False, "sequence": 2, "key_id": None}
    with pytest.raises(ZooIntegrityError, match="not signed"):
        load_model("u@prod", zoo=zoo, verify_signature=str(keys["a"][1]))
    assert not (tmp_path / "trust.json").exists()


def _spy(monkeypatch, module, attr, seen):
    real = getattr(module, attr)

    def spy(path, *args, **kwargs):
        seen.append((str(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, attr, spy)


def test_local_tampered_or_planted_weights_are_refused_and_loads_use_a_private_copy(tmp_path, monkeypatch):
    import safetensors.torch

    zoo = tmp_path / "zoo"
    publish(model=str(write_weights(tmp_path / "w.safetensors", 4, n=16)), name="t", zoo=str(zoo), **WIDE)
    stored = zoo / "models/t/1/weights/model.safetensors"
    good = stored.read_bytes()
    stored.write_bytes(good + b"\0" * 64)  # longer than recorded: read no further than size + 1
    with pytest.raises(ZooIntegrityError, match="longer than the .* bytes recorded"):
        load_model("t", zoo=str(zoo))
    stored.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(ZooIntegrityError, match="weights/model.safetensors: sha256 mismatch"):
        load_model("t", zoo=str(zoo))
    stored.unlink()
    os.mkfifo(stored)  # a planted FIFO would block a plain open() forever
    with pytest.raises(ZooIntegrityError, match="not a regular file"):
        pull("t", tmp_path / "out", zoo=str(zoo))
    assert not (tmp_path / "out").exists()
    stored.unlink()
    stored.write_bytes(good)
    seen = []
    _spy(monkeypatch, safetensors.torch, "load_file", seen)
    assert isinstance(load_model("t", zoo=str(zoo)), Wide)
    (path, digest), = seen  # safetensors read a private verified copy, removed after the load
    assert not path.startswith(str(zoo)) and digest == hashlib.sha256(good).hexdigest() and not Path(path).exists()


def test_torch_program_loads_through_the_checked_loader_on_a_verified_copy(tmp_path, monkeypatch):
    from helpers.toy_models import make_mlp

    import cann_export.load.archive_safety as archive_safety

    zoo = tmp_path / "zoo"
    model = make_mlp()
    publish(model=model, name="p", zoo=str(zoo), example_inputs=(torch.randn(2, 12),))
    program = zoo / "models/p/1/architecture/program.pt2"
    seen = []
    _spy(monkeypatch, archive_safety, "load_exported_program", seen)
    x = torch.randn(2, 12)
    with torch.no_grad():
        assert torch.allclose(load_model("p", zoo=str(zoo))(x), model.eval()(x))
    (path, digest), = seen
    assert not path.startswith(str(zoo)) and digest == hashlib.sha256(program.read_bytes()).hexdigest()
    body = bytearray(program.read_bytes())
    body[len(body) // 2] ^= 0xFF
    program.write_bytes(bytes(body))
    with pytest.raises(ZooIntegrityError, match="architecture/program.pt2: sha256 mismatch"):
        load_model("p", zoo=str(zoo))
    assert len(seen) == 1  # the tampered program never reached the loader


# ------------------------------------------------------------------------------------------ S3


def _key(zoo: str, rel: str) -> str:
    return zoo.split("?")[0].split("/", 3)[3] + "/" + rel


def test_s3_signed_aliases_refuse_rollbacks_and_forgeries(s3, tmp_path, keys):
    zoo = s3.new_zoo()
    a_key, a_pub = keys["a"]
    w1, w2 = _two_signed_versions(zoo, tmp_path, a_key)
    log = _key(zoo, "models/m/aliases/prod/")
    get = lambda n: s3.client.get_object(Bucket=s3.bucket, Key=f"{log}{n:08d}.json")["Body"].read()  # noqa: E731
    put = lambda n, body: s3.client.put_object(Bucket=s3.bucket, Key=f"{log}{n:08d}.json", Body=body)  # noqa: E731
    first, second = json.loads(get(1)), json.loads(get(2))
    assert (first["record"]["sequence"], second["record"]["sequence"]) == (1, 2) and "signature" in second["record"]
    out = pull("m@prod", tmp_path / "out", zoo=zoo, verify_signature=str(a_pub))  # the happy path
    assert out["alias"]["sequence"] == 2 and out["version"] == "2"
    assert torch.equal(_bias(load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))), _expected_bias(w2))

    put(3, json.dumps(dict(second, version="1")))  # the bucket writer moves the pointer, keeps the record
    with pytest.raises(ZooIntegrityError, match="points the alias at version 1 .* says version 2"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    put(3, get(1))  # ... or replays the older signed record (sequence 1) as the newest log entry
    with pytest.raises(ZooIntegrityError, match="sequence 1 .* alias log already holds sequence 2"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    for n in (2, 3):  # ... and cuts the log back to it: this client has accepted sequence 2
        s3.client.delete_object(Bucket=s3.bucket, Key=f"{log}{n:08d}.json")
    with pytest.raises(ZooIntegrityError, match="sequence 1 .* already accepted sequence 2 .* rollback"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    assert load_model("m@prod", zoo=zoo) is not None  # without verify_signature nothing is checked (unsigned use)
    put(2, json.dumps(dict(first, record=dict(first["record"], sequence=7))))  # a forged sequence
    with pytest.raises(ZooIntegrityError, match="alias record.*signature does not match"):
        load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))
    assert set_alias("m", "prod", "2", zoo=zoo, sign=str(a_key))["sequence"] >= 3  # forward past the seen 2
    assert torch.equal(_bias(load_model("m@prod", zoo=zoo, verify_signature=str(a_pub))), _expected_bias(w2))
    assert show("m", zoo=zoo)["alias_records"]["prod"]["signed"] and w1.is_file()


def test_s3_planted_blob_is_not_reused_and_tampered_weights_are_refused(s3, tmp_path, keys):
    zoo = s3.new_zoo()
    w = write_weights(tmp_path / "w.safetensors", 9, n=16)
    good = w.read_bytes()
    digest = hashlib.sha256(good).hexdigest()  # publish stores the weights file byte for byte
    blob = _key(zoo, f"blobs/sha256/{digest}")
    s3.client.put_object(Bucket=s3.bucket, Key=blob, Body=good[:-4] + b"evil")  # planted under the right name
    publish(model=str(w), name="b", zoo=zoo, sign=str(keys["a"][0]), **WIDE)
    assert s3.client.get_object(Bucket=s3.bucket, Key=blob)["Body"].read() == good  # replaced, not reused
    assert verify("b", zoo=zoo, key=str(keys["a"][1]))["ok"]
    s3.client.put_object(Bucket=s3.bucket, Key=blob, Body=good + b"\0" * 1024)  # tampered after publish
    with pytest.raises(ZooIntegrityError, match="longer than the .* bytes recorded"):
        load_model("b", zoo=zoo, verify_signature=str(keys["a"][1]))
    assert not list((tmp_path / "cache").rglob(digest))  # nothing unverified reached the cache
    s3.client.put_object(Bucket=s3.bucket, Key=blob, Body=good)
    assert torch.equal(_bias(load_model("b", zoo=zoo, verify_signature=str(keys["a"][1]))), _expected_bias(w))


def test_cli_alias_sign_pull_key_and_show(tmp_path, keys):
    from click.testing import CliRunner

    from cann_export.cli.main import cli
    from cann_export.hooks.manager import get_plugin_manager

    get_plugin_manager().hook.register_commands(cli=cli)
    zoo = str(tmp_path / "zoo")
    (a_key, a_pub) = keys["a"]
    _two_signed_versions(zoo, tmp_path, a_key)

    def run(*args):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    refused = run("zoo", "alias", "m", "prod", "1", "--zoo", zoo)
    assert refused.exit_code != 0 and "--sign KEY" in refused.output and "Traceback" not in refused.output
    moved = run("zoo", "alias", "m", "prod", "1", "--sign", a_key, "--zoo", zoo, "--json")
    assert moved.exit_code == 0 and json.loads(moved.stdout)["sequence"] == 3
    pulled = run("zoo", "pull", "m@prod", "-o", tmp_path / "out", "--key", a_pub, "--zoo", zoo, "--json")
    assert pulled.exit_code == 0 and json.loads(pulled.stdout)["alias"]["sequence"] == 3
    assert "alias prod -> 1 (signed by key" in run("zoo", "show", "m", "--zoo", zoo).stdout
    _db(zoo).execute("UPDATE aliases SET version='2' WHERE alias='prod'")
    rolled = run("zoo", "verify", "m@prod", "--key", a_pub, "--zoo", zoo, "--json")
    assert rolled.exit_code == 1 and "pointer was edited" in json.loads(rolled.stdout)["versions"][0]["problems"][0]
