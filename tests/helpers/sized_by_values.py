"""Modules whose only tracer warning tests a size (``if r.shape[0] > 2``) that input values set without a warning of
their own: each must be probed (capture/trace_taint.py); ``Fine`` tests a size made from sizes and needs no probe.
Each traced graph differs from eager on a sign-flipped or scaled copy of the example the tests use."""
import torch
from torch.nn.utils.rnn import pack_padded_sequence


def tail(x, r):
    if r.shape[0] > 2:
        return x + 1
    return x - 1


class Arange(torch.nn.Module):  # a count as a size argument, a 0-dim tensor the tracer takes as an int
    def forward(self, x):
        return tail(x, torch.arange((x > 0.5).sum()))


class Alias(torch.nn.Module):  # values copied into a base whose earlier view is read
    def forward(self, x):
        buf = torch.zeros(4)
        view = buf[:]
        buf.copy_(x[:4])
        return tail(x, torch.arange((view > 0.5).sum()))


class SelectFill(torch.nn.Module):  # values written through a view (select) of a tensor that held none
    def forward(self, x):
        buf = torch.zeros(2, 6)
        buf[0] = x
        return tail(x, torch.arange((buf > 0.5).sum()))


class ViewAdd(torch.nn.Module):
    def forward(self, x):
        buf = torch.zeros(6)
        buf.view(-1).add_(x)
        return tail(x, torch.arange((buf > 0.5).sum()))


class ViewAs(torch.nn.Module):  # a view made marked by its other argument, written into: its base stays unmarked
    def forward(self, x):
        buf = torch.zeros(x.shape[0])
        buf.view_as(x).copy_(x)
        return tail(x, torch.arange((buf > 0.5).sum()))


class OutView(torch.nn.Module):  # out= into a view of a tensor that held no values
    def forward(self, x):
        buf = torch.zeros(2, x.shape[0])
        torch.add(x, 0.0, out=buf[0])
        return tail(x, torch.arange((buf > 0.5).sum()))


class Split(torch.nn.Module):  # torch's own code converts the count (int(split_size)): the graph holds a constant
    def forward(self, x):
        return tail(x, torch.split(x, (x > 0.5).sum())[0])


class Pack(torch.nn.Module):  # an op PyTorch does not tag as sized by values
    def forward(self, x):
        lengths = (x[:2] > 0.5).long() + 1
        return tail(x, pack_padded_sequence(x.reshape(-1, 2, 1)[:2], lengths, enforce_sorted=False).data)


class Sparse(torch.nn.Module):
    def forward(self, x):
        return tail(x, (x > 0.5).float().to_sparse()._values())


class Data(torch.nn.Module):  # .data: read untraced, a constant in the trace
    def forward(self, x):
        return tail(x, torch.arange((x.data > 0.5).sum()))


class Fine(torch.nn.Module):
    def forward(self, x):
        return tail(x, x[: x.shape[0] - 1])


def tail_limit(x, n):
    """A test of sizes against an argument: the tracer hands a size computed from ``.shape`` on as a 0-dim tensor."""
    if (limit := n + 2) < x.shape[0]:
        return x + 1
    return x - limit


class ValueArgument(torch.nn.Module):  # the argument is a count of values
    def forward(self, x):
        return tail_limit(x, (x > 0.5).sum())


class SizeArgument(torch.nn.Module):  # the argument is a size (as transformers' kv_length): no probe
    def forward(self, x):
        return tail_limit(x, x.shape[0] - 1)


class ItemOfValues(torch.nn.Module):  # a test of a count, converted with .item()
    def forward(self, x):
        flag = (x > 0.5).sum() > 3
        flag = flag.item()
        return x + 1 if flag else x - 1


class ItemOfSize(torch.nn.Module):  # as transformers' sdpa: ``is_causal = is_causal.item()`` of a test of sizes
    def forward(self, x):
        flag = x.shape[0] > 3
        flag = flag.item()
        return x + 1 if flag else x - 1


class Walrus(torch.nn.Module):  # the test rebinds n (:=) after reading it: the frame holds the new, a size
    def forward(self, x):
        n = (x > 0.5).sum()
        if (n > 2) & ((n := x.shape[0]) > 0):
            return x + 1
        return x - 1


class BroadcastWrite(torch.nn.Module):  # values written into n through a broadcast_tensors view of it
    def forward(self, x):
        n = torch.zeros((), dtype=torch.long)
        count = (x > 0.5).sum().reshape(1)
        v, _ = torch.broadcast_tensors(n, count)
        v.copy_(count)
        if n > 2:
            return x + 1
        return x - 1


class BroadcastArange(torch.nn.Module):  # the same write, the count then sizing a tensor
    def forward(self, x):
        n = torch.zeros((), dtype=torch.long)
        count = (x > 0.5).sum().reshape(1)
        v, _ = torch.broadcast_tensors(n, count)
        v.copy_(count)
        return tail(x, torch.arange(n))


class DataSet(torch.nn.Module):  # values put in with the .data setter (untraced: the trace keeps zeros)
    def forward(self, x):
        n = torch.zeros((), dtype=torch.long)
        n.data = (x > 0.5).sum()
        return tail(x, torch.arange(n))


PROBED = (Arange, Alias, SelectFill, ViewAdd, ViewAs, OutView, Split, Pack, Sparse, Data, ValueArgument, ItemOfValues,
          Walrus, BroadcastWrite, BroadcastArange, DataSet)
FINE = (Fine, SizeArgument, ItemOfSize)


class TensorAttribute(torch.nn.Module):  # a plain 0-dim tensor attribute the test reads: looked up, never crashes
    def __init__(self) -> None:
        super().__init__()
        self.limit = torch.tensor(0)

    def forward(self, x):
        if x.shape[0] > 2 and self.limit < 1:
            return x * 2 + self.limit
        return x - 1


def _floor_test(x, floor=torch.tensor(1)):  # noqa: B008 - the default tensor is the case
    if x.shape[0] > 2 and floor > 0:
        return x * floor
    return x


class DefaultTensor(torch.nn.Module):  # a helper's default 0-dim tensor
    def forward(self, x):
        return _floor_test(x)


class GradAttribute(torch.nn.Module):  # a grad-requiring tensor the test never reaches (short-circuit)
    def __init__(self) -> None:
        super().__init__()
        self.limit = torch.tensor(0.0, requires_grad=True)

    def forward(self, x):
        if x.shape[0] > 2 or self.limit < 1:
            return x + 1
        return x - 1


UNTRACED = (TensorAttribute, DefaultTensor, GradAttribute)
