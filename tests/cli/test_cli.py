"""The CLI: both spellings, --json schema, inspect, validate, plugins, and a real subprocess."""
import json
import os
import subprocess
import sys

from click.testing import CliRunner
from helpers import files, hf_models
from safetensors.torch import save_file

from cann_export.cli.main import cli


def invoke(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def check_json_schema(payload):
    assert set(payload) >= {"ok", "format", "output", "files", "onnx", "parity"}
    assert isinstance(payload["ok"], bool) and isinstance(payload["files"], list)
    assert set(payload["onnx"]) >= {"path", "opset", "exporter"} and isinstance(payload["onnx"]["opset"], int)
    assert isinstance(payload["parity"]["passed"], bool)
    for out in payload["parity"]["outputs"]:
        assert {"name", "max_abs", "max_rel", "cosine"} <= set(out)


def test_bare_and_export_subcommand_spellings(tmp_path):
    model = str(files.pt2(tmp_path))
    a = invoke([model, "--format", "onnx", "-o", str(tmp_path / "a.onnx"), "--json"])
    b = invoke(["export", model, "--format", "onnx", "-o", str(tmp_path / "b.onnx"), "--json"])
    for result in (a, b):
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)  # exactly one JSON object on stdout
        check_json_schema(payload)
        assert payload["format"] == "onnx" and payload["files"] == [payload["onnx"]["path"]]
    assert "[5/12] capture" in a.stderr  # progress goes to stderr


def test_the_articles_model_option_spelling(tmp_path, cli_env):
    """`cann-export --model X --format F` (and `export --model X`) is the positional MODEL; so is the console
    script `cann.torch.export --model X --format atc_ready`, the articles' CI line."""
    model = str(files.pt2(tmp_path))
    for args in (["--model", model], [f"--model={model}"], ["export", "--model", model]):
        out = tmp_path / f"{len(args)}_{args[0][:8].strip('-=')}.onnx"
        result = invoke([*args, "--format", "onnx", "-o", str(out), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["onnx"]["path"] == str(out) and out.is_file()
    both = invoke([model, "--model", str(tmp_path / "other.pt2"), "--format", "onnx"])
    assert both.exit_code == 2 and "two models given" in both.stderr
    neither = invoke(["export", "--format", "onnx"])
    assert neither.exit_code == 2 and "--model MODEL" in neither.stderr
    script = os.path.join(os.path.dirname(sys.executable), "cann.torch.export")
    assert os.access(script, os.X_OK), "the console script is installed by `pip install -e .`"
    proc = subprocess.run([script, "--model", model, "--format", "atc_ready", "-o", str(tmp_path / "ci.pth"),
                           "--json"], capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["format"] == "atc_ready" and (tmp_path / "ci.pth").is_file()


def test_bert_through_cli_with_example_inputs_and_hints(tmp_path):
    model = hf_models.tiny_bert()
    from safetensors.torch import save_model

    save_model(model, str(tmp_path / "bert.safetensors"))
    (tmp_path / "bert_factory.py").write_text(
        f"import sys\nsys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})\n"
        "from helpers.hf_models import tiny_bert\n")
    save_file(hf_models.token_inputs(1, 16), str(tmp_path / "inputs.safetensors"))
    out = tmp_path / "bert_bundle"
    sys.path.insert(0, str(tmp_path))
    try:
        result = invoke([str(tmp_path / "bert.safetensors"), "--model-class", "bert_factory:tiny_bert",
                         "--example-inputs", str(tmp_path / "inputs.safetensors"), "-o", str(out), "--json",
                         "--metadata", "license=apache-2.0", "--atc-hint", "log=error",
                         "--soc-version", "Ascend910B", "--precision-mode", "allow_mix_precision"])
    finally:
        sys.path.remove(str(tmp_path))
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    check_json_schema(payload)
    assert [o["name"] for o in payload["parity"]["outputs"]] == ["last_hidden_state", "pooler_output"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metadata"] == {"license": "apache-2.0"}
    assert manifest["atc"]["hints"] == {"log": "error"}
    script = (out / "atc" / "convert.sh").read_text()
    assert "--soc_version=Ascend910B" in script and "--precision_mode=allow_mix_precision" in script
    assert "--log=error" in script and "--input_shape=input_ids:1,16;attention_mask:1,16" in script


def test_inspect_and_validate_a_bundle(tmp_path):
    out = tmp_path / "b"
    assert invoke([str(files.pt2(tmp_path)), "-o", str(out)]).exit_code == 0
    info = json.loads(invoke(["inspect", str(out), "--json"]).stdout)
    assert info["kind"] == "atc_ready" and info["inputs"][0]["name"] == "x"
    assert info["ops"] and info["parity"]["passed"] and info["metadata"]["cann_export.exporter"]
    text = invoke(["inspect", str(out / "model.onnx")]).stdout
    assert "inputs:" in text and "ops:" in text and "opset" in text

    ok = invoke(["validate", str(out), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["parity"]["passed"]


def test_validate_detects_a_tampered_bundle(tmp_path):
    out = tmp_path / "b"
    invoke([str(files.pt2(tmp_path)), "-o", str(out)])
    data = bytearray((out / "model.onnx").read_bytes())
    data[-20] ^= 0xFF
    (out / "model.onnx").write_bytes(bytes(data))
    result = invoke(["validate", str(out)])
    assert result.exit_code == 2 and "model.onnx" in result.stderr and "sha256" in result.stderr


def test_validate_reports_parity_failure_with_exit_1(tmp_path):
    """A bundle written with a real parity failure (fp16 overflows where fp32 is finite): export and
    validate's re-derived verdict both exit EXIT_PARITY_FAILED, a verdict rather than a refusal."""
    import torch
    from helpers import parity_models

    from cann_export.errors import EXIT_PARITY_FAILED

    torch.manual_seed(0)
    torch.save(parity_models.Overflow().state_dict(), tmp_path / "ovf.pth")
    save_file({"x": torch.randn(2, 8) + 2}, str(tmp_path / "x.safetensors"))
    out = tmp_path / "b"
    exported = invoke([str(tmp_path / "ovf.pth"), "--model-class", "helpers.parity_models:Overflow",
                       "--example-inputs", str(tmp_path / "x.safetensors"), "-o", str(out)])
    assert exported.exit_code == EXIT_PARITY_FAILED, exported.output
    result = invoke(["validate", str(out), "--json"])
    assert result.exit_code == EXIT_PARITY_FAILED, result.output
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["parity"]["passed"] is False, payload
    assert payload["parity"]["device"]["passed"] is False and "error" not in payload


def test_validate_refuses_a_manifest_without_its_file_table(tmp_path):
    """Without the file table the manifest is malformed: a refusal (exit 2), not a verdict."""
    from cann_export.errors import EXIT_USER_ERROR

    out = tmp_path / "b"
    assert invoke([str(files.pt2(tmp_path)), "-o", str(out)]).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("files")
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = invoke(["validate", str(out), "--json"])
    assert result.exit_code == EXIT_USER_ERROR and "file table" in json.loads(result.stdout)["error"]["message"]


def test_validate_under_a_tighter_explicit_tolerance_fails_with_exit_1(tmp_path):
    out = tmp_path / "b"
    invoke([str(files.pt2(tmp_path)), "-o", str(out)])
    assert invoke(["validate", str(out)]).exit_code == 0
    result = invoke(["validate", str(out), "--atol", "0", "--rtol", "0", "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["ok"] is False


def test_plugins_lists_builtins_with_hooks():
    rows = json.loads(invoke(["plugins", "--json"]).stdout)
    by_name = {r["name"]: r for r in rows}
    assert by_name["cann_export.plugins.formats"]["hooks"] == ["register_formats"]
    assert all(r["version"] for r in rows)
    assert "register_loaders" in invoke(["plugins"]).stdout


def test_real_subprocess_export_and_exit_codes(tmp_path, cli_env):
    model = files.state_dict(tmp_path)
    exe = [sys.executable, "-c", "from cann_export.cli.main import main; main()"]
    ok = subprocess.run([*exe, str(model), "--model-class", files.MLP_CLASS, "--input-shape", "x:4,12",
                         "--format", "onnx", "-o", str(tmp_path / "m.onnx"), "--json"],
                        capture_output=True, text=True, env=cli_env, timeout=300, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["onnx"]["path"] == str(tmp_path / "m.onnx")
    bad = subprocess.run([*exe, str(tmp_path / "missing.pth")], capture_output=True, text=True, env=cli_env,
                         timeout=300, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "[load]" in bad.stderr


def test_help_does_not_import_torch(cli_env):
    code = "import sys; from cann_export.cli.main import main; sys.argv=['cann-export','--help']\n" \
           "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules, 'onnx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env, timeout=60,
                         check=False)
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_a_reader_that_leaves_early_ends_the_command_quietly(cli_env):
    """`cann-export plugins | head -0`: the pipe's reader is gone before the first write."""
    from cann_export.cli.guard import EXIT_BROKEN_PIPE

    code = "import sys; from cann_export.cli.main import main; sys.argv=['cann-export','plugins']\nmain()\n"
    read, write = os.pipe()
    os.close(read)  # nobody will ever read what the command prints
    try:
        out = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, text=True,
                             env=cli_env, timeout=120, check=False)
    finally:
        os.close(write)
    assert out.returncode == EXIT_BROKEN_PIPE, out.stderr
    assert out.stderr == ""


def test_every_plugin_command_is_guarded_and_clicks_own_errors_stay_clicks(plugin):
    """A plugin's commands, in nested groups too, run under the guard: a cann-export error is one message
    and its exit code, a returned code is the exit code, ``--json`` (whatever its parameter is called) gives
    the JSON error; click's own usage errors and ``ctx.exit`` keep click's behaviour."""
    import click

    from cann_export import hookimpl
    from cann_export.cli.main import _register_plugin_commands
    from cann_export.errors import ValidateError

    @hookimpl
    def register_commands(cli):
        outer = click.Group("house")
        inner = click.Group("deep")

        @inner.command("fail")
        @click.option("--json", "machine", is_flag=True)
        def fail(machine):
            raise ValidateError("the house rules refuse it", path="x.onnx")

        @inner.command("code")
        def code():
            return 3

        @inner.command("usage")
        def usage():
            raise click.UsageError("say which house")

        @inner.command("leave")
        @click.pass_context
        def leave(ctx):
            ctx.exit(4)

        outer.add_command(inner)
        cli.add_command(outer)

    plugin({"register_commands": register_commands}, "house-commands")
    _register_plugin_commands()
    runner = CliRunner()
    failed = runner.invoke(cli, ["house", "deep", "fail"])
    assert failed.exit_code == ValidateError.exit_code and "the house rules refuse it" in failed.stderr
    assert "Traceback" not in failed.output and "internal" not in failed.stderr
    as_json = runner.invoke(cli, ["house", "deep", "fail", "--json"])
    assert json.loads(as_json.stdout)["error"]["message"].endswith("the house rules refuse it")
    assert runner.invoke(cli, ["house", "deep", "code"]).exit_code == 3
    usage = runner.invoke(cli, ["house", "deep", "usage"])
    assert usage.exit_code == 2 and "say which house" in usage.stderr and "internal" not in usage.stderr
    assert runner.invoke(cli, ["house", "deep", "leave"]).exit_code == 4


def test_exit_once_torch_is_imported_skips_the_teardown(cli_env):
    """With torch imported, the interpreter's teardown (~1 s of wall and CPU) is skipped: atexit handlers still
    run, what was printed is flushed, the exit code is the command's; an object freed only by the teardown is
    not freed (it would print)."""
    code = ("import atexit, sys, torch\n"
            "class Late:\n    def __del__(self):\n        print('TORN-DOWN', flush=True)\n"
            "late = Late()\natexit.register(lambda: print('ATEXIT'))\n"
            "from cann_export.cli.main import main\nsys.argv = ['cann-export'] + sys.argv[1:]\nmain()\n")
    ok = subprocess.run([sys.executable, "-c", code, "plugins"], capture_output=True, text=True, env=cli_env,
                        timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "register_loaders" in ok.stdout and ok.stdout.rstrip().endswith("ATEXIT")
    assert "TORN-DOWN" not in ok.stdout
    usage = subprocess.run([sys.executable, "-c", code, "export", "--no-such-flag"], capture_output=True, text=True,
                           env=cli_env, timeout=120, check=False)
    assert usage.returncode == 2 and "--no-such-flag" in usage.stderr and "TORN-DOWN" not in usage.stdout


def test_the_cli_lets_openmp_threads_sleep_unless_the_user_chose(cli_env):
    """OMP_WAIT_POLICY=PASSIVE is set before torch loads OpenMP (spinning threads on shared cores made ViT-small's
    eager forwards 3-7x slower); a policy the user set is kept."""
    code = ("import atexit, os, sys\nfrom cann_export.cli.main import main\n"
            "atexit.register(lambda: print('POLICY', os.environ.get('OMP_WAIT_POLICY'), flush=True))\n"
            "sys.argv = ['cann-export', 'plugins']\nmain()\n")
    env = {k: v for k, v in cli_env.items() if k != "OMP_WAIT_POLICY"}
    for given, want in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        run_env = env if given is None else {**env, "OMP_WAIT_POLICY": given}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env, timeout=120,
                             check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.rstrip().splitlines()[-1] == f"POLICY {want}", out.stdout[-500:]
