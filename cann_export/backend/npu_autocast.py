"""Autocast for npu-sim (filled in below)."""


def register() -> None:
    return None
