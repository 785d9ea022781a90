"""Running a multi-graph bundle's components in onnxruntime, wired only by the bundle's own connections."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort


def component_session(bundle, component):
    return ort.InferenceSession(str(bundle / "components" / component / "model.onnx"),
                                providers=["CPUExecutionProvider"])


def run_named(session, feed):
    """The session's outputs by name for ``feed`` (tensors or arrays)."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: np.asarray(v) for k, v in feed.items()}), strict=True))


def feeds_from(manifest, source, target, outputs):
    """What the bundle's connections say ``source``'s outputs give ``target``'s inputs."""
    return {c["to"]["input"]: outputs[c["from"]["output"]] for c in manifest["connections"]
            if c["from"]["component"] == source and c["to"]["component"] == target}
