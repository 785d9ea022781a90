"""What the model says about its inputs: the dtype of an ``--input-shape`` given without one, and which
inputs index an embedding table (and how many rows it has). Read off the model (its forward signature, its
graph, or one probing call with hooks on its ``nn.Embedding`` layers), never off an input's name."""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from ..options import InputSpec

_ANNOTATED = {"LongTensor": "int64", "IntTensor": "int32", "BoolTensor": "bool", "FloatTensor": "float32",
              "HalfTensor": "float16", "BFloat16Tensor": "bfloat16", "DoubleTensor": "float64"}
# The inputs a Hugging Face tokenizer emits as 0/1 int64 masks (tokenizers' model_input_names): a model with a
# transformers config is fed them so. The one naming rule left, and only for those models (see ``spec_dtypes``).
_HF_MASK = re.compile(r"(^|_)attention_mask$")


class _Found(Exception):
    """Raised from an embedding's pre-hook to stop a probing call as soon as it has its answer."""


def signature_dtype(model: Any, name: str) -> str | None:
    """The dtype the forward signature gives ``name``: a tensor default's, or a ``torch.LongTensor``-style
    annotation's; None when it says nothing."""
    try:
        param = inspect.signature(model.forward).parameters.get(name)
    except (TypeError, ValueError, AttributeError):
        return None
    if param is None:
        return None
    default = param.default
    if hasattr(default, "dtype") and hasattr(default, "shape"):
        return str(default.dtype).removeprefix("torch.")
    text = param.annotation if isinstance(param.annotation, str) else str(param.annotation)
    return next((dtype for word, dtype in _ANNOTATED.items() if re.search(rf"\b{word}\b", text)), None)


def is_transformers_model(model: Any) -> bool:
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "model_type") and hasattr(model, "main_input_name")


def spec_dtypes(model: Any, specs: list[InputSpec]) -> tuple[dict[str, str], dict[str, int]]:
    """({name: dtype}, {name: embedding rows}) for ``specs``: the spec's own dtype, else the signature's, else
    int64 for an input that indexes an embedding (found by ``embedding_rows``) or a transformers model's
    attention mask, else float32."""
    dtypes = {s.name: s.dtype or signature_dtype(model, s.name) for s in specs}
    if is_transformers_model(model):
        dtypes.update({n: "int64" for n, d in dtypes.items() if d is None and _HF_MASK.search(n)})
    rows = embedding_rows(model, {s.name: s.example_shape for s in specs}, dtypes)
    return {n: d or ("int64" if n in rows else "float32") for n, d in dtypes.items()}, rows


def embedding_rows(model: Any, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str | None]) -> dict[str, int]:
    """{input name: rows of the embedding table it indexes}, for the inputs of ``shapes`` whose dtype is
    undecided (None) or integer. FX graphs are read; an nn.Module is called with hooks on its embeddings,
    each undecided input first as floats, switched to int64 zeros once an embedding is seen reading it."""
    import torch

    candidates = [n for n, d in dtypes.items() if d is None or not getattr(torch, d).is_floating_point]
    graph = graph_embedding_rows(model)
    if graph or not isinstance(model, torch.nn.Module) or not candidates:
        return {n: r for n, r in graph.items() if n in candidates}
    gen = torch.Generator().manual_seed(0)  # the global RNG is the user's
    feed = {n: (torch.zeros(shapes[n], dtype=torch.int64) if d and d != "bool" else
                torch.zeros(shapes[n], dtype=torch.bool) if d else torch.randn(shapes[n], generator=gen))
            for n, d in dtypes.items()}
    rows: dict[str, int] = {}
    for _ in range(len(candidates)):
        found = _probe(model, feed, [n for n in candidates if n not in rows])
        if found is None:
            break
        name, table = found
        rows[name] = table
        feed[name] = torch.zeros(shapes[name], dtype=torch.int64)
    return rows


def feed_embedding_rows(model: Any, feed: dict[str, Any]) -> dict[str, int]:
    """{input name: embedding rows} for the integer tensors of an actual ``feed``."""
    import torch

    ints = {n: t for n, t in feed.items() if isinstance(t, torch.Tensor) and not t.dtype.is_floating_point
            and t.dtype != torch.bool}
    graph = graph_embedding_rows(model) if ints else {}
    if graph or not ints or not isinstance(model, torch.nn.Module):
        return {n: r for n, r in graph.items() if n in ints}
    rows: dict[str, int] = {}
    while (found := _probe(model, feed, [n for n in ints if n not in rows])) is not None:
        rows[found[0]] = found[1]
    return rows


def _probe(model: Any, feed: dict[str, Any], wanted: list[str]) -> tuple[str, int] | None:
    """Call ``model(**feed)`` until an embedding lookup reads one of ``wanted``, or the same values reached
    through a view, a slice, a copy or a dtype cast (``ids[:, 1:].long()``): (that name, the table's rows);
    None when the call ends (or fails) without that happening. The call runs without gradients and leaves
    the global RNG as it found it, in inference mode (no BatchNorm statistics move), the modes restored."""
    import torch

    if not wanted:
        return None
    modes = {m: m.training for m in model.modules()}
    try:
        try:
            model.eval()
        except NotImplementedError:  # an exported graph's module: its mode is in the graph
            pass
        with torch.no_grad(), torch.random.fork_rng(devices=[]), _follow_inputs_mode()({n: feed[n] for n in wanted}):
            model(**feed)
    except _Found as found:
        return found.args[0], found.args[1]
    except Exception:  # noqa: BLE001 - a probe that cannot run says nothing; the export reports the real error
        return None
    finally:
        for m, training in modes.items():
            m.training = training
    return None


# Tensor methods whose result holds the values they were given (maybe fewer, reshaped or in another dtype):
# what they return is still the input an embedding may read. Anything computed from it is not.
_SAME_VALUES = frozenset({"long", "int", "short", "to", "type", "clone", "contiguous", "detach", "__getitem__",
                          "view", "reshape", "flatten", "squeeze", "unsqueeze", "expand", "narrow", "select",
                          "t", "transpose", "permute", "repeat"})


@functools.cache
def _follow_inputs_mode() -> type:
    """A TorchFunctionMode that knows which tensors hold which input's values and stops at the first
    embedding lookup indexed by one (built on first use, so torch is imported only then)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    lookups = (torch.nn.functional.embedding, torch.nn.functional.embedding_bag)

    class FollowInputs(TorchFunctionMode):
        def __init__(self, inputs: dict[str, Any]) -> None:
            super().__init__()
            self.origin = {id(t): n for n, t in inputs.items()}
            self.alive = list(inputs.values())  # an id stays its tensor's while the tensor lives

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func in lookups:
                index = args[0] if args else kwargs.get("input")
                weight = args[1] if len(args) > 1 else kwargs.get("weight")
                if id(index) in self.origin and weight is not None:
                    raise _Found(self.origin[id(index)], int(weight.shape[0]))
            out = func(*args, **kwargs)
            sources = [a for a in tree_flatten((args, kwargs))[0]
                       if isinstance(a, torch.Tensor) and id(a) in self.origin]
            if len({self.origin[id(a)] for a in sources}) == 1 and getattr(func, "__name__", "") in _SAME_VALUES:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and id(t) not in self.origin:
                        self.origin[id(t)] = self.origin[id(sources[0])]
                        self.alive.append(t)
            return out

    return FollowInputs


def graph_embedding_rows(model: Any) -> dict[str, int]:
    """Input name -> rows of the embedding table it indexes, for FX graphs (unlifted .pt2 archives) and
    TorchScript modules."""
    if hasattr(model, "inlined_graph"):
        return _script_embedding_rows(model)
    graph = getattr(model, "graph", None)
    nodes = getattr(graph, "nodes", None)
    if nodes is None or not hasattr(model, "get_parameter"):
        return {}
    rows: dict[str, int] = {}
    for node in nodes:
        if node.op != "call_function" or "embedding" not in str(node.target) or len(node.args) < 2:
            continue
        weight, index = node.args[0], node.args[1]
        if getattr(index, "op", None) != "placeholder" or getattr(weight, "op", None) != "get_attr":
            continue
        try:
            table = model.get_parameter(weight.target)
        except AttributeError:
            table = getattr(model, str(weight.target), None)
        if table is not None and table.dim() == 2:
            rows[str(index.target)] = int(table.shape[0])
    return rows


def _script_embedding_rows(model: Any) -> dict[str, int]:
    """The same for TorchScript: ``aten::embedding`` nodes indexed by a graph input, the table found by
    following its ``prim::GetAttr`` chain from the module."""
    rows: dict[str, int] = {}
    try:
        nodes = list(model.inlined_graph.nodes())
    except RuntimeError:
        return rows
    for node in (n for n in nodes if n.kind() == "aten::embedding"):
        weight, index = list(node.inputs())[:2]
        if index.node().kind() != "prim::Param":
            continue
        path, source = [], weight.node()
        while source.kind() == "prim::GetAttr":
            path.append(source.s("name"))
            source = source.input().node()
        table: Any = model
        for attr in reversed(path):
            table = getattr(table, attr, None)
        if getattr(table, "dim", lambda: 0)() == 2:
            rows[index.debugName().split(".")[0]] = int(table.shape[0])
    return rows
