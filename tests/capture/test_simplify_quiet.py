"""onnxsim's native warnings (a CLIP's causal mask: "failed to run Where op ... skip") go to the process's own
stderr, past Python; the optimize stage keeps an in-process export's output to what the tool prints."""
import json
import os
import sys


def test_what_onnxsim_writes_natively_is_dropped_and_the_streams_come_back(capfd):
    from cann_export.passes.stage import _native_output_dropped

    print("before", flush=True)
    with _native_output_dropped():
        os.write(2, b"WARNING: failed to run \"Where\" op\n")
        os.write(1, b"native stdout\n")
    print("after", file=sys.stderr, flush=True)
    out, err = capfd.readouterr()
    assert out == "before\n" and err == "after\n"


def test_a_pipelines_clip_text_encoder_exports_in_process_without_onnxsim_chatter(tmp_path, capfd):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    import cann_export
    from cann_export.diffusion.graphs import TextEncoder

    config = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                            vocab_size=64, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = TextEncoder(CLIPTextModel(config).eval(), hidden_states=False)  # traced first, as in a pipeline
    ids = torch.randint(3, 64, (2, 77))  # its causal mask is what onnxsim cannot fold, and says so natively
    result = cann_export.export(model, tmp_path / "clip.onnx", example_inputs={"input_ids": ids}, export_format="onnx")
    assert result.ok, json.dumps(result.to_dict().get("parity"))[:2000]
    _, err = capfd.readouterr()
    assert "failed to run" not in err
