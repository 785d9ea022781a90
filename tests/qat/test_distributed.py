"""QAT under torchrun with 2 CPU processes (gloo DDP): same scales as one process, only rank 0 writes."""
import json
import subprocess
import sys

from helpers import digits
from safetensors.torch import save_file, save_model


def run(args, env, tmp_path):
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_ddp_scales_equal_single_process(tmp_path, cli_env):
    save_model(digits.trained(), str(tmp_path / "digits.safetensors"))
    save_file({"x": digits.split()[0][:256].contiguous()}, str(tmp_path / "calib.safetensors"))
    common = ["export", str(tmp_path / "digits.safetensors"), "--model-class", "helpers.digits:DigitsCNN", "--qat",
              "--calibration-data", str(tmp_path / "calib.safetensors"), "--qat-steps", "12", "--qat-lr", "1e-4",
              "--exporter", "torchscript", "--format", "onnx", "--lint", "off"]
    env = dict(cli_env, OMP_NUM_THREADS="1")
    run([sys.executable, "-m", "cann_export", *common, "-o", str(tmp_path / "single.onnx"), "--json"], env, tmp_path)
    # --standalone: a local rendezvous on a free port torchrun picks (a fixed port collides with a parallel run)
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "cann_export", *common, "-o", str(tmp_path / "ddp.onnx")], env, tmp_path)
    outputs = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".onnx")
    assert outputs == ["ddp.onnx", "single.onnx"]  # rank 1 wrote nothing

    def layers(name):
        import onnx

        props = {p.key: p.value for p in onnx.load(str(tmp_path / name)).metadata_props}
        return json.loads(props["cann_export.quantization"])["layers"]

    single, ddp = layers("single.onnx"), layers("ddp.onnx")
    assert single.keys() == ddp.keys()
    for path in single:
        assert single[path]["act_scale"] == ddp[path]["act_scale"]  # calibration ranges reduced across ranks
        assert single[path]["act_zero_point"] == ddp[path]["act_zero_point"]
        for key in ("weight_scale_min", "weight_scale_max"):
            assert abs(single[path][key] - ddp[path][key]) <= 1e-4 * abs(single[path][key]), (path, key)
