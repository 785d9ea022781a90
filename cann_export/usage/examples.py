"""Examples shown at the end of each command's ``--help`` (click's epilog), kept verbatim (``\\b``)."""
from __future__ import annotations


def examples(*lines: str) -> str:
    """An epilog of example command lines; a line starting with '#' is a caption."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
