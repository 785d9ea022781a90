"""``cann.torch.config``'s training keys (article 000, section 2) on the user's unchanged loop on npu-sim:
each test proves the key's effect on the tracked model, not the flag. Each scenario runs in its own
subprocess (npu-sim is process-global)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PREAMBLE = """
import json, warnings
import torch
from torch import nn
import cann.torch
from cann_export.backend import train_config
from cann_export.backend.activation_meter import saved_activations

cann.torch.enable()
cann.torch.set_device("cann:0")
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.bn = nn.Linear(32, 128), nn.Linear(128, 32), nn.BatchNorm1d(32)

    def forward(self, x):
        return self.bn(x + self.down(torch.relu(self.up(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(4)])
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.blocks(x))


x, y = torch.randn(16, 32).to("cann"), torch.randint(0, 4, (16,)).to("cann")


def loop(model, optimizer, steps=3):
    losses = []
    for _ in range(steps):  # the articles' unchanged loop
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
"""

MIXED = PREAMBLE + """
cann.torch.config(mixed_precision="fp16")  # before the model is tracked: applies at .to("cann")
model = Net().to("cann")
seen = []
model.blocks[0].up.register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
reference = Net().to("cpu")
reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})

out = model(x)
res = {"inner": seen[-1], "out": str(out.dtype), "param": str(model.head.weight.dtype)}
nn.functional.cross_entropy(out, y).backward()
ref_loss = nn.functional.cross_entropy(reference(x.cpu()), y.cpu())
ref_loss.backward()
got = torch.cat([p.grad.cpu().flatten() for p in model.parameters()])
want = torch.cat([r.grad.flatten() for r in reference.parameters()])
res["grad_rel"] = float((got - want).norm() / want.norm())  # unscaled: fp16 rounding only
model.zero_grad()

opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
res["losses"] = loop(model, opt)
res["scale"] = train_config.status(model)["loss_scale"]

# an overflow: the step is skipped (parameters unchanged) and the scale halves
from cann_export.backend import loss_scale
loss_scale.of(model).scale.fill_(2.0 ** 40)
before = [p.detach().clone() for p in model.parameters()]
res["overflow_losses"] = loop(model, opt, steps=1)
res["unchanged_after_overflow"] = all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
res["overflow_scale"] = train_config.status(model)["loss_scale"]
loop(model, opt, steps=30)  # each overflow halves the scale, until the gradients fit fp16 again
res["recovered"] = train_config.status(model)["loss_scale"]
res["changed_after_next"] = not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))

cann.torch.config(mixed_precision="bf16")
model(x)
res["bf16_inner"], res["bf16_scaler"] = seen[-1], train_config.status(model)["loss_scale"]
cann.torch.config(mixed_precision=False)
model(x)
res["off_inner"] = seen[-1]
print(json.dumps(res))
"""

CHECKPOINTING = PREAMBLE + """
import copy
plain = Net().to("cann")
model = copy.deepcopy(plain)  # the same weights


def step(m):
    with saved_activations() as meter:
        loss = nn.functional.cross_entropy(m(x), y)
    loss.backward()
    return meter.bytes


res = {"plain_bytes": step(plain)}
cann.torch.track(model)
cann.torch.config(gradient_checkpointing=True)  # applies at once to the models tracked already
res.update(ckpt_bytes=step(model), status=train_config.status(model))
res["grads_equal"] = all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), model.parameters()))
res["buffers_equal"] = all(torch.equal(a, b) for a, b in zip(plain.buffers(), model.buffers()))
cann.torch.config(gradient_checkpointing=False)
model.zero_grad()
res["off_bytes"] = step(model)
print(json.dumps(res))
"""

HF_CHECKPOINTING = PREAMBLE + """
from transformers import BertConfig, BertForSequenceClassification

cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64, num_labels=3)
ids, labels = torch.randint(0, 100, (4, 16)).to("cann"), torch.randint(0, 3, (4,)).to("cann")


def step(m):
    torch.manual_seed(1)  # the same dropout masks in both runs
    with saved_activations() as meter:
        loss = m(input_ids=ids, labels=labels).loss
    loss.backward()
    return meter.bytes


cann.torch.config(gradient_checkpointing=True)
model = BertForSequenceClassification(cfg).to("cann")
res = {"hf_switch": model.is_activation_checkpointing, "status": train_config.status(model)}
model.train()
res["ckpt_bytes"] = step(model)
grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
cann.torch.config(gradient_checkpointing=False)
res["hf_switch_off"] = model.is_activation_checkpointing
res["plain_bytes"] = step(model)
res["grads_equal"] = all(torch.equal(a, b.grad) for a, b in zip(grads, model.parameters()))
print(json.dumps(res))
"""

COMPILE = PREAMBLE + """
from torch._dynamo.utils import counters

model = Net().to("cann")
eager = [p.detach().clone() for p in model.parameters()]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cann.torch.config(compile_model=True)
res = {"status": train_config.status(model), "losses": loop(model, opt)}
res["graphs"], res["frames_ok"] = counters["stats"]["unique_graphs"], counters["frames"]["ok"]
cann.torch.config(compile_model=False)
frames = counters["frames"]["total"]
loop(model, opt, steps=1)
res["frames_after_off"] = counters["frames"]["total"] - frames
print(json.dumps(res))
"""

WORKERS = PREAMBLE + """
from torch.utils.data import DataLoader, TensorDataset

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    settings = cann.torch.config(dataloader_workers=8)
loader = DataLoader(TensorDataset(torch.randn(8, 32)), batch_size=4)  # the user's own loader, unchanged
print(json.dumps({"messages": [str(w.message) for w in caught], "setting": settings["dataloader_workers"],
                  "user_workers": loader.num_workers}))
"""


def run(code: str, *args: str) -> dict:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    env = {**os.environ, "PYTHONPATH": path, "CANN_EXPORT_LOAD_PLUGINS": ""}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


def test_mixed_precision_fp16_autocasts_the_tracked_forward_and_scales_its_gradients():
    res = run(MIXED)
    assert res["inner"] == "torch.float16" and res["out"] == "torch.float32", res  # autocast inside, fp32 out
    assert res["param"] == "torch.float32", res  # fp32 master weights
    assert res["grad_rel"] < 0.02, res  # p.grad is the true gradient (unscaled), up to fp16 rounding
    assert all(v == v for v in res["losses"]) and res["losses"][-1] < res["losses"][0], res
    assert res["scale"] == {"scale": 65536.0, "steps": 3, "skipped_steps": 0}, res
    assert res["unchanged_after_overflow"] and res["changed_after_next"], res
    assert res["overflow_scale"]["skipped_steps"] == 1 and res["overflow_scale"]["scale"] == 2.0 ** 39, res
    assert 1 < res["recovered"]["skipped_steps"] < 30 and res["recovered"]["scale"] < 2.0 ** 39, res
    assert res["bf16_inner"] == "torch.bfloat16" and res["bf16_scaler"] is None, res  # bf16: no scaler
    assert res["off_inner"] == "torch.float32", res  # config(mixed_precision=False) undoes it


def test_gradient_checkpointing_recomputes_blocks_with_less_saved_memory_and_the_same_gradients():
    res = run(CHECKPOINTING)
    assert res["status"]["gradient_checkpointing"] and "4 block(s)" in res["status"]["notes"][0], res
    assert res["ckpt_bytes"] < 0.5 * res["plain_bytes"], res  # saved activations (bytes) measured, not a flag
    assert res["grads_equal"] and res["buffers_equal"], res  # BatchNorm's statistics updated once per step
    assert res["off_bytes"] == res["plain_bytes"], res  # config(gradient_checkpointing=False) undoes it


def test_gradient_checkpointing_uses_transformers_own_switch():
    res = run(HF_CHECKPOINTING)
    assert res["hf_switch"] and not res["hf_switch_off"], res
    assert "transformers' own" in res["status"]["notes"][0], res
    assert res["ckpt_bytes"] < res["plain_bytes"], res
    assert res["grads_equal"], res


def test_compile_model_runs_the_tracked_model_through_torch_compile():
    res = run(COMPILE)
    assert res["status"]["compile_model"] == "auto", res
    assert res["graphs"] >= 1 and res["frames_ok"] >= 1, res  # dynamo captured the model's forward
    assert res["losses"][-1] < res["losses"][0], res
    assert res["frames_after_off"] == 0, res  # config(compile_model=False): eager again


def test_dataloader_workers_says_where_the_workers_go():
    res = run(WORKERS)
    assert res["setting"] == 8 and res["user_workers"] == 0, res  # the user's DataLoader is not touched
    assert any("DataLoader(dataset, ..., num_workers=8)" in m for m in res["messages"]), res
