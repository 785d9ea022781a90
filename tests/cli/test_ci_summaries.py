"""Issue 21 item 4: CI summaries of real exports through the CLI: --summary (and $GITHUB_STEP_SUMMARY, appended),
--junit (one test case per output x gear x component, in the testsuites/testsuite/testcase/failure shape CI
reporters read) and GitHub ::error annotations at the model's source line; a refused export still leaves a
JUnit file with one failing test case naming the error."""
from __future__ import annotations

import inspect
import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import calibration_models as cm

from cann_export.cli.main import cli

REPO = Path(__file__).resolve().parents[2]


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(12, 16)
        self.a, self.b = torch.nn.Linear(16, 4), torch.nn.Linear(16, 2)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.a(h), self.b(h)


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


def _pt2(model, args, path, dynamic_shapes=None):
    torch.export.save(torch.export.export(model.eval(), args, dynamic_shapes=dynamic_shapes), str(path))
    return path


def invoke(args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env or {}, catch_exceptions=False)


def junit_cases(path):
    """The test cases of a JUnit file, after checking the shape Jenkins / GitLab / GitHub reporters read."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("name")
    cases = suites[0].findall("testcase")
    for element in (root, suites[0]):
        assert int(element.get("tests")) == len(cases)
        assert int(element.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(element.get("errors")) == 0 and float(element.get("time")) >= 0
    for c in cases:
        assert c.get("classname") and c.get("name") and set(c.attrib) <= {"classname", "name", "time", "file", "line"}
        failure = c.find("failure")
        assert failure is None or (failure.get("message") and failure.get("type") and failure.text)
    return cases


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("ci")


@pytest.fixture(scope="module")
def two_heads(work):
    """A passing export of a two-output model, with --summary, --junit and a job summary to append to."""
    model = _pt2(TwoHeads(), (torch.randn(2, 12),), work / "heads.pt2")
    step = work / "step_summary.md"
    step.write_text("## an earlier step\n")
    out = work / "heads_bundle"
    result = invoke([model, "-o", out, "--summary", work / "reports" / "summary.md", "--junit", work / "junit.xml"],
                    env={"GITHUB_STEP_SUMMARY": str(step), "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(REPO)})
    assert result.exit_code == 0, result.output
    return out, result, json.loads((out / "manifest.json").read_text())


def test_a_passing_export_writes_the_summary_junit_and_appends_the_job_summary(two_heads, work):
    out, result, manifest = two_heads
    outputs = [o["name"] for o in manifest["model"]["outputs"]]
    assert len(outputs) == 2
    cases = junit_cases(work / "junit.xml")
    assert sorted(c.get("name") for c in cases) == sorted(outputs)
    assert all(c.find("failure") is None for c in cases)
    command = " ".join(shlex.quote(a) for a in manifest["atc"]["command"])
    summary = (work / "reports" / "summary.md").read_text()
    assert "passed" in summary.splitlines()[0] and f"`{out}`" in summary.splitlines()[0]
    assert command in summary and "--soc_version=Ascend310P3" in command
    rows = [line for line in summary.splitlines() if line.startswith("| `")]
    assert len(rows) == 2
    for o, d in zip(manifest["parity"]["fp32"]["outputs"], manifest["parity"]["device"]["outputs"], strict=True):
        row = next(r for r in rows if r.startswith(f"| `{o['name']}`"))
        assert f"{o['cosine']:.6f} / {d['cosine']:.6f}" in row and f"{o['max_abs']:.3g} / {d['max_abs']:.3g}" in row
    step = (work / "step_summary.md").read_text()
    assert step.startswith("## an earlier step\n") and summary in step  # appended, as GitHub does
    assert "::error" not in result.stdout  # nothing failed: no annotation


def test_validate_writes_one_case_per_output_and_per_soc(two_heads, work):
    out, _, manifest = two_heads
    result = invoke(["validate", out, "--soc-version", "Ascend910B1", "--junit", work / "validate.xml", "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # --json stays one object
    cases = junit_cases(work / "validate.xml")
    assert [c.get("name") for c in cases] == [o["name"] for o in manifest["model"]["outputs"]] + [
        "device precision on Ascend910B1"]


def test_gears_give_one_case_per_output_and_gear(work):
    batch = torch.export.Dim("batch", min=1, max=16)
    model = _pt2(Conv(), (torch.randn(2, 3, 8, 8),), work / "conv.pt2", {"x": {0: batch}})
    result = invoke([model, "-o", work / "gears", "--dynamic", "x:0=batch:1,2,4,8", "--junit", work / "gears.xml",
                     "--summary", work / "gears.md"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((work / "gears" / "manifest.json").read_text())
    shapes = manifest["parity"]["shapes"]
    outputs = manifest["model"]["outputs"]
    assert len(shapes) == 4
    cases = junit_cases(work / "gears.xml")
    assert len(cases) == len(outputs) * len(shapes)
    assert {c.get("name") for c in cases} == {f"{o['name']} [batch={s['shape']['batch']}]" for o in outputs
                                              for s in shapes}
    table = [line for line in (work / "gears.md").read_text().splitlines() if line.startswith("| `")]
    assert len(table) == 4 and all("batch=" in row for row in table)


def test_a_device_precision_failure_is_a_failing_case_and_an_annotation_at_the_source_line(work):
    model, inputs, module = cm.reduction_overflow()
    path = _pt2(model, (inputs["x"],), work / "overflow.pt2")
    result = invoke([path, "-o", work / "overflow", "--junit", work / "overflow.xml", "--summary",
                     work / "overflow.md"], env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(REPO)})
    assert result.exit_code == 1, result.output
    manifest = json.loads((work / "overflow" / "manifest.json").read_text())
    assert manifest["parity"]["device"]["passed"] is False
    cases = junit_cases(work / "overflow.xml")
    failures = [c.find("failure") for c in cases if c.find("failure") is not None]
    assert len(cases) == 1 and len(failures) == 1 and failures[0].get("type") == "device_precision"
    assert manifest["parity"]["first_divergence"]["message"] in failures[0].text
    # the annotation points at Energy.forward's sum of squares, found here from the source, not the manifest
    lines, start = inspect.getsourcelines(cm.Energy.forward)
    sum_line = start + next(i for i, text in enumerate(lines) if ".sum(" in text)
    expected = f"::error file=tests/helpers/calibration_models.py,line={sum_line},title=cann-export export%3A output::"
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1 and errors[0].startswith(expected), errors
    assert "device precision (force_fp16 on Ascend310P3) failed" in errors[0]
    assert (cases[0].get("file"), cases[0].get("line")) == ("tests/helpers/calibration_models.py", str(sum_line))
    summary = (work / "overflow.md").read_text()
    assert "FAILED" in summary.splitlines()[0] and "first divergence: energy" in summary and module == "energy"


def test_a_refused_export_writes_one_failing_case_naming_the_error(work):
    bad = work / "broken.pt2"
    bad.write_bytes(b"not an archive")
    result = invoke([bad, "-o", work / "refused", "--junit", work / "refused.xml", "--summary", work / "refused.md"],
                    env={"GITHUB_ACTIONS": "true"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert not (work / "refused").exists()
    message = result.stderr.strip().splitlines()[-1].removeprefix("error: ")
    cases = junit_cases(work / "refused.xml")
    assert len(cases) == 1 and cases[0].get("name") == "export"
    failure = cases[0].find("failure")
    assert failure.get("type") == "refused:load"
    assert failure.text.startswith("[load] ") and failure.text.split("] ", 1)[1] in message
    assert "refused" in (work / "refused.md").read_text().splitlines()[0]
    annotation = "::error title=cann-export export refused (load)::"
    assert any(line.startswith(annotation) for line in result.stdout.splitlines())


def test_a_hostile_name_stays_data_in_the_summary_junit_and_annotation(work):
    """Issue 41: a model path holding a newline + workflow command, ESC and 0x01 and U+202E. The summary's
    heading keeps it in one code span, the JUnit file is well-formed XML (expat), the one annotation is one
    line, and no other output line starts with ``::``."""
    import xml.parsers.expat

    bad = work / "x\n::error::pwned\x1b[2J\x01\u202e`.pt2"
    bad.write_bytes(b"not an archive")
    result = invoke([bad, "--junit", work / "hostile.xml", "--summary", work / "hostile.md"],
                    env={"GITHUB_ACTIONS": "true"})
    assert result.exit_code == 2
    xml.parsers.expat.ParserCreate().Parse((work / "hostile.xml").read_bytes(), True)
    assert "pwned" in ET.parse(work / "hostile.xml").getroot().find("testsuite").get("name")
    heading = (work / "hostile.md").read_text(encoding="utf-8").splitlines()[0]
    assert heading.startswith("### cann-export export: ❌ refused — ``") and "\\n::error::pwned" in heading
    commands = [line for line in (result.stdout + result.stderr).splitlines() if line.lstrip().startswith("::")]
    assert len(commands) == 1 and commands[0].startswith("::error title=")
    assert not any(c in result.stdout + result.stderr for c in "\x1b\x01\u202e")



def test_a_multi_graph_bundle_gives_one_case_per_component_output(work):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=96, n_positions=64, bos_token_id=0,
                                  eos_token_id=None, pad_token_id=0)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(work / "gpt2-dir")
    out = work / "gpt2_kv"
    result = invoke([work / "gpt2-dir", "-o", out, "--kv-cache", "static:16", "--junit", work / "multi.xml",
                     "--summary", work / "multi.md"])
    assert result.exit_code == 0, result.output
    top = json.loads((out / "manifest.json").read_text())
    expected = {(c["name"], o) for c in top["components"] for o in c["outputs"]}
    assert {c["name"] for c in top["components"]} == {"prefill", "decode"}
    cases = junit_cases(work / "multi.xml")
    assert len(cases) == len(expected)
    assert {(c.get("classname").rsplit(".", 1)[1], c.get("name")) for c in cases} == expected
    again = invoke(["validate", out, "--junit", work / "multi_validate.xml"])  # the re-derived verdicts, alike
    assert again.exit_code == 0, again.output
    cases = junit_cases(work / "multi_validate.xml")
    assert {(c.get("classname").rsplit(".", 1)[1], c.get("name")) for c in cases} == expected
    summary = (work / "multi.md").read_text()
    for c in top["components"]:  # each graph's own ATC command
        own = json.loads((out / c["path"] / "manifest.json").read_text())
        assert " ".join(shlex.quote(a) for a in own["atc"]["command"]) in summary
    text = invoke(["inspect", out]).stdout  # the readable view, per component
    assert "[prefill] role prefill" in text and "[decode] role decode" in text
    assert f"{len(top['files'])} files" in text.splitlines()[0] and "ATC: atc/convert.sh runs each graph's" in text
    assert text.count("parity recorded at export: passed") == 2 and "connections: prefill -> decode" in text


def test_a_device_failure_at_every_gear_fails_each_gears_case(work):
    """An RMSNorm that overflows fp16 (Inf/NaN on 910B) in a graph with a dynamic batch: one failing case per
    output and gear, each with the gear's shape in its name and message."""
    from helpers import origin_models

    model, inputs, _ = origin_models.rms_decoder()
    batch = torch.export.Dim("batch", min=1, max=4)
    path = _pt2(model, (inputs["input_ids"],), work / "rms.pt2", {"input_ids": {0: batch}})
    result = invoke([path, "-o", work / "rms", "--soc-version", "Ascend910B1", "--junit", work / "rms.xml"],
                    env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(REPO)})
    assert result.exit_code == 1, result.output
    manifest = json.loads((work / "rms" / "manifest.json").read_text())
    shapes, outputs = manifest["parity"]["shapes"], manifest["model"]["outputs"]
    assert len(shapes) > 1 and not any(s["device"] for s in shapes)
    cases = junit_cases(work / "rms.xml")
    assert len(cases) == len(shapes) * len(outputs)
    for case in cases:
        failure = case.find("failure")
        assert failure is not None and failure.get("type") == "device_precision"
        shape = case.get("name").split(" [", 1)[1].rstrip("]")
        assert f"at {shape}" in failure.get("message") and "Ascend910B1" in failure.get("message")
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == len(cases)
