"""Example inputs: parsing ``--input-shape``, naming and seeded variants (``--example-inputs`` is read in
load/tensor_files.py)."""
from __future__ import annotations

import inspect
from typing import Any

from ..errors import PrepareError
from ..options import InputSpec
from .signature import graph_embedding_rows, spec_dtypes


def forward_input_names(model: Any) -> list[str]:
    """Names of the model's forward parameters, in order (no *args/**kwargs)."""
    schema = getattr(getattr(model, "forward", None), "schema", None)
    if schema is not None:  # TorchScript
        return [a.name for a in schema.arguments if a.name != "self"]
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def embedding_vocab(model: Any, name: str | None = None) -> int:
    """Upper bound for random token ids: the rows of the Embedding that reads input ``name`` in a
    torch.export graph, else the config's vocab size, else the smallest Embedding table (2 if none)."""
    rows = graph_embedding_rows(model).get(name) if name else None
    if rows:
        return rows
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0:
        return vocab
    import torch

    sizes = ([m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
             if isinstance(model, torch.nn.Module) else [])
    return min(sizes) if sizes else 2


def _is_mask(name: str) -> bool:
    return "mask" in name.lower()


def padded_mask(shape: tuple[int, ...], dtype: Any, gen: Any, where: str = "end") -> Any:
    """A 0/1 mask over the last dimension with padding: rows keep different numbers of tokens
    (``where="end"``: zeros at the end; ``"middle"``: a run of zeros inside, as packed sequences have)."""
    import torch

    mask = torch.ones(shape, dtype=torch.int64)
    length = shape[-1] if shape else 1
    if not shape or length < 2:
        return mask.to(dtype)
    rows = mask.view(-1, length)
    for r in range(rows.shape[0]):
        pad = 1 + int(torch.randint(0, max(length // 2, 1), (1,), generator=gen))
        if where == "end":
            rows[r, length - pad:] = 0
        else:
            start = max(1, (length - pad) // 2)
            rows[r, start:min(start + pad, length - 1)] = 0
    return mask.to(dtype)


def tensors_from_specs(specs: list[InputSpec], model: Any, seed: int = 0) -> dict[str, Any]:
    """Build example tensors from shapes, of the dtype the spec or the model gives (inputs.signature):
    seeded normal floats; an embedding's indices across its rows; 0/1 masks of ones except padding at the
    end of later batch rows (each row a different length)."""
    import torch

    dtypes, rows = spec_dtypes(model, specs)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for spec in specs:
        dtype = getattr(torch, dtypes[spec.name])
        if dtype.is_floating_point:
            out[spec.name] = torch.randn(spec.example_shape, generator=gen).to(dtype)
        elif dtype == torch.bool or (_is_mask(spec.name) and spec.name not in rows):
            mask = padded_mask(spec.example_shape, dtype, gen)
            if len(spec.example_shape) >= 2:
                mask.view(-1, spec.example_shape[-1])[0] = 1  # the first row unpadded, the others padded
            else:
                mask = torch.ones(spec.example_shape, dtype=dtype)
            out[spec.name] = mask
        else:
            high = min(rows.get(spec.name) or embedding_vocab(model, spec.name), 2**31 - 1)
            out[spec.name] = torch.randint(0, high, spec.example_shape, generator=gen, dtype=torch.int64).to(dtype)
    return out


def check_input_names(names: list[str], accepted: list[str], source: str) -> None:
    unknown = [n for n in names if accepted and n not in accepted]
    if unknown:
        raise PrepareError(
            f"input(s) {', '.join(unknown)} from {source} are not parameters of the model's forward "
            f"({', '.join(accepted)}); name the inputs after the forward parameters"
        )


FLOAT_DISTRIBUTIONS = ("normal", "uniform", "laplace", "wide_normal")
# Draws that look like the model's real inputs decide parity; the others are specialisation probes, judged
# relative to their own output. Measured on a 224 px ImageNet-normalised example (max |x| of the draw / the
# example's, std): normal 1.32 / 0.75, uniform 1.00 / 1.3 (inside the example's range by construction),
# laplace 2.73 / 0.75, wide_normal 2.89 / 1.5: the last two reach values the example never has (fp16 overflow
# on such values is not the device's behaviour on real inputs). Output peaks across 12 vision models, median
# (max) of the example's: normal 0.97 (1.53), uniform 1.59 (3.42), laplace 1.05 (1.28), wide_normal 2.18 (3.37)
REALISTIC_DISTRIBUTIONS = ("normal", "uniform")
PROBE_DISTRIBUTIONS = ("laplace", "wide_normal")


def set_label(source: str, kind: str, index: int, probe: bool = False) -> dict[str, Any]:
    """What one parity input set is: its ``index`` in the run, ``source`` (example / random / parity_data /
    trace_path), ``kind`` (the distribution, ``sample k``, the probe) and its ``role``: ``verdict`` sets
    decide parity, ``probe`` sets check that the graph follows the model off the example's distribution."""
    return {"index": index, "source": source, "kind": kind, "role": "probe" if probe else "verdict"}


def variant_labels(inputs: dict[str, Any], count: int, first_index: int,
                   distributions: tuple[str, ...] = FLOAT_DISTRIBUTIONS) -> list[dict[str, Any]]:
    """The labels of ``random_variants(inputs, count, ..., distributions)``: a variant is a probe when it drew
    floats from a probe distribution; inputs with no floats (token ids, masks) vary in ids and padding only,
    which real inputs do too, so those variants decide."""
    floats = any(t.dtype.is_floating_point and t.numel() > 0 for t in inputs.values())
    masks = any(_is_mask(n) and not t.dtype.is_floating_point for n, t in inputs.items())
    labels = []
    for k in range(count):
        dist = distributions[k % len(distributions)]
        if floats:
            kind = dist
        else:
            kind = ("padding at the end" if k % 2 == 0 else "padding in the middle") if masks else "random ids"
        labels.append(set_label("random", kind, first_index + k, floats and dist in PROBE_DISTRIBUTIONS))
    return labels


def random_variants(inputs: dict[str, Any], count: int, seed: int, vocab: dict[str, int] | None = None,
                    distributions: tuple[str, ...] = FLOAT_DISTRIBUTIONS) -> list[dict[str, Any]]:
    """``count`` seeded inputs shaped like ``inputs`` that try to find bugs: floats drawn from
    several distributions around the example's mean and spread (normal, uniform over the example's
    range, heavy-tailed Laplace, wider normal); ``*mask*`` 0/1 inputs with padding (zeros at the end, then
    in the middle, each batch row a different length); an embedding's indices across ``vocab[name]`` (its
    rows, with both ends hit) when known, else inside the example's range; booleans kept."""
    import torch

    from .boxes import is_boxes, random_boxes

    gen = torch.Generator().manual_seed(seed)
    variants = []
    for k in range(count):
        one = {}
        for name, t in inputs.items():
            if t.numel() == 0:
                one[name] = t.clone()
            elif t.dtype.is_floating_point:
                one[name] = _float_variant(t, distributions[k % len(distributions)], gen)
            elif is_boxes(name, t):  # valid boxes over the example's coordinates
                one[name] = random_boxes(tuple(t.shape), max(int(t.max()), 1), gen, t.dtype)
            elif (_is_mask(name) and name not in (vocab or {}) and t.dim() >= 1
                  and int(t.min()) >= 0 and int(t.max()) <= 1):
                one[name] = padded_mask(tuple(t.shape), t.dtype, gen, "end" if k % 2 == 0 else "middle")
            elif t.dtype == torch.bool:
                one[name] = t.clone()
            elif vocab and vocab.get(name, 0) > 2:
                ids = torch.randint(0, vocab[name], t.shape, generator=gen)
                flat = ids.view(-1)
                flat[0], flat[-1] = (vocab[name] - 1, 0) if k % 2 == 0 else (0, vocab[name] - 1)
                one[name] = ids.to(t.dtype)
            else:
                lo, hi = int(t.min()), int(t.max())
                one[name] = t.clone() if lo == hi else torch.randint(lo, hi + 1, t.shape, generator=gen).to(t.dtype)
        variants.append(one)
    return variants


def _float_variant(t: Any, kind: str, gen: Any) -> Any:
    import torch

    x = t.detach().float()
    mean = float(x.mean())
    std = float(x.std()) if x.numel() > 1 else 0.0
    std = std if std > 0 else 1.0
    if kind == "normal":
        y = mean + std * torch.randn(t.shape, generator=gen)
    elif kind == "uniform":
        lo, hi = float(x.min()), float(x.max())
        lo, hi = (lo, hi) if hi > lo else (mean - std, mean + std)
        y = lo + (hi - lo) * torch.rand(t.shape, generator=gen)
    elif kind == "laplace":  # Laplace with the same spread: heavy tails, a few large values
        u = torch.rand(t.shape, generator=gen).clamp(1e-6, 1 - 1e-6) - 0.5
        y = mean - (std / 2 ** 0.5) * torch.sign(u) * torch.log1p(-2 * u.abs())
    else:
        y = mean + 2 * std * torch.randn(t.shape, generator=gen)
    return y.to(t.dtype)


def flatten_outputs(outputs: Any) -> tuple[list[str], list[Any]]:
    """Flatten a model's outputs (tensor, tuple, dict, transformers ModelOutput) into names and tensors."""
    import torch
    from torch.utils import _pytree as pytree

    if hasattr(outputs, "to_tuple") and hasattr(outputs, "keys"):  # transformers ModelOutput
        outputs = {k: outputs[k] for k in outputs.keys()}
    leaves, _ = pytree.tree_flatten_with_path(outputs)
    names, tensors = [], []
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        key = ".".join(_key_str(k) for k in path) or "output"
        names.append(key if not key[0].isdigit() else f"output_{key}")
        tensors.append(leaf)
    return names, tensors


def _key_str(k: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)
