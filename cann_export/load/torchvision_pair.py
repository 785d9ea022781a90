"""A torchvision that is installed but does not import beside this torch. PyPI's torchvision links its C++ ops
against PyPI's (CUDA) torch: beside another build of the same version (the CPU one) ``import torchvision`` fails
with ``operator torchvision::nms does not exist``. transformers imports torchvision whenever it is installed, so
one mismatched pair would fail every Hugging Face load, though almost no model uses torchvision.

``hide_broken_torchvision`` tries the import once per process, before the tool's first import of transformers.
When it fails, torchvision is hidden for the rest of the process (``sys.modules["torchvision"] = None``: then
``importlib.util.find_spec`` answers None, which transformers' ``is_torchvision_available`` reads) and one
warning line names the versions and the pair to install. A model that does need torchvision (its class lives in
torchvision or timm, or its load imports it) then fails to import it: ``refusal`` turns that failure into a
LoadError naming the pair."""
from __future__ import annotations

import sys
from typing import Any

from .. import errors

_checked = False
_note: str | None = None  # the warning of this process, once torchvision was hidden
# transformers' cached answers, read again after torchvision was hidden (transformers was imported first)
_TRANSFORMERS_CACHES = ("is_torchvision_available", "is_torchvision_v2_available", "is_torchvision_greater_or_equal",
                        "is_timm_available")


def hide_broken_torchvision() -> str | None:
    """The warning line when torchvision is installed but does not import (then hidden for this process); None
    when it is absent, imports, or was imported before. Tried once per process."""
    global _checked, _note
    if _checked:
        return _note
    _checked = True
    if "torchvision" in sys.modules:  # imported already (it works), or hidden by the caller
        return None
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure (missing operator, undefined symbol): the pair is broken
        _hide()
        _note = _warning(e)
    return _note


def hidden() -> str | None:
    """This process's warning when torchvision was hidden, else None."""
    return _note


def refusal(error: BaseException, path: Any = None) -> errors.LoadError | None:
    """A LoadError naming the pair to install when ``error`` comes from a model needing the hidden torchvision;
    None when torchvision was not hidden or ``error`` is about something else."""
    if _note is None or not _mentions_torchvision(error):
        return None
    return errors.LoadError(f"this model needs torchvision, which is installed but does not import beside torch "
                            f"{_version('torch')}: install a matching pair ({pair_command()}) and export again",
                            path=path)


def pair_command() -> str:
    """The pip command of a torch / torchvision pair that work together, from the installed torch and torchvision's
    own requirement (its Requires-Dist pin of torch): torch moves to torchvision's pin when the versions differ;
    a local build tag (``+cpu``) keeps both on PyTorch's index of that build."""
    torch_base, _, local = _version("torch").partition("+")
    vision_base = _version("torchvision").partition("+")[0]
    torch_pin = (_torch_pin() or torch_base).partition("+")[0]
    if local:
        return (f"pip install torch=={torch_pin}+{local} torchvision=={vision_base}+{local} "
                f"--index-url https://download.pytorch.org/whl/{local}")
    return f"pip install --force-reinstall torch=={torch_pin} torchvision=={vision_base}"


def _hide() -> None:
    for name in [m for m in sys.modules if m.startswith("torchvision.")]:  # what imported before the failure
        del sys.modules[name]
    sys.modules["torchvision"] = None  # type: ignore[assignment]
    utils = sys.modules.get("transformers.utils.import_utils")
    for name in _TRANSFORMERS_CACHES if utils is not None else ():
        clear = getattr(getattr(utils, name, None), "cache_clear", None)
        if callable(clear):
            clear()


def _warning(e: BaseException) -> str:
    return (f"torchvision {_version('torchvision')} is installed but does not import beside torch "
            f"{_version('torch')} ({type(e).__name__}: {errors.one_line(e, 160)}): it was left out of this export "
            f"(a model that needs it is refused). Install a matching pair ({pair_command()}), or "
            "`pip uninstall torchvision` if no model needs it")


def _mentions_torchvision(error: BaseException) -> bool:
    """An ImportError for torchvision (or a message naming it) anywhere in ``error``'s chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = getattr(current, "name", None) if isinstance(current, ImportError) else None
        if name is not None and (name == "torchvision" or name.startswith("torchvision.")):
            return True
        if "torchvision" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "(unknown)"


def _torch_pin() -> str | None:
    """The exact torch version torchvision's metadata requires (``torch (==2.13.0)``), if it pins one."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    try:
        lines = requires("torchvision") or []
    except PackageNotFoundError:
        return None
    for line in lines:
        pin = re.fullmatch(r"\s*torch\s*\(?\s*==\s*([0-9][0-9A-Za-z.+]*)\s*\)?\s*", line)
        if pin:
            return pin.group(1)
    return None
