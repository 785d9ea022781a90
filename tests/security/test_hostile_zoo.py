"""The model zoo against someone who can write to the store (a shared S3 bucket, the local zoo directory):
no code runs from a manifest, forged names never touch the filesystem, signatures are enforced, and
--overwrite / gc remove only what the zoo wrote. Plus the articles' round trip: export -> publish ->
load_model(framework="pytorch") with no model_class."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.toy_models import make_mlp

from cann.model_zoo import ZooError, ZooIntegrityError, load_model, publish, pull, show, verify
from cann_export.cli.main import cli
from cann_export.hooks.manager import get_plugin_manager
from cann_export.model_zoo.file_copies import manifest_bytes, manifest_digest


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


@pytest.fixture(autouse=True)
def no_allow_list(monkeypatch):
    monkeypatch.delenv("CANN_MODEL_ZOO_ALLOW_MODULES", raising=False)
    monkeypatch.setenv("CANN_MODEL_ZOO_USER", "tester@ci")


@pytest.fixture(scope="module")
def s3():
    from helpers.zoo_s3 import LoopbackS3

    server = LoopbackS3()
    yield server
    server.close()


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# ------------------------------------------------------------------------------- forging helpers


def _forge_local(zoo: Path, name: str, version: str, edit) -> None:
    """Edit a local version's manifest as an attacker with write access would: recompute the digest, and
    the digest and manifest sha256 in index.sqlite."""
    path = zoo / "models" / name / version / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    manifest["digest"] = manifest_digest(manifest)
    body = manifest_bytes(manifest)
    path.write_bytes(body)
    db = sqlite3.connect(str(zoo / "index.sqlite"))
    with db:
        db.execute("UPDATE versions SET digest=?, manifest_sha256=? WHERE name=? AND version=?",
                   (manifest["digest"], hashlib.sha256(body).hexdigest(), name, version))
    db.close()


def _s3_key(s3, zoo: str, rel: str) -> str:
    return zoo.split("?")[0].split("/", 3)[3] + "/" + rel


def _forge_s3(s3, zoo: str, name: str, version: str, edit) -> None:
    key = _s3_key(s3, zoo, f"models/{name}/{version}/manifest.json")
    manifest = json.loads(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    edit(manifest)
    manifest["digest"] = manifest_digest(manifest)
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=manifest_bytes(manifest))


def _subprocess_arch(marker: Path):
    def edit(manifest):
        manifest["architecture"] = {"kind": "callable", "callable": "subprocess:call",
                                    "kwargs": {"args": [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]}}
    return edit


# ------------------------------------------------------------------------ no code from a manifest


def test_callable_architecture_never_runs_local(tmp_path):
    zoo, marker = tmp_path / "zoo", tmp_path / "RAN"
    publish(model=make_mlp(), name="m", zoo=str(zoo))
    _forge_local(zoo, "m", "1", _subprocess_arch(marker))
    assert verify("m", zoo=str(zoo))["ok"]  # the files are intact: only the architecture was changed
    with pytest.raises(ZooError, match=r"callable 'subprocess:call'.*model_class=.*"
                                       r"allow_modules=\['subprocess'\].*CANN_MODEL_ZOO_ALLOW_MODULES=subprocess"):
        load_model("m", zoo=str(zoo))
    assert not marker.exists()
    # an allow-list for the consumer's own package does not allow another module
    os.environ["CANN_MODEL_ZOO_ALLOW_MODULES"] = "helpers"
    try:
        with pytest.raises(ZooError, match="subprocess:call"):
            load_model("m", zoo=str(zoo), allow_modules=["subprocessx", "sub"])
    finally:
        del os.environ["CANN_MODEL_ZOO_ALLOW_MODULES"]
    assert not marker.exists()
    # the consumer naming the class itself loads the (verified) weights
    x = torch.randn(2, 12)
    with torch.no_grad():
        assert torch.equal(load_model("m", zoo=str(zoo), model_class="helpers.toy_models:MLP")(x),
                           make_mlp().eval()(x))


def test_recorded_callable_loads_only_when_its_module_is_allowed(tmp_path, monkeypatch):
    zoo = str(tmp_path / "zoo")
    publish(model=make_mlp(), name="m", zoo=zoo)
    with pytest.raises(ZooError, match="allow_modules=\\['helpers.toy_models'\\]"):
        load_model("m", zoo=zoo)
    assert isinstance(load_model("m", zoo=zoo, allow_modules=["helpers"]), torch.nn.Module)
    monkeypatch.setenv("CANN_MODEL_ZOO_ALLOW_MODULES", "other, helpers.toy_models")
    assert isinstance(load_model("m", zoo=zoo), torch.nn.Module)


def test_callable_architecture_never_runs_s3(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_MODEL_ZOO_CACHE", str(tmp_path / "cache"))
    zoo, marker = s3.new_zoo(), tmp_path / "RAN"
    publish(model=make_mlp(), name="m", zoo=zoo)
    _forge_s3(s3, zoo, "m", "1", _subprocess_arch(marker))
    assert verify("m", zoo=zoo)["ok"]
    with pytest.raises(ZooError, match="subprocess:call.*CANN_MODEL_ZOO_ALLOW_MODULES"):
        load_model("m", zoo=zoo)
    assert not marker.exists()


# --------------------------------------------------------------------- forged content-derived names


def test_forged_s3_cache_digest_deletes_nothing(s3, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CANN_MODEL_ZOO_CACHE", str(cache))
    zoo = s3.new_zoo()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    publish(model=make_mlp(), name="m", zoo=zoo, model_class="helpers.toy_models:MLP")
    pull("m", tmp_path / "warm", zoo=zoo)  # a warm cache
    blobs = next(cache.glob("*/blobs"))
    forged = os.path.relpath(victim, blobs)  # '../' * depth + the victim: resolves to the victim file
    assert forged.startswith("../../") and (blobs / forged).resolve() == victim.resolve()
    _forge_s3(s3, zoo, "m", "1", lambda m: m["files"]["README.md"].update({"sha256": forged}))
    for call in (lambda: pull("m", tmp_path / "out", zoo=zoo), lambda: load_model("m", zoo=zoo),
                 lambda: load_model("m", zoo=zoo, model_class="helpers.toy_models:MLP")):
        with pytest.raises(ZooIntegrityError, match="sha256 that is not 64 hex digits"):
            call()
    report = verify("m", zoo=zoo)
    assert not report["ok"] and "not 64 hex digits" in report["versions"][0]["problems"][0]
    assert victim.read_text() == "precious" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m["files"].update({"../../escape.txt": m["files"]["README.md"]}), "outside the version"),
    (lambda m: m["files"].update({"/etc/passwd": m["files"]["README.md"]}), "outside the version"),
    (lambda m: m["weights"].update({"file": "../weights.safetensors"}), "not in its file table"),
    (lambda m: m.update({"artifacts": {"../x": {"path": "artifacts/../x", "model_file": "a"}}}), "not a plain name"),
    (lambda m: m["files"]["README.md"].update({"size": -1}), "invalid size"),
])
def test_forged_file_table_is_refused_local(tmp_path, edit, needle):
    zoo = tmp_path / "zoo"
    publish(model=make_mlp(), name="m", zoo=str(zoo), model_class="helpers.toy_models:MLP")
    _forge_local(zoo, "m", "1", edit)
    with pytest.raises(ZooIntegrityError, match=needle):
        pull("m", tmp_path / "out", zoo=str(zoo))
    with pytest.raises(ZooIntegrityError, match=needle):
        load_model("m", zoo=str(zoo), model_class="helpers.toy_models:MLP")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()


def test_forged_s3_version_name_is_refused(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("CANN_MODEL_ZOO_CACHE", str(tmp_path / "cache"))
    zoo = s3.new_zoo()
    publish(model=make_mlp(), name="m", zoo=zoo, model_class="helpers.toy_models:MLP")
    _forge_s3(s3, zoo, "m", "1", lambda m: m.update({"version": "../../../../escape"}))
    with pytest.raises(ZooIntegrityError, match="names another model or version"):
        load_model("m", zoo=zoo, model_class="helpers.toy_models:MLP")
    assert not list(tmp_path.rglob("escape"))


def test_manifest_bytes_are_pinned_by_the_index(tmp_path):
    zoo = tmp_path / "zoo"
    rec = publish(model=make_mlp(), name="m", zoo=str(zoo), model_class="helpers.toy_models:MLP")
    path = zoo / "models" / "m" / "1" / "manifest.json"
    assert rec["manifest_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert show("m", zoo=str(zoo))["manifest_sha256"] == rec["manifest_sha256"]
    db = sqlite3.connect(str(zoo / "index.sqlite"))
    assert db.execute("SELECT manifest_sha256 FROM versions").fetchone()[0] == rec["manifest_sha256"]
    db.close()
    pulled = pull("m", tmp_path / "out", zoo=str(zoo))
    assert pulled["manifest_sha256"] == rec["manifest_sha256"]
    assert hashlib.sha256((tmp_path / "out" / "manifest.json").read_bytes()).hexdigest() == rec["manifest_sha256"]
    # the same content re-serialised (digest still valid) is not the published file
    path.write_text(json.dumps(json.loads(path.read_text())))
    with pytest.raises(ZooIntegrityError, match="changed after publish .not the file that was published"):
        load_model("m", zoo=str(zoo), model_class="helpers.toy_models:MLP")


def test_manifest_sha256_in_cli_json(tmp_path):
    zoo = tmp_path / "zoo"
    weights = tmp_path / "w.pt"
    torch.save(make_mlp().state_dict(), weights)
    result = invoke("zoo", "publish", weights, "--name", "m", "--model-class", "helpers.toy_models:MLP",
                    "--zoo", zoo, "--json")
    assert result.exit_code == 0, result.output
    pinned = json.loads(result.stdout)["manifest_sha256"]
    shown = json.loads(invoke("zoo", "show", "m", "--zoo", zoo, "--json").stdout)
    pulled = json.loads(invoke("zoo", "pull", "m", "-o", tmp_path / "o", "--zoo", zoo, "--json").stdout)
    verified = json.loads(invoke("zoo", "verify", "m", "--zoo", zoo, "--json").stdout)
    assert pinned == shown["manifest_sha256"] == pulled["manifest_sha256"] == verified["versions"][0]["manifest_sha256"]


# ------------------------------------------------------------------------------------- signatures


@pytest.fixture
def keys(tmp_path):
    for who in ("a", "b"):
        result = invoke("zoo", "keygen", "--out", tmp_path / f"{who}.key", "--json")
        assert result.exit_code == 0, result.output
    assert (tmp_path / "a.key").stat().st_mode & 0o077 == 0
    return {w: (tmp_path / f"{w}.key", tmp_path / f"{w}.key.pub") for w in ("a", "b")}


def test_signatures_required_by_the_consumer(tmp_path, keys):
    zoo = tmp_path / "zoo"
    (a_key, a_pub), (b_key, b_pub) = keys["a"], keys["b"]
    weights = tmp_path / "w.pt"
    torch.save(make_mlp().state_dict(), weights)
    cls = ["--model-class", "helpers.toy_models:MLP"]
    assert invoke("zoo", "publish", weights, "--name", "signed", *cls, "--sign", a_key, "--zoo", zoo).exit_code == 0
    assert invoke("zoo", "publish", weights, "--name", "plain", *cls, "--zoo", zoo).exit_code == 0
    good = load_model("signed", zoo=str(zoo), model_class="helpers.toy_models:MLP", verify_signature=str(a_pub))
    x = torch.randn(1, 12)
    with torch.no_grad():
        assert torch.equal(good(x), make_mlp().eval()(x))
    ok = invoke("zoo", "verify", "signed", "--key", a_pub, "--zoo", zoo, "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["versions"][0]["signed_by"]
    with pytest.raises(ZooIntegrityError, match="not signed"):
        load_model("plain", zoo=str(zoo), model_class="helpers.toy_models:MLP", verify_signature=str(a_pub))
    with pytest.raises(ZooIntegrityError, match="not by the required key"):
        load_model("signed", zoo=str(zoo), model_class="helpers.toy_models:MLP", verify_signature=str(b_pub))
    unsigned = invoke("zoo", "verify", "plain", "--key", a_pub, "--zoo", zoo, "--json")
    assert unsigned.exit_code == 1 and "not signed" in json.loads(unsigned.stdout)["versions"][0]["problems"][0]

    # tampered after signing (digest recomputed, signature kept)
    _forge_local(zoo, "signed", "1", lambda m: m["metadata"].update({"license": "stolen"}))
    with pytest.raises(ZooIntegrityError, match="signature does not match"):
        load_model("signed", zoo=str(zoo), model_class="helpers.toy_models:MLP", verify_signature=str(a_pub))
    # re-signed by the attacker's key
    from cann_export.model_zoo.signing import sealer

    _forge_local(zoo, "signed", "1", lambda m: m.update(sealer(str(b_key))(m)))
    with pytest.raises(ZooIntegrityError, match="not by the required key"):
        load_model("signed", zoo=str(zoo), model_class="helpers.toy_models:MLP", verify_signature=str(a_pub))
    assert invoke("zoo", "verify", "signed", "--key", a_pub, "--zoo", zoo).exit_code == 1


def test_signature_binds_name_and_version(tmp_path, keys):
    zoo = tmp_path / "zoo"
    a_key, a_pub = keys["a"]
    publish(model=make_mlp(), name="m", zoo=str(zoo), model_class="helpers.toy_models:MLP", sign=str(a_key))
    publish(model=make_mlp(hidden=8), name="m", zoo=str(zoo), model_class="helpers.toy_models:MLP",
            model_kwargs={"hidden": 8}, sign=str(a_key))
    old = json.loads((zoo / "models/m/1/manifest.json").read_text())
    # replay the signature of version 1 onto version 2's manifest
    _forge_local(zoo, "m", "2", lambda m: m.update({"signature": old["signature"]}))
    with pytest.raises(ZooIntegrityError, match="signature does not match"):
        load_model("m", version="2", zoo=str(zoo), model_class="helpers.toy_models:MLP", verify_signature=str(a_pub))


# ---------------------------------------------------------------------------------- --overwrite


def test_pull_overwrite_replaces_only_an_earlier_pull(tmp_path, monkeypatch):
    zoo = tmp_path / "zoo"
    publish(model=make_mlp(), name="m", zoo=str(zoo), model_class="helpers.toy_models:MLP")
    mine = tmp_path / "data"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ZooError, match="only a directory an earlier pull wrote.*no zoo manifest"):
        pull("m", mine, overwrite=True, zoo=str(zoo))
    assert (mine / "notes.txt").read_text() == "mine"
    with pytest.raises(ZooError, match="the model zoo itself"):
        pull("m", zoo, overwrite=True, zoo=str(zoo))
    with pytest.raises(ZooError, match="the model zoo itself"):
        pull("m", zoo / "models", overwrite=True, zoo=str(zoo))
    assert (zoo / "index.sqlite").is_file()
    monkeypatch.chdir(mine)
    for target in (".", ".."):
        with pytest.raises(ZooError, match="current directory or one of its parents"):
            pull("m", target, overwrite=True, zoo=str(zoo))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "deploy"
    pull("m", out, zoo=str(zoo))
    assert pull("m", out, overwrite=True, zoo=str(zoo))["ok"]  # an earlier pull: replaced
    (out / "extra.bin").write_bytes(b"user data")
    with pytest.raises(ZooError, match="files the pulled version does not list.*extra.bin"):
        pull("m", out, overwrite=True, zoo=str(zoo))
    assert (out / "extra.bin").is_file()
    result = invoke("zoo", "pull", "m", "-o", mine, "--overwrite", "--zoo", zoo, "--json")
    assert result.exit_code == 2 and "earlier pull" in json.loads(result.stdout)["error"]["message"]
    assert (mine / "notes.txt").is_file()


# --------------------------------------------------------------------------------------------- gc


def test_gc_sweeps_stale_staging_of_dead_processes(tmp_path):
    from cann_export.model_zoo import file_copies as files

    zoo = tmp_path / "zoo"
    publish(model=make_mlp(), name="m", zoo=str(zoo), model_class="helpers.toy_models:MLP")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    stale = zoo / ".tmp" / f"{files._HOST}-{dead.stdout.strip()}-1-deadbeef"
    live = files.new_staging(zoo / ".tmp")
    (stale / "weights").mkdir(parents=True)
    (stale / "weights" / "model.safetensors").write_bytes(b"x" * 100)
    orphan = zoo / "models" / "m" / "7"  # a killed commit: a directory with no index row
    orphan.mkdir()
    result = invoke("gc", "--zoo", zoo, "--json")
    assert result.exit_code == 0, result.output
    removed = json.loads(result.stdout)["removed"]
    assert f".tmp/{stale.name}" in removed and "models/m/7" in removed
    assert not stale.exists() and not orphan.exists() and live.is_dir()
    assert (zoo / "models" / "m" / "1" / "manifest.json").is_file()


# ------------------------------------------------------------------------ the articles' round trip


def test_export_publish_load_model_round_trip(tmp_path):
    import cann_export

    torch.manual_seed(0)
    model = make_mlp()
    bundle = tmp_path / "mlp_bundle"
    result = cann_export.export(model, bundle, "atc_ready", example_inputs={"x": torch.randn(2, 12)})
    assert result.ok
    files = json.loads((bundle / "manifest.json").read_text())["files"]
    assert "torch/program.pt2" in files
    zoo = str(tmp_path / "zoo")
    rec = publish(model=str(bundle), metadata={"license": "apache-2.0"}, zoo=zoo)
    assert rec["name"] == "mlp_bundle" and rec["kinds"] == ["pytorch", "atc_ready"]
    arch = show("mlp_bundle", zoo=zoo)["manifest"]["architecture"]
    assert arch["kind"] == "torch.export" and arch["file"] == "architecture/program.pt2"
    loaded = load_model("mlp_bundle", framework="pytorch", zoo=zoo)
    assert isinstance(loaded, torch.nn.Module)
    loaded = loaded.to("cpu")
    x = torch.randn(2, 12)
    with torch.no_grad():
        assert torch.allclose(loaded(x), model.eval()(x), atol=1e-6)
    assert (Path(load_model("mlp_bundle", framework="onnx", zoo=zoo)) / "torch" / "program.pt2").is_file()


def test_loaded_program_moves_to_the_cann_device(tmp_path):
    """``load_model(...).to("cann")`` as the articles write it (npu-sim; in a subprocess: enable() is
    process-wide)."""
    import cann_export

    model = make_mlp()
    bundle = tmp_path / "m"
    assert cann_export.export(model, bundle, "atc_ready", example_inputs={"x": torch.randn(2, 12)}).ok
    zoo = tmp_path / "zoo"
    publish(model=str(bundle), zoo=str(zoo))
    code = (
        "import sys, torch, cann.torch\n"
        "from cann.model_zoo import load_model\n"
        "from helpers.toy_models import make_mlp\n"
        "cann.torch.enable()\n"
        f"m = load_model('m', framework='pytorch', zoo={str(zoo)!r}).to('cann')\n"
        "x = torch.randn(3, 12)\n"
        "with torch.no_grad():\n"
        "    got = m(x.to('cann')).cpu()\n"
        "    want = make_mlp().eval()(x)\n"
        "print('MAX', float((got - want).abs().max()))\n")
    tests = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split("MAX")[1]) < 1e-5, proc.stdout


def test_model_zoo_has_no_import_cycles():
    """Every import inside cann_export.model_zoo (module level and inside functions) forms no cycle, and no
    zoo module reaches for a private name of another package's module."""
    import ast

    import cann_export.model_zoo as pkg

    root = Path(pkg.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        mod = path.stem
        deps = graph.setdefault(mod, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert not any(a.name.startswith("_") and not a.name.endswith("__")
                               for a in node.names), (mod, node.module)
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}

    def visit(mod: str, stack: list[str]) -> None:
        assert mod not in stack, " -> ".join([*stack, mod])
        for dep in graph[mod]:
            visit(dep, [*stack, mod])

    for mod in graph:
        visit(mod, [])


# ------------------------------------------------------------------ paths that are not regular files (issue 41)


@pytest.mark.parametrize("layout", ["bundle manifest.json", "model file"])
def test_publish_of_a_fifo_is_a_clean_refusal(tmp_path, layout):
    """A bundle whose manifest.json is a FIFO gave ``[internal] IsADirectoryError``; a FIFO model file would block."""
    if layout == "bundle manifest.json":
        (tmp_path / "b").mkdir()
        os.mkfifo(tmp_path / "b" / "manifest.json")
        model, shown = tmp_path / "b", "manifest.json is a FIFO"
    else:
        os.mkfifo(tmp_path / "m.pth")
        model, shown = tmp_path / "m.pth", "model file is a FIFO"
    result = subprocess.run([sys.executable, "-m", "cann_export", "zoo", "publish", str(model), "--name", "m",
                             "--zoo", str(tmp_path / "zoo")], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CANN_EXPORT_LOAD_PLUGINS": ""})
    assert result.returncode == 2, result.stderr
    assert "[zoo]" in result.stderr and shown in result.stderr and "not a regular file" in result.stderr
    assert "[internal]" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "zoo" / "models" / "m").exists()
