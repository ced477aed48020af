"""Which activity rule makes RAM work on dense LoRA deltas? A small, honest experiment.

LoRA task vectors ΔW = s·BA are dense: with the paper's rule (|Δ| > 1e-5 is "updated") every entry is shared
by every adapter that targets the module, and RAM is a plain mean. This script measures what the sparsifying
rules of ``ram_live.peft`` do instead.

Set-up (all on CPU, one thread, nothing downloaded):

* a tiny Llama built from a config (2 layers, hidden 128), random init, then 100 steps of "pre-training" on
  generic data (random tokens within one of three token ranges): it knows the vocabulary's layout, no task;
* three synthetic next-token tasks on those disjoint ranges — ``count`` (x, x+5, x+10, … mod 32), ``route``
  (a fixed random successor table over 48 tokens), ``lookup`` (keys followed by their value under a fixed
  random table) —, one LoRA adapter per task (r = 16, alpha = 32, on every linear layer), trained ``--steps``
  AdamW steps on its task plus generic "replay" data (a stand-in for RL's KL penalty to the reference);
* every merge candidate: the baselines (mean = ``linear``, sum = ``task_arithmetic``, PEFT-style ``ties``),
  RAM and RAM+ with the paper's rule (dense: |Δ| > 1e-5), with ``TopK(d)`` and with ``RelativeThreshold(t)``;
* every merged model is scored on each task's held-out loss by the share of the specialist's improvement it
  keeps: gain = (L_base − L_merged) / (L_base − L_specialist) (100 % = as good as that task's own adapter,
  0 % = no better than the base, < 0 = worse). "Best" = the highest mean gain over the three tasks, averaged
  over seeds; the worst task's gain (averaged over seeds) is reported next to it;
* three outputs per candidate: ΔW* folded into the base (``into_base=True``, exact), and the re-factored
  adapter at the default rank (the largest input rank, 16) and at the sum of the ranks (48), with the whole
  adapter's relative re-factorisation error.

Run: ``python examples/lora_activity_experiment.py [--seeds 10] [--steps 80] [--out results.json]``
(≈ 10 min on 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from typing import Any, Callable

import torch
from torch import Tensor

warnings.filterwarnings("ignore")

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live.peft import RelativeThreshold, TopK, ram_merge_adapters  # noqa: E402

SEQ = 24
BATCH = 32
RANK = 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
Task = Callable[[torch.Generator, int], tuple[Tensor, Tensor]]


def _chain(g: torch.Generator, n: int, lo: int, hi: int, step: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    x = torch.randint(lo, hi, (n,), generator=g)
    seq = [x]
    for _ in range(SEQ - 1):
        seq.append(step(seq[-1]))
    mask = torch.ones(n, SEQ, dtype=torch.bool)
    mask[:, 0] = False
    return torch.stack(seq, dim=1), mask


def arith(g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """Counting by 5 modulo 32 over tokens 0..31: x, x+5, x+10, ...; every position after the first is
    predictable."""
    return _chain(g, n, 0, 32, lambda x: (x + 5) % 32)


_PERM = torch.randperm(48, generator=torch.Generator().manual_seed(4321)) + 32


def copy_task(g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """A fixed random successor table over tokens 32..79 (a "route"): x, π(x), π(π(x)), ..."""
    return _chain(g, n, 32, 80, lambda x: _PERM[x - 32])


_TABLE = torch.randint(112, 128, (32,), generator=torch.Generator().manual_seed(1234))


def lookup(g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """Pairs (key, value): keys in 80..111, value = a fixed random table[key] in 112..127; values are predictable."""
    keys = torch.randint(80, 112, (n, SEQ // 2), generator=g)
    values = _TABLE[keys - 80]
    seq = torch.stack([keys, values], dim=2).reshape(n, SEQ)
    mask = torch.zeros(n, SEQ, dtype=torch.bool)
    mask[:, 1::2] = True
    return seq, mask


TASKS: dict[str, Task] = {"count": arith, "route": copy_task, "lookup": lookup}
RANGES = [(0, 32), (32, 80), (80, 128)]


def generic(g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """The base's "pre-training" data: random tokens, each sequence from one of the tasks' token ranges. The
    base learns the vocabulary's layout (loss ≈ log of the range's size on every task) but none of the rules."""
    which = torch.randint(0, len(RANGES), (n,), generator=g)
    lo = torch.tensor([r[0] for r in RANGES])[which][:, None]
    hi = torch.tensor([r[1] for r in RANGES])[which][:, None]
    seq = lo + (torch.rand(n, SEQ, generator=g) * (hi - lo)).long()
    return seq, torch.ones(n, SEQ, dtype=torch.bool)


def loss_on(model: torch.nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    seq, mask = batch
    logits = model(seq).logits[:, :-1]
    target = seq[:, 1:].masked_fill(~mask[:, 1:], -100)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
    )


@torch.no_grad()
def evaluate(model: torch.nn.Module, held_out: dict[str, tuple[Tensor, Tensor]]) -> dict[str, float]:
    model.eval()
    return {name: float(loss_on(model, batch)) for name, batch in held_out.items()}


def pretrain(base: LlamaForCausalLM, seed: int, steps: int, lr: float) -> LlamaForCausalLM:
    """Full training of the base on :func:`generic` data: it knows the vocabulary, not the tasks."""
    opt = torch.optim.AdamW(base.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed * 1000 + 7)
    base.train()
    for step in range(steps):
        loss = loss_on(base, generic(g, BATCH))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return base.eval()


def train_adapters(
    base: LlamaForCausalLM, seed: int, steps: int, lr: float, rank: int = RANK, replay: bool = True
) -> Any:
    """One LoRA adapter per task. With ``replay`` each batch also holds generic data (a stand-in for RL's KL
    penalty to the reference model: the agent keeps the base's behaviour outside its task)."""
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, lora_dropout=0.0)
    model = get_peft_model(copy.deepcopy(base), cfg, adapter_name=next(iter(TASKS)))
    for name in list(TASKS)[1:]:
        model.add_adapter(name, cfg)
    for i, (name, task) in enumerate(TASKS.items()):
        model.set_adapter(name)  # only this adapter is active and trainable
        params = [p for n, p in model.named_parameters() if f".{name}." in n]
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        g = torch.Generator().manual_seed(seed * 100 + i)
        model.train()
        for _ in range(steps):
            loss = loss_on(model, task(g, BATCH))
            if replay:
                loss = loss + loss_on(model, generic(g, BATCH))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model


def candidates() -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = [
        ("mean (linear)", "linear", {}),
        ("sum (task_arithmetic)", "task_arithmetic", {}),
        ("ties d=0.2", "ties", {"density": 0.2}),
        ("ram dense |Δ|>1e-5", "ram", {"sparsify": None}),
        ("ram+ dense |Δ|>1e-5", "ram_plus", {"sparsify": None}),
    ]
    for d in (0.05, 0.1, 0.2, 0.3, 0.5, 0.7):
        out.append((f"ram topk {d:g}", "ram", {"sparsify": TopK(d)}))
        out.append((f"ram+ topk {d:g}", "ram_plus", {"sparsify": TopK(d)}))
    for t in (0.5, 1.0, 2.0):
        out.append((f"ram relative {t:g}×rms", "ram", {"sparsify": RelativeThreshold(t)}))
        out.append((f"ram+ relative {t:g}×rms", "ram_plus", {"sparsify": RelativeThreshold(t)}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--lr", type=float, default=1e-2, help="LoRA learning rate")
    parser.add_argument("--pretrain", type=int, default=100, help="steps of the base on the task mixture")
    parser.add_argument("--out", default=None, help="write every number as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tensors this small gain nothing from more threads, and lose when cores are busy
    results: dict[str, dict[str, list[Any]]] = {}
    specialists: list[dict[str, float]] = []
    t_start = time.perf_counter()
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        base = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=128,
                hidden_size=128,
                intermediate_size=256,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
            )
        )
        base = pretrain(base, seed, args.pretrain, 3e-3)
        held_out = {name: task(torch.Generator().manual_seed(10_000 + seed), 256) for name, task in TASKS.items()}
        base_loss = evaluate(base, held_out)
        model = train_adapters(base, seed, args.steps, args.lr)
        spec = {}
        for name in TASKS:
            model.set_adapter(name)
            spec[name] = evaluate(model, held_out)[name]
        specialists.append({"base": base_loss, "specialist": spec})

        def gains(losses: dict[str, float]) -> dict[str, float]:
            return {n: (base_loss[n] - losses[n]) / (base_loss[n] - spec[n]) for n in TASKS}

        names = list(TASKS)
        for label, method, kw in candidates():
            row = results.setdefault(label, {"into_base": [], "rank16": [], "rank48": [], "err16": [], "err48": []})
            plain = ram_merge_adapters(model, names, method=method, into_base=True, warn_dense=False, **kw)
            row["into_base"].append(gains(evaluate(plain, held_out)))
            for rank in (RANK, 3 * RANK):
                new = f"m{rank}"
                _, report = ram_merge_adapters(
                    model, names, new, method=method, rank=rank, warn_dense=False, return_info=True, **kw
                )
                model.set_adapter(new)
                row[f"rank{rank}"].append(gains(evaluate(model, held_out)))
                row[f"err{rank}"].append(report.error)
                model.delete_adapter(new)
        print(
            f"seed {seed} done ({time.perf_counter() - t_start:.0f} s): base {base_loss}, specialists {spec}",
            flush=True,
        )

    def summary(per_seed: list[dict[str, float]]) -> tuple[float, float]:
        means = [statistics.mean(g.values()) for g in per_seed]
        worst = [min(g.values()) for g in per_seed]
        return statistics.mean(means), statistics.mean(worst)

    print(
        f"\n{args.seeds} seeds × 3 tasks, {args.steps} steps per adapter; gain = share of the specialist's "
        "improvement kept (mean over tasks / worst task), averaged over seeds\n"
    )
    header = (
        f"{'candidate':<26} {'into base':>17} {'adapter r=16':>17} {'err r=16':>8} {'adapter r=48':>17} {'err r=48':>9}"
    )
    print(header)
    print("-" * len(header))
    table = {}
    for label, row in results.items():
        ib, r8, r24 = summary(row["into_base"]), summary(row["rank16"]), summary(row["rank48"])
        e8, e24 = statistics.mean(row["err16"]), statistics.mean(row["err48"])
        table[label] = {
            "into_base": ib,
            "rank16": r8,
            "rank48": r24,
            "err16": e8,
            "err48": e24,
            "per_task_into_base": {n: statistics.mean(g[n] for g in row["into_base"]) for n in TASKS},
        }
        print(
            f"{label:<26} {100 * ib[0]:7.1f}% /{100 * ib[1]:6.1f}% {100 * r8[0]:7.1f}% /{100 * r8[1]:6.1f}% "
            f"{e8:8.3f} {100 * r24[0]:7.1f}% /{100 * r24[1]:6.1f}% {e24:9.3f}"
        )
    for output in ("into_base", "rank16", "rank48"):
        best = max(table, key=lambda k: table[k][output][0])
        print(f"best {output:<9}: {best} ({100 * table[best][output][0]:.1f} % mean gain)")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "specialists": specialists, "table": table, "raw": results}, fh, indent=2)


if __name__ == "__main__":
    main()
