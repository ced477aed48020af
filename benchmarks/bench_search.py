"""What a search costs besides the user's evaluation, on a small MLP (a few M parameters, float32, CPU).

    python benchmarks/bench_search.py [--hidden 512] [--layers 6] [--agents 3] [--budget 60] [--module]

Prints, in one run: each candidate's merge time against one plain ``merge`` of the same models and against a
plain ``merge()`` of the family's first candidate (new output each time), per family; the search's time split
(merge / evaluate / other) and the share of everything but the evaluation; the extra peak resident memory of the
search and of one plain merge per method, against one model's bytes (Linux: VmHWM, reset through
/proc/self/clear_refs before each measurement). The evaluation is one forward pass of a batch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from _host import cpu_label
from torch import nn

from ram_live import merge, search
from ram_live.selection import Trial
from ram_live.selection.target import Merger


def make_model(hidden: int, layers: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)])


def fine_tuned(base: nn.Module, density: float, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    agent = type(base)(*[nn.Linear(m.in_features, m.out_features) for m in base])
    with torch.no_grad():
        for p, q in zip(agent.parameters(), base.parameters()):
            mask = torch.rand(q.shape, generator=g) < density
            p.copy_(q + 0.01 * torch.randn(q.shape, generator=g) * mask)
    return agent


def rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":")
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def setup(args: argparse.Namespace):
    """The base, the agents (modules), the inputs as passed (modules or state dicts), and the evaluation."""
    base = make_model(args.hidden, args.layers, 0)
    agents = {f"agent{i}": fine_tuned(base, d, i + 1) for i, d in enumerate([0.05, 0.3, 0.6, 0.2, 0.4][: args.agents])}
    if not args.module:
        base_in = {k: v.detach() for k, v in base.state_dict().items()}
        agents_in = {n: {k: v.detach() for k, v in a.state_dict().items()} for n, a in agents.items()}
    else:
        base_in, agents_in = base, agents
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = sum(a(x) for a in agents.values()) / len(agents)
    probe_net = make_model(args.hidden, args.layers, 0)

    def evaluate(merged) -> float:
        with torch.no_grad():
            if isinstance(merged, nn.Module):
                out = merged(x)
            else:
                probe_net.load_state_dict(merged, assign=False)
                out = probe_net(x)
            return -float((out - want).square().mean())

    return base, agents, base_in, agents_in, evaluate


RAM_SPACE = ["ram_plus", "lambdas", "leave_one_out", "activity"]


def peak_of(what: str, base_in, agents_in, evaluate, budget: int) -> int:
    """Bytes of resident memory above the inputs' at the peak of one search or merge (run in a fresh process)."""
    before, _ = rss()
    reset_peak()
    if what == "search":
        search(agents_in, base=base_in, evaluate=evaluate, budget=budget)
    elif what == "search-ram":
        search(agents_in, base=base_in, evaluate=evaluate, budget=budget // 2, space=RAM_SPACE)
    else:
        merge(agents_in, base=base_in, method=what)
    return rss()[1] - before


def peak_in_subprocess(what: str, argv: list[str]) -> int:
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--peak", what], capture_output=True, text=True, check=True
    ).stdout
    return int(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64, help="rows of the evaluation's forward pass")
    parser.add_argument("--module", action="store_true", help="module base (default: state dicts)")
    parser.add_argument("--peak", default=None, help=argparse.SUPPRESS)  # internal: one peak measurement
    parser.add_argument(
        "--ties-only", action="store_true", help="only the TIES threshold cache's row (cached vs uncached candidates)"
    )
    args = parser.parse_args()

    base, agents, base_in, agents_in, evaluate = setup(args)
    model_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    if args.peak:
        print(peak_of(args.peak, base_in, agents_in, evaluate, args.budget))
        return
    if args.ties_only:
        ties_cache_row(agents_in, base_in)
        return

    merge(agents_in, base=base_in)  # warm-up: native kernels, pools
    plain_s = timed(lambda: merge(agents_in, base=base_in), 7)
    argv = [a for a in sys.argv[1:]]
    plain_peak = {m: peak_in_subprocess(m, argv) for m in ("ram_plus", "task_arithmetic", "ties", "dare_ties")}
    search_peak, ram_peak = peak_in_subprocess("search", argv), peak_in_subprocess("search-ram", argv)

    ram_only = search(agents_in, base=base_in, evaluate=evaluate, budget=args.budget // 2, space=RAM_SPACE)
    t0 = time.perf_counter()
    result = search(agents_in, base=base_in, evaluate=evaluate, budget=args.budget)
    wall = time.perf_counter() - t0
    merger = Merger(agents_in, base_in)  # candidates again, each merged 3 times between plain merge calls
    merger.merge({"method": "ram_plus"})

    params = sum(p.numel() for p in base.parameters())
    print(
        f"model: {args.layers} x Linear({args.hidden}) = {params / 1e6:.2f} M parameters ({model_bytes / 1e6:.1f} MB "
        f"float32), {args.agents} agents, {'module' if args.module else 'state-dict'} base, "
        f"{torch.get_num_threads()} threads, {cpu_label()}"
    )
    print(f"plain merge (default RAM+: counts + merge, new output): median {plain_s * 1e3:.2f} ms of 7")
    by_family: dict[str, list[Trial]] = {}
    for t in result.history:
        if t.score is not None:
            by_family.setdefault(t.family, []).append(t)
    print(
        "candidate merge time (the family's best, re-merged into the search's output 3 times between plain "
        "merges, medians): / plain merge; / a plain merge() of the same candidate; during the search"
    )
    for family, trials in by_family.items():
        best = max(trials, key=lambda t: t.score)
        pairs = [
            (
                timed(lambda: merger.merge(best.candidate), 1),
                timed(lambda: merge(agents_in, base=base_in), 1),
                timed(lambda: merge(agents_in, base=base_in, **best.candidate), 1),
            )
            for _ in range(3)
        ]
        mine, plain, same = (statistics.median(x) for x in zip(*pairs))
        during = statistics.median(t.merge_seconds for t in trials) / plain_s
        print(
            f"  {family:<16} n={len(trials):>2}  {mine * 1e3:8.2f} ms   / merge {mine / plain:6.2f}   "
            f"/ same candidate {mine / same:5.2f}   during the search / merge {during:6.2f}"
        )
    total = result.total_seconds
    print(
        f"search: {len(result.history)} trials in {wall:.3f} s wall; merge {result.merge_seconds:.3f} s, evaluate "
        f"{result.evaluate_seconds:.3f} s, other {result.overhead_seconds:.3f} s; "
        f"all but evaluate {(total - result.evaluate_seconds) / total:.1%} of total, other alone "
        f"{result.overhead_seconds / total:.2%}; statistics passes {result.statistics_passes}"
    )
    r_total = ram_only.total_seconds
    print(
        f"RAM-family-only search ({len(ram_only.history)} trials): merge {ram_only.merge_seconds:.3f} s, evaluate "
        f"{ram_only.evaluate_seconds:.3f} s, other {ram_only.overhead_seconds:.3f} s; all but evaluate "
        f"{(r_total - ram_only.evaluate_seconds) / r_total:.1%}"
    )
    if reset_peak():
        print(
            f"extra peak RSS (fresh process each): search {search_peak / 1e6:.1f} MB = "
            f"{search_peak / model_bytes:.2f} x one model; RAM-family-only search {ram_peak / 1e6:.1f} MB = "
            f"{ram_peak / model_bytes:.2f} x; one plain merge: "
            + ", ".join(f"{m} {v / 1e6:.1f} MB ({v / model_bytes:.2f} x)" for m, v in plain_peak.items())
        )
    else:
        print("extra peak RSS: not measurable here (/proc/self/clear_refs not writable)")
    print(f"best: {result.best_trial.label()} score {result.best_score:.6g}")
    ties_cache_row(agents_in, base_in)


def ties_cache_row(agents_in, base_in) -> None:
    """The default TIES grid merged by a search's merger with its threshold cache (filled by one pass over the
    grid first, as a search fills it) and by one without, candidate by candidate in turn; medians."""
    from ram_live.selection.space import TIES_GRID

    cached, uncached = Merger(agents_in, base_in), Merger(agents_in, base_in)
    uncached._cached = lambda method: method  # TIES' own prepare: thresholds computed in every merge
    grid = [{"method": "ties", **g} for g in TIES_GRID]
    for c in grid:
        cached.merge(c)
    pairs = [(timed(lambda: cached.merge(c), 1), timed(lambda: uncached.merge(c), 1)) for c in grid]
    with_, without = (statistics.median(x) for x in zip(*pairs))
    print(
        f"TIES candidate merge, default grid ({len(grid)}), medians: thresholds cached {with_ * 1e3:.1f} ms, "
        f"computed each time {without * 1e3:.1f} ms ({with_ / without:.2f} x); cache "
        f"{len(cached.thresholds)} floats"
    )


def timed(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    main()
