"""Weights and optimizer state written as safetensors (no pickle), with their structure in the header."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_weights(model: Any, path: Path) -> None:
    from safetensors.torch import save_model

    save_model(model, str(path))  # handles tied/shared tensors


def save_optimizer_state(optimizer: Any, path: Path) -> None:
    """Tensors go to ``state.<param>.<key>``; scalars and param_groups to the JSON header."""
    import torch
    from safetensors.torch import save_file

    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    header = {"param_groups": json.dumps(state["param_groups"], default=str),
              "scalars": json.dumps(scalars, default=str), "optimizer": type(optimizer).__name__}
    save_file(tensors, str(path), metadata=header)


def load_optimizer_state(path: Path) -> dict[str, Any]:
    """Rebuild a ``state_dict`` suitable for ``optimizer.load_state_dict``."""
    from safetensors import safe_open

    state: dict[int, dict[str, Any]] = {}
    with safe_open(str(path), "pt") as f:
        header = f.metadata()
        for name in f.keys():
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = f.get_tensor(name)
    for name, value in json.loads(header["scalars"]).items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": json.loads(header["param_groups"])}
