"""A diffusers pipeline directory (``save_pretrained`` or a hub-cache snapshot: ``model_index.json`` at its top),
read as untrusted: model_index.json bounded and strict, its pipeline class and every part's class allow-listed
(diffusers' and transformers' own classes in ``table.ALLOWED``; no remote code), every part's folder and each text
encoder's tokenizer present, weights in safetensors; then loaded offline with diffusers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import LoadError
from .files import MODEL_INDEX, PART, read_json
from .known_pipelines import ALLOWED, OPTIONAL_PARTS, PIPELINES, components_of, tokenizer_of

EXTRA = "pip install 'cann-export[diffusers]'"
TOKENIZER_MARKS = ("tokenizer.json", "vocab.json", "spiece.model")


MAX_ENTRIES = 20000  # files and folders of one pipeline directory walked for links (a real one has < 200)


def is_pipeline_directory(path: Any) -> bool:
    """A directory with model_index.json, or a hub cache's ``models--org--name`` folder whose snapshot has one."""
    if not isinstance(path, (str, Path)) or not Path(path).is_dir():
        return False
    path = Path(path)
    if (path / MODEL_INDEX).is_file() or (path / MODEL_INDEX).is_symlink():
        return True
    if path.name.startswith("models--") and (path / "snapshots").is_dir():
        from ..hf.directory_files import snapshot

        try:
            return (snapshot(path) / MODEL_INDEX).exists()
        except LoadError:
            return False
    return False


def pipeline_directory(path: Path) -> tuple[Path, list[Path]]:
    """(the directory holding model_index.json, the roots its files may resolve into): ``path``, or the snapshot
    refs/main names in a hub cache's repo folder; a snapshot's files are links into the cache's ``blobs/``. A link
    anywhere else (or a linked folder, which a hub cache never makes) is refused before anything is read."""
    from ..hf.directory_files import roots_of, snapshot

    directory = path
    if not (path / MODEL_INDEX).exists() and not (path / MODEL_INDEX).is_symlink() and (path / "snapshots").is_dir():
        directory = snapshot(path)
    roots = roots_of(directory)
    _check_links(directory, roots)
    return directory, roots


def _check_links(directory: Path, roots: list[Path]) -> None:
    """Every link under ``directory`` is a file link resolving inside ``roots`` (bounded walk)."""
    import os

    from ..hf.directory_files import check_inside

    seen = 0
    for top, folders, files in os.walk(directory, followlinks=False):
        seen += len(folders) + len(files)
        if seen > MAX_ENTRIES:
            raise LoadError(f"the pipeline directory holds more than {MAX_ENTRIES} files and folders, far past any "
                            "pipeline's; refused. Pass the pipeline's own directory", path=directory)
        for name in folders:
            if (Path(top) / name).is_symlink():
                raise LoadError(f"{name}/ is a linked folder, which neither save_pretrained nor a hub cache makes; "
                                "refused unread. Copy the folder into the pipeline directory", path=Path(top) / name)
        for name in files:
            if (Path(top) / name).is_symlink():
                check_inside(Path(top) / name, roots)


def read_index(path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """(the pipeline class, ``{part: (library, class)}``) of the pipeline directory ``path``'s model_index.json
    (pipeline_directory), every name checked."""
    _, cls, parts, _ = checked_index(path)
    return cls, parts


def checked_index(path: Path) -> tuple[Path, str, dict[str, tuple[str, str]], dict[str, Any]]:
    """(the directory holding model_index.json, the pipeline class, the parts exported, the whole index) of the
    pipeline directory ``path`` (read_index)."""
    from ..fs.regular import check_regular_file

    directory, _ = pipeline_directory(path)
    where = directory / MODEL_INDEX
    check_regular_file(where, MODEL_INDEX, "it must be a regular file (or a hub cache's link to one)", LoadError)
    index = read_json(where, MODEL_INDEX)
    cls = index.get("_class_name")
    if not isinstance(cls, str) or cls not in PIPELINES:
        raise LoadError(f"model_index.json names the pipeline class {str(cls)[:80]!r}, which this tool does not "
                        f"export; it exports {', '.join(PIPELINES)}. Export the pipeline's modules one by one from "
                        "Python (cann_export.export(pipe.transformer, ...))", path=where)
    parts: dict[str, tuple[str, str]] = {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list):
            continue
        if entry in ([None, None], [None]) or (len(entry) == 2 and entry[1] is None) or name in OPTIONAL_PARTS:
            continue  # an optional part is left out of the export and never loaded (load_pipeline passes None)
        library, klass = (entry + [None, None])[:2]
        if not (isinstance(name, str) and PART.fullmatch(name)):
            raise LoadError(f"model_index.json names a part {str(name)[:64]!r}, not a folder name save_pretrained "
                            "writes (lower-case letters, digits, _); restore the pipeline's own model_index.json",
                            path=where)
        if not (isinstance(library, str) and isinstance(klass, str)) or library not in ALLOWED \
                or klass not in ALLOWED[library]:
            raise LoadError(f"model_index.json's part {str(name)[:64]!r} names {str(library)[:40]}.{str(klass)[:80]}, "
                            "not a diffusers or transformers class this tool loads (no remote code is run); use a "
                            f"pipeline whose parts are {', '.join(sorted(set().union(*ALLOWED.values())))}",
                            path=where)
        parts[name] = (library, klass)
    _check_parts(directory, cls, parts, index)
    return directory, cls, parts, index


def _check_parts(directory: Path, cls: str, parts: dict[str, tuple[str, str]], index: dict[str, Any]) -> None:
    encoders, denoiser = PIPELINES[cls]
    for name in (*encoders, denoiser, "vae", "scheduler"):
        folder = directory / name
        if name not in parts and index.get(name) in ([None, None], [None]):  # dropped on purpose (SD3 without T5)
            raise LoadError(f"model_index.json sets {name} to null: the pipeline was saved without it (as diffusers "
                            f"suggests for SD3's T5, to save memory). This tool exports every part of a {cls} "
                            f"({', '.join(components_of(cls))}) and checks the assembled loop, so a pipeline without "
                            f"{name} is not exported; save it with its {name} (load it without passing {name}=None) "
                            "or copy the folder and its model_index.json entry from the model's snapshot",
                            path=directory / "model_index.json")
        if name not in parts or not folder.is_dir() or folder.is_symlink():
            raise LoadError(f"the diffusers pipeline {cls} has no {name}/ folder listed in model_index.json; it "
                            f"exports {', '.join(components_of(cls))}. Save the whole pipeline "
                            "(pipe.save_pretrained(DIR)) or copy the folder from the model's snapshot", path=folder)
        if name != "scheduler" and not any(p.suffix == ".safetensors" and p.is_file() for p in folder.iterdir()):
            raise LoadError(f"{name}/ holds no .safetensors weights (pickled .bin weights are not loaded); save "
                            "the pipeline with pipe.save_pretrained(DIR, safe_serialization=True)", path=folder)
    for enc in encoders:
        tok = tokenizer_of(enc)
        folder = directory / tok
        if tok not in parts or not folder.is_dir() or not any((folder / m).is_file() for m in TOKENIZER_MARKS):
            raise LoadError(f"the tokenizer of {enc} is missing: {tok}/ with tokenizer.json (or vocab.json / "
                            "spiece.model) is not in the pipeline directory, and nothing is downloaded. Copy "
                            f"{tok}/ from the model's snapshot, or save the pipeline with its tokenizers "
                            "(pipe.save_pretrained(DIR))", path=folder)


def diffusers_module() -> Any:
    """diffusers, or a refusal naming the extra that installs it."""
    try:
        import diffusers
    except ImportError as e:
        raise LoadError(f"a diffusers pipeline directory (model_index.json) needs diffusers, which is not "
                        f"installed; {EXTRA}") from e
    return diffusers


def load_pipeline(path: Path) -> tuple[Any, bytes]:
    """The checked pipeline of ``path``, loaded offline in fp32 on the CPU, and its model_index.json bytes."""
    import os

    import torch

    from .parts import check_assembled, check_files, load_parts

    directory, cls, parts, index = checked_index(path)
    left_out = {p: None for p in OPTIONAL_PARTS if isinstance(index.get(p), list) and any(index[p])}
    diffusers = diffusers_module()
    os.environ["HF_HUB_OFFLINE"] = "1"
    check_files(directory, parts)
    models = load_parts(directory, parts)  # each checked against its weight files; diffusers loads the rest
    try:  # an optional part (SD's safety checker) is passed as None: never imported nor loaded
        pipe = getattr(diffusers, cls).from_pretrained(str(directory), local_files_only=True, use_safetensors=True,
                                                       torch_dtype=torch.float32, **left_out, **models)
    except Exception as e:  # noqa: BLE001 - any failure of diffusers' load of the user's directory
        raise LoadError(f"diffusers could not load the {cls}: {type(e).__name__}: {str(e)[:300]}. Check the "
                        "directory is a complete pipeline saved with save_pretrained", path=directory) from e
    check_assembled(pipe, directory)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to("cpu"), (directory / MODEL_INDEX).read_bytes()
