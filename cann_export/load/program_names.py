"""Which names in a .pt2's model JSON may reach the Python source torch 2.13 writes and runs.

torch builds code from the program's names, unchecked:

- ``ExportedProgram.module()`` (torch/export/_unlift.py ``_get_codegen``, torch/fx/graph.py ``_PyTreeCodeGen``)
  writes the keyword-input names (the root call's ``forward_arg_names``, else the keys of the ``in_spec``'s
  kwargs dict) as ``forward``'s parameters and as quoted keys of its first line, then ``exec()``s it;
- torch.export.load (torch/_export/serde/serialize.py) names placeholders and nodes after the JSON's value names
  and compiles the graph module: a placeholder's name is a parameter of its ``forward``;
- a parameter / buffer / constant name (``l.weight``) becomes ``self.l.weight``, a component that is no
  identifier ``getattr(self.l, "<component>")`` with the component quoted raw (``_format_target``);
- an operator argument of a target without an ATen schema is written ``name=value``;
- a pytree context is read with torch's enum hook (a JSON object ``{"__enum__": ..., "fqn": "mod:Cls"}``
  imports ``mod``), and a ``defaultdict`` context names a module torch imports.

``names_problem`` allows what torch writes: plain ASCII identifiers (not keywords, at most ``MAX_NAME_CHARS``)
for value, node, placeholder and keyword-input names and every string of a pytree context; dotted paths of
identifiers and indices for module and attribute paths; pytree contexts that are JSON lists and scalars
(``defaultdict`` only with a builtin factory). Anything else is refused, naming where it was found.
"""
from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable, Iterator
from typing import Any

MAX_NAME_CHARS = 256  # FX names join module paths (p_encoder_layers_11_attention_output_dense_weight)
MAX_PATH_PARTS = 64
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"\d+")
_CALL = re.compile(r"@\d+$")  # torch.export names the second call of a submodule "layer@1"
_VALUE_TABLES = ("tensor_values", "sym_int_values", "sym_float_values", "sym_bool_values", "custom_obj_values")
_ATTRIBUTE_PATHS = ("parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name")
_NAME_KEYS = ("name", "as_name")
_DEFAULTDICT_FACTORIES = frozenset(["list", "dict", "set", "int", "float", "str", "tuple", "bool"])
Rule = Callable[[Any], "str | None"]


def identifier(name: Any) -> str | None:
    """Why ``name`` is not a plain identifier torch may write into source, or None."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a name"
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name)} characters long, more than {MAX_NAME_CHARS}"
    if not _IDENT.fullmatch(name):
        return "is not a plain Python identifier (ASCII letters, digits and _, not starting with a digit)"
    if keyword.iskeyword(name):
        return "is a Python keyword"
    return None


def _argument_name(name: Any) -> str | None:
    """An operator argument's name: an identifier, or empty (positional); ATen schemas name some ``from``."""
    if name == "" or (isinstance(name, str) and keyword.iskeyword(name)):
        return None
    return identifier(name)


def _path(name: Any, *, calls: bool = False, empty: bool = False) -> str | None:
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a name"
    if name == "" and empty:
        return None
    parts = name.split(".")
    if len(parts) > MAX_PATH_PARTS:
        return f"has {len(parts)} components, more than {MAX_PATH_PARTS}"
    for part in parts:
        part = _CALL.sub("", part) if calls else part
        if not ((_INDEX.fullmatch(part) and len(part) <= MAX_NAME_CHARS) or identifier(part) is None):
            return ("is not a dotted path of plain identifiers and indices (ASCII letters, digits and _, "
                    f"not a keyword, at most {MAX_NAME_CHARS} characters each)")
    return None


def _attribute_path(name: Any) -> str | None:
    return _path(name)


def _module_path(name: Any) -> str | None:
    return _path(name, calls=True, empty=True)


def _type_name(name: Any) -> str | None:
    if not isinstance(name, str) or not all(_IDENT.fullmatch(p) for p in name.split(".")) or len(name) > 1024:
        return "is not a dotted path of plain identifiers"
    return None


def _context_strings(value: Any) -> str | None:
    """A pytree context as torch writes it for dicts, dataclasses and model outputs: lists of keys."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            return ("holds a JSON object, which torch's pytree reader treats as an enum whose module it "
                    "imports")
        elif isinstance(item, str) and (why := identifier(item)):
            return f"holds the key {_shown(item)}, which {why}"
    return None


def _treespec_node(node: dict[str, Any]) -> str | None:
    kind, context = node.get("type"), node.get("context")
    if kind is None:
        return None
    if why := _type_name(kind):
        return f"names the type {_shown(kind)}, which {why}"
    if kind == "collections.namedtuple":
        return None if _type_name(context) is None else f"names the namedtuple type {_shown(context)}"
    if kind == "collections.defaultdict":
        if not isinstance(context, dict) or context.get("default_factory_module") != "builtins" or (
                context.get("default_factory_name") not in _DEFAULTDICT_FACTORIES):
            return ("holds a defaultdict whose factory is not a builtin container, so torch would import the "
                    "module it names")
        return _context_strings(context.get("dict_context"))
    if context is None:
        return None
    try:
        return _context_strings(json.loads(context)) if isinstance(context, str) else "holds a context that is not JSON"
    except (ValueError, RecursionError):
        return "holds a context that is not JSON"


def treespec_problem(text: Any) -> str | None:
    """Why a serialized pytree spec (torch.utils._pytree.treespec_dumps) is more than containers of plain
    names, or None."""
    if text is None:
        return None
    try:
        spec = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        spec = None
    if not isinstance(spec, list) or len(spec) != 2 or not isinstance(spec[1], dict):
        return "is not a pytree spec as torch.export.save writes one"
    stack = [spec[1]]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            return "is not a pytree spec as torch.export.save writes one"
        if why := _treespec_node(node):
            return why
        children = node.get("children_spec")
        stack.extend(children if isinstance(children, list) else [])
    return None


def _argument_names(arg: Any, where: str) -> Iterator[tuple[str, Any, Rule]]:
    stack = [arg]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, value in item.items():
                if key in _NAME_KEYS and value is not None:
                    yield f"the {where} value name", value, identifier
                elif key == "graph" and isinstance(value, dict):
                    yield from _graph_names(value, "subgraph")
                elif isinstance(value, (dict, list)):
                    stack.append(value)


def _graph_names(graph: dict[str, Any], where: str) -> Iterator[tuple[str, Any, Rule]]:
    for table in _VALUE_TABLES:
        for name in _dict(graph.get(table)):
            yield f"the {where} value name", name, identifier
    yield from _argument_names([graph.get("inputs"), graph.get("outputs")], f"{where} input/output")
    for node in _list(graph.get("nodes")):
        if not isinstance(node, dict):
            continue
        if node.get("name") is not None:
            yield f"the {where} node name", node["name"], identifier
        for named in _list(node.get("inputs")):
            if isinstance(named, dict):
                yield f"the operator argument name of {where} node {_shown(node.get('name'))}", named.get("name"), \
                    _argument_name
                yield from _argument_names(named.get("arg"), where)
        yield from _argument_names(node.get("outputs"), where)


def _signature_names(signature: Any) -> Iterator[tuple[str, Any, Rule]]:
    for key in ("input_specs", "output_specs"):
        for spec in _list(_dict(signature).get(key)):
            for kind, body in _dict(spec).items():
                for field, value in _dict(body).items():
                    if field == "arg":
                        yield from _argument_names(value, f"{key[:-1].replace('_', ' ')}")
                    elif field in _ATTRIBUTE_PATHS:
                        yield f"the {kind} {field}", value, _attribute_path
                    elif field == "user_input_name":
                        yield f"the {kind} {field}", value, identifier


def _call_graph_names(entries: Any) -> Iterator[tuple[str, Any, Rule]]:
    for entry in _list(entries):
        entry = _dict(entry)
        if "fqn" in entry:
            yield "the module path (module_call_graph fqn)", entry["fqn"], _module_path
        signature = _dict(entry.get("signature"))
        yield from _argument_names([signature.get("inputs"), signature.get("outputs")], "module call")
        for spec in ("in_spec", "out_spec"):
            if signature.get(spec) is not None:
                yield f"the program's {spec} (its pytree of inputs/outputs)", signature[spec], treespec_problem
        for name in _list(signature.get("forward_arg_names")):
            yield "the keyword-input name (forward_arg_names)", name, identifier


def names_problem(root: Any) -> str | None:
    """Why a .pt2 model JSON holds a name torch would write into generated source unchecked, or None."""
    module = _dict(_dict(root).get("graph_module"))
    found = [_graph_names(_dict(module.get("graph")), "graph"), _signature_names(module.get("signature")),
             _call_graph_names(module.get("module_call_graph"))]
    for group in found:
        for where, name, rule in group:
            if why := rule(name):
                return f"{where} {why}" if rule is treespec_problem else f"{where} {_shown(name)} {why}"
    for type_name, fields in _dict(module.get("treespec_namedtuple_fields")).items():
        if why := _type_name(type_name):
            return f"the namedtuple type {_shown(type_name)} {why}"
        for field in _list(_dict(fields).get("field_names")):
            if why := identifier(field):
                return f"the field {_shown(field)} of namedtuple {_shown(type_name)} {why}"
    return None


def _shown(name: Any) -> str:
    text = name if isinstance(name, str) else repr(name)
    return repr(text[:80] + ("..." if len(text) > 80 else ""))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
