"""The canonical re-pack (cann_export/load/repack.py): torch reads only a fresh archive holding the members on
the allow-list of what torch's own writers produce, never the user's file; members torch parses are bounded
and counted before they are accepted; node targets come from an allow-list of operator namespaces."""
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import files
from helpers.files import evil_bytes, rewrite

from cann_export.cli.main import _register_plugin_commands, cli
from cann_export.errors import LoadError
from cann_export.load import allowlist, archive_safety, canonical_zip
from cann_export.load.archive_safety import check_export_archive, load_exported_program
from cann_export.load.repack import canonical_copy

_register_plugin_commands()
ROOT = Path(__file__).resolve().parents[2]


def export_args(path: Path, out: Path) -> list[str]:
    return [str(path), "-o", str(out), "--model-class", files.MLP_CLASS, "--input-shape", "x:2,12"]


@pytest.mark.parametrize("maker,member", [(files.pt2, "data/evil.pkl"), (files.pt2, "data/weights/model.pt"),
                                          (files.torchscript, "code/__torch__/x.pyc"),
                                          (files.state_dict, "constants.pkl")])
def test_a_member_not_on_the_allow_list_is_refused_by_name(tmp_path, maker, member):
    marker = tmp_path / "pwned"
    src = maker(tmp_path)
    path = rewrite(src, tmp_path / f"extra{src.suffix}", add={f"{{root}}/{member}": evil_bytes(marker, "protocol2")})
    out = tmp_path / "o"
    result = CliRunner().invoke(cli, export_args(path, out))
    assert result.exit_code == 2, result.output
    assert member in result.stderr and "not among the members" in result.stderr, result.stderr
    assert "Traceback" not in result.output and not marker.exists() and not out.exists()


def test_trust_pickle_lets_an_unlisted_member_through(tmp_path):
    path = rewrite(files.pt2(tmp_path), tmp_path / "x.pt2", add={"{root}/notes/readme.txt": b"hi"})
    with pytest.raises(LoadError, match="notes/readme.txt"):
        check_export_archive(path, trust_pickle=False)
    check_export_archive(path, trust_pickle=True)
    assert load_exported_program(path, trust_pickle=True).module()(torch.randn(2, 12)).shape == (2, 4)


def test_the_allow_lists_hold_what_torch_writes(tmp_path):
    """Every member torch 2.13's writers produce for these files is on the list of their kind."""
    for maker, kind in ((files.pt2, allowlist.PT2), (files.torchscript, allowlist.TORCHSCRIPT),
                        (files.state_dict, allowlist.TORCH_SAVE), (files.checkpoint, allowlist.TORCH_SAVE)):
        names = zipfile.ZipFile(maker(tmp_path)).namelist()
        assert allowlist.refusal(kind, names) is None, (kind, names)
    traced = tmp_path / "traced.pt"
    torch.jit.save(torch.jit.trace(files.make_mlp().eval(), (torch.randn(2, 12),)), str(traced),
                   _extra_files={"meta.json": "{}"})
    assert allowlist.refusal(allowlist.TORCHSCRIPT, zipfile.ZipFile(traced).namelist()) is None


def test_torch_loads_the_checked_copy_not_the_file_at_the_path(tmp_path, monkeypatch):
    """Between the check and torch's load the path is replaced by a payload-carrying archive: torch still
    loads the checked program and nothing runs. Written to in place instead, the load is refused."""
    marker = tmp_path / "pwned"
    (tmp_path / "a").mkdir()
    good = files.pt2(tmp_path / "a")
    expected = torch.export.load(str(good)).module()(torch.ones(2, 12))
    evil = rewrite(good, tmp_path / "evil.pt2", {"sample_inputs/model.pt": evil_bytes(marker, "protocol2"),
                                                 "data/weights/weight_0": bytes(len(zipfile.ZipFile(good).read(
                                                     "mlp/data/weights/weight_0")))})
    real_check = archive_safety.check_export_archive

    def check_then_swap(path, trust, canon):
        real_check(path, trust, canon)
        os.replace(evil, path)

    monkeypatch.setattr(archive_safety, "check_export_archive", check_then_swap)
    got = load_exported_program(good, trust_pickle=False).module()(torch.ones(2, 12))
    torch.testing.assert_close(got, expected)
    assert not marker.exists()
    assert b"pwned" in good.read_bytes()  # the path did hold the payload when torch loaded

    def check_then_overwrite(path, trust, canon):
        real_check(path, trust, canon)
        with open(path, "r+b") as f:  # same file, new bytes
            f.write(f.read())

    (tmp_path / "b").mkdir()
    monkeypatch.setattr(archive_safety, "check_export_archive", check_then_overwrite)
    with pytest.raises(LoadError, match="modified while it was being loaded"):
        load_exported_program(files.pt2(tmp_path / "b"), trust_pickle=False)


def test_torchscript_and_zip_pth_load_through_the_copy(tmp_path, monkeypatch):
    seen = []
    jit_load, torch_load = torch.jit.load, torch.load
    monkeypatch.setattr(torch.jit, "load", lambda f, **kw: seen.append(f) or jit_load(f, **kw))
    monkeypatch.setattr(torch, "load", lambda f, **kw: seen.append(f) or torch_load(f, **kw))
    ts, sd = files.torchscript(tmp_path), files.state_dict(tmp_path)
    for path in (ts, sd):
        result = CliRunner().invoke(cli, [*export_args(path, tmp_path / f"o_{path.stem}"), "--format", "onnx",
                                          "--no-sandbox"])  # the spies live in this process
        assert result.exit_code == 0, result.output
    staged = [f for f in seen if isinstance(f, str) and "cann-export-load-" in f]
    assert staged and not any(Path(f).exists() for f in staged)  # TorchScript: a staging copy, removed after
    assert any(isinstance(f, canonical_zip.SegmentView) for f in seen)  # .pth: the copy as a file object
    assert str(ts) not in map(str, seen) and str(sd) not in map(str, seen)


def test_a_deflated_zip_pth_is_inflated_counted_and_loads(tmp_path):
    """Re-zipped by a tool that deflates everything: each member is inflated into the private spill file."""
    src = files.state_dict(tmp_path)
    path = tmp_path / "deflated.pth"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, zin.read(item.filename))
    with canonical_copy(path, allowlist.TORCH_SAVE) as canon:
        state = torch.load(canon.view(), weights_only=True)
    assert set(state) == set(torch.load(str(src), weights_only=True))


@pytest.mark.parametrize("maker", [files.torchscript, files.state_dict])
def test_two_archives_in_one_file_are_refused_for_every_kind(tmp_path, maker):
    marker = tmp_path / "pwned"
    (tmp_path / "m").mkdir()
    (tmp_path / "z").mkdir()
    evil = files.malicious_pickle(tmp_path / "m", marker, zipped=True)
    both = tmp_path / f"both{maker(tmp_path / 'z').suffix}"
    both.write_bytes(evil.read_bytes() + maker(tmp_path / "z").read_bytes())
    result = CliRunner().invoke(cli, export_args(both, tmp_path / "o"))
    assert result.exit_code == 2 and "prepended" in result.stderr, result.output
    assert not marker.exists()


def test_zip64_records_are_read_by_zipfile_and_torch(tmp_path, monkeypatch):
    """Members past 4 GiB get zip64 fields: forced for a small archive, torch and the checked reader agree."""
    monkeypatch.setattr(canonical_zip, "ZIP64_LIMIT", 100)
    good = files.pt2(tmp_path)
    with canonical_copy(good, allowlist.PT2) as canon:
        with canon.checked() as z:
            assert z.names == zipfile.ZipFile(good).namelist()
            assert all(z.read(n) == zipfile.ZipFile(good).read(n) for n in z.names)
        ep = torch.export.load(canon.view())
    assert ep.module()(torch.randn(2, 12)).shape == (2, 4)
    assert load_exported_program(good, trust_pickle=False) is not None


def graph_target(tmp: Path, target: str) -> Path:
    good = files.pt2(tmp)
    with zipfile.ZipFile(good) as z:
        model = json.loads(z.read("mlp/models/model.json"))
    model["graph_module"]["graph"]["nodes"][0]["target"] = target
    return rewrite(good, tmp / "t.pt2", {"models/model.json": json.dumps(model).encode()})


@pytest.mark.parametrize("target,why", [("torch.ops.mylib.evil.default", "namespace 'mylib'"),
                                        ("#mylib:evil", "neither an operator"),
                                        ("torch._C._nn.linear", "neither an operator"),
                                        ("torch.ops.profiler._record_function_enter_new.default", "'profiler'")])
def test_node_targets_outside_the_allowed_namespaces_are_refused(tmp_path, target, why):
    path = graph_target(tmp_path, target)
    with pytest.raises(LoadError, match="models/model.json") as info:
        check_export_archive(path, trust_pickle=False)
    assert why in str(info.value) and target[:20] in str(info.value)
    check_export_archive(path, trust_pickle=True)


def test_control_flow_and_symbolic_targets_load_untrusted(tmp_path):
    class Branchy(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
            return y.reshape(-1) * torch.sym_float(n) + max(n, 3)

    path = tmp_path / "branchy.pt2"
    torch.export.save(torch.export.export(Branchy(), (torch.randn(4, 3),),
                                          dynamic_shapes={"x": {0: torch.export.Dim("b", min=2)}}), str(path))
    assert load_exported_program(path, trust_pickle=False).module()(torch.randn(5, 3)).shape == (15,)


# ------------------------------------------------------------------ bounded memory while refusing a bomb

# Peak RSS is the child's own VmHWM: ru_maxrss of a child starts at its parent's peak (exec keeps it), and
# the pytest process is far larger than the bound.
RSS_CHILD = r"""
import json, sys
import torch
from cann_export.errors import LoadError
from cann_export.load.archive_safety import load_exported_program

def peak_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])

base = peak_kib()
errors = []
for path in sys.argv[1:]:
    try:
        load_exported_program(path, trust_pickle=False)
        errors.append(None)
    except LoadError as e:
        errors.append(e.message)
print(json.dumps({"grown_kib": peak_kib() - base, "errors": errors}))
"""


def _with_zeros(src: Path, dst: Path, suffix: str) -> Path:
    """``src`` with the member ending in ``suffix`` replaced by 1 GiB of deflated zeros (declared honestly)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for item in zin.infolist():
            if item.filename.endswith(suffix):
                with zout.open(item.filename, "w") as f:
                    chunk = bytes(64 << 20)
                    for _ in range(16):
                        f.write(chunk)
            else:
                zout.writestr(item, zin.read(item.filename))
    return dst


def _declaring(src: Path, dst: Path, suffix: str, declared: int) -> Path:
    """A copy of ``src`` whose local header and central directory entry for ``suffix`` declare ``declared``."""
    with zipfile.ZipFile(src) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    raw = bytearray(src.read_bytes())
    central = raw.rfind(info.filename.encode()) - 46
    assert raw[central:central + 4] == b"PK\x01\x02" and raw[info.header_offset:info.header_offset + 2] == b"PK"
    struct.pack_into("<I", raw, info.header_offset + 22, declared)
    struct.pack_into("<I", raw, central + 24, declared)
    dst.write_bytes(bytes(raw))
    return dst


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """A ~67 MB .pt2 (one 4096x4096 Linear: the declared total passes the 16x expansion bound) whose model
    JSON is 1 GiB of deflated zeros, declared honestly or not; and one whose 64 MiB weight is."""
    tmp = tmp_path_factory.mktemp("bombs")
    torch.manual_seed(0)
    good = tmp / "big.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4096, 4096), (torch.randn(1, 4096),)), str(good))
    honest = _with_zeros(good, tmp / "a.pt2", "models/model.json")
    weight = _with_zeros(good, tmp / "w.pt2", "data/weights/weight_0")
    return {"honest json": honest,
            "json declaring 200 MB": _declaring(honest, tmp / "b.pt2", "models/model.json", 200 << 20),
            "json declaring 6 KB": _declaring(honest, tmp / "c.pt2", "models/model.json", 6000),
            "weight declaring its 64 MiB": _declaring(weight, tmp / "d.pt2", "data/weights/weight_0", 64 << 20)}


def test_a_gib_deflated_member_is_refused_with_bounded_memory(bombs):
    sizes = {label: path.stat().st_size for label, path in bombs.items()}
    assert all(60e6 < s < 80e6 for label, s in sizes.items() if "json" in label), sizes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run([sys.executable, "-c", RSS_CHILD, *map(str, bombs.values())], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for label, error in zip(bombs, report["errors"], strict=True):
        assert error and "refused" in error, (label, error)
        assert ("above the" in error) if label == "honest json" else ("as declared" in error), (label, error)
    assert report["grown_kib"] < 100 * 1000, report  # peak RSS <= 100 MB above the child's baseline
