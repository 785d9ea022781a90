"""Hostile .pt2 files for each path by which torch 2.13 writes a name of the program into Python source it runs
(issue 41), built from a real torch.export.save archive of a model called by keyword (``export(m, (), {"x": t})``)
with the JSON members rewritten. Each payload creates ``marker`` when torch runs the source it generates."""
from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from .files import rewrite


class KeywordModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.l(x).relu()


def keyword_program(tmp: Path) -> Path:
    """A real program whose input is taken by keyword: torch.export stores "x" in its in_spec and
    forward_arg_names."""
    torch.manual_seed(0)
    path = tmp / "kw.pt2"
    torch.export.save(torch.export.export(KeywordModel().eval(), (), {"x": torch.randn(2, 4)}), str(path))
    return path


def source_payload(marker: Path, name: str = "x") -> str:
    """A name that, written where torch writes a parameter name (``def forward(self, NAME)`` and again as
    ``{'x':NAME}`` / ``{'NAME':NAME}`` on the next line), makes a default value that opens ``marker``: the
    triple quote swallows the rest up to the name's next occurrence, the comment the remainder of that line."""
    return f"{name}=str(open({str(marker)!r},'w'))+'''):#"


def _edit_json(src: Path, dst: Path, edit: Callable[[dict[str, str]], None]) -> Path:
    """Copy ``src`` with its JSON members (record -> text, e.g. "models/model.json") edited by ``edit``."""
    with zipfile.ZipFile(src) as z:
        texts = {n.split("/", 1)[1]: z.read(n).decode() for n in z.namelist() if n.endswith(".json")}
    edit(texts)
    return rewrite(src, dst, {record: text.encode() for record, text in texts.items()})


def _program(texts: dict[str, str], edit: Callable[[dict], None]) -> None:
    doc = json.loads(texts["models/model.json"])
    edit(doc)
    texts["models/model.json"] = json.dumps(doc)


def _root_signature(doc: dict) -> dict:
    return doc["graph_module"]["module_call_graph"][0]["signature"]


def _forward_arg_names(marker: Path) -> Callable[[dict[str, str]], None]:
    names = [source_payload(marker)]
    return lambda texts: _program(texts, lambda d: _root_signature(d).update(forward_arg_names=names))


def _in_spec_key(marker: Path) -> Callable[[dict[str, str]], None]:
    def edit(doc: dict) -> None:
        signature = _root_signature(doc)
        signature["forward_arg_names"] = []  # torch then takes the names from the in_spec's kwargs dict
        spec = json.loads(signature["in_spec"])
        spec[1]["children_spec"][1]["context"] = json.dumps([source_payload(marker)])
        signature["in_spec"] = json.dumps(spec)
    return lambda texts: _program(texts, edit)


def _renamed(old: str, new: str) -> Callable[[dict[str, str]], None]:
    """Every JSON string ``old`` (a value or a key) becomes ``new``, in every JSON member."""
    def edit(texts: dict[str, str]) -> None:
        for record, text in texts.items():
            texts[record] = text.replace(json.dumps(old), json.dumps(new))
    return edit


def _spec_context(marker_module: str, spec_key: str) -> Callable[[dict[str, str]], None]:
    """The in_spec's kwargs dict keyed by an enum: torch's pytree reader imports the module it names."""
    def edit(doc: dict) -> None:
        signature = _root_signature(doc)
        spec = json.loads(signature[spec_key])
        node = spec[1]["children_spec"][1] if spec_key == "in_spec" else spec[1]
        if spec_key == "out_spec":
            node.update(type="builtins.tuple", children_spec=[{"type": None, "context": None, "children_spec": []}])
        node["context"] = json.dumps([{"__enum__": True, "fqn": f"{marker_module}:Key", "name": "X"}])
        signature[spec_key] = json.dumps(spec)
    return lambda texts: _program(texts, edit)


def _defaultdict_factory(marker_module: str) -> Callable[[dict[str, str]], None]:
    def edit(doc: dict) -> None:
        signature = _root_signature(doc)
        spec = json.loads(signature["in_spec"])
        spec[1]["children_spec"][1] = {
            "type": "collections.defaultdict",
            "context": {"default_factory_module": marker_module, "default_factory_name": "Key",
                        "dict_context": ["x"]},
            "children_spec": [{"type": None, "context": None, "children_spec": []}]}
        signature["in_spec"] = json.dumps(spec)
    return lambda texts: _program(texts, edit)


# Each path: how torch 2.13 reaches source with the name, and the words the refusal names it by.
PATHS = {
    # ExportedProgram.module(): _get_codegen -> _PyTreeCodeGen.gen_fn_def / gen_var_bindings, exec at .module()
    "forward_arg_names": ("module", "forward_arg_names"),
    # the same, names taken from the in_spec's kwargs dict when forward_arg_names is empty
    "in_spec kwargs key": ("module", "in_spec"),
    # torch.export.load: placeholder named raw (serialize.py sync_fx_node), forward(self, ..., NAME) compiled
    "placeholder name": ("load", "value name"),
    # ExportedProgram.module() body: get_attr of the parameter path via fx.graph._format_target, run when called
    "parameter path": ("call", "parameter_name"),
    # torch.export.load: pytree context json.loads(object_hook=enum_object_hook) imports the module it names
    "in_spec enum context": ("load", "in_spec"),
    "out_spec enum context": ("load", "out_spec"),
    # torch.export.load: _defaultdict_deserialize imports default_factory_module
    "defaultdict factory module": ("load", "defaultdict"),
}


def hostile(path: str, good: Path, dst: Path, marker: Path, marker_module: str) -> Path:
    """``good`` rewritten so that ``path`` (a key of PATHS) carries a payload creating ``marker`` (the
    import paths import ``marker_module``, whose import creates it)."""
    edits = {
        "forward_arg_names": lambda: _forward_arg_names(marker),
        "in_spec kwargs key": lambda: _in_spec_key(marker),
        "placeholder name": lambda: _renamed("x", f"x=open({str(marker)!r},'w')"),
        "parameter path": lambda: _renamed(
            "l.weight", f'l.weight") if open({str(marker)!r},"w") else getattr(getattr(self, "l"), "weight'),
        "in_spec enum context": lambda: _spec_context(marker_module, "in_spec"),
        "out_spec enum context": lambda: _spec_context(marker_module, "out_spec"),
        "defaultdict factory module": lambda: _defaultdict_factory(marker_module),
    }
    return _edit_json(good, dst, edits[path]())


def marker_module(directory: Path, marker: Path) -> str:
    """A module in ``directory`` (put it on sys.path) whose import creates ``marker``: stands for any
    installed module with import-time effects."""
    name = f"codegen_marker_{abs(hash(str(marker))) % 10**8}"
    (directory / f"{name}.py").write_text(
        f"import enum, pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "class Key(enum.Enum):\n    X = 'x'\n")
    return name


def run_in_torch(path: Path, x: torch.Tensor) -> None:
    """What a consumer does with a .pt2: load it, build its module, call it by keyword."""
    torch.export.load(str(path)).module()(x=x)
