"""Run at start-up by the `cann-export` subprocesses of the tests (tests/ is on their PYTHONPATH): the
stand-in schemas for torchvision's C++ ops are defined just before torchvision is imported (helpers/
torchvision_ops.py explains why)."""
from helpers.torchvision_ops import install_on_import

install_on_import()
