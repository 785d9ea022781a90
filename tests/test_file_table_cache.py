"""A file table reads each file once per process (fs/digests.py): a multi-graph bundle's top-level table lists its
components' files, hashed moments before for their own manifests and moved with their directory since; a file
changed in any way since it was hashed is read again, and the zoo's tables and the checks never use what was kept."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from cann_export.fs import digests
from cann_export.model_zoo import files as zoo_files


@pytest.fixture
def reads(monkeypatch):
    """The paths sha256_file read, in order."""
    seen: list[str] = []
    real = digests.sha256_file

    def counting(path):
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(digests, "sha256_file", counting)
    return seen


def _component(root: Path) -> Path:
    comp = root / "staging" / "model"
    (comp / "parity").mkdir(parents=True)
    (comp / "model.onnx").write_bytes(os.urandom(300_000))
    (comp / "parity" / "inputs.bin").write_bytes(os.urandom(5000))
    time.sleep(digests._SETTLED_NS / 1e9 + 0.05)  # written a while before it is hashed, as an export's files are
    return comp


def _fresh(root: Path) -> dict[str, dict[str, object]]:
    return {p.relative_to(root).as_posix(): {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                                             "size": p.stat().st_size}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "manifest.json"}


def test_a_bundle_table_reads_its_components_files_once(tmp_path, reads):
    comp = _component(tmp_path)
    assert digests.file_table(comp) == _fresh(comp) and reads == ["model.onnx", "inputs.bin"]
    bundle = tmp_path / "bundle"
    (bundle / "components").mkdir(parents=True)
    comp.rename(bundle / "components" / "model")  # committed as one directory rename
    (bundle / "config.json").write_text("{}")
    reads.clear()
    assert digests.file_table(bundle) == _fresh(bundle)
    assert reads == ["config.json"], reads  # only the file no table hashed before
    assert zoo_files.file_table(bundle, {}) == _fresh(bundle) and len(reads) == 4, reads  # the zoo reads all


@pytest.mark.parametrize("change", ["same-size-same-mtime", "replaced", "chmod-then-back"])
def test_a_file_changed_since_it_was_hashed_is_read_again(tmp_path, reads, change):
    comp = _component(tmp_path)
    digests.file_table(comp)
    model = comp / "model.onnx"
    st = model.stat()
    if change == "same-size-same-mtime":  # rewritten in place, its mtime set back: ctime still moves
        with open(model, "r+b") as f:
            f.write(b"\0" * 16)
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "replaced":  # a new file of the same size (the freed inode may be reused)
        model.unlink()
        model.write_bytes(os.urandom(st.st_size))
    else:
        model.chmod(0o600)
        model.chmod(st.st_mode & 0o777)
    reads.clear()
    assert digests.file_table(comp) == _fresh(comp)
    assert reads == ["model.onnx"], reads


def test_a_file_hashed_right_after_it_was_written_is_read_each_time(tmp_path, reads):
    path = tmp_path / "d" / "new.bin"
    path.parent.mkdir()
    path.write_bytes(os.urandom(1000))
    digests.file_table(path.parent)
    digests.file_table(path.parent)
    assert reads == ["new.bin", "new.bin"], reads
