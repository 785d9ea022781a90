"""Where a multi-graph export of a model directory starts (which calls are multi-graph, the loaders declare:
``Loader.graphs``, asked by ``api.graphs``): a Hugging Face model directory loaded with the hf package's checks
(its config read within bounds, the task detected from it, safetensors only unless --trust-pickle, files inside
the directory, no remote code unless allowed), the config and tokenizer files carried into the bundle."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import LoadError, OptionsError
from .graph_plans import DECODER_TASKS, SEQ2SEQ_TASKS

# Optimum's tasks this package exports as several graphs (the hf task table marks them graphs > 1)
SUPPORTED = (*DECODER_TASKS, *SEQ2SEQ_TASKS)


def load_directory(path: Path, task: str | None, options: dict[str, Any]) -> tuple[Any, str, dict[str, bytes]]:
    """(the transformers model, its task, the files to carry) for a model directory."""
    from types import SimpleNamespace

    from . import directory_files as hf_files
    from .config_json import read_config
    from ..hf.model import load_pretrained
    from ..hf.tasks import TASKS, detect
    from ..hf.weights import checked_weights

    directory, roots = hf_files.resolve(Path(path))
    config_path = hf_files.check_inside(directory / hf_files.CONFIG, roots)
    trust_remote = bool(options.get("trust_remote_code"))
    config = read_config(directory, trust_remote)
    if "auto_map" in config:
        raise LoadError("config.json's auto_map names remote code; a multi-graph export loads only transformers' "
                        "own classes. Export the model from Python (cann_export.export_multi(model, ...))",
                        path=config_path)
    arch, found = detect(config, task, config_path)
    if found.name == "text-generation":  # asked for several graphs (--kv-cache): the decoder with its cache
        found = TASKS["text-generation-with-past"]
    if found.name not in SUPPORTED:
        raise OptionsError(f"task {found.name} of {arch} does not export as several graphs here yet; supported: "
                           f"{', '.join(SUPPORTED)} (or --task with a single-graph task)", path=config_path)
    safetensors, _ = checked_weights(directory, roots, bool(options.get("trust_pickle")))
    carried = hf_files.companions(directory, roots)
    opts = SimpleNamespace(trust_remote_code=False, trust_pickle=bool(options.get("trust_pickle")), task=found.name)
    model = load_pretrained(directory, arch, found, config, safetensors, opts)
    return model, found.name, carried
