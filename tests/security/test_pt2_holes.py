"""The code-execution holes of issue 16 that the .pt2 checker closes: guards_code (exec()'d by torch when the
module is built), AOTInductor shared objects (dlopen()'d at load), two zip readers seeing different archives
(a prefix, trailing data, overlapping members, a NUL or a differing local name) and node targets that read
files. Each hostile file is built from a real torch.export.save archive; each is refused with exit 2, the
member named, no traceback, and nothing run (the payload would create a marker file)."""
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
from cann_export.load.archive_safety import check_export_archive
from cann_export.load.archives import ArchiveError, open_checked

_register_plugin_commands()


def edit_model(pt2: Path, edit) -> dict[str, bytes]:
    with zipfile.ZipFile(pt2) as z:
        model = json.loads(z.read(next(n for n in z.namelist() if n.endswith("models/model.json"))))
    edit(model)
    return {"models/model.json": json.dumps(model).encode()}


def touch(marker: Path) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch() is None"


def guards_archive(tmp: Path, marker: Path) -> Path:
    good = files.pt2(tmp)
    return rewrite(good, tmp / "guards.pt2", edit_model(good, lambda m: m.update(guards_code=[touch(marker)])))


def refused(path: Path, out: Path, member: str, marker: Path, *extra: str) -> str:
    result = CliRunner().invoke(cli, [str(path), "-o", str(out), *extra])
    assert result.exit_code == 2, result.output
    assert member in result.stderr, result.stderr
    assert "refused" in result.stderr and "Traceback" not in result.output, result.output
    assert not marker.exists(), "the payload ran"
    assert not out.exists()
    return result.stderr


def test_guards_code_would_run_without_the_check(tmp_path):
    """The premise: torch exec()s guards_code when the loaded program's module is built and called."""
    marker = tmp_path / "pwned"
    ep = torch.export.load(str(guards_archive(tmp_path, marker)))
    ep.module()(torch.randn(2, 12))
    assert marker.exists()


def test_guards_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = guards_archive(tmp_path, marker)
    err = refused(path, tmp_path / "o", "models/model.json", marker, "--format", "onnx")
    assert "guards_code" in err and "--trust-pickle" in err
    # the zoo goes through the same check
    result = CliRunner().invoke(cli, ["zoo", "publish", str(path), "--name", "evil", "--zoo", str(tmp_path / "zoo")])
    assert result.exit_code == 2 and "guards_code" in result.stderr, result.output
    assert not marker.exists() and not list((tmp_path / "zoo").rglob("*.pt2"))


class TwoInputs(torch.nn.Module):
    def forward(self, ids, mask):
        return ids * mask


def test_shape_guards_torch_writes_for_shared_dynamic_dims_load(tmp_path):
    """torch.export.save writes guards_code for inputs sharing a dynamic dimension: plain shape checks pass."""
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(TwoInputs(), (torch.ones(2, 8), torch.ones(2, 8)),
                             dynamic_shapes={"ids": {0: batch}, "mask": {0: batch}})
    path = tmp_path / "dyn.pt2"
    torch.export.save(ep, str(path))
    with zipfile.ZipFile(path) as z:
        written = json.loads(z.read(next(n for n in z.namelist() if n.endswith("models/model.json"))))
    assert written["guards_code"], "torch no longer writes shape guards: this test lost its premise"
    result = CliRunner().invoke(cli, [str(path), "-o", str(tmp_path / "o"), "--format", "onnx"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("guard", [
    "__import__('os').getcwd() == 0",  # a call of anything but size()/stride()
    "L['x'].size()[0] == len('a')",
    "L['x'].numpy() == 1",
    "L['x\"'].size()[0] == 2",  # a key that could leave the message string torch embeds the guard in
    "L['x'].size()[0] == 2\nimport os",
    "(lambda: 1)() == 1",
    "L['x'].size()[0] == 'a'",
    "L['x'].size()[0] == 2.5",
    "L['x'].size()[0]",  # not a condition
    "L.x.size()[0] == 2",
    "M['x'].size()[0] == 2",
    "[c for c in ()] == []",
])
def test_guards_beyond_shape_checks_are_refused(tmp_path, guard):
    good = files.pt2(tmp_path)
    path = rewrite(good, tmp_path / "g.pt2", edit_model(good, lambda m: m.update(
        guards_code=["L['x'].size()[0] == 2", guard])))
    with pytest.raises(LoadError, match="guards_code"):
        check_export_archive(path, trust_pickle=False)


def test_unknown_model_fields_must_be_empty(tmp_path):
    good = files.pt2(tmp_path)
    busy = rewrite(good, tmp_path / "busy.pt2", edit_model(good, lambda m: m.update(future_code=["x"])))
    with pytest.raises(LoadError, match="future_code"):
        check_export_archive(busy, trust_pickle=False)
    check_export_archive(busy, trust_pickle=True)
    empty = rewrite(good, tmp_path / "empty.pt2", edit_model(good, lambda m: m.update(future_code=[])))
    check_export_archive(empty, trust_pickle=False)


@pytest.mark.parametrize("member", ["{root}/data/aotinductor/model/x.so", "{root}/extra/libpayload.so.1"])
def test_native_code_members_are_refused(tmp_path, member):
    marker = tmp_path / "pwned"
    path = rewrite(files.pt2(tmp_path), tmp_path / "aoti.pt2", add={member: b"\x7fELF not really"})
    shown = member.split("/", 1)[1]
    err = refused(path, tmp_path / "o", shown, marker)
    assert "dlopen" in err
    check_export_archive(path, trust_pickle=True)  # the user's call


_CONSTRUCTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void run_at_load(void) {
  const char *m = getenv("CANN_TEST_MARKER");
  if (m) { FILE *f = fopen(m, "w"); if (f) { fputs("native code ran", f); fclose(f); } }
}
"""


@pytest.fixture(scope="module")
def real_shared_object(tmp_path_factory):
    """A real ELF shared object whose constructor writes $CANN_TEST_MARKER the moment it is dlopen()ed."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a real shared object")
    tmp = tmp_path_factory.mktemp("so")
    (tmp / "p.c").write_text(_CONSTRUCTOR)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp / "model.so"), str(tmp / "p.c")], check=True)
    return tmp / "model.so"


def test_a_real_aotinductor_shared_object_is_refused_unloaded(tmp_path, real_shared_object, monkeypatch):
    import subprocess
    import sys

    premise = tmp_path / "premise"
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(real_shared_object)!r})"], check=True,
                   env={"CANN_TEST_MARKER": str(premise), "PATH": ""})
    assert premise.read_text() == "native code ran"  # dlopen() alone runs it
    marker = tmp_path / "pwned"
    monkeypatch.setenv("CANN_TEST_MARKER", str(marker))
    so = real_shared_object.read_bytes()
    path = rewrite(files.pt2(tmp_path), tmp_path / "aoti.pt2", add={
        "{root}/data/aotinductor/model/model.so": so,
        "{root}/data/aotinductor/model/model_metadata.json": b'{"AOTI_DEVICE_KEY": "cpu"}'})
    err = refused(path, tmp_path / "o", "data/aotinductor/model/", marker)
    assert "dlopen" in err
    err = refused(path, tmp_path / "o", "data/aotinductor/model/", marker, "--format", "onnx", "--no-sandbox")
    assert not marker.exists()


def test_from_file_node_target_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    good = files.pt2(tmp_path)

    def target(model):
        model["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.aten.from_file.default"

    path = rewrite(good, tmp_path / "ff.pt2", edit_model(good, target))
    err = refused(path, tmp_path / "o", "models/model.json", marker)
    assert "aten::from_file" in err


@pytest.mark.parametrize("target", ["torch.ops.aten.save.default", "torch.ops.aten._print.default",
                                    "torch.ops.debugprims.load_tensor.default", "torch.ops.higher_order.print",
                                    "torch.ops.aten.from_file"])
def test_io_operators_are_refused_by_name(tmp_path, target):
    good = files.pt2(tmp_path)

    def edit(model):
        model["graph_module"]["graph"]["nodes"][0]["target"] = target

    path = rewrite(good, tmp_path / "io.pt2", edit_model(good, edit))
    with pytest.raises(LoadError, match="models/model.json"):
        check_export_archive(path, trust_pickle=False)


def evil_sample_inputs(tmp: Path, marker: Path) -> Path:

    return rewrite(files.pt2(tmp), tmp / "m.pt2", {"sample_inputs/model.pt": evil_bytes(marker, "protocol2")})


def test_two_archives_in_one_file_are_refused(tmp_path):
    """M + Z: Python's zipfile sees the harmless Z, torch's miniz the payload-carrying M."""
    marker = tmp_path / "pwned"
    (tmp_path / "m").mkdir()
    evil = evil_sample_inputs(tmp_path / "m", marker)
    (tmp_path / "z").mkdir()
    harmless = files.pt2(tmp_path / "z")
    both = tmp_path / "both.pt2"
    both.write_bytes(evil.read_bytes() + harmless.read_bytes())
    with zipfile.ZipFile(both) as z:  # the premise: zipfile reads the harmless one, unpickling nothing
        assert z.namelist() == zipfile.ZipFile(harmless).namelist()
    err = refused(both, tmp_path / "o", "prepended", marker)
    assert "both.pt2" in err


def test_trailing_data_and_prefixes_are_refused(tmp_path):
    good = files.pt2(tmp_path).read_bytes()
    for data, why in ((good + b"\0" * 8, "follow the end"), (b"#!/bin/sh\n" + good, "precede")):
        with pytest.raises(ArchiveError, match=why):
            open_checked(data, label="x.pt2")


def patched(src: Path, old: bytes, new: bytes, *, count: int = -1) -> bytes:
    raw = src.read_bytes()
    assert raw.count(old) >= 1
    return raw.replace(old, new, count)


def test_nul_in_a_member_name_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = rewrite(files.pt2(tmp_path), tmp_path / "nul.pt2", add={"{root}/extra/aXb": b"x"})
    path.write_bytes(patched(path, b"extra/aXb", b"extra/a\0b"))  # local header and central directory
    with zipfile.ZipFile(path) as z:
        assert any(n.endswith("extra/a") for n in z.namelist())  # zipfile truncates at the NUL
    err = refused(path, tmp_path / "o", "extra/a\\x00b", marker)
    assert "NUL" in err


def test_local_and_central_names_must_agree(tmp_path):
    path = rewrite(files.pt2(tmp_path), tmp_path / "names.pt2", add={"{root}/extra/aaa": b"x"})
    path.write_bytes(patched(path, b"extra/aaa", b"extra/bbb", count=1))  # the local header only
    with pytest.raises(ArchiveError, match="local header"):
        open_checked(path)


def test_overlapping_members_are_refused(tmp_path):
    path = rewrite(files.pt2(tmp_path), tmp_path / "ov.pt2", add={"{root}/extra/a": b"x" * 64})
    raw = bytearray(path.read_bytes())
    cd = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"extra/a") + 1)
    struct.pack_into("<I", raw, cd + 42, 0)  # its local header offset: the first member's
    path.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match="overlaps|local header"):
        open_checked(path)


def test_healthy_archives_still_export(tmp_path):
    good = files.pt2(tmp_path)
    check_export_archive(good, trust_pickle=False)
    result = CliRunner().invoke(cli, [str(good), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    for path in (files.torchscript(tmp_path), files.state_dict(tmp_path)):
        open_checked(path).close()
