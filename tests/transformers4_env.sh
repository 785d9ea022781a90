#!/usr/bin/env bash
# The `transformers4` tests (pytest -m transformers4): what differs on transformers 4.53-4.57, the releases
# Optimum's exporters pin (optimum-onnx 0.1.0: transformers < 4.58) and so many users still run. They build their
# attention masks with vmap, which the TorchScript tracer cannot record (capture/traceable_masks.py). The README's
# environment has transformers 5, where those tests skip; this builds a second venv with transformers 4.57 and runs
# them there. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TRANSFORMERS4_VENV:-.venv-transformers4}
PINS="torch==2.13.0+cpu transformers==4.57.6 huggingface-hub<1.0"
if ! "$VENV/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '4.57.6')" >/dev/null 2>&1
then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet $PINS -e ".[test]"
fi
"$VENV/bin/python" -m pytest -q -n auto -m transformers4 "$@"
