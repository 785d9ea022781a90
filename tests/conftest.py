import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # `helpers.toy_models:...` for --model-class
os.environ.setdefault("CANN_EXPORT_LOAD_PLUGINS", "")  # hermetic: no installed third-party plugins


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist each worker (and every process it starts) gets its share of the cores for OpenMP
    (torch's intra-op pool, numpy's BLAS), unless the user set OMP_NUM_THREADS: by default each process takes every
    core, and two workers' pools then wait on each other's spinning threads (docs/development.md, "Workers":
    tests/qat/test_cnn_digits.py 113 -> 34 CPU-seconds)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 1 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # a plugin imported torch before this file: its pool already started
        sys.modules["torch"].set_num_threads(threads)


_share_the_cores_between_workers()
VISION_RUN = ("bash tests/vision_env.sh (its own venv with torch, torchvision and timm; .ci/run runs it after the "
              "main suite)")


def _why_no_vision() -> str | None:
    """Why the ``vision`` tests (timm / torchvision architectures) cannot run in this environment, or None."""
    import importlib.util

    missing = [name for name in ("timm", "torchvision") if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (the README's environment has neither)"
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 - PyPI's torchvision beside another torch build: a broken pair
        return f"torchvision does not import beside this torch ({type(e).__name__}: {e})"
    return None


# the slow set (docs/development.md): every test of these folders (real multi-graph / encoder-decoder exports, 30-100 s
# a file on 2 shared cores) and the models marked slow one by one. The README's test command deselects it
# (`-m "not slow"`); .ci/run runs it as its own step (`-m slow`).
SLOW_FOLDERS = {"multigraph"}

# the quick subset (`-m quick`, docs/development.md): the layout and plugin contracts, the stage table and context,
# the CLI and the Python API, less their whole real exports (each also in the README's command, which runs them all)
QUICK_FILES = ("test_architecture.py", "pipeline/test_stage_table.py", "pipeline/test_context.py", "plugins/",
               "cli/test_cli.py", "api/test_python_api.py")
NOT_QUICK = ("test_the_articles_model_option_spelling", "test_real_subprocess_export_and_exit_codes",
             "test_bert_through_cli_with_example_inputs_and_hints",
             "test_exit_once_torch_is_imported_skips_the_teardown",
             "test_a_third_party_formats_exception_is_a_write_error",
             "test_an_export_files_each_report_in_its_typed_place")


def _quick(item) -> bool:
    path = item.path.relative_to(TESTS).as_posix()
    return path.startswith(QUICK_FILES) and item.originalname not in NOT_QUICK


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
        if _quick(item):
            item.add_marker(pytest.mark.quick)
    vision = [item for item in items if item.get_closest_marker("vision")]
    why = _why_no_vision() if vision else None
    for item in vision if why else ():
        item.add_marker(pytest.mark.skip(reason=f"vision test: {why}; run: {VISION_RUN}"))


@pytest.fixture
def cli_env(monkeypatch):
    """Environment for a real `cann-export` subprocess that can import the test helpers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env["CANN_EXPORT_LOAD_PLUGINS"] = ""
    return env


@pytest.fixture
def plugin():
    """Register a plugin made of hookimpls (``{"hook_name": fn}``) for one test; unregistered after it."""
    import types

    from cann_export.hooks.manager import get_plugin_manager

    pm = get_plugin_manager()
    registered = []

    def register(namespace: dict, name: str):
        module = types.SimpleNamespace(**namespace)
        pm.register(module, name=name)
        registered.append(module)
        return module

    yield register
    for module in registered:
        pm.unregister(module)


@pytest.fixture
def run_ort():
    """Run an ONNX file in onnxruntime with named numpy/torch inputs."""
    import numpy as np
    import onnxruntime as ort

    def run(path, feeds):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {i.name: np.asarray(feeds[i.name].numpy() if hasattr(feeds[i.name], "numpy") else feeds[i.name])
                for i in sess.get_inputs()}
        return [o.name for o in sess.get_outputs()], sess.run(None, feed)

    return run


@pytest.fixture(autouse=True)
def _no_process_wide_qat_left_behind():
    """``cann.torch.config(quantization_aware_training=True)`` quantizes every later train-mode forward in
    the process (by design): a test that turns it on must not hand it to the next one."""
    yield
    if "cann.torch" in sys.modules:
        sys.modules["cann.torch"].config(quantization_aware_training=False, quant_config={})
