"""npu-sim's placement rule against torch's own: ``python placement_oracle.py CHUNK CHUNKS LOG``.

For the first OpInfo sample of every op with float32 CPU support (chunk CHUNK of CHUNKS, dealt round-robin
by name) with at least two tensors: the tensors are dealt alternately to npu and to the CPU (the first to
npu), and the op runs twice on that mix:

* the oracle: under torch's ``FakeTensorMode``, the npu tensors as fake ``cuda`` tensors (FakeTensor's device
  propagation: devices must match unless a tensor is a 0-dim CPU one, with torch's own exceptions such as
  CPU indices); torch's fake run decides "raises" or "runs", npu-sim's code takes no part in it;
* npu-sim, on the real tensors.

One JSON line per op is appended to LOG: {"op", "oracle", "npu_sim", "detail"}, where oracle and npu_sim are
"mismatch" (a device-mismatch error), "runs", or, for the oracle only, "unknown" (the fake run failed for a
reason other than devices, or the all-cuda run itself fails: nothing is claimed); npu_sim is "error" when it
raised something other than torch's mismatch message.
"""
from __future__ import annotations

import itertools
import json
import sys

import torch
from torch.utils import _pytree as pytree

MISMATCH = "Expected all tensors to be on the same device"
SAMPLES = 8  # samples looked at per op for one with two tensors or more


def _deal(sample):
    """The sample's (args, kwargs) with the tensor leaves numbered in order: even ones go to npu."""
    counter = itertools.count()
    return pytree.tree_map(lambda x: (next(counter), x) if isinstance(x, torch.Tensor) else x,
                           ((sample.input, *sample.args), dict(sample.kwargs)))


def _place(dealt, on_npu, mix: bool):
    def f(x):
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], torch.Tensor):
            k, t = x
            return on_npu(t) if (not mix or k % 2 == 0) else t
        return x
    return pytree.tree_map(f, dealt, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2
                           and isinstance(x[0], int) and isinstance(x[1], torch.Tensor))


def _fake_outcome(op, dealt, mix: bool) -> tuple[str, str]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    cuda = torch.device("cuda")

    def to_fake(t):
        with mode:
            if t.layout != torch.strided:
                raise _Unknown("non-strided input")
            return torch.ops.aten.empty_strided.default(t.shape, t.stride(), dtype=t.dtype, device=cuda)

    try:
        placed = _place(dealt, to_fake, mix)
        args, kwargs = pytree.tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor)
                                       and not isinstance(x, torch._subclasses.FakeTensor) else x, placed)
        with mode:
            op(*args, **kwargs)
    except _Unknown as e:
        return "unknown", str(e)
    except Exception as e:  # noqa: BLE001 - classified below
        text = f"{type(e).__name__}: {e}"
        if type(e).__name__ == "FakeTensorDeviceMismatchError" or MISMATCH in text or (mix and "device" in text):
            return "mismatch", text[:300]
        return "unknown", text[:300]
    return "runs", ""


class _Unknown(Exception):
    pass


def _npu_outcome(op, dealt) -> tuple[str, str]:
    def to_npu(t):
        return t.detach().to("npu")

    try:
        args, kwargs = _place(dealt, to_npu, True)
        torch.manual_seed(0)
        op(*args, **kwargs)
    except RuntimeError as e:  # torch's message, or an op's own device check ("... on the same device")
        if MISMATCH in str(e) or "device" in str(e):
            return "mismatch", str(e)[:300]
        return "error", f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:  # noqa: BLE001 - recorded, judged by the test
        return "error", f"{type(e).__name__}: {str(e)[:300]}"
    return "runs", ""


def _first_mixable(op, record):
    """The first of the op's first SAMPLES samples with two tensors or more, dealt; None if none has."""
    try:
        for sample in itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=False), SAMPLES):
            dealt = _deal(sample)
            if sum(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(dealt)) >= 2:
                return dealt
    except Exception as e:  # noqa: BLE001 - an op whose samples cannot be made proves nothing
        record["detail"] = f"samples: {type(e).__name__}"
        return None
    record["detail"] = f"no sample with two tensors among the first {SAMPLES}"
    return None


def main() -> None:
    chunk, chunks, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    from torch.testing._internal.common_methods_invocations import op_db

    import cann.torch

    cann.torch.enable("npu-sim")
    ops = sorted((o for o in op_db if torch.float32 in o.supported_dtypes("cpu")),
                 key=lambda o: (o.name, o.variant_test_name))
    with open(log, "a", encoding="utf-8") as f:
        for op in ops[chunk::chunks]:
            full = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
            record = {"op": full}
            dealt = _first_mixable(op, record)
            if dealt is None:
                record.update(oracle="unknown", npu_sim="")
            else:
                base, why = _fake_outcome(op, dealt, mix=False)
                if base != "runs":  # the op does not run on fake cuda at all: nothing to learn about devices
                    record.update(oracle="unknown", npu_sim="", detail=f"all on fake cuda: {why}")
                else:
                    oracle, why = _fake_outcome(op, dealt, mix=True)
                    npu, detail = _npu_outcome(op, dealt) if oracle != "unknown" else ("", "")
                    record.update(oracle=oracle, npu_sim=npu, detail=(detail or why)[:300])
            f.write(json.dumps(record) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
