"""What a new user's terminal shows (issue 46): third-party chatter (torchao's "Failed to load ..._C_*.so", torch's
deprecation log lines, onnxruntime's telemetry warning, transformers' progress bars) counted in one line, a traced
graph's specialisation in one short line with no site-packages paths, and no lint warning on the int64 token ids
the tool itself chose. A real CLI export of a Hugging Face BERT directory (tiny config, random weights)."""
import json
import re
import subprocess
import sys

from helpers import hf_dirs
from onnx import TensorProto, helper

from cann_export.atc import lint as atc_lint


def _int_input_graph(name: str):
    x = helper.make_tensor_value_info(name, TensorProto.INT64, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    node = helper.make_node("Cast", [name], ["y"], to=TensorProto.FLOAT, name="c")
    return helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def test_int64_token_inputs_are_no_finding_and_another_int64_input_still_is():
    for name in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "cache_position", "bbox"):
        assert atc_lint.lint_model(_int_input_graph(name), "8.0")["findings"] == [], name
    (finding,) = atc_lint.lint_model(_int_input_graph("scores"), "8.0")["findings"]
    assert (finding["severity"], finding["rule"]) == ("warning", "input-dtype") and "'scores'" in finding["message"]


def _export(model, out, env, *flags):
    run = subprocess.run([sys.executable, "-m", "cann_export", str(model), "-o", str(out), "-q", *flags], env=env,
                         capture_output=True, text=True, timeout=600)
    shown = run.stdout + run.stderr
    assert run.returncode == 0, shown
    assert "Failed to load" not in shown and "_C_" not in shown  # torchao's optional kernels
    assert "site-packages" not in shown and "dist-packages" not in shown
    assert not re.search(r"^[WEI]\d{4} ", shown, re.MULTILINE)  # torch's glog-style log lines
    assert "Warning" not in shown and "deprecated" not in shown.lower()
    assert "[W:onnxruntime" not in shown and "Loading weights" not in shown
    return run, json.loads((out / "manifest.json").read_text())


COUNTED = r"^(\d+) warning\(s\) from ([a-z_, ]+) hidden; --verbose shows them$"


def test_a_cli_export_of_a_bert_directory_keeps_third_party_chatter_to_one_line(tmp_path, cli_env):
    model = hf_dirs.save("bert", tmp_path / "tiny-bert")
    out = tmp_path / "bundle"
    run, manifest = _export(model, out, cli_env)
    counted = re.search(COUNTED, run.stderr, re.MULTILINE)
    third_party = manifest.get("warnings", {}).get("third_party")  # kept, for --verbose and inspect
    assert bool(counted) == bool(third_party)
    assert not [w for w in third_party or [] if "torchao" in json.dumps(w)]  # hidden: the directory cannot use it
    trace = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("traced graph")]
    assert all(len(line) < 400 for line in trace)
    assert not [f for f in manifest["lint"]["atc-lint"]["findings"] if f["rule"] == "input-dtype"]
    check = subprocess.run([sys.executable, "-m", "cann_export", "inspect", str(out)], env=cli_env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr  # validate's re-run of the lint agrees

    # --trust-remote-code leaves torchao importable (the model's own code may use it): its chatter is counted
    run, manifest = _export(model, tmp_path / "trusted", cli_env, "--trust-remote-code", "--no-validate")
    counted = re.search(COUNTED, run.stderr, re.MULTILINE)
    assert counted and "torchao" in counted.group(2) and manifest["warnings"]["third_party"], run.stderr
