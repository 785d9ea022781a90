"""torchao hidden from a CLI export of a model directory (cann_export/torchao_hidden.py), and only there."""
import json
import subprocess
import sys

import pytest

from cann_export import torchao_hidden


@pytest.fixture
def torchao_slot(monkeypatch):
    """sys.modules["torchao"] as the test found it, put back after; the test starts with torchao not imported."""
    before = sys.modules.get("torchao", ...)
    sys.modules.pop("torchao", None)
    monkeypatch.setattr(torchao_hidden, "_owned", True)
    yield
    if before is ...:
        sys.modules.pop("torchao", None)
    else:
        sys.modules["torchao"] = before


def _directory(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], **config}))
    return tmp_path


def test_a_plain_directory_hides_torchao(tmp_path, torchao_slot):
    assert torchao_hidden.hide_for(str(_directory(tmp_path)), trust_remote_code=False)
    assert "torchao" in sys.modules and sys.modules["torchao"] is None
    with pytest.raises(ImportError):
        import torchao  # noqa: F401


@pytest.mark.parametrize("where", ["config.json", "transformer/config.json",
                                   "models--org--name/snapshots/abc/vae/config.json"])
def test_a_quantization_config_anywhere_keeps_it(tmp_path, torchao_slot, where):
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"quantization_config": {"quant_method": "torchao"}}))
    assert not torchao_hidden.hide_for(str(tmp_path), trust_remote_code=False)
    assert sys.modules.get("torchao", ...) is not None


def test_remote_code_a_model_file_and_the_python_api_keep_it(tmp_path, torchao_slot, monkeypatch):
    (tmp_path / "d").mkdir()
    model = _directory(tmp_path / "d")
    assert not torchao_hidden.hide_for(str(model), trust_remote_code=True)  # the model's own Python may import it
    (tmp_path / "model.pth").write_bytes(b"")
    assert not torchao_hidden.hide_for(str(tmp_path / "model.pth"), trust_remote_code=False)  # a pickle may hold it
    monkeypatch.setattr(torchao_hidden, "_owned", False)  # the API runs in the caller's process
    assert not torchao_hidden.hide_for(str(model), trust_remote_code=False)
    assert sys.modules.get("torchao", ...) is not None


def test_an_oversized_config_keeps_it(tmp_path, torchao_slot, monkeypatch):
    monkeypatch.setattr(torchao_hidden, "MAX_CONFIG_BYTES", 16)
    assert not torchao_hidden.hide_for(str(_directory(tmp_path)), trust_remote_code=False)


def test_a_config_that_is_a_fifo_keeps_it_without_blocking(tmp_path, torchao_slot):
    import os

    os.mkfifo(tmp_path / "config.json")  # opening it to read would wait for a writer
    assert not torchao_hidden.hide_for(str(tmp_path), trust_remote_code=False)


def test_the_cli_process_of_a_directory_export_never_imports_torchao(tmp_path, cli_env):
    from helpers import hf_dirs

    model = hf_dirs.save("bert", tmp_path / "tiny-bert")
    probe = ("import atexit, runpy, sys\n"  # the CLI ends with os._exit after the atexit handlers
             "atexit.register(lambda: print('TORCHAO', sys.modules.get('torchao', 'absent'), flush=True))\n"
             "sys.argv = ['cann-export', sys.argv[1], '-o', sys.argv[2], '--no-validate', '--no-sandbox', "
             "'--format', 'onnx', '-q']\n"
             "runpy.run_module('cann_export', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", probe, str(model), str(tmp_path / "m.onnx")], env=cli_env,
                         capture_output=True, text=True, timeout=600)
    assert "TORCHAO None" in run.stdout, run.stdout + run.stderr
    assert (tmp_path / "m.onnx").is_file()
