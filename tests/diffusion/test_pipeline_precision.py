"""--fix-precision on a diffusers pipeline (issue 43 item 3): a tiny SD3 pipeline whose T5 (text_encoder_3) feed-forward
overflows fp16 (wi scaled up, wo down: the same model in fp32) is exported for an Atlas A2 SoC (Ascend910B4, IEEE
inf/NaN overflow, as MindIE's SD3 runs). Without the flag the export fails naming text_encoder_3 (its device verdict
and the end-to-end loop's NaN); with it, the keep set is text_encoder_3's feed-forward only, written as keep_dtype.cfg
and as customize_dtypes entries, and the end-to-end check, rerun with the fix, passes. The oracle is torch itself in
fp16. Two real exports of six graphs each: minutes on 2 shared cores, so marked slow."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from cann_export.cli.main import cli

pytestmark = pytest.mark.slow

SOC = "Ascend910B4"
FEED_FORWARD = re.compile(r"text_encoder_3\.encoder\.block\.[0-9]+\.layer\.1\.DenseReluDense")
OTHERS = ["text_encoder", "text_encoder_2", "transformer", "vae_encoder", "vae_decoder"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from helpers.tiny_diffusion import overflow_t5, save, sd3_pipeline

    root = tmp_path_factory.mktemp("hot_t5")
    save(overflow_t5(sd3_pipeline()), root / "sd3-dir")
    runs = {}
    for name, flags in (("plain", []), ("fixed", ["--fix-precision"])):
        runs[name] = CliRunner().invoke(cli, [str(root / "sd3-dir"), "-o", str(root / name), "--soc-version", SOC,
                                              *flags], catch_exceptions=False)
    return root, runs


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _module_paths(graph):
    """``{node: the PyTorch module that produced it}``, from the stamps the export leaves on the graph's nodes."""
    import onnx

    from cann_export.graph.module_paths import collect

    return collect(onnx.load(str(graph)))


def test_without_the_flag_the_export_fails_naming_text_encoder_3(exported):
    root, runs = exported
    assert runs["plain"].exit_code == 1, runs["plain"].output
    assert re.search(r"text_encoder_3: parity FAILED[^\n]*\(fp32 ok, device FAIL\)", runs["plain"].output)
    manifest = _manifest(root / "plain")
    assert manifest["parity"]["components"] == {**{n: True for n in OTHERS}, "text_encoder_3": False}
    assert "precision_fix" not in manifest
    device = manifest["pipeline"]["end_to_end"]["device"]
    assert device["passed"] is False and device["nonfinite"]["text_encoder_3"] > 0  # then the denoiser's, the VAE's
    assert device["nonfinite"]["text_encoder"] == device["nonfinite"]["text_encoder_2"] == 0
    first = _manifest(root / "plain" / "components" / "text_encoder_3")["parity"]["first_divergence"]
    assert first["module"] == "model.encoder.block.0.layer.1.DenseReluDense.wi" and first["overflow"] is True


def test_fix_precision_keeps_only_the_t5_feed_forward_and_the_end_to_end_check_passes(exported):
    root, runs = exported
    assert runs["fixed"].exit_code == 0, runs["fixed"].output
    manifest = _manifest(root / "fixed")
    assert manifest["parity"]["passed"] is True and manifest["pipeline"]["end_to_end"]["passed"] is True
    fix = manifest["precision_fix"]
    assert list(fix) == ["text_encoder_3"]  # the other components have no keep set
    t5 = fix["text_encoder_3"]
    assert t5["fixed"] is True and t5["modules"] and all(FEED_FORWARD.fullmatch(m) for m in t5["modules"]), t5
    assert 0 < t5["kept_ops"] < t5["graph_ops"] and 0 < t5["kept_flops_share"] < 0.5
    assert t5["keep_dtype"] == "components/text_encoder_3/atc/keep_dtype.cfg"
    assert t5["customize_dtypes"] == "components/text_encoder_3/atc/customize_dtypes.fix.cfg"
    own = _manifest(root / "fixed" / "components" / "text_encoder_3")
    kept = own["parity"]["fixed_by_keep_dtype"]
    assert kept and "--keep_dtype=atc/keep_dtype.cfg" in own["atc"]["command"]
    paths = _module_paths(root / "fixed" / "components" / "text_encoder_3" / "model.onnx")
    assert all(FEED_FORWARD.match("text_encoder_3" + paths[n][len("model"):]) for n in kept), kept
    for name in OTHERS:
        other = root / "fixed" / "components" / name
        assert not (other / "atc" / "keep_dtype.cfg").exists(), name
        assert not _manifest(other)["parity"].get("fixed_by_keep_dtype"), name
    device = manifest["pipeline"]["end_to_end"]["device"]
    assert device["passed"] is True and not any(device["nonfinite"].values())
    before = device["before_fix"]  # the same loop without the fix's keep sets: the NaN the fix removes
    assert before["passed"] is False and before["nonfinite"]["text_encoder_3"] > 0
    assert before["fixed_components"] == ["text_encoder_3"]
    out = runs["fixed"].output
    said = re.search(r"text_encoder_3: parity passed[^\n]*\n(\s+checks:[^\n]*\n)?\s+--fix-precision kept \d+ of \d+ "
                     r"ops in fp32 \(\d+\.\d% of its FLOPs\): ([^\n]*)", out)
    assert said and said.group(2).startswith("text_encoder_3.encoder.block.0.layer.1.DenseReluDense"), out
    assert "without its keep sets (text_encoder_3) FAILED" in out


def test_the_customize_dtypes_form_names_the_same_nodes_and_mends_the_graph(exported):
    import onnx

    from cann_export.atc.customize import parse
    from cann_export.atc.mixlists import lists_for
    from cann_export.validators.precision import Emulator

    root, _ = exported
    where = root / "fixed" / "components" / "text_encoder_3"
    text = (where / "atc" / "customize_dtypes.fix.cfg").read_text()
    entries = parse(text)
    keep = (where / "atc" / "keep_dtype.cfg").read_text().split()
    assert [e.target for e in entries] == keep
    assert all(set(e.inputs) | set(e.outputs) == {"float"} for e in entries), entries
    model = onnx.load(str(where / "model.onnx"))
    ids = np.random.default_rng(0).integers(2, 40, (1, 256)).astype(np.int64)
    plain = Emulator(model, "force_fp16", "inf_nan").session(set()).run({"input_ids": ids}, ["last_hidden_state"])[0]
    custom = Emulator(model, "force_fp16", "inf_nan", lists=lists_for(SOC, None, text))
    mended = custom.session(set()).run({"input_ids": ids}, ["last_hidden_state"])[0]
    assert not np.isfinite(plain).all()  # the emulated device without the entries: the overflow's NaN
    assert np.isfinite(mended).all()


def test_torch_fp16_overflows_where_the_device_verdict_says_and_not_with_the_feed_forward_in_fp32(exported):
    """The oracle: torch's own fp16 on the CPU. The whole T5 in fp16 gives inf/NaN, first at block 0's wi (where the
    device verdict localised it); the same T5 with only the modules the fix kept in fp32 is finite and matches fp32."""
    import torch
    from transformers import T5EncoderModel

    root, _ = exported
    t5 = T5EncoderModel.from_pretrained(root / "sd3-dir" / "text_encoder_3", torch_dtype=torch.float32).eval()
    ids = torch.randint(2, 40, (2, 256), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = t5(ids)[0]
    assert torch.isfinite(want).all()
    half = T5EncoderModel.from_pretrained(root / "sd3-dir" / "text_encoder_3", torch_dtype=torch.float32).eval().half()
    seen = {}
    half.encoder.block[0].layer[1].DenseReluDense.wi.register_forward_hook(
        lambda m, a, out: seen.update(wi=bool(torch.isinf(out).any())))
    with torch.no_grad():
        got = half(ids)[0]
    assert seen["wi"] and not torch.isfinite(got).all()
    fixed = _manifest(root / "fixed")["precision_fix"]["text_encoder_3"]["modules"]
    for path in fixed:  # the fix's modules back in fp32, fed and read in fp32
        module = half.get_submodule(path[len("text_encoder_3."):]).float()
        module.register_forward_pre_hook(lambda m, args: tuple(a.float() for a in args))
        module.register_forward_hook(lambda m, args, out: out.half())
    with torch.no_grad():
        mended = half(ids)[0].float()
    assert torch.isfinite(mended).all()
    cosine = torch.nn.functional.cosine_similarity(mended.flatten(), want.flatten(), dim=0)
    assert cosine > 0.99, cosine


def test_validate_rederives_the_precision_summary_and_refuses_a_doctored_one(exported, tmp_path):
    import shutil

    import cann_export

    root, _ = exported
    assert cann_export.validate(root / "fixed")["passed"] is True
    bundle = tmp_path / "doctored"
    shutil.copytree(root / "fixed", bundle)
    manifest = _manifest(bundle)
    manifest["precision_fix"]["text_encoder_3"]["kept_flops_share"] = 0.0
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    res = CliRunner().invoke(cli, ["validate", str(bundle)])
    assert res.exit_code == 2 and "precision_fix" in res.output, res.output
