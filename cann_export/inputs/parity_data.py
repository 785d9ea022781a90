"""``--parity-data FILE``: real input samples for parity (safetensors or .npz, never pickle).

The file names its tensors after the forward's inputs, in one of two layouts:

- ``NAME`` with a leading sample dimension: shape ``[N, *example_shape]`` gives N samples; a tensor of
  the example's rank whose first dimension is a multiple of the example's batch (``[N * B, ...]``) is
  cut into N batches of B rows;
- ``S/NAME`` keys (``0/input_ids``, ``1/input_ids``, ...), one tensor per sample, as the bundle's
  parity/inputs.safetensors stores them.

Every sample must give every input the example gives, with the example's shape (graphs are static). Parity
runs every sample: a file of more than ``MAX_SAMPLES`` samples is refused from its headers, before its arrays are
allocated (each array may hold at most ``MAX_SAMPLES`` times the largest example input's elements)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import PrepareError

MAX_SAMPLES = 1024  # parity keeps every sample's inputs and outputs: ~18 KB each for a 12-feature MLP
_SAMPLE_KEY = re.compile(r"^(\d+)/(.+)$")
_LAYOUT = ("name the tensors after the forward's inputs, each with a leading sample dimension "
           "[N, *input_shape], or as N/NAME keys, one per sample")


def read_tensors(path: Path, max_elements: int | None = None) -> dict[str, Any]:
    """Named tensors of a .safetensors or .npz file (a regular file; no pickle; bounded, see load/tensor_files.py), each
    of at most ``max_elements`` elements, checked from the file's header before anything is allocated."""
    from ..load.tensor_files import check_input_file, read_npz_tensors

    check_input_file(path, "--parity-data", PrepareError)
    if path.suffix == ".npz":
        return read_npz_tensors(path, "--parity-data", max_elements=max_elements)
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), "pt") as f:
            shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
    except Exception as e:  # safetensors raises its own types for corrupt headers
        raise PrepareError(f"cannot read parity data ({type(e).__name__}: {e}); write it with "
                           "safetensors.torch.save_file or numpy.savez", path=path) from e
    if max_elements is not None:
        _check_elements(shapes, max_elements, path)
    try:
        return dict(load_file(str(path)))
    except Exception as e:  # numpy / safetensors raise their own types for corrupt files
        raise PrepareError(f"cannot read parity data ({type(e).__name__}: {e}); write it with "
                        "safetensors.torch.save_file or numpy.savez", path=path) from e


def _check_elements(shapes: dict[str, list[int]], max_elements: int, path: Path) -> None:
    import math

    for key, shape in shapes.items():
        if math.prod(shape) > max_elements:
            raise PrepareError(f"--parity-data: tensor {key[:80]!r} of shape {list(shape)[:8]} holds more than "
                               f"{max_elements} elements ({MAX_SAMPLES} samples of the largest input); parity runs "
                               f"every sample, pass at most {MAX_SAMPLES}", path=path)


def _too_many(count: int, path: Path) -> PrepareError:
    return PrepareError(f"the parity data holds {count} samples, more than the {MAX_SAMPLES} parity runs (it keeps "
                        f"every sample's inputs and outputs); pass a subset of at most {MAX_SAMPLES} samples",
                        path=path)


def read_parity_data(path: str | Path, example: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples of ``path`` as input sets shaped and typed like ``example``."""
    path = Path(path)
    largest = max((int(t.numel()) for t in example.values()), default=1)
    tensors = read_tensors(path, MAX_SAMPLES * max(largest, 1))
    if not tensors:
        raise PrepareError(f"the parity data holds no tensors; {_LAYOUT}", path=path)
    keyed: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        if m := _SAMPLE_KEY.match(key):
            keyed.setdefault(int(m.group(1)), {})[m.group(2)] = t
    if len(keyed) > MAX_SAMPLES:
        raise _too_many(len(keyed), path)
    samples = [keyed[i] for i in sorted(keyed)] if keyed else _split(tensors, example, path)
    out = []
    for i, sample in enumerate(samples):
        missing = [n for n in example if n not in sample]
        if missing:
            raise PrepareError(f"parity data sample {i} lacks input(s) {', '.join(missing)}; {_LAYOUT}", path=path)
        one = {}
        for name, ref in example.items():
            t = sample[name]
            if tuple(t.shape) != tuple(ref.shape):
                raise PrepareError(f"parity data sample {i}: {name} has shape {list(t.shape)}, the graph takes "
                                f"{list(ref.shape)}; {_LAYOUT}", path=path)
            one[name] = t.to(ref.dtype)
        out.append(one)
    return out


def _split(tensors: dict[str, Any], example: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    counts, chunks = {}, {}
    for name, ref in example.items():
        if name not in tensors:
            raise PrepareError(f"parity data has no tensor {name!r} (it has {', '.join(sorted(tensors))}); {_LAYOUT}",
                            path=path)
        t, shape = tensors[name], tuple(ref.shape)
        if t.dim() == len(shape) + 1 and tuple(t.shape[1:]) == shape:
            if t.shape[0] > MAX_SAMPLES:
                raise _too_many(int(t.shape[0]), path)
            chunks[name] = list(t.unbind(0))
        elif (t.dim() == len(shape) and shape and tuple(t.shape[1:]) == shape[1:]
              and t.shape[0] % shape[0] == 0 and t.shape[0] > 0):
            if t.shape[0] // shape[0] > MAX_SAMPLES:
                raise _too_many(int(t.shape[0] // shape[0]), path)
            chunks[name] = list(t.split(shape[0], dim=0))
        else:
            raise PrepareError(f"parity data {name} has shape {list(t.shape)}; for inputs of shape {list(shape)} "
                            f"give [N, {', '.join(map(str, shape))}]; {_LAYOUT}", path=path)
        counts[name] = len(chunks[name])
    if len(set(counts.values())) != 1:
        raise PrepareError("parity data inputs hold different numbers of samples ("
                        + ", ".join(f"{n}: {c}" for n, c in counts.items()) + ")", path=path)
    n = next(iter(counts.values()))
    return [{name: chunks[name][i] for name in chunks} for i in range(n)]


def read_bundle_parity(bundle: Path, manifest: dict[str, Any]) -> tuple[list, list, dict]:
    """The inputs, reference outputs and recorded tolerance a bundle stored for re-running its parity."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from ..errors import ValidateError
    from ..options import Tolerance

    inputs_file, expected_file = bundle / "parity" / "inputs.safetensors", bundle / "parity" / "expected.safetensors"
    if not inputs_file.is_file() or not expected_file.is_file():
        raise ValidateError("the bundle holds no parity data (it was exported with --no-validate); "
                                   "export again with validation to get re-runnable parity", path=bundle)
    try:
        with safe_open(str(inputs_file), "np") as f:
            meta = f.metadata() or {}
        names_in, names_out, sets = meta["inputs"].split(","), meta["outputs"].split(","), int(meta["sets"])
        ins, outs = load_file(str(inputs_file)), load_file(str(expected_file))
        feeds = [{n: ins[f"{s}/{n}"] for n in names_in} for s in range(sets)]
        expected = [[outs[f"{s}/{n}"] for n in names_out] for s in range(sets)]
    except Exception as e:
        raise ValidateError(f"the parity data is unreadable ({type(e).__name__}: {e}); the bundle is damaged, "
                                   "export it again", path=bundle) from e
    tol = dict((manifest.get("parity") or {}).get("tolerance") or Tolerance().to_dict())
    device_tol = ((manifest.get("parity") or {}).get("device") or {}).get("tolerance") or {}
    tol.update({f"device_{k}": v for k, v in device_tol.items()})  # the summary keeps the two policies apart
    tol = {k: v for k, v in tol.items() if k in Tolerance.__dataclass_fields__}
    return feeds, expected, tol


def _stored_json(bundle: Path, key: str) -> Any:
    """One JSON field of the parity inputs' metadata (labels, noise, int8_noise), or None when absent or
    unreadable (read_bundle_parity has already named a damaged file); the caller checks its shape."""
    import json

    from safetensors import safe_open

    try:
        with safe_open(str(bundle / "parity" / "inputs.safetensors"), "np") as f:
            return json.loads((f.metadata() or {}).get(key, "null"))
    except Exception:
        return None


def read_bundle_noise(bundle: Path, sets: int) -> list[list[float] | None] | None:
    """The reference's fp32-vs-float64 distances the bundle stored (per set, per output; None per set where
    not measured), or None when absent or malformed (then the fp32 floor is relative to the output's peak)."""
    import math

    noise = _stored_json(bundle, "noise")
    ok = isinstance(noise, list) and len(noise) == sets and all(
        row is None or (isinstance(row, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      and math.isfinite(v) and v >= 0 for v in row))
        for row in noise)
    return noise if ok else None


def read_bundle_float_outputs(bundle: Path, expected: list[list[Any]]) -> list[list[Any]] | None:
    """The float model's outputs a Q/DQ bundle stored beside its fake-quant reference (``float/<set>/<output>``
    in expected.safetensors), or None when absent or not shaped as ``expected``."""
    from safetensors import safe_open

    try:
        with safe_open(str(bundle / "parity" / "expected.safetensors"), "np") as f:
            meta = f.metadata() or {}
            names, keys = meta["outputs"].split(","), set(f.keys())
            wanted = [[f"float/{s}/{n}" for n in names] for s in range(len(expected))]
            if not all(k in keys for row in wanted for k in row):
                return None
            out = [[f.get_tensor(k) for k in row] for row in wanted]
    except Exception:  # read_bundle_parity has already named a damaged file
        return None
    same = all(len(o) == len(e) and all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(o, e, strict=True))
               for o, e in zip(out, expected, strict=True))
    return out if same else None


def read_bundle_int8_noise(bundle: Path, sets: int) -> list[list[dict[str, float]] | None] | None:
    """The fake-quant reference's own rounding noise the bundle stored (inputs/quant_noise.py), or None when
    absent or malformed (then a Q/DQ graph is judged by the step rule alone)."""
    from .quant_noise import well_formed

    noise = _stored_json(bundle, "int8_noise")
    return noise if well_formed(noise, sets) else None


def read_bundle_labels(bundle: Path, sets: int) -> list[dict[str, Any]] | None:
    """What each stored parity input set is (inputs.tensors.set_label), or None when the bundle predates the
    labels or they do not describe ``sets`` sets (then every set decides, as it did)."""
    labels = _stored_json(bundle, "labels")
    ok = (isinstance(labels, list) and len(labels) == sets
          and all(isinstance(x, dict) and x.get("role") in ("verdict", "probe") and isinstance(x.get("kind"), str)
                  and isinstance(x.get("source"), str) for x in labels))
    return [{"index": s, "source": x["source"], "kind": x["kind"], "role": x["role"], **_shape(x)}
            for s, x in enumerate(labels)] if ok else None


def _shape(label: dict[str, Any]) -> dict[str, Any]:
    """A set's dynamic-axis sizes (inputs.dynamic_axes.shape_sets), kept when well formed."""
    shape = label.get("shape")
    good = (isinstance(shape, dict) and len(shape) <= 64 and all(isinstance(k, str) and type(v) is int and v > 0
                                                                 for k, v in shape.items()))
    return {"shape": dict(shape)} if good else {}
