"""Shared by the verl tests and tests/verl/make_checkpoints.py (which torchrun runs): a tiny Qwen2 base built from
a config (nothing downloaded) and verl's own trainer config composed by Hydra from verl's ppo_trainer.yaml."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

CALLBACK = "ram_live.integrations.verl.RAMCheckpointCallback"


def build_base(folder: str | os.PathLike[str]) -> Path:
    """A tiny Qwen2ForCausalLM (tied embeddings, like Qwen2.5-0.5B) saved in bf16 with a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    vocab = {f"t{i}": i for i in range(250)}
    vocab.update({"<unk>": 250, "<|endoftext|>": 251})
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    cfg = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def compose(overrides: Sequence[str]):
    """verl's trainer config (``verl/trainer/config/ppo_trainer.yaml``, Hydra defaults resolved) with overrides."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


def run_overrides(base: str, root: str, store: str, agent: str, *extra: str) -> list[str]:
    """The command-line overrides of a verl run with the RAM callback (what the README shows)."""
    return [
        f"actor_rollout_ref.model.path={base}",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "trainer.save_freq=1",
        f"trainer.default_local_dir={root}",
        f"trainer.checkpoint_callback_class={CALLBACK}",
        f"+ram.store={store}",
        f"+ram.agent={agent}",
        *extra,
    ]


def score(merged_dir: str, step: int) -> dict[str, float]:
    """An evaluation hook for the tests (``+ram.evaluate=verl_helpers.score``): the merged model's mean loss on a
    fixed batch."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(merged_dir)
    ids = torch.arange(2, 50).view(2, 24)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    return {"loss": float(loss), "eval_step": float(step)}
