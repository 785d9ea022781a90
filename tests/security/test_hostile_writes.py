"""The write path under hostile or careless use: --overwrite replaces only what cann-export wrote, concurrent
commits to one target end cleanly, and the staging litter of killed runs is swept."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from helpers import files
from onnx import TensorProto, helper

from cann_export import errors
from cann_export.cli.main import cli
from cann_export.fs import atomic

LITTER = (".cann-tmp-", ".cann-old-", ".cann-lock")


def litter(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if any(m in p.name for m in LITTER))


def export_cli(model: Path, out, *extra, cwd: Path | None = None):
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(model), "-o", str(out), "--no-validate", *extra], catch_exceptions=False)
    finally:
        os.chdir(old)


def refused(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output.lower()
    assert "[write]" in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return files.pt2(tmp_path_factory.mktemp("src"))


def test_overwrite_refuses_a_users_directory(tmp_path, model_file):
    data = tmp_path / "data"
    data.mkdir()
    (data / "results.csv").write_text("a,b\n1,2\n")
    refused(export_cli(model_file, data, "--overwrite"), str(data), "not written by cann-export")
    assert (data / "results.csv").read_text() == "a,b\n1,2\n" and litter(tmp_path) == []


def test_overwrite_replaces_our_bundle_but_not_one_holding_user_files(tmp_path, model_file):
    out = tmp_path / "bundle"
    assert export_cli(model_file, out).exit_code == 0
    assert export_cli(model_file, out, "--overwrite").exit_code == 0  # ours: replaced
    (out / "notes.txt").write_text("mine")
    refused(export_cli(model_file, out, "--overwrite"), "notes.txt")
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.onnx").is_file()
    assert litter(tmp_path) == []


def test_overwrite_refuses_a_forged_manifest_directory(tmp_path, model_file):
    out = tmp_path / "x"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"schema": "someone-else/1", "files": {}}))
    refused(export_cli(model_file, out, "--overwrite"), "not written by cann-export")
    assert (out / "manifest.json").exists()


def test_overwrite_never_replaces_the_models_own_directory(tmp_path):
    src = tmp_path / "models"
    src.mkdir()
    model = files.pt2(src)
    refused(export_cli(model, src, "--overwrite"), "model's own input")
    assert model.is_file()


def test_overwrite_never_replaces_a_zoo_root_or_its_content(tmp_path, model_file):
    zoo = tmp_path / "zoo"
    (zoo / "models" / "m" / "1").mkdir(parents=True)
    (zoo / "index.sqlite").write_bytes(b"SQLite format 3\0")
    (zoo / "models" / "m" / "1" / "manifest.json").write_text(
        json.dumps({"schema": "cann-export/zoo-version/1", "files": {}}))
    refused(export_cli(model_file, zoo, "--overwrite"), "zoo")
    refused(export_cli(model_file, zoo / "models" / "m" / "1", "--overwrite"), "zoo")
    assert (zoo / "index.sqlite").is_file() and (zoo / "models" / "m" / "1" / "manifest.json").is_file()


def test_overwrite_removes_the_external_data_it_no_longer_writes(tmp_path, model_file):
    """An .onnx rewritten without external data takes its old ``.data`` with it; a ``.data`` the old graph did
    not use, or a file a forged graph names, stays."""
    out, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    assert export_cli(model_file, out, "--format", "onnx", "--external-data", "always").exit_code == 0
    assert data.is_file()
    assert export_cli(model_file, out, "--format", "onnx", "--overwrite", "--external-data", "never").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("m.")) == ["m.onnx"]
    onnx.checker.check_model(onnx.load(str(out)))

    data.write_bytes(b"user bytes")  # not named by the graph being replaced
    assert export_cli(model_file, out, "--format", "onnx", "--overwrite").exit_code == 0
    assert data.read_bytes() == b"user bytes"

    keep = tmp_path / "keep.bin"  # a graph of ours naming another file as its external data
    keep.write_bytes(b"k")
    forged = onnx.load(str(out))
    onnx.external_data_helper.set_external_data(forged.graph.initializer[0], "keep.bin")
    forged.graph.initializer[0].data_location = TensorProto.EXTERNAL
    forged.graph.initializer[0].ClearField("raw_data")
    out.write_bytes(forged.SerializeToString())
    data.unlink()
    assert export_cli(model_file, out, "--format", "onnx", "--overwrite").exit_code == 0
    assert keep.read_bytes() == b"k" and litter(tmp_path) == []


@pytest.mark.parametrize("out", [".", "..", "sub/..", "CWD", "CWD_PARENT"])
@pytest.mark.parametrize("fmt", ["atc_ready", "onnx"])
def test_current_directory_and_parents_refused(tmp_path, model_file, out, fmt):
    cwd = tmp_path / "work"
    (cwd / "sub").mkdir(parents=True)
    (cwd / "keep.txt").write_text("k")
    out = {"CWD": str(cwd), "CWD_PARENT": str(tmp_path)}.get(out, out)
    for extra in ((), ("--overwrite",)):
        refused(export_cli(model_file, out, "--format", fmt, *extra, cwd=cwd))
    assert (cwd / "keep.txt").read_text() == "k" and sorted(p.name for p in cwd.iterdir()) == ["keep.txt", "sub"]


def test_onnx_format_replaces_only_our_onnx(tmp_path, model_file):
    foreign = tmp_path / "theirs.onnx"
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save_model(helper.make_model(graph), str(foreign))
    before = foreign.read_bytes()
    refused(export_cli(model_file, foreign, "--format", "onnx", "--overwrite"), "not written by cann-export")
    assert foreign.read_bytes() == before

    ours = tmp_path / "ours.onnx"
    assert export_cli(model_file, ours, "--format", "onnx").exit_code == 0
    assert export_cli(model_file, ours, "--format", "onnx", "--overwrite").exit_code == 0
    assert any(p.key == "cann_export.tool" for p in onnx.load(str(ours)).metadata_props)

    lone = tmp_path / "lone.onnx"  # a companion file without our primary beside it is not ours to replace
    (tmp_path / "lone.onnx.data").write_bytes(b"user bytes")
    with pytest.raises(errors.WriteError, match="companion"):
        staging = atomic.staging_dir(lone)
        (staging / "lone.onnx.data").write_bytes(b"new")
        (staging / "lone.onnx").write_bytes(ours.read_bytes())
        try:
            atomic.commit_files(staging, ["lone.onnx.data", "lone.onnx"], tmp_path, overwrite=True)
        finally:
            atomic.discard(staging)
    assert (tmp_path / "lone.onnx.data").read_bytes() == b"user bytes" and not lone.exists()
    assert litter(tmp_path) == []


def test_symlink_target_refused(tmp_path, model_file):
    real = tmp_path / "real"
    assert export_cli(model_file, real).exit_code == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    refused(export_cli(model_file, link, "--overwrite"), "symbolic link")
    assert link.is_symlink()


# ---------------------------------------------------------------- the commit race

_WORKER = r"""
import json, sys
from pathlib import Path
from cann_export import errors
from cann_export.fs import atomic
target, n, tag = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ok = clean = 0
for i in range(n):
    staging = atomic.staging_dir(target)
    mark = f"{tag}-{i}"
    (staging / "payload.txt").write_text(mark)
    (staging / "manifest.json").write_text(json.dumps({"schema": "cann-export/manifest/1", "mark": mark,
                                                       "files": {"payload.txt": {}}}))
    try:
        atomic.commit_dir(staging, target, overwrite=(i % 4 != 0))
        ok += 1
    except errors.ExportError:
        clean += 1
        atomic.discard(staging)
print(json.dumps({"ok": ok, "clean": clean}))
"""


def _commit_loop(target: Path, n: int, tag: str, results: list) -> None:
    ok = clean = 0
    raw = []
    for i in range(n):
        staging = atomic.staging_dir(target)
        mark = f"{tag}-{i}"
        (staging / "payload.txt").write_text(mark)
        (staging / "manifest.json").write_text(json.dumps({"schema": "cann-export/manifest/1", "mark": mark,
                                                           "files": {"payload.txt": {}}}))
        try:
            atomic.commit_dir(staging, target, overwrite=(i % 4 != 0))
            ok += 1
        except errors.ExportError:
            clean += 1
            atomic.discard(staging)
        except OSError as e:  # the bug this test guards against
            raw.append(repr(e))
    results.append({"ok": ok, "clean": clean, "raw": raw})


def test_concurrent_commits_to_one_target_end_cleanly(tmp_path):
    target = tmp_path / "bundle"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(atomic.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(target), "100", f"p{k}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    results: list = []
    threads = [threading.Thread(target=_commit_loop, args=(target, 100, f"t{k}", results)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err  # a raw OSError would end the worker with a traceback
        results.append({**json.loads(out), "raw": []})
    assert [r["raw"] for r in results] == [[]] * 6
    assert sum(r["ok"] + r["clean"] for r in results) == 600
    assert sum(r["ok"] for r in results) >= 400  # every overwrite=True commit replaces our own bundle
    manifest = json.loads((target / "manifest.json").read_text())
    assert (target / "payload.txt").read_text() == manifest["mark"]  # one commit's content, whole
    assert litter(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


# ---------------------------------------------------------------- stale staging

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_removes_litter_of_dead_processes_only(tmp_path):
    live = atomic.staging_dir(tmp_path / "a")  # this process: alive
    tag = live.name.split(".cann-tmp-", 1)[1]
    host, boot, _pid, _start, rand = tag.split("-")
    dead = tmp_path / f".b.cann-tmp-{host}-{boot}-{_dead_pid()}-0-{rand}"
    dead.mkdir()
    (dead / "model.onnx").write_bytes(b"x" * 100)
    dead_old = tmp_path / f".b.cann-old-{host}-{boot}-{_dead_pid()}-0-{rand}"
    dead_old.mkdir()
    other_host_fresh = tmp_path / f".c.cann-tmp-otherhost-{boot}-1-0-{rand}"
    other_host_fresh.mkdir()
    legacy_old = tmp_path / ".d.cann-tmp-k2j4h5g6"  # an unmarked staging directory, two days old
    legacy_old.mkdir()
    os.utime(legacy_old, (time.time() - 2 * 86400,) * 2)
    stale_lock = tmp_path / ".e.cann-lock"
    stale_lock.write_text("")
    user = tmp_path / ".config.cann-tmp-notes"  # not ours by shape, but fresh: kept
    user.mkdir()
    removed = {p.name for p in atomic.sweep_stale(tmp_path)}
    assert removed == {dead.name, dead_old.name, legacy_old.name, stale_lock.name}
    assert live.is_dir() and other_host_fresh.is_dir() and user.is_dir()


_KILLED = r"""
import sys, time
from pathlib import Path
from cann_export.fs import atomic
staging = atomic.staging_dir(Path(sys.argv[1]))
(staging / "model.onnx.data").write_bytes(b"\0" * 4096)
print(staging, flush=True)
time.sleep(600)
"""


def test_kill_9_litter_is_swept_by_the_next_export(tmp_path, model_file):
    target = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(atomic.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(target)], env=env, stdout=subprocess.PIPE, text=True)
    staging = Path(proc.stdout.readline().strip())
    assert staging.is_dir() and atomic.sweep_stale(tmp_path) == []  # alive: left alone
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert staging.is_dir()
    assert export_cli(model_file, target).exit_code == 0
    assert not staging.exists() and litter(tmp_path) == []


def test_overwrite_replaces_our_single_file_bundle_and_only_it(tmp_path, model_file):
    import zipfile

    out = tmp_path / "x.pth"
    assert export_cli(model_file, out).exit_code == 0 and zipfile.is_zipfile(out)
    first = out.read_bytes()
    assert export_cli(model_file, out, "--overwrite").exit_code == 0  # ours: replaced
    assert zipfile.is_zipfile(out) and litter(tmp_path) == []
    # ours with a file added, a foreign zip with a cann-export-looking manifest, a torch checkpoint, a link
    added = tmp_path / "added.pth"
    added.write_bytes(first)
    with zipfile.ZipFile(added, "a") as z:
        z.writestr("notes.txt", "mine")
    forged = tmp_path / "forged.zip"
    with zipfile.ZipFile(forged, "w") as z:
        z.writestr("manifest.json", json.dumps({"schema": "someone-else/1", "files": {}}))
    import torch

    checkpoint = tmp_path / "weights.pth"
    torch.save({"w": torch.zeros(2)}, checkpoint)
    link = tmp_path / "link.pth"
    link.symlink_to(out)
    for target in (added, forged, checkpoint):
        before = target.read_bytes()
        refused(export_cli(model_file, target, "--overwrite"), "not written by cann-export")
        assert target.read_bytes() == before
    refused(export_cli(model_file, link, "--overwrite"), "symbolic link")
    assert link.is_symlink() and litter(tmp_path) == []
