"""--model-class weights load onto a meta-device skeleton (load/meta_build.py): the same module as the copying
load, the file's tensors assigned rather than copied, and the same refusals for keys and shapes."""
from pathlib import Path

import pytest
import torch

from cann_export.errors import LoadError
from cann_export.load.file_loaders import build_from_state_dict
from cann_export.load.meta_build import build_skeleton, parameters_on_meta
from cann_export.options import ExportOptions
from helpers import meta_models

PATH = Path("weights.safetensors")
GPT2, BERT = "helpers.meta_models:tiny_gpt2_lm", "helpers.meta_models:tiny_bert"


def _state(factory, seed=1):
    torch.manual_seed(seed)
    model = factory()
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _load(cls, state):
    return build_from_state_dict(state, ExportOptions(model_class=cls), PATH)


@pytest.mark.parametrize("cls,factory", [(GPT2, meta_models.tiny_gpt2_lm), (BERT, meta_models.tiny_bert)])
def test_meta_load_gives_the_copying_loads_module(cls, factory):
    ref, state = _state(factory)
    model = _load(cls, dict(state))
    assert not [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    # the file's tensors are the module's now: assigned, not copied into a random-initialised twin
    params = dict(model.named_parameters(remove_duplicate=False))
    assert {p.data_ptr() for p in params.values()} <= {v.data_ptr() for v in state.values()}
    if cls == GPT2:  # the tie survives: one tensor, as in the copying load
        assert model.lm_head.weight is model.transformer.wte.weight
    torch.manual_seed(7)
    copying = factory()
    copying.load_state_dict(state, strict=True)
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        got, want, ref_out = model(input_ids=ids), copying(input_ids=ids), ref(input_ids=ids)
    key = "logits" if "logits" in got else "last_hidden_state"
    assert torch.equal(got[key], want[key]) and torch.equal(got[key], ref_out[key])


def test_skeleton_parameters_take_no_memory_and_the_patch_is_undone():
    original = torch.nn.Module.register_parameter
    model = build_skeleton(meta_models.tiny_bert, {})
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {b.device.type for b in model.buffers()} == {"cpu"}  # position ids etc. keep their values
    assert torch.nn.Module.register_parameter is original
    with pytest.raises(ValueError), parameters_on_meta():
        raise ValueError("leaves the context")
    assert torch.nn.Module.register_parameter is original and torch.nn.Linear(2, 2).weight.device.type == "cpu"


@pytest.mark.parametrize("name", ["reads_its_weights", "keeps_a_derived_tensor"])
def test_a_factory_that_computes_with_its_weights_falls_back_to_the_copying_load(name):
    ref, state = _state(getattr(meta_models, name))
    model = _load(f"helpers.meta_models:{name}", dict(state))
    x = torch.randn(3, 8)
    assert torch.equal(model(x), ref(x))


def test_half_precision_weights_are_cast_to_the_modules_dtype():
    ref, state = _state(meta_models.tiny_bert)
    model = _load(BERT, {k: (v.half() if v.is_floating_point() else v) for k, v in state.items()})
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert torch.equal(model.pooler.dense.weight, state["pooler.dense.weight"].half().float())


def _copying_error(cls, factory, state):
    torch.manual_seed(0)
    try:
        factory().load_state_dict(state, strict=True)
    except RuntimeError as e:
        return f"weights do not fit {cls}: {' '.join(str(e).split())[:500]}"
    raise AssertionError("the copying load accepted it")


def test_mismatched_keys_and_shapes_are_refused_as_before():
    _, state = _state(meta_models.tiny_bert)
    missing = {k: v for k, v in state.items() if k != "pooler.dense.bias"}
    missing["extra.weight"] = torch.zeros(1)
    with pytest.raises(LoadError) as err:
        _load(BERT, missing)
    assert ("weights do not match helpers.meta_models:tiny_bert: missing keys: pooler.dense.bias; "
            "unexpected keys: extra.weight. Check --model-class and --model-kwargs") in str(err.value)
    wrong = dict(state)
    wrong["pooler.dense.weight"] = torch.zeros(32, 31)
    with pytest.raises(LoadError) as err:
        _load(BERT, wrong)
    expected = _copying_error(BERT, meta_models.tiny_bert, dict(wrong))
    assert expected in str(err.value) and "size mismatch for pooler.dense.weight" in expected
