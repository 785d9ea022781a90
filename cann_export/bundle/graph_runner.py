"""``cann_export.load(BUNDLE)``: a bundle run back in onnxruntime. The bundle is first checked as ``validate``
checks it without re-running parity (its file table, each graph against its manifest, external data only from
listed files, a multi-graph bundle's connections): nothing the manifest does not list is ever opened.

A one-graph bundle gives a :class:`GraphRunner`, called with the graph's input names as keywords (numpy arrays,
torch tensors or lists) and returning the outputs by name as numpy arrays. A multi-graph bundle gives a
:class:`ComponentsRunner`: each component's GraphRunner by name (``runner["decoder"]`` or ``runner.decoder``).
A bundle kind with a runner of its own (a diffusers pipeline, plan.RUNNERS) gives that runner. Every session is
made while the bundle is open, so a single-file bundle's unpacked copy can go when ``load`` returns."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import OptionsError


class GraphRunner:
    """One graph in an onnxruntime session: ``runner(**inputs) -> {output name: array}``."""

    def __init__(self, graph: Path, name: str, manifest: dict[str, Any], where: Path):
        import onnxruntime as ort

        from ..graph.onnx_helpers import session_options

        opts = session_options(arena=True)
        self.name = name
        self.manifest = manifest
        self.path = where  # the bundle (or component) the graph came from, as the user named it
        self._session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self._dtypes = {i.name: _numpy_dtype(i.type) for i in self._session.get_inputs()}

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"GraphRunner({self.name!r}, inputs={self.input_names}, outputs={self.output_names})"

    def __call__(self, **inputs: Any) -> dict[str, Any]:
        missing = [n for n in self.input_names if n not in inputs]
        unknown = [n for n in inputs if n not in self.input_names]
        if missing or unknown:
            said = ", ".join([*(f"missing {n!r}" for n in missing), *(f"unknown {n!r}" for n in unknown)])
            raise OptionsError(f"{self.name} takes the inputs {', '.join(self.input_names)} as keywords ({said})",
                               path=self.path, stage="run")
        feed = {n: _array(inputs[n], self._dtypes[n]) for n in self.input_names}
        try:
            values = self._session.run(self.output_names, feed)
        except Exception as e:  # onnxruntime's own errors: a wrong rank, a dimension the graph fixed
            raise OptionsError(f"{self.name} refused its inputs ({' '.join(str(e).split())[:400]}); the shapes it "
                               f"takes are in its manifest (model.inputs)", path=self.path, stage="run") from e
        return dict(zip(self.output_names, values, strict=True))


class ComponentsRunner:
    """A multi-graph bundle's components by name: ``runner["decoder"](**inputs)`` or ``runner.decoder(...)``;
    ``connections`` says which output feeds which input, as the manifest records it."""

    def __init__(self, runners: dict[str, GraphRunner], manifest: dict[str, Any], where: Path):
        self._runners = runners
        self.manifest = manifest
        self.path = where
        self.kind = manifest.get("kind")
        self.connections = list(manifest.get("connections") or [])

    @property
    def components(self) -> list[str]:
        return list(self._runners)

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"ComponentsRunner({self.kind!r}, components={self.components})"

    def __getitem__(self, name: str) -> GraphRunner:
        if name not in self._runners:
            raise KeyError(f"{name!r} is not a component of this bundle; it has {', '.join(self._runners)}")
        return self._runners[name]

    def __getattr__(self, name: str) -> GraphRunner:
        runners = self.__dict__.get("_runners") or {}
        if name in runners:
            return runners[name]
        raise AttributeError(f"{name!r} is not a component of this bundle; it has {', '.join(runners)}")

    def __contains__(self, name: object) -> bool:
        return name in self._runners

    def __iter__(self) -> Any:
        return iter(self._runners)


def load(bundle: str | os.PathLike[str], **options: Any) -> Any:
    """The runner of the bundle at ``bundle`` (a directory or a single-file bundle); ``options`` go to a kind's
    own runner (a pipeline's ``device=True``) and are refused for graphs."""
    from ..errors import ValidateError
    from .multi_check import opened_multi

    path = Path(bundle)
    if not path.exists():
        raise OptionsError("no such bundle; pass the directory or single file an export wrote", path=path,
                           stage="load")
    try:
        with opened_multi(path) as directory:
            if directory is not None:
                return _load_multi(directory, path, options)
        return _load_one(path, options)
    except ValidateError as e:
        e.stage = "load"
        raise


def _load_one(path: Path, options: dict[str, Any]) -> GraphRunner:
    from .read import open_bundle
    from .rederive import check_bundle

    _no_options(options, path)
    with open_bundle(path) as (directory, container):
        if directory == path and path.is_file():
            raise OptionsError("not a bundle cann_export.load can run (a bundle directory, a single-file bundle "
                               "such as x.pth, or an om-stub an export wrote)", path=path, stage="load")
        checked = check_bundle(directory, container=container, stage="load")
        manifest = checked.manifest
        return GraphRunner(directory / manifest["model"]["file"], path.name, manifest, path)


def _load_multi(directory: Path, path: Path, options: dict[str, Any]) -> Any:
    from ..plan import runner_module
    from .multi_check import check_multi
    from .rederive import BundleMismatchError, check_bundle

    manifest, diffs = check_multi(directory)
    checked = {}
    for c in manifest["components"] if not diffs else []:
        one = check_bundle(directory / c["path"], raise_on_difference=False)
        diffs += [f"{c['path']}: {d}" for d in one.differences]
        checked[c["name"]] = one.manifest
    if diffs:
        raise BundleMismatchError(diffs, path=path, stage="load")
    own = runner_module(manifest.get("kind"))
    if own is not None:  # a diffusers pipeline: called like the pipeline (diffusion/bundle_runner.py)
        return own.runner(directory, manifest, path, **options)
    _no_options(options, path)
    runners = {c["name"]: GraphRunner(directory / c["path"] / checked[c["name"]]["model"]["file"], c["name"],
                                      checked[c["name"]], path / c["path"]) for c in manifest["components"]}
    return ComponentsRunner(runners, manifest, path)


def _no_options(options: dict[str, Any], path: Path) -> None:
    if options:
        raise OptionsError(f"cann_export.load takes no {', '.join(sorted(options))} for this bundle (only a "
                           "pipeline bundle's runner takes device=)", path=path, stage="load")


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
              "tensor(bool)": "bool", "tensor(bfloat16)": None}


def _numpy_dtype(ort_type: str) -> Any:
    import numpy as np

    name = _ORT_TYPES.get(ort_type)
    return np.dtype(name) if name else None


def _array(value: Any, dtype: Any) -> Any:
    """``value`` (a torch tensor, an array, a list) as the numpy array of the graph input's type."""
    import numpy as np

    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    return array.astype(dtype, copy=False) if dtype is not None and array.dtype != dtype else array
