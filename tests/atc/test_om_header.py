"""A real ATC .om read by `inspect`: both ModelFileHeader layouts, checked against bytes laid out by hand from the
published structs (GraphEngine types.h, 2019-20; executor/c_types.h, 2023), hostile headers refused, and
`atc --mode=1`'s JSON where an `atc` is on PATH."""
import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner
from helpers.fake_atc import path_without_atc
from helpers.toy_models import make_mlp

import cann_export

from cann_export.bundle import om_header
from cann_export.cli.main import cli
from cann_export.hooks.manager import get_plugin_manager

MAGIC_ON_DISK = b"IMOD"  # 0x444F4D49, little-endian


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def put(buf: bytearray, offset: int, raw: bytes) -> None:
    buf[offset:offset + len(raw)] = raw


def u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def hand_header(layout: str, length: int, platform: bytes = b"Ascend310P3", model_num: int = 1,
                mark: bytes = b"") -> bytes:
    """256 bytes laid out field by field from the published struct, offsets counted by hand."""
    buf = bytearray(256)
    put(buf, 0, MAGIC_ON_DISK)
    put(buf, 4, u32(256))                # headsize
    put(buf, 8, u32(0x10000000))         # version 1.0
    put(buf, 12, bytes(range(64)))       # checksum[64]
    put(buf, 76, u32(length))            # length
    put(buf, 80, bytes([0, 1, 1, 0]))    # is_encrypt, is_checksum, modeltype (standard model), genmode
    put(buf, 84, b"resnet18")            # name[32]
    put(buf, 116, u32(7))                # ops
    put(buf, 120, mark)                  # userdefineinfo[32]
    put(buf, 152, u32(2))                # om_ir_version
    if layout == "2023":
        put(buf, 156, u32(model_num))    # model_num
        put(buf, 160, platform)          # platform_version[20]
        buf[180] = 3                     # platform_type, then reserved[75]
    else:
        put(buf, 156, platform)          # platform_version[20]
        buf[176] = 3                     # platform_type, then reserved[79]
    return bytes(buf)


def real_om(tmp_path, layout="2023", payload=b"\x01partition-table-and-model" * 8, **kw):
    path = tmp_path / f"model_{layout}.om"
    path.write_bytes(hand_header(layout, len(payload), **kw) + payload)
    return path


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """An om-stub of a small MLP, exported where no atc is on PATH."""
    out = tmp_path_factory.mktemp("om") / "mlp_om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path_without_atc())
        assert cann_export.export(make_mlp(), out, "om", example_inputs=(torch.randn(2, 12),)).ok
    return out / "model.om"


@pytest.fixture
def no_atc(monkeypatch):
    monkeypatch.setenv("PATH", path_without_atc())


@pytest.mark.parametrize("layout", ["2019-20", "2023"])
def test_both_header_layouts_read_from_hand_laid_bytes(layout):
    info = om_header.parse_header(hand_header(layout, 1234, model_num=2))
    assert info["layout"] == layout
    assert info["magic_hex"] == "0x444F4D49" and info["headsize"] == 256 and info["version_hex"] == "0x10000000"
    assert info["checksum"] == bytes(range(64)).hex() and info["length"] == 1234
    assert (info["is_encrypt"], info["is_checksum"], info["modeltype"], info["genmode"]) == (0, 1, 1, 0)
    assert info["name"] == "resnet18" and info["ops"] == 7 and info["om_ir_version"] == 2
    assert info["platform_version"] == "Ascend310P3" and info["platform_type"] == 3
    assert info["model_type"] == "standard model" and info["stub"] is False
    if layout == "2023":
        assert info["model_num"] == 2
    else:
        assert "model_num" not in info


def test_a_2023_header_with_an_empty_platform_is_read_by_its_model_num():
    info = om_header.parse_header(hand_header("2023", 10, platform=b""))
    assert info["layout"] == "2023" and info["model_num"] == 1 and info["platform_version"] == ""


def test_inspect_reads_a_real_om_without_atc(tmp_path, no_atc):
    path = real_om(tmp_path, "2023")
    out = invoke(["inspect", path, "--json"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.stdout)
    assert info["kind"] == "om" and info["om"]["kind"] == "compiled" and info["om"]["layout"] == "2023"
    assert info["om"]["platform_version"] == "Ascend310P3" and info["om"]["model_num"] == 1
    assert "atc_json" not in info and any("no `atc` on PATH" in n for n in info["notes"])
    text = invoke(["inspect", real_om(tmp_path, "2019-20")])
    assert text.exit_code == 0, text.output
    assert "compiled ATC offline model" in text.stdout and "2019-20 layout" in text.stdout
    assert "'Ascend310P3'" in text.stdout


def test_a_real_om_is_not_read_as_a_stub_nor_a_stub_as_a_real_om(tmp_path, stub, no_atc):
    info = json.loads(invoke(["inspect", stub, "--json"]).stdout)
    assert info["kind"] == "om-stub"  # the stub mark: read (and its sha256 checked) as a stub
    real = real_om(tmp_path, "2019-20")
    refused = invoke(["validate", real])  # a compiled model holds no graph nor parity data to validate
    assert refused.exit_code == 2 and "not a cann-export om-stub" in refused.stderr
    marked = real_om(tmp_path, "2019-20", mark=b"CANN-EXPORT-STUB/2")  # the mark, but no stub behind it
    out = invoke(["inspect", marked])
    assert out.exit_code == 2 and "sha256" in out.stderr and "Traceback" not in out.output


@pytest.mark.parametrize("damage, words", [
    (lambda h, p: h, None),
    (lambda h, p: b"NOPE" + h[4:], "magic"),
    (lambda h, p: h[:4] + (4096).to_bytes(4, "little") + h[8:], "header size 4096"),
    (lambda h, p: h[:76] + (0xFFFFFFFF).to_bytes(4, "little") + h[80:], "truncated"),
    (lambda h, p: h[:76] + (len(p) - 1).to_bytes(4, "little") + h[80:], "trailing bytes"),
    (lambda h, p: h[:156] + b"\xff\xff\xff\xff" + h[160:], "neither"),
])
def test_hostile_headers_are_refused(tmp_path, no_atc, damage, words):
    payload = b"p" * 64
    head = hand_header("2023", len(payload))
    path = tmp_path / "hostile.om"
    path.write_bytes(damage(head, payload) + payload)
    out = invoke(["inspect", path])
    if words is None:  # the undamaged control
        assert out.exit_code == 0, out.output
        return
    assert out.exit_code == 2, out.output
    assert words in out.stderr and str(path) in out.stderr and "Traceback" not in out.output


def test_a_huge_length_on_a_huge_sparse_file_reads_only_the_header(tmp_path, no_atc):
    path = tmp_path / "sparse.om"
    size = 3 << 30  # 3 GiB of holes: reading it would take seconds and memory, the header says it all
    with open(path, "wb") as f:
        f.write(hand_header("2023", size - 256))
        f.truncate(size)
    out = invoke(["inspect", path, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["om"]["length"] == size - 256


def fake_atc_json(directory, fail=False):
    """An `atc` that answers --mode=1 as ATC does: the model's JSON at --json (graph attrs), or an error."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = {"name": "resnet18", "graph": [{"name": "resnet18", "attr": [
        {"key": "soc_version", "value": {"s": "Ascend310P3"}},
        {"key": "atc_cmdline", "value": {"s": "atc --model=model.onnx --framework=5 --soc_version=Ascend310P3"}},
        {"key": "secret_path", "value": {"s": "/home/someone"}}]}]}
    script = directory / "atc"
    body = ["#!/bin/sh", 'for a in "$@"; do case "$a" in --json=*) out="${a#--json=}";; esac; done']
    if fail:
        body += ['echo "E10001: Value [x] for parameter [--om] is invalid." >&2', "exit 1"]
    else:
        body += [f"cat > \"$out\" <<'EOF'\n{json.dumps(doc)}\nEOF"]
    script.write_text("\n".join(body) + "\n")
    script.chmod(0o755)
    return directory


def test_inspect_adds_atc_mode_1_json_where_atc_exists(tmp_path, monkeypatch):
    path = real_om(tmp_path, "2023")
    monkeypatch.setenv("PATH", os.pathsep.join([str(fake_atc_json(tmp_path / "bin")), path_without_atc()]))
    assert shutil.which("atc")
    info = json.loads(invoke(["inspect", path, "--json"]).stdout)
    attrs = info["atc_json"]["attrs"]
    assert attrs["soc_version"] == "Ascend310P3" and attrs["atc_cmdline"].startswith("atc --model=model.onnx")
    assert "secret_path" not in attrs and info["atc_json"]["graphs"] == ["resnet18"]
    text = invoke(["inspect", path]).stdout
    assert "soc_version: Ascend310P3" in text

    monkeypatch.setenv("PATH", os.pathsep.join([str(fake_atc_json(tmp_path / "failbin", fail=True)),
                                                path_without_atc()]))
    failed = json.loads(invoke(["inspect", path, "--json"]).stdout)
    assert "E10001" in failed["atc_json"]["error"] and failed["om"]["layout"] == "2023"
