"""Exports whose manifest.json, parity.json and ``--json`` output are compared, as text, against goldens
(tests/golden_bundles/), first made from the code before the bundle/rooms refactor of issue 42 and remade only
with a change that means to change an export's record (say which in its commit).

Only what differs from run to run on the same code is normalised: the run's temporary directory (``<ROOT>``),
``provenance.created_utc``, the per-stage wall times (``stage_seconds``), the checks' own cost (``parity.checks``:
wall seconds and peak RSS), every sha256 (the graphs and parity
files carry run-specific bytes, the manifests carry the times) and the byte size of a ``manifest.json`` (it holds
the times), of a ``model.onnx`` (its metadata holds the source's path) and of a ``torch/program.pt2`` (its stack
traces hold the absolute paths of the tool's own source files) in a file table, and the line numbers
of trace warnings inside an installed library (they move with its release). Everything else, key
order and formatting included, must be identical."""
from __future__ import annotations

import json
import re
from pathlib import Path

# name -> (model, extra CLI flags); every case runs `cann-export DIR -o OUT --json FLAGS`
CASES = {
    "single_gpt2": ("gpt2_single", ["--format", "onnx", "--task", "text-generation"]),
    "single_gpt2_atc": ("gpt2_single", ["--format", "atc_ready", "--task", "text-generation"]),
    "multi_gpt2_past": ("gpt2_past", ["--format", "onnx"]),
    "multi_t5": ("t5", []),
}
GOLDEN = Path(__file__).resolve().parents[1] / "golden_bundles"


def _tiny_models() -> dict:
    import torch
    import transformers

    from helpers.hf_models import tiny_decoder_gpt2, tiny_gpt2

    torch.manual_seed(2)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)).eval()
    return {"gpt2_past": tiny_decoder_gpt2(n_positions=64), "t5": t5, "gpt2_single": tiny_gpt2()}


def _stage_seconds(match: re.Match) -> str:
    return re.sub(r"(\"\w+\": )-?[0-9.eE+-]+", r"\1<s>", match.group(0))


def normalise(text: str, root: str) -> str:
    text = text.replace(root, "<ROOT>")
    text = re.sub(r"\"created_utc\": \"[^\"]*\"", "\"created_utc\": \"<t>\"", text)
    text = re.sub(r"\"stage_seconds\": \{[^{}]*\}", _stage_seconds, text)
    text = re.sub(r"\"checks\": \{[^{}]*\}", _stage_seconds, text)  # the checks' own wall and peak RSS
    # where tracing warned inside an installed library: its line numbers move with the library's release
    text = re.sub(r"(\"file\": \"[^\"/][^\"]*\",\s*\"line\": )\d+", r"\1<line>", text)
    # a hash of bytes: the source's too, which covers the carried config.json and so the transformers release that
    # wrote it (CI's fresh venv can get a newer one); tests/hf/test_directories.py checks it against the files
    text = re.sub(r"(\"(?:manifest_|source_)?sha256\": )\"[0-9a-f]{64}\"", r'\1"<sha>"', text)
    sized = r"((?:manifest\.json|model\.onnx|program\.pt2)\": \{\s*\"sha256\": \"<sha>\",\s*\"size\": )\d+"
    return re.sub(sized, r"\1<n>", text)


def run_cases(root: Path) -> dict[str, dict[str, str]]:
    """Export every case under root through the CLI; name -> {file: normalised text} (``--json`` as result.json)."""
    from click.testing import CliRunner

    from cann_export.cli.main import cli

    models = _tiny_models()
    dirs = {}
    for key, model in models.items():
        dirs[key] = root / f"{key}-dir"
        model.save_pretrained(dirs[key])
    out: dict[str, dict[str, str]] = {}
    for name, (key, flags) in CASES.items():
        target = root / name
        res = CliRunner().invoke(cli, [str(dirs[key]), "-o", str(target), "--json", *flags], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        found = {"result.json": normalise(res.stdout, str(root))}
        if target.is_dir():
            for path in sorted(target.rglob("*.json")):
                if path.name in ("manifest.json", "parity.json"):
                    found[str(path.relative_to(target))] = normalise(path.read_text(), str(root))
        out[name] = found
    return out


def write_goldens(found: dict[str, dict[str, str]]) -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, files in found.items():
        (GOLDEN / f"{name}.json").write_text(json.dumps(files, indent=1, sort_keys=True) + "\n")


def read_golden(name: str) -> dict[str, str]:
    return json.loads((GOLDEN / f"{name}.json").read_text())
