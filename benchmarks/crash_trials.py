"""Crash and concurrency trials of the snapshot store with real processes.

    python benchmarks/crash_trials.py --trials 50            # writer killed with SIGKILL at random moments
    python benchmarks/crash_trials.py --concurrency 5        # 2 writers (pruning) + 1 merger for 5 s

Crash trials: one store; each trial starts a writer process that snapshots agent "crash" at steps continuing
after the last complete one (densities 0.5 %..60 %, so every encoding occurs, 0.01-0.9 MB each), waits a random
0-0.6 s after it is ready and SIGKILLs it. After each kill: every snapshot committed in any trial is listed and
reconstructs bit-exactly to what the writer wrote at that step, nothing else is listed (no half snapshot), and a
merge of the latest snapshot works. Orphans (files of the killed write) are counted, then removed by
``store.gc(grace_s=0)``. Also kills a writer while it creates the base (first trial, early kill).

Concurrency: two writer processes (agents "w0", "w1", prune keep=3) and a merger process that, in a loop, opens
``store.latest_all()``, checks each snapshot bit-exactly against the expected weights of its step and merges them.
Prints a JSON summary; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {
    "emb": ((256, 512), torch.bfloat16),
    "w1": ((128, 512), torch.float32),
    "w2": ((512, 128), torch.bfloat16),
    "b": ((1000,), torch.float32),
    "scale": ((), torch.float32),
}
DENSITIES = (0.005, 0.02, 0.1, 0.3, 0.6)


def make_base(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g).to(dtype) for k, (shape, dtype) in SHAPES.items()}


def expected(base: dict[str, torch.Tensor], agent: str, step: int) -> dict[str, torch.Tensor]:
    """The weights agent ``agent`` has at ``step``: the base moved at a step-dependent random subset."""
    seed = (sum(map(ord, agent)) * 1_000_003 + step) % (2**31)
    g = torch.Generator().manual_seed(seed)
    density = DENSITIES[step % len(DENSITIES)]
    out = {}
    for k, v in base.items():
        mask = torch.rand(v.shape, generator=g) < density
        delta = (torch.randn(v.shape, generator=g) * 0.5 + 0.25).to(v.dtype)
        out[k] = torch.where(mask, v + delta, v)
    return out


def check(store, agent: str, base: dict[str, torch.Tensor], step: int) -> None:
    snap = store.open(agent, step)
    want = expected(base, agent, step)
    for k, v in want.items():
        got = snap.get(k)
        if got.dtype != v.dtype or not torch.equal(got.view(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)):
            raise AssertionError(f"{agent} step {step}: tensor {k} differs")


# --------------------------------------------------------------------------------------------- workers


def writer_main(store_dir: str, agent: str, keep: int | None, limit: int | None) -> None:
    from ram_live.store import SnapshotStore

    store = SnapshotStore(store_dir)
    base = make_base()
    run = store.current_run(agent)  # a writer restarted after a crash continues its run (None: a new one)
    writer = store.writer(agent, base, run=run)
    step = (store.steps(agent, run=writer.run) or [0])[-1] + 1
    print("ready", flush=True)
    n = 0
    while limit is None or n < limit:
        writer.snapshot(expected(base, agent, step), step)
        print(f"committed {step}", flush=True)
        if keep is not None:
            store.prune(keep, agent, run=writer.run)
        step += 1
        n += 1


def merger_main(store_dir: str, seconds: float) -> None:
    from ram_live import merge
    from ram_live.store import SnapshotNotFoundError, SnapshotStore

    base = make_base()
    store = SnapshotStore(store_dir)
    start = time.time()
    while len(store.agents()) < 2 and time.time() < start + 120:  # both writers have started
        time.sleep(0.02)
    deadline = time.time() + seconds
    reads = merges = 0
    errors: list[str] = []
    while time.time() < deadline:
        try:
            snaps = store.latest_all()
        except SnapshotNotFoundError as exc:
            errors.append(f"latest_all: {exc}")
            continue
        for agent, snap in snaps.items():
            want = expected(base, agent, snap.step)
            for k, v in want.items():
                if not torch.equal(snap.get(k).reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)):
                    errors.append(f"torn read: {agent} step {snap.step} tensor {k}")
            reads += 1
        if len(snaps) >= 2 and reads % 4 == 0:
            merged = merge(snaps)
            ref = merge({a: expected(base, a, s.step) for a, s in snaps.items()}, base=base)
            if any(not torch.equal(merged[k], ref[k]) for k in ref):
                errors.append("merge from the store differs from the merge of the expected weights")
            merges += 1
    print(json.dumps({"reads": reads, "merges": merges, "errors": errors[:10], "n_errors": len(errors)}), flush=True)


# --------------------------------------------------------------------------------------------- drivers


def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def crash_trials(trials: int, seed: int, store_dir: str | None = None, max_delay: float = 0.6) -> dict:
    from ram_live import merge
    from ram_live.store import SnapshotStore

    rng = random.Random(seed)
    tmp = store_dir or tempfile.mkdtemp(prefix="ram-crash-")
    base = make_base()
    committed: set[int] = set()
    results = {
        "trials": trials,
        "killed": 0,
        "exited_early": 0,
        "snapshots_checked": 0,
        "orphans_seen": 0,
        "in_flight_visible": 0,
        "failures": [],
    }
    for trial in range(trials):
        proc = _spawn("--worker", "writer", "--store", tmp, "--agent", "crash")
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "ready": imports done, base set
        if trial == 0:
            delay = 0.0  # kill at once: often while the base is being written (first trial) or right after
        else:
            delay = rng.uniform(0.0, max_delay)
        if line.strip() == "ready":
            time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        if proc.returncode == -signal.SIGKILL:
            results["killed"] += 1
        else:
            results["exited_early"] += 1
            results["failures"].append(f"trial {trial}: writer exited with {proc.returncode}: {err[-500:]}")
        done = {int(ln.split()[1]) for ln in (line + out).splitlines() if ln.startswith("committed")}
        committed |= done
        try:
            store = SnapshotStore(tmp)
            listed = set(store.steps("crash"))
            missing = committed - listed
            if missing:
                results["failures"].append(f"trial {trial}: committed snapshots lost: {sorted(missing)}")
            extra = listed - committed
            # the one in flight may have been renamed into place just before the kill (its "committed" line lost)
            if len(extra) > 1 or (extra and min(extra) <= max(committed | {0})):
                results["failures"].append(f"trial {trial}: unexpected snapshots listed: {sorted(extra)}")
            results["in_flight_visible"] += len(extra)
            committed |= extra
            for step in sorted(listed):
                check(store, "crash", base, step)
                results["snapshots_checked"] += 1
            if listed:
                latest = store.latest("crash")
                merged = merge({"crash": latest})
                want = merge({"crash": expected(base, "crash", latest.step)}, base=base)
                if any(not torch.equal(merged[k], want[k]) for k in want):
                    results["failures"].append(f"trial {trial}: merge of the latest snapshot != merge of its weights")
            folder = Path(tmp) / "crash"
            referenced = set()
            for step in listed:
                referenced |= {f["name"] for f in store.open("crash", step).manifest["files"]}
            orphans = (
                [p for p in folder.iterdir() if not p.name.endswith(".json") and p.name not in referenced]
                if folder.exists()
                else []
            )
            results["orphans_seen"] += len(orphans)
            store.gc(grace_s=0)
            for step in sorted(listed):
                store.open("crash", step)
        except Exception as exc:  # noqa: BLE001 - reported
            results["failures"].append(f"trial {trial}: {type(exc).__name__}: {exc}")
    results["snapshots_committed"] = len(committed)
    results["store"] = tmp
    return results


def concurrency(seconds: float, store_dir: str | None = None) -> dict:
    tmp = store_dir or tempfile.mkdtemp(prefix="ram-conc-")
    from ram_live.store import SnapshotStore

    SnapshotStore(tmp).writer("w0", make_base())  # the base exists before the processes start
    writers = [_spawn("--worker", "writer", "--store", tmp, "--agent", f"w{i}", "--keep", "3") for i in range(2)]
    merger = _spawn("--worker", "merger", "--store", tmp, "--seconds", str(seconds))
    out, err = merger.communicate()
    commits = []
    for w in writers:
        w.send_signal(signal.SIGKILL)
        w_out, _ = w.communicate()
        commits.append(sum(1 for ln in w_out.splitlines() if ln.startswith("committed")))
    try:
        summary = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        summary = {"n_errors": 1, "errors": [f"merger failed: {err[-2000:]}"], "reads": 0, "merges": 0}
    summary["commits"] = commits
    summary["store"] = tmp
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--concurrency", type=float, default=0.0, help="seconds of the writers + merger run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store")
    p.add_argument("--worker", choices=["writer", "merger"])
    p.add_argument("--agent", default="crash")
    p.add_argument("--keep", type=int)
    p.add_argument("--limit", type=int)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    if a.worker == "writer":
        return writer_main(a.store, a.agent, a.keep, a.limit)
    if a.worker == "merger":
        return merger_main(a.store, a.seconds)
    failed = False
    if a.trials:
        t0 = time.time()
        r = crash_trials(a.trials, a.seed, a.store)
        r["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(r, indent=1))
        failed |= bool(r["failures"]) or r["killed"] != a.trials
    if a.concurrency:
        r = concurrency(a.concurrency, a.store if not a.trials else None)
        print(json.dumps(r, indent=1))
        failed |= r["n_errors"] > 0 or r["reads"] == 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
