"""The demo's training: SFT of the base, GRPO specialists snapshotted into the store, the density study."""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LlamaForCausalLM

from ram_live.importance import adam_importance, empirical_fisher
from ram_live.store import SnapshotStore

from .lang import TASKS, accuracy, answer_len, answer_logprobs, build_model, generate, make_prompts, vocab_for


@dataclass(frozen=True)
class Recipe:
    optimizer: str
    lr: float
    steps: int  # with ``plateau``: the most steps
    weight_decay: float = 0.0
    plateau: int = 0  # > 0: stop once this many selection checks in a row (every snapshot) beat no earlier one


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
    n_sel: int  # selection prompts per task (disjoint from the test prompts), for search
    hidden: int = 96  # the model's width (the sparse regime uses a wider one)
    intermediate: int = 256
    sft_replay: float = 0.125  # share of its batch a task keeps in SFT once it reached the target (0: none)


# Recipes differ the way real agents' do: SGD moves only entries with large gradients (a sparse bf16 task
# vector), Adam moves nearly every entry with a gradient by ~lr per step (dense), AdamW in between here.
DEFAULT = Settings(
    sft_steps=400,
    sft_batch=32,
    sft_lr=3e-3,
    recipes={
        "shift": Recipe("sgd", 0.001, 60),
        "rev": Recipe("adam", 1e-4, 40),
        "sort": Recipe("adamw", 1e-5, 80, weight_decay=0.01),
    },
    prompts_per_step=16,
    group=8,
    snapshot_every=20,
    n_eval=500,
    n_val=200,
    n_sel=200,
)
QUICK = Settings(
    sft_steps=400,
    sft_batch=32,
    sft_lr=3e-3,
    recipes={
        "shift": Recipe("sgd", 0.002, 30),
        "rev": Recipe("adam", 1e-4, 20),
        "sort": Recipe("adamw", 2e-5, 30, weight_decay=0.01),
    },
    prompts_per_step=16,
    group=8,
    snapshot_every=10,
    n_eval=300,
    n_val=100,
    n_sel=100,
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
# ``--converged``: every agent Adam at one lr (so their exp_avg_sq are comparable), trained until its
# own task's accuracy on the selection split stops improving (checked at every snapshot), at most ``steps``.
CONVERGED_RECIPE = Recipe("adam", 1e-4, 160, plateau=2)
CONVERGED_QUICK_RECIPE = Recipe("adam", 1e-4, 60, plateau=2)
TA_GRID_FINE = (0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0)  # TA (tuned) under --tuned-baselines / --converged
TIES_GRID = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # TIES (tuned): density chosen on the validation prompts
FISHER_BATCHES = 8
SFT_TARGET = 0.4
EPS_SWEEP = (1e-5, 1e-4, 3e-4, 1e-3, 3e-3)
TA_GRID = (0.3, 0.5, 0.7, 1.0)
R_SWEEP = (0.0, 0.05, 0.1, 0.15, 0.2)


def stage(name: str, i: int, n: int, t0: float, extra: str = "") -> None:
    """A one-line progress bar on stderr."""
    width = 24
    done = int(width * i / max(n, 1))
    end = "\n" if i >= n else ""
    sys.stderr.write(
        f"\r{name:<14} [{'#' * done}{'.' * (width - done)}] {i}/{n} {time.perf_counter() - t0:6.1f}s {extra:<28}{end}"
    )
    sys.stderr.flush()


# ------------------------------------------------------------------------------------------------ training


def train_base(
    s: Settings, seed: int, val: dict[str, tuple[Tensor, Tensor]], target: float = SFT_TARGET
) -> tuple[LlamaForCausalLM, dict]:
    """Brief supervised training on the tasks of ``val`` (its keys) (loss on answer tokens), returned in bf16.

    The tasks are learnt at very different speeds (``shift`` in ~100 steps, ``rev`` in a few hundred, with a
    sudden jump), so a fixed step count leaves one task solved and another not started. To make the base *partly*
    competent on every task, whatever the seed, a task drops to ``s.sft_replay`` (1/8) of its batch once its greedy
    validation accuracy reaches ``target`` (``SFT_TARGET``; checked every 10 steps); SFT ends when every task has
    reached it, or at ``sft_steps``.
    """
    tasks = tuple(val)
    replay = s.sft_replay
    model = build_model(seed, vocab_for(tasks), s.hidden, s.intermediate).train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed + 11)
    t0 = time.perf_counter()
    active = {t: True for t in tasks}
    reached: dict[str, int] = {}
    step = 0
    for step in range(1, s.sft_steps + 1):
        loss = torch.zeros(())
        for task in tasks:
            if not active[task] and replay == 0:
                continue
            p, a = make_prompts(task, g, s.sft_batch if active[task] else int(s.sft_batch * replay))
            loss = loss - answer_logprobs(model, p, a).mean() * (1.0 if active[task] else replay)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = accuracy(model, val)
            for t in tasks:
                if active[t] and acc[t] >= target:
                    active[t] = False
                    reached[t] = step
            stage("base (SFT)", step, s.sft_steps, t0, " ".join(f"{t} {acc[t]:.2f}" for t in tasks))
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


def grpo(
    base: nn.Module,
    task: str,
    recipe: Recipe,
    s: Settings,
    seed: int,
    store: SnapshotStore,
    return_model: bool = False,
    sel: tuple[Tensor, Tensor] | None = None,
    keep: dict[str, dict[str, Tensor]] | None = None,
) -> Any:
    """On-policy GRPO from the bf16 base with float32 master weights; bf16 snapshots into ``store``.

    Every snapshot carries the agent's importances: Adam/AdamW's raw ``exp_avg_sq`` from the live
    optimizer at that step; an SGD agent has none, so its last snapshot carries :func:`policy_fisher` instead.
    ``keep`` (if given) receives the final importances in float32: ``{"raw": ..., "bias_corrected": ...}`` (the
    Fisher is both). With ``recipe.plateau`` and ``sel`` (this task's selection prompts) training stops early
    once the selection accuracy has stopped improving."""
    model = copy.deepcopy(base).float().train()
    writer = store.writer(task, base=base)
    opt = make_optimizer(recipe, model.parameters())
    g = torch.Generator().manual_seed(seed)
    length = answer_len(task)
    t0 = time.perf_counter()
    rewards: list[float] = []
    curve: list[tuple[int, float]] = []
    best, stale, step = -1.0, 0, 0
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
        last = step == recipe.steps
        if step % s.snapshot_every == 0 and recipe.plateau and sel is not None:
            acc = accuracy(model, {task: sel})[task]
            model.train()
            curve.append((step, acc))
            best, stale = (acc, 0) if acc > best else (best, stale + 1)
            last = last or stale >= recipe.plateau
        if step % s.snapshot_every == 0 or last:
            if recipe.optimizer == "sgd":
                imp = policy_fisher(model, task, s, g) if last else None
            else:
                imp = adam_importance(opt, model)
            writer.snapshot(bf16_state(model), step=step, extra={"reward": rewards[-1]}, importance=imp)
        stage(f"RL {task}", step, recipe.steps, t0, f"reward {sum(rewards[-5:]) / len(rewards[-5:]):.2f}")
        if last:
            break
    if keep is not None:
        if recipe.optimizer == "sgd":
            keep["raw"] = keep["bias_corrected"] = imp
        else:
            keep["raw"] = imp
            keep["bias_corrected"] = adam_importance(opt, model, bias_correction=True)
    if return_model:
        return model
    return {
        "steps": step,
        "max_steps": recipe.steps,
        "reward_first5": sum(rewards[:5]) / 5,
        "reward_last5": sum(rewards[-5:]) / 5,
        "seconds": time.perf_counter() - t0,
        "selection_curve": curve,
        "importance": "fisher" if recipe.optimizer == "sgd" else "adam exp_avg_sq",
    }


def policy_fisher(
    model: nn.Module, task: str, s: Settings, g: torch.Generator, batches: int = FISHER_BATCHES
) -> dict[str, Tensor]:
    """The SGD agent's importances: a diagonal Fisher of its final policy (``empirical_fisher``) on its training
    prompts, the loss being −log p of answers sampled from the policy itself (batches of ``prompts_per_step``).

    Not the GRPO loss: its group-normalised advantages are 0 wherever the agent already solves every sample of
    a group, which would give the best-trained entries no importance at all."""
    length = answer_len(task)

    def batches_of() -> Any:
        for _ in range(batches):
            p, _ = make_prompts(task, g, s.prompts_per_step)
            yield p, generate(model.eval(), p, length, g)

    return empirical_fisher(model, batches_of(), lambda m, b: -answer_logprobs(m, *b).sum(1).mean(), batches=batches)


def density_study(base: nn.Module, s: Settings, seed: int, out: Path) -> list[dict[str, Any]]:
    """What controls the density of a task vector here: the same RL task (``sort``, 30 steps) from the same base
    under several optimisers and learning rates; density of τ with the master weights kept in float32
    (|τ| > 1e-5, the paper's rule) and after storage in bf16 (the value changed), and the reward gained."""
    grid = [
        Recipe("sgd", 0.001, 30),
        Recipe("sgd", 0.005, 30),
        Recipe("sgd", 0.02, 30),
        Recipe("adam", 3e-6, 30),
        Recipe("adam", 1e-5, 30),
        Recipe("adam", 3e-5, 30),
        Recipe("adam", 1e-4, 30),
        Recipe("adamw", 1e-5, 30, weight_decay=0.01),
    ]
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
        rows.append(
            {
                "optimizer": recipe.optimizer,
                "lr": recipe.lr,
                "steps": recipe.steps,
                "weight_decay": recipe.weight_decay,
                "density_fp32": fp32,
                "density_bf16": bf16,
                "sort_acc_bf16": accuracy(model.to(torch.bfloat16), val)["sort"],
            }
        )
    return rows


def bf16_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
