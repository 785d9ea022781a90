"""Every task the task table advertises for an architecture exports (issue 46: CLIPModel's feature-extraction was
listed and failed at prepare). Cheap per task: the load and the prepare stage's forward on the task's dummies (one
graph), or the multi-graph plan with each component run on its example inputs; CLIP's feature-extraction end to end
(Optimum's four outputs, onnxruntime against transformers)."""
import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers import hf_dirs

from cann_export.cli.main import cli

ARCHITECTURES = ["bert", "gpt2", "t5", "vit", "clip", "whisper", "wav2vec2"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("advertised")
    return {name: hf_dirs.save(name, root / name) for name in ARCHITECTURES}


def _single_graph_runs(directory, task):
    """The load stage's module called on the task's dummy inputs returns the task's outputs."""
    from cann_export.hf.dummy_inputs import tensors
    from cann_export.hf.loader import HfDirectoryLoader
    from cann_export.options import ExportOptions

    loaded = HfDirectoryLoader().load(directory, ExportOptions(task=task))
    hf = loaded.extras["hf"]
    with torch.no_grad():
        out = loaded.model(**tensors(hf["dummy_inputs"], 0))
    assert list(out) == hf["outputs"] and hf["task"] == task


def _several_graphs_run(directory, task):
    """The multi-graph plan of the task builds, and each of its graphs runs on its example inputs."""
    from cann_export.hf.graph_plans import plan_for
    from cann_export.hf.directory_source import load_directory

    model, name, _ = load_directory(directory, task, {})
    plan = plan_for(model, name)
    assert plan.components
    with torch.no_grad():
        for component in plan.components:
            component.module(**component.example_inputs)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_advertised_task_of_an_architecture_exports(name, saved):
    from cann_export.hf.tasks import tasks_of

    advertised = tasks_of(hf_dirs.CASES[name].cls)
    assert any(t.name == "feature-extraction" for t in advertised)
    for task in advertised:
        check = _single_graph_runs if task.graphs == 1 else _several_graphs_run
        check(saved[name], task.name)


def test_clip_feature_extraction_exports_optimums_four_outputs(saved, tmp_path, run_ort):
    import transformers

    out = tmp_path / "clip.onnx"
    result = CliRunner().invoke(cli, [str(saved["clip"]), "--task", "feature-extraction", "--format", "onnx",
                                      "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    outputs = ["logits_per_image", "logits_per_text", "text_embeds", "image_embeds"]
    assert [o.name for o in onnx.load(str(out)).graph.output] == outputs
    g = torch.Generator().manual_seed(5)
    feeds = {"input_ids": torch.randint(0, 100, (3, 10), generator=g), "pixel_values": torch.randn(3, 3, 32, 32),
             "attention_mask": torch.ones(3, 10, dtype=torch.int64)}
    names, got = run_ort(out, feeds)
    model = transformers.CLIPModel.from_pretrained(str(saved["clip"])).eval()
    with torch.no_grad():
        want = model(**feeds)
    for n, value in zip(names, got, strict=True):
        np.testing.assert_allclose(value, want[n].numpy(), atol=2e-4, rtol=1e-3, err_msg=n)
