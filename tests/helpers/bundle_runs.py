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


def greedy_seq2seq(bundle, manifest, encoder_feed, start, steps, extra=None):
    """Greedy tokens through an encoder-decoder bundle: encoder, then decoder on ``start``, then decoder_with_past
    one token at a time, the caches wired by the bundle's connections (``extra``: inputs every decoder step takes,
    such as T5's ``encoder_attention_mask``). Returns (tokens, the last step's outputs)."""
    extra = extra or {}
    enc = run_named(component_session(bundle, "encoder"), encoder_feed)
    out = run_named(component_session(bundle, "decoder"), {"input_ids": np.array([[start]], np.int64), **extra,
                                                           **feeds_from(manifest, "encoder", "decoder", enc)})
    with_past = component_session(bundle, "decoder_with_past")
    first, tokens, source = out, [], "decoder"
    for step in range(steps):
        tokens.append(int(out["logits"][0, -1].argmax()))
        if step == steps - 1:
            break
        past = {**feeds_from(manifest, "decoder", "decoder_with_past", first),
                **feeds_from(manifest, source, "decoder_with_past", out)}
        out = run_named(with_past, {"input_ids": np.array([[tokens[-1]]], np.int64), **extra, **past})
        source = "decoder_with_past"
    return tokens, out


def cli_export(directory, output, *flags):
    """``cann-export DIRECTORY -o OUTPUT --json FLAGS`` through the CLI: its JSON result (the exit must be 0)."""
    import json

    from click.testing import CliRunner

    from cann_export.cli.main import cli

    res = CliRunner().invoke(cli, [str(directory), "-o", str(output), "--json", *flags], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)
