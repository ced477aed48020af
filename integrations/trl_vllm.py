"""The generalist evaluated on the vLLM engine a TRL trainer already runs (``use_vllm=True``,
``vllm_mode="colocate"``): no second engine and no second copy of the weights. Each candidate's weights are swapped
into ``trainer.vllm_generation.llm`` in place (:class:`~ram_live.evaluate.VLLMGenerate`'s swap); the policy's
come back at the trainer's next rollout, which :class:`~ram_live.integrations.transformers.RAMTrainerCallback`
forces after every merge (TRL pushes again after an evaluation at the merge's step). With TRL's sleep mode the
engine is woken for the evaluation and put back to sleep after it, its weights marked as gone so TRL pushes them.

    engine = ColocatedVLLMGenerate("ckpt/base")            # the folder TRL started vLLM from (model.name_or_path)
    callback = RAMTrainerCallback("runs/ram", agent="coder", merge_every=200,
                                  search=SearchSetting(evaluate=rewards("val.jsonl", fn, generate=engine)))
    trainer = GRPOTrainer(..., args=GRPOConfig(use_vllm=True, vllm_mode="colocate"), callbacks=[callback])
    callback.bind(trainer)
    engine.bind(trainer)

On a CPU, TRL's colocate mode does not run with vLLM 0.32's CPU build (TRL writes its weights with the model's
``load_weights``, which the CPU's re-packed layers refuse after start-up); the swap, the completions and the
wake/sleep handling are tested there on a running vLLM engine (tests/vllm_engine), TRL's own colocate loop is not.
"""

from __future__ import annotations

import os
from typing import Any

from ram_live.errors import ConfigError
from ram_live.evaluate import VLLMGenerate

__all__ = ["ColocatedVLLMGenerate"]


class ColocatedVLLMGenerate(VLLMGenerate):
    """A ``generate=`` engine on a TRL trainer's colocated vLLM engine (bound with :meth:`bind`).

    Args:
        model: the folder TRL started vLLM from (the policy's ``name_or_path``): its keys and shapes check each
            candidate, its tokenizer encodes prompts and decodes completions unless ``tokenizer`` is given.
        tokenizer: the tokenizer or its folder (default: the folder's).

    Raises:
        ConfigError: a folder that is not a Hugging Face model folder with safetensors weights.

    >>> engine = ColocatedVLLMGenerate("ckpt/base"); engine.bind(trainer)   # doctest: +SKIP
    """

    def __init__(self, model: str | os.PathLike, *, tokenizer: Any = None) -> None:
        super().__init__(model, tokenizer=tokenizer)
        self._owned, self._generation = False, None

    def bind(self, trainer: Any) -> None:
        """Evaluate on ``trainer``'s colocated vLLM engine.

        Args:
            trainer: a TRL trainer built with ``use_vllm=True, vllm_mode="colocate"``.

        Raises:
            ConfigError: a trainer that does not generate with vLLM, or does in server mode (its engine is in
                another process: evaluate with your own ``VLLMGenerate``)."""
        generation = getattr(trainer, "vllm_generation", None)
        mode = getattr(generation, "mode", None)
        if not getattr(trainer, "use_vllm", False) or generation is None:
            raise ConfigError(
                f"ColocatedVLLMGenerate.bind: {type(trainer).__name__} does not generate with vLLM "
                "(use_vllm=True, vllm_mode='colocate')"
            )
        if mode != "colocate" or getattr(generation, "llm", None) is None:
            raise ConfigError(
                f"ColocatedVLLMGenerate.bind: the trainer's vLLM runs in {mode!r} mode, not 'colocate': its engine "
                "is not in this process; evaluate with VLLMGenerate(folder) instead"
            )
        self._generation, self._llm, self._reload = generation, generation.llm, None

    def start(self) -> None:
        """The engine is the trainer's: :meth:`bind` it first.

        Raises:
            ConfigError: not bound yet."""
        if self._llm is None:
            raise ConfigError("ColocatedVLLMGenerate: bind(trainer) first: it evaluates on the trainer's vLLM engine")

    def __call__(self, merged: Any, prompts: Any, settings: Any, seeds: Any) -> list[list[str]]:
        """As :class:`VLLMGenerate`; a sleeping engine (TRL's ``vllm_enable_sleep_mode``) is woken and put back.

        Args:
            merged, prompts, settings, seeds: as every ``generate=`` engine gets them."""
        self.start()
        generation = self._generation
        sleeps = bool(getattr(generation, "enable_sleep_mode", False))
        if sleeps:
            self._llm.wake_up()
        try:
            return super().__call__(merged, prompts, settings, seeds)
        finally:
            if sleeps:
                self._llm.sleep(level=2)
                generation._llm_weights_sleeping = True  # TRL pushes the policy's weights again before its rollout
