"""Validation of model names, versions and aliases (they become path components and S3 keys)."""
from __future__ import annotations

import re

from .zoo_errors import ZooError

MAX_NAME = 128
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
_ALIAS = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")
LATEST = "latest"  # a reserved alias: the most recently published version


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ZooError("a model name is required (name=..., --name NAME)")
    if len(name) > MAX_NAME or not _NAME.fullmatch(name) or ".." in name:
        raise ZooError(f"invalid model name {name[:160]!r}: use 1-{MAX_NAME} characters from letters, digits, "
                       "'.', '_' and '-', starting with a letter or digit (no '/', '\\' or '..')")
    return name


def check_version(version: object) -> str:
    version = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
    if not isinstance(version, str) or not _VERSION.fullmatch(version) or ".." in version:
        raise ZooError(f"invalid version {str(version)[:80]!r}: use up to 64 letters, digits, '.', '_', '+' "
                       "or '-', starting with a letter or digit (e.g. 3 or 1.2.0)")
    return version


def check_alias(alias: object) -> str:
    if not isinstance(alias, str) or not _ALIAS.fullmatch(alias) or ".." in alias:
        raise ZooError(f"invalid alias {str(alias)[:80]!r}: use up to 64 letters, digits, '.', '_' or '-', "
                       "starting with a letter (e.g. prod, staging)")
    if alias == LATEST:
        raise ZooError("'latest' is reserved (it always means the newest version); choose another alias")
    return alias


def split_ref(ref: str) -> tuple[str, str | None]:
    """``NAME``, ``NAME@VERSION`` or ``NAME@ALIAS``."""
    name, sep, version = ref.partition("@")
    check_name(name)
    if sep and not version:
        raise ZooError(f"{ref!r}: nothing after '@'; write NAME@VERSION or NAME@ALIAS")
    return name, (version or None)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(value: object) -> bool:
    """A lowercase hex sha256: the only form a digest may take before it names a blob or a cache file."""
    return isinstance(value, str) and bool(_SHA256.fullmatch(value))


def is_relpath(rel: object) -> bool:
    """A relative POSIX path that stays inside its root (no absolute path, '..', '.', backslash, NUL or
    empty part)."""
    from pathlib import PurePosixPath

    if not isinstance(rel, str) or not rel or len(rel) > 1024 or rel.endswith("/") or "\\" in rel or "\x00" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and all(part not in ("..", "", ".") for part in rel.split("/"))
