"""Issue 46, part 1: the user's environment. The README's set-up installs no torchvision and no timm, and exports
a Hugging Face directory through the CLI with nothing defined for the tests. A user's own mismatched torch /
torchvision pair (PyPI's torchvision beside the CPU torch: ``import torchvision`` raises ``operator
torchvision::nms does not exist``, and transformers imports torchvision whenever it is installed) never breaks an
export whose model does not use torchvision: it is left out with one warning naming the pair to install, and a
model that needs it is refused naming that pair. The broken torchvision here is a real package on the
subprocess's PYTHONPATH whose import fails as PyPI's does, with its own dist-info (version and torch pin)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import hf_dirs

ROOT = Path(__file__).resolve().parents[2]
EXE = [sys.executable, "-m", "cann_export"]
BROKEN_INIT = 'raise RuntimeError("operator torchvision::nms does not exist")\n'
NEEDS_TORCHVISION = """import torch
import torchvision  # noqa: F401  (its ops, say)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
"""


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return hf_dirs.save("bert", tmp_path_factory.mktemp("hf") / "tiny-bert")


def _broken_torchvision(root: Path) -> Path:
    """A directory holding a ``torchvision`` 0.28.0 (pinning torch 2.13.0) whose import fails as PyPI's does beside
    the CPU torch, and a model module that imports it."""
    (root / "torchvision").mkdir(parents=True)
    (root / "torchvision" / "__init__.py").write_text(BROKEN_INIT)
    info = root / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n"
                                   "Requires-Dist: numpy\nRequires-Dist: torch (==2.13.0)\n")
    (root / "needs_tv.py").write_text(NEEDS_TORCHVISION)
    return root


def _env(*paths: Path) -> dict:
    """The environment of a user's shell: the repository (the editable install) and ``paths``, nothing of tests/."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(ROOT)])
    env["CANN_EXPORT_LOAD_PLUGINS"] = ""
    return env


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*EXE, *args], capture_output=True, text=True, env=env, timeout=600, check=False)


def test_the_readme_environment_has_no_torchvision_timm_or_stand_ins():
    """requirements-dev.txt (README command 1) and the test extra bring neither package, and the tests define
    nothing a user's process would not have (no sitecustomize, no stand-in schemas)."""
    requirements = (ROOT / "requirements-dev.txt").read_text()
    extra = re.search(r"^test = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    names = set(re.findall(r"^\s*([A-Za-z0-9_.-]+)", requirements, re.M))
    names |= set(re.findall(r'"([A-Za-z0-9_.-]+)', extra))
    assert "torch" in names and "pytest" in names  # what the patterns read
    assert not {"torchvision", "timm"} & {n.lower() for n in names}
    assert not (ROOT / "tests" / "sitecustomize.py").exists()
    assert not (ROOT / "tests" / "helpers" / "torchvision_ops.py").exists()
    assert "torch.library" not in (ROOT / "tests" / "conftest.py").read_text()


def test_the_readme_environment_exports_a_hugging_face_directory(tiny_bert, tmp_path):
    out = tmp_path / "bert_atc_ready"
    proc = _run([str(tiny_bert), "-o", str(out)], _env())
    assert proc.returncode == 0, proc.stderr
    assert "parity: passed" in proc.stdout and "torchvision" not in proc.stderr
    assert "environment" not in json.loads((out / "manifest.json").read_text()).get("warnings", {})


def test_a_broken_torchvision_does_not_break_a_hugging_face_export(tiny_bert, tmp_path):
    fake = _broken_torchvision(tmp_path / "site")
    out = tmp_path / "bert_atc_ready"
    proc = _run([str(tiny_bert), "-o", str(out)], _env(fake))
    assert proc.returncode == 0, proc.stderr
    assert "parity: passed" in proc.stdout
    warning = json.loads((out / "manifest.json").read_text())["warnings"]["environment"]
    assert warning.startswith("torchvision 0.28.0 is installed but does not import beside torch ")
    assert "operator torchvision::nms does not exist" in warning
    assert re.search(r"pip install (--force-reinstall )?torch==2\.13\.0\S* torchvision==0\.28\.0", warning), warning
    assert proc.stderr.count("warning: torchvision 0.28.0 is installed") == 1, proc.stderr


def test_a_model_that_needs_the_broken_torchvision_is_refused_naming_the_pair(tmp_path):
    import torch
    from safetensors.torch import save_file

    fake = _broken_torchvision(tmp_path / "site")
    weights = tmp_path / "net.safetensors"
    save_file(torch.nn.Sequential().state_dict() | {"fc.weight": torch.randn(2, 4), "fc.bias": torch.zeros(2)},
              str(weights))
    out = tmp_path / "net_atc_ready"
    proc = _run([str(weights), "--model-class", "needs_tv:Net", "--input-shape", "x:1,4", "-o", str(out)], _env(fake))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    assert "[load]" in proc.stderr and "this model needs torchvision, which is installed but does not import" in \
        proc.stderr
    assert re.search(r"pip install (--force-reinstall )?torch==2\.13\.0\S* torchvision==0\.28\.0", proc.stderr), \
        proc.stderr


def test_the_pair_follows_the_installed_torch_and_torchvision_s_pin(monkeypatch):
    from cann_export.load import torchvision_pair as pair

    versions = {"torch": "2.13.0+cpu", "torchvision": "0.28.0"}
    monkeypatch.setattr(pair, "_version", versions.__getitem__)
    monkeypatch.setattr(pair, "_torch_pin", lambda: "2.13.0")
    assert pair.pair_command() == ("pip install torch==2.13.0+cpu torchvision==0.28.0+cpu --index-url "
                                   "https://download.pytorch.org/whl/cpu")
    versions["torch"] = "2.14.1"  # PyPI's torch beside a torchvision pinned to another release: torch follows the pin
    assert pair.pair_command() == "pip install --force-reinstall torch==2.13.0 torchvision==0.28.0"


def test_the_suites_workers_share_the_cores():
    """Under pytest-xdist (the README's `-n auto`) a worker's OpenMP pools and those of the processes it starts
    take its share of the cores, not every core: by default each of n workers ran n threads per pool, which spin
    while they wait for one another (tests/qat/test_cnn_digits.py: 113 CPU-seconds against 34 on one thread)."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        pytest.skip("not run by pytest-xdist's workers")
    cores = len(os.sched_getaffinity(0))
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)
    for threads in (torch.get_num_threads(), int(child.stdout)):
        assert threads * workers <= max(cores, workers), (threads, workers, cores)


@pytest.mark.parametrize("value, threads", [("1", 1), ("3", 3), ("", 0), ("two", 0), ("0", 0)])
def test_onnxruntime_sessions_keep_to_the_users_thread_limit(monkeypatch, value, threads):
    """onnxruntime ignores OMP_NUM_THREADS and spins a thread per core; the tool's sessions take at most the limit
    the user set (0: onnxruntime's own choice), so an export sharing the cores spins against nothing."""
    from cann_export.graph.onnx_helpers import session_options

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert session_options().intra_op_num_threads == threads


def test_onnxruntime_pool_threads_sleep_while_they_wait():
    """A session's pool threads do not spin between a run's ops (they held the cores a shared machine's other work,
    torch's threads included, needed): the tool's sessions run with intra-op spinning off."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from cann_export.graph.onnx_helpers import session_options

    options = session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist() == [0.0, 2.0]
