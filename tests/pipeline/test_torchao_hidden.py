"""torchao hidden from a CLI export of a model directory (cann_export/torchao_hidden.py), and only there."""
import json
import os
import subprocess
import sys

import pytest

from cann_export import torchao_hidden

PLAIN = {}


@pytest.fixture
def torchao_slot(monkeypatch):
    """The test starts in a CLI-owned process where none of transformers, diffusers and torchao is imported;
    sys.modules as the test found it afterwards."""
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] in torchao_hidden.LIBRARIES}
    for name in saved:
        del sys.modules[name]
    monkeypatch.setattr(torchao_hidden, "_owned", True)
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in torchao_hidden.LIBRARIES]:
        del sys.modules[name]
    sys.modules.update(saved)


def _directory(path, **config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], **config}))
    return path


def _hidden() -> bool:
    return "torchao" in sys.modules and sys.modules["torchao"] is None


def test_a_plain_directory_hides_torchao(tmp_path, torchao_slot):
    assert torchao_hidden.hide_for(str(_directory(tmp_path / "m")), PLAIN)
    assert _hidden()
    with pytest.raises(ImportError):
        import torchao  # noqa: F401


@pytest.mark.parametrize("root, where", [("m", "config.json"), ("m", "transformer/config.json"),
                                         ("models--org--name", "snapshots/abc/vae/config.json")])
def test_a_quantization_config_anywhere_keeps_it(tmp_path, torchao_slot, root, where):
    model = _directory(tmp_path / root)
    path = model / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"nested": [{"quantization_config": {"quant_method": "torchao"}}]}))
    assert not torchao_hidden.hide_for(str(model), PLAIN) and not _hidden()


def test_an_escaped_key_is_read_as_json(tmp_path, torchao_slot):
    model = _directory(tmp_path)
    (model / "config.json").write_text('{"architectures": ["BertModel"], "quantization\\u005fconfig": {}}')
    assert not torchao_hidden.hide_for(str(model), PLAIN) and not _hidden()


def test_trust_flags_a_model_file_and_the_python_api_keep_it(tmp_path, torchao_slot, monkeypatch):
    model = _directory(tmp_path / "d")
    for flag in ("trust_remote_code", "trust_pickle"):  # the model's own Python; a pickle may hold torchao's classes
        assert not torchao_hidden.hide_for(str(model), {flag: True})
    (tmp_path / "model.pth").write_bytes(b"")
    assert not torchao_hidden.hide_for(str(tmp_path / "model.pth"), PLAIN)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "model.pt2").write_bytes(b"")
    assert not torchao_hidden.hide_for(str(tmp_path / "files"), PLAIN)  # not a directory this package reads
    monkeypatch.setattr(torchao_hidden, "_owned", False)  # the API runs in the caller's process
    assert not torchao_hidden.hide_for(str(model), PLAIN)
    assert not _hidden()


@pytest.mark.parametrize("library", ["transformers", "diffusers", "torchao.quantization"])
def test_a_library_imported_already_keeps_it(tmp_path, torchao_slot, library):
    sys.modules[library] = type(sys)(library)  # it has read torchao as installed: hiding it now would break it
    assert not torchao_hidden.hide_for(str(_directory(tmp_path)), PLAIN) and not _hidden()


def test_a_plugin_loader_that_claims_the_directory_keeps_it(tmp_path, torchao_slot, monkeypatch):
    class Claims:
        name, priority = "third-party", 99

        def matches(self, path):
            return False

        def matches_directory(self, path):
            return True

        def load(self, path, options):
            raise AssertionError

    class Registry:
        def loaders(self):
            return {"third-party": Claims()}

    from cann_export.hooks import manager

    monkeypatch.setattr(manager, "registry", Registry)
    assert not torchao_hidden.hide_for(str(_directory(tmp_path)), PLAIN) and not _hidden()


def test_a_scan_that_cannot_tell_keeps_it(tmp_path, torchao_slot, monkeypatch):
    model = _directory(tmp_path / "big")
    monkeypatch.setattr(torchao_hidden, "MAX_CONFIG_BYTES", 16)  # oversized
    assert not torchao_hidden.hide_for(str(model), PLAIN)
    monkeypatch.undo()
    monkeypatch.setattr(torchao_hidden, "_owned", True)
    wide = _directory(tmp_path / "wide")
    for k in range(torchao_hidden.MAX_ENTRIES):
        (wide / f"d{k}").mkdir()  # empty folders count too
    assert not torchao_hidden.hide_for(str(wide), PLAIN)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")  # opening it to read would wait for a writer
    assert not torchao_hidden.hide_for(str(fifo), PLAIN)
    broken = _directory(tmp_path / "broken")
    (broken / "config.json").write_text("{not json")
    assert not torchao_hidden.hide_for(str(broken), PLAIN)
    assert not _hidden()


def _cli_probe(model, out, *flags, env):
    probe = ("import atexit, runpy, sys\n"  # the CLI ends with os._exit after the atexit handlers
             "atexit.register(lambda: print('TORCHAO', sys.modules.get('torchao', 'absent'), flush=True))\n"
             "sys.argv = ['cann-export', *sys.argv[1:]]\n"
             "runpy.run_module('cann_export', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", probe, str(model), "-o", str(out), "--no-validate", "--no-sandbox",
                          "--format", "onnx", "-q", *flags], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and out.is_file(), run.stdout + run.stderr
    return run.stdout


def test_the_cli_process_of_a_directory_export_never_imports_torchao(tmp_path, cli_env):
    from helpers import hf_dirs

    model = hf_dirs.save("bert", tmp_path / "tiny-bert")
    assert "TORCHAO None" in _cli_probe(model, tmp_path / "m.onnx", env=cli_env)
    shown = _cli_probe(model, tmp_path / "trusted.onnx", "--trust-remote-code", env=cli_env)
    assert "TORCHAO None" not in shown  # importable: the module, or absent where torchao is not installed
