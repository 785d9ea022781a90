"""Run PyTorch's OpInfo samples on npu-sim against the CPU: ``python opinfo_npu_sim.py CHUNK CHUNKS LOG [N]``.

Every OpInfo whose CPU kernels support float32, in chunk CHUNK of CHUNKS (ops dealt round-robin by name):
the first N samples (default 1) run forward on CPU and on npu-sim (same seed, so random ops draw the same
numbers from the shared CPU generator), outputs compared with ``torch.testing.assert_close``; when the op
supports autograd, the gradient of the summed floating outputs is compared too. One JSON line per event is
appended to LOG and flushed before the op runs, so a crash (a segfault takes the process with it) is
attributed to the op that started last. Lines: {"begin": op}, {"op", "status", "detail", "compared"}.

Status: "ok" (at least one sample compared, all equal), "failed", "skipped" (an input npu-sim does not
emulate), or "not_compared" (no sample the CPU accepts: nothing was compared, so nothing is claimed).
"""
from __future__ import annotations

import itertools
import json
import os
import sys

import torch
from torch.utils import _pytree as pytree

# What npu-sim does not (and need not) reproduce, by OpInfo name, with the reason.
METADATA_ONLY = {  # outputs whose values are unspecified: only shape, dtype and device are compared
    "empty": "uninitialized memory", "empty_like": "uninitialized memory", "new_empty": "uninitialized memory",
    "new_empty_strided": "uninitialized memory", "empty_strided": "uninitialized memory",
    "empty_permuted": "uninitialized memory", "nn.functional.dropout": "random mask",
    "torch._C._nn._test_warn_in_autograd": "test helper",
}
EXCEPTIONS = {  # op -> why it cannot match on npu-sim: it fails with the message given here
    "to_sparse": "sparse layouts: npu-sim emulates dense tensors and refuses with NpuSimError",
}


INPUT_ONLY = {  # ops whose other tensor arguments must stay on the CPU, as on CUDA: only the input moves
    "tensor_split": "indices_or_sections is a CPU tensor by contract",
}


def _npu(x):
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise _Skip(f"{x.layout} input: npu-sim emulates dense (strided) tensors only")
        t = x.detach().to("npu")
        return t.requires_grad_(x.requires_grad) if (x.is_floating_point() or x.is_complex()) else t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("npu")
    if isinstance(x, str) and x == "cpu":
        return "npu"
    return x


class _Skip(Exception):
    pass


def _leaves(x):
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _run(op, sample, to_npu: bool):
    args = (sample.input, *sample.args)
    kwargs = dict(sample.kwargs)
    if to_npu and op.name in INPUT_ONLY:
        args = (_npu(args[0]), *args[1:])
    elif to_npu:
        args, kwargs = pytree.tree_map(_npu, (args, kwargs))
    torch.manual_seed(0)
    out = op(*args, **kwargs)
    grads = None
    inputs = [t for t in _leaves((args, kwargs)) if t.requires_grad]
    diff = [o for o in _leaves(out) if o.requires_grad and (o.is_floating_point() or o.is_complex())]
    if op.supports_autograd and inputs and diff:
        total = sum(o.real.sum() if o.is_complex() else o.sum() for o in diff)
        grads = torch.autograd.grad(total, inputs, allow_unused=True)
    return out, grads


def _compare(name, cpu, npu):
    c, n = _leaves(cpu), _leaves(npu)
    if len(c) != len(n):
        raise AssertionError(f"{len(n)} tensors on npu-sim, {len(c)} on CPU")
    for a, b in zip(c, n, strict=False):
        if b.device.type != "npu" and a.device.type == "cpu":
            raise AssertionError(f"a result is on {b.device}, not npu")
        b = b.detach().cpu()
        a = a.detach()
        if name in METADATA_ONLY:
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
            continue
        torch.testing.assert_close(b, a, equal_nan=True, check_device=False)


def main() -> None:
    chunk, chunks, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    per_op = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    skip_before = sys.argv[5] if len(sys.argv) > 5 else ""  # resume after a crash: ops up to this one are done
    from torch.testing._internal.common_methods_invocations import op_db

    import cann.torch

    cann.torch.enable("npu-sim")
    ops = sorted((o for o in op_db if torch.float32 in o.supported_dtypes("cpu")),
                 key=lambda o: (o.name, o.variant_test_name))
    mine = ops[chunk::chunks]
    only = os.environ.get("CANN_EXPORT_OPINFO_ONLY")  # a comma-separated list of ops, for bisecting
    if only:
        wanted = only.split(",")
        mine = sorted((o for o in ops if (f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name)
                       in wanted), key=lambda o: wanted.index(f"{o.name}.{o.variant_test_name}"
                                                                if o.variant_test_name else o.name))
    names = [f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name for o in mine]
    start = names.index(skip_before) + 1 if skip_before in names else 0
    with open(log, "a", encoding="utf-8") as f:
        def emit(**record):
            f.write(json.dumps(record) + "\n")
            f.flush()

        for op, full in zip(mine[start:], names[start:], strict=False):
            emit(begin=full)
            status, detail, compared = "ok", "", 0
            try:
                for sample in itertools.islice(op.sample_inputs("cpu", torch.float32,
                                                                requires_grad=op.supports_autograd), per_op):
                    try:
                        cpu = _run(op, sample, False)
                    except Exception:  # noqa: BLE001, S112 - a sample the CPU itself rejects proves nothing
                        continue
                    npu = _run(op, sample, True)
                    _compare(op.name, cpu[0], npu[0])
                    if cpu[1] is not None:
                        _compare(op.name, [g for g in cpu[1] if g is not None],
                                 [g for g in npu[1] if g is not None])
                    compared += 1
                if compared == 0:
                    status, detail = "not_compared", f"none of the first {per_op} sample(s) runs on the CPU"
            except _Skip as e:
                status, detail = "skipped", str(e)
            except Exception as e:  # noqa: BLE001 - recorded per op, judged by the test
                status, detail = "failed", f"{type(e).__name__}: {str(e)[:300]}"
            emit(op=full, status=status, detail=detail, compared=compared)


if __name__ == "__main__":
    main()
