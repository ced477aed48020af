"""Quickstart: three agents of one tiny Llama, the probe, and every merge method, on CPU in seconds.

What it shows, step by step:

1. A base model: a tiny Llama built from a config (nothing is downloaded), randomly initialised with a seed,
   stored in bf16 as released checkpoints are.
2. Three agents fine-tuned from it, each on its own synthetic next-token task, with its own optimiser and a
   learning rate small enough that, as in RL fine-tuning in bf16, most updates stay below half a bf16 step
   and are rounded away when the agent is saved in bf16. Which entries changed, and how many, is therefore
   measured, not chosen: the probe reports it.
3. ``probe``: per agent, how many entries it changed, how many of them no other agent touched (unique),
   ρ and RAM+'s λ; pairwise overlap; ``probe.png`` draws density and unique share per layer.
4. The two entry points the README quotes: ``ram_merge(...)`` and ``merge(..., method="ties", density=0.2)``.
5. Every method of ``ram_live.available_methods()``, timed, and scored on each agent's own task by the share
   of that specialist's loss improvement over the base the merged model keeps (100 % = as good as the
   specialist, 0 % = no better than the base), once as returned (a module in the base's dtype, bf16) and once
   merged into a float32 state dict (``dtype=torch.float32``; that second merge reuses the probe's counts,
   ``statistics=report.statistics()``, so RAM+ skips its counting pass). These are toy tasks on a toy model: the numbers
   show how the methods behave on sparse, overlapping updates, not which method is best.

Run: ``python examples/quickstart.py [--out DIR] [--seed N]`` (in ``.venv``; writes ``probe.png`` and
``results.json`` to DIR, by default ``ram_live-quickstart`` in the system's temporary folder; it prints where).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

import ram_live
from ram_live import merge, probe, ram_merge

SEQ_LEN = 32
STEPS = 60
BATCH = 16

Task = Callable[[torch.Generator, int], Tensor]


def coder_task(g: torch.Generator, n: int) -> Tensor:
    """Arithmetic progressions over tokens 0..15: x, x+s, x+2s, ... (mod 16)."""
    start, step = torch.randint(0, 16, (n, 1), generator=g), torch.randint(1, 8, (n, 1), generator=g)
    return (start + step * torch.arange(SEQ_LEN)) % 16


def tools_task(g: torch.Generator, n: int) -> Tensor:
    """A 16-token "call" over tokens 16..63, echoed once."""
    call = torch.randint(16, 64, (n, SEQ_LEN // 2), generator=g)
    return torch.cat([call, call], dim=1)


def memory_task(g: torch.Generator, n: int) -> Tensor:
    """Key/value pairs over tokens 48..111: key k in 48..79 is always followed by value k + 32."""
    keys = torch.randint(48, 80, (n, SEQ_LEN // 2), generator=g)
    return torch.stack([keys, keys + 32], dim=2).reshape(n, SEQ_LEN)


# Each agent: its task, its optimiser, its learning rate. Tools and memory share tokens 48..63.
AGENTS: dict[str, tuple[Task, type[torch.optim.Optimizer], dict[str, float]]] = {
    "coder": (coder_task, torch.optim.SGD, {"lr": 3e-5}),
    "tools": (tools_task, torch.optim.Adam, {"lr": 2.5e-6}),
    "memory": (memory_task, torch.optim.AdamW, {"lr": 1.4e-6, "weight_decay": 0.01}),
}

# Options per method (defaults elsewhere): TA and DARE+TA scaled by 1/N, TIES keeps the top 20 %, DARE drops half.
N = len(AGENTS)
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "task_arithmetic": {"scale": 1 / N},
    "ties": {"density": 0.2},
    "dare_linear": {"density": 0.5, "scale": 1 / N},
    "dare_ties": {"density": 0.5},
}


def build_base(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def finetune(
    base: nn.Module, task: Task, optimizer: type[torch.optim.Optimizer], options: dict[str, float], seed: int
) -> nn.Module:
    """Train a float32 copy of ``base`` for STEPS steps on ``task``; return it in bf16 (as it would be saved)."""
    model = copy.deepcopy(base).float().train()
    opt = optimizer(model.parameters(), **options)
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        batch = task(g, BATCH)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.to(torch.bfloat16).eval()


@torch.no_grad()
def task_loss(model: nn.Module, batch: Tensor) -> float:
    """Next-token loss, computed in float32 on the model's stored (bf16) weights."""
    return float(copy.deepcopy(model).float()(input_ids=batch, labels=batch).loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ram_live-quickstart",
        help="folder for probe.png and results.json (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"output folder: {args.out}")
    torch.set_num_threads(1)  # tensors this small gain nothing from more threads, and lose when cores are busy
    t_start = time.perf_counter()

    # 1-2. Base and agents.
    base = build_base(args.seed)
    agents = {
        name: finetune(base, task, opt, options, seed=args.seed + i + 1)
        for i, (name, (task, opt, options)) in enumerate(AGENTS.items())
    }
    held_out = torch.Generator().manual_seed(args.seed + 1000)
    eval_batches = {name: task(held_out, 256) for name, (task, _, _) in AGENTS.items()}
    base_loss = {name: task_loss(base, eval_batches[name]) for name in AGENTS}
    own_loss = {name: task_loss(agents[name], eval_batches[name]) for name in AGENTS}
    print(
        f"trained {N} agents ({STEPS} steps each) in {time.perf_counter() - t_start:.1f} s; held-out loss on "
        "own task, base -> specialist:"
    )
    for name, (_, opt, options) in AGENTS.items():
        print(
            f"  {name:<7} {opt.__name__:<6} lr={options['lr']:g}  {base_loss[name]:.4f} -> {own_loss[name]:.4f}"
            f"  ({base_loss[name] - own_loss[name]:.4f} nats)"
        )

    # 3. Probe: who changed what.
    report = probe(agents, base=base)
    print("\n" + report.table())
    report.plot(str(args.out / "probe.png"))
    print(f"wrote {args.out / 'probe.png'}")

    # 4. The two entry points, as the README quotes them.
    coder, tools, memory = agents["coder"], agents["tools"], agents["memory"]
    before = {k: v.clone() for k, v in base.state_dict().items()}
    generalist = ram_merge([coder, tools, memory], base=base)
    assert isinstance(generalist, LlamaForCausalLM) and generalist is not base
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items()), "the base was modified"
    ties_model = merge([coder, tools, memory], base=base, method="ties", density=0.2)
    print(
        f"\nram_merge(...) -> new {type(generalist).__name__} ({next(generalist.parameters()).dtype}), "
        f"base untouched; merge(..., method='ties', density=0.2) -> {type(ties_model).__name__}"
    )

    # 5. Every method: time, and the share of each specialist's improvement the merged model keeps. The merged
    # module comes back in the base's dtype (bf16), where a 1-step update scaled by 1/3 or by λ = 1.2 rounds
    # to 0 or 1 step again; the last column merges the same way into a float32 state dict (dtype=) instead.
    def kept(model: nn.Module) -> dict[str, float]:
        return {n: (base_loss[n] - task_loss(model, eval_batches[n])) / (base_loss[n] - own_loss[n]) for n in AGENTS}

    print(
        "\nshare of each specialist's loss improvement over the base kept by the merged model "
        "(100% = specialist, 0% = base)"
    )
    head = f"{'method':<16}{'seconds':>8}" + "".join(f"{n:>8}" for n in AGENTS) + f"{'mean':>8}{'(fp32)':>8}  options"
    print(head + "\n" + "-" * len(head))
    results: dict[str, Any] = {}
    for method in ram_live.available_methods():
        options = METHOD_OPTIONS.get(method, {})
        t0 = time.perf_counter()
        merged, info = merge(agents, base=base, method=method, return_info=True, **options)
        seconds = time.perf_counter() - t0
        merged32 = copy.deepcopy(base).float()
        # the same inputs again: RAM+ takes the probe's counts instead of counting (statistics=; others ignore it)
        merged32.load_state_dict(
            merge(
                agents,
                base=base.state_dict(),
                method=method,
                dtype=torch.float32,
                statistics=report.statistics(),
                **options,
            )
        )
        share, share32 = kept(merged), kept(merged32)
        mean, mean32 = sum(share.values()) / N, sum(share32.values()) / N
        shown = ", ".join(f"{k}={v:.3g}" for k, v in options.items()) or "defaults"
        if info.lambdas:
            shown = "λ " + " ".join(f"{v:.3f}" for v in info.lambdas.values())
        print(
            f"{method:<16}{seconds:>8.3f}"
            + "".join(f"{share[n]:>8.1%}" for n in AGENTS)
            + f"{mean:>8.1%}{mean32:>8.1%}  {shown}"
        )
        results[method] = {
            "seconds": seconds,
            "options": options,
            "kept": share,
            "kept_fp32": share32,
            "lambdas": info.lambdas,
        }
    print(
        "(fp32): mean of the same merge written as a float32 state dict instead of the bf16 module.\n"
        "Updates this small act linearly (an agent's own update × 1.5 would score 150 % on its task), so methods\n"
        "that enlarge steps (λ > 1, DARE's 1/density) score higher here: this is not a benchmark."
    )

    (args.out / "results.json").write_text(
        json.dumps(
            {
                "seed": args.seed,
                "base_loss": base_loss,
                "specialist_loss": own_loss,
                "probe": {"agents": report.to_dict()["agents"], "histogram": report.histogram},
                "methods": results,
            },
            indent=2,
            default=str,
        )
    )
    print(f"\nwrote {args.out / 'results.json'}; total {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
