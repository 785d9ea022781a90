"""npu-sim: the emulated npu device. Every check runs in a subprocess (PrivateUse1's name is process-global)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import json, sys, torch
from torch import nn
DEVICE = sys.argv[1]
torch.manual_seed(0)
if sys.argv[2] == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
else:
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
model = model.to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
images = torch.randn(256, 1, 28, 28)
labels = torch.randint(0, 10, (256,))
losses = []
for epoch in range(2):
    for i in range(0, 256, 64):
        x, y = images[i:i + 64].to(DEVICE), labels[i:i + 64].to(DEVICE)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
model.eval()
with torch.no_grad():
    acc = (model(images.to(DEVICE)).argmax(1).cpu() == labels).float().mean().item()
torch.save(model.state_dict(), sys.argv[3])
back = torch.load(sys.argv[3], map_location="cpu")
assert all(v.device.type == "cpu" for v in back.values())
print(json.dumps({"losses": [l.hex() for l in losses], "acc": acc,
                  "device": str(next(model.parameters()).device),
                  "first": model.state_dict()[next(iter(model.state_dict()))].cpu().numpy().sum().item()}))
"""

ENABLE = "import cann.torch\ncann.torch.enable()\n"


def run(code: str, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    full_env = {**os.environ, "PYTHONPATH": path, "CANN_EXPORT_LOAD_PLUGINS": "", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"subprocess failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# the CNN (conv, batch norm, linear) in the README's command; the MLP (linear alone) in the slow set
@pytest.mark.parametrize("arch", [pytest.param("mlp", marks=pytest.mark.slow), "cnn"])
def test_unchanged_training_script_matches_cpu_bitwise(arch, tmp_path):
    cpu = json.loads(run(TRAIN, "cpu", arch, str(tmp_path / "cpu.pt")).stdout.splitlines()[-1])
    sim = json.loads(run(ENABLE + TRAIN, "npu", arch, str(tmp_path / "npu.pt")).stdout.splitlines()[-1])
    assert sim["device"] == "npu:0" and cpu["device"] == "cpu"
    assert sim["losses"] == cpu["losses"]  # float.hex: bitwise
    assert sim["acc"] == cpu["acc"] and sim["first"] == cpu["first"]


HF_TRAIN = """
import json, sys, torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
from transformers.utils import logging
logging.set_verbosity_error()
DEVICE = sys.argv[1]
torch.manual_seed(0)
losses, tied = [], []
for model in (BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, intermediate_size=64)),
              GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4))):
    model = model.to(DEVICE).train()  # dropout on: npu-sim draws from the CPU generator
    tied.append(model.get_output_embeddings() is None
                or model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (4, 16)).to(DEVICE)
    labels = ids if isinstance(model, GPT2LMHeadModel) else torch.tensor([0, 1, 0, 1]).to(DEVICE)
    for _ in range(3):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
print(json.dumps({"losses": losses, "tied": tied}))
"""


@pytest.mark.slow  # two transformers trainings in subprocesses; the README's command keeps bitwise training
# (test_unchanged_training_script_matches_cpu_bitwise) and BERT trained on npu-sim (test_articles_flow.py)
def test_transformers_training_matches_cpu_bitwise():
    """BERT and GPT-2 train identically; GPT-2's LM head stays tied to its embedding through .to("npu")."""
    cpu = json.loads(run(HF_TRAIN, "cpu").stdout.splitlines()[-1])
    sim = json.loads(run(ENABLE + HF_TRAIN, "npu").stdout.splitlines()[-1])
    assert sim["tied"] == [True, True]
    assert sim["losses"] == cpu["losses"]


def test_device_api_and_tensor_round_trip():
    code = ENABLE + textwrap.dedent("""
        import torch
        assert torch.npu.is_available() and torch.npu.device_count() == 1
        assert cann.torch.device_count() == 1 and cann.torch.is_available()
        cann.torch.set_device("cann:0"); cann.torch.set_device("npu:0")
        torch.manual_seed(1); a = torch.randn(3, 4, device="npu")
        torch.manual_seed(1); b = torch.randn(3, 4)
        assert a.device.type == "npu" and torch.equal(a.cpu(), b)
        t = torch.arange(6.).npu().view(2, 3).t()
        assert t.cpu().numpy().tolist() == [[0., 3.], [1., 4.], [2., 5.]]
        m = torch.nn.Linear(4, 2).npu()
        assert m.weight.device.type == "npu" and m.weight.is_npu
        print("ok")
    """)
    assert run(code).stdout.strip().endswith("ok")


OPS = ENABLE + textwrap.dedent("""
    import warnings, torch
    warnings.simplefilter("ignore")  # ATen's deprecation warning for resizing a non-empty out= tensor
    F = torch.nn.functional
    cases = {
        "wrapped number": lambda a, b, i, m: (a + 2, 1 - a, a / 3),
        "in-place": lambda a, b, i, m: (a.mul_(b), a.clamp_(min=0)),
        "index": lambda a, b, i, m: (a[i], a[m], torch.where(m, a, b), a.masked_fill(m, 1.5)),
        "index_put": lambda a, b, i, m: a.index_put_((i,), torch.ones(5, device=a.device)),
        "setitem": lambda a, b, i, m: (a.__setitem__(m, 0.0), a)[1],
        "tuple returns": lambda a, b, i, m: (*a.max(dim=1), *a.sort(dim=1), *a.topk(2), *torch.std_mean(a, 0)),
        "shape-dependent": lambda a, b, i, m: (m.nonzero(), *torch.unique(i, return_counts=True), torch.bincount(i)),
        "lists": lambda a, b, i, m: (torch.cat([a, b]), torch.stack([a, b]), *a.split(2), *a.unbind(0)),
        "views": lambda a, b, i, m: (a.t().contiguous(), b.copy_(a.t().t()), a.flip(0), a.repeat(2, 1)),
        "nn": lambda a, b, i, m: (a @ b.t(), a.softmax(-1), F.layer_norm(a, (5,)), F.embedding(i, a),
                                  F.conv1d(a.unsqueeze(0), b.reshape(4, 5, 1)[:, :4].contiguous())),
        "factories": lambda a, b, i, m: (torch.arange(5, device=a.device), torch.full((2, 2), 3.0, device=a.device),
                                         torch.zeros_like(a), torch.linspace(0, 1, 5, device=a.device)),
        "dtype": lambda a, b, i, m: (a.half(), a.to(torch.int32), F.one_hot(i, 4)),
        "out= grow": lambda a, b, i, m: torch.add(a, b, out=torch.empty(0, device=a.device)),
        "out= shrink": lambda a, b, i, m: torch.add(a[:2], b[:2], out=torch.empty(4, 5, device=a.device)),
        "out= same": lambda a, b, i, m: torch.sum(a, 0, out=torch.empty(5, device=a.device)),
        "resize_ shrink": lambda a, b, i, m: a.resize_(2, 3),
        "resize_ grow": lambda a, b, i, m: a.resize_(10, 10).view(-1)[:20],
        # a block of its own (mmap'd): reading past the old size would fault, not read a neighbour
        "resize_ grow big": lambda a, b, i, m: (lambda t: t.resize_(1 << 20)[:1 << 16])(
            torch.ones(1 << 16, device=a.device)),
        "view after swap": lambda a, b, i, m: (lambda v: (setattr(a, "data", b * 0), torch.randn(64), v)[2])(
            a.view(20)),
        "in-place views": lambda a, b, i, m: (a.view(-1).add_(1), a.t_(), a.unsqueeze_(0))[2],
    }
    torch.manual_seed(0)
    a, b, i = torch.randn(4, 5), torch.randn(4, 5), torch.tensor([0, 2])
    bad = []
    for _ in range(3):  # repeated: freed memory would be reused and show up as wrong values
        for name, f in cases.items():
            want = f(a.clone(), b.clone(), i, a > 0)
            got = f(a.clone().npu(), b.clone().npu(), i.npu(), (a > 0).npu())
            want, got = [x if isinstance(x, tuple) else (x,) for x in (want, got)]
            if not all(g.device.type == "npu" and torch.equal(w, g.cpu()) for w, g in zip(want, got)):
                bad.append(name)
    assert torch.zeros_like(torch.ones(2, device="npu"), device="cpu").device.type == "cpu"
    print("bad:", sorted(set(bad)))
""")


def test_operators_match_cpu_and_memory_stays_owned():
    """Shape-changing out=, resize_ and storage swaps keep every npu tensor over live memory."""
    assert run(OPS).stdout.strip().splitlines()[-1] == "bad: []"


REFUSE = ENABLE + textwrap.dedent("""
    import sys, torch
    what = sys.argv[1]
    try:
        if what == "pin":
            torch.randn(2).pin_memory()
        elif what == "loader":
            ds = torch.utils.data.TensorDataset(torch.randn(4, 2))
            next(iter(torch.utils.data.DataLoader(ds, pin_memory=True)))
        elif what == "device1":
            torch.randn(2, device="npu:1")
        elif what == "to1":
            torch.randn(2).to("npu:1")
        elif what == "set1":
            cann.torch.set_device("npu:1")
        elif what == "numpy":
            torch.randn(2, device="npu").numpy()
        elif what == "inductor":
            model = torch.nn.Linear(4, 2).npu()
            assert torch.compile(model, backend="aot_eager")(torch.randn(3, 4, device="npu")).shape == (3, 2)
            torch.compile(model)(torch.randn(3, 4, device="npu"))
    except Exception as e:
        print(type(e).__name__, e)
""")


@pytest.mark.parametrize("what,expected", [
    ("pin", "no pinned (page-locked) host memory"),
    ("loader", "no pinned (page-locked) host memory"),
    ("device1", "single device, npu:0"),
    ("to1", "single device, npu:0"),
    ("set1", "single device, npu:0"),
    ("numpy", "Use Tensor.cpu()"),
    # torch.compile's aot_eager run: the slow set
    pytest.param("inductor", "inductor backend does not run on npu-sim", marks=pytest.mark.slow),
])
def test_refusals_are_clear(what, expected):
    assert expected in run(REFUSE, what).stdout


def test_not_a_side_effect_of_import():
    out = run("import torch, cann_export, cann.torch, cann.model_zoo\n"
              "print(torch._C._get_privateuse1_backend_name(), hasattr(torch, 'npu'))").stdout
    assert out.split() == ["privateuseone", "False"]


def test_steps_aside_when_real_torch_npu_imports(tmp_path):
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("")
    code = textwrap.dedent("""
        import cann_export.backend.npu_sim as sim
        try:
            sim.install()
        except sim.NpuSimError as e:
            print(e)
    """)
    out = run(code, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}).stdout
    assert "real torch_npu imports" in out and "steps aside" in out


SAVE = """
import sys, torch
dev = sys.argv[1]
if dev == "npu":
    import cann.torch; cann.torch.enable()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(7)
x, y = torch.randn(32, 8, generator=g).to(dev), torch.randn(32, 2, generator=g).to(dev)
def step():
    loss = torch.nn.functional.mse_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step(); return loss.item()
for _ in range(3): step()
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "step": 30}, sys.argv[2])
print(step().hex())
"""

RESUME = """
import sys, torch
dev = sys.argv[1]
if dev == "npu":
    import cann.torch; cann.torch.enable()
import cann.torch
torch.manual_seed(123)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
state = cann.torch.resume(sys.argv[2], model, opt)
assert state == {"epoch": 3, "step": 30, "restored": ["model", "optimizer"]}, state
assert all(v.device.type == dev for s in opt.state.values() for v in s.values() if v.dim() > 0)
g = torch.Generator().manual_seed(7)
x, y = torch.randn(32, 8, generator=g).to(dev), torch.randn(32, 2, generator=g).to(dev)
loss = torch.nn.functional.mse_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
print(loss.item().hex())
"""


# npu -> cpu in the README's command (a checkpoint saved from the device resumes off it); the other two ways in the
# slow set: the same save and load code, four more subprocesses
@pytest.mark.parametrize("saved_on,resumed_on", [pytest.param("cpu", "npu", marks=pytest.mark.slow), ("npu", "cpu"),
                                                 pytest.param("npu", "npu", marks=pytest.mark.slow)])
def test_resume_across_cpu_and_npu_sim(saved_on, resumed_on, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    expected = run(SAVE, saved_on, str(ckpt)).stdout.split()[-1]
    got = run(RESUME, resumed_on, str(ckpt)).stdout.split()[-1]
    assert got == expected


def test_backends_command_lists_availability_with_reasons():
    usage = run("import sys; sys.argv = ['cann-export', '--help']\nfrom cann_export.cli.main import main; main()")
    assert re.search(r"^  backends +List the devices", usage.stdout, re.M), usage.stdout  # discoverable
    proc = subprocess.run([sys.executable, "-m", "cann_export", "backends", "--json"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["cpu"]["available"] and rows["npu-sim"]["available"]
    assert set(rows) >= {"cpu", "cuda", "npu", "npu-sim"}
    assert not rows["npu"]["available"] and "torch_npu" in rows["npu"]["reason"]


@pytest.mark.slow  # two QAT CLI exports in subprocesses; QAT on npu-sim stays in the README's command through
# test_articles_flow.py's restart test (qat)
def test_qat_export_on_npu_sim_equals_cpu(tmp_path):
    """--backend npu-sim runs the QAT fine-tuning on the emulated npu: same scales as on the CPU."""
    from helpers import digits
    from safetensors.torch import save_file, save_model

    save_model(digits.trained(), str(tmp_path / "d.safetensors"))
    save_file({"x": digits.split()[0][:128].contiguous()}, str(tmp_path / "c.safetensors"))
    layers = {}
    for backend in ("cpu", "npu-sim"):
        out = tmp_path / f"{backend}.onnx"
        code = "import sys; sys.argv = ['cann-export'] + sys.argv[1:]\nfrom cann_export.cli.main import main\nmain()\n"
        tests_dir = str(Path(__file__).parents[1])
        run(code, "export", str(tmp_path / "d.safetensors"), "--model-class", "helpers.digits:DigitsCNN", "--qat",
            "--calibration-data", str(tmp_path / "c.safetensors"), "--qat-steps", "4", "--backend", backend,
            "--format", "onnx", "-o", str(out), "--json",
            env={"PYTHONPATH": os.pathsep.join([str(ROOT), tests_dir])})
        import onnx

        props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
        q = json.loads(props["cann_export.quantization"])
        assert q["device"] == ("cpu" if backend == "cpu" else "npu")
        layers[backend] = q["layers"]
    assert layers["cpu"] == layers["npu-sim"]


def test_parity_reference_runs_on_npu_sim(tmp_path):
    code = textwrap.dedent("""
        import json, sys, torch
        import cann_export
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        result = cann_export.export(model, sys.argv[1], example_inputs=torch.randn(3, 12), backend="npu-sim")
        print(json.dumps({"ok": result.ok, "device": result.manifest["parity"]["reference_device"],
                          "renamed": torch._C._get_privateuse1_backend_name()}))
    """)
    out = json.loads(run(code, str(tmp_path / "b")).stdout.strip().splitlines()[-1])
    assert out == {"ok": True, "device": "npu", "renamed": "npu"}


def test_autocast_cast_lists_and_grad_scaler():
    code = textwrap.dedent("""
        import json, torch
        import cann.torch
        cann.torch.enable()

        def train(device, amp):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            scaler = torch.amp.GradScaler(device, enabled=amp)
            x, y = torch.randn(64, 16).to(device), torch.randint(0, 4, (64,)).to(device)
            losses, dtypes = [], {}
            for _ in range(5):
                with torch.autocast(device, dtype=torch.float16, enabled=amp):
                    logits = model(x)
                    probs = torch.softmax(logits, -1)
                    loss = torch.nn.functional.cross_entropy(logits, y)
                dtypes = {"linear": str(logits.dtype), "softmax": str(probs.dtype), "loss": str(loss.dtype)}
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                losses.append(loss.item())
            return losses, dtypes, scaler.get_scale() if amp else None

        amp_losses, dtypes, scale = train("npu", True)
        fp32_losses, _, _ = train("cpu", False)
        print(json.dumps({"amp": amp_losses, "fp32": fp32_losses, "dtypes": dtypes, "scale": scale}))
    """)
    out = json.loads(run(code).stdout.strip().splitlines()[-1])
    assert out["dtypes"] == {"linear": "torch.float16", "softmax": "torch.float32", "loss": "torch.float32"}
    assert out["scale"] == 65536.0
    for amp, ref in zip(out["amp"], out["fp32"], strict=False):
        assert abs(amp - ref) <= 1e-2 * abs(ref)  # fp16 matmuls, fp32 softmax/loss: close to fp32
    assert out["amp"] != out["fp32"]  # ... and visibly computed in reduced precision


MEMORY = ENABLE + textwrap.dedent("""
    import copy, gc, io, pickle, torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).to("npu")
    model(torch.randn(2, 1, 6, 6, device="npu")).sum().backward()
    t = torch.randn(3, 4).npu()
    want = t.cpu()
    checks = {
        "storage clone": lambda: torch.empty(0, device="npu").set_(t.untyped_storage().clone()).view(torch.float32),
        "deepcopy tensor": lambda: copy.deepcopy(t).view(-1),
        "deepcopy state_dict": lambda: copy.deepcopy(model.state_dict())["0.weight"],
        "deepcopy module": lambda: copy.deepcopy(model)[0].weight,
        "pickle": lambda: pickle.loads(pickle.dumps(t)),
        "typed storage": lambda: torch.TypedStorage(4, device="npu", dtype=torch.float32).device,
        "storage cpu": lambda: t.untyped_storage().cpu(),
        "conj": lambda: torch.randn(3, dtype=torch.complex64).npu().conj().cpu(),
    }
    out = {}
    for name, check in checks.items():
        for _ in range(3):  # freed memory would be reused by the allocations in between
            r = check(); gc.collect(); torch.randn(4096)
        out[name] = r
    assert torch.equal(out["storage clone"].cpu().view(-1), want.view(-1))
    assert torch.equal(out["deepcopy tensor"].cpu(), want.view(-1))
    assert torch.equal(out["deepcopy state_dict"].cpu(), model[0].weight.cpu())
    assert out["deepcopy module"].device.type == "npu"
    assert torch.equal(out["pickle"].cpu(), want) and out["pickle"].device.type == "npu"
    assert out["typed storage"].type == "npu" and out["storage cpu"].device.type == "cpu"
    b = io.BytesIO(); torch.save({"sd": model.state_dict(), "t": t}, b); b.seek(0)
    back = torch.load(b); assert back["t"].device.type == "npu" and torch.equal(back["t"].cpu(), want)
    x = torch.arange(6.).npu(); v = x.view(2, 3); x.resize_(2); x.resize_(50)
    gc.collect(); torch.randn(4096)
    assert v.cpu().tolist() == [[0., 1., 2.], [3., 4., 5.]] and x.shape == (50,)
    print("ok")
""")


def test_storage_copies_and_serialization_never_crash_or_alias_freed_memory():
    """The BatchNorm export crash of issue 12: deepcopy reached a PrivateUse1 allocator that is null."""
    assert run(MEMORY).stdout.strip().endswith("ok")


ADAPTER = ENABLE + textwrap.dedent("""
    import json, sys, torch
    from torch import nn
    cann.torch.set_device("cann:0")
    tmp = sys.argv[1]
    # "cann" is the npu device wherever a device is passed; results carry the real one
    x = torch.randn(2, 3).to("cann")
    devices = {str(d) for d in (x.device, torch.randn(2, device="cann:0").device, torch.zeros(2, device="cann").device,
                                x.new_zeros(3, device="cann").device, x.to(device="cann:0").device,
                                torch.arange(3, device="cann").device, cann.torch.device("cann:0"))}
    assert devices == {"npu:0"}, devices
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)).to("cann")
    assert next(model.parameters()).device.type == "npu"
    opt = torch.optim.AdamW(model.parameters())
    for step in range(2):
        loss = model(torch.randn(8, 1, 6, 6).to("cann")).sum(); opt.zero_grad(); loss.backward(); opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 2}, tmp + "/ck.pt")
    weights = [p.detach().cpu().clone() for p in model.parameters()]
    moments = opt.state_dict()["state"][0]["exp_avg"].cpu().clone()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    for s in opt.state.values():
        s["exp_avg"].zero_()
    state = cann.torch.resume(tmp + "/ck.pt")  # one argument: the tracked model and its optimizer
    assert state == {"step": 2, "restored": ["model", "optimizer"]}, state
    assert all(torch.equal(w, p.detach().cpu()) for w, p in zip(weights, model.parameters()))
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"].cpu(), moments)
    # export from where the model lives: the recorded npu inputs and the module are copied to the CPU
    model.train()
    result = cann.torch.export(model=model, output_path=tmp + "/m.onnx", export_format="onnx")
    assert result.ok and next(model.parameters()).device.type == "npu" and model.training
    # torch.npu.amp and graph mode as torch_npu spells them
    with torch.npu.amp.autocast():
        assert model[4](torch.randn(2, 64, device="cann")).dtype == torch.float16
    assert isinstance(torch.npu.amp.GradScaler(), torch.amp.GradScaler)
    said = torch.npu.enable_graph_mode(True)
    eager = model.eval()(torch.ones(2, 1, 6, 6, device="cann")).cpu()
    assert "aot_eager" in said and model._compiled_call_impl is not None
    assert torch.npu.enable_graph_mode(False).startswith("graph mode off") and model._compiled_call_impl is None
    assert torch.allclose(model(torch.ones(2, 1, 6, 6, device="cann")).cpu(), eager)
    # the profiler's CANN activity: npu operators with their shapes
    P = cann.torch.profiler
    with P.profile(activities=[P.ProfilerActivity.CPU, P.ProfilerActivity.CANN], record_shapes=True) as prof:
        model(torch.randn(2, 1, 6, 6, device="cann"))
    prof.export_chrome_trace(tmp + "/trace.json")
    events = json.load(open(tmp + "/trace.json"))["traceEvents"]
    conv = [e for e in events if e.get("name", "").startswith("npu::convolution")]
    assert conv and conv[0]["args"]["Input Dims"][:2] == [[2, 1, 6, 6], [4, 1, 3, 3]], conv
    cann.torch.disable()
    try:
        torch.randn(2).to("cann")
    except RuntimeError:
        print("ok")
""")


def test_adapter_surface_as_the_articles_write_it(tmp_path):
    assert run(ADAPTER, str(tmp_path)).stdout.strip().endswith("ok")


KWARGS = ENABLE + textwrap.dedent("""
    import sys, torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging
    logging.set_verbosity_error()
    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32)).to("cann")
    ids = torch.randint(0, 64, (1, 8)).to("cann")
    model(input_ids=ids, attention_mask=torch.ones_like(ids))  # keyword arguments only
    result = cann.torch.export(model=model, output_path=sys.argv[1] + "/bert.onnx", export_format="onnx")
    names = [i["name"] for i in result.manifest["model"]["inputs"]]
    assert names == ["input_ids", "attention_mask"], names
    assert next(model.parameters()).device.type == "npu"
    print("ok")
""")


def test_export_records_keyword_inputs_on_npu(tmp_path):
    assert run(KWARGS, str(tmp_path)).stdout.strip().endswith("ok")


def test_disable_undoes_enable_and_untested_torch_is_refused():
    code = textwrap.dedent("""
        import torch, cann.torch
        from cann_export.backend import npu_sim
        before = list(torch.serialization._package_registry)
        cann.torch.enable("npu-sim")
        assert torch.randn(2, device="npu").device.type == "npu"
        cann.torch.disable()
        assert not npu_sim.is_installed() and torch.serialization._package_registry == before
        assert "__new__" not in torch.UntypedStorage.__dict__ and torch.autograd.grad_mode
        try:
            torch.randn(2, device="npu")
        except (RuntimeError, NotImplementedError) as e:
            print("disabled:", type(e).__name__)
        cann.torch.enable("npu-sim")  # again, in the same process
        assert torch.randn(2, device="npu").cpu().shape == (2,)
        ok, why = npu_sim.torch_version_supported("2.99.0")
        print(ok, why)
    """)
    out = run(code).stdout
    assert "disabled:" in out
    assert "False npu-sim was tested with torch" in out and "CANN_EXPORT_NPU_SIM_ANY_TORCH=1" in out
