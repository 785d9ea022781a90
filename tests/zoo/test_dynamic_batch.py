"""A model tracked in training at one batch and called last at batch 1 keeps the bundle's dynamic batch in its zoo
program (torch/program.pt2): loaded back from the zoo it trains and infers at any batch in the graph's range, as
the ONNX graph does (issue 46). Runs in a subprocess: npu-sim (PrivateUse1's name) is process-global."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, *args: str) -> dict:
    """``code`` in a fresh interpreter (tests/ on the path for its torchvision stand-ins); its last line's JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "CANN_EXPORT_LOAD_PLUGINS": ""}
    env.pop("CANN_MODEL_ZOO", None)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.splitlines()[-1])

TRACKED_AT_ONE = """
import json, sys, zipfile
import onnx
import torch
from torch import nn
import cann.torch
cann.torch.enable()
cann.torch.set_device("cann:0")
import cann.model_zoo
from cann.model_zoo import load_model

work, zoo = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
model = model.to("cann")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.train()
for _ in range(2):  # tracked in training at batch 16
    loss = model(torch.randn(16, 3, 8, 8).to("cann")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
model.eval()
with torch.no_grad():
    model(torch.randn(1, 3, 8, 8).to("cann"))  # the last call, at batch 1: the export's example
cann.torch.export(model=model, output_path=f"{work}/cnn.pth", export_format="atc_ready")
with zipfile.ZipFile(f"{work}/cnn.pth") as z:
    graph = onnx.load_from_string(z.read("model.onnx"))
dims = graph.graph.input[0].type.tensor_type.shape.dim
cann.model_zoo.publish(model=f"{work}/cnn.pth", name="cnn", zoo=zoo)
loaded = load_model("cnn", framework="pytorch", zoo=zoo).to("cann")
loaded.train()
x, y = torch.randn(8, 3, 8, 8).to("cann"), torch.randint(0, 3, (8,)).to("cann")
loss = nn.functional.cross_entropy(loaded(x), y)
loss.backward()
out = {"graph_batch": dims[0].dim_param or dims[0].dim_value, "train_shape": list(loaded(x).shape)}
with torch.no_grad():
    out["eval_shapes"] = [list(loaded.eval()(torch.randn(b, 3, 8, 8).to("cann")).shape) for b in (1, 3)]
print(json.dumps(out))
"""


def test_a_zoo_model_called_last_at_batch_1_trains_at_batch_8(tmp_path):
    res = run(TRACKED_AT_ONE, str(tmp_path), str(tmp_path / "zoo"))
    assert isinstance(res["graph_batch"], str), res  # the ONNX graph's batch is symbolic
    assert res["train_shape"] == [8, 3], res
    assert res["eval_shapes"] == [[1, 3], [3, 3]], res
