"""The CLI's process holds the cyclic garbage collector while the libraries and the model load, then freezes what
is alive and turns it back on (cann_export/collector.py); the Python API leaves the collector of the process it
runs in as it found it."""
import gc
import json
import subprocess
import sys

import pytest

PROBE = """
import gc, json, sys
from cann_export.cli import main as m
seen = {}
def leave(code):
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(), code=code)
    print("PROBE" + json.dumps(seen))
    sys.stdout.flush()
m._leave = leave
sys.argv = ["cann-export", *sys.argv[1:]]
m.main()
"""


@pytest.fixture
def fresh_collector():
    import cann_export.collector as collector

    yield collector
    collector._held = False
    gc.enable()
    gc.unfreeze()


def test_hold_turns_the_collector_off_and_settle_freezes_and_turns_it_on(fresh_collector):
    before = gc.get_freeze_count()
    fresh_collector.settle()  # not held: nothing changes
    assert gc.isenabled() and gc.get_freeze_count() == before
    fresh_collector.hold()
    assert not gc.isenabled()
    fresh_collector.settle()
    assert gc.isenabled() and gc.get_freeze_count() > before
    fresh_collector.settle()  # once only


def test_the_python_api_leaves_the_collector_of_its_process_alone(tmp_path, fresh_collector):
    import torch

    import cann_export
    from helpers.toy_models import make_mlp

    before = gc.get_freeze_count()
    result = cann_export.export(make_mlp().eval(), tmp_path / "mlp.onnx", export_format="onnx",
                                example_inputs=(torch.randn(2, 12),))
    assert result.ok
    assert gc.isenabled() and gc.get_freeze_count() == before


@pytest.mark.parametrize("sandbox", [[], ["--no-sandbox"]])
def test_a_cli_export_ends_with_the_collector_on_and_the_loaded_heap_frozen(tmp_path, sandbox):
    from helpers.files import pt2

    model = pt2(tmp_path)
    run = subprocess.run([sys.executable, "-c", PROBE, str(model), "--format", "onnx", "-o",
                          str(tmp_path / "out.onnx"), *sandbox], capture_output=True, text=True, timeout=300)
    line = next(x for x in run.stdout.splitlines() if x.startswith("PROBE"))
    seen = json.loads(line[5:])
    assert seen["code"] in (0, None), run.stderr[-2000:]
    assert seen["enabled"] is True
    assert seen["frozen"] > 10000  # torch's, onnx's and the model's objects, frozen once it was loaded
    assert (tmp_path / "out.onnx").is_file()


def test_a_command_that_loads_no_model_collects_as_usual(tmp_path):
    run = subprocess.run([sys.executable, "-c", PROBE, "inspect", str(tmp_path / "missing.onnx")],
                         capture_output=True, text=True, timeout=120)
    seen = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("PROBE"))[5:])
    assert seen["enabled"] is True and seen["code"] not in (0, None)
