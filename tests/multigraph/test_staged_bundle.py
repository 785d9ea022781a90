"""A multi-graph export's staged bundle is checked by the rule a single graph's staging is (bundle/staged.py) before it
is renamed into place, confined or not: a hostile child (standing for model code run while the directory loads and
exports) stages a healthy bundle, then changes it and re-hashes every file table and component digest so the bundle
agrees with itself. Each change is refused, nothing is placed, no staging is left."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from cann_export import api
from cann_export.pipeline import sandboxed_directory as confined
from cann_export.errors import ExportError
from cann_export.sandbox import confine
from helpers.hf_models import tiny_decoder_gpt2


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("staged-multi") / "gpt2"
    api.export_multi(tiny_decoder_gpt2(n_positions=64), out, num_random_inputs=1)
    return out


def _entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _rehash(bundle: Path) -> None:
    """Every component's file table, its manifest's digest and the top-level file table, as the child can."""
    top = json.loads((bundle / "manifest.json").read_text())
    for c in top["components"]:
        home = bundle / c["path"]
        own = json.loads((home / "manifest.json").read_text())
        own["files"] = {p.relative_to(home).as_posix(): _entry(p) for p in sorted(home.rglob("*"))
                        if p.is_file() and not p.is_symlink() and p.name != "manifest.json"}
        (home / "manifest.json").write_text(json.dumps(own, indent=2))
        c["manifest_sha256"] = _entry(home / "manifest.json")["sha256"]
    top["files"] = {p.relative_to(bundle).as_posix(): _entry(p) for p in sorted(bundle.rglob("*"))
                    if p.is_file() and not p.is_symlink() and p.relative_to(bundle).as_posix() != "manifest.json"}
    (bundle / "manifest.json").write_text(json.dumps(top, indent=2))


def _plant_top(bundle: Path) -> None:
    (bundle / "p4-planted.sh").write_text("#!/bin/sh\ntouch MARK\n")


def _poison_component_script(bundle: Path) -> None:
    with open(bundle / "components" / "prefill" / "atc" / "convert.sh", "a") as f:
        f.write("\ntouch MARK\n")


def _plant_component_file(bundle: Path) -> None:
    (bundle / "components" / "decode" / "p4-planted.sh").write_text("touch MARK\n")


def _unlisted(edit):
    """``edit`` made after the file tables are re-hashed: a file none lists (a listed one is refused as
    check_multi refuses it)."""
    def later(bundle: Path) -> None:
        _rehash(bundle)
        edit(bundle)

    return later


CHANGES = {  # what the child does, what the refusal names
    "top-level file": (_unlisted(_plant_top), "p4-planted.sh"),  # the write stage's bundle check names it first
    "component convert.sh": (_poison_component_script, "components/prefill: atc/convert.sh: differs"),
    "component file": (_plant_component_file, "components/decode: 'p4-planted.sh': not a file --format atc_ready"),
}


def _modes() -> list:
    return [pytest.param("require", id="sandboxed", marks=pytest.mark.skipif(
        not confine.probe().available, reason="no Landlock")), pytest.param("off", id="no-sandbox")]


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("change", list(CHANGES))
def test_what_the_child_changed_in_a_multi_graph_bundle_is_refused(healthy, tmp_path, monkeypatch, mode, change):
    edit, named = CHANGES[change]

    def hostile_child(path, output, *args, **kwargs):
        shutil.copytree(healthy, output)
        edit(output)
        if edit.__name__ != "later":
            _rehash(output)

    monkeypatch.setattr(confined, "_export", hostile_child)
    with pytest.raises(ExportError) as info:
        confined.export_directory(tmp_path / "model", tmp_path / "out", None, (None, None, 7), None,
                                  {"sandbox": mode})
    message = str(info.value)
    # the bundle check of the write stage (every file listed) or the commit's re-derivation catches it first
    assert info.value.stage in ("write", "commit") and named in message, message
    assert list(tmp_path.iterdir()) == []  # nothing placed, the staging gone


@pytest.mark.parametrize("mode", _modes())
def test_the_healthy_multi_graph_bundle_is_placed(healthy, tmp_path, monkeypatch, mode):
    monkeypatch.setattr(confined, "_export", lambda path, output, *args, **kwargs: shutil.copytree(healthy, output))
    result = confined.export_directory(tmp_path / "model", tmp_path / "out", None, (None, None, 7), None,
                                       {"sandbox": mode})
    assert result.ok is True and set(result.components) == {"prefill", "decode"}
    assert api.validate(tmp_path / "out")["passed"] is True
