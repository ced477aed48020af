"""What the device-path tests share: a tensor's bits, sparse agents of flat tensors and of small modules, and the
fixture ``on_device`` (tests/conftest.py) runs the device path on CPU tensors."""

import torch
from torch import nn


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers (a bit-for-bit comparison that tells -0.0 from 0.0 and compares NaNs)."""
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def flat_inputs(n: int, k: int, dtype: torch.dtype, seed: int = 0, share: float = 0.6):
    """A flat base and ``k`` agents, each changing about ``share`` of the entries by steps of 1e-1 to 1e-3."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g).to(dtype)
    agents = []
    for t in range(k):
        changed = torch.rand(n, generator=g) < share
        step = 10.0 ** -(t % 3 + 1) * torch.randn(n, generator=g) * changed
        agents.append((base.float() + step).to(dtype))
    return base, agents


class Net(nn.Module):
    """Two small layers (three tensors: a weight and bias, a weight)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(40, 36).to(dtype)
        self.b = nn.Linear(36, 20, bias=False).to(dtype)


def module_agents(dtype: torch.dtype, k: int = 3):
    """A :class:`Net` base and ``k`` agents that change about 60 % of its entries each."""
    base, agents = Net(dtype), []
    for t in range(k):
        agent = Net(dtype)
        g = torch.Generator().manual_seed(100 + t)
        with torch.no_grad():
            for p in agent.parameters():
                keep = torch.rand(p.shape, generator=g) < 0.6
                p.add_((0.02 * torch.randn(p.shape, generator=g)).to(dtype) * keep)
        agents.append(agent)
    return base, agents
