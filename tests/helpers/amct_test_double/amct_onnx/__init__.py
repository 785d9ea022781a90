"""TEST DOUBLE of AMCT's ``amct_onnx``: this is not AMCT and does no quantization.

``convert_qat_model`` only records its arguments (to the JSON-lines file named by ``AMCT_TEST_DOUBLE_RECORD``)
and copies the model to the deploy and fake-quant paths AMCT would write, so tests can check the order and
paths of the AMCT step of convert.sh, the om format and ``cann-export convert`` without CANN.
``AMCT_TEST_DOUBLE_FAIL=1`` makes it raise, as AMCT does on a graph it refuses. Standard library only.
"""
import json
import os
import shutil

TEST_DOUBLE = True


def convert_qat_model(model_file, save_path, record_file=None):
    record = os.environ.get("AMCT_TEST_DOUBLE_RECORD")
    if record:
        with open(record, "a", encoding="utf-8") as f:
            f.write(json.dumps({"model_file": model_file, "save_path": save_path, "record_file": record_file,
                                "cwd": os.getcwd(), "model_exists": os.path.isfile(model_file)}) + "\n")
    os.makedirs("amct_log", exist_ok=True)  # where AMCT writes its own log: its working directory
    with open(os.path.join("amct_log", "amct_onnx.log"), "a", encoding="utf-8") as f:
        f.write("amct_onnx TEST DOUBLE: convert_qat_model called\n")
    if os.environ.get("AMCT_TEST_DOUBLE_FAIL"):
        raise RuntimeError("amct_onnx TEST DOUBLE: refused the model (AMCT_TEST_DOUBLE_FAIL is set)")
    os.makedirs(os.path.dirname(save_path) or ".", exist_ok=True)
    shutil.copyfile(model_file, f"{save_path}_deploy_model.onnx")
    shutil.copyfile(model_file, f"{save_path}_fake_quant_model.onnx")
    if record_file:
        with open(record_file, "w", encoding="utf-8") as f:
            f.write("# amct_onnx TEST DOUBLE: no quantization factors\n")
    print("amct_onnx TEST DOUBLE: copied", model_file, "to", f"{save_path}_deploy_model.onnx")
