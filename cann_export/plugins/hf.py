"""Hugging Face model directories (cann_export.hf): the directory loader and the task's dummy inputs."""
from __future__ import annotations

from ..hooks.specs import hookimpl


@hookimpl
def register_loaders(register):
    from ..hf.loader import HfDirectoryLoader

    register(HfDirectoryLoader())


@hookimpl
def register_input_providers(register):
    from ..hf.dummy_inputs import TaskDummyInputs

    register(TaskDummyInputs())
