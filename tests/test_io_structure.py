"""structure_copy gives what copy.deepcopy gives a module: the same tree of new objects, ties and shared objects
kept, parameters from the memo, buffers and other values copied, classes with their own copy deep-copied;
state_tensors gives state_dict(keep_vars=True)'s tensors and which are buffers, whatever the module does to its state
dict."""

import copy
import types

import pytest
import torch
from torch import nn

from ram_live.io.structure import state_tensors, structure_copy


class Settings:
    def __init__(self) -> None:
        self.sizes = [3, 4]


class OwnCopy(nn.Module):
    copies = 0

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))

    def __deepcopy__(self, memo):
        OwnCopy.copies += 1
        new = OwnCopy()
        memo[id(self)] = new
        return new


class Block(nn.Module):
    def __init__(self, settings: Settings, shared: nn.Module) -> None:
        super().__init__()
        self.settings = settings  # one object shared by several modules (a model's config)
        self.lin = nn.Linear(3, 4)
        self.shared = shared
        self.register_buffer("steps", torch.arange(3.0))
        self.register_buffer("cache", torch.ones(2), persistent=False)
        self.names = {"a": [1, 2]}
        self.missing = None


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        settings, shared = Settings(), nn.Linear(4, 4)
        self.blocks = nn.ModuleList([Block(settings, shared) for _ in range(2)])
        self.head = nn.Linear(3, 4)
        self.head.weight = self.blocks[0].lin.weight  # tied
        self.own = OwnCopy()
        self.blocks[1].register_forward_hook(lambda module, args, out: out)


def _fresh(model: nn.Module) -> dict[int, nn.Parameter]:
    return {id(p): nn.Parameter(torch.zeros_like(p), requires_grad=p.requires_grad) for p in model.parameters()}


def test_matches_deepcopy():
    model = Model()
    memo_a, memo_b = _fresh(model), _fresh(model)
    expected, got = copy.deepcopy(model, memo_a), structure_copy(model, memo_b)
    pairs = list(zip(model.named_modules(remove_duplicate=False), expected.named_modules(remove_duplicate=False)))
    assert [n for (n, _), _ in pairs] == [n for n, _ in got.named_modules(remove_duplicate=False)]
    for ((name, orig), (_, want)), (_, have) in zip(pairs, got.named_modules(remove_duplicate=False)):
        assert type(have) is type(want) and have is not orig, name
        assert set(vars(have)) == set(vars(want)), name
    # parameters are the memo's (OwnCopy's own copy makes its own), ties kept
    for key, p in got.named_parameters(remove_duplicate=False):
        if not key.startswith("own."):
            assert any(p is q for q in memo_b.values()), key
    assert got.head.weight is got.blocks[0].lin.weight
    # shared objects copied once and shared in the copy
    assert got.blocks[0].shared is got.blocks[1].shared is not model.blocks[0].shared
    assert got.blocks[0].settings is got.blocks[1].settings is not model.blocks[0].settings
    assert got.blocks[0].settings.sizes == [3, 4] and got.blocks[0].settings.sizes is not model.blocks[0].settings.sizes
    assert got.blocks[0].names == {"a": [1, 2]} and got.blocks[0].names["a"] is not model.blocks[0].names["a"]
    # buffers copied (values equal, new memory), the non-persistent set kept
    for block, orig in zip(got.blocks, model.blocks):
        assert torch.equal(block.steps, orig.steps) and block.steps.data_ptr() != orig.steps.data_ptr()
        assert block._non_persistent_buffers_set == {"cache"}
        assert block._non_persistent_buffers_set is not orig._non_persistent_buffers_set
    # hooks: the same functions in new dicts
    assert list(got.blocks[1]._forward_hooks.values()) == list(model.blocks[1]._forward_hooks.values())
    assert got.blocks[1]._forward_hooks is not model.blocks[1]._forward_hooks
    assert got.state_dict().keys() == expected.state_dict().keys()
    x = torch.randn(2, 3)
    got.head.weight.data.copy_(model.head.weight)
    got.head.bias.data.copy_(model.head.bias)
    assert torch.equal(got.head(x), model.head(x))


def test_a_class_with_its_own_copy_is_deep_copied():
    model = Model()
    before = OwnCopy.copies
    got = structure_copy(model, _fresh(model))
    assert OwnCopy.copies == before + 1 and isinstance(got.own, OwnCopy) and got.own is not model.own


def test_compiled_call_is_not_copied():
    model = Model()
    model.compile(backend="eager")
    got = structure_copy(model, _fresh(model))
    assert "_compiled_call_impl" not in vars(got)
    assert "_compiled_call_impl" not in vars(copy.deepcopy(model, _fresh(model)))


def _tiny_qwen() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=50, tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config).eval()


def test_a_transformers_model_matches_deepcopy():
    model = _tiny_qwen()
    got, want = structure_copy(model, _fresh(model)), copy.deepcopy(model, _fresh(model))
    assert repr(got) == repr(want)
    assert got.config is not model.config and got.config.to_dict() == model.config.to_dict()
    assert got.model.config is got.config
    assert got.lm_head.weight is got.model.embed_tokens.weight
    for name, buf in model.named_buffers():
        assert torch.equal(dict(got.named_buffers())[name], buf)
    got.load_state_dict(model.state_dict())
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(got(ids).logits, model(ids).logits)


def _by_state_dict(module):
    """What state_tensors promises, as state_dict and named_parameters say it."""
    tensors = {k: v for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    return tensors, frozenset(k for k in tensors if k not in params)


class TensorExtraState(nn.Linear):
    def get_extra_state(self):
        return torch.ones(1)

    def set_extra_state(self, state):
        pass


class OwnSave(nn.Linear):
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "packed"] = torch.cat([self.weight.detach().flatten(), self.bias.detach()])


def _models():
    yield "model", Model()
    bn = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    bn[1].running_var = None  # a None buffer
    yield "batchnorm", bn
    buffer_param = nn.Linear(2, 2)
    buffer_param.register_buffer("frozen", nn.Parameter(torch.ones(2)))  # a Parameter registered as a buffer
    yield "parameter as buffer", buffer_param
    hooked = Model()
    hooked.blocks[0]._register_state_dict_hook(lambda module, state, prefix, local: state.pop(prefix + "steps"))
    yield "state-dict hook", hooked
    pre = Model()
    pre.blocks[1].register_state_dict_pre_hook(lambda module, prefix, keep_vars: None)
    yield "state-dict pre-hook", pre
    yield "extra state", nn.Sequential(nn.Linear(2, 2), TensorExtraState(2, 2))
    yield "own save", nn.Sequential(nn.Linear(2, 2), OwnSave(2, 2))
    compiled = Model()
    compiled.compile(backend="eager")
    yield "compiled", compiled
    yield "optimized module", torch.compile(nn.Linear(2, 2), backend="eager")
    own_object = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # one object given its own (as quantisers do)
    own_object[1]._save_to_state_dict = types.MethodType(OwnSave._save_to_state_dict, own_object[1])
    yield "a module object's own save", own_object


@pytest.mark.parametrize("name, module", list(_models()), ids=[n for n, _ in _models()])
def test_state_tensors_are_the_state_dict(name, module):
    want, want_buffers = _by_state_dict(module)
    got, buffers = state_tensors(module)
    assert list(got) == list(want), name  # state_dict's order
    held = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    assert all(got[k] is want[k] for k in want if k in held), name  # the tensors themselves
    assert all(torch.equal(got[k], want[k]) for k in want if k not in held), name  # what a class's state_dict made
    assert buffers == want_buffers, name


def test_a_transformers_models_state_tensors_are_the_state_dict():
    model = _tiny_qwen()
    want, want_buffers = _by_state_dict(model)
    got, buffers = state_tensors(model)
    assert list(got) == list(want) and all(got[k] is want[k] for k in want) and buffers == want_buffers


def test_a_class_or_nn_module_patched_after_a_first_read_is_read_through_state_dict(monkeypatch):
    class Late(nn.Linear):
        pass

    late = nn.Sequential(Late(2, 2))
    assert list(state_tensors(late)[0]) == ["0.weight", "0.bias"]
    monkeypatch.setattr(Late, "_save_to_state_dict", OwnSave._save_to_state_dict)
    assert list(state_tensors(late)[0]) == list(late.state_dict()) == ["0.packed"]
    monkeypatch.undo()

    def without_bias(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.detach()

    monkeypatch.setattr(nn.Module, "_save_to_state_dict", without_bias)
    plain = nn.Linear(2, 2)
    assert list(state_tensors(plain)[0]) == list(plain.state_dict()) == ["weight"]
