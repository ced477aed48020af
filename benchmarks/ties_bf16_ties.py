"""TIES on bf16-valued task vectors against PEFT's ``ties``: the size of the difference, where it lies, and how
far an exactly-k rule (lowest index first) is from PEFT (numbers in docs/methods.md, "TIES' tie rule").

Run: ``.venv/bin/python benchmarks/ties_bf16_ties.py``
"""

import warnings

import torch
from peft.utils import merge_utils as pmu
from ram_live import merge
from ram_live import functional as F

warnings.filterwarnings("ignore", message="The density 1.0")

g = torch.Generator().manual_seed(0)
shapes = {"a": (256, 256), "b": (64, 512), "c": (1024,), "d": (128, 96)}
base = {k: torch.zeros(s) for k, s in shapes.items()}
W = [0.7, 1.3, 0.5]
agents = [{k: (torch.randn(s, generator=g) * 0.02).bfloat16().float() for k, s in shapes.items()} for _ in W]
for density in (0.2, 0.5):
    out = merge(agents, base=base, method="ties", density=density, weights=W)
    num = den = 0.0
    tied_total = kept_extra = 0
    outside = 0.0
    for k in shapes:
        taus = [a[k] for a in agents]
        peft = pmu.ties(taus, torch.tensor(W), density, "total")
        d = out[k] - peft
        num += float(d.norm() ** 2)
        den += float(peft.norm() ** 2)
        tied = torch.zeros(shapes[k], dtype=torch.bool)
        for t in taus:
            thr = F.magnitude_threshold(t, density)
            tied |= t.abs() == thr
            tied_total += int((t.abs() == thr).sum())
            kept_extra += int((t.abs() >= thr).sum()) - int(density * t.numel())
        outside = max(outside, float(d[~tied].abs().max()))
    print(
        f"density {density}: |ours - peft| / |peft| = {(num / den) ** 0.5:.4%}; tied entries at thresholds "
        f"{tied_total}, kept beyond k {kept_extra}; max |diff| away from tied columns {outside:.3g}"
    )
# float32: no ties
agents32 = [{k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()} for _ in W]
out = merge(agents32, base=base, method="ties", density=0.2, weights=W)
r = max(float((out[k] - pmu.ties([a[k] for a in agents32], torch.tensor(W), 0.2, "total")).norm()) for k in shapes)
print("float32 max |diff| norm:", r)


# exactly k with a deterministic tie-break (lowest flat index first) against PEFT's topk
def exact_k(t, density):
    k = int(density * t.numel())
    order = torch.sort(t.abs().reshape(-1), descending=True, stable=True).indices[:k]
    m = torch.zeros(t.numel(), dtype=torch.bool)
    m[order] = True
    return t * m.view_as(t)


for density in (0.2, 0.5):
    num = den = 0.0
    for k in shapes:
        taus = [a[k] for a in agents]
        peft = pmu.ties(taus, torch.tensor(W), density, "total")
        mine = pmu.ties([exact_k(t, density) for t in taus], torch.tensor(W), 1.0, "total")
        num += float((mine - peft).norm() ** 2)
        den += float(peft.norm() ** 2)
    print(f"exactly-k (lowest index) density {density}: |exact_k - peft| / |peft| = {(num / den) ** 0.5:.4%}")
