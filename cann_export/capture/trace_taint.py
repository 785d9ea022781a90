"""Whether anything a running trace recorded has sizes that may depend on input values (capture/shape_tests.py).

The exported graph drops what only fed Python (``r = torch.arange((x > 5).sum()); if r.shape[0] > 0: ...``: ``r``
never reaches an output), so the check reads the tracer's own graph while it is being built
(``torch._C._get_tracing_state()``). A mark flows through it from the traced forward's tensor inputs (and from tensor
constants: ``x.data`` is read untraced) to every op's outputs; a size read (``aten::size``, ``dim``, ``numel``)
carries none. A marked input is refused (the test of sizes is probed) where it may size a tensor:

- at a non-tensor argument (an int, a Scalar, a list of ints: ``torch.arange(n)``, ``expand(n)``, a slice's end,
  passed as 0-dim tensors that the tracer takes without a warning);
- at any op outside an allow-list of aten ops whose output sizes follow from their tensor inputs' sizes and their
  non-tensor arguments (so nonzero, unique, masked_select, pack_padded_sequence, to_sparse, a custom op, a Python
  autograd function, and whatever torch adds later are refused), and at ``torch.where(cond)`` or a boolean-mask index;
- at an in-place write of values into a tensor (or a view of one) that held none: later reads of its base would not
  carry the mark.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_SIZE_READS = frozenset(("aten::size", "aten::dim", "aten::numel", "prim::shape"))
_VALUELESS = frozenset(("prim::GetAttr", "prim::TracedAttr"))


class Trace:
    """The marks of one running trace, kept between the warnings it raises: each call walks only what was recorded
    since, so a trace that warns once per layer does not walk its graph once per layer. The tracer appends to the
    block it is in, and inserts conversions (``aten::Int`` of a size, constants) next to the value they convert when
    a later op needs them; a value whose node was not walked is marked from its node when it is read."""

    def __init__(self) -> None:
        self.untraced = False  # a tensor's ``.data`` was read while tracing: its values became a constant
        self.marks: dict[int, int] = {}  # every value walked: 1 when it carries input values
        self.cursors: dict[tuple[int, ...], tuple[int, tuple[str, tuple[int, ...]]]] = {}  # block: walked, last
        self.failed = False

    def sizes_from_shapes(self) -> bool:
        """Whether no tensor the current trace recorded so far has sizes that depend on input values; False outside
        a trace or when torch's tracing API does not answer."""
        import torch

        if self.failed or self.untraced:
            return False
        try:
            state = torch._C._get_tracing_state()
            if state is None:
                return False
            graph = state.graph()
            if not self.marks:
                self._restart(graph)
            try:
                self._walk(graph, ())
            except _Moved:  # the tracer changed what was walked: walk it all again
                self._restart(graph)
                self._walk(graph, ())
        except Exception:  # noqa: BLE001 - _Rejected, or torch's private tracing API changed: no claim
            self.failed = True
        return not self.failed

    def computed_size(self, value: Any) -> bool:
        """Whether ``value``, a 0-dim tensor a warning's frame holds, is a size this trace computed: the tracer keeps
        sizes as 0-dim tensors, so a caller's ``kv_length = past_length + query.shape[1]`` reaches a test as such an
        argument. Its recorded producers must be size reads, scalar constants, conversions and out-of-place
        arithmetic only (``_SIZE_EXPRESSION``), and nothing recorded may write into it or anything made from it (a
        write through an alias the tracer does not map back: ``broadcast_tensors``' views). A tensor the trace does
        not hold (torch's lookup records it as a constant, as its first use would), or one needing grad (the lookup
        would stop the trace), makes no such claim."""
        import torch

        if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.requires_grad \
                or not self.sizes_from_shapes():
            return False
        state = torch._C._get_tracing_state()
        if state is None:  # torch's lookup needs a running trace (else it crashes)
            return False
        try:
            return _size_expression(torch._C._get_value_trace(value))
        except Exception:  # noqa: BLE001 - torch's private tracing API changed: no claim
            return False
        finally:
            if torch._C._get_tracing_state() is None:  # a failed lookup may have paused the trace
                torch._C._set_tracing_state(state)

    def _restart(self, graph: Any) -> None:
        """Nothing walked yet: the forward's inputs (not the module itself) carry values."""
        self.marks = {v.unique(): 1 for v in graph.inputs() if v.type().kind() != "ClassType"}
        self.cursors = {}

    def _walk(self, block: Any, key: tuple[int, ...]) -> None:
        nodes = list(block.nodes())
        for index in range(self._resumed(nodes, key), len(nodes)):
            node = nodes[index]
            blocks = list(node.blocks())
            for k, inner in enumerate(blocks):
                self._walk(inner, (*key, index, k))
            if blocks and index == len(nodes) - 1:  # a module's forward still running: marked once it returned
                break
            self._marked(node, blocks)
            self.cursors[key] = (index + 1, _identity(node))

    def _resumed(self, nodes: list[Any], key: tuple[int, ...]) -> int:
        """Where the walk of a block goes on: after the last node it walked, which inserted conversions may have
        moved further down; gone, and the trace is walked again (``_Moved``)."""
        done, last = self.cursors.get(key, (0, None))
        if not done:
            return 0
        if done <= len(nodes) and _identity(nodes[done - 1]) == last:
            return done
        found = next((j for j in range(done - 1, len(nodes)) if _identity(nodes[j]) == last), None)
        if found is None:
            raise _Moved
        return found + 1

    def _marked(self, node: Any, blocks: list[Any], depth: int = 0) -> int:
        mark = _mark(node, lambda v: self._mark_of(v, depth), blocks)
        if mark is None:
            raise _Rejected
        self.marks.update((out.unique(), mark) for out in node.outputs())
        return mark

    def _mark_of(self, value: Any, depth: int) -> int:
        unique = value.unique()
        if unique not in self.marks:  # a conversion inserted before the walk's cursor, or an unknown producer
            node = value.node()
            if depth > 64 or node.kind() == "prim::Param":
                return 1
            self._marked(node, list(node.blocks()), depth + 1)
        return self.marks.get(unique, 1)


@contextlib.contextmanager
def untraced_reads(trace: Trace) -> Iterator[None]:
    """While a trace runs, a tensor's ``.data`` read (the tracer records its values as a constant, with no warning)
    or write (the trace keeps the tensor's earlier value) marks ``trace`` untraced: no test of sizes in it is taken
    for one."""
    import torch

    base = torch._C.TensorBase.data

    def read(tensor: Any) -> Any:
        if torch._C._get_tracing_state() is not None:
            trace.untraced = True
        return base.__get__(tensor)

    def write(tensor: Any, value: Any) -> None:  # values put in untraced: the trace keeps the tensor's old value
        if torch._C._get_tracing_state() is not None:
            trace.untraced = True
        base.__set__(tensor, value)

    had = "data" in vars(torch.Tensor)
    saved = vars(torch.Tensor).get("data")
    torch.Tensor.data = property(read, write)
    try:
        yield
    finally:
        if had:
            torch.Tensor.data = saved
        else:
            del torch.Tensor.data


class _Moved(Exception):
    pass


class _Rejected(Exception):
    """A tensor was sized by values."""


def _identity(node: Any) -> tuple[str, tuple[int, ...]]:
    return node.kind(), tuple(v.unique() for v in node.outputs())


# what a size computed while tracing is made of: size reads (their tensor is not followed), scalar constants,
# conversions, and out-of-place arithmetic and comparisons on those
_SIZE_EXPRESSION = _SIZE_READS | frozenset((
    "prim::NumToTensor", "aten::Int", "aten::IntImplicit", "aten::ScalarImplicit", "aten::Float", "aten::Bool",
    "aten::FloatImplicit", "aten::add", "aten::sub", "aten::rsub", "aten::mul", "aten::div", "aten::floor_divide",
    "aten::floordiv", "aten::remainder", "aten::neg", "aten::gt", "aten::lt", "aten::ge", "aten::le", "aten::eq",
    "aten::ne", "aten::__and__", "aten::__or__", "aten::__not__", "aten::logical_and", "aten::logical_or",
    "aten::logical_not", "aten::minimum", "aten::maximum"))


def _size_expression(value: Any, budget: int = 64) -> bool:
    """Whether the traced ``value`` is made of ``_SIZE_EXPRESSION`` nodes down to size reads and scalar constants
    (a 0-dim tensor constant is one: ``x.shape[0] - 1``'s ``1``), with no recorded write into it or into a tensor
    that may alias it."""
    if value.node().kind() == "prim::Constant":  # not recorded by the trace (its lookup made it a constant)
        return False
    seen: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if current.unique() in seen:
            continue
        seen.add(current.unique())
        node = current.node()
        kind = node.kind()
        if len(seen) > budget or _written_later(current, budget):
            return False
        if kind == "prim::Constant":  # a literal operand (``- 1`` is a 0-dim tensor constant), or module state
            if current.type().kind() == "TensorType" and node.t("value").dim() != 0:
                return False
            continue
        if kind not in _SIZE_EXPRESSION:
            return False
        if kind not in _SIZE_READS:
            stack.extend(node.inputs())
    return True


# ops whose outputs are new tensors (never a view of an input): a write into what they return leaves their inputs
_FRESH = (_SIZE_EXPRESSION - _SIZE_READS) | frozenset((
    "aten::arange", "aten::zeros", "aten::ones", "aten::full", "aten::empty", "aten::zeros_like", "aten::ones_like",
    "aten::full_like", "aten::cat", "aten::stack", "aten::where", "aten::masked_fill", "aten::clone", "aten::index",
    "aten::abs", "aten::min", "aten::max", "aten::sum", "aten::prod", "aten::pow", "aten::sqrt", "aten::exp"))


def _written_later(value: Any, budget: int) -> bool:
    """Whether a recorded node writes (in place, or ``out=``) into ``value`` or into a tensor that may alias it
    (any op's tensor outputs but a ``_FRESH`` one's, followed; an int made from it cannot)."""
    stack, seen = [value], set()
    while stack:
        current = stack.pop()
        if current.unique() in seen:
            continue
        seen.add(current.unique())
        if len(seen) > budget:
            return True
        for use in current.uses():
            node = use.user
            name = node.kind().partition("::")[2]
            if name.endswith("_") and not name.endswith("__") or _written(node, False, len(list(node.inputs()))):
                return True
            if node.kind() not in _FRESH:
                stack.extend(v for v in node.outputs() if _tensor_like(v))
    return False


def _mark(node: Any, mark_of: Any, blocks: list[Any]) -> int | None:
    """The mark of ``node``'s outputs (``mark_of``: a value's), or None when it may size a tensor by values."""
    kind = node.kind()
    if kind in _VALUELESS:
        return 0
    if kind == "prim::Constant":  # a value read untraced (``x.data``) is refused where it is read (``untraced``)
        return 0
    ins = list(node.inputs())
    got = [mark_of(v) for v in ins]
    if blocks:  # a module's forward: its outputs are its block's returns
        got += [mark_of(v) for b in blocks for v in b.outputs()]
    if not any(got):
        return 0
    if kind in _SIZE_READS:
        return 1 if any(got[1:]) else 0  # the tensor's sizes carry no value
    if kind in _PASS_THROUGH:
        return 1
    namespace, _, name = kind.partition("::")
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    if namespace != "aten" or base not in _SIZED_BY_SHAPES:  # any other op: its sizes may follow values
        return None
    if any(m and not _tensor_like(v) for m, v in zip(got[:len(ins)], ins, strict=True)):  # an int, a Scalar, ints
        return None
    if any(not mark_of(r) for k in _written(node, base != name, len(ins)) for r in _roots(ins[k])):
        return None  # values written into a tensor, or a view of one, whose base held none: its reads stay unmarked
    if kind == "aten::where" and len(ins) == 1 or kind == "aten::index" and _masked(ins):
        return None
    return 1


# conversions and containers: their outputs carry what their inputs do (what then reads them is judged)
_PASS_THROUGH = frozenset(("prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack", "prim::TupleUnpack",
                           "prim::NumToTensor", "prim::TracedModuleForward", "aten::Int", "aten::IntImplicit",
                           "aten::ScalarImplicit", "aten::FloatImplicit", "aten::Float", "aten::Bool"))
# aten ops whose outputs' sizes follow from their tensor inputs' sizes and their non-tensor arguments alone (a marked
# non-tensor argument is refused above); an op not listed may size its output by its inputs' values (nonzero,
# unique, masked_select, pack_padded_sequence, to_sparse ...), and so may an op torch adds later
_SIZED_BY_SHAPES = frozenset("""
abs acos acosh add addbmm addcdiv addcmul addmm addmv alias all amax amin any arange argmax argmin argsort asin asinh
atan atan2 atanh avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d
adaptive_max_pool1d adaptive_max_pool2d baddbmm batch_norm bitwise_and bitwise_not bitwise_or bitwise_xor bmm
broadcast_tensors broadcast_to cat ceil celu chunk clamp clamp_max clamp_min clip clone concat concatenate contiguous
conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d _convolution convolution copy cos cosh cumprod
cumsum detach diagonal div dot dropout einsum elu embedding empty empty_like eq erf erfc exp exp2 expand expand_as expm1
feature_dropout fill flatten flip float floor floor_divide fmod frac full full_like gather ge gelu glu group_norm gt
hardsigmoid hardswish hardtanh index index_select instance_norm isfinite isinf isnan layer_norm le leaky_relu lerp
lift_fresh linear linalg_vector_norm log log10 log1p log2 log_softmax _log_softmax logical_and logical_not logical_or
logical_xor logsumexp lt masked_fill matmul max max_pool1d max_pool2d max_pool3d maximum mean min minimum mish mm mul
movedim mv nan_to_num narrow native_layer_norm ne neg new_empty new_full new_ones new_zeros norm ones ones_like outer
permute pixel_shuffle pixel_unshuffle pow prod reciprocal relu relu6 remainder repeat reshape reshape_as roll round
rsqrt rsub scaled_dot_product_attention scatter scatter_add select selu sigmoid sign silu sin sinh slice softmax
_softmax softplus softsign sort split split_with_sizes sqrt square squeeze stack std sub sum t take_along_dim tan tanh
threshold to topk transpose tril triu true_divide trunc type_as unbind unflatten unsqueeze upsample_bilinear2d
upsample_nearest1d upsample_nearest2d upsample_nearest3d var view view_as where zero zeros zeros_like
__and__ __or__ __xor__ __invert__ __lshift__ __rshift__
""".split())


# ops whose output is a view of their first input (an in-place write into it writes into that input)
_VIEWS = frozenset(("aten::view", "aten::reshape", "aten::slice", "aten::select", "aten::narrow", "aten::transpose",
                    "aten::permute", "aten::expand", "aten::expand_as", "aten::view_as", "aten::reshape_as",
                    "aten::squeeze", "aten::unsqueeze", "aten::t", "aten::diagonal", "aten::unflatten",
                    "aten::flatten", "aten::as_strided", "aten::alias", "aten::detach", "aten::movedim",
                    "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::unfold",
                    "aten::contiguous", "aten::to", "aten::type_as", "prim::ListUnpack", "aten::__getitem__",
                    "aten::broadcast_tensors", "aten::broadcast_to", "aten::meshgrid", "aten::tensor_split",
                    "aten::swapaxes", "aten::swapdims", "aten::unsafe_split", "aten::unsafe_chunk", "aten::dropout",
                    "aten::feature_dropout", "aten::view_as_real", "aten::view_as_complex", "aten::real",
                    "aten::imag"))


def _roots(value: Any) -> list[Any]:
    """The tensors ``value`` may be a view of (through views, and into every element of the lists split / chunk /
    unbind / broadcast_tensors take or return), else itself."""
    found, stack, seen = [], [value], set()
    while stack and len(seen) < 256:
        current = stack.pop()
        if current.unique() in seen:
            continue
        seen.add(current.unique())
        node = current.node()
        inputs = list(node.inputs())
        if node.kind() in _VIEWS and inputs:
            stack.append(inputs[0])
        elif node.kind() == "prim::ListConstruct" and inputs:
            stack.extend(inputs)
        else:
            found.append(current)
    return found if not stack else [*found, *stack]


def _written(node: Any, in_place: bool, count: int) -> list[int]:
    """The inputs ``node`` writes into: ``self`` of an in-place op, any argument its schema marks mutable (``out=``)."""
    try:
        schema = node.schema()
    except Exception:  # noqa: BLE001 - a node without a schema: its in-place form only
        schema = ""
    written = [0] if in_place else []
    if "!" in schema:
        arguments = schema.partition("(")[2].rpartition(") ->")[0].replace("*, ", "").split(", ")
        written += [k for k, a in enumerate(arguments) if "!" in a.split(" ")[0] and k < count]
    return sorted(set(written))


def _masked(ins: list[Any]) -> bool:
    """An index by a boolean (or untyped) mask: the output's size is its count of True."""
    listed = ins[1].node() if len(ins) > 1 else None
    indices = list(listed.inputs()) if listed is not None and listed.kind() == "prim::ListConstruct" else None
    return indices is None or any(_mask_or_unknown(v) for v in indices)


def _tensor_like(value: Any) -> bool:
    """A tensor, or a list / optional of tensors (``torch.cat``'s, an index's): what reaches an op as data."""
    kind = value.type()
    while kind.kind() in ("ListType", "OptionalType"):
        kind = kind.getElementType()
    return kind.kind() == "TensorType"


def _mask_or_unknown(value: Any) -> bool:
    import torch

    kind = value.type()
    if kind.kind() == "NoneType":
        return False
    while kind.kind() == "OptionalType":
        kind = kind.getElementType()
    return kind.kind() != "TensorType" or kind.dtype() in (torch.bool, torch.uint8, None)
