"""Run the README's quickstarts exactly as written: every fenced ```bash or ```python block that follows a line
`<!-- ci: quickstart -->` in README.md, in order, in one scratch directory (``examples/`` linked into it), with
the current environment's python and cann-export. Exits non-zero at the first block that fails, naming it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- ci: quickstart -->"
BLOCK = re.compile(re.escape(MARK) + r"\s*\n```(bash|python)\n(.*?)\n```", re.S)


def main() -> int:
    blocks = BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    print(f"README quickstarts: {len(blocks)} block(s) marked {MARK}")
    with tempfile.TemporaryDirectory(prefix="readme-quickstarts-") as scratch:
        os.symlink(ROOT / "examples", Path(scratch) / "examples")
        for number, (language, code) in enumerate(blocks, 1):
            command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
            started = time.monotonic()
            proc = subprocess.run(command, cwd=scratch, check=False)
            print(f"quickstart {number} ({language}): exit {proc.returncode} in {time.monotonic() - started:.0f} s")
            if proc.returncode != 0:
                print(f"quickstart {number} failed; it reads:\n{code}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
