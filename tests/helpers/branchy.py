"""A module whose trace is wrong at another size of its dynamic axis (Python control flow on a size), served by a
loader plugin for ``*.branch`` files: the trace gate's and the deferred trace check's test model."""
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


def branchy_loader(plugin, order, size=4):
    @hookimpl
    def register_loaders(register):
        class Branchy:
            name = "shape-branch"
            priority = 500

            def matches(self, path):
                return path.suffix == ".branch"

            def load(self, path, options):
                torch.manual_seed(0)
                extras = {"dynamic_axes": {"x": {1: "seq"}}, **({"exporter_order": order} if order else {})}
                return LoadedModel(ShapeBranch(size).eval(), "module", example_inputs={"x": torch.randn(2, 8, 3)},
                                   source_sha256="0" * 64, extras=extras)

        register(Branchy())

    plugin({"register_loaders": register_loaders}, "shape-branch")
