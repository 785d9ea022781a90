"""A pipeline export's memory (issue 43, Numbers): the end-to-end check holds one component's graph at a time (its
onnxruntime session, and under the device emulation its emulator's weights), not every component's at once for
each of its loops, and gives the numbers the export recorded. A real export (the shared UNet bundle): slow."""
from __future__ import annotations

import gc
import json
import weakref

import onnxruntime as ort
import pytest

pytestmark = pytest.mark.slow


def test_the_end_to_end_check_holds_one_graph_session_at_a_time(sd, monkeypatch):
    from cann_export.diffusion.end_to_end import check

    pipe, root = sd
    bundle = root / "sd_bundle"
    live: list[weakref.ref] = []
    most = [0]
    opened = ort.InferenceSession.__init__

    def counted(self, *args, **kwargs):  # the real session, each one watched while it lives
        opened(self, *args, **kwargs)
        live.append(weakref.ref(self))
        gc.collect()
        most[0] = max(most[0], sum(r() is not None for r in live))

    monkeypatch.setattr(ort.InferenceSession, "__init__", counted)
    result = check(pipe, bundle)
    monkeypatch.undo()
    # each loop (fp32, emulated; each run once: its latents come from the last step's callback) opened the graphs of
    # the loop's three components (text_encoder, unet, vae_decoder)
    assert len(live) >= 2 * 3
    assert most[0] == 1, f"{most[0]} graph sessions were alive at once"
    recorded = json.loads((bundle / "manifest.json").read_text())["pipeline"]["end_to_end"]
    assert result["passed"] is recorded["passed"] is True and result["image_shape"] == recorded["image_shape"]
    for loop in ("fp32", "device"):  # the same check: the export's own verdicts and numbers (threads' sum order aside)
        assert result[loop]["passed"] is recorded[loop]["passed"] and result[loop]["nonfinite"] == \
            recorded[loop]["nonfinite"]
        numbers = {k: v for k, v in recorded[loop].items() if isinstance(v, float)}
        assert {k: result[loop][k] for k in numbers} == pytest.approx(numbers, rel=1e-6, abs=1e-9), loop


def test_large_components_run_on_the_pipelines_own_weights_in_the_end_to_end_check(tmp_path, monkeypatch):
    """Components past external_data_threshold (lowered so the tiny pipeline's take the large-graph path) skip their
    own device emulation (it would hold the weights twice). The end-to-end check's loops run each such graph fed
    the pipeline's own tensors, not a second copy read from its data file; the device loop runs it in fp32 and
    says so; and the bundle holds only its files (a component's spilled reference outputs were left inside the
    bundle's staging, and moved into place with it)."""
    import click
    from click.testing import CliRunner
    from helpers.tiny_diffusion import sd_pipeline

    import cann_export
    from cann_export.capture import large_graph
    from cann_export.cli.main import _print_multi_export
    from cann_export.errors import ExportError

    fed: list[tuple[str, dict[str, int]]] = []
    real = large_graph.fed_session

    def watched(path, module):
        session = real(path, module)
        fed.append((path.parent.name, {n: a.ctypes.data for n, a in getattr(session, "weights", {}).items()}))
        return session

    monkeypatch.setattr(large_graph, "fed_session", watched)
    pipe = sd_pipeline()
    out = tmp_path / "large"
    result = cann_export.export(pipe, out, external_data_threshold=10_000)
    monkeypatch.undo()
    assert result.ok, result.to_dict()
    e2e = result.manifest["pipeline"]["end_to_end"]
    assert e2e["passed"] and e2e["fp32"]["passed"] and e2e["device"]["passed"]
    skipped = e2e["device"]["not_emulated"]
    assert sorted(skipped) == sorted(result.components)
    assert all("external_data_threshold" in reason for reason in skipped.values())
    for name, module in (("unet", pipe.unet), ("vae_decoder", pipe.vae)):  # the fp32 loop, then the device loop
        runs = [weights for component, weights in fed if component == name]
        own = {k: t.data_ptr() for k, t in module.state_dict().items()}
        assert len(runs) == 2 and all(runs), fed
        assert all(own[n.removeprefix("model.")] == address for weights in runs for n, address in weights.items())
    assert not [p for p in out.rglob("*") if ".cann-tmp-" in p.name]
    shown = CliRunner().invoke(click.command()(lambda: _print_multi_export(result, False)), [])
    assert "unet: parity passed" in shown.output and "(fp32 ok, device not emulated)" in shown.output, shown.output
    assert cann_export.validate(out)["passed"]
    manifest = json.loads((out / "manifest.json").read_text())  # a component claimed emulated that was not
    del manifest["pipeline"]["end_to_end"]["device"]["not_emulated"]["unet"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="device.not_emulated: not the components"):
        cann_export.validate(out)
