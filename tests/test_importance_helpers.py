"""Where importances come from: Adam's second moments of a real optimizer, a diagonal empirical Fisher."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ram_live import ConfigError, adam_importance, empirical_fisher, merge


def _trained(seed: int, steps: int = 3, opt_cls=torch.optim.AdamW, **opt_kw):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = opt_cls(model.parameters(), **opt_kw)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(5, 4)
        model(x).square().mean().backward()
        grads.append(model[0].weight.grad[1, 2].item())
        opt.step()
    return model, opt, grads


def test_adam_exp_avg_sq_by_hand():
    beta2 = 0.99
    model, opt, grads = _trained(0, steps=3, betas=(0.9, beta2), lr=1e-2)
    imp = adam_importance(opt, model)
    assert sorted(imp) == sorted(n for n, _ in model.named_parameters())
    v = 0.0
    for g in grads:  # v_t = β₂ v_{t-1} + (1 − β₂) g_t²
        v = beta2 * v + (1 - beta2) * g * g
    assert imp["0.weight"][1, 2].item() == pytest.approx(v, rel=1e-5)
    corrected = adam_importance(opt, model, bias_correction=True)
    assert corrected["0.weight"][1, 2].item() == pytest.approx(v / (1 - beta2**3), rel=1e-5)
    # a copy: the optimizer's later steps do not change it
    before = imp["0.weight"].clone()
    opt.step()
    assert torch.equal(imp["0.weight"], before)
    assert imp["0.weight"].data_ptr() != opt.state[model[0].weight]["exp_avg_sq"].data_ptr()


def test_adam_frozen_parameter_gets_zeros_and_plain_adam_works():
    torch.manual_seed(1)
    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    opt = torch.optim.Adam([model.weight], lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    imp = adam_importance(opt, model)
    assert torch.equal(imp["bias"], torch.zeros(2))
    assert torch.equal(imp["weight"], opt.state[model.weight]["exp_avg_sq"])


def test_optimizers_without_second_moments_are_refused():
    model, opt, _ = _trained(0, opt_cls=torch.optim.SGD, lr=0.1, momentum=0.9)
    with pytest.raises(ConfigError, match=r"SGD keeps no 'exp_avg_sq'.*empirical_fisher"):
        adam_importance(opt, model)
    fresh = torch.optim.AdamW(model.parameters())
    with pytest.raises(ConfigError, match="at least one optimizer step"):
        adam_importance(fresh, model)


def test_empirical_fisher_by_hand_and_state_restored():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -1.0]]))
        model.bias.fill_(0.25)
    data = [
        (torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0]])),
        (torch.tensor([[-1.0, 0.5]]), torch.tensor([[1.0]])),
        (torch.tensor([[3.0, 3.0]]), torch.tensor([[2.0]])),
    ]
    sentinel = [torch.full_like(p, 7.0) for p in model.parameters()]
    for p, s in zip(model.parameters(), sentinel):
        p.grad = s
    model.train()

    def loss_fn(m, batch):
        x, y = batch
        return (m(x) - y).square().sum()

    fisher = empirical_fisher(model, data, loss_fn)
    gw, gb = [], []
    for x, y in data:  # d/dw (w·x + b − y)² = 2 r x, d/db = 2 r
        r = (0.5 * x[0, 0] - 1.0 * x[0, 1] + 0.25 - y[0, 0]).item()
        gw.append([2 * r * x[0, 0].item(), 2 * r * x[0, 1].item()])
        gb.append(2 * r)
    expected_w = torch.tensor(gw).square().mean(0, keepdim=True)
    torch.testing.assert_close(fisher["weight"], expected_w)
    torch.testing.assert_close(fisher["bias"], torch.tensor([sum(g * g for g in gb) / 3]))
    assert model.training
    assert all(p.grad is s for p, s in zip(model.parameters(), sentinel))
    first = empirical_fisher(model, data, loss_fn, batches=1)
    torch.testing.assert_close(first["bias"], torch.tensor([gb[0] ** 2]))
    with pytest.raises(ConfigError, match="no batch"):
        empirical_fisher(model, [], loss_fn)


def test_adam_importances_feed_a_merge():
    torch.manual_seed(5)
    base = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    agents, importance = {}, {}
    for name in ("a", "b"):
        model = copy.deepcopy(base)  # fine-tuned from the base
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(5, 4)).square().mean().backward()
            opt.step()
        agents[name] = model
        importance[name] = adam_importance(opt, model, bias_correction=True)
    merged, info = merge(agents, base, method="ram", importance=importance, return_info=True)
    plain = merge(agents, base, method="ram")
    assert info.extra["importance"] == "given"
    assert any(not torch.equal(p, q) for p, q in zip(merged.parameters(), plain.parameters()))
