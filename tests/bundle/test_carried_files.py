"""What a bundle carries beside its graph is checked too (issue 16 item 3): the torch program
(``torch/program.pt2``) passes the .pt2 checker model files pass and agrees with the graph's signature, read
from its JSON, never loaded; a single-file bundle holds only what its file table lists; validate's tolerance
flags are checked as export's are, with the same messages.

One real two-input bundle is exported per module; each test tampers a copy (re-hashing the file table, as an
attacker would) and asserts a refusal naming the member and the difference, exit 2, no traceback, and that a
payload's marker file was never created."""
import json
import math
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.deadline import deadline
from helpers.fake_atc import two_inputs_bundle
from helpers.files import evil_bytes, rewrite

import cann_export
from cann_export.bundle import om_stub, rederive, single_file
from cann_export.cli.main import cli
from cann_export.errors import OptionsError
from cann_export.fs import digests
from cann_export.hooks.manager import get_plugin_manager
from cann_export.options import Tolerance

PROGRAM = "torch/program.pt2"


@pytest.fixture(scope="module", autouse=True)
def plugin_commands():
    get_plugin_manager().hook.register_commands(cli=cli)


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two inputs sharing a free batch dimension (torch.export records a guard between them) and a dict of
    two outputs."""
    return two_inputs_bundle(tmp_path_factory.mktemp("checks"))


@pytest.fixture
def bundle(exported, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(exported, path)
    return path


def rehash(path: Path) -> None:
    data = json.loads((path / "manifest.json").read_text())
    data["files"] = digests.file_table(path)
    (path / "manifest.json").write_text(json.dumps(data))


def refused(args, *words):
    result = invoke(args)
    assert result.exit_code == 2, (args, result.output)
    assert "Traceback" not in result.output and "[internal]" not in result.output, result.output
    for w in words:
        assert w in result.stderr, (args, w, result.stderr)
    return result


def every_command_refuses(path: Path, *words):
    for command in ("validate", "inspect", "lint"):
        refused([command, path], *words)


# ------------------------------------------------------------------ torch/program.pt2


def model_json(bundle: Path) -> dict:
    with zipfile.ZipFile(bundle / PROGRAM) as zf:
        return json.loads(zf.read(next(n for n in zf.namelist() if n.endswith("models/model.json"))))


def replace_program_member(bundle: Path, suffix: str, data: bytes) -> None:
    program = bundle / PROGRAM
    rewrite(program, program.with_suffix(".new"), replace={suffix: data}).replace(program)
    rehash(bundle)


def test_the_untouched_bundle_validates_and_its_program_has_no_guard_source(exported):
    result = invoke(["validate", exported])
    assert result.exit_code == 0, result.output
    assert model_json(exported)["guards_code"] == []  # written empty: torch rebuilds the input checks


def test_guards_code_in_the_program_is_refused_and_never_runs(bundle, tmp_path):
    marker = tmp_path / "ran"
    program = model_json(bundle)
    program["guards_code"] = [f"__import__('os').system('touch {marker}') == 0"]
    replace_program_member(bundle, "models/model.json", json.dumps(program).encode())
    every_command_refuses(bundle, PROGRAM, "guards_code", "exec()")
    with pytest.raises(rederive.BundleMismatchError) as e:
        cann_export.validate(bundle)
    assert any(d.startswith(f"{PROGRAM}: refused by the .pt2 checker") for d in e.value.differences)
    assert not marker.exists()


def test_a_pickle_in_the_program_is_refused_and_never_runs(bundle, tmp_path):
    marker = tmp_path / "ran"
    replace_program_member(bundle, "data/sample_inputs/model.pt", evil_bytes(marker, "torch.save zip"))
    every_command_refuses(bundle, PROGRAM, "sample_inputs/model.pt", "posix.system")
    assert not marker.exists()


def test_a_program_that_is_not_an_archive_is_refused(bundle):
    (bundle / PROGRAM).write_bytes(b"PK\x03\x04 not a zip")
    rehash(bundle)
    refused(["validate", bundle], PROGRAM, "refused by the .pt2 checker")


def _tensor(program: dict, name: str) -> dict:
    return program["graph_module"]["graph"]["tensor_values"][name]


def _rename_input(program: dict) -> None:
    spec = program["graph_module"]["signature"]["input_specs"]
    user = next(s["user_input"]["arg"]["as_tensor"] for s in spec if "user_input" in s)
    tensors = program["graph_module"]["graph"]["tensor_values"]
    tensors["ids"] = tensors[user["name"]]
    user["name"] = "ids"


def _drop_output(program: dict) -> None:
    program["graph_module"]["signature"]["output_specs"].pop()


def _drop_signature(program: dict) -> None:
    del program["graph_module"]["signature"]


SIGNATURE_EDITS = {
    "input renamed": (_rename_input, "its inputs are ['ids', 'features'], the graph's ['input_ids', 'features']"),
    "input dtype": (lambda p: _tensor(p, "features").update(dtype=6),
                    "input 'features' is float16, in the graph float"),
    "input static dim": (lambda p: _tensor(p, "features")["sizes"][2].update(as_int=17),
                         "input 'features' has shape ['*', 9, 17], in the graph [2, 9, 16]"),
    "input rank": (lambda p: _tensor(p, "input_ids")["sizes"].append({"as_int": 1}),
                   "input 'input_ids' has shape ['*', 9, 1], in the graph [2, 9]"),
    "output dropped": (_drop_output, "it has 1 outputs, the graph 2"),
    "no signature": (_drop_signature, "its model JSON has no graph signature with tensor metadata where "
                                     "torch.export.save writes one"),
}


@pytest.mark.parametrize("edit", SIGNATURE_EDITS)
def test_a_program_whose_signature_differs_from_the_graph_is_named(bundle, edit):
    change, words = SIGNATURE_EDITS[edit]
    program = model_json(bundle)
    change(program)
    replace_program_member(bundle, "models/model.json", json.dumps(program).encode())
    result = refused(["validate", bundle, "--json"])
    differences = json.loads(result.stdout)["error"]["differences"]
    assert differences == [f"{PROGRAM}: {words}"], differences
    every_command_refuses(bundle, PROGRAM)


# ------------------------------------------------------------------ single-file bundles


@pytest.fixture
def archive(exported, tmp_path):
    path = tmp_path / "b.zip"
    single_file.write_archive(path, exported)
    return path


def test_a_single_file_bundle_validates(archive):
    assert invoke(["validate", archive]).exit_code == 0


@pytest.mark.parametrize("name", ["extra.py", "torch/loader.so", "parity/more.safetensors"])
def test_an_entry_outside_the_file_table_is_refused(archive, tmp_path, name):
    tampered = rewrite(archive, tmp_path / "t.zip", add={name: b"print('hi')"})
    every_command_refuses(tampered, repr(name), "file table does not list", str(tampered))
    with pytest.raises(cann_export.errors.ValidateError, match="does not list"):
        cann_export.validate(tampered)


def test_an_om_stub_payload_entry_outside_the_file_table_is_refused(bundle, tmp_path):
    clean, tampered = tmp_path / "clean.om", tmp_path / "tampered.om"
    om_stub.write_stub(clean, bundle, "model")
    assert invoke(["validate", clean]).exit_code == 0
    (bundle / "extra.py").write_text("print('hi')")
    om_stub.write_stub(tampered, bundle, "model")
    every_command_refuses(tampered, "om-stub payload holds 'extra.py'", "file table does not list")


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_inspect_and_lint_refuse_what_is_not_a_regular_file(tmp_path, kind):
    path = Path("/dev/zero") if kind == "character device" else tmp_path / "m.onnx"
    if kind == "FIFO":
        os.mkfifo(path)
    with deadline():  # inspect used to open a FIFO (blocked) and read /dev/zero (without end)
        for command in ("inspect", "lint", "validate"):
            refused([command, path], str(path), kind)


# ------------------------------------------------------------------ validate's tolerance flags


def _export_message(**tolerance) -> str:
    with pytest.raises(OptionsError) as e:
        Tolerance(**tolerance).check()
    return e.value.message


@pytest.mark.parametrize("flag, value, field", [
    ("--atol", "nan", "atol"), ("--atol", "inf", "atol"), ("--rtol", "-0.1", "rtol"),
    ("--min-cosine", "nan", "min_cosine"), ("--min-cosine", "1.5", "min_cosine"), ("--min-cosine", "-2", "min_cosine"),
])
def test_validate_checks_tolerances_as_export_does(exported, flag, value, field):
    message = _export_message(**{field: float(value)})
    assert flag in message
    result = refused(["validate", exported, flag, value], "[options]", message)
    assert "[validate]" not in result.stderr
    with pytest.raises(OptionsError) as e:
        cann_export.validate(exported, **{field: float(value)})
    assert e.value.message == message.replace(f"{flag} ", f"{field}=")  # the API names its own arguments


def test_validate_api_refuses_a_non_number_and_a_bad_tolerance_object(exported):
    with pytest.raises(OptionsError, match="atol='abc' is not a finite number"):
        cann_export.validate(exported, atol="abc")
    with pytest.raises(OptionsError, match="tolerance.device_atol nan"):
        cann_export.validate(exported, Tolerance(device_atol=math.nan))
