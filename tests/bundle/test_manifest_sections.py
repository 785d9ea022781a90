"""A single-graph manifest.json is checked name by name against what its writer produces
(bundle/manifest_schema.py): a field the writer never writes, a section of the wrong type, a capture report that
names another exporter or opset than the model, a lint that passed beside an error, a forged sandbox record, a
format that writes no directory, an opset or exporter the graph contradicts. Each edit (made as an attacker
would: the file table left intact, since manifest.json is not in it) is refused by ``validate`` naming the
field, exit 2; the untouched bundle validates."""
import json
import shutil

import pytest
from click.testing import CliRunner
from helpers.fake_atc import two_inputs_bundle

from cann_export.bundle.manifest_schema import TOP, sandbox_problems
from cann_export.cli.main import cli
from cann_export.pipeline.sandboxed_file import DENIES


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return two_inputs_bundle(tmp_path_factory.mktemp("sections"))


def _validate(path):
    return CliRunner().invoke(cli, ["validate", str(path)], catch_exceptions=False)


def test_the_untouched_bundle_validates_and_writes_only_allowed_sections(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert set(manifest) <= set(TOP)
    result = _validate(exported)
    assert result.exit_code == 0, result.output


def _set(*path, value):
    def edit(m):
        target = m
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _other(m):
    return "torchscript" if m["model"]["exporter"] == "dynamo" else "dynamo"


def _exporter_everywhere(m):
    other = _other(m)
    m["model"]["exporter"] = m["capture"]["exporter"] = other
    m["capture"]["attempts"].append({"exporter": other, "opset": m["model"]["opset"]})


def _lint_error(m):
    report = next(iter(m["lint"].values()))
    report["findings"] = [*report.get("findings", []), {"severity": "error", "rule": "x", "message": "m"}]
    report["passed"] = True


EDITS = {
    "an unknown top-level field": (_set("evil", value={"x": 1}), "field 'evil' is not one this tool writes"),
    "an unknown model field": (_set("model", "evil", value=1), "model: field 'evil'"),
    "an unknown capture field": (_set("capture", "evil", value=1), "capture: field 'evil'"),
    "capture naming another exporter": (lambda m: m["capture"].__setitem__("exporter", _other(m)),
                                        "capture.exporter"),
    "a capture attempt's unknown field": (lambda m: m["capture"]["attempts"][0].__setitem__("x", 1),
                                          "capture.attempts[0]: field 'x'"),
    "optimize as a string": (_set("optimize", value="x"), "optimize: a str"),
    "warnings as a string": (_set("warnings", value="none"), "warnings: a str"),
    "an unknown warning": (_set("warnings", "evil", value="x"), "warnings: field 'evil'"),
    "negative stage seconds": (_set("stage_seconds", "load", value=-5), "stage_seconds.load"),
    "stage seconds past a float": (_set("stage_seconds", "load", value=10 ** 400), "stage_seconds.load"),
    "no model exporter": (lambda m: m["model"].pop("exporter"), "model.exporter: missing"),
    "no capture": (lambda m: m.pop("capture"), "capture: a NoneType"),
    "a lint that passed beside an error": (_lint_error, ".passed: true beside a finding of severity error"),
    "a lint report that is a number": (_set("lint", "atc-lint", value=0), "lint.atc-lint: not a linter's report"),
    "a sandbox record as a string": (_set("sandbox", value="yes"), "sandbox: 'str' is not a sandbox record"),
    "a forged confined record": (_set("sandbox", value={"kind": "landlock+seccomp", "landlock_abi": 7,
                                                        "denies": []}), "sandbox.denies"),
    "a single-file format on a directory": (_set("format", value="onnx"), "writes a single file"),
    "an opset the graph does not import": (_set("model", "opset", value=11), "model.opset"),
    "an exporter the graph's provenance contradicts": (_exporter_everywhere, "model.exporter"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edited_section_is_refused_naming_the_field(exported, tmp_path, case):
    edit, expected = EDITS[case]
    bundle = tmp_path / "b"
    shutil.copytree(exported, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    result = _validate(bundle)
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output


def test_the_sandbox_records_this_tool_writes_are_accepted():
    confined = {"kind": "landlock+seccomp", "landlock_abi": 7, "denies": list(DENIES)}
    assert sandbox_problems({**confined, "torch_threads": "all"}) == []
    assert sandbox_problems({**confined, "torch_threads": 1}) == []
    assert sandbox_problems({"kind": "none", "reason": "turned off"}) == []
    assert sandbox_problems({**confined, "torch_threads": True})  # a bool is not the count 1
    assert sandbox_problems({**confined, "torch_threads": "all"}, optional={})  # a multi-graph top level: none
