"""Our side in the peer's environment: a virtualenv holding exactly the peer venv's package versions, plus this
checkout (editable) and the packages only we need, so both tools import the same torch, transformers, onnx,
onnxruntime and torchao. A ratio then measures the two tools, not two transformers releases: the peer pins an
older transformers (optimum-onnx 0.1.0: <4.58), and transformers 5's imports cost ~0.4 CPU-s more per process here;
a package only installed on one side (scipy, which scikit-learn brings to the dev env and transformers imports
with every model when present: ~0.2 s) is another such difference."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SKIPPED = ("optimum", "optimum-onnx")  # the peer itself: our side never imports it


def frozen(venv: Path) -> dict[str, str]:
    """``pip freeze`` of ``venv`` as {normalised name: version}; editable and comment lines left out."""
    out = subprocess.run([str(venv / "bin" / "pip"), "freeze"], capture_output=True, text=True, check=True).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line and not line.startswith(("-e", "#")):
            name, version = line.split("==", 1)
            pins[name.lower().replace("_", "-")] = version
    return pins


def ours_in(peer: Path, venv: Path, repo: Path, install: bool) -> tuple[Path | None, str, list[str]]:
    """(``venv``'s bin directory, how it was found, the packages only our side has), or (None, why not, [])."""
    want = {n: v for n, v in frozen(peer).items() if n not in SKIPPED}
    cli = venv / "bin" / "cann-export"
    if cli.exists():
        have = frozen(venv)
        if all(have.get(n) == v for n, v in want.items()):
            return venv / "bin", "present", sorted(f"{n}=={v}" for n, v in have.items() if n not in want)
    if not install:
        return None, f"{venv} is missing or its versions differ from {peer}'s, and --no-install was given", []
    pins = venv.with_name(venv.name + "-pins.txt")
    try:
        if not (venv / "bin" / "pip").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(want.items())))
        pip = [str(venv / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, "-r", str(pins)], check=True, capture_output=True, text=True, timeout=1800)
        subprocess.run([*pip, "-c", str(pins), "-e", str(repo)], check=True, capture_output=True, text=True,
                       timeout=1800)  # the constraints keep every shared package at the peer's version
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        err = (getattr(e, "stderr", "") or str(e)).strip()
        return None, f"making {venv} failed: {err.splitlines()[-1] if err else e}", []
    have = frozen(venv)
    return venv / "bin", "installed", sorted(f"{n}=={v}" for n, v in have.items() if n not in want)


def add_options(ap: argparse.ArgumentParser, venv: Path) -> None:
    """``--ours-env`` and ``--ours-venv``, the same in every benchmark against a peer."""
    ap.add_argument("--ours-env", choices=("same", "here"), default="same",
                    help="same: our side runs in a venv with the peer venv's package versions plus this checkout "
                         "(--ours-venv), so the ratios compare the tools; here: in this interpreter's environment")
    ap.add_argument("--ours-venv", type=Path, default=venv)


def our_environment(args: argparse.Namespace, repo: Path) -> tuple[Path | None, str] | None:
    """(our side's bin directory, None for this interpreter's; what it is) under ``args.ours_env``, or None (and a
    line saying why nothing is measured) when the same-versions venv cannot be had."""
    if args.ours_env == "here":
        return None, "this environment"
    bin_dir, how, only_ours = ours_in(args.venv, args.ours_venv, repo, not args.no_install)
    if bin_dir is None:
        print(f"skipped: our side's environment is not available ({how}); nothing was measured")
        return None
    return bin_dir, f"{args.ours_venv} ({how}): the peer venv's versions, plus {', '.join(only_ours) or 'nothing'}"
