"""The model card: README.md with a YAML front matter (license, task, base_model, metrics, tags).

The YAML is written by hand (scalars, lists and one level of mappings); strings are JSON-quoted,
which is valid YAML, so any YAML reader reads it back exactly."""
from __future__ import annotations

import json
from typing import Any

CARD_FIELDS = ("license", "task", "base_model", "metrics", "tags")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def to_yaml(data: dict[str, Any]) -> str:
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{_key(key)}:" if value else f"{_key(key)}: {{}}")
            lines += [f"  {_key(str(k))}: {_scalar(v)}" for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            lines.append(f"{_key(key)}:" if value else f"{_key(key)}: []")
            lines += [f"  - {_scalar(v)}" for v in value]
        else:
            lines.append(f"{_key(key)}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [value]


def card_fields(metadata: dict[str, Any], card: dict[str, Any] | None) -> dict[str, Any]:
    """The front matter: card= wins over metadata; tags are a list; metrics a mapping or a list."""
    merged = {k: metadata[k] for k in CARD_FIELDS if k in metadata}
    merged.update({k: v for k, v in (card or {}).items() if k != "body"})
    out: dict[str, Any] = {}
    for key in CARD_FIELDS:
        if key in merged and merged[key] not in (None, ""):
            value = merged[key]
            if key == "tags":
                value = _as_list(value)
            elif key == "metrics" and isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    value = _as_list(value)
            out[key] = value
    for key, value in merged.items():  # extra card fields are kept after the standard ones
        if key not in out and key not in CARD_FIELDS:
            out[key] = value
    return out


def render(name: str, fields: dict[str, Any], body: str | None, summary: list[str]) -> str:
    text = "---\n" + to_yaml(fields) + "---\n\n"
    if body:
        return text + body.rstrip() + "\n"
    text += f"# {name}\n\n"
    for line in summary:
        text += f"- {line}\n"
    return text
