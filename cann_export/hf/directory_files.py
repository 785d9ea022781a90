"""Which directory a path names (a ``save_pretrained`` directory, a hub-cache snapshot or the cache's
``models--org--name`` folder), that every file read from it stays inside it (a snapshot's links may point into
the cache's ``blobs/``, nothing else), and the tokenizer / processor / generation files that travel into the
bundle (an allow-list, bounded sizes, read once into memory)."""
from __future__ import annotations

import os

import re
from pathlib import Path

from ..errors import LoadError

CONFIG = "config.json"
DIFFUSERS = "model_index.json"
# the files besides the weights that a deployment needs to turn text/images/audio into the graph's inputs
COMPANIONS = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "preprocessor_config.json", "processor_config.json", "chat_template.jinja",
    "chat_template.json", "normalizer.json",
)
MAX_COMPANION = 32 << 20
MAX_COMPANIONS_TOTAL = 64 << 20
BUNDLE_FOLDER = "hf"
_COMMIT = re.compile(r"[0-9a-f]{40}")


WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def is_model_directory(path: Path) -> bool:
    """A directory this package reads (or refuses with its own reasons): config.json, model_index.json or
    transformers' weight files in it, or a hub-cache repo folder."""
    return path.is_dir() and (any((path / n).exists() for n in (CONFIG, DIFFUSERS, *WEIGHT_NAMES))
                              or ((path / "snapshots").is_dir() and path.name.startswith("models--")))


def resolve(path: Path) -> tuple[Path, list[Path]]:
    """(the directory holding config.json, the roots its files may resolve into). A diffusers pipeline and a
    directory with no config.json are refused here."""
    directory = path
    if not (path / CONFIG).exists() and (path / "snapshots").is_dir():
        directory = snapshot(path)
    if (directory / DIFFUSERS).exists() and not (directory / CONFIG).exists():
        raise LoadError("this is a diffusers pipeline (model_index.json), which exports as one bundle of its "
                        "components through `cann-export DIR` or cann_export.export(DIR), not as one transformers "
                        "model. Export one component's directory that has a config.json (e.g. unet/ or "
                        "text_encoder/) to get that graph alone",
                        path=directory / DIFFUSERS)
    if (directory / CONFIG).is_symlink() and not (directory / CONFIG).exists():
        raise LoadError("config.json is a link that leads nowhere (dangling, or a loop); copy the model's real "
                        "config.json into the directory", path=directory / CONFIG)
    if not (directory / CONFIG).exists():
        raise LoadError("is a directory but not a transformers model: there is no config.json. Pass a directory "
                        "written by save_pretrained (config.json + model.safetensors), a hub-cache snapshot, or a "
                        "model file (.pt2, .pt, .pth, .safetensors)", path=directory)
    return directory, roots_of(directory)


def roots_of(directory: Path) -> list[Path]:
    """The roots a model directory's files may resolve into: the directory, and a hub-cache snapshot's ``blobs/``."""
    roots = [directory.resolve()]
    lexical = Path(os.path.abspath(directory))  # a relative path (run inside the repo folder) has no parents
    hub = lexical.parent.name == "snapshots" and lexical.parent.parent.resolve().name.startswith("models--")
    if hub:  # hub cache: models--org--name/snapshots/<hash>/ links to ../../blobs
        if directory.is_symlink() or roots[0].parent != directory.parent.resolve():
            raise LoadError(f"the hub-cache snapshot {directory.name} is a link (to {str(roots[0])[:200]}), which a "
                            "hub cache never makes: its files could lie anywhere; refused unread. Pass the real "
                            "model directory", path=directory)
        blobs = _blobs(lexical.parent.parent)
        if blobs is not None:
            roots.append(blobs)
    return roots


def _blobs(repo: Path) -> Path | None:
    """The resolved ``blobs`` folder of a hub-cache repo folder, when there is one: a real folder directly in the
    repo folder. A ``blobs`` link (to ``/`` it would let a snapshot's links reach any file) is refused."""
    blobs = repo / "blobs"
    if not blobs.is_symlink() and not blobs.exists():
        return None
    real = blobs.resolve()
    if blobs.is_symlink() or not real.is_dir() or real.parent != repo.resolve():
        raise LoadError(f"the hub-cache folder's blobs is a link or lies elsewhere (it resolves to {str(real)[:200]}), "
                        "so the snapshot's links could reach any file; refused unread. Use a real hub cache, or copy "
                        "the snapshot's files into a plain directory", path=blobs)
    return real


def snapshot(repo: Path) -> Path:
    """The snapshot ``refs/main`` names in a hub-cache repo folder, else its only snapshot."""
    ref = repo / "refs" / "main"
    if ref.is_file():
        with ref.open("rb") as f:
            commit = f.read(64).decode("ascii", "replace").strip()
        if _COMMIT.fullmatch(commit) and (repo / "snapshots" / commit).is_dir():
            return repo / "snapshots" / commit
    found = sorted(p for p in (repo / "snapshots").iterdir() if p.is_dir() and _COMMIT.fullmatch(p.name))
    if len(found) != 1:
        raise LoadError(f"the hub-cache folder has {len(found)} snapshots and refs/main names none of them; pass the "
                        "snapshot directory itself (models--org--name/snapshots/<commit>)", path=repo)
    return found[0]


def check_inside(path: Path, roots: list[Path]) -> Path:
    """``path`` when it (after links) lies inside one of ``roots``; a link out of the model directory is refused,
    so no file elsewhere on the machine is read or carried into a bundle."""
    try:
        real = path.resolve(strict=path.is_symlink())
    except (OSError, RuntimeError) as e:  # a link loop, or a link to nothing
        raise LoadError(f"{path.name} is a link that leads nowhere (dangling, or a loop); copy the real file into "
                        "the directory", path=path) from e
    if not any(real == r or r in real.parents for r in roots):
        raise LoadError(f"{path.name} links outside the model directory (to {str(real)[:200]}); refused unread. "
                        "Copy the real file into the directory", path=path)
    return path


def companions(directory: Path, roots: list[Path]) -> dict[str, bytes]:
    """The allow-listed companion files of ``directory``, as ``{"hf/NAME": bytes}`` (each bounded)."""
    from ..fs.regular import check_regular_file

    out: dict[str, bytes] = {}
    total = 0
    for name in COMPANIONS:
        path = directory / name
        if not path.exists() and not path.is_symlink():
            continue
        check_inside(path, roots)  # a link that dangles or loops is refused by name, never skipped
        check_regular_file(path, name, "it must be a regular file; re-save the model with save_pretrained")
        with path.open("rb") as f:
            data = f.read(MAX_COMPANION + 1)
        if len(data) > MAX_COMPANION:
            raise LoadError(f"{name} is larger than {MAX_COMPANION >> 20} MB, far past any real {name}; refused. "
                            "Remove it from the directory or replace it with the model's own file", path=path)
        if name.endswith(".json"):
            _check_json(path, data)
        total += len(data)
        if total > MAX_COMPANIONS_TOTAL:
            raise LoadError(f"the tokenizer/processor files add up to more than {MAX_COMPANIONS_TOTAL >> 20} MB; "
                            f"refused at {name}. Keep only the model's own files in the directory", path=path)
        out[f"{BUNDLE_FOLDER}/{name}"] = data
    return out


def _check_json(path: Path, data: bytes) -> None:
    """A companion .json file carried into the bundle is strict JSON (no NaN / Infinity, no key twice), as every
    JSON file in a bundle is."""
    from ..fs.jsonio import loads_strict

    try:
        loads_strict(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        why = "nests too deeply" if isinstance(e, RecursionError) else str(e)[:160]
        raise LoadError(f"{path.name} is not strict JSON ({why}); a bundle carries only RFC 8259 JSON. Restore the "
                        "model's own file or re-save it with save_pretrained", path=path) from e


def directory_digest(files: list[Path], carried: dict[str, bytes]) -> str:
    """sha256 over the names and sha256s of the files the export read (weights) and carried (config, tokenizer)."""
    from ..fs.digests import sha256_bytes, sha256_file

    lines = [f"{p.name} {sha256_file(p)}" for p in files] + [f"{n} {sha256_bytes(d)}" for n, d in carried.items()]
    return sha256_bytes("\n".join(sorted(lines)).encode())
