#!/usr/bin/env bash
# The `vision` tests (pytest -m vision): the timm and torchvision architecture corpora. They need a torchvision
# that imports beside torch, which the README's environment (requirements-dev.txt: the CPU torch, no torchvision,
# no timm) does not have: PyPI's torchvision is built for PyPI's torch. This builds a second venv with a pair
# PyPI ships together and runs them there. Extra arguments go to pytest (e.g. -k timm_resnet10t).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VISION_VENV:-.venv-vision}
case "$(uname -m)" in
    aarch64) PAIR="torch==2.9.1 torchvision==0.24.1" ;;  # a CPU build on aarch64
    *) PAIR="torch==2.14.1 torchvision==0.29.1" ;;  # a CUDA build (runs on the CPU), about 5.5 GB
esac
if ! "$VENV/bin/python" -c "import timm, torchvision" >/dev/null 2>&1; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet $PAIR -e ".[test,vision]"
fi
# npu-sim refuses a torch newer than the last release it was tested on unless told (backend/npu_sim)
export CANN_EXPORT_NPU_SIM_ANY_TORCH=1
"$VENV/bin/python" -m pytest -q -n auto -m vision "$@"
