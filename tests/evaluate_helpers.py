"""A tiny Llama and a character-level tokenizer built locally (no downloads), reward functions, and the
hand-written per-prompt greedy loop the evaluator is checked against."""

from __future__ import annotations

import torch

transformers = __import__("pytest").importorskip("transformers")
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

CHARS = "abcdefghijklmnopqrstuvwxyz =+0123456789"
VOCAB = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
PROMPTS = ["a", "two plus two =", "abc abc", "the cat sat", "zz", "1+1=", "hello there friend"]
ANSWERS = ["b", "4", "abc", "on", "z", "2", "hi"]
CHAT = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def tokenizer(pad: bool = True) -> transformers.PreTrainedTokenizerFast:
    tk = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    extra = {"pad_token": "<pad>"} if pad else {}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<eos>", unk_token="<unk>", padding_side="left", **extra
    )
    tok.chat_template = CHAT
    return tok


def config(hidden: int = 32) -> transformers.LlamaConfig:
    """A two-layer Llama of this vocabulary, ``hidden`` wide (head_dim ``hidden / 4``)."""
    return transformers.LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )


def model(seed: int = 0, hidden: int = 32) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(config(hidden)).eval()
    with torch.no_grad():  # a sharper output layer: random models then rarely tie for the argmax
        m.lm_head.weight.mul_(8.0)
        # EOS wins wherever "=" would (a little more than it): completions end at different lengths
        m.lm_head.weight[VOCAB["<eos>"]] = m.lm_head.weight[VOCAB["="]] * 1.05
    return m


def greedy(m, tok, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The reference: one prompt at a time, the whole sequence recomputed each step, argmax, stop at EOS."""
    ids = list(prompt_ids)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = m(torch.tensor([ids])).logits[0, -1]
            t = int(torch.argmax(logits))
            out.append(t)
            ids.append(t)
            if t == tok.eos_token_id:
                break
    return out


def count_a(prompts, completions, **kwargs) -> list[float]:
    return [float(c.count("a")) for c in completions]


def starts_right(completions, answer) -> list[float]:
    return [1.0 if c.startswith(a[:1]) else 0.0 for c, a in zip(completions, answer)]


def length(completions, completion_ids, **kwargs) -> list[float]:
    return [float(len(ids)) for ids in completion_ids]
