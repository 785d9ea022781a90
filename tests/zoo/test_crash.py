"""Model zoo guarantees under crashes and concurrency: SIGKILL at each commit point, 8 racing publishers."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import crash
from helpers.zoo_models import write_weights

from cann.model_zoo import list_models, load_model, publish, verify

TESTS = str(Path(__file__).resolve().parents[1])
WIDE = "helpers.zoo_models:Wide"


def _cls(n: int = 64) -> list[str]:
    """The architecture of write_weights(n=...) files (a bare state_dict is refused at publish)."""
    return ["--model-class", WIDE, "--model-kwargs", json.dumps({"width": n, "depth": 1})]


def _kw(n: int = 64) -> dict:
    return {"model_class": WIDE, "model_kwargs": {"width": n, "depth": 1}}


def _env(**extra):
    env = dict(os.environ)
    env["CANN_EXPORT_LOAD_PLUGINS"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _index_rows(zoo: Path) -> list[tuple[str, str, str]]:
    if not (zoo / "index.sqlite").exists():
        return []
    db = sqlite3.connect(str(zoo / "index.sqlite"))
    try:
        return db.execute("SELECT name, version, path FROM versions").fetchall()
    finally:
        db.close()


def _assert_consistent(zoo: Path) -> None:
    """Every index row points at a complete version directory whose files match their sha256."""
    for name, version, rel in _index_rows(zoo):
        manifest = json.loads((zoo / rel / "manifest.json").read_text())
        for f in manifest["files"]:
            assert (zoo / rel / f).is_file(), f"{name}@{version}: index row points at missing {f}"
    for row in list_models(zoo=str(zoo)):
        assert verify(row["name"], zoo=str(zoo))["ok"]


@pytest.mark.parametrize("point", ["copy", "staged", "manifest", "renamed"])
def test_sigkill_during_publish_leaves_no_visible_version(tmp_path, point):
    zoo = tmp_path / "zoo"
    weights = write_weights(tmp_path / "w.safetensors", seed=1, n=600)  # > one copy block
    marker = tmp_path / "reached"
    proc = crash.run(point, marker, ["zoo", "publish", str(weights), "--name", "m", "--zoo", str(zoo), "--json",
                                     *_cls(600)], env=_env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert crash.reached(marker, point), "the child was killed before it reached the crash point"
    assert list_models(zoo=str(zoo)) == []
    assert _index_rows(zoo) == []
    leftovers = list((zoo / ".tmp").iterdir()) + list((zoo / "models").glob("m/*"))
    assert leftovers, "the kill should have left staging or an uncommitted directory behind"
    # the next publish cleans the stale staging / orphan directory and commits normally
    rec = publish(model=str(weights), name="m", zoo=str(zoo), **_kw(600))
    assert (rec["version"], rec["existed"]) == ("1", False)
    assert list((zoo / ".tmp").iterdir()) == []
    assert sorted(p.name for p in (zoo / "models" / "m").iterdir()) == ["1"]
    _assert_consistent(zoo)


def test_sigkill_after_commit_keeps_a_complete_version(tmp_path):
    zoo = tmp_path / "zoo"
    weights = write_weights(tmp_path / "w.safetensors", seed=2)
    marker = tmp_path / "reached"
    proc = crash.run("committed", marker, ["zoo", "publish", str(weights), "--name", "m", "--zoo", str(zoo), *_cls()],
                     env=_env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert crash.reached(marker, "committed")
    assert [r["versions"] for r in list_models(zoo=str(zoo))] == [["1"]]
    _assert_consistent(zoo)
    assert publish(model=str(weights), name="m", zoo=str(zoo), **_kw())["existed"]


def test_external_sigkill_mid_publish(tmp_path):
    """A kill from outside at an arbitrary moment (here: while the manifest is about to be renamed in)."""
    zoo = tmp_path / "zoo"
    weights = write_weights(tmp_path / "w.safetensors", seed=3)
    marker = tmp_path / "reached"
    proc = subprocess.Popen(crash.command("manifest", marker, ["zoo", "publish", str(weights), "--name", "m",
                                                               "--zoo", str(zoo), *_cls()], sleep=60),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not crash.reached(marker, "manifest"):
        time.sleep(0.05)
    assert crash.reached(marker, "manifest"), f"the child never reached the manifest (exit {proc.poll()})"
    assert list((zoo / ".tmp").glob("*/manifest.json")), "the manifest should be staged, not yet renamed in"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert list_models(zoo=str(zoo)) == [] and _index_rows(zoo) == []
    assert publish(model=str(weights), name="m", zoo=str(zoo), **_kw())["version"] == "1"
    _assert_consistent(zoo)


def _onnx(path: Path, seed: int) -> Path:
    """A one-MatMul ONNX model whose weight depends on ``seed``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((4, 4)).astype("float32"), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    onnx.checker.check_model(graph_model := helper.make_model(graph))
    onnx.save(graph_model, str(path))
    return path


def _race(tmp_path: Path, zoo: Path, extra: list[str]) -> list[subprocess.CompletedProcess]:
    go = tmp_path / "go"
    script = ("import os, sys, time\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
              "from cann_export.cli.main import main\nsys.argv = ['cann-export'] + sys.argv[1:]\nmain()\n")
    procs = []
    for i in range(8):  # small distinct ONNX graphs: publishing them needs no torch import, so the race is at commit
        w = _onnx(tmp_path / f"m{i}.onnx", seed=100 + i)
        procs.append(subprocess.Popen([sys.executable, "-c", script, "zoo", "publish", str(w), "--name", "race",
                                       "--zoo", str(zoo), "--json", *extra], env=_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    time.sleep(1.0)  # let every process import and wait at the barrier
    go.touch()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_eight_concurrent_publishers_get_distinct_versions(tmp_path):
    zoo = tmp_path / "zoo"
    results = _race(tmp_path, zoo, [])
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results]
    versions = sorted(int(json.loads(r.stdout)["version"]) for r in results)
    assert versions == list(range(1, 9))
    assert sorted(v for _, v, _ in _index_rows(zoo)) == sorted(str(v) for v in range(1, 9))
    _assert_consistent(zoo)


def test_eight_concurrent_publishers_same_explicit_version_conflict_cleanly(tmp_path):
    zoo = tmp_path / "zoo"
    results = _race(tmp_path, zoo, ["--version", "2.0"])
    ok = [r for r in results if r.returncode == 0]
    refused = [r for r in results if r.returncode != 0]
    assert len(ok) == 1 and len(refused) == 7
    for r in refused:
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert json.loads(r.stdout)["error"]["message"].startswith("race version 2.0 already exists")
    assert [v for _, v, _ in _index_rows(zoo)] == ["2.0"]
    assert list((zoo / ".tmp").iterdir()) == []
    winner = json.loads(ok[0].stdout)
    import onnx

    onnx.checker.check_model(onnx.load(load_model("race", framework="onnx", zoo=str(zoo))))
    assert winner["version"] == "2.0"
