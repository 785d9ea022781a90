"""The load sandbox: a model file loads and captures in a confined child (Landlock + seccomp), which cannot
write outside its staging directory, open a socket or run a program; what it sends back is JSON only.

The payload is code on purpose (a pickled callable, loaded with --trust-pickle): it stands for any path into
torch's loader that no checker knows. The same file unconfined (--no-sandbox) leaves all three traces, so
the test would fail if the sandbox did nothing."""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cann_export import api, errors
from cann_export.cli.main import cli
from cann_export.sandbox import confine
from helpers.files import pt2
from helpers.sandbox_payload import Crash, Escape

pytestmark = pytest.mark.skipif(not confine.probe().available, reason="no Landlock + seccomp on this machine")


class Listener:
    """A TCP server on loopback that records what any connection sends."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(64))
                except OSError:
                    self.received.append(b"")

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def _escape_file(tmp_path: Path, port: int) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = tmp_path / "escape.pth"
    torch.save(Escape(outside, port), str(path))
    return path, outside


def _traces(outside: Path) -> list[str]:
    return sorted(p.name for p in outside.iterdir())


def test_a_load_cannot_write_outside_staging_connect_or_run_programs(tmp_path, listener):
    model, outside = _escape_file(tmp_path, listener.port)
    result = api.export(str(model), tmp_path / "out", "onnx", trust_pickle=True, input_shapes=["x:2,12"])
    assert result.ok and result.sandbox["kind"] == "landlock+seccomp"
    assert _traces(outside) == []
    assert listener.received == []


def test_the_same_file_unconfined_leaves_every_trace(tmp_path, listener):
    """The control: the payload really does what the sandbox stops."""
    model, outside = _escape_file(tmp_path, listener.port)
    result = api.export(str(model), tmp_path / "out", "onnx", trust_pickle=True, input_shapes=["x:2,12"],
                        sandbox="off")
    assert result.sandbox == {"kind": "none", "reason": "turned off (sandbox='off' / --no-sandbox)"}
    assert _traces(outside) == ["executed", "system", "written"]
    listener.stop.wait(0.5)
    assert b"escaped" in listener.received


def test_bundle_manifest_and_json_name_the_sandbox(tmp_path):
    out = tmp_path / "bundle"
    res = CliRunner().invoke(cli, [str(pt2(tmp_path)), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout)["sandbox"]
    assert record["kind"] == "landlock+seccomp" and record["landlock_abi"] >= 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sandbox"] == record
    assert not [p for p in tmp_path.iterdir() if ".cann-" in p.name]  # the sandbox's directory is gone


def test_progress_and_stage_errors_cross_back(tmp_path):
    seen = []
    model = pt2(tmp_path)
    api.export(str(model), tmp_path / "out", "onnx", progress=lambda *a: seen.append(a[1]))
    assert seen[:5] == ["load", "prepare", "train", "strip", "capture"] and seen[-2:] == ["commit", "publish"]
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(model.read_bytes()[: len(model.read_bytes()) // 2])
    with pytest.raises(errors.LoadError) as info:
        api.export(str(bad), tmp_path / "out2", "onnx")
    assert info.value.path == str(bad) and not (tmp_path / "out2").exists()


def test_a_load_that_crashes_the_child_is_a_clean_error(tmp_path):
    path = tmp_path / "crash.pth"
    torch.save(Crash(), str(path))
    res = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "out"), "--trust-pickle",
                                   "--input-shape", "x:2,12"])
    assert res.exit_code == errors.EXIT_USER_ERROR, res.output
    assert "SIGSEGV" in res.output and "[load]" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".cann-" in p.name]


def test_require_sandbox_refuses_a_machine_without_one(tmp_path, monkeypatch):
    monkeypatch.setattr(confine, "probe", lambda: confine.Support(0, False, ["the kernel offers no Landlock"]))
    model = pt2(tmp_path)
    res = CliRunner().invoke(cli, [str(model), "-o", str(tmp_path / "out"), "--require-sandbox"])
    assert res.exit_code == errors.EXIT_USER_ERROR
    assert "--require-sandbox" in res.output and "no Landlock" in res.output
    assert not (tmp_path / "out").exists()
    res = CliRunner().invoke(cli, [str(model), "-o", str(tmp_path / "out"), "--json"])  # auto: unconfined, said
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["sandbox"] == {"kind": "none", "reason": "the kernel offers no Landlock"}


def test_an_in_memory_model_is_not_sandboxed(tmp_path):
    from helpers.toy_models import make_mlp

    result = api.export(make_mlp().eval(), tmp_path / "out", "onnx", example_inputs=torch.randn(2, 12))
    assert result.sandbox["kind"] == "none" and "in-memory" in result.sandbox["reason"]


def test_what_a_compromised_child_sends_cannot_move_the_commit(tmp_path):
    """The child's outcome is data: a staging directory outside its own, or an output name its format does not
    declare, is refused before anything is renamed."""
    from cann_export.api import _context
    from cann_export.options import ExportOptions
    from cann_export.pipeline import sandboxed_file as confined
    from cann_export.sandbox import child

    ctx = _context(str(tmp_path / "m.pt2"), tmp_path / "out", ExportOptions(export_format="onnx"), None)
    box = tmp_path / ".box"
    (box / "staged").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for data in ({"staging": str(tmp_path / "elsewhere")}, {"staging": str(box / "staged" / ".." / ".." / "x")},
                 {"staging": str(box / "staged"), "output_name": ".bashrc"},
                 {"staging": str(box / "staged"), "capture": {"exporter": "x", "bogus": 1}}):
        with pytest.raises(child.ChildFailed):
            confined._apply(ctx, data, box)
    confined._apply(ctx, {"staging": str(box / "staged"), "output_name": "out.onnx"}, box)
    assert ctx.output_path == tmp_path / "out.onnx" and ctx.staging == box / "staged"


def test_errors_cross_back_with_their_class_exit_code_and_cause():
    from cann_export.sandbox import child

    err = child.rebuild({"mro": ["AtcError", "WriteError", "ExportError"], "message": "atc failed", "path": "m",
                         "stage": "write", "exit_code": errors.EXIT_STAGE_FAILED, "cause": ["ValueError", "bad"]})
    assert type(err) is errors.WriteError and err.exit_code == errors.EXIT_STAGE_FAILED
    assert err.to_dict()["cause"] == "ValueError: bad"
    odd = child.rebuild({"mro": ["os.system"], "type": "__import__('os')", "message": "x"})
    assert type(odd).__name__ == "ChildError"  # a name that is not an identifier is never used


HELD_CONSOLE = r"""
import logging, sys, threading, time
from pathlib import Path
from cann_export.sandbox import child, confine

class Proxy:  # what a live line (rich's Live) puts in sys.stderr: writes go through its console's lock
    def __init__(self, lock):
        self.lock = lock
    def write(self, text):
        with self.lock:
            return len(text)
    def flush(self):
        with self.lock:
            pass

lock = threading.Lock()
sys.stderr = Proxy(lock)
made_meanwhile = logging.StreamHandler()  # a library's handler made while the proxy was in place
logging.getLogger("lib").addHandler(made_meanwhile)
held = threading.Event()
def refresh():  # the console's refresh thread, holding its lock when the fork comes
    with lock:
        held.set()
        time.sleep(30)
threading.Thread(target=refresh, daemon=True).start()
held.wait()

def body(send):
    logging.getLogger("other").warning("a warning at import")  # logging's last resort: sys.stderr
    logging.getLogger("lib").warning("through the handler made meanwhile")
    print("and a print")
    return {"done": True}

out = child.run(body, [Path(sys.argv[1])], confine.probe(), lambda e: None,
                keep_threads=True)
sys.__stdout__.write(repr(out) + "\n")
sys.__stdout__.flush()
import os
os._exit(0)  # the parent's own exit would flush the proxy its refresh thread still holds
"""


def test_the_child_does_not_write_through_the_parents_live_console(tmp_path):
    """A parent showing a live line had sys.stderr (and the handlers libraries made meanwhile) go through its
    console, whose lock its refresh thread may hold at the fork: the child's first warning waited on it forever
    (torchao's warning at import hung a pty export of a GPT-2 directory). The child writes through its own streams."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", HELD_CONSOLE, str(tmp_path)], capture_output=True, text=True,
                         timeout=20, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "{'done': True}" in run.stdout
