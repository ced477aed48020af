"""RL demo, end to end on CPU: a tiny base LM, three GRPO-trained specialists, the probe, every merge method scored.

1. Base: a tiny Llama (built from a config, nothing downloaded) trained briefly by supervised learning on a
   synthetic token language with three task formats whose answers are checkable: ``shift`` (every digit + 3 mod
   10), ``rev`` (reverse 5 digits), ``sort`` (sort 5 digits). It is partly competent, and stored in bf16.
2. Specialists: one per task, trained from the base by on-policy RL with a verifiable reward (GRPO-style: a group
   of sampled answers per prompt, group-normalised advantages, exact-match reward, no KL term), float32 master
   weights, snapshotted in bf16 into ram_live's :class:`~ram_live.store.SnapshotStore` (``<out>/store``) every few
   steps. Recipes differ per task (optimiser, learning rate, steps), so the task vectors come out with different
   densities: the probe measures them.
3. Probe: density, unique/shared shares, ρ and λ per agent (printed, ``probe.png``).
4. Merge (the agents are the store's latest snapshots) and score: greedy exact-match accuracy per task on held-out
   prompts for the base, each specialist, task arithmetic (1/N, and a scale tuned on a separate validation set),
   TIES, DARE+TA, DARE+TIES, RAM, RAM+, RAM+s; the mean; merge seconds per method. Printed, and written as
   ``results.json`` and ``results.png``. ``merged_ram.safetensors`` / ``merged_ram_plus.safetensors`` keep the
   RAM and RAM+ outputs, ``base.safetensors`` the base (for checks).

Seeds are fixed (``--seed``): two runs print the same table (merge times aside). ``--quick`` is the CI setting.
``--rsweep`` adds RAM+ at r ∈ {0, 0.05, 0.1, 0.15, 0.2} on the same agents.

Run: ``python examples/rl_merge_demo.py --out runs/rl_demo [--quick] [--seed 0]``
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from ram_live import merge, probe
from ram_live.store import SnapshotStore

# ------------------------------------------------------------------------------------------- the token language

DIGITS = 10
TASK_TOKEN = {"shift": 10, "rev": 11, "sort": 12}
EQ = 13
VOCAB = 16
TASKS = ("shift", "rev", "sort")


def make_prompts(task: str, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """``n`` prompts of ``task`` and their answers: prompt = [TASK, digits..., '='], answer = digits."""
    digits = torch.randint(0, DIGITS, (n, 5), generator=g)
    if task == "shift":  # every digit + 3 (mod 10)
        answer = (digits + 3) % DIGITS
    elif task == "rev":
        answer = digits.flip(1)
    else:
        answer = digits.sort(dim=1).values
    head = torch.full((n, 1), TASK_TOKEN[task])
    eq = torch.full((n, 1), EQ)
    return torch.cat([head, digits, eq], dim=1), answer


def answer_len(task: str) -> int:
    return 5


# -------------------------------------------------------------------------------------------------- the model


def build_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                         tie_word_embeddings=False, use_cache=False)
    return LlamaForCausalLM(config)


def answer_logprobs(model: nn.Module, prompts: Tensor, answers: Tensor) -> Tensor:
    """log p(answer token | prefix) for every answer token: [B, A]."""
    ids = torch.cat([prompts, answers], dim=1)
    logits = model(input_ids=ids).logits[:, prompts.shape[1] - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, answers.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate(model: nn.Module, prompts: Tensor, length: int, g: torch.Generator | None = None) -> Tensor:
    """Answers of ``length`` tokens: greedy (g=None) or sampled at temperature 1 (no KV cache: sequences are short)."""
    ids = prompts
    for _ in range(length):
        logits = model(input_ids=ids).logits[:, -1].float()
        nxt = logits.argmax(-1) if g is None else torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids[:, prompts.shape[1]:]


@torch.no_grad()
def accuracy(model: nn.Module, data: dict[str, tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Greedy exact-match accuracy per task, computed in float32 on the model's stored weights."""
    m = model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
    m.eval()
    return {t: float((generate(m, p, a.shape[1]) == a).all(1).float().mean()) for t, (p, a) in data.items()}


# ------------------------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Recipe:
    optimizer: str
    lr: float
    steps: int
    weight_decay: float = 0.0


@dataclass(frozen=True)
class Settings:
    sft_steps: int
    sft_batch: int
    sft_lr: float
    recipes: dict[str, Recipe]
    prompts_per_step: int
    group: int
    snapshot_every: int
    n_eval: int
    n_val: int


# Recipes differ the way real agents' do: SGD moves only entries with large gradients (a sparse bf16 task
# vector), Adam moves nearly every entry with a gradient by ~lr per step (dense), AdamW in between here.
DEFAULT = Settings(
    sft_steps=400, sft_batch=32, sft_lr=3e-3,
    recipes={"shift": Recipe("sgd", 0.001, 60), "rev": Recipe("adam", 1e-4, 40),
             "sort": Recipe("adamw", 1e-5, 80, weight_decay=0.01)},
    prompts_per_step=16, group=8, snapshot_every=20, n_eval=500, n_val=200,
)
QUICK = Settings(
    sft_steps=400, sft_batch=32, sft_lr=3e-3,
    recipes={"shift": Recipe("sgd", 0.002, 30), "rev": Recipe("adam", 1e-4, 20),
             "sort": Recipe("adamw", 2e-5, 30, weight_decay=0.01)},
    prompts_per_step=16, group=8, snapshot_every=10, n_eval=300, n_val=100,
)

# ``--recipes sgd``: every agent SGD at lr 1e-3 (sparser task vectors: ~20-40 % in bf16), for comparison.
SGD_RECIPES = {"shift": Recipe("sgd", 0.001, 60), "rev": Recipe("sgd", 0.001, 40), "sort": Recipe("sgd", 0.001, 80)}

# Merge options: TA/DARE+TA at 1/N; TIES/DARE at the paper's/PEFT's usual densities.
N = len(TASKS)
METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("TA (1/N)", "task_arithmetic", {"scale": 1 / N}),
    ("TA (tuned)", "task_arithmetic", {}),  # scale filled in from the validation grid
    ("TIES", "ties", {"density": 0.2}),
    ("DARE+TA", "dare_linear", {"density": 0.5, "scale": 1 / N}),
    ("DARE+TIES", "dare_ties", {"density": 0.5}),
    ("RAM", "ram", {}),
    ("RAM+", "ram_plus", {}),
    ("RAM+s", "ram_plus_soft", {}),
]
SFT_TARGET = 0.4
EPS_SWEEP = (1e-5, 1e-4, 3e-4, 1e-3, 3e-3)
TA_GRID = (0.3, 0.5, 0.7, 1.0)
R_SWEEP = (0.0, 0.05, 0.1, 0.15, 0.2)


def stage(name: str, i: int, n: int, t0: float, extra: str = "") -> None:
    """A one-line progress bar on stderr."""
    width = 24
    done = int(width * i / max(n, 1))
    end = "\n" if i >= n else ""
    sys.stderr.write(f"\r{name:<14} [{'#' * done}{'.' * (width - done)}] {i}/{n} {time.perf_counter() - t0:6.1f}s "
                     f"{extra:<28}{end}")
    sys.stderr.flush()


# ------------------------------------------------------------------------------------------------ training


def train_base(s: Settings, seed: int, val: dict[str, tuple[Tensor, Tensor]]) -> tuple[LlamaForCausalLM, dict]:
    """Brief supervised training on the three formats (loss on answer tokens), returned in bf16.

    The tasks are learnt at very different speeds (``shift`` in ~100 steps, ``rev`` in a few hundred, with a
    sudden jump), so a fixed step count leaves one task solved and another not started. To make the base *partly*
    competent on every task, whatever the seed, a task drops to 1/8 of its batch (replay) once its greedy validation accuracy
    reaches ``SFT_TARGET`` (checked every 10 steps); SFT ends when every task has reached it, or at ``sft_steps``.
    """
    model = build_model(seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed + 11)
    t0 = time.perf_counter()
    active = {t: True for t in TASKS}
    reached: dict[str, int] = {}
    step = 0
    for step in range(1, s.sft_steps + 1):
        loss = torch.zeros(())
        for task in TASKS:
            p, a = make_prompts(task, g, s.sft_batch if active[task] else s.sft_batch // 8)
            loss = loss - answer_logprobs(model, p, a).mean() * (1.0 if active[task] else 0.125)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = accuracy(model, val)
            for t in TASKS:
                if active[t] and acc[t] >= SFT_TARGET:
                    active[t] = False
                    reached[t] = step
            stage("base (SFT)", step, s.sft_steps, t0, " ".join(f"{t} {acc[t]:.2f}" for t in TASKS))
            model.train()
            if not any(active.values()):
                break
    stage("base (SFT)", s.sft_steps, s.sft_steps, t0, f"stopped at step {step}")
    return model.to(torch.bfloat16).eval(), {"steps": step, "task_left_mix_at": reached}


def make_optimizer(recipe: Recipe, params: Any) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


def grpo(base: nn.Module, task: str, recipe: Recipe, s: Settings, seed: int, store: SnapshotStore,
         return_model: bool = False) -> Any:
    """On-policy GRPO from the bf16 base with float32 master weights; bf16 snapshots into ``store``."""
    model = copy.deepcopy(base).float().train()
    writer = store.writer(task, base=base)
    opt = make_optimizer(recipe, model.parameters())
    g = torch.Generator().manual_seed(seed)
    length = answer_len(task)
    t0 = time.perf_counter()
    rewards: list[float] = []
    for step in range(1, recipe.steps + 1):
        prompts, answers = make_prompts(task, g, s.prompts_per_step)
        prompts = prompts.repeat_interleave(s.group, 0)
        answers = answers.repeat_interleave(s.group, 0)
        model.eval()
        sampled = generate(model, prompts, length, g)
        model.train()
        reward = (sampled == answers).all(1).float().view(-1, s.group)
        adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)).view(-1)
        logp = answer_logprobs(model, prompts, sampled).sum(1)
        loss = -(adv * logp).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rewards.append(float(reward.mean()))
        if step % s.snapshot_every == 0 or step == recipe.steps:
            writer.snapshot(bf16_state(model), step=step, extra={"reward": rewards[-1]})
        stage(f"RL {task}", step, recipe.steps, t0, f"reward {sum(rewards[-5:]) / len(rewards[-5:]):.2f}")
    if return_model:
        return model
    return {"steps": recipe.steps, "reward_first5": sum(rewards[:5]) / 5, "reward_last5": sum(rewards[-5:]) / 5,
            "seconds": time.perf_counter() - t0}


def density_study(base: nn.Module, s: Settings, seed: int, out: Path) -> list[dict[str, Any]]:
    """What controls the density of a task vector here: the same RL task (``sort``, 30 steps) from the same base
    under several optimisers and learning rates; density of τ with the master weights kept in float32
    (|τ| > 1e-5, the paper's rule) and after storage in bf16 (the value changed), and the reward gained."""
    grid = [Recipe("sgd", 0.001, 30), Recipe("sgd", 0.005, 30), Recipe("sgd", 0.02, 30),
            Recipe("adam", 3e-6, 30), Recipe("adam", 1e-5, 30), Recipe("adam", 3e-5, 30), Recipe("adam", 1e-4, 30),
            Recipe("adamw", 1e-5, 30, weight_decay=0.01)]
    rows = []
    base32 = {k: v.float() for k, v in base.state_dict().items()}
    numel = sum(v.numel() for v in base32.values())
    val = {"sort": make_prompts("sort", torch.Generator().manual_seed(30_000 + seed), s.n_val)}
    for j, recipe in enumerate(grid):
        store = SnapshotStore(out / "density_store" / str(j), durable=False)
        model = grpo(base, "sort", recipe, s, seed=seed * 100 + 7, store=store, return_model=True)
        sd = model.state_dict()
        fp32 = sum(int(((sd[k] - b).abs() > 1e-5).sum()) for k, b in base32.items()) / numel
        bf16 = sum(int((sd[k].to(torch.bfloat16) != base.state_dict()[k]).sum()) for k in base32) / numel
        rows.append({"optimizer": recipe.optimizer, "lr": recipe.lr, "steps": recipe.steps,
                     "weight_decay": recipe.weight_decay, "density_fp32": fp32, "density_bf16": bf16,
                     "sort_acc_bf16": accuracy(model.to(torch.bfloat16), val)["sort"]})
    return rows


def bf16_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ main


def module_of(base: nn.Module, state: Any) -> nn.Module:
    m = copy.deepcopy(base)
    m.load_state_dict(dict(state) if not isinstance(state, nn.Module) else state.state_dict())
    return m


def sign_agreement(agents: dict[str, Any], base: nn.Module) -> dict[str, float]:
    """On entries changed by ≥ 2 agents: share where all changing agents agree in sign; also counts."""
    shared = agree = 0
    for key, b in base.state_dict().items():
        deltas = torch.stack([a.get(key).float() - b.float() for a in agents.values()])
        active = deltas != 0
        c = active.sum(0)
        mask = c >= 2
        if not mask.any():
            continue
        pos = ((deltas > 0) & active).sum(0)
        neg = ((deltas < 0) & active).sum(0)
        shared += int(mask.sum())
        agree += int((mask & ((pos == c) | (neg == c))).sum())
    return {"shared_entries": shared, "sign_agree_share": agree / shared if shared else float("nan")}


def eps_sweep(agents: dict[str, Any], base: nn.Module, test: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Any]:
    """RAM and RAM+ with larger activity thresholds ε: an entry counts as updated by an agent only if |τ| > ε, so
    an agent's tiny incidental change no longer halves another agent's large update there (nor counts as shared)."""
    rows: dict[str, Any] = {}
    for eps in EPS_SWEEP:
        row = {}
        for variant in ("ram", "ram_plus"):
            merged, info = merge(agents, base=base, method=variant, eps=eps, return_info=True)
            acc = accuracy(merged, test)
            acc["mean"] = sum(acc[t] for t in TASKS) / N
            row[variant] = acc
            if info.lambdas:
                row["lambdas"] = dict(info.lambdas)
        rows[str(eps)] = row
    return rows


def plot_results(path: Path, table: dict[str, dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    cols = list(TASKS) + ["mean"]
    fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.9), 4))
    w = 0.8 / len(cols)
    for j, c in enumerate(cols):
        ax.bar([i + j * w for i in range(len(names))], [table[n][c] for n in names], w, label=c)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("greedy exact-match accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=4)
    ax.set_title("RL demo: specialists and merges (held-out prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/rl_demo"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="CI setting (~30 s on 2 cores)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 was faster on a busy 2-core box)")
    parser.add_argument("--density-study", action="store_true",
                        help="also: density of one task's vector vs optimiser / lr, fp32 vs bf16 storage")
    parser.add_argument("--recipes", choices=("mixed", "sgd"), default="mixed",
                        help="mixed: SGD / Adam / AdamW per task (default); sgd: SGD lr 1e-3 for every agent")
    parser.add_argument("--eps-sweep", action="store_true", help="also RAM/RAM+ at activity thresholds ε > 1e-5")
    parser.add_argument("--rsweep", action="store_true", help="also RAM+ at r in 0, 0.05, 0.1, 0.15, 0.2")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    s = QUICK if args.quick else DEFAULT
    if args.recipes == "sgd":
        s = dataclasses.replace(s, recipes={t: dataclasses.replace(r, steps=s.recipes[t].steps)
                                            for t, r in SGD_RECIPES.items()})
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # held-out test prompts (never trained on: the RL/SFT generators use other seeds; overlap is chance only)
    g_test = torch.Generator().manual_seed(10_000 + args.seed)
    test = {t: make_prompts(t, g_test, s.n_eval) for t in TASKS}
    g_val = torch.Generator().manual_seed(20_000 + args.seed)
    val = {t: make_prompts(t, g_val, s.n_val) for t in TASKS}

    # 1. base
    t0 = time.perf_counter()
    base, sft_info = train_base(s, args.seed, val)
    timings["base_sft"] = time.perf_counter() - t0
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(out / "base.safetensors"))

    # 2. specialists, through the snapshot store
    store_dir = out / "store"
    if store_dir.exists():
        import shutil

        shutil.rmtree(store_dir)
    store = SnapshotStore(store_dir, durable=False)
    rl: dict[str, Any] = {}
    t0 = time.perf_counter()
    for i, task in enumerate(TASKS):
        rl[task] = grpo(base, task, s.recipes[task], s, seed=args.seed * 100 + i + 1, store=store)
    timings["rl"] = time.perf_counter() - t0
    agents = store.latest_all(TASKS)

    study: list[dict[str, Any]] = []
    if args.density_study:
        study = density_study(base, s, args.seed, out)
        print("\ndensity of the sort agent's task vector (30 GRPO steps) vs recipe:")
        print(f"{'optimizer':<10}{'lr':>8}{'fp32 |τ|>1e-5':>15}{'bf16 changed':>14}{'sort acc':>10}")
        for row in study:
            print(f"{row['optimizer']:<10}{row['lr']:>8g}{row['density_fp32']:>15.1%}{row['density_bf16']:>14.1%}"
                  f"{row['sort_acc_bf16']:>10.3f}")

    # 3. probe
    report = probe(agents, base=base)
    print("\n" + report.table())
    report.plot(str(out / "probe.png"))
    signs = sign_agreement(agents, base)
    print(f"entries changed by ≥ 2 agents: {signs['shared_entries']:,}; all changing agents agree in sign on "
          f"{signs['sign_agree_share']:.1%} of them")

    # 4. merge and score
    t0 = time.perf_counter()
    rows: dict[str, dict[str, float]] = {}
    seconds: dict[str, float | None] = {}
    options_used: dict[str, Any] = {}
    lambdas: dict[str, Any] = {}

    def score(name: str, model: nn.Module, sec: float | None) -> None:
        acc = accuracy(model, test)
        acc["mean"] = sum(acc[t] for t in TASKS) / N
        rows[name], seconds[name] = acc, sec

    score("base", base, None)
    for t in TASKS:
        score(f"specialist {t}", module_of(base, agents[t].to_state_dict()), None)

    # tuned TA scale: chosen on the validation prompts (not the test prompts)
    val_scores = {}
    for sc in TA_GRID:
        m = merge(agents, base=base, method="task_arithmetic", scale=sc)
        v = accuracy(m, val)
        val_scores[sc] = sum(v.values()) / N
    best_scale = max(TA_GRID, key=lambda x: (val_scores[x], -x))
    n_methods = len(METHODS) + (len(R_SWEEP) if args.rsweep else 0)
    for j, (label, method, opts) in enumerate(METHODS, 1):
        opts = dict(opts)
        if label == "TA (tuned)":
            opts["scale"] = best_scale
        t1 = time.perf_counter()
        merged, info = merge(agents, base=base, method=method, return_info=True, **opts)
        sec = time.perf_counter() - t1
        score(label, merged, sec)
        options_used[label] = {"method": method, **opts}
        if info.lambdas:
            lambdas[label] = dict(info.lambdas)
        if method in ("ram", "ram_plus"):
            save_file({k: v.contiguous() for k, v in merged.state_dict().items()},
                      str(out / f"merged_{method}.safetensors"))
        stage("merge+score", j, n_methods, t0, label)
    sweep: dict[str, Any] = {}
    if args.rsweep:
        counts = None  # the first RAM+ merge counts ρ's inputs; the others reuse them (one pass each)
        for j, r in enumerate(R_SWEEP, len(METHODS) + 1):
            merged, info = merge(agents, base=base, method="ram_plus", r=r, return_info=True, statistics=counts)
            counts = info.statistics
            acc = accuracy(merged, test)
            acc["mean"] = sum(acc[t] for t in TASKS) / N
            sweep[str(r)] = {"acc": acc, "lambdas": dict(info.lambdas or {})}
            stage("merge+score", j, n_methods, t0, f"RAM+ r={r}")
    eps_rows = eps_sweep(agents, base, test) if args.eps_sweep else {}
    if eps_rows:
        print("RAM / RAM+ mean accuracy vs activity threshold ε: " + ", ".join(
            f"ε={e}: {v['ram']['mean']:.3f} / {v['ram_plus']['mean']:.3f}" for e, v in eps_rows.items()))
    timings["merge_and_score"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    # table
    head = f"{'method':<18}" + "".join(f"{t:>8}" for t in TASKS) + f"{'mean':>8}{'merge s':>9}"
    lines = [head, "-" * len(head)]
    for name, acc in rows.items():
        sec = seconds[name]
        lines.append(f"{name:<18}" + "".join(f"{acc[t]:>8.3f}" for t in TASKS) + f"{acc['mean']:>8.3f}"
                     + (f"{sec:>9.3f}" if sec is not None else f"{'-':>9}"))
    print(f"\ngreedy exact-match accuracy on held-out prompts (n = {s.n_eval} per task)")
    print("\n".join(lines))
    print(f"TA tuned scale = {best_scale} (validation means: "
          + ", ".join(f"{k}: {v:.3f}" for k, v in val_scores.items()) + ")")
    for label, lam in lambdas.items():
        print(f"λ {label}: " + ", ".join(f"{k} {v:.4f}" for k, v in lam.items()))
    if sweep:
        print("RAM+ r sweep (α = 2): " + ", ".join(f"r={r}: {v['acc']['mean']:.3f}" for r, v in sweep.items()))
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    result = {
        "seed": args.seed, "quick": args.quick, "recipes": args.recipes, "threads": args.threads,
        "settings": {"sft_steps": s.sft_steps, "recipes": {t: vars(r) for t, r in s.recipes.items()},
                     "prompts_per_step": s.prompts_per_step, "group": s.group, "n_eval": s.n_eval},
        "parameters": sum(p.numel() for p in base.parameters()),
        "sft": sft_info, "rl": rl, "accuracy": rows, "merge_seconds": seconds, "options": options_used, "lambdas": lambdas,
        "ta_validation": {str(k): v for k, v in val_scores.items()}, "ta_tuned_scale": best_scale,
        "probe": {"agents": report.to_dict()["agents"], "histogram": report.histogram},
        "density": {t: agents[t].density for t in TASKS},
        "sign_agreement": signs, "r_sweep": sweep, "eps_sweep": eps_rows, "density_study": study, "timings": timings,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    plot_results(out / "results.png", rows)
    print(f"wrote {out / 'results.json'}, {out / 'results.png'}, {out / 'probe.png'}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
