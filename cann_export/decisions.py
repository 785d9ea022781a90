"""What the stages after load will do, decided once, right after load, from the options, the format and the loaded
model: the later stages read ``ExportContext.decisions`` instead of asking each other (prepare used to ask capture
whether it would trace first and how large the module's weights were)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Decisions:
    """The export's plan for the stages after load. Nothing here changes once made."""

    # the exporters --exporter auto tries first, in order: the format's exporter_order, else the loader's
    # (a Hugging Face directory asks for TorchScript first, as Optimum traces); the rest follow by priority
    exporter_order: tuple[str, ...] = ()
    # a traced graph that warned must pass the trace check to be kept (--exporter auto, no
    # --accept-trace-specialization)
    trace_gated: bool = False
    # capture will first try a trace the gate can check: prepare builds the sign-flipped / scaled probes among its
    # input sets, and under --no-validate still builds the sets the gate judges
    trace_first: bool = False
    module_bytes: int = 0  # the loaded module's parameters and buffers (shared storages counted once)
    # weights past ExportOptions.external_data_threshold (and --external-data not "never"): the graph lives on disk
    # from capture on (capture/large_graph.py)
    large_graph: bool = False
    quantize: str | None = None  # --qat / --ptq: the reference is the fake-quant model after train
    prepared_for_qat: bool = False  # a model prepared with cann_export.qat.prepare in Python
    fake_quantized: bool = False  # a model with torch.ao eager fake quantization (prepare_qat): a Q/DQ graph
    # a multi-graph component's parity input sets at other shapes (the module's graph_shape_sets: seed -> sets),
    # sized by the element budget its planner chose (inputs/parity_budget.py); None for any other model
    shape_sets: Any = None
    # the batch gears of the user's --atc-hint dynamic_batch_size (atc/hint_gears.py), () without one: prepare makes
    # axis 0 a dynamic ``batch`` over them when the model has no dynamic batch of its own
    batch_gears: tuple[int, ...] = ()

    @property
    def quantized(self) -> bool:
        """The graph is judged against a fake-quant reference (--qat / --ptq, or prepared in Python)."""
        return bool(self.quantize or self.prepared_for_qat)


def decide(ctx: Any) -> Decisions:
    """The plan of ``ctx``'s export, from its options, format and the model the load stage put in ``ctx.model``."""
    from .atc.hint_gears import hint_sizes
    from .qat.torch_ao import fake_quantized
    from .qat.wrapping import prepared_state

    opts = ctx.options
    extras = ctx.loaded.extras
    order = tuple(getattr(ctx.format, "exporter_order", None) or extras.get("exporter_order") or ())
    gated = opts.exporter == "auto" and not opts.accept_trace_specialization
    size = module_bytes(ctx.model)
    large = opts.external_data != "never" and size > opts.external_data_threshold
    return Decisions(exporter_order=order, trace_gated=gated,
                     trace_first=bool(gated and not opts.quantize and order[:1] == ("torchscript",) and not large),
                     module_bytes=size, large_graph=large, quantize=opts.quantize,
                     prepared_for_qat=prepared_state(ctx.model) is not None, fake_quantized=fake_quantized(ctx.model),
                     shape_sets=extras.get("shape_sets"),
                     batch_gears=tuple(hint_sizes(opts.atc_hints or {}, [], ("batch",)).get("batch") or ()))


def module_bytes(model: Any) -> int:
    """Bytes of a torch module's parameters and buffers (shared storages counted once); 0 for anything else."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return 0
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        try:
            key = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            key = id(t)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
