"""Merge three LoRA adapters with RAM+: into a new adapter of a live PeftModel, into the base, and from disk.

Everything runs on CPU in seconds; nothing is downloaded (the model is a tiny Llama built from a config).

1. A base model and three LoRA adapters ("count", "route", "lookup") of one PeftModel, each trained a few
   dozen steps on its own synthetic task (different ranks and options on purpose: r = 8, rsLoRA r = 16, and a
   ``rank_pattern``).
2. ``ram_merge_adapters(model, [...], "generalist")``: ΔW_t = s_t·B_t A_t per module with each adapter's exact
   scaling, RAM+ in ΔW space with the recommended activity rule, re-factored by truncated SVD into a new adapter
   of the largest input rank; the report gives λ/ρ per adapter and the re-factorisation error per module.
3. ``set_adapter("generalist")``, ``save_pretrained``, ``PeftModel.from_pretrained``: the reloaded model's
   outputs equal the live one's.
4. ``into_base=True``: a plain ``LlamaForCausalLM`` with the merged ΔW folded into its weights.
5. ``ram_merge_adapter_files``: the same merge from the adapter folders on disk, without a live model.

Run: ``python examples/merge_lora_adapters.py``.
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

warnings.filterwarnings("ignore", module="peft")
warnings.filterwarnings("ignore", category=FutureWarning)

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live.peft import ram_merge_adapter_files, ram_merge_adapters  # noqa: E402

SEQ, BATCH, STEPS = 16, 32, 40
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ROUTE = torch.randperm(48, generator=torch.Generator().manual_seed(0)) + 32
TABLE = torch.randint(112, 128, (32,), generator=torch.Generator().manual_seed(1))


def chain(g: torch.Generator, n: int, lo: int, hi: int, step) -> Tensor:
    seq = [torch.randint(lo, hi, (n,), generator=g)]
    for _ in range(SEQ - 1):
        seq.append(step(seq[-1]))
    return torch.stack(seq, dim=1)


TASKS = {
    "count": lambda g, n: chain(g, n, 0, 32, lambda x: (x + 5) % 32),  # x, x+5, x+10, ... mod 32
    "route": lambda g, n: chain(g, n, 32, 80, lambda x: ROUTE[x - 32]),  # a fixed successor table
    "lookup": lambda g, n: torch.stack(  # key, table[key], key, ...
        [k := torch.randint(80, 112, (n, SEQ // 2), generator=g), TABLE[k - 80]], dim=2
    ).reshape(n, SEQ),
}
CONFIGS = {
    "count": LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS),
    "route": LoraConfig(r=16, lora_alpha=16, use_rslora=True, target_modules=TARGETS),
    "lookup": LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, rank_pattern={"down_proj": 4}),
}


def loss(model, batch: Tensor) -> Tensor:
    return model(input_ids=batch, labels=batch).loss


@torch.no_grad()
def losses(model, batches: dict[str, Tensor]) -> dict[str, float]:
    model.eval()
    return {name: float(loss(model, batch)) for name, batch in batches.items()}


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
        )
    )
    base.eval()

    # 1. One PeftModel, three adapters, each trained on its own task.
    names = list(TASKS)
    model = get_peft_model(copy.deepcopy(base), CONFIGS[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, CONFIGS[name])
    for i, name in enumerate(names):
        model.set_adapter(name)
        params = [p for n, p in model.named_parameters() if f".{name}." in n]
        opt = torch.optim.AdamW(params, lr=1e-2)
        g = torch.Generator().manual_seed(i)
        model.train()
        for _ in range(STEPS):
            opt.zero_grad()
            loss(model, TASKS[name](g, BATCH)).backward()
            opt.step()
    held_out = {name: task(torch.Generator().manual_seed(100), 256) for name, task in TASKS.items()}

    # 2. RAM+ in ΔW space, re-factored into a new adapter.
    _, report = ram_merge_adapters(model, names, "generalist", method="ram_plus", return_info=True)
    print(report.table())

    # 3. Use it, save it, reload it.
    model.set_adapter("generalist")
    x = held_out["count"][:4]
    with torch.no_grad():
        live = model(x).logits
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, selected_adapters=names + ["generalist"])
        reloaded = PeftModel.from_pretrained(copy.deepcopy(base), Path(tmp) / "generalist").eval()
        with torch.no_grad():
            same = torch.equal(reloaded(x).logits, live)
        print(f"\nsaved and reloaded the merged adapter: outputs equal the live model's: {same}")

        # 5. The same merge from the folders on disk (PEFT saves a non-default adapter in a subfolder).
        folders = {name: Path(tmp) / name for name in names}
        out = ram_merge_adapter_files(folders, Path(tmp) / "from_disk", method="ram_plus")
        from_disk = PeftModel.from_pretrained(copy.deepcopy(base), out).eval()
        with torch.no_grad():
            print(
                f"merged from the folders: max |logit difference| to the live merge "
                f"{float((from_disk(x).logits - live).abs().max()):.2e}"
            )

    # 4. Into the base: a plain model, no adapter.
    plain = ram_merge_adapters(model, names, method="ram_plus", into_base=True)
    print(
        f"into_base=True -> {type(plain).__name__} with "
        f"{sum('lora' in n for n, _ in plain.named_parameters())} LoRA parameters"
    )

    print("\nheld-out loss per task (lower is better):")
    rows = {"base": losses(base, held_out)}
    for name in names:
        model.set_adapter(name)
        rows[f"adapter {name}"] = losses(model, held_out)
    model.set_adapter("generalist")
    rows["merged adapter (RAM+)"] = losses(model, held_out)
    rows["merged into base (RAM+)"] = losses(plain, held_out)
    print(f"{'model':<26}" + "".join(f"{n:>9}" for n in names))
    for label, row in rows.items():
        print(f"{label:<26}" + "".join(f"{row[n]:9.3f}" for n in names))


if __name__ == "__main__":
    main()
