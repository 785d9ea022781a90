"""Issue 41 finding 3: names from files, paths and users reach terminals, CI logs, step summaries and JUnit
XML only through cann_export.safe_text. Real exports through the CLI in a subprocess with a model path and an
output directory whose names hold a newline followed by GitHub workflow commands, ESC/OSC sequences and bidi
overrides: no output line starts with ``::`` from data, no raw control or bidi character reaches stdout or
stderr, the step summary's heading keeps the name inside one code span, the JUnit file parses with expat."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
import xml.parsers.expat
from pathlib import Path

import pytest
import torch
from helpers import calibration_models as cm
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from cann_export import safe_text
from cann_export.bundle import summaries
from cann_export.sandbox import confine

REPO = Path(__file__).resolve().parents[2]
# a newline then workflow commands; OSC 0 (terminal title), a screen clear, an OSC 8 link, RTL override, SOH
HOSTILE = ("m\n::error::pwned\n  ::add-mask::x\r::stop-commands::tok ##[error]v1\x1b]0;owned\x07\x1b[2J"
           "\x1b]8;;https:evil.example\x1b\\link\x1b]8;;\x1b\\\u202eexe.\x01`|*")
RAW = ["\x1b", "\x07", "\x01", "\u202e", "\r"]


def _lines_are_safe(text: str, own_annotations: int = 0) -> None:
    """No line of ``text`` is a workflow command, except the tool's own ``::error `` annotations (counted), and
    no raw control or bidi character is in it."""
    commands = [line for line in text.split("\n") if line.lstrip().startswith("::")]
    assert len(commands) == own_annotations, commands
    assert all(line.startswith("::error ") for line in commands)
    assert "##[" not in text
    assert [c for c in RAW if c in text] == []


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    full.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run([sys.executable, "-m", "cann_export", *args], env=full, capture_output=True, text=True,
                          timeout=600)


def _markdown() -> MarkdownIt:
    """GitHub-flavoured Markdown (tables, strikethrough); plain-text links need the optional linkify-it."""
    return MarkdownIt("gfm-like", {"linkify": False})


def _heading_code(markdown: str) -> str:
    """The text of the one code span in the Markdown's first heading (the heading must be whole)."""
    tokens = _markdown().parse(markdown)
    assert tokens[0].type == "heading_open" and tokens[0].tag == "h3"
    spans = [t.content for t in tokens[1].children if t.type == "code_inline"]
    assert len(spans) == 1
    return spans[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One tiny model exported through the CLI from and to hostile names, with --summary, --junit and a job
    summary to append to."""
    work = tmp_path_factory.mktemp("hostile-output")
    model_dir = work / HOSTILE
    model_dir.mkdir()
    model = model_dir / (HOSTILE + ".pt2")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    torch.export.save(torch.export.export(net, (torch.randn(2, 4),)), str(model))
    out = work / ("out" + HOSTILE)
    step = work / "step_summary.md"
    proc = _cli(str(model), "-o", str(out), "--summary", str(work / "summary.md"), "--junit", str(work / "junit.xml"),
                "--no-simplify", env={"GITHUB_STEP_SUMMARY": str(step)})
    return work, model, out, proc


def test_progress_and_result_lines_show_hostile_names_escaped(exported):
    _, _, out, proc = exported
    assert proc.returncode == 0, proc.stderr
    _lines_are_safe(proc.stdout)
    _lines_are_safe(proc.stderr)
    assert safe_text.terminal(out) in proc.stdout  # `wrote atc_ready: <out>`: the name, escaped, on one line
    assert "\\n::error::pwned" in proc.stderr and "\\x1b]0;owned\\x07" in proc.stderr and "\\u202e" in proc.stderr


def test_the_summary_heading_holds_the_hostile_name_in_one_code_span(exported):
    work, _, out, _ = exported
    for file in (work / "summary.md", work / "step_summary.md"):
        text = file.read_text(encoding="utf-8")
        assert _heading_code(text) == safe_text._escaped(out)  # every control / bidi character shown escaped
        assert not any(line.lstrip().startswith("::") for line in text.splitlines())


def test_the_junit_file_parses_with_expat_and_names_the_model(exported):
    work, _, out, _ = exported
    data = (work / "junit.xml").read_bytes()
    xml.parsers.expat.ParserCreate().Parse(data, True)  # raises on ESC / 0x01: not well-formed
    suite = ET.fromstring(data).find("testsuite")
    assert "pwned" in suite.get("name") and "\x1b" not in suite.get("name")


def test_inspect_and_validate_show_the_hostile_bundle_name_escaped(exported):
    _, _, out, _ = exported
    shown = _cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    _lines_are_safe(shown.stdout + shown.stderr)
    assert safe_text.terminal(out) in shown.stdout
    checked = _cli("validate", str(out), "--junit", str(out.parent / "validate.xml"))
    assert checked.returncode == 0, checked.stderr
    _lines_are_safe(checked.stdout + checked.stderr)
    xml.parsers.expat.ParserCreate().Parse((out.parent / "validate.xml").read_bytes(), True)


def test_a_refused_run_escapes_its_error_in_every_sink(tmp_path):
    """The error message names the (missing) hostile path: stderr, the annotation, the summary and JUnit."""
    missing = tmp_path / (HOSTILE + ".pt2")
    proc = _cli(str(missing), "--summary", str(tmp_path / "s.md"), "--junit", str(tmp_path / "j.xml"),
                env={"GITHUB_ACTIONS": "true"})
    assert proc.returncode == 2
    _lines_are_safe(proc.stdout, own_annotations=1)  # the refusal's own ::error annotation, on one line
    _lines_are_safe(proc.stderr)
    assert "model file not found" in proc.stderr and "\\n::error::pwned" in proc.stderr
    xml.parsers.expat.ParserCreate().Parse((tmp_path / "j.xml").read_bytes(), True)
    summary = (tmp_path / "s.md").read_text(encoding="utf-8")
    assert "refused" in summary.splitlines()[0] and "pwned" in _heading_code(summary)


@pytest.mark.parametrize("pair", ["k=a\x1bb", "k=line\nbreak", "k\u202e=v", "k=\u2066x\u2069", "k=a\x00"])
def test_metadata_with_control_or_bidi_characters_is_refused_up_front(tmp_path, pair):
    proc = _cli(str(tmp_path / "absent.pt2"), "--metadata", pair) if "\x00" not in pair else None
    if proc is not None:  # (a NUL cannot be an argv; the API refuses it the same way)
        assert proc.returncode == 2
        assert "error: [options] --metadata" in proc.stderr and "printable" in proc.stderr
        assert "not found" not in proc.stderr  # refused before the model is even looked for
        _lines_are_safe(proc.stderr)
    from cann_export import export
    from cann_export.errors import OptionsError

    key, _, value = pair.partition("=")
    with pytest.raises(OptionsError, match="control or invisible character"):
        export(model=str(tmp_path / "absent.pt2"), output_path=str(tmp_path / "o"), metadata={key: value})



def test_the_zoo_apis_publish_refuses_metadata_the_cli_refuses(tmp_path):
    """``cann.model_zoo.publish(metadata=...)`` refuses what ``zoo publish --metadata`` does, before any read."""
    from cann.model_zoo import publish
    from cann_export.errors import OptionsError

    with pytest.raises(OptionsError, match="metadata= k: the value holds the control or invisible character"):
        publish(model=str(tmp_path / "absent.pt2"), metadata={"k": "a\x1bb"}, zoo=str(tmp_path / "zoo"))
    assert not (tmp_path / "zoo").exists()


def test_zoo_show_prints_hostile_card_and_metadata_escaped(tmp_path, monkeypatch):
    """A zoo entry whose card fields hold ESC/OSC sequences and U+202E (this client's publish refuses them, but a
    shared store may hold anything another client wrote: here publish's check is switched off to write one):
    `zoo show` and `zoo list` print them escaped."""
    from helpers.toy_models import make_mlp

    from cann.model_zoo import publish
    from cann_export.model_zoo import zoo_api

    monkeypatch.setattr(zoo_api, "check_printable", lambda *args: None)
    zoo = tmp_path / "zoo"
    publish(model=make_mlp(), name="tiny", zoo=str(zoo), metadata={
        "license": "\x1b]0;owned\x07mit\x1b[2J", "task": "\u202eexe.txt", "tags": "a\n::warning::pwned"})
    for args in (("zoo", "show", "tiny"), ("zoo", "list")):
        proc = _cli(*args, "--zoo", str(zoo))
        assert proc.returncode == 0, proc.stderr
        _lines_are_safe(proc.stdout + proc.stderr)
    shown = _cli("zoo", "show", "tiny", "--zoo", str(zoo)).stdout
    assert "\\x1b]0;owned\\x07mit\\x1b[2J" in shown and "\\u202eexe.txt" in shown


class HostileModule(torch.nn.Module):
    """calibration_models.ReductionOverflow with its fp16-breaking module under a hostile attribute name: the
    first divergence names it (add_module takes any name without a dot)."""

    NAME = "energy\n::error::pwned\x1b]0;owned\x07\u202e"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(1300, 1300)
        self.add_module(self.NAME, cm.Energy())
        self.head = torch.nn.Linear(1, 4)

    def forward(self, x):
        return self.head(torch.sqrt(getattr(self, self.NAME)(self.proj(x))) / 100)


def test_the_first_divergence_names_a_hostile_module_escaped(tmp_path):
    """The module name reaches the first-divergence line of inspect and validate --soc-version, the summary
    and JUnit: escaped everywhere (the API takes the module; the CLI reads the bundle)."""
    from cann_export import export

    _, inputs, _ = cm.reduction_overflow()
    out = tmp_path / "bundle"
    result = export(HostileModule().eval(), str(out), "atc_ready", example_inputs=(inputs["x"],))
    assert "::error::pwned" in result.parity["first_divergence"]["message"]
    shown = _cli("inspect", str(out))
    assert "first divergence: energy\\n::error::pwned" in shown.stdout
    checked = _cli("validate", str(out), "--soc-version", "Ascend910B1", "--summary", str(tmp_path / "s.md"),
                   "--junit", str(tmp_path / "j.xml"))
    assert checked.returncode == 1 and "first divergence: energy\\n::error::pwned" in checked.stdout
    for proc in (shown, checked):
        _lines_are_safe(proc.stdout + proc.stderr)
    xml.parsers.expat.ParserCreate().Parse((tmp_path / "j.xml").read_bytes(), True)
    summary = (tmp_path / "s.md").read_text(encoding="utf-8")
    assert "energy\\\\n::error::pwned" in summary  # markdown_text: the escape's backslash shown as itself
    assert not any(line.lstrip().startswith("::") for line in summary.splitlines())


# ------------------------------------------------------------------------------------ the sinks, one by one


def _hostile_manifest() -> dict:
    row = {"name": HOSTILE, "passed": False, "cosine": 0.5, "max_abs": 1.0, "max_rel": 1.0, "reason": HOSTILE}
    return {"parity": {"validated": True, "passed": False, "outputs": [row], "fp32": {"outputs": [row]},
                       "first_divergence": {"message": f"first divergence: {HOSTILE} cosine 0.50",
                                            "source": f"{HOSTILE}.py:12"}},
            "lint": {"atc": {"findings": [{"severity": "error", "rule": HOSTILE, "message": HOSTILE}]}},
            "atc": {"command": ["atc", f"--output={HOSTILE}\n```\n# heading", "--x=````"]}}


def test_summaries_keep_hostile_names_in_their_place():
    graphs = {None: _hostile_manifest()}
    markdown = summaries.markdown("export", HOSTILE, graphs)
    assert _heading_code(markdown) == safe_text._escaped(HOSTILE)
    html = _markdown().render(markdown)
    assert "<a " not in html and "<em>" not in html and "\x1b" not in html
    assert html.count("<h3>") == 1 and "<h1>" not in html  # the fence held "# heading" inside
    assert html.count("<pre>") == 1 and "--x=````" in html
    tokens = _markdown().parse(markdown)
    assert sum(t.type == "tr_open" for t in tokens) == 2  # the header and the one case: `|` did not split cells
    for junit in (summaries.junit("export", HOSTILE, graphs), summaries.refused_junit("export", HOSTILE,
                                                                                    {"message": HOSTILE})):
        xml.parsers.expat.ParserCreate().Parse(junit.encode(), True)
    notes = summaries.annotations("export", graphs) + [summaries.refused_annotation("export", {"message": HOSTILE})]
    for line in notes:
        assert "\n" not in line and "\r" not in line and line.startswith("::error ")
        command = line[2:line.index("::", 2)]  # what the runner reads as the command and its properties
        assert command.split(" ")[0] == "error" and ":" not in command  # data's colons are %3A there
        _lines_are_safe(line, own_annotations=1)


def test_the_terminal_escaper():
    assert safe_text.terminal("a\nb\x1b[2J\u202e\x85\u2028\udcff\t") == "a\\nb\\x1b[2J\\u202e\\x85\\u2028\\udcff\\t"
    assert safe_text.terminal(" \u3000::error::x") == " \u3000\\x3a:error::x"  # whitespace GitHub trims first
    assert safe_text.terminal("aten::add ##[error]") == "aten::add ##\\x5berror]"
    assert safe_text.terminal("plain/path_ü.onnx") == "plain/path_ü.onnx"


def test_the_xml_escaper_leaves_only_what_xml_allows():
    every = "".join(map(chr, range(0x20))) + "\x7f\ud800\udfff\ufffe\uffff\u202e<&\">"
    element = ET.Element("e", {"a": safe_text.xml_text(every)})
    element.text = safe_text.xml_text(every)
    data = ET.tostring(element, encoding="unicode").encode("utf-8")
    xml.parsers.expat.ParserCreate().Parse(data, True)
    assert ET.fromstring(data).text.startswith("\\x00\\x01")


def test_markdown_code_spans_outlast_any_backticks():
    for text in ("a`b", "``", "`lead", "trail`", "x````y", "", " "):
        html = _markdown().renderInline(safe_text.markdown_code(text))
        assert html.count("<code>") == 1 and html.startswith("<code>") and html.endswith("</code>")
    assert safe_text.markdown_fence("a\n````\nb", "bash")[0] == "`````bash"


# what a hostile name is made of: the escapers' hard cases, weighted over all of Unicode
_PIECES = st.sampled_from(["\n", "\r", "\r\n", "::", "::error::", "##[", " ", "\t", "\u3000", "`", "``", "|",
                           "\\", "%", ":", ",", "<", "&", "]]>", "\x1b]0;", "\x07", "\x1b[2J", "\x00", "\x85",
                           "\u202e", "\u2066", "\u200f", "\u061c", "\u2028", "\ufeff", "\ufffe", "\ud800", "*", "#"])
HOSTILE_TEXT = st.lists(_PIECES | st.text(max_size=4), max_size=12).map("".join)


@settings(max_examples=400, deadline=None, database=None)
@given(text=HOSTILE_TEXT)
def test_every_sink_holds_any_text(text):
    """The invariants, for any text: the terminal form is one line, starts no workflow command and holds no
    control, bidi or invisible character; the workflow forms hold no line break; the code span renders as one
    code span and a table cell stays one cell; the XML forms parse with expat."""
    shown = safe_text.terminal(text)
    assert "\n" not in shown and "\r" not in shown and "##[" not in shown
    assert not shown.lstrip().startswith("::") and safe_text.unprintable(shown) is None
    for escaped in (safe_text.workflow_data(text), safe_text.workflow_property(text)):
        assert "\n" not in escaped and "\r" not in escaped and safe_text.unprintable(escaped) is None
    assert "," not in safe_text.workflow_property(text) and ":" not in safe_text.workflow_property(text)
    html = _markdown().renderInline(safe_text.markdown_code(text))
    assert html.count("<code>") == 1 and html.startswith("<code>") and html.endswith("</code>")
    row = _markdown().render(f"| a | b |\n|---|---|\n| {safe_text.markdown_code(text, in_table=True)} | x |\n")
    assert row.count("<td>") == 2
    text_html = _markdown().renderInline(safe_text.markdown_text(text))
    assert "<" not in text_html.replace("<br />", "")  # no tag, link, emphasis or code from the text
    element = ET.Element("e", {"a": safe_text.xml_text(text)})
    element.text = safe_text.xml_text(text)
    xml.parsers.expat.ParserCreate().Parse(ET.tostring(element, encoding="unicode").encode("utf-8"), True)


def test_workflow_escapes_follow_githubs_rules():
    assert safe_text.workflow_data("50%\r\n::x") == "50%25%0D%0A::x"
    assert safe_text.workflow_property("a:b,c") == "a%3Ab%2Cc"
    assert safe_text.workflow_data("\x1b\u202e") == "\\x1b\\u202e"


def test_progress_events_from_the_sandbox_child_are_logged_and_shown_escaped(caplog, capsys):
    """The load sandbox's child sends progress events (ProgressEvent.from_dict): a hostile model's code picks
    their text. The progress logger and the CLI's progress lines show it escaped."""
    import logging

    from cann_export.cli.progress_view import ProgressView
    from cann_export.progress import ProgressEvent, emit

    events = [ProgressEvent.from_dict({"kind": kind, "stage": HOSTILE[:60], "status": HOSTILE[:60],
                                       "what": HOSTILE[:60], "index": 1, "stages": 2, "done": 1, "total": 2})
              for kind in ("start", "advance", "end")]
    with caplog.at_level(logging.DEBUG, logger="cann_export.progress"):
        for event in events:
            emit(event)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert len(caplog.records) == 3 and "\\n::error::pwned" in logged
    _lines_are_safe(logged)
    with ProgressView(live=False) as view:
        for event in events:
            view(event)
        view.say(f"cann-export: {HOSTILE} -> out")
    _lines_are_safe(capsys.readouterr().err)


@pytest.mark.skipif(not confine.probe().available, reason="no load sandbox: the code runs in-process")
def test_what_code_in_the_load_sandbox_prints_never_reaches_the_ci_log(tmp_path):
    """A trusted pickle's code runs in the load sandbox's child and writes ``::error::`` / ``::add-mask::`` and
    terminal escapes to fds 1 and 2: the child's stdout and stderr go nowhere; the control (--no-sandbox runs
    the same code in the exporting process) shows the payload really prints."""
    from helpers.loud_payload import Shout

    model = tmp_path / "loud.pt"
    torch.save(Shout(), str(model))
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    args = [str(model), "--format", "onnx", "--trust-pickle", "--input-shape", "x:2,12", "--no-validate"]
    confined = _cli(*args, "-o", str(tmp_path / "a.onnx"), env=env)
    assert confined.returncode == 0, confined.stderr
    assert "pwned" not in confined.stdout + confined.stderr
    _lines_are_safe(confined.stdout + confined.stderr)
    unconfined = _cli(*args, "-o", str(tmp_path / "b.onnx"), "--no-sandbox", env=env)
    assert "::error::pwned-from-the-sandbox" in unconfined.stdout.splitlines()
