"""The tiny models of tests/vllm_engine: a Llama with head_dim 32 (vLLM's CPU attention refuses 16 and less), the
character-level WordLevel tokenizer of tests/evaluate_helpers.py, agents fine-tuned from it (sparse changes) and
merges of them made with ram_live."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from evaluate_helpers import VOCAB, tokenizer

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


def config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )


def base_model(seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(config()).eval()
    with torch.no_grad():  # a sharp output layer: the two engines' rounding never ties the argmax
        m.lm_head.weight.mul_(8.0)
        m.lm_head.weight[VOCAB["<eos>"]] = m.lm_head.weight[VOCAB["="]] * 1.05  # completions of several lengths
    return m


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
    m = transformers.LlamaForCausalLM(config()).eval()
    m.load_state_dict(state)
    return m


def count_a(completions, **kwargs) -> list[float]:
    return [float(c.count("a")) + 0.1 * len(c) for c in completions]
