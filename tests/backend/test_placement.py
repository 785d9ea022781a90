"""npu-sim enforces placement as the device does (issue 20, item 1): an op mixing npu and CPU tensors raises
torch's device-mismatch error, 0-dim CPU tensors and CPU indices allowed, in forward, backward, optimizers
and losses; copies, saving, loading and printing still cross devices.

The oracle is torch's own: PyTorch's OpInfo samples with their tensors dealt alternately to npu and to the
CPU, judged by ``FakeTensorMode`` with fake ``cuda`` tensors (tests/helpers/placement_oracle.py). npu-sim is
process-global, so everything runs in subprocesses.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import expecttest  # noqa: F401 - a declared test dependency: torch.testing._internal imports it

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "helpers" / "placement_oracle.py"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "CANN_EXPORT_LOAD_PLUGINS": ""}

_CONV = ("FakeTensor's convolution meta kernel never compares the weight's device with the input's; CUDA's "
         "kernel raises (\"Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the "
         "same\"), and so does npu-sim")
# op -> why npu-sim's answer differs from FakeTensor's, and which side real hardware takes
EXCEPTIONS = {
    **{f"nn.functional.{c}": _CONV for c in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                                              "conv_transpose3d")},
    "nn.functional.embedding": "FakeTensor decomposes embedding to weight[indices], and indexing takes indices "
                               "on any device; the eager kernel runs index_select, which raises on CUDA and npu-sim",
    "native_dropout_backward": "FakeTensor's decomposition moves the mask (mask.type_as(grad)); CUDA's kernel "
                               "(TensorIterator) takes no CPU mask, nor does npu-sim",
    "linalg.pinv": "the 0-dim CPU rtol: torch's composite kernel (which CUDA and npu-sim both run) makes it 1-dim "
                   "(rtol.unsqueeze(-1)) before multiplying device values; FakeTensor takes another path",
    "nn.functional.linear_cross_entropy.chunked": "the chunked op's fake kernel computes shapes only; its eager "
                                                  "kernel multiplies the input by the CPU weight (aten.mm), which "
                                                  "raises on CUDA and npu-sim",
    "nn.functional.linear_cross_entropy.chunked_none": "as linear_cross_entropy.chunked",
    "select_scatter": "CUDA's kernel copies src into a clone of the input with copy_, which crosses devices "
                      "(select_scatter is device_check: NoCheck); npu-sim runs that same kernel. FakeTensor's "
                      "meta kernel wants one device",
}


def test_op_db_samples_raise_where_torch_says_devices_mismatch(tmp_path):
    log = tmp_path / "log.jsonl"
    proc = subprocess.run([sys.executable, str(RUNNER), "0", "1", str(log)], check=False, capture_output=True,
                          text=True, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    judged = [r for r in records if r["oracle"] != "unknown"]
    differ = {r["op"]: r for r in judged if r["oracle"] != r["npu_sim"] and r["op"] not in EXCEPTIONS}
    assert not differ, "npu-sim's placement differs from torch's:\n" + "\n".join(
        f"{op}: torch {r['oracle']}, npu-sim {r['npu_sim']} ({r['detail']})" for op, r in sorted(differ.items()))
    agreeing = [op for op in EXCEPTIONS if any(r["op"] == op and r["oracle"] == r["npu_sim"] for r in judged)]
    assert not agreeing, f"listed as exceptions but npu-sim and torch agree now: {agreeing}"
    mismatches = sum(r["oracle"] == "mismatch" for r in judged)
    runs = sum(r["oracle"] == "runs" for r in judged)
    print(f"{len(judged)} ops judged: {mismatches} mismatch, {runs} run (of {len(records)})")
    # both answers must be exercised broadly: a check that never fires (or always does) would fail here
    assert mismatches > 80 and runs > 50, (mismatches, runs)


def run_sim(body: str) -> subprocess.CompletedProcess:
    script = "import torch\nfrom torch import nn\nimport cann.torch\ncann.torch.enable('npu-sim')\n" + \
        textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=ENV,
                          timeout=300)


MISMATCH = "Expected all tensors to be on the same device, but found at least two devices"


def test_mixed_forward_backward_loss_and_optimizer_raise_as_on_the_device():
    proc = run_sim("""
        def raises(what, f):
            try:
                f()
            except RuntimeError as e:
                assert "Expected all tensors to be on the same device" in str(e), (what, e)
                assert "npu:0" in str(e) and "cpu" in str(e), (what, e)
                print("raised:", what)
                return
            raise AssertionError(what + " ran")

        model = nn.Linear(4, 2).npu()
        raises("model on npu, input on cpu", lambda: model(torch.randn(3, 4)))
        raises("a cpu tensor indexed by npu indices", lambda: torch.randn(4, 3)[torch.tensor([0, 1]).npu()])
        logits = torch.randn(5, 3).npu()
        raises("loss with a cpu target", lambda: nn.CrossEntropyLoss()(logits, torch.tensor([0, 1, 2, 0, 1])))

        class Mixes(torch.autograd.Function):  # a backward that brings in a CPU tensor
            @staticmethod
            def forward(ctx, a):
                return a * 2

            @staticmethod
            def backward(ctx, g):
                return g * torch.ones(g.shape)

        a = torch.randn(3, device="npu", requires_grad=True)
        raises("backward", lambda: Mixes.apply(a).sum().backward())
        for name, make in (("adam", lambda p: torch.optim.Adam(p)), ("adamw fused", lambda p: torch.optim.AdamW(p,
                           fused=True)), ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))):
            opt = make(model.parameters())
            model(torch.randn(3, 4).npu()).sum().backward()
            opt.step()
            for p in model.parameters():
                for k, v in opt.state[p].items():
                    if k != "step":
                        opt.state[p][k] = v.cpu()
            raises(f"{name} with its state on cpu", opt.step)
        print("ALL RAISED")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ALL RAISED" in proc.stdout


def test_what_crosses_devices_on_the_device_still_does(tmp_path):
    proc = run_sim(f"""
        x = torch.randn(5, 3).npu()
        assert (x + torch.tensor(2.0)).device.type == "npu"            # a 0-dim CPU tensor
        assert (x * torch.tensor(2.0, dtype=torch.float64)).device.type == "npu"
        assert x[torch.tensor([0, 2])].shape == (2, 3)                 # CPU indices
        assert x[torch.tensor([True, False, True, False, True])].shape == (3, 3)
        y = x.clone()
        y[torch.tensor([0, 1])] = torch.zeros(2, 3).npu()
        y.index_put_((torch.tensor([4]),), torch.tensor(7.0))
        assert y.cpu()[4].eq(7).all() and y.cpu()[:2].eq(0).all()
        assert torch.empty_like(x, device="cpu").device.type == "cpu"
        assert x.cpu().device.type == "cpu" and x.to("cpu").device.type == "cpu"
        z = torch.zeros(5, 3, device="npu").copy_(torch.ones(5, 3))
        assert z.cpu().eq(1).all()
        assert "npu:0" in repr(x)
        model = nn.Linear(4, 2).npu()
        cpu_state = nn.Linear(4, 2).state_dict()
        model.load_state_dict(cpu_state)
        assert torch.equal(model.weight.cpu(), cpu_state["weight"])
        torch.save(model.state_dict(), {str(tmp_path / 'm.pth')!r})
        loaded = torch.load({str(tmp_path / 'm.pth')!r})
        assert loaded["weight"].device.type == "npu"
        opt = torch.optim.Adam(model.parameters())               # its "step" counters are 0-dim CPU tensors
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4).npu()).sum().backward()
            opt.step()
        assert opt.state[model.weight]["step"].device.type == "cpu"
        sd = opt.state_dict()
        opt2 = torch.optim.Adam(model.parameters())
        opt2.load_state_dict(sd)
        opt2.step()
        print("ALL RAN")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ALL RAN" in proc.stdout


def test_a_loaded_program_moves_its_constants_and_baked_devices_with_it():
    """``load_model(..., framework="pytorch").to("cann")``: a torch.export program's lifted constants and
    its baked ``to(x, cpu)`` nodes follow the module, so the placement check finds nothing left on the CPU."""
    proc = run_sim("""
        from cann_export.bundle.torch_program import accept_keywords, follow_device

        class M(nn.Module):
            def forward(self, x, mask):
                return x * torch.tensor([1.0, 2.0, 3.0]) + mask.to(torch.float32)  # a lifted constant

        x, mask = torch.randn(2, 3), torch.ones(2, 3, dtype=torch.int64)
        module = follow_device(accept_keywords(torch.export.export(M(), (x, mask)).module())).to("npu")
        assert torch.equal(module(x.npu(), mask.npu()).cpu(), M()(x, mask))
        assert module.cpu()(x, mask).device.type == "cpu"
        print("FOLLOWED")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FOLLOWED" in proc.stdout
