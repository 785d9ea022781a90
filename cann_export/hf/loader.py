"""The Loader of Hugging Face model directories, and its adoption of in-memory transformers models: both give
a LoadedModel whose module is the task's graph (``model.TaskModule``) with ``extras``:

- ``task``: the task's name (Optimum's);
- ``input_names``: Optimum's input names in forward's order;
- ``dynamic_axes``: ``{input name: {axis: Optimum's axis name}}``, the axes the model computes at any size
  (batch, and sequence for text; ``inputs.DEFAULT_DYNAMIC``): the dynamic-shape stage's defaults;
- ``dynamic_ranges``: ``{input name: {axis: [min, max or None]}}``, the sizes those axes may take (raw audio
  from the receptive field, an image's sides from the total stride to twice the example's: ``image_sides``);
- ``static_axes``: the axes Optimum names dynamic that stay fixed, and why (the manifest's ``model.static_axes``);
- ``hf``: task, architecture, model_type, the dummy input specs (``inputs.InputSpec`` dicts), outputs, and
  ``axes``: Optimum's name of every axis of every input and output (``{name: {"0": "batch_size", ...}}``);
- ``output_axes``: ``{output name: {axis: Optimum's axis name}}`` (a traced graph's output dims take those names);
- ``exporter_order``: ``["torchscript", "dynamo"]`` (``EXPORTER_ORDER``), the order the capture stage tries them
  under ``--exporter auto``;
- ``bundle_files``: ``{"hf/NAME": bytes}``, config.json and the tokenizer/processor files (directories only),
  which bundle formats carry and list in the manifest's file table."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..context import LoadedModel
from . import directory_files as hf_files

# Optimum's capture: a TorchScript trace, kept only after the capture stage's trace gate checked it (a trace that
# warned and disagrees on any prepared input set falls back to dynamo); capture/exporter_choice.py. Every task: a float
# input (pixels, audio) adds the four sign-flipped / scaled copies as probes, two forwards more than the random probe
# draws they replace (inputs/stage.py), which the trace's saving outweighs. Measured with torch on one thread (CPU
# seconds are then the work; medians of 2, interleaved): ViT-small at batch 1 16.7 s CPU and 827 MiB traced first
# against 20.3 s and 929 MiB dynamo first; ConvNeXt-tiny 14.6 s / 961 MiB against 16.7 s / 1037 MiB.
EXPORTER_ORDER = ("torchscript", "dynamo")


def _loaded(model: Any, config: dict[str, Any], arch: str, task: Any, sampling_rate: int | None,
            options: Any = None) -> LoadedModel:
    from .dummy_inputs import all_axes, dummy_specs, dynamic_axes, dynamic_ranges, static_axes
    from .model import forward_parameters, task_module

    model_type = str(config.get("model_type", ""))
    wrapped, outputs = task_module(model, task, arch, model_type)
    specs = dummy_specs(forward_parameters(model), config, task.name, sampling_rate)
    hf = {"task": task.name, "architecture": arch, "model_type": model_type, "outputs": list(outputs),
          "dummy_inputs": [s.to_dict() for s in specs], "axes": all_axes(specs, outputs, _batches_of(task, options))}
    from ..inputs.eos_rows import KEY, eos_pooled

    return LoadedModel(wrapped, "module", extras={KEY: eos_pooled(config, task.name),
                                                 "task": task.name, "input_names": [s.name for s in specs],
                                                 "dynamic_axes": dynamic_axes(specs, _batches_of(task, options),
                                                                              config),
                                                 "dynamic_ranges": dynamic_ranges(specs, config), "hf": hf,
                                                 "static_axes": static_axes(specs, config),
                                                 "output_axes": {n: dict(a) for n, a in outputs.items()},
                                                 "exporter_order": list(EXPORTER_ORDER)})


def _batches_of(task: Any, options: Any) -> str | None:
    """The task whose separate batch axes the graph gets: not for a CANN < 8 target, where each combination of
    gears is a profile (hf/inputs._axes_of)."""
    from ..atc.versions import parse_cann_version

    version = getattr(options, "cann_version", None)
    try:
        return task.name if version is None or parse_cann_version(str(version))[0] >= 8 else None
    except (ValueError, TypeError):
        return task.name


def _single_graph(task: Any, path: Any) -> None:
    from ..errors import LoadError

    if task.graphs > 1:
        raise LoadError(f"task {task.name} exports {task.graphs} graphs (decoder with past / encoder-decoder), which "
                        "a single-graph export cannot hold; pass --task feature-extraction (the encoder) or a "
                        "single-graph task of the model", path=path)


class HfDirectoryLoader:
    """A transformers ``save_pretrained`` directory or a hub-cache snapshot (never a download)."""

    name = "hf-directory"
    priority = 60

    def matches(self, path: Path) -> bool:
        return False  # files are other loaders'; directories come through matches_directory

    def matches_directory(self, path: Path) -> bool:
        return hf_files.is_model_directory(path)

    def load(self, path: Path, options: Any) -> LoadedModel:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is first imported (its constants)
        from .config_json import read_config, read_json
        from .model import load_pretrained
        from .tasks import TASKS, detect
        from .weights import checked_weights, stored_elements

        directory, roots = hf_files.resolve(Path(path))
        config_path = hf_files.check_inside(directory / hf_files.CONFIG, roots)
        config = read_config(directory, bool(options.trust_remote_code))
        if "auto_map" in config and not (config.get("architectures") and _known(config["architectures"][0])):
            from ..errors import LoadError

            if options.task is None:
                raise LoadError("config.json's auto_map names remote code, whose task cannot be told from the "
                                "config; pass --task too", path=config_path)
            arch, task = (config.get("architectures") or ["remote"])[0], TASKS.get(options.task)
            if task is None:
                detect(config, options.task, config_path)  # names the valid tasks
        else:  # remote code exports one graph (several load transformers' own classes only): no -with-past default
            arch, task = detect(config, options.task, config_path, with_past="auto_map" not in config)
        _single_graph(task, config_path)
        safetensors, weights = checked_weights(directory, roots, bool(options.trust_pickle))
        carried = hf_files.companions(directory, roots)
        sampling_rate = None
        if (directory / "preprocessor_config.json").exists():
            rate = read_json(directory / "preprocessor_config.json", "preprocessor_config.json").get("sampling_rate")
            sampling_rate = rate if isinstance(rate, int) and 0 < rate <= 1 << 22 else None
        stored = stored_elements(weights) if safetensors else 0
        model = load_pretrained(directory, arch, task, config, safetensors, options, stored)
        loaded = _loaded(model, config, arch, task, sampling_rate, options)
        loaded.extras["bundle_files"] = carried
        loaded.extras["hf"]["directory"] = str(directory)
        loaded.source_sha256 = hf_files.directory_digest(weights, carried)
        return loaded

    def adopt(self, module: Any, options: Any, inputs_given: bool) -> LoadedModel | None:
        """An in-memory transformers model: the same task, names and dummy inputs as its directory would get,
        when the caller gave no inputs or asked for a task (else the module is exported as called)."""
        from ..errors import LoadError
        from .model import for_task, is_pretrained
        from .tasks import detect

        if not is_pretrained(module) or (inputs_given and options.task is None):
            return None
        config = module.config.to_dict()
        config["architectures"] = [type(module).__name__]
        try:  # an in-memory model keeps the single graph by default (several: task=... or kv_cache=...)
            arch, task = detect(config, options.task, f"<in-memory {type(module).__name__}>", with_past=False)
        except LoadError:
            if options.task is not None:
                raise
            return None  # a class of no task (the user's own subclass): exported as called, with its inputs
        _single_graph(task, None)
        return _loaded(for_task(module, task, arch), config, arch, task, None, options)

    def graphs(self, source: Any, options: dict[str, Any]) -> str | None:
        """The multi-graph task of exporting ``source``: a model directory's (``--task`` or detected: a causal LM
        defaults to text-generation-with-past, as in Optimum) or an in-memory transformers model's ``task``;
        ``"auto"`` when only ``kv_cache`` asks for several graphs; None for one graph (or a source not this
        loader's). What cannot be told here the single-graph load refuses with its own message."""
        from ..errors import LoadError
        from .tasks import detect

        task, several = options.get("task"), "auto" if options.get("kv_cache") else None
        if isinstance(source, (str, Path)):
            path = Path(source)
            if not (path.is_dir() and hf_files.is_model_directory(path)):
                return None
            try:
                config, where = _directory_config(path, bool(options.get("trust_remote_code")))
                if "auto_map" in config:
                    return several
                _, found = detect(config, task, where)
            except LoadError:
                return several
            return found.name if found.graphs > 1 else several
        from .model import is_pretrained

        if not is_pretrained(source):
            return None
        return _in_memory_graphs(source, task) or several


def _directory_config(path: Path, trust_remote_code: bool) -> tuple[dict[str, Any], Path]:
    from .config_json import read_config

    directory, roots = hf_files.resolve(path)
    where = hf_files.check_inside(directory / hf_files.CONFIG, roots)
    return read_config(directory, trust_remote_code), where


def _in_memory_graphs(module: Any, task: str | None) -> str | None:
    """``task`` when it exports ``module`` as several graphs (its class decides where a name is both, as
    automatic-speech-recognition is for Whisper and CTC models); None otherwise."""
    from ..errors import LoadError
    from .tasks import detect, graphs_of

    if task is None:
        return None
    config = module.config.to_dict()
    config["architectures"] = [type(module).__name__]
    try:
        _, found = detect(config, task, f"<in-memory {type(module).__name__}>")
    except LoadError:  # a class of no task table: the name decides (the plan then checks the model)
        return task if graphs_of(task) > 1 else None
    return found.name if found.graphs > 1 else None


def _known(arch: str) -> bool:
    from .tasks import known_class

    return known_class(arch)
