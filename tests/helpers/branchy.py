"""A module whose trace is wrong at another size of its dynamic axis (Python control flow on a size), served by a
loader plugin for ``*.branch`` files: the trace gate's and the deferred trace check's test model; and one whose
trace is wrong on a padded mask (``*.maskbranch``: integer inputs only)."""
import torch

from cann_export import LoadedModel, hookimpl


class ShapeBranch(torch.nn.Module):
    """Python control flow on a size: a trace keeps the branch of the example's size (8) at every size; with
    ``size`` below the range's low end the branch is the same at every size (a warned trace that is right)."""

    def __init__(self, size: int = 4) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)
        self.size = size

    def forward(self, x):
        y = self.proj(x)
        if x.shape[1] > self.size:
            return y * 2.0
        return y - 1.0


def _loader(plugin, name, suffix, make):
    """A loader plugin serving ``make() -> (module, example inputs, extras)`` for ``*{suffix}`` files."""
    @hookimpl
    def register_loaders(register):
        class Loader:
            priority = 500

            def matches(self, path):
                return path.suffix == suffix

            def load(self, path, options):
                torch.manual_seed(0)
                module, feed, extras = make()
                return LoadedModel(module.eval(), "module", example_inputs=feed, source_sha256="0" * 64, extras=extras)

        Loader.name = name
        register(Loader())

    plugin({"register_loaders": register_loaders}, name)


def branchy_loader(plugin, order, size=4):
    def make():
        extras = {"dynamic_axes": {"x": {1: "seq"}}, **({"exporter_order": order} if order else {})}
        return ShapeBranch(size), {"x": torch.randn(2, 8, 3)}, extras

    _loader(plugin, "shape-branch", ".branch", make)


class MaskBranch(torch.nn.Module):
    """Python control flow on a mask's values: the example has no padding, so a trace keeps the unmasked mean at
    every input; only a set with padding (the realistic random draws) shows it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids)
        if bool(attention_mask.all()):
            return self.head(h.mean(1))
        m = attention_mask[..., None].float()
        return self.head((h * m).sum(1) / m.sum(1).clamp(min=1))


def mask_branch_loader(plugin):
    def make():
        feed = {"input_ids": torch.randint(0, 50, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
        axes = {n: {0: "batch_size", 1: "sequence_length"} for n in feed}
        return MaskBranch(), feed, {"dynamic_axes": axes, "exporter_order": ["torchscript", "dynamo"]}

    _loader(plugin, "mask-branch", ".maskbranch", make)


class InputChecks(torch.nn.Module):
    """Input checks only (``if ...: raise`` and ``assert`` on sizes): the tracer warns at both, yet every input the
    model accepts takes the traced path (capture/trace_guards.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        if x.shape[2] != 3:
            raise ValueError(f"x needs 3 features, got {x.shape[2]}")
        assert x.shape[1] <= 64, "at most 64 positions"
        return self.proj(x) * 2.0


class CaughtCheck(torch.nn.Module):
    """An input check whose ValueError the caller catches to take another path: data-dependent control flow, which a
    trace at the example's size (8) gets wrong past it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def fast(self, x):
        if x.shape[1] > 8:
            raise ValueError("too long for the fast path")
        return self.proj(x) * 2.0

    def forward(self, x):
        try:
            return self.fast(x)
        except ValueError:
            return self.proj(x) - 1.0


def checks_loader(plugin, module_class, name, suffix):
    def make():
        return module_class(), {"x": torch.randn(2, 8, 3)}, {"dynamic_axes": {"x": {1: "seq"}},
                                                            "exporter_order": ["torchscript", "dynamo"]}

    _loader(plugin, name, suffix, make)


class FailsAtOne(torch.nn.Module):
    """A size branch that holds at every size (a warned trace that is right) and a forward that fails at seq=1
    (``x[:, 1]``): the range's low end cannot be checked."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.proj(x) * x[:, 1][:, None]
        if x.shape[1] > 0:
            return y * 2.0
        return y - 1.0


class ValueBranch(torch.nn.Module):
    """Python control flow on a value that no prepared set nor probe reaches (a mean past 10): a warned trace that
    depends on values, right on every set, so the gate keeps it after judging it on the path probes too."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.proj(x)
        if float(x.abs().mean()) > 10.0:
            return y * 0.0
        return y


class SizeOfValues(torch.nn.Module):
    """A test of a size that comes from values (``x[x > 0]``: NonZero in the graph): a value probe can move it, so it
    is probed like any value-dependent warning (capture/shape_tests.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.proj(x)
        if x[x > 0].shape[0] > 1000:
            return y * 0.0
        return y


def value_branch_loader(plugin, order, module_class=ValueBranch, suffix=".valuebranch"):
    def make():
        extras = {"dynamic_axes": {"x": {1: "seq"}}, **({"exporter_order": order} if order else {})}
        return module_class(), {"x": torch.randn(2, 8, 3)}, extras

    _loader(plugin, module_class.__name__.lower(), suffix, make)


class ArangeOfValues(torch.nn.Module):
    """A test of a size made from values by an op the exported graph drops (``torch.arange`` of a count: the tracer
    records the 0-dim tensor as its size without a warning): only a value probe reaches the other branch."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.proj(x)
        r = torch.arange((x > 5).sum())
        if r.shape[0] > 0:
            return y * 0.0
        return y


class NonlocalSize(torch.nn.Module):
    """A size rebound to a value by a nested function (``nonlocal``)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.proj(x)
        n = x.shape[1]

        def bump():
            nonlocal n
            n = (x > 5).sum()

        bump()
        if n > 0:
            return y * 0.0
        return y
