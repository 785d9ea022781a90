"""Where the registry lives: ``--zoo URL`` / ``CANN_MODEL_ZOO`` / a directory under the user cache."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .zoo_errors import ZooError

ENV_ZOO = "CANN_MODEL_ZOO"
ENV_ENDPOINT = "CANN_MODEL_ZOO_ENDPOINT"
ENV_CACHE = "CANN_MODEL_ZOO_CACHE"


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/cann-export`` (default ``~/.cache/cann-export``), as platformdirs does on Linux."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cann-export"


def default_zoo() -> str:
    return os.environ.get(ENV_ZOO) or str(user_cache_dir() / "zoo")


def remote_cache_dir(url: str) -> Path:
    """Local cache of verified blobs fetched from a remote zoo."""
    import hashlib

    base = Path(os.environ[ENV_CACHE]) if os.environ.get(ENV_CACHE) else user_cache_dir() / "zoo-remote"
    return base / hashlib.sha256(url.encode()).hexdigest()[:16]


def parse(zoo: str | os.PathLike | None) -> tuple[str, str, dict[str, Any]]:
    """Return ``(protocol, root, storage_options)``; protocol ``file`` means the embedded local store.

    Remote URLs take fsspec options from the query (``s3://bucket/prefix?endpoint_url=http://host:9000``);
    the S3 endpoint also comes from ``CANN_MODEL_ZOO_ENDPOINT`` or ``AWS_ENDPOINT_URL``."""
    raw = os.fspath(zoo) if zoo is not None else default_zoo()
    if not raw:
        raise ZooError("empty model zoo location; pass --zoo DIR|s3://bucket/prefix or set CANN_MODEL_ZOO")
    if "://" not in raw:
        return "file", str(Path(raw).expanduser().resolve()), {}
    parts = urlsplit(raw)
    protocol = parts.scheme
    if protocol == "file":
        return "file", str(Path(parts.netloc + parts.path).expanduser().resolve()), {}
    options: dict[str, Any] = dict(parse_qsl(parts.query))
    root = (parts.netloc + parts.path).rstrip("/")
    if protocol in ("s3", "s3a"):
        protocol = "s3"
        endpoint = (options.pop("endpoint_url", None) or os.environ.get(ENV_ENDPOINT)
                    or os.environ.get("AWS_ENDPOINT_URL"))
        if endpoint:
            options.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
        if not parts.netloc:
            raise ZooError(f"{raw!r} names no bucket; write s3://BUCKET[/PREFIX]")
    return protocol, root, options
