"""The article's order: ``cann.torch.enable()`` first, then ``from_pretrained``. transformers builds the model under
``torch.device("meta")`` and fills the buffers the checkpoint lacks (``position_ids``) after loading; the ``cann``
device name must leave torch's device context working, or those buffers stay unfilled memory. Each check runs in a
fresh process: torch builds the table that context consults once per process, so an earlier test could hide it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

LOAD_ENABLED = """
import sys, torch
import cann.torch
cann.torch.enable("npu-sim")
from transformers import AutoModel
out = {}
for name in sys.argv[2:]:
    model = AutoModel.from_pretrained(sys.argv[1] + "/" + name).eval()
    for key, buffer in model.named_buffers():
        out[name + "/buffer/" + key] = buffer.detach().clone()
    with torch.no_grad():
        out[name + "/cpu"] = model(input_ids=torch.tensor([[1, 5, 9, 3]])).last_hidden_state
        model.to("cann")
        out[name + "/npu"] = model(input_ids=torch.tensor([[1, 5, 9, 3]]).to("cann")).last_hidden_state.cpu()
torch.save(out, sys.argv[1] + "/enabled.pt")
"""

CONTEXTS = """
import torch
import cann.torch
cann.torch.enable("npu-sim")
with torch.device("meta"):
    print(torch.tensor([]).device, torch.empty(2).device, torch.nn.Linear(2, 2).weight.device)
torch.set_default_device("cann")
print(torch.zeros(2).device, torch.arange(3).device)
torch.set_default_device(None)
cann.torch.disable()
with torch.device("meta"):
    print(torch.zeros(2).device)
"""


def run(code: str, *args: str) -> str:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    env = {**os.environ, "PYTHONPATH": path, "CANN_EXPORT_LOAD_PLUGINS": ""}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"subprocess failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def tiny_clip_text():
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    return CLIPTextModel(CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                        num_hidden_layers=1, vocab_size=64, max_position_embeddings=16))


def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                intermediate_size=37, max_position_embeddings=16))


def test_from_pretrained_after_enable_gives_the_buffers_and_outputs_of_a_plain_load(tmp_path):
    from transformers import AutoModel

    makers = {"clip": tiny_clip_text, "bert": tiny_bert}
    for name, make in makers.items():
        make().save_pretrained(tmp_path / name)
    run(LOAD_ENABLED, str(tmp_path), *makers)
    enabled = torch.load(tmp_path / "enabled.pt", weights_only=True)
    for name in makers:
        plain = AutoModel.from_pretrained(tmp_path / name).eval()
        buffers = dict(plain.named_buffers())
        assert any(key.endswith("position_ids") for key in buffers)  # the non-persistent buffer at stake
        for key, want in buffers.items():
            assert torch.equal(enabled[f"{name}/buffer/{key}"], want), f"{name}: buffer {key} differs"
        with torch.no_grad():
            want = plain(input_ids=torch.tensor([[1, 5, 9, 3]])).last_hidden_state
        torch.testing.assert_close(enabled[f"{name}/cpu"], want, rtol=0, atol=0)
        torch.testing.assert_close(enabled[f"{name}/npu"], want, rtol=1e-5, atol=1e-6)


def test_device_contexts_still_place_tensors_under_enable_and_after_disable():
    lines = run(CONTEXTS).split()
    assert lines == ["meta", "meta", "meta", "npu:0", "npu:0", "meta"]
