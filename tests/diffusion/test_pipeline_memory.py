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
