"""What a TRL trainer's weights need around a merge: vLLM's copy pushed again after the generalist was swapped in
and out (:func:`force_vllm_resync`), and the sharded models a merge cannot write into (:func:`sharding_refusal`)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

__all__ = ["VLLM_SYNC_MARKER", "check_vllm_marker", "force_vllm_resync", "sharding_refusal", "uses_vllm"]

#: TRL's vLLM trainers push the model's weights to vLLM before a generation only when ``state.global_step`` differs
#: from this attribute (TRL 1.16: GRPOTrainer._generate_single_turn and _generate, RLOOTrainer, ...)
VLLM_SYNC_MARKER = "_last_loaded_step"


def uses_vllm(trainer: Any, args: Any = None) -> bool:
    """Whether the trainer (or its arguments: TRL's ``use_vllm``) generates with vLLM."""
    return bool(getattr(trainer, "use_vllm", False) or getattr(args, "use_vllm", False))


def sharding_refusal(model: Any) -> str | None:
    """Why the callback cannot merge into ``model`` in place: DeepSpeed ZeRO-3 (parameters partitioned into empty
    placeholders) or FSDP1 (flat parameters); None otherwise (plain, DDP, FSDP2/DTensor models)."""
    if any(hasattr(p, "ds_id") for p in getattr(model, "parameters", lambda: [])()):
        return "DeepSpeed ZeRO-3 partitions the parameters (each holds an empty placeholder outside forward)"
    if any(type(m).__name__ == "FullyShardedDataParallel" for m in getattr(model, "modules", lambda: [])()):
        return "FSDP1 flattens and shards the parameters (use FSDP2, whose parameters are DTensors)"
    return None


def check_vllm_marker(trainer: Any, who: str) -> None:
    """Refuse a vLLM trainer without TRL's weight-sync marker (``who`` names the caller).

    Raises:
        ConfigError: the trainer has no marker (a TRL version this is not tested with).
    """
    if not hasattr(trainer, VLLM_SYNC_MARKER):
        raise ConfigError(
            f"{who}: {type(trainer).__name__} generates with vLLM but has no {VLLM_SYNC_MARKER!r} (a TRL version "
            "this callback does not know): the agent's weights could not be pushed to vLLM again after a merge, "
            "and its rollouts could sample the generalist. Use the TRL version the callback is tested with (1.16), "
            "or use_vllm=False"
        )


def force_vllm_resync(trainer: Any, who: str) -> None:
    """Make a vLLM trainer's next generation push the model's weights (the agent's, swapped back) to vLLM: TRL
    skips the push while ``_last_loaded_step == state.global_step``, and an evaluation of the generalist at this
    step (``trainer.evaluate()``, or any ``evaluate`` generating through the trainer) pushed the generalist's. Costs
    one extra push per merge; nothing for a trainer without vLLM. ``who`` names the caller in the error.

    Raises:
        ConfigError: the trainer generates with vLLM but has no marker (:func:`check_vllm_marker`).
    """
    if uses_vllm(trainer):
        check_vllm_marker(trainer, who)
        setattr(trainer, VLLM_SYNC_MARKER, -1)
