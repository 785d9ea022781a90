"""Issue 44 §3, start fast: a command imports only what its path needs. A refusal never imports torch; inspect,
lint and validate of an ONNX-only bundle (a Hugging Face directory's, hf/ files and all) import neither torch nor
transformers; checking a bundle's torch/program.pt2 imports torch, not torch.export's serializer and dynamo; and a
sandboxed export imports torch and onnx once for its two processes, not once in each."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import files, hf_dirs

from cann_export import api

HEAVY = ("torch", "transformers", "onnxscript", "diffusers", "torch._dynamo", "torch._export.serde.serialize")


def _commands(argvs, env):
    """Each of ``argvs`` through the real click tree (plugin commands registered, as ``main`` does) in one fresh
    interpreter: [(exit code, heavy modules imported so far)]."""
    code = ("import json, sys\nfrom cann_export.cli.main import _register_plugin_commands, cli\n"
            "_register_plugin_commands()\nseen = []\n"
            f"for argv in {argvs!r}:\n"
            "    try:\n        cli(argv)\n    except SystemExit as e:\n        code = e.code\n"
            f"    seen.append([code, sorted(m for m in {HEAVY!r} if m in sys.modules)])\n"
            "print(json.dumps(seen))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_refusal_imports_no_torch(tmp_path, cli_env):
    """Refusals decided from the command line and the paths (a refusal of the file's content is the sandboxed
    child's, after the libraries its checks need are imported for both processes: pipeline/sandboxed_file.py)."""
    (tmp_path / "taken.onnx").write_bytes(b"")
    (tmp_path / "m.pt2").write_bytes(b"")
    seen, err = _commands([[str(tmp_path / "missing.pth")],
                           [str(tmp_path / "m.pt2"), "--format", "onnx", "-o", str(tmp_path / "taken.onnx")],
                           [str(tmp_path / "m.pt2"), "--opset", "3"], ["--help"]], cli_env)
    assert [code for code, _ in seen] == [2, 2, 2, 0], err
    assert seen[-1][1] == [], err


@pytest.mark.parametrize("source", ["pt2", pytest.param("hf", marks=pytest.mark.slow)])
def test_commands_on_an_onnx_only_bundle_import_neither_torch_nor_transformers(tmp_path, cli_env, source):
    """A .pt2's bundle, and a Hugging Face directory's with its hf/ files (slow: 7 CPU-s, transformers' import)."""
    model = files.pt2(tmp_path) if source == "pt2" else hf_dirs.save("bert", tmp_path / "bert")
    bundle = tmp_path / "bundle"
    api.export(model, bundle, "onnx_bundle", sandbox="off", num_random_inputs=1)
    assert not (bundle / "torch").exists() and (bundle / "hf").is_dir() == (source == "hf")
    seen, err = _commands([["inspect", str(bundle)], ["lint", str(bundle)], ["validate", str(bundle)]], cli_env)
    assert [code for code, _ in seen] in ([0, 0, 0], [0, 1, 0]), err  # lint exits 1 on a finding
    assert seen[-1][1] == [], err


@pytest.mark.slow
def test_checking_a_program_imports_torch_but_not_its_serializer(tmp_path, cli_env):
    """torch.export.pt2_archive's constants module imports torch.export's serializer and dynamo (seconds); the
    archive check reads five of its strings (load/allowlist.py: Pt2Layout) and torch's operators."""
    bundle = tmp_path / "bundle"
    api.export(files.pt2(tmp_path), bundle, "atc_ready", sandbox="off", validate=False)
    assert (bundle / "torch" / "program.pt2").is_file()
    seen, err = _commands([["inspect", str(bundle)]], cli_env)
    assert seen[0][0] == 0, err
    assert "torch" in seen[0][1] and not {"torch._dynamo", "torch._export.serde.serialize"} & set(seen[0][1]), err


def test_the_archive_layout_is_torchs():
    from dataclasses import fields

    from torch.export.pt2_archive import constants

    from cann_export.load.allowlist import PT2_LAYOUT

    for field in fields(PT2_LAYOUT):
        assert getattr(constants, field.name) == getattr(PT2_LAYOUT, field.name), field.name


def _imports(stderr: str, module: str) -> int:
    """How many processes imported ``module`` (``-X importtime`` lines, the sandboxed child's kept by
    CANN_EXPORT_DEBUG)."""
    return sum(1 for line in stderr.splitlines()
               if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == module)


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["atc_ready", "onnx"])
def test_a_sandboxed_export_imports_torch_and_onnx_once(tmp_path, cli_env, export_format):
    from cann_export.sandbox import confine

    if not confine.probe().available:
        pytest.skip("no load sandbox here: the export runs in one process")
    model = files.pt2(tmp_path)
    env = {**cli_env, "CANN_EXPORT_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "from cann_export.cli.main import main; main()",
                          str(model), "-o", str(tmp_path / "b"), "--format", export_format, "--no-validate"],
                         capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert export_format == "onnx" or Path(tmp_path / "b" / "torch" / "program.pt2").is_file()
    assert (_imports(out.stderr, "torch"), _imports(out.stderr, "onnx")) == (1, 1)
