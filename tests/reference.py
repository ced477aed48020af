"""A second, deliberately naive implementation of RAM (dense stacking, float64) to test the engine against."""

from __future__ import annotations

import math

import torch

#: sqrt(3): scales the sum of four uniforms (variance 4/12) to variance one
_IRWIN_HALL_SCALE = math.sqrt(3.0)


def portable_randn(shape, generator: torch.Generator) -> torch.Tensor:
    """Normal-like float32 draws (Irwin-Hall: four uniforms summed, centred, scaled to variance one) that are the
    same bits on every CPU: ``torch.randn`` is not (its Box-Muller runs Sleef's vector log/sin/cos under AVX2 and
    AVX-512 and libm's under ``ATEN_CPU_CAPABILITY=default``); ``torch.rand`` draws from the integer generator, and
    the rest is single IEEE additions and one multiplication, each correctly rounded everywhere."""
    total = torch.rand(shape, generator=generator)
    for _ in range(3):
        total = total + torch.rand(shape, generator=generator)
    return (total - 2.0) * _IRWIN_HALL_SCALE


def ref_ram(base, agents, variant="ram_plus", r=0.1, alpha=2.0, eps=1e-5, scope="global", shared="mean"):
    keys = [k for k in base if base[k].dtype.is_floating_point]
    taus = {k: torch.stack([a[k].float() - base[k].float() for a in agents]) for k in keys}
    masks = {k: taus[k].abs() > eps for k in keys}

    def lambdas(ks):
        lam = []
        for t in range(len(agents)):
            active = sum(int(masks[k][t].sum()) for k in ks)
            unique = sum(int((masks[k][t] & (masks[k].sum(0) == 1)).sum()) for k in ks)
            shared = active - unique
            # the spec: +inf without a unique entry, also with none active
            rho = shared / unique if unique else math.inf
            if variant == "ram":
                lam.append(1.0)
            elif variant == "ram_plus":
                lam.append(1 + r * min(max(rho, 0.0), alpha))
            else:
                lam.append(1 + r * (1.0 if math.isinf(rho) else rho / (1 + rho)))
        return lam

    global_lam = lambdas(keys)
    out = {}
    for k in base:
        if k not in keys:
            out[k] = base[k].clone()
            continue
        lam = global_lam if scope == "global" else lambdas([k])
        tau = taus[k].double() * masks[k]
        c = masks[k].sum(0)
        mean = tau.sum(0) / c.clamp(min=1)
        if shared == "sign":  # the mean over the active agents whose τ has the sign of Σ τ (Σ τ = 0: the mean, 0)
            total = tau.sum(0)
            agree = torch.where(total > 0, tau > 0, tau < 0)
            kept = (tau * agree).sum(0) / agree.sum(0).clamp(min=1)
            mean = torch.where(total != 0, kept, mean)
        scaled = (torch.tensor(lam, dtype=torch.float64).view(-1, *[1] * (tau.dim() - 1)) * tau).sum(0)
        merged = torch.where(c == 1, scaled, mean)
        out[k] = torch.where(c > 0, base[k].double() + merged, base[k].double()).to(base[k].dtype)
        out[k] = torch.where(c > 0, out[k], base[k])
    return out, global_lam
