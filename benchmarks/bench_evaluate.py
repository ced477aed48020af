"""What ``ram_live.evaluate.rewards`` costs against a plain hand-written batched ``generate`` loop over the same
prompts (target: <= 1.1x), and what share of a ``search``'s wall time goes to the evaluation. A small Llama
(float32, CPU) built from a config, a character-level tokenizer, no downloads.

    python benchmarks/bench_evaluate.py [--hidden 256] [--layers 4] [--prompts 32] [--max-new-tokens 32]
        [--batch-size 16] [--repeats 5] [--budget 6]

The two are timed in interleaved repetitions in the same run (medians); both generate the same tokens (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from _host import cpu_label

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import evaluate_helpers as h  # noqa: E402

from ram_live import search  # noqa: E402
from ram_live.evaluate import rewards  # noqa: E402


def model(hidden: int, layers: int, seed: int) -> torch.nn.Module:
    cfg = h.config()
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = hidden, 2 * hidden, layers
    torch.manual_seed(seed)
    return h.transformers.LlamaForCausalLM(cfg).eval()


def plain_loop(m, tok, prompts: list[str], max_new: int, batch_size: int) -> list[list[int]]:
    """The hand-written baseline: tokenizer padding on the left, greedy generate, completions sliced off."""
    out = []
    with torch.no_grad():
        for s in range(0, len(prompts), batch_size):
            enc = tok(prompts[s : s + batch_size], return_tensors="pt", padding=True)
            gen = m.generate(
                **enc,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            out.extend(gen[:, enc["input_ids"].shape[1] :].tolist())
    return out


def cut(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=int, default=6)
    args = ap.parse_args()
    tok = h.tokenizer()
    prompts = [(h.PROMPTS[i % len(h.PROMPTS)] + " " + h.CHARS[i % 26] * (i % 5)).strip() for i in range(args.prompts)]
    base = model(args.hidden, args.layers, 0)
    evaluate = rewards(prompts, h.length, tokenizer=tok, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"## bench_evaluate ({cpu_label()}, torch threads {torch.get_num_threads()})")
    print(
        f"Llama {n_params / 1e6:.2f} M parameters (hidden {args.hidden}, {args.layers} layers, float32), "
        f"{args.prompts} prompts, max_new_tokens {args.max_new_tokens}, batch {args.batch_size}"
    )

    plain_loop(base, tok, prompts, args.max_new_tokens, args.batch_size)  # warm-up
    evaluate(base)
    ours, theirs = [], []
    for _ in range(args.repeats):  # interleaved
        t0 = time.perf_counter()
        ids = plain_loop(base, tok, prompts, args.max_new_tokens, args.batch_size)
        theirs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        evaluate(base)
        ours.append(time.perf_counter() - t0)
    expected = [float(len(cut(i, tok.eos_token_id))) for i in ids]
    same = evaluate.per_prompt == expected
    ratio = statistics.median(ours) / statistics.median(theirs)
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(
        f"plain generate loop: {statistics.median(theirs):.3f} s   rewards(): {statistics.median(ours):.3f} s "
        f"(medians of {args.repeats})   ratio {ratio:.3f} (per repetition {min(ratios):.3f}–{max(ratios):.3f}; "
        f"target <= 1.1)   same tokens: {same}"
    )

    agents = {f"agent{i}": model(args.hidden, args.layers, i + 1).state_dict() for i in range(2)}
    with torch.no_grad():  # agents near the base: a base plus a sparse change
        for i, sd in enumerate(agents.values()):
            g = torch.Generator().manual_seed(i)
            for k, v in base.state_dict().items():
                sd[k] = v + (torch.rand(v.shape, generator=g) < 0.2) * torch.randn(v.shape, generator=g) * 0.02
    t0 = time.perf_counter()
    result = search(agents, base=base, evaluate=evaluate, budget=args.budget)
    wall = time.perf_counter() - t0
    print(
        f"search (budget {args.budget}, module base): wall {wall:.2f} s, evaluate {result.evaluate_seconds:.2f} s "
        f"({100 * result.evaluate_seconds / wall:.1f} %), merge {result.merge_seconds:.2f} s "
        f"({100 * result.merge_seconds / wall:.1f} %), other {result.overhead_seconds:.2f} s"
    )


if __name__ == "__main__":
    main()
