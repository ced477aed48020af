"""Evaluate merge candidates with vLLM: a ``generate=`` engine for :func:`ram_live.evaluate.rewards`.

One vLLM engine is built once from the base model; for every candidate, ``search`` hands the evaluation the
merged weights, which are written into the engine in place with vLLM's own ``load_weights`` (as TRL's
``trl/generation/vllm_generation.py`` syncs the policy into a colocated engine) — no save, no reload — and the
completions come from vLLM with the evaluation's settings (k samples, ``max_new_tokens``, stop strings, EOS ids,
one seed per prompt).

Needs a GPU and ``pip install vllm``. Check it against the Hugging Face path (greedy, the base model: the two
scores should agree up to the engines' numerics)::

    python examples/vllm_generate.py --base Qwen/Qwen2.5-0.5B-Instruct --prompts val.parquet --check

It is not imported by the tests (vLLM is not a dependency of ram-live).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The engine core in this process (vLLM V1 runs it in a child process by default): weights are then written into
# the very model that generates, without serialising them across processes. Set before vLLM is imported.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def state_dict_of(merged: Any) -> Mapping[str, Any]:
    """The merged weights, whatever the evaluation was handed: a module, a state dict, or a folder of safetensors."""
    if isinstance(merged, Mapping):
        return merged
    if isinstance(merged, (str, os.PathLike)):
        from safetensors.torch import load_file

        state: dict[str, Any] = {}
        for shard in sorted(Path(merged).glob("*.safetensors")):
            state.update(load_file(shard))
        return state
    return merged.state_dict()


class VLLMGenerate:
    """``generate(merged, prompts, settings, seeds) -> list[list[str]]`` on one colocated vLLM engine.

    Args:
        model: the base model's folder or Hugging Face id (the merge's structure: every candidate has its keys).
        gpu_memory_utilization: vLLM's share of the GPU (leave room for the merge and the search's model).
        **llm_kwargs: more ``vllm.LLM`` options (``max_model_len``, ``tensor_parallel_size`` ...).
    """

    def __init__(
        self, model: str, *, gpu_memory_utilization: float = 0.4, dtype: str = "auto", **llm_kwargs: Any
    ) -> None:
        from vllm import LLM

        self.llm = LLM(model=model, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, **llm_kwargs)

    def push(self, merged: Any) -> None:
        """Write the candidate's weights into the engine (HF names; vLLM maps them onto its fused layers). Every
        call writes them: ``search`` reuses one output module for every candidate, so the same object holds new
        weights each time."""
        weights = list(state_dict_of(merged).items())
        if hasattr(self.llm, "apply_model"):  # current vLLM: the function runs on the model in each worker
            self.llm.apply_model(lambda model: model.load_weights(weights))
        else:  # older vLLM (V0), as TRL's colocate mode writes them
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)
        self.llm.reset_prefix_cache()  # cached prefixes hold the previous weights' keys and values

    def __call__(self, merged: Any, prompts: list[Any], settings: Any, seeds: list[int]) -> list[list[str]]:
        from vllm import SamplingParams

        self.push(merged)
        eos = list(settings.eos_token_id) if settings.eos_token_id else None
        params = [
            SamplingParams(
                n=settings.samples,
                max_tokens=settings.max_new_tokens,
                seed=seed,
                temperature=float(settings.temperature) if settings.do_sample else 0.0,  # 0: greedy
                top_p=float(settings.top_p),
                top_k=int(settings.top_k) or -1,  # -1: no top-k cut
                stop=list(settings.stop) or None,
                include_stop_str_in_output=settings.include_stop,
                stop_token_ids=eos,
                ignore_eos=eos is not None,  # eos_token_id= replaces the EOS set, as in the HF path
                skip_special_tokens=True,
            )
            for seed in seeds
        ]
        if prompts and isinstance(prompts[0], list):  # conversations: vLLM renders the chat template
            outputs = self.llm.chat(prompts, sampling_params=params, add_generation_prompt=True, use_tqdm=False)
        else:
            outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        return [[o.text for o in out.outputs] for out in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model's folder or Hugging Face id")
    parser.add_argument("--prompts", required=True, help="held-out prompts: JSONL or verl parquet")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--check", action="store_true", help="also score greedily with Hugging Face generate")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from ram_live.evaluate import rewards

    def length(completions, **kwargs):  # stands in for the run's reward function
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(len(t)) for t in texts]

    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.bfloat16).to("cuda")
    engine = VLLMGenerate(args.base)
    evaluate = rewards(
        args.prompts,
        length,
        tokenizer=args.base,
        max_new_tokens=args.max_new_tokens,
        samples=args.samples,
        generate=engine,
    )
    print("vLLM:", evaluate(base), evaluate.metrics)
    if args.check:
        plain = rewards(args.prompts, length, tokenizer=args.base, max_new_tokens=args.max_new_tokens)
        print("HF generate:", plain(base), plain.metrics)
        same = sum(a == b for a, b in zip(evaluate.completions, plain.completions))
        print(f"identical completions: {same} of {len(plain.completions)} (greedy; bf16 numerics differ slightly)")


if __name__ == "__main__":
    main()
