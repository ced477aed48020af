"""Seconds per candidate through vLLM (``ram_live.evaluate.VLLMGenerate``: the candidate's weights swapped into one
engine, then its completions) and through Hugging Face ``generate`` (the candidate loaded into one model, then
generated in batches), on the same prompts and candidates, greedy or sampled. A random Llama built from a config
(head_dim 64), a WordLevel tokenizer of ``--vocab`` tokens, no downloads.

    python benchmarks/bench_vllm.py [--hidden 512] [--layers 8] [--vocab 8192] [--prompts 16] [--samples 4]
        [--max-new-tokens 64] [--candidates 3] [--dtype float32] [--batch-size 64] [--json FILE]

Needs vLLM (the ``.venv-vllm`` environment of ``scripts/test_vllm.sh`` on a CPU with AVX-512; the ``vllm`` extra on
a GPU). Each engine runs in a process of its own (on a CPU vLLM binds its process's threads), the Hugging
Face one first; each times the same candidates after one warm-up candidate, and the engine's start is reported
apart. The ratio is HF's median seconds per candidate over vLLM's, both measured in this run; with ``--samples
1`` (greedy, float32) the completions of the two are compared too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _host import cpu_label


def build(folder: Path, args: argparse.Namespace) -> None:
    """The random base and its tokenizer, saved as a Hugging Face folder."""
    import torch
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = "abcdefghijklmnopqrstuvwxyz =+0123456789"
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    vocab.update({f"<t{i}>": i for i in range(len(vocab), args.vocab)})
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<eos>", unk_token="<unk>", pad_token="<pad>", padding_side="left"
    )
    heads = args.hidden // 64
    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(4.0)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)


def prompts(n: int) -> list[str]:
    words = ["the cat", "two plus two =", "abc", "hello there", "9 8 7", "q", "xyz abc", "a b c d"]
    return [f"{words[i % len(words)]} {i}" for i in range(n)]


def run(engine: str, folder: str, args: argparse.Namespace) -> dict:
    """In this process: one engine's seconds per candidate (and its completions of the first timed one)."""
    import torch
    from safetensors.torch import load_file

    from ram_live.evaluate import VLLMGenerate, rewards

    base = load_file(str(Path(folder) / "model.safetensors"))
    candidates = []
    for c in range(args.candidates + 1):  # the first: a warm-up
        g = torch.Generator().manual_seed(c)
        candidates.append({k: v + 0.02 * torch.randn(v.shape, generator=g) * v.std() for k, v in base.items()})
    sampled = {"samples": args.samples, "top_p": 0.95} if args.samples > 1 else {}
    started = time.perf_counter()
    generate = VLLMGenerate(folder, dtype=args.dtype, max_model_len=512) if engine == "vllm" else None
    evaluate = rewards(
        prompts(args.prompts),
        lambda completions, **kw: [float(len(c)) for c in completions],
        tokenizer=folder,
        model=folder,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        generate=generate,
        **sampled,
    )
    evaluate(candidates[0])
    start_seconds = time.perf_counter() - started
    seconds, completions = [], None
    for cand in candidates[1:]:
        t = time.perf_counter()
        evaluate(cand)
        seconds.append(time.perf_counter() - t)
        completions = completions or list(evaluate.completions)
    return {"seconds": seconds, "start": start_seconds, "completions": completions, "threads": torch.get_num_threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--candidates", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", metavar="FILE", help="also write the figures there (gpu_check.py reads them)")
    p.add_argument("--engine", choices=("hf", "vllm"), help=argparse.SUPPRESS)  # a child process's
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine:
        print(json.dumps(run(args.engine, args.folder, args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "base"
        build(folder, args)
        out = {}
        for engine in ("hf", "vllm"):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--engine", engine, "--folder", str(folder)]
            env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode:
                sys.exit(f"{engine} failed:\n{proc.stderr[-4000:]}")
            out[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    params = f"hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, {args.dtype}"
    work = f"{args.prompts} prompts x {args.samples} samples x <= {args.max_new_tokens} new tokens"
    print(f"CPU: {cpu_label()}; model: {params}; per candidate: {work}")
    for engine, name in (("hf", "HF generate"), ("vllm", "vLLM")):
        r = out[engine]
        print(
            f"{name:12s} median {statistics.median(r['seconds']):7.2f} s/candidate "
            f"(runs {', '.join(f'{s:.2f}' for s in r['seconds'])}; start + warm-up {r['start']:.1f} s; "
            f"torch threads after {r['threads']})"
        )
    ratio = statistics.median(out["hf"]["seconds"]) / statistics.median(out["vllm"]["seconds"])
    print(f"HF / vLLM: {ratio:.2f}x")
    same = None
    if args.samples == 1:
        same = sum(a == b for a, b in zip(out["hf"]["completions"], out["vllm"]["completions"]))
        print(f"identical greedy completions: {same} of {len(out['hf']['completions'])}")
    if args.json:
        figures = {e: {k: out[e][k] for k in ("seconds", "start", "threads")} for e in out}
        Path(args.json).write_text(
            json.dumps(
                {"cpu": cpu_label(), "model": params, "work": work, "ratio": ratio, "identical": same, **figures}
            )
        )


if __name__ == "__main__":
    main()
