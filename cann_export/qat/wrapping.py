"""``prepare``: fold BatchNorm into its Conv, then wrap the chosen layers in fake quantization."""
from __future__ import annotations

import collections
import copy
import itertools
from typing import Any

import torch
from torch import nn

from .quant_config import QuantConfig, parse
from .fake_quant import QuantLayer, quant_layers

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BNS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_BatchNorm = nn.modules.batchnorm._BatchNorm
STATE_ATTR = "_cann_qat"  # a plain dict on the prepared model (not a submodule, not in state_dict)


def _get(model: nn.Module, path: str) -> nn.Module:
    return model.get_submodule(path) if path else model


def replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(_get(model, parent), name, module)


def conv_bn_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """(conv path, bn path) where the BN consumes only that conv's output: traced with torch.fx when the
    model traces, else neighbours inside nn.Sequential."""
    pairs = []
    try:
        from torch import fx

        graph = fx.symbolic_trace(model).graph
        calls = collections.Counter(n.target for n in graph.nodes if n.op == "call_module")
        for node in graph.nodes:
            if node.op != "call_module" or not isinstance(_get(model, node.target), _BNS):
                continue
            src = node.args[0] if node.args else None
            if getattr(src, "op", None) == "call_module" and isinstance(_get(model, src.target), _CONVS) \
                    and len(src.users) == 1 and calls[src.target] == 1 and calls[node.target] == 1:
                # a module called twice would change both calls
                pairs.append((src.target, node.target))
    except Exception:  # noqa: BLE001 - models with data-dependent control flow do not trace: neighbours only
        pairs = []
    else:
        return pairs
    for path, seq in model.named_modules():
        if isinstance(seq, nn.Sequential):
            names = list(seq._modules)
            for a, b in itertools.pairwise(names):
                if isinstance(seq._modules[a], _CONVS) and isinstance(seq._modules[b], _BNS):
                    pairs.append((f"{path}.{a}".lstrip("."), f"{path}.{b}".lstrip(".")))
    return pairs


def conv_bn_pairs_by_running(model: nn.Module, inputs: dict[str, Any]) -> list[tuple[str, str]]:
    """(conv path, bn path) seen in one eval forward on ``inputs``: the BN's input is the conv's output and
    no other operation reads that output. Works for models torch.fx cannot trace (transformers' ResNet)."""
    from torch.overrides import TorchFunctionMode

    paths = {m: p for p, m in model.named_modules()}
    produced: dict[int, str] = {}  # id(conv output) -> conv path
    read_by_bn: dict[int, str] = {}  # id(conv output) -> bn path
    uses: dict[int, int] = {}
    keep: list[Any] = []  # hold the outputs so their ids stay unique during the run

    in_bn = [0]  # inside a BatchNorm's forward, which only reads its own input

    class CountUses(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not in_bn[0]:
                for a in (*args, *(kwargs or {}).values()):
                    if isinstance(a, torch.Tensor) and id(a) in produced:
                        uses[id(a)] = uses.get(id(a), 0) + 1
            return func(*args, **(kwargs or {}))

    def after_conv(module: nn.Module, args: tuple, out: Any) -> None:
        produced[id(out)] = paths[module]
        keep.append(out)

    def before_bn(module: nn.Module, args: tuple) -> None:
        if args and id(args[0]) in produced:
            read_by_bn[id(args[0])] = paths[module]
            uses[id(args[0])] = uses.get(id(args[0]), 0) + 1
        in_bn[0] += 1

    def after_bn(module: nn.Module, args: tuple, out: Any) -> None:
        in_bn[0] -= 1

    handles = [m.register_forward_hook(after_conv) for m in model.modules() if isinstance(m, _CONVS)]
    handles += [m.register_forward_pre_hook(before_bn) for m in model.modules() if isinstance(m, _BNS)]
    handles += [m.register_forward_hook(after_bn, always_call=True) for m in model.modules() if isinstance(m, _BNS)]
    was = model.training
    try:
        model.eval()
        with torch.no_grad(), CountUses():
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    return [(produced[k], bn) for k, bn in read_by_bn.items() if uses.get(k, 0) == 1]


def fold_batchnorm(model: nn.Module, inputs: dict[str, Any] | None = None,
                   replaced: dict[str, nn.Module] | None = None) -> list[str]:
    """Fold each Conv -> BatchNorm pair (running statistics) into the conv; the BN becomes Identity.
    With ``inputs`` the pairs come from running the model (any architecture), else from tracing it. With
    ``replaced``, each folded pair's modules as they were before the fold are added to it by path."""
    import copy

    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = []
    pairs = conv_bn_pairs_by_running(model, inputs) if inputs is not None else conv_bn_pairs(model)
    for conv_path, bn_path in pairs:
        conv, bn = _get(model, conv_path), _get(model, bn_path)
        plain = type(bn).forward is _BatchNorm.forward
        if bn.running_mean is None or (model.training and not plain):
            continue  # a norm-act layer in a model that trains on: it trains as it is and is folded at export
        fused = fuse_conv_bn_eval(conv.eval(), bn.eval())  # a copy of the conv: the original is left as it was
        fused.train(model.training)
        if replaced is not None:
            replaced[conv_path], replaced[bn_path] = conv, (bn if plain else copy.deepcopy(bn))
        replace(model, conv_path, fused)
        replace(model, bn_path, nn.Identity() if plain else _neutral(bn))
        folded.append(bn_path)
    return folded


def _neutral(bn: nn.Module) -> nn.Module:
    """A BatchNorm subclass that does more than normalize (timm's BatchNormAct2d: then drop and act), its
    statistics folded away: normalization becomes the identity, the rest of its forward stays."""
    # new tensors, never writes into the old ones: the stripped model may share them with the caller's
    bn.running_mean = torch.zeros_like(bn.running_mean)
    bn.running_var = torch.ones_like(bn.running_var)
    if bn.weight is not None:
        bn.weight = nn.Parameter(torch.ones_like(bn.weight), requires_grad=False)
        bn.bias = nn.Parameter(torch.zeros_like(bn.bias), requires_grad=False)
    bn.eps = 0.0
    return bn.eval()


def kept_batchnorms(model: nn.Module) -> list[str]:
    """BatchNorms left in ``model`` after folding (not after a Conv whose output only they read): they stay
    in the graph as BatchNormalization and compute in float."""
    return [p for p, m in model.named_modules() if isinstance(m, _BNS) and not _is_neutral(m)]


def _is_neutral(bn: nn.Module) -> bool:
    return bn.eps == 0.0 and bn.running_mean is not None and not bn.running_mean.any() and \
        bool((bn.running_var == 1).all())


def quantizable(module: nn.Module) -> bool:
    """Conv1d/2d/3d, Linear, and transformers' Conv1D (GPT-2: ``x @ weight + bias``, weight [in, out])."""
    return layer_kind(module) is not None


def layer_kind(module: nn.Module) -> str | None:
    """The quantizable layer ``module`` is, by class or base class (a subclass such as transformers'
    ``EfficientNetDepthwiseConv2d(nn.Conv2d)`` computes as its base): "Conv2d", "Linear", "Conv1D"... or
    None."""
    for base in (*_CONVS, nn.Linear):
        if isinstance(module, base):
            return base.__name__
    weight = getattr(module, "weight", None)
    if any(c.__name__ == "Conv1D" for c in type(module).__mro__) and isinstance(weight, torch.Tensor) \
            and weight.dim() == 2 and isinstance(getattr(module, "bias", None), torch.Tensor):
        return "Conv1D"
    return None


def prepare(model: nn.Module, example_inputs: Any = None, config: dict[str, Any] | QuantConfig | None = None,
            *, keep_float_copy: bool = True) -> nn.Module:
    """Return a copy of ``model`` ready for quantization-aware training (the original is not changed).

    BatchNorm is folded into the preceding conv, then every layer of ``config.quantize_types`` outside
    ``config.skip_modules`` is wrapped in fake quantization. Train it with your usual loop (activation
    ranges are observed in training mode) and export it with ``cann_export.export``.
    """
    cfg = parse(config)
    float_model = copy.deepcopy(model).eval() if keep_float_copy else None
    qmodel = copy.deepcopy(model)
    folded = fold_batchnorm(qmodel)
    wrapped = wrap_layers(qmodel, cfg)
    object.__setattr__(qmodel, STATE_ATTR, {"config": cfg, "float_model": float_model, "folded_bn": folded,
                                            "quantized": wrapped, "prepared": "cann_export.qat.prepare"})
    if example_inputs is not None:  # one forward in eval mode checks the inputs fit
        with torch.no_grad():
            was = qmodel.training
            qmodel.eval()
            qmodel(**example_inputs) if isinstance(example_inputs, dict) else qmodel(
                *(example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)))
            qmodel.train(was)
    return qmodel


def wrap_layers(model: nn.Module, cfg: QuantConfig) -> list[str]:
    """Wrap every layer of ``cfg.quantize_types`` outside ``cfg.skip_modules`` in fake quantization, in
    place. The wrapped layers keep their Parameter objects (an optimizer built before still trains them);
    the observer buffers live on the layer's device. Returns the wrapped paths."""
    wrapped: list[str] = []
    for path, module in list(model.named_modules()):
        if not path or layer_kind(module) not in cfg.quantize_types:
            continue
        if any(path == s or path.startswith(s + ".") for s in cfg.skip_modules):
            continue
        if any(path.startswith(w + ".") for w in wrapped):
            continue
        _wrap(model, path, module, cfg)
        wrapped.append(path)
    if not wrapped:
        from ..errors import OptionsError

        raise OptionsError(f"nothing to quantize: no {', '.join(cfg.quantize_types)} layer outside skip_modules "
                           f"{list(cfg.skip_modules)}")
    return wrapped


def _wrap(model: nn.Module, path: str, module: nn.Module, cfg: QuantConfig) -> None:
    layer = QuantLayer(module, cfg.weight_bits)
    for name in ("act_min", "act_max"):
        setattr(layer, name, getattr(layer, name).to(module.weight.device))
    layer.train(module.training)
    replace(model, path, layer)


def wrap_paths(model: nn.Module, paths: list[str], config: dict[str, Any] | QuantConfig | None, how: str) -> None:
    """Fake-quantize exactly the layers at ``paths`` in place (those a QAT checkpoint holds wrapped), as
    ``prepare_in_place`` would: same Parameter objects, fresh observers on the layer's device."""
    cfg = parse(config)
    for path in paths:
        module = _get(model, path)
        if layer_kind(module) is None:
            raise ValueError(f"{path} is a {type(module).__name__}, not a Conv/Linear layer to fake-quantize")
        _wrap(model, path, module, cfg)
    object.__setattr__(model, STATE_ATTR, {"config": cfg, "float_model": None, "folded_bn": [],
                                           "quantized": list(paths), "prepared": how})


def prepare_in_place(model: nn.Module, config: dict[str, Any] | QuantConfig | None, how: str) -> list[str]:
    """Fake-quantize ``model``'s layers where it stands, for a training loop that already holds the model and
    its optimizer: BatchNorm stays (it trains as usual and is folded into its conv at export, which commutes
    with symmetric per-channel weight quantization). ``how`` records what applied it."""
    cfg = parse(config)
    wrapped = wrap_layers(model, cfg)
    object.__setattr__(model, STATE_ATTR, {"config": cfg, "float_model": None, "folded_bn": [],
                                           "quantized": wrapped, "prepared": how})
    return wrapped


def float_twin(model: nn.Module) -> nn.Module | None:
    """The model as trained without its fake quantization (each QuantLayer's own float layer, a copy): what
    int8 is measured against when no float copy was kept (a model fake-quantized in place)."""
    if not quant_layers(model):
        return None
    twin = copy.deepcopy(model)
    for path, layer in quant_layers(twin).items():
        replace(twin, path, layer.layer)
    return twin.eval()


def prepared_state(model: Any) -> dict[str, Any] | None:
    """What ``prepare()`` recorded on ``model`` (config, float model, folded BatchNorms), or None when it was
    not prepared here."""
    return getattr(model, STATE_ATTR, None)


def qat_state(model: Any) -> dict[str, Any] | None:
    state = getattr(model, STATE_ATTR, None)
    if state is None and isinstance(model, nn.Module) and quant_layers(model):
        state = {"config": QuantConfig(), "float_model": None, "folded_bn": [], "quantized": list(quant_layers(model))}
    return state
