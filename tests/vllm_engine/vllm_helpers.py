"""The tiny models of tests/vllm_engine: a Llama with head_dim 32 (vLLM's CPU attention refuses 16 and less), the
character-level WordLevel tokenizer of tests/evaluate_helpers.py, agents fine-tuned from it (sparse changes) and
merges of them made with ram_live."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from evaluate_helpers import config, model, tokenizer

#: Prompts: more than the race's slices need, of different lengths.
PROMPTS = [
    "a",
    "two plus two =",
    "abc abc",
    "the cat sat",
    "zz",
    "1+1=",
    "hello there friend",
    "q",
    "mm nn",
    "9 8 7",
    "xyz",
    "a b c d e",
]


#: the models' width: head_dim 32, the least vLLM's CPU attention takes
HIDDEN = 128


def base_model(seed: int = 0) -> transformers.LlamaForCausalLM:
    return model(seed, HIDDEN)


def save_base(folder: Path) -> Path:
    m = base_model()
    m.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def base_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def agents(base: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Three agents: sparse changes of the base, large enough to change the greedy completions."""
    g = torch.Generator().manual_seed(1)
    out = {}
    for name, density in (("coder", 0.2), ("tools", 0.3), ("memory", 0.25)):
        out[name] = {
            k: v + torch.randn(v.shape, generator=g) * 0.08 * (torch.rand(v.shape, generator=g) < density)
            for k, v in base.items()
        }
    return out


def module_with(state: dict[str, torch.Tensor]) -> transformers.LlamaForCausalLM:
    m = transformers.LlamaForCausalLM(config(HIDDEN)).eval()
    m.load_state_dict(state)
    return m


def count_a(completions, **kwargs) -> list[float]:
    return [float(c.count("a")) + 0.1 * len(c) for c in completions]
