"""The articles' flow, literally, on npu-sim: enable, set_device("cann:0"), ``.to("cann")``, QAT configured,
3 epochs of the unchanged AdamW loop, ``cann.torch.export(..., output_path="x.pth", export_format="atc_ready")``,
``cann.model_zoo.publish(model="x.pth")``, ``load_model(name, framework="pytorch").to("cann")`` and its outputs
against the exported ONNX graph in onnxruntime; and the profiler's Chrome trace. Each scenario runs in its own
subprocess: npu-sim (PrivateUse1's name) is process-global."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PREAMBLE = """
import json, sys, zipfile
from pathlib import Path
import numpy as np
import torch
from torch import nn

import cann.torch
cann.torch.enable()
cann.torch.set_device("cann:0")
cann.torch.config(quantization_aware_training=True, quant_config={"weight_bits": 8, "activation_bits": 8})
import cann.model_zoo
from cann.model_zoo import load_model

work, zoo = Path(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)


def train(model, batches, loss_fn):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(3):
        model.train()
        for inputs, target in batches:
            out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
            loss = loss_fn(out, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()


def onnx_outputs(path, feed):
    import onnxruntime as ort
    path = Path(path)
    if zipfile.is_zipfile(path):  # the single-file atc_ready bundle: its ONNX member
        with zipfile.ZipFile(path) as z:
            member = next(n for n in z.namelist() if n.endswith(".onnx"))
            target = work / "unpacked"
            z.extractall(target)
        path = target / member
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, {n: feed[n].cpu().numpy() for n in names})[0]


def one_step(ref):
    return float(ref.max() - ref.min()) / 255  # one 8-bit step of the output range


def round_trip(name, path, feed, call):
    info = cann.model_zoo.publish(model=str(path), name=name, metadata={"task": "articles"}, zoo=zoo)
    loaded = load_model(name, framework="pytorch", zoo=zoo).to("cann")
    dev = {k: v.to("cann") for k, v in feed.items()}
    with torch.no_grad():
        got = call(loaded, dev)
    assert got.device.type == "npu", got.device
    ref = onnx_outputs(path, feed)
    err = float(np.abs(got.cpu().numpy() - ref).max())
    with torch.no_grad():  # and back: .cpu() retargets the program's baked-in devices too
        back = call(loaded.cpu(), feed)
    drift = float((back - got.cpu()).abs().max())
    assert back.device.type == "cpu" and torch.allclose(back, got.cpu(), atol=1e-5), drift
    return {"version": info["version"], "err": err, "step": one_step(ref), "shape": list(ref.shape)}
"""

CNN = PREAMBLE + """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


model = Net().to("cann")
images, labels = torch.randn(32, 3, 16, 16), torch.randint(0, 4, (32,))
batches = [(images[i:i + 8].to("cann"), labels[i:i + 8].to("cann")) for i in range(0, 32, 8)]
train(model, batches, nn.functional.cross_entropy)
assert next(model.parameters()).device.type == "npu"
x = images[:2].to("cann")
with torch.no_grad():
    model(x)  # the last recorded call: export's example inputs
cann.torch.export(model=model, output_path=str(work / "cnn.pth"), export_format="atc_ready",
                  metadata={"model_name": "brand-cnn", "version": "1.0"})
assert (work / "cnn.pth").is_file() and zipfile.is_zipfile(work / "cnn.pth")
assert next(model.parameters()).device.type == "npu"  # the user's model stays where it was
res = round_trip("brand-cnn", work / "cnn.pth", {"x": images[:2]}, lambda m, feed: m(feed["x"]))
again = cann.torch.export(model=model, output_path=str(work / "cnn.pth"), export_format="atc_ready",
                          metadata={"model_name": "brand-cnn", "version": "1.1"}, overwrite=True)  # a rerun
with zipfile.ZipFile(work / "cnn.pth") as z:
    res["rerun"] = bool(again.ok) and json.loads(z.read("manifest.json"))["metadata"]["version"] == "1.1"
cann.torch.export(model=model, output_path=str(work / "cnn.onnx"), format="onnx")  # article scenario 3
import onnx
ops = [n.op_type for n in onnx.load(str(work / "cnn.onnx")).graph.node]
res["onnx_qdq"] = ops.count("QuantizeLinear")
res["onnx_err"] = float(np.abs(onnx_outputs(work / "cnn.onnx", {"x": images[:2]})
                               - onnx_outputs(work / "cnn.pth", {"x": images[:2]})).max())
print(json.dumps(res))
"""

BERT = PREAMBLE + """
from transformers import BertConfig, BertModel

cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=37, max_position_embeddings=64)
model = BertModel(cfg).to("cann")
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 100, (16, 12), generator=g)
mask = torch.ones(16, 12, dtype=torch.int64)
target = torch.randn(16, 12, 32, generator=g)
batches = [({"input_ids": ids[i:i + 4].to("cann"), "attention_mask": mask[i:i + 4].to("cann")},
            target[i:i + 4].to("cann")) for i in range(0, 16, 4)]
train(model, batches, lambda out, t: nn.functional.mse_loss(out.last_hidden_state, t))
feed = {"input_ids": ids[:2], "attention_mask": mask[:2]}
with torch.no_grad():
    model(input_ids=feed["input_ids"].to("cann"), attention_mask=feed["attention_mask"].to("cann"))
cann.torch.export(model=model, output_path=str(work / "bert.pth"), export_format="atc_ready",
                  metadata={"model_name": "tiny-bert", "version": "1.0"})
assert zipfile.is_zipfile(work / "bert.pth")
print(json.dumps(round_trip("tiny-bert", work / "bert.pth", feed, lambda m, feed: m(**feed)[0])))
"""

PROFILE = """
import json, sys
import torch
from torch import nn
import cann.torch
cann.torch.enable()
cann.torch.set_device("cann:0")
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 4))
model = model.to("cann")
x = torch.randn(2, 3, 16, 16).to("cann")
model(x)
with cann.torch.profiler.profile(activities=[cann.torch.profiler.ProfilerActivity.CANN],
                                 record_shapes=True) as prof:
    model(x).sum().backward()
prof.export_chrome_trace(sys.argv[1])
print(json.dumps({"ok": True}))
"""

# article 000, section 2: the four training keys, typed literally, then the unchanged loop and an export
TRAIN_CONFIG = '''import json, sys, warnings
from pathlib import Path
import numpy as np
import torch
from torch import nn

import cann.torch
cann.torch.enable()
cann.torch.set_device("cann:0")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cann.torch.config(
        mixed_precision="fp16",       # 混合精度训练
        gradient_checkpointing=True,  # 梯度检查点（显存↓40%）
        dataloader_workers=8,         # 优化数据加载流水线
        compile_model=True            # TorchScript编译加速
    )
from torch._dynamo.utils import counters
from cann_export.backend import train_config
work = Path(sys.argv[1])
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.stage = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.stage(self.stem(x)).mean((2, 3)))


model = Net().to("cann")
dtypes = []
model.stem.register_forward_hook(lambda m, i, o: dtypes.append(str(o.dtype)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
images, labels = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
losses = []
for epoch in range(3):
    model.train()
    for i in range(0, 16, 8):
        loss = nn.functional.cross_entropy(model(images[i:i + 8].to("cann")), labels[i:i + 8].to("cann"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
train_dtypes = sorted(set(dtypes))
model.eval()
x = images[:2].to("cann")
with torch.no_grad():
    model(x)  # the last recorded call: export's example inputs
status = train_config.status(model)
cann.torch.export(model=model, output_path=str(work / "net.onnx"), format="onnx")
import onnx, onnxruntime as ort
graph = onnx.load(str(work / "net.onnx"))
sess = ort.InferenceSession(str(work / "net.onnx"), providers=["CPUExecutionProvider"])
got = sess.run(None, {sess.get_inputs()[0].name: images[:2].numpy()})[0]
still_on = "forward" in model.__dict__ and model._compiled_call_impl is not None  # put back after export
cann.torch.config(mixed_precision=False, compile_model=False)
with torch.no_grad():
    ref = model(x)  # the plain fp32 model: what the export must have captured
print(json.dumps({"dtypes": train_dtypes, "losses": losses, "status": status,
                  "graphs": counters["stats"]["unique_graphs"], "warnings": [str(w.message) for w in caught],
                  "onnx_types": sorted({i.type.tensor_type.elem_type for i in graph.graph.output}),
                  "onnx_err": float(np.abs(got - ref.cpu().numpy()).max()),
                  "still_on": still_on}))
'''


def run(code: str, *args: str) -> dict:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    env = {**os.environ, "PYTHONPATH": path, "CANN_EXPORT_LOAD_PLUGINS": ""}
    env.pop("CANN_MODEL_ZOO", None)  # the zoo is the temporary one passed as zoo=, never the user's cache
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


# tiny-bert in the README's command; bn-cnn in the slow set (BatchNorm training on npu-sim stays in
# test_npu_sim.py's bitwise CNN case, a BatchNorm model's export in the CPU suites)
@pytest.mark.parametrize("script", [pytest.param(CNN, marks=pytest.mark.slow), BERT], ids=["bn-cnn", "tiny-bert"])
def test_train_export_publish_load_on_npu_sim(script, tmp_path):
    zoo = tmp_path / "zoo"
    res = run(script, str(tmp_path), str(zoo))
    assert res["version"] and (zoo).is_dir()
    assert res["step"] > 0
    assert res["err"] <= res["step"], res  # within one 8-bit step of the output range
    if "rerun" in res:  # the export rerun with overwrite=True replaced the x.pth it wrote
        assert res["rerun"], res
    if "onnx_qdq" in res:  # export(..., format="onnx"): the same int8 Q/DQ graph as the bundle's
        assert res["onnx_qdq"] >= 2 and res["onnx_err"] <= res["step"], res


def test_profiler_trace_has_npu_operator_events(tmp_path):
    trace = tmp_path / "trace.json"
    run(PROFILE, str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and "npu" in json.dumps(e.get("args", {})).lower()]
    names = {e["name"] for e in ops}
    assert any("conv" in n for n in names) and any("addmm" in n or "linear" in n for n in names), sorted(names)
    assert any(e.get("args", {}).get("Input Dims") for e in ops)  # record_shapes=True


AFTER_ERROR = """
import json, torch, cann.torch
from cann_export.inputs.tracking import recorded_inputs
cann.torch.enable()
m = torch.nn.Linear(3, 2)
try:
    m(torch.zeros(2, 4))  # a forward that raises (a user's shape mistake)
except RuntimeError:
    pass
m(torch.zeros(5, 3))
rec = recorded_inputs(m)
print(json.dumps({"shapes": None if rec is None else [list(a.shape) for a in rec[0]]}))
"""


def test_a_forward_that_raised_does_not_stop_input_recording():
    assert run(AFTER_ERROR)["shapes"] == [[5, 3]]


# --- a restart between training and resume: checkpoint, new process, resume, train on ---------------

RESTART = """
import json, sys
import torch
from torch import nn
import cann.torch

cann.torch.enable()
cann.torch.set_device("cann:0")
work, qat, role = sys.argv[1], sys.argv[2] == "qat", sys.argv[3]
if qat:
    cann.torch.config(quantization_aware_training=True, quant_config={"weight_bits": 8, "activation_bits": 8})
torch.manual_seed(0 if role == "train" else 99)  # the resumed process starts from other weights
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                      nn.Linear(8 * 8 * 8, 4)).to("cann")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(i):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(8, 3, 8, 8, generator=g).to("cann"), torch.randint(0, 4, (8,), generator=g).to("cann")
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


out = {}
if role == "train":  # the uninterrupted run, saving as the articles do before and after the first forward
    losses = []
    for i in range(6):
        if i in (0, 3):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": i},
                       f"{work}/checkpoint{i}.pt")
        losses.append(step(i))
    out["losses"] = losses
else:
    start = int(role)
    state = cann.torch.resume(f"{work}/checkpoint{start}.pt")  # the tracked model and its optimizer
    out["state"] = state
    out["losses"] = [step(i) for i in range(state["epoch"], 6)]
out["weights"] = [float(p.detach().cpu().double().sum()) for p in model.parameters()]
out["observers"] = [float(b.cpu()) for n, b in model.named_buffers() if n.endswith(("act_min", "act_max"))]
print(json.dumps(out))
"""


# qat in the README's command: the same loop and checkpoints as float, plus the observers; float in the slow set
@pytest.mark.parametrize("qat", ["qat", pytest.param("float", marks=pytest.mark.slow)])
def test_a_restart_between_training_and_resume_continues_the_same_run(qat, tmp_path):
    full = run(RESTART, str(tmp_path), qat, "train")
    for start in (0, 3):  # saved before the first training forward (QAT not in yet), and after it
        resumed = run(RESTART, str(tmp_path), qat, str(start))
        restored = ["model", "optimizer"] + (["qat_observers"] if qat == "qat" and start else [])
        assert resumed["state"] == {"epoch": start, "restored": restored}, resumed["state"]
        assert resumed["losses"] == pytest.approx(full["losses"][start:], rel=1e-6, abs=1e-7), (start, resumed, full)
        assert resumed["weights"] == pytest.approx(full["weights"], rel=1e-6, abs=1e-6)
        assert resumed["observers"] == pytest.approx(full["observers"], rel=1e-6, abs=1e-7)
        assert len(full["observers"]) == (4 if qat == "qat" else 0)


# --- a model loaded from the zoo, fine-tuned one step on npu-sim --------------------------------------

ZOO_FINE_TUNE = """
import json, sys
import torch
from torch import nn
import cann.torch
import cann.model_zoo
from cann.model_zoo import load_model

cann.torch.enable()
work, zoo = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 16),
                      nn.Dropout(0.5), nn.Linear(16, 3)).eval()
cann.torch.export(model=model, output_path=f"{work}/x.pth", export_format="atc_ready",
                  example_inputs=(torch.randn(4, 3, 8, 8),))
cann.model_zoo.publish(model=f"{work}/x.pth", name="tuned", zoo=zoo)
loaded = load_model("tuned", framework="pytorch", zoo=zoo).to("cann")
g = torch.Generator().manual_seed(3)
x, y = torch.randn(16, 3, 8, 8, generator=g).to("cann"), torch.randint(0, 3, (16,), generator=g).to("cann")
out = {"loaded_training": loaded.training}
stats = [b for n, b in loaded.named_buffers() if n.endswith("running_mean")]
before = stats[0].cpu().clone()
with torch.no_grad():
    out["eval_same"] = bool(torch.equal(loaded(x).cpu(), loaded(x).cpu()))
    out["eval_keeps_stats"] = bool(torch.equal(before, stats[0].cpu()))
    loaded.train()  # the article's load-then-fine-tune step
    out["train_differs"] = not torch.equal(loaded(x).cpu(), loaded(x).cpu())  # dropout drops
    out["train_updates_stats"] = not torch.equal(before, stats[0].cpu())  # BatchNorm: batch statistics
optimizer = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
torch.manual_seed(5)
loss = nn.functional.cross_entropy(loaded(x), y)
optimizer.zero_grad()
loss.backward()
optimizer.step()
with torch.no_grad():
    torch.manual_seed(5)  # the same dropout mask, after the step
    out["losses"] = [loss.item(), nn.functional.cross_entropy(loaded(x), y).item()]
    single = loaded.eval()(x[:1])  # eval: running statistics, so one sample alone is fine
out["device"] = single.device.type
print(json.dumps(out))
"""


def test_a_zoo_loaded_model_fine_tunes_one_step_on_npu_sim(tmp_path):
    res = run(ZOO_FINE_TUNE, str(tmp_path), str(tmp_path / "zoo"))
    assert res["loaded_training"] is False and res["eval_same"] and res["eval_keeps_stats"], res
    assert res["train_differs"] and res["train_updates_stats"], res  # dropout and BatchNorm in train mode
    assert res["losses"][1] < res["losses"][0], res
    assert res["device"] == "npu"


def test_the_articles_training_config_acts_on_the_unchanged_loop(tmp_path):
    res = run(TRAIN_CONFIG, str(tmp_path))
    assert res["dtypes"] == ["torch.float16"], res  # the tracked forward ran under fp16 autocast
    assert res["status"]["loss_scale"] == {"scale": 65536.0, "steps": 6, "skipped_steps": 0}, res
    assert res["status"]["gradient_checkpointing"] and res["status"]["compile_model"] == "auto", res
    assert res["graphs"] >= 1, res  # torch.compile captured it
    assert all(v == v for v in res["losses"]), res
    assert any("num_workers=8" in w for w in res["warnings"]), res  # dataloader_workers: where they go
    assert res["onnx_types"] == [1] and res["onnx_err"] < 1e-4, res  # export captured the plain fp32 model
    assert res["still_on"], res  # and put the training keys' effects back


# Article 003, typed as written: it never imports cann.torch (with torch_npu, `import torch` alone gives
# torch.npu). The one-time opt-in is CANN_EXPORT_NPU_SIM=1, which torch's device-backend autoload (the
# `torch.backends` entry point in pyproject.toml) reads; `train_loader` is the reader's own, as in the article.
ARTICLE_003 = """
import torch
import torch.nn as nn
import torch.optim as optim

train_loader = [(torch.randn(8, 784), torch.randint(0, 10, (8,))) for _ in range(2)]


# 1. 定义模型（跟普通 PyTorch 模型一样）
class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = self.fc2(x)
        return x


model = MyModel()
# 2. 把模型搬到 NPU 上（关键！）
model = model.npu()  # 类似 .cuda()
# 3. 把输入数据搬到 NPU 上
input_data = torch.randn(32, 784).npu()  # 类似 .cuda()
# 4. 前向计算（自动在 NPU 上跑）
output = model(input_data)
print(output.device)  # 输出：npu:0

# the article's warning: model on the NPU, input on the CPU -> a device-mismatch error
try:
    model(torch.randn(32, 784))
    print("MISMATCH NOT RAISED")
except RuntimeError as e:
    print("mismatch:", e)

model = MyModel().npu()
criterion = nn.CrossEntropyLoss()
optimizer = optim.Adam(model.parameters(), lr=0.001)
for epoch in range(10):
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.npu(), target.npu()
        output = model(data)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if batch_idx % 100 == 0:
            print(f'Epoch{epoch}, Batch{batch_idx}, Loss{loss.item()}')

torch.save(model.state_dict(), 'model_npu.pth')
model = MyModel().npu()  # 先搬到 NPU
model.load_state_dict(torch.load('model_npu.pth'))
model.eval()  # 推理模式
input_data = torch.randn(1, 784).npu()
output = model(input_data)
pred = output.argmax(dim=1)
print(f'Prediction:{pred.item()}')

torch.npu.enable_graph_mode(True)
input_data = torch.randn(1, 784).npu()
output = model(input_data)
print("graph mode:", output.device)
torch.npu.enable_graph_mode(False)

print("available:", torch.npu.is_available())
with torch.npu.amp.autocast():
    output = model(data)
    loss = criterion(output, target)
loss.backward()
print("autocast:", output.dtype)
"""


def run_article_003(tmp_path, opt_in: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CANN_EXPORT_LOAD_PLUGINS": ""}
    env.pop("CANN_EXPORT_NPU_SIM", None)
    if opt_in is not None:
        env["CANN_EXPORT_NPU_SIM"] = opt_in
    return subprocess.run([sys.executable, "-c", ARTICLE_003], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)


def test_article_003_typed_literally_runs_after_the_opt_in(tmp_path):
    proc = run_article_003(tmp_path, "1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "npu:0", lines[:3]
    mismatch = next(line for line in lines if line.startswith("mismatch:") or "NOT RAISED" in line)
    assert "Expected all tensors to be on the same device" in mismatch and "npu:0" in mismatch, mismatch
    assert "cpu" in mismatch
    assert sum(line.startswith("Epoch") for line in lines) == 10
    assert any(line.startswith("Prediction:") for line in lines)
    assert "graph mode: npu:0" in lines and "available: True" in lines and "autocast: torch.float16" in lines
    assert (tmp_path / "model_npu.pth").is_file()


def test_without_the_opt_in_import_torch_is_unchanged(tmp_path):
    proc = run_article_003(tmp_path, None)
    assert proc.returncode != 0 and "has no attribute 'npu'" in proc.stderr, proc.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CANN_EXPORT_NPU_SIM", None)
    probe = ("import sys, torch; print(hasattr(torch, 'npu'), "
             "sorted(m for m in sys.modules if m.split('.')[0] in ('cann', 'cann_export')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "False"
    # the autoload hook was imported (the entry point is installed) and imported nothing else of ours
    assert "['cann', 'cann.npu_autoload']" in out.stdout, out.stdout
