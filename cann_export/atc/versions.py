"""CANN release numbers as the ATC guides write them."""
from __future__ import annotations

import re


def parse_cann_version(text: str) -> tuple[int, int] | None:
    """``"8.0"``, ``"7.0.RC1"``, ``"6.3.RC2"``, ``"8.0.0"`` -> (major, minor); None when it does not parse."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.[0-9A-Za-z.]+)?\s*", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None
