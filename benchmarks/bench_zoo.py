#!/usr/bin/env python
"""Benchmark the model zoo against the raw operations it wraps, on a ~537 MB model (8 x Linear(4096, 4096)).

* load:    ``cann_export.model_zoo.load_model(NAME)`` (resolve the name in the SQLite index, read the manifest,
           rebuild the module from the recorded ``module:Callable`` + kwargs, load the safetensors weights,
           sha256 of every file it reads)  vs  ``Wide(**kwargs)`` + ``safetensors.torch.load_file`` +
           ``load_state_dict`` of the same file.                                  target: ratio <= 1.2
* publish: ``publish(model=WEIGHTS.safetensors, name=..., model_class=...)`` into a fresh local zoo (hashed copy,
           fsync, card, manifest, SQLite commit)  vs  ``shutil.copyfile`` + ``hashlib.sha256`` of the copy.
                                                                                  target: ratio <= 1.5

Both sides run in this process, alternating order, ``--repeat`` times; medians are reported (page cache
warm on both sides; ``os.sync()`` untimed before each publish-side run, so the plain copy's deferred
writeback is not charged to the zoo's fsync). Results go to ``benchmarks/results/zoo.json``.

Usage::

    python benchmarks/bench_zoo.py [--repeat 5] [--width 4096] [--depth 8]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


class Wide(nn.Module):
    def __init__(self, width: int = 4096, depth: int = 8):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--output", type=Path, default=HERE / "results" / "zoo.json")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))  # the architecture is recorded as bench_zoo:Wide
    from bench_zoo import Wide as ImportableWide
    from safetensors.torch import load_file, save_model

    from cann_export.model_zoo import load_model, publish

    kwargs = {"width": args.width, "depth": args.depth}
    with tempfile.TemporaryDirectory(prefix="bench-zoo-", dir=HERE.parent) as tmp_name:
        tmp = Path(tmp_name)
        weights = tmp / "wide.safetensors"
        torch.manual_seed(0)
        save_model(ImportableWide(**kwargs), str(weights))
        size_mb = weights.stat().st_size / 1e6
        zoo = tmp / "zoo"
        publish(model=str(weights), name="wide", model_class="bench_zoo:Wide", model_kwargs=kwargs, zoo=str(zoo))

        def raw_load() -> None:
            model = ImportableWide(**kwargs)
            model.load_state_dict(load_file(str(weights)))

        def zoo_load() -> None:
            load_model("wide", zoo=str(zoo), allow_modules=["bench_zoo"])  # the recorded callable: allowed

        def raw_publish(i: int) -> None:
            dst = tmp / f"copy{i}" / "wide.safetensors"
            dst.parent.mkdir()
            shutil.copyfile(weights, dst)
            _sha256(dst)

        def zoo_publish(i: int) -> None:
            publish(model=str(weights), name="wide", model_class="bench_zoo:Wide", model_kwargs=kwargs,
                    zoo=str(tmp / f"zoo{i}"))

        times: dict[str, list[float]] = {"raw_load": [], "zoo_load": [], "raw_publish": [], "zoo_publish": []}
        raw_load(), zoo_load()  # warm-up: imports, page cache
        for i in range(args.repeat):
            order = [("raw_load", raw_load), ("zoo_load", zoo_load)]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
            order = [("raw_publish", raw_publish), ("zoo_publish", zoo_publish)]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                os.sync()  # untimed: neither side pays for the other's pending writeback
                t = time.perf_counter()
                fn(i)
                times[name].append(time.perf_counter() - t)
            shutil.rmtree(tmp / f"copy{i}", ignore_errors=True)
            shutil.rmtree(tmp / f"zoo{i}", ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [("load (name -> nn.Module)", med["zoo_load"], med["raw_load"], 1.2),
            ("publish (weights file)", med["zoo_publish"], med["raw_publish"], 1.5)]
    print(f"model: {args.depth} x Linear({args.width}, {args.width}), weights {size_mb:.0f} MB; "
          f"median of {args.repeat} runs")
    print(f"{'operation':<26} {'zoo s':>8} {'raw s':>8} {'ratio':>7} {'target':>7}  verdict")
    for label, z, r, target in rows:
        print(f"{label:<26} {z:8.3f} {r:8.3f} {z / r:7.2f} {target:7.2f}  {'ok' if z / r <= target else 'MISSED'}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"size_mb": size_mb, "repeat": args.repeat, "times": times, "medians": med,
                                       "ratios": {"load": med["zoo_load"] / med["raw_load"],
                                                  "publish": med["zoo_publish"] / med["raw_publish"]}},
                                      indent=2) + "\n")


if __name__ == "__main__":
    main()
