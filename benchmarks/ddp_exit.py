"""Count the two-rank DDP runs that hang at exit (issue 44): a plain ``transformers.Trainer`` on a PEFT LoRA model
(the tiny Qwen2 of tests/test_transformers_callback.py, two CPU processes, gloo) ending as a script ends:
``trainer.train()``, ``destroy_process_group()``, return, and the interpreter's own teardown.

    python benchmarks/ddp_exit.py --runs 20 --mode merges       # the RAM callback snapshotting and merging
    python benchmarks/ddp_exit.py --runs 20 --mode plain        # no RAM callback

A run hangs when a rank has finished ``trainer.train()`` (its marker file) and has not exited ``--grace`` seconds
later; both ranks are then killed. Prints one line per run and the count.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


VOCAB = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}}


def _model() -> object:
    """The tiny Qwen2 of tests/test_transformers_callback.py (built from a config, no download)."""
    import torch
    import transformers

    cfg = transformers.Qwen2Config(
        vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg)


def _score(model: object) -> dict[str, float]:
    import torch

    ids = torch.tensor([[VOCAB[c] for c in "hello world"]])
    with torch.no_grad():
        return {"loglik": -float(model(input_ids=ids, labels=ids).loss)}


def worker(rank: int, root: Path, init: str, mode: str) -> None:
    """One rank: train 4 steps, snapshot and merge every 2 (``mode="merges"``), then end as a script does."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    from ram_live.integrations.transformers import RAMTrainerCallback

    transformers.logging.set_verbosity_error()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="1", WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    texts = ["hello world", "abc def", "the cat", "a dog ran", "sun and moon", "big red box", "ice", "zebra"]
    rows = []
    for text in texts:
        ids = [VOCAB[c] for c in text][:8] + [0] * (8 - len(text[:8]))
        rows.append(
            {"input_ids": ids, "labels": [t if t else -100 for t in ids], "attention_mask": [int(t > 0) for t in ids]}
        )
    args = transformers.TrainingArguments(
        output_dir=str(root / f"run{rank}"),
        per_device_train_batch_size=2,
        max_steps=4,
        learning_rate=1e-2,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
    )
    callbacks = []
    if mode != "plain":
        every = 2 if mode == "merges" else None
        callbacks.append(
            RAMTrainerCallback(
                root / "store", "ddp", snapshot_every=2, merge_every=every, evaluate=_score, merged_dir=root / "merged"
            )
        )
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"])
    trainer = transformers.Trainer(
        model=get_peft_model(_model(), lora), args=args, train_dataset=rows, callbacks=callbacks
    )
    trainer.train()
    (root / f"trained{rank}").write_text("1")
    if callbacks and os.environ.get("RAM_DDP_EXIT_LOG"):  # what the callback did: its merges' steps, its failures
        with open(os.environ["RAM_DDP_EXIT_LOG"], "a") as f:
            steps, errors = [h["step"] for h in callbacks[0].history], getattr(callbacks[0].schedule, "errors", None)
            f.write(f"rank {rank}: merged at {steps}, errors {errors}\n")
    if os.environ.get("RAM_DDP_EXIT_DUMP"):  # every thread's Python stack, should this rank still run by then
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["RAM_DDP_EXIT_DUMP"]), file=open(root / f"stack{rank}", "w"))
    torch.distributed.destroy_process_group()


def _dump(procs: list[subprocess.Popen], stuck: list[int], root: Path, dump: Path) -> None:
    """The stuck ranks' native stacks (gdb) and Python stacks (faulthandler) into ``dump``."""
    dump.mkdir(parents=True, exist_ok=True)
    for r in stuck:
        pid = procs[r].pid
        gdb = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"], capture_output=True, text=True, timeout=120
        )
        (dump / f"rank{r}-{pid}.gdb.txt").write_text(gdb.stdout + gdb.stderr)
        stack = root / f"stack{r}"
        if stack.exists():
            (dump / f"rank{r}-{pid}.py.txt").write_text(stack.read_text())


def one_run(mode: str, grace: float, deadline: float, dump: Path | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(rank),
                    "--root",
                    tmp,
                    "--init",
                    str(root / "init"),
                    "--mode",
                    mode,
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(root / f"err{rank}", "w"),
            )
            for rank in (0, 1)
        ]
        start, trained_at = time.monotonic(), None
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            if trained_at is None and any((root / f"trained{r}").exists() for r in (0, 1)):
                trained_at = time.monotonic()
            late = trained_at is not None and time.monotonic() - trained_at > grace
            if late or time.monotonic() - start > deadline:
                stuck = [r for r, p in enumerate(procs) if p.poll() is None]
                if dump is not None:
                    _dump(procs, stuck, root, dump)
                for p in procs:
                    p.kill()
                return f"hang (ranks {stuck} still running {'after training' if late else 'before training ended'})"
        codes = [p.returncode for p in procs]
        if codes != [0, 0]:
            return f"failed {codes}: {(root / 'err0').read_text()[-400:]}{(root / 'err1').read_text()[-400:]}"
        return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mode", choices=["merges", "snapshots", "plain"], default="merges")
    parser.add_argument("--grace", type=float, default=60.0, help="seconds a rank may take to exit after training")
    parser.add_argument("--deadline", type=float, default=600.0)
    parser.add_argument("--dump", type=Path, default=None, help="a folder for the stacks of hung ranks (gdb)")
    parser.add_argument("--worker", type=int, default=None)
    parser.add_argument("--root")
    parser.add_argument("--init")
    a = parser.parse_args()
    if a.worker is not None:
        worker(a.worker, Path(a.root), a.init, a.mode)
        return
    outcomes = []
    for i in range(a.runs):
        t0 = time.monotonic()
        if a.dump is not None:
            os.environ["RAM_DDP_EXIT_DUMP"] = str(max(a.grace - 15.0, 5.0))
        outcome = one_run(a.mode, a.grace, a.deadline, a.dump)
        outcomes.append(outcome)
        print(f"run {i + 1}/{a.runs} [{a.mode}]: {outcome} ({time.monotonic() - t0:.0f} s)", flush=True)
    hangs = sum(o.startswith("hang") for o in outcomes)
    failed = sum(o.startswith("failed") for o in outcomes)
    print(f"{a.mode}: {hangs} of {a.runs} runs hung at exit, {failed} failed otherwise", flush=True)


if __name__ == "__main__":
    main()
