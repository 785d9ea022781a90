"""``cann-export zoo ...``: the model zoo commands for CI/CD steps (publish, list, show, pull, alias, verify,
keygen), and ``cann-export gc`` (sweep stale staging). One function per command; ``register_commands``
only attaches them."""
from __future__ import annotations

import json
from typing import Any

from ..usage.examples import examples
from ..hooks.specs import hookimpl
from ..safe_text import terminal

ZOO_HELP = "Model zoo: a directory or s3://bucket/prefix (default: $CANN_MODEL_ZOO or ~/.cache/cann-export/zoo)."


def _echo_json(data: Any) -> None:
    import click

    click.echo(json.dumps(data, default=str, allow_nan=False))


def _common(fn: Any) -> Any:
    """--zoo and --json, which every zoo command takes."""
    import click

    fn = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(fn)
    return click.option("--zoo", envvar="CANN_MODEL_ZOO", default=None, help=ZOO_HELP)(fn)


def _kwargs(raw: str | None) -> dict[str, Any]:
    from ..options import parse_model_kwargs

    return parse_model_kwargs(raw)


# ------------------------------------------------------------------------------------------ commands


def publish_command(click: Any) -> Any:
    @click.command("publish", epilog=examples(
        "cann-export zoo publish resnet_bundle --name resnet50 --alias prod",
        "cann-export zoo publish w.safetensors --name tiny --model-class pkg.nets:build --sign key.pem"))
    @click.argument("path", type=click.Path(path_type=str))
    @click.option("--name", required=True, help="Model name (letters, digits, '.', '_', '-').")
    @click.option("--version", "version", default=None, help="Explicit version (default: the next number).")
    @click.option("--metadata", multiple=True,
                  help="KEY=VALUE (license, task, base_model, metrics, tags go to the card); repeatable.")
    @click.option("--alias", "aliases", multiple=True, help="Point this alias at the published version; repeatable.")
    @click.option("--model-class", default=None, help="pkg.module:Callable that rebuilds the module from the weights.")
    @click.option("--model-kwargs", default=None, help="JSON object of keyword arguments for --model-class.")
    @click.option("--card", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
                  help="A README.md to use as the model card body.")
    @click.option("--artifact", "artifacts", multiple=True,
                  help="An extra exported bundle / .onnx to store with the weights.")
    @click.option("--trust-pickle", is_flag=True, help="Accept a pickled nn.Module (converted to safetensors).")
    @click.option("--sign", "sign", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
                  help="Sign the version with this ed25519 private key (PEM; `cann-export zoo keygen`).")
    @_common
    def publish_cmd(path: str, name: str, version: str | None, metadata: tuple[str, ...], aliases: tuple[str, ...],
                    model_class: str | None, model_kwargs: str | None, card: str | None, artifacts: tuple[str, ...],
                    trust_pickle: bool, sign: str | None, zoo: str | None, as_json: bool) -> int:
        """Publish PATH (weights/checkpoint file, .pt2, or an exported bundle / .onnx / om-stub)."""

        from ..model_zoo import zoo_api
        from ..options import parse_key_values

        record = zoo_api.publish(model=path, name=name, version=version,
                             metadata=parse_key_values(metadata, "--metadata"), card=card, zoo=zoo,
                             alias=list(aliases), model_class=model_class, model_kwargs=_kwargs(model_kwargs),
                             trust_pickle=trust_pickle, artifacts=list(artifacts), sign=sign)
        if as_json:
            _echo_json({"ok": True, **record})
        else:
            state = "already published (identical contents)" if record["existed"] else "published"
            click.echo(terminal(f"{record['name']} version {record['version']} "
                                f"{state}{' (signed)' if record['signed'] else ''}: "
                                f"{record['path']} (manifest sha256 {record['manifest_sha256']})"))
        return 0

    return publish_cmd


def list_command(click: Any) -> Any:
    @click.command("list", epilog=examples("cann-export zoo list --zoo s3://models/zoo"))
    @_common
    def list_cmd(zoo: str | None, as_json: bool) -> int:
        """List the models with their versions and aliases."""

        from ..model_zoo import zoo_api

        rows = zoo_api.list_models(zoo=zoo)
        if as_json:
            _echo_json({"ok": True, "models": rows})
            return 0
        if not rows:
            click.echo("the model zoo is empty")
        for r in rows:
            aliases = " ".join(f"{a}->{v}" for a, v in r["aliases"].items())
            click.echo(terminal(f"{r['name']}  latest {r['latest']}  versions {','.join(r['versions'])}"
                                f"{'  ' + aliases if aliases else ''}  [{', '.join(r['kinds'] + r['targets'])}]"))
        return 0

    return list_cmd


def _print_show(click: Any, info: dict[str, Any]) -> None:
    m = info["manifest"]
    click.echo(terminal(f"{info['name']} version {info['version']} (digest {m['digest'][:16]}, {m['created_utc']}, "
                        f"{m.get('created_by')})"))
    click.echo(terminal(f"manifest sha256: {info['manifest_sha256']}"))
    if isinstance(m.get("signature"), dict):
        click.echo(terminal(f"signed: ed25519 key {m['signature'].get('key_id')}"))
    click.echo(terminal("versions: " + ", ".join(v["version"] for v in info["versions"])))
    records = info.get("alias_records") or {}
    for a, v in info["aliases"].items():
        r = records.get(a) or {}
        how = f"signed by key {r['key_id']}" if r.get("signed") else "unsigned"
        click.echo(terminal(f"alias {a} -> {v} ({how}, sequence {r.get('sequence') or '-'})"))
    for h in info["alias_history"]:
        click.echo(terminal(f"  {h['time_utc']} {h['alias']}: {h.get('previous') or '-'} -> {h['version']}"))
    if m.get("card"):
        click.echo(terminal("card: " + ", ".join(f"{k}={v}" for k, v in m["card"].items())))
    if m.get("architecture"):
        click.echo(terminal(f"architecture: {m['architecture'].get('callable') or m['architecture'].get('file')}"))
    for key in m.get("artifacts") or {}:
        click.echo(terminal(f"artifact: {key}"))
    for step in m.get("lineage") or []:
        digests = ("source_weights_sha256", "onnx_sha256", "om_sha256")
        click.echo(terminal("lineage: " + " -> ".join(f"{k} {str(step[k])[:16]}" for k in digests if step.get(k))))
    click.echo(terminal(f"files: {len(m['files'])} ({sum(f['size'] for f in m['files'].values())} bytes)"))


def show_command(click: Any) -> Any:
    @click.command("show", epilog=examples("cann-export zoo show resnet50@prod --json"))
    @click.argument("ref")
    @_common
    def show_cmd(ref: str, zoo: str | None, as_json: bool) -> int:
        """Show NAME[@VERSION|@ALIAS]: versions, aliases and their history, the manifest and its sha256."""

        from ..model_zoo import zoo_api

        info = zoo_api.show(ref, zoo=zoo)
        if as_json:
            _echo_json({"ok": True, **info})
        else:
            _print_show(click, info)
        return 0

    return show_cmd


def pull_command(click: Any) -> Any:
    @click.command("pull", epilog=examples("cann-export zoo pull resnet50@prod -o deploy --target Ascend910B1"))
    @click.argument("ref")
    @click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Directory to write.")
    @click.option("--target", default=None, help="Only the artifact for this soc_version or target key.")
    @click.option("--overwrite", is_flag=True,
                  help="Replace an existing output (only a directory an earlier pull wrote).")
    @click.option("--key", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
                  help="Require a valid signature by this ed25519 public key (PEM), and a signed alias record.")
    @_common
    def pull_cmd(ref: str, output: str, target: str | None, overwrite: bool, key: str | None, zoo: str | None,
                 as_json: bool) -> int:
        """Copy NAME[@VERSION|@ALIAS] (verified) into a directory."""

        from ..model_zoo import zoo_api

        result = zoo_api.pull(ref, output, target=target, overwrite=overwrite, zoo=zoo, verify_signature=key)
        if as_json:
            _echo_json(result)
        else:
            click.echo(terminal(f"pulled {result['name']} version {result['version']} to {result['output']} "
                                f"({len(result['files'])} files, verified; manifest sha256 "
                                f"{result['manifest_sha256']})"))
        return 0

    return pull_cmd


def alias_command(click: Any) -> Any:
    @click.command("alias", epilog=examples("cann-export zoo alias resnet50 prod 3 --sign key.pem"))
    @click.argument("name")
    @click.argument("alias")
    @click.argument("version")
    @click.option("--sign", "sign", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
                  help="Sign the alias record with this ed25519 private key (required when VERSION is signed).")
    @_common
    def alias_cmd(name: str, alias: str, version: str, sign: str | None, zoo: str | None, as_json: bool) -> int:
        """Point ALIAS of NAME at VERSION (logged with time, the previous target and a sequence number)."""

        from ..model_zoo import zoo_api

        result = zoo_api.set_alias(name, alias, version, zoo=zoo, sign=sign)
        if as_json:
            _echo_json({"ok": True, **result})
        else:
            click.echo(terminal(f"{name}@{alias} -> {result['version']} (was {result['previous'] or 'unset'}; sequence "
                                f"{result['sequence']}, {'signed' if result['signed'] else 'unsigned'})"))
        return 0

    return alias_cmd


def verify_command(click: Any) -> Any:
    @click.command("verify", epilog=examples("cann-export zoo verify resnet50@prod --key key.pub"))
    @click.argument("ref")
    @click.option("--key", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
                  help="Also require a valid signature by this ed25519 public key (PEM).")
    @_common
    def verify_cmd(ref: str, key: str | None, zoo: str | None, as_json: bool) -> int:
        """Check the sha256 of every file of NAME (all versions) or NAME@VERSION, and with --key its signature."""

        from ..errors import EXIT_PARITY_FAILED
        from ..model_zoo import zoo_api

        report = zoo_api.verify(ref, zoo=zoo, key=key)
        if as_json:
            _echo_json(report)
        else:
            for v in report["versions"]:
                signed = f", signed by {v['signed_by']}" if v.get("signed_by") else ""
                click.echo(terminal(f"{report['name']} version {v['version']}: "
                                    f"{'ok' if v['ok'] else 'DAMAGED'} ({v['files']} files{signed})"))
                for p in v["problems"]:
                    click.echo(terminal(f"  {p}"))
        if not report["ok"]:
            click.echo(terminal(f"error: [zoo] {report['name']}: integrity check failed; restore the files or publish "
                                "again"), err=True)
        return 0 if report["ok"] else EXIT_PARITY_FAILED

    return verify_cmd


def keygen_command(click: Any) -> Any:
    @click.command("keygen", epilog=examples("cann-export zoo keygen --out keys/zoo"))
    @click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=str),
                  help="Private key file to write (PEM, mode 0600); the public key goes to OUT.pub.")
    @click.option("--overwrite", is_flag=True, help="Replace existing key files.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
    def keygen_cmd(out: str, overwrite: bool, as_json: bool) -> int:
        """Make an ed25519 key pair for `zoo publish --sign` and `zoo verify --key`."""

        from ..model_zoo.signing import keygen

        result = keygen(out, overwrite=overwrite)
        if as_json:
            _echo_json({"ok": True, **result})
        else:
            click.echo(terminal(f"wrote {result['private_key']} (keep it secret) and {result['public_key']} "
                                f"(key id {result['key_id']})"))
        return 0

    return keygen_cmd


def gc_command(click: Any) -> Any:
    @click.command("gc", epilog=examples("cann-export gc --zoo s3://models/zoo"))
    @_common
    def gc_cmd(zoo: str | None, as_json: bool) -> int:
        """Remove stale staging left by killed processes: the zoo's staging directories, killed commits and
        partial downloads of processes that are gone."""

        from ..model_zoo import zoo_api

        result = zoo_api.gc(zoo=zoo)
        if as_json:
            _echo_json(result)
        else:
            click.echo(terminal(f"{result['zoo']}: removed {len(result['removed'])} stale entries"))
            for entry in result["removed"]:
                click.echo(terminal(f"  {entry}"))
        return 0

    return gc_cmd


ZOO_COMMANDS = (publish_command, list_command, show_command, pull_command, alias_command, verify_command,
                keygen_command)


@hookimpl
def register_commands(cli):
    import click

    @cli.group("zoo", epilog=examples("cann-export zoo publish resnet_bundle --name resnet50",
                                      "cann-export zoo pull resnet50@prod -o deploy"))
    def zoo_group() -> None:
        """Publish, list, show, pull, alias and verify models in the model zoo."""

    for make in ZOO_COMMANDS:
        zoo_group.add_command(make(click))
    cli.add_command(gc_command(click))
